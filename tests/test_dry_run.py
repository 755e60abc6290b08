"""`tuner run FILE --dry-run` (issue 39, item 16): the study file as it is, run on the built-in
simulator with its hardware profile, fast clocks and short levels, in its own folder, in about
the demo's time. The rewrite is pure and checked field by field; the run itself is the
field-notes study file, end to end, timed."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT, run_tuner, wait_no_orphans, write_study
from tuner.adapters.artifacts import StudyPaths
from tuner.commands.dry_run import MARKER, _clear_previous
from tuner.commands.main import main
from tuner.errors import StudyError
from tuner.sim.profile import builtin_profiles
from tuner.store.handle import StudyLock
from tuner.study.dry_run import PROFILES, dry_run_spec, pick_profile
from tuner.study.study_file import parse_study

GLM5 = ROOT / "search_spaces" / "glm5-8xpcie.yaml"
D8B = ROOT / "search_spaces" / "d8b-h100.yaml"


def _dry(text: str, name: str = "x-dry-run"):
    return dry_run_spec(parse_study(text), name=name, cache_dir="/tmp/dry/vllm-cache")


def test_the_field_notes_study_on_the_simulator() -> None:
    real = parse_study(GLM5.read_text())
    dry = _dry(GLM5.read_text(), "glm5-8xpcie-dry-run")
    spec = dry.spec
    assert spec.name == "glm5-8xpcie-dry-run"
    assert spec.server.command == ["{python}", "-m", "tuner.sim"]
    assert spec.server.env == {**real.server.env, "TUNER_SIM_PROFILE": "glm5-8xpcie", "TUNER_SIM_TIME_SCALE": 0.1,
                               "TUNER_SIM_STARTUP_SCALE": 0.001}
    assert spec.execution.compile_cache_dir == "/tmp/dry/vllm-cache"
    load = spec.load
    assert (load.sizing, load.requests_per_stream, load.min_requests, load.warmup_requests, load.repeats,
            load.fit_prompt_tokens) == ("requests", 2, 4, 2, 1, False)
    assert [(c.name, c.prompt_tokens, c.output_tokens) for c in load.workload.classes] == [
        ("chat", 128, 16), ("edit", 128, 16)]
    assert spec.budget.n_trials == 12
    # The night itself is the file's: its space, objectives, limits, levels, probe, confirmation.
    for field in ("parameters", "forbidden", "baseline", "starting_points", "objectives", "limits", "probe",
                  "confirm", "sampler", "verify"):
        assert getattr(spec, field) == getattr(real, field), field
    assert (load.concurrency, spec.server.flags, spec.server.gpus_per_trial, spec.server.model) == (
        real.load.concurrency, real.server.flags, real.server.gpus_per_trial, real.server.model)
    assert dry.changes == (
        "study glm5-8xpcie -> glm5-8xpcie-dry-run: its own folder, storage and compile cache; nothing of "
        "glm5-8xpcie's is read or written",
        "server.command vllm serve -> the built-in simulator, hardware profile glm5-8xpcie; its clock runs at "
        "0.1 x modelled time (TUNER_SIM_TIME_SCALE), server starts at 0.001 x (TUNER_SIM_STARTUP_SCALE), so its "
        "tok/s and latencies are not the box's",
        "simulator profile glm5-8xpcie (GLM-5 on eight PCIe GPUs): 8 GPUs a trial (the largest "
        "tensor_parallel_size x pipeline_parallel_size it asks); server.env.TUNER_SIM_PROFILE picks another "
        "(built-in: glm5-8xpcie, llama8b-h100, tiny-cpu)",
        "load: each level 2 requests per stream (at least 4) after 2 warm-up requests, once, instead of "
        "steady-state windows of at least 10 s",
        "load.workload: requests of at most 128 prompt and 16 output tokens (the file's prompt/output tokens: "
        "chat 512/256, edit 1024/256)",
        "load.fit_prompt_tokens true -> false: prompt lengths are estimated, not fitted with the server's /tokenize",
        "budget.n_trials 60 -> 12 (--n-trials N runs more)",
    )


def test_a_dataset_is_sent_as_it_is_and_a_shared_prefix_keeps_its_share(tmp_path: Path) -> None:
    data = yaml.safe_load(GLM5.read_text())
    data["load"]["workload"] = {"dataset": {"path": str(tmp_path / "traffic.jsonl")}}
    dry = _dry(yaml.safe_dump(data))
    assert dry.spec.load.workload.dataset == parse_study(yaml.safe_dump(data)).load.workload.dataset
    assert "load.workload.dataset: its requests are sent as the file has them" in "\n".join(dry.changes)
    data["load"]["workload"] = {"classes": [{"name": "rag", "kind": "shared_prefix", "prompt_tokens": 2048,
                                             "prefix_tokens": 1536, "output_tokens": 256}]}
    [rag] = _dry(yaml.safe_dump(data)).spec.load.workload.classes
    assert (rag.prompt_tokens, rag.prefix_tokens, rag.output_tokens) == (128, 96, 16)


def test_a_study_keeps_its_own_simulator_settings_and_loses_a_shared_cache() -> None:
    data = yaml.safe_load(GLM5.read_text())
    data["server"]["env"].update({"TUNER_SIM_PROFILE": "tiny-cpu", "TUNER_SIM_TIME_SCALE": 0.5,
                                  "VLLM_CACHE_ROOT": "/home/me/.cache/vllm"})
    data["load"]["host_check_s"] = 30
    data["load"]["request_rates"] = [1.0, 2.0]
    data["budget"]["n_trials"] = 5
    dry = _dry(yaml.safe_dump(data))
    env = dry.spec.server.env
    assert (env["TUNER_SIM_PROFILE"], env["TUNER_SIM_TIME_SCALE"], env["TUNER_SIM_STARTUP_SCALE"]) == ("tiny-cpu", 0.5,
                                                                                                        0.001)
    assert "VLLM_CACHE_ROOT" not in env     # the simulator's entries never land in vLLM's own cache
    assert (dry.spec.load.host_check_s, dry.spec.load.rate_duration_s, dry.spec.budget.n_trials) == (0, 5.0, 5)
    assert "load.host_check_s 30 -> 0 (the host check is the real run's)" in dry.changes
    assert "load.rate_duration_s 60 -> 5" in dry.changes
    assert not any(line.startswith("budget.n_trials") for line in dry.changes)


def test_the_profile_fits_the_study_unless_the_study_names_one() -> None:
    assert set(PROFILES) <= set(builtin_profiles())
    files = sorted((ROOT / "search_spaces").glob("*.yaml"))
    shipped = {f.stem: pick_profile(parse_study(f.read_text()))[0] for f in files}
    assert shipped == {"d8b-h100": "llama8b-h100", "d8b-h100-energy": "llama8b-h100", "smollm2-h200": "llama8b-h100",
                       "smollm2-cpu": "tiny-cpu",
                       "smollm2-cpu-slo": "tiny-cpu", "smollm2-cpu-chat": "tiny-cpu",
                       "smollm2-cpu-synthetic": "tiny-cpu", "smollm2-cpu-tp": "tiny-cpu",
                       "smollm2-cpu-lossy": "tiny-cpu", "smollm2-h100-lossy": "llama8b-h100",
                       "glm5-8xpcie": "glm5-8xpcie", "glm5-8xpcie-large": "glm5-8xpcie",
                       "glm5-8xpcie-slo": "glm5-8xpcie", "demo": "glm5-8xpcie"}
    data = yaml.safe_load(D8B.read_text())
    dry = _dry(yaml.safe_dump(data))
    assert dry.spec.server.env["TUNER_SIM_PROFILE"] == "llama8b-h100"
    # Its steps are milliseconds already: its clock is not sped up (tuner.study.dry_run.PROFILE_TIME_SCALES).
    assert dry.spec.server.env["TUNER_SIM_TIME_SCALE"] == 1.0
    assert ("simulator profile llama8b-h100 (an 8B Llama on one H100): one GPU a trial (tensor_parallel_size x "
            "pipeline_parallel_size 1); server.env.TUNER_SIM_PROFILE picks another (built-in: glm5-8xpcie, "
            "llama8b-h100, tiny-cpu)") in dry.changes

    def pick(server: dict, parameters: list | None = None) -> tuple[str, str]:
        study = yaml.safe_load(D8B.read_text())
        study["server"].update(server)
        study["parameters"] += parameters or []
        return pick_profile(parse_study(yaml.safe_dump(study)))

    # The GPUs a trial's server uses decide, the largest a parameter can ask included...
    assert pick({"gpus_per_trial": 8}) == ("llama8b-h100", "one GPU a trial (tensor_parallel_size x "
                                           "pipeline_parallel_size 1)")
    assert pick({"gpus_per_trial": 4, "flags": {"tensor_parallel_size": 2, "pipeline_parallel_size": 2}}) == (
        "glm5-8xpcie", "4 GPUs a trial (the largest tensor_parallel_size x pipeline_parallel_size it asks)")
    tp = {"name": "tp", "flag": "tensor_parallel_size", "kind": "categorical", "values": [1, 2], "default": 1}
    assert pick({"gpus_per_trial": 2}, [tp])[0] == "glm5-8xpcie"
    tp_int = {"name": "tp", "flag": "tensor_parallel_size", "kind": "int", "low": 1, "high": 2, "default": 1}
    assert pick({"gpus_per_trial": 2}, [tp_int])[0] == "glm5-8xpcie"
    # ...after a CPU study's hints, and never over the study's own choice.
    assert pick({"gpus_per_trial": 0}) == ("tiny-cpu", "a CPU study (server.gpus_per_trial 0)")
    assert pick({"env": {"VLLM_CPU_KVCACHE_SPACE": 2}}) == ("tiny-cpu", "a CPU study (VLLM_CPU_KVCACHE_SPACE in "
                                                                        "server.env)")
    own = pick({"env": {"TUNER_SIM_PROFILE": "glm5-8xpcie"}})
    assert own == ("glm5-8xpcie", "the study's own server.env.TUNER_SIM_PROFILE")
    data["server"]["env"]["TUNER_SIM_PROFILE"] = "/tmp/mine.yaml"
    assert "simulator profile /tmp/mine.yaml: the study's own server.env.TUNER_SIM_PROFILE" in _dry(
        yaml.safe_dump(data)).changes


def test_a_name_too_long_for_a_study_is_said(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="study name"):
        _dry(GLM5.read_text(), "n" * 121 + "-dry-run")   # 129 characters, one over
    assert main(["run", str(GLM5), "--dry-run", "--study", "n" * 121, "--results", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --dry-run: the dry run is named after the study plus '-dry-run': study name ")
    assert err.rstrip().endswith("give it a shorter name with --study") and not list(tmp_path.iterdir())


def test_each_dry_run_replaces_the_last_but_nothing_else(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = StudyPaths.of(tmp_path, "glm5-dry-run")
    paths.root.mkdir()
    (paths.root / "optuna.db").write_text("")
    (paths.root / MARKER).write_text("{}")
    said: list[str] = []
    _clear_previous(paths, said.append)
    assert not paths.root.exists() and said == [f"[dry run] replaced the earlier dry run in {paths.root}"]
    # A running dry run is not pulled from under itself.
    paths.root.mkdir()
    (paths.root / MARKER).write_text("{}")
    with StudyLock(paths), pytest.raises(StudyError, match="already being run"):
        _clear_previous(paths, said.append)
    assert (paths.root / MARKER).exists()
    # A real study that happens to carry the name is never removed.
    (paths.root / MARKER).unlink()
    with pytest.raises(StudyError, match="not a dry run"):
        _clear_previous(paths, said.append)
    assert paths.root.exists()
    # Nor is the real study's storage ever the dry run's.
    assert main(["run", str(GLM5), "--dry-run", "--results", str(tmp_path), "--storage", "sqlite:///x.db"]) == 2
    assert "--storage: a dry run keeps its own storage" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.quiethost
def test_the_field_notes_study_dry_run_end_to_end(tmp_path: Path) -> None:
    # The shipped file, on a free port (another study may hold 8000 here) and with a marker
    # to find its processes by: nothing else differs.
    path, marker = write_study(tmp_path, base="glm5-8xpcie.yaml", name="glm5-8xpcie")
    results = tmp_path / "results"
    began = time.monotonic()
    run = run_tuner("run", "--dry-run", str(path), "--results", str(results), timeout=600)
    took = time.monotonic() - began
    print(run.stdout[-4000:])
    print(f"dry run of glm5-8xpcie.yaml: {took:.1f}s")
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.startswith(f"DRY RUN of {path} on the built-in simulator")
    assert "DRY RUN finished (glm5-8xpcie-dry-run, simulator profile glm5-8xpcie)" in run.stdout
    assert sorted(p.name for p in results.iterdir()) == ["glm5-8xpcie-dry-run"]   # never the real study's folder
    folder = results / "glm5-8xpcie-dry-run"
    assert json.loads((folder / MARKER).read_text())["study_file"] == str(path.resolve())
    status = json.loads(run_tuner("status", "glm5-8xpcie-dry-run", "--results", str(results), "--json").stdout)
    assert status["finished_trials"] == 12 and status["front"]
    for command in folder.glob("trials/*/command.json"):
        assert json.loads(command.read_text())["argv"][1:3] == ["-m", "tuner.sim"]
    # The reference: 284 s on the simulator's own clock, seconds on the dry run's.
    reference = json.loads((folder / "reference_probe.json").read_text())
    assert reference["trusted"] and reference["startup_s"] + reference["probe_s"] < 30, reference
    # Confirmation re-runs are part of the night (confirm: candidates: 2, of the front there is:
    # the simulator's noise makes it one point or several).
    assert len(list((folder / "confirm").glob("*.json"))) == min(2, len(status["front"])) > 0
    assert not wait_no_orphans(marker)
    assert took < 180, f"the dry run took {took:.1f}s (the demo takes about 80-105 s on two cores)"


def _dry_run_shipped(tmp_path: Path, name: str) -> tuple[Any, Path, str]:
    """`tuner run --dry-run` of search_spaces/NAME.yaml (its own port block and marker):
    the finished run, the results root and the marker its processes carry."""
    path, marker = write_study(tmp_path, base=f"{name}.yaml", name=name)
    results = tmp_path / "results"
    run = run_tuner("run", "--dry-run", str(path), "--results", str(results), timeout=600)
    print(run.stdout[-3000:])
    assert run.returncode == 0, run.stderr[-3000:]
    return run, results, marker


@pytest.mark.slow
def test_the_one_gpu_study_dry_run_end_to_end(tmp_path: Path) -> None:
    # The 8B-on-one-H100 study: on the field-notes box (the default before it fit the study)
    # every trial ran out of GPU memory; on its own profile it runs to a front.
    run, results, marker = _dry_run_shipped(tmp_path, "d8b-h100")
    assert "DRY RUN finished (d8b-h100-dry-run, simulator profile llama8b-h100)" in run.stdout
    assert "[dry run] simulator profile llama8b-h100 (an 8B Llama on one H100): one GPU a trial" in run.stdout
    status = json.loads(run_tuner("status", "d8b-h100-dry-run", "--results", str(results), "--json").stdout)
    assert status["finished_trials"] == 9 and status["front"]
    outcomes = [json.loads(f.read_text()) for f in (results / "d8b-h100-dry-run" / "trials").glob("*/outcome.json")]
    assert len(outcomes) == 9 and not [o["reason"] for o in outcomes if o["status"] != "completed"]
    assert not wait_no_orphans(marker)


@pytest.mark.slow
def test_the_gpu_energy_study_dry_run_measures_every_mode_and_draws_both_figures(tmp_path: Path) -> None:
    # The GPU step of issue 40, rehearsed: the grid's three modes all measured (the baseline's
    # three noise starts first), the profile's 70 W idle draw recovered, both figures drawn.
    _, results, marker = _dry_run_shipped(tmp_path, "d8b-h100-energy")
    folder = results / "d8b-h100-energy-dry-run"
    outcomes = [json.loads(f.read_text()) for f in sorted(folder.glob("trials/*/outcome.json"))]
    assert [o["status"] for o in outcomes] == ["completed"] * 5
    modes = {(json.loads(f.read_text())["argv"].count("--enforce-eager"),
              next((a for a in json.loads(f.read_text())["argv"] if "cudagraph_mode" in a), None))
             for f in folder.glob("trials/*/command.json")}
    assert len(modes) == 3, modes
    for o in outcomes:
        for c in ("1", "32"):
            level = o["levels"][c]
            assert level["joules_per_token"] > 0 and level["joules_per_token.ci95"] > 0
            assert level["usd_per_mtok"] > 0 and level["output_tok_s_per_gpu"] == level["output_tok_s"]
    assert outcomes[0]["energy"]["idle_w"] == pytest.approx(70.0, rel=0.15)
    assert all(o["energy"]["idle_w"] == outcomes[0]["energy"]["idle_w"] for o in outcomes)   # once a worker
    report = run_tuner("report", "d8b-h100-energy-dry-run", "--results", str(results), timeout=300)
    assert report.returncode == 0, report.stderr[-2000:]
    assert (folder / "report" / "serving_curve.png").stat().st_size > 10_000
    assert (folder / "report" / "energy_per_token.png").stat().st_size > 10_000
    assert not wait_no_orphans(marker)
