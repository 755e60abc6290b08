"""scripts/gpu_scenarios.py: the scenario studies it builds are valid study files that run
the intended configurations in the intended order, it judges outcomes as the scenarios
require, and (slow) the whole script runs against the simulator with a stand-in
nvidia-smi, finds every scenario as expected and leaves no process behind."""

from __future__ import annotations

import importlib.util
import json
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT
from tests.test_gpu_study_file import H200_STUDY
from tuner.study import policy, space
from tuner.study.study_file import parse_study
from tuner.vllm.compile_cache import study_cache_root

spec_ = importlib.util.spec_from_file_location("gpu_scenarios", ROOT / "scripts" / "gpu_scenarios.py")
assert spec_ is not None and spec_.loader is not None
scn = importlib.util.module_from_spec(spec_)
sys.modules["gpu_scenarios"] = scn
spec_.loader.exec_module(scn)


CACHE = "/work/gpu-scenarios/vllm-cache"


@pytest.fixture
def study() -> dict:
    return yaml.safe_load(H200_STUDY)


def test_scenario_study_runs_a_then_d1_d2_c_b_and_d_shares_one_compile_key(study: dict) -> None:
    data, points = scn.scenario_study(study, {"a", "b", "c", "d"}, dry_run=False, cache_dir=CACHE)
    assert list(points) == ["a", "d1", "d2", "c", "b"]
    spec = parse_study(yaml.safe_dump(data), "scenarios.yaml")     # what `tuner run` will read
    assert spec.server.command == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert spec.server.gpus_per_trial == 1 and not spec.probe.enabled and spec.budget.n_trials == 5
    assert spec.execution.gpu_free_timeout == 10.0
    assert "gpu_memory_utilization" not in spec.server.flags and spec.server.flags["max_model_len"] == 4096
    assert spec.server.env["NCCL_NVLS_ENABLE"] == 0
    # The queue the tuner builds from it: the busy trial a (the baseline, eager: no compile
    # key), then d1 and d2 (one key: gpu_memory_utilization is outside it), c (compiled, a key
    # of its own), b (eager) last.
    queued = [p.values for p in policy.first_points(spec, [])]
    assert queued == [points[n] for n in ("a", "d1", "d2", "c", "b")]
    keys = {n: space.point_compile_key(spec, points[n]) for n in points}
    assert keys["a"] is None and keys["b"] is None
    assert keys["d1"] == keys["d2"] is not None and keys["c"] not in (None, keys["d1"])
    # The memory scenario's KV cache is too small for one 4,096-token request of SmolLM2-135M
    # (30 layers x 2 x 3 KV heads x 64 x 2 bytes = 23,040 bytes a token: 94 MB).
    assert scn.KV_BYTES < 4096 * 23_040


def test_only_some_scenarios(study: dict) -> None:
    data, points = scn.scenario_study(study, {"c", "d"}, dry_run=True, cache_dir=CACHE)
    assert list(points) == ["d1", "d2", "c"] and data["baseline"] == points["d1"]
    assert points["d1"] == {"gpu_memory_utilization": 0.5, "enforce_eager": False, "kv_cache_memory_bytes": None,
                            "spec_method": None}
    assert data["server"]["command"] == ["{python}", "-m", "tuner.sim"] and data["server"]["gpus_per_trial"] == 0
    busy = parse_study(yaml.safe_dump(scn.scenario_study(study, {"a"}, dry_run=False, cache_dir=CACHE)[0]))
    assert busy.budget.n_trials == 1 and space.baseline_values(busy)["enforce_eager"] is True


def test_the_compile_cache_scenario_has_a_cache_of_its_own_whatever_the_environment(study: dict) -> None:
    # On 2026-12-02 the script ran with VLLM_CACHE_ROOT exported to the cache the main study
    # had filled: the scenario study inherited it and d1 loaded the study's graphs (a hit).
    study["server"]["env"]["VLLM_CACHE_ROOT"] = "/in/the/study/file"
    data, points = scn.scenario_study(study, {"d"}, dry_run=False, cache_dir=CACHE)
    spec = parse_study(yaml.safe_dump(data), "scenarios.yaml")
    assert spec.execution.compile_cache_dir == CACHE and "VLLM_CACHE_ROOT" not in spec.server.env
    # The orchestrator keeps an explicit compile_cache_dir over the tuner's own environment...
    root = study_cache_root(spec.execution.compile_cache_dir, "/results/smollm2-h200-scenarios",
                            {"VLLM_CACHE_ROOT": "/tmp/tuner-h200-compile-cache"})
    assert root == CACHE
    # ...and each trial's server gets it as VLLM_CACHE_ROOT in the env the worker lays over
    # its own environment (worker.TrialWorker._start: os.environ, then the request's env).
    for name in ("d1", "d2"):
        command = space.trial_command(spec, points[name], port=18400, compile_cache_dir=root)
        assert command.launch_env["VLLM_CACHE_ROOT"] == CACHE
        assert {**{"VLLM_CACHE_ROOT": "/tmp/tuner-h200-compile-cache"}, **command.launch_env}[
            "VLLM_CACHE_ROOT"] == CACHE


