"""One run of one study touches only what it started, and one study in one storage is one
run at a time (issue 39, items 1, 2, 3, 7 and the --port option of 17), through real `tuner`
processes on the simulator:

- two studies with the same name, run side by side into two results folders, both measure
  every trial: neither takes the other's servers for its own leftovers;
- a second run of a study whose storage another run is using is refused, from any results
  folder, and a refused command (that run, or `resume --n-trials`) leaves every file as it
  was;
- SIGTERM (`timeout`, systemd, Kubernetes) stops a run like Ctrl-C: its own exit code, the
  trial recorded as interrupted, a line saying what to run next, and `status` says nothing
  runs;
- `--port` moves a run's servers; a finished study run again says it has nothing to do.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import failure_reasons, load_trials, lost_completed, run_tuner, wait_no_orphans, \
    write_study
from tests.faultkit import FAST, SIM_ENV, Tuner, running_trial_dirs, wait_for

pytestmark = pytest.mark.slow

# Servers that take long enough to start that two runs side by side always overlap, for
# longer than a worker waits for an earlier server of its group to go (stop_timeout + 5 s).
LONG_START_S = 12
LONG_START = {**FAST, "server.startup_timeout": "40s", "budget.trial_timeout": "60s",
              "probe.reference.enabled": True}


def _long_start_study(tmp_path: Path, *, name: str | None = None, n_trials: int = 2,
                      start_s: float = LONG_START_S) -> tuple[Path, str]:
    # slow_start counts simulated seconds, scaled by TUNER_SIM_STARTUP_SCALE (0.002).
    tmp_path.mkdir(parents=True, exist_ok=True)
    faults = [{"fault": "slow_start", "seconds": start_s / SIM_ENV["TUNER_SIM_STARTUP_SCALE"]}]
    updates = {**LONG_START, "budget.n_trials": n_trials,
               "parameters": [{"name": "seqs", "flag": "max_num_seqs", "kind": "categorical",
                               "values": [256, 257, 258], "default": 256}]}
    return write_study(tmp_path, name=name, updates=updates,
                       env={**SIM_ENV, "TUNER_SIM_FAULTS": json.dumps(faults)})


def _digests(root: Path) -> dict[str, str]:
    """Every file under ``root`` by its content (what a refused command must not change)."""

    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_two_same_name_studies_side_by_side_both_measure_every_trial(
        tmp_path: Path, orphan_check: list[str]) -> None:
    name = f"same{os.getpid()}"
    first, first_marker = _long_start_study(tmp_path / "a", name=name)
    second, second_marker = _long_start_study(tmp_path / "b", name=name)
    orphan_check.extend([first_marker, second_marker])
    results = [tmp_path / "a" / "results", tmp_path / "b" / "results"]
    runs = [Tuner(tmp_path / "a", "run", str(first), "--results", str(results[0])),
            Tuner(tmp_path / "b", "run", str(second), "--results", str(results[1]))]
    try:
        codes = [run.wait(timeout=400) for run in runs]
    finally:
        for run in runs:
            run.stop()
    for run, code in zip(runs, codes):
        print(run.own_output[-3000:])
        assert code == 0, run.own_output[-3000:]
        assert "earlier server" not in run.output
    for folder in results:
        trials = [t for t in load_trials(folder, name) if t.user_attrs.get("kind", "run") == "run"]
        assert len(trials) == 2 and all(t.state.name == "COMPLETE" and t.values for t in trials), \
            [(t.number, t.state.name, t.user_attrs.get("failure")) for t in trials]
        assert lost_completed(folder, name) == 0
        for outcome in (folder / name).glob("**/outcome.json"):
            assert not json.loads(outcome.read_text()).get("warnings"), outcome
    assert not wait_no_orphans(first_marker) and not wait_no_orphans(second_marker)
