"""execution.startup in a real `tuner run` on the simulator (issue 35): with prestart every trial
after the first server is a spare interpreter released into the server, verified and measured
like a cold start; its imports count in startup_s (what a deployment pays) but not in the
trial's wait or in the startup share status gives; the phases still sum to startup_s; the
Triton cache under the study's cache root is measurement environment, never exported; and no
spare outlives the run. Both levers are on by default."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import load_trials, processes_with_env, run_tuner, write_study
from tests.faultkit import FAST

pytestmark = pytest.mark.slow


def test_prestart_and_cache_levers_in_a_study(tmp_path: Path, orphan_check: list[str]) -> None:
    updates = dict(FAST)
    updates.update({
        # A searched variable changes from trial to trial: the spare starts without it.
        "parameters": [{"name": "nccl_proto", "env": "NCCL_PROTO", "kind": "categorical",
                        "values": [None, "LL", "Simple"]}],
        "budget.n_trials": 3, "budget.trial_timeout": "60s", "sampler.name": "grid",
        # execution.startup left to its defaults: prestart and the Triton cache on.
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
    status = run_tuner("status", path.stem, "--results", str(results)).stdout
    assert "from a spare interpreter" in status and "done ahead by a spare interpreter" in status, status
    exported = run_tuner("export", path.stem, "--results", str(results), "--trial", "1", "--format", "json")
    assert exported.returncode == 0, exported.stderr
    env = json.loads(exported.stdout)["env"]
    assert "TRITON_CACHE_DIR" not in env


def test_startup_s_as_objective_and_limit_reaches_the_sampler_and_the_front(tmp_path: Path,
                                                                           orphan_check: list[str]) -> None:
    """A user searching for the fastest-starting configuration within a throughput target:
    startup_s (what a deployment pays, a spare's imports included) is an objective Optuna
    optimises and a limit it is told as a constraint, and the front carries it."""
    updates = dict(FAST)
    updates.update({
        "objectives": [{"metric": "output_tok_s", "concurrency": "max", "direction": "maximize"},
                       {"metric": "startup_s", "direction": "minimize"}],
        "limits": [{"metric": "startup_s", "max": 600}],
        "budget.n_trials": 2, "budget.trial_timeout": "60s",
    })
    path, marker = write_study(tmp_path, updates=updates)
    orphan_check.append(marker)
    results = tmp_path / "results"
    out = run_tuner("run", str(path), "--results", str(results))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    root = results / path.stem
    trials = [t for t in load_trials(results, path.stem) if t.user_attrs.get("kind") == "run"]
    assert len(trials) == 2
    for trial in trials:
        outcome = json.loads((root / "trials" / f"{trial.number:04d}" / "outcome.json").read_text())
        assert trial.values[1] == pytest.approx(outcome["startup_s"])       # what the sampler saw
        assert trial.system_attrs["constraints:limit:startup_s<=600.0"] == pytest.approx(outcome["startup_s"] - 600)
    front = json.loads((root / "pareto.json").read_text())
    assert front["front"] and all("startup_s" in point["values"] for point in front["front"])
