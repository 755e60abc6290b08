"""execution.startup in a real `tuner run` on the simulator (issue 35): with prestart every trial
after the first server is a spare interpreter released into the server, verified and measured
like a cold start; its imports count in startup_s (what a deployment pays) but not in the
trial's wait or in the startup share status gives; the phases still sum to startup_s; the
levers' environment (Triton cache, startup plan) is measurement only, never exported; and no
spare outlives the run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import processes_with_env, run_tuner, write_study
from tests.faultkit import FAST

pytestmark = pytest.mark.slow


def test_prestart_and_cache_levers_in_a_study(tmp_path: Path, orphan_check: list[str]) -> None:
    updates = dict(FAST)
    updates.update({
        # A searched variable changes from trial to trial: the spare starts without it.
        "parameters": [{"name": "nccl_proto", "env": "NCCL_PROTO", "kind": "categorical",
                        "values": [None, "LL", "Simple"]}],
        "budget.n_trials": 3, "budget.trial_timeout": "60s", "sampler.name": "grid",
        "execution.startup": {"prestart": True, "triton_cache": True, "startup_plan": True},
        "execution.compile_cache_dir": str(tmp_path / "cache"),
    })
    path, marker = write_study(tmp_path, updates=updates)
    orphan_check.append(marker)
    results = tmp_path / "results"
    out = run_tuner("run", str(path), "--results", str(results))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert processes_with_env(marker) == [], "a spare interpreter outlived the run"
    root = results / path.stem
    outcomes = [json.loads((root / "trials" / f"{n:04d}" / "outcome.json").read_text()) for n in range(3)]
    assert all(o["status"] == "completed" and o["applied"] for o in outcomes), outcomes
    used = [o for o in outcomes if o["prestart"]["used"]]
    # The first server of the worker starts cold (no probe here, so no reference job before).
    assert [o["number"] for o in used] == [1, 2], [o["prestart"] for o in outcomes]
    assert "first server" in outcomes[0]["prestart"]["reason"] and outcomes[0]["start_wait_s"] is None
    for outcome in used:
        ahead = outcome["prestart"]["import_s"]
        assert outcome["start_wait_s"] == pytest.approx(outcome["startup_s"] - ahead)
        startup = json.loads((root / "trials" / f"{outcome['number']:04d}" / "startup.json").read_text())
        assert startup["overlapped_s"] == ahead
        assert sum(startup["phases"].values()) == pytest.approx(outcome["startup_s"], abs=0.01)
    command = json.loads((root / "trials" / "0001" / "command.json").read_text())
    assert command["env"]["TRITON_CACHE_DIR"] == str(tmp_path / "cache" / "triton")
    assert command["env"]["VLLM_ENABLE_STARTUP_PLAN"] == "1"
    status = run_tuner("status", path.stem, "--results", str(results)).stdout
    assert "from a spare interpreter" in status and "done ahead by a spare interpreter" in status, status
    exported = run_tuner("export", path.stem, "--results", str(results), "--trial", "1", "--format", "json")
    assert exported.returncode == 0, exported.stderr
    env = json.loads(exported.stdout)["env"]
    assert "TRITON_CACHE_DIR" not in env and "VLLM_ENABLE_STARTUP_PLAN" not in env