def test_trials_are_matched_to_configurations_by_their_values() -> None:
    points = {"d1": {"u": 0.5, "s": None}, "d2": {"u": 0.45, "s": None}, "c": {"u": 0.5, "s": "mtp", "k": 1}}
    trials = {0: {"status": "completed"}, 1: {"status": "failed", "reason": "invalid_config"},
              2: {"status": "completed"}}
    values = {0: {"u": 0.5, "s": None}, 1: {"u": 0.5, "s": "mtp", "k": 1}, 2: {"u": 0.45, "s": None}}
    found = scn.match_trials(points, trials, values)
    assert {n: g["trial"] for n, g in found.items()} == {"d1": 0, "c": 1, "d2": 2}


def test_judging() -> None:
    miss = {"status": "completed", "compile_cache": "miss", "startup_s": 90.0}
    hit = {"status": "completed", "compile_cache": "hit", "startup_s": 50.0}
    assert scn.judge("d1", miss, {}) and scn.judge("d2", hit, {"d1": miss})
    assert not scn.judge("d2", {**hit, "startup_s": 95.0}, {"d1": miss}), "a hit must start faster"
    assert not scn.judge("d2", {**hit, "compile_cache": "miss"}, {"d1": miss})
    busy = {"reason": "gpus_not_free", "phase": "prepare",
            "message": "the trial's GPUs are still in use after waiting 10s: pid 7 (python3, 20996 MiB); ..."}
    assert scn.judge("a", busy, {}) and not scn.judge("a", {**busy, "phase": "start"}, {})
    assert scn.judge("b", {"reason": "max_model_len_too_large", "phase": "start"}, {})
    assert not scn.judge("b", {"reason": "startup_timeout", "phase": "start"}, {})
    assert scn.judge("c", {"reason": "invalid_config",
                           "message": "...: NotImplementedError: Unsupported speculative method: 'mtp'"}, {})


@pytest.mark.slow
def test_dry_run_end_to_end(tmp_path: Path, study: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    study_file = tmp_path / "smollm2-h200.yaml"
    study_file.write_text(H200_STUDY)
    out = tmp_path / "out"
    # A cache root in the environment (as on the GPU box) must not reach the scenario
    # study's servers: the simulator writes its compile cache under VLLM_CACHE_ROOT.
    inherited = tmp_path / "inherited-cache"
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(inherited))
    rc = scn.main([str(study_file), "--out", str(out), "--work", str(tmp_path / "work"), "--dry-run"])
    summary = json.loads((out / "summary.json").read_text())
    assert rc == 0, (out / "summary.txt").read_text()
    assert summary["ok"] and summary["leftover_pids"] == []
    assert summary["run_order"] == ["a", "d1", "d2", "c", "b"]
    got = {k: v["got"] for k, v in summary["scenarios"].items()}
    assert got["a"]["reason"] == "gpus_not_free" and f"pid {got['a']['holder_pid']} " in got["a"]["message"]
    assert got["a"]["gpu_wait_s"] >= 10.0
    # The holder went 3 s after d1 began waiting for the GPU: d1 waited, then started.
    assert got["d1"]["gpu_wait_s"] > 0 and got["d1"]["status"] == "completed"
    assert (got["d1"]["compile_cache"], got["d2"]["compile_cache"]) == ("miss", "hit")
    assert not inherited.exists()
    assert list((tmp_path / "work" / "vllm-cache" / "torch_compile_cache").glob("torch_aot_compile/*/rank_0_0/model"))
    assert got["c"]["signature"] == "unsupported_speculative_method"
    assert got["b"]["reason"] == "max_model_len_too_large"
    text = (out / "summary.txt").read_text()
    assert "== smollm2-h200-scenarios.status.txt" in text and "(torch.compile cache hit)" in text
    with tarfile.open(out / "scenarios.tar.gz") as tar:
        names = tar.getnames()
    assert any(n.endswith("trials/0001/startup.json") for n in names)
    assert not any("vllm-cache" in n for n in names)
