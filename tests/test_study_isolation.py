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

from tests.conftest import (
    failure_reasons,
    free_port_block,
    host_probes_running,
    load_trials,
    lost_completed,
    run_tuner,
    wait_no_orphans,
    write_study,
)
from tests.faultkit import (
    FAST,
    SIM_ENV,
    SLOW_START,
    STOP_TIMEOUT_S,
    Tuner,
    fault_study,
    running_trial_dirs,
    wait_for,
    wait_server_starting,
)
from tuner.adapters import host_probe, proctree

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
    """Every result file under ``root`` by its content: all but the locks (the folder's, and
    the run's marker in the storage, taken and given back by every run)."""

    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name not in ("run.lock", "optuna.db")}


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


def _first_server_up(folder: Path) -> bool:
    """A server of the run is up or starting (the reference's or a trial's pid file)."""

    return bool(list(folder.rglob("server.pid")))


def test_a_second_run_on_a_shared_storage_is_refused_and_changes_nothing(
        tmp_path: Path, orphan_check: list[str]) -> None:
    study, marker = _long_start_study(tmp_path, n_trials=1)
    orphan_check.append(marker)
    name = study.stem
    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    first_results = tmp_path / "first"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    first = Tuner(tmp_path, "run", str(study), "--results", str(first_results), "--storage", storage)
    try:
        wait_for(lambda: _first_server_up(first_results / name), 180, "the first run's server", first)
        # Another working directory, a relative --results: another folder, the same storage.
        began = time.monotonic()
        second = run_tuner("run", str(study), "--results", "results", "--storage", storage,
                           cwd=elsewhere, timeout=400)
        refused_in = time.monotonic() - began
        code = first.wait(timeout=300)
    finally:
        first.stop()
    print(first.own_output[-3000:], second.stdout[-2000:], second.stderr[-2000:], sep="\n")
    assert second.returncode == 3, second.stderr[-3000:]
    assert f"study {name!r}" in second.stderr and "already being run" in second.stderr, second.stderr
    assert str(first_results / name) in second.stderr, second.stderr   # where the holder's files are
    assert not (elsewhere / "results").exists(), sorted(elsewhere.rglob("*"))
    print(f"refused in {refused_in:.2f} s")
    assert code == 0, first.own_output[-3000:]
    trials = [t for t in load_trials(first_results, name, storage)
              if t.user_attrs.get("kind", "run") == "run"]
    assert [t.state.name for t in trials] == ["COMPLETE"]
    assert "1/1 trials finished" in first.output


def test_a_refused_resume_leaves_every_file_as_it_was(tmp_path: Path, orphan_check: list[str]) -> None:
    study, marker = _long_start_study(tmp_path, n_trials=1)
    orphan_check.append(marker)
    name, results = study.stem, tmp_path / "results"
    first = Tuner(tmp_path, "run", str(study), "--results", str(results))
    try:
        wait_for(lambda: _first_server_up(results / name), 180, "the run's server", first)
        kept = {f: (results / name / f).read_bytes() for f in ("study.json", "spec.yaml")}
        refused = run_tuner("resume", name, "--results", str(results), "--n-trials", "50", timeout=120)
        after_refusal = {f: (results / name / f).read_bytes() for f in kept}
        code = first.wait(timeout=300)
    finally:
        first.stop()
    assert refused.returncode == 3, refused.stderr[-3000:]
    assert "already being run" in refused.stderr
    assert after_refusal == kept
    assert code == 0, first.own_output[-3000:]
    status = json.loads(run_tuner("status", name, "--results", str(results), "--json").stdout)
    assert (status["finished_trials"], status["target_trials"]) == (1, 1), status


def test_sigterm_stops_a_run_like_ctrl_c_and_status_says_nothing_runs(
        tmp_path: Path, orphan_check: list[str]) -> None:
    study, marker = fault_study(tmp_path, {256: [], 257: SLOW_START, 258: SLOW_START})
    orphan_check.append(marker)
    name, results = study.stem, tmp_path / "results"
    tuner = Tuner(tmp_path, "run", str(study), "--results", str(results))
    try:
        victim = wait_for(lambda: [d for d in running_trial_dirs(results, name) if d.name != "0000"], 180,
                          "the second trial", tuner)[0]
        pgid = wait_server_starting(victim, tuner)
        sent = time.monotonic()
        os.kill(tuner.proc.pid, signal.SIGTERM)   # as `timeout` and Kubernetes do: the tuner alone
        code = tuner.wait(timeout=60)
        took = time.monotonic() - sent
    finally:
        tuner.stop()
    print(tuner.own_output[-3000:])
    print(f"exit {code} {took:.2f} s after SIGTERM")
    assert code == 143, tuner.own_output[-3000:]
    assert f"interrupted by SIGTERM; run `tuner resume {name}` to continue" in tuner.output
    assert "Traceback" not in tuner.own_output
    assert took < STOP_TIMEOUT_S + 10, took
    assert pgid is not None and not proctree.group_members(pgid)
    number = int(victim.name)
    # The running trial was stopped as on Ctrl-C: its server by SIGTERM within its grace,
    # recorded interrupted, re-queued for the resume.
    outcome = json.loads((victim / "outcome.json").read_text())
    assert outcome["reason"] == "interrupted", outcome
    assert failure_reasons(results, name)[number] == "interrupted"
    waiting = [t for t in load_trials(results, name) if t.state.name == "WAITING"]
    assert len(waiting) == 1 and waiting[0].user_attrs["retry_of"] == number
    status = run_tuner("status", name, "--results", str(results), "--brief").stdout
    assert f"nothing is running; `tuner resume {name}` continues" in status, status
    assert "\n  running: trial" not in status
    assert not wait_no_orphans(marker)


def test_sigterm_before_the_trials_start_is_an_interruption_too(tmp_path: Path) -> None:
    """Stopped during the host check, before Ray or any server: the same exit and line."""

    study, marker = write_study(tmp_path, updates={"load.host_check_s": 30})
    name, results = study.stem, tmp_path / "results"
    tuner = Tuner(tmp_path, "run", str(study), "--results", str(results), env={"TUNER_TEST_ID": marker})
    try:
        wait_for(lambda: "[host] timing CPU work" in tuner.output, 120, "the host check", tuner)
        probes = len(host_probe.default_cpus())
        wait_for(lambda: host_probes_running(marker, tuner.proc.pid, probes), 60, "the host probes to run", tuner)
        os.kill(tuner.proc.pid, signal.SIGTERM)
        code = tuner.wait(timeout=30)
    finally:
        tuner.stop()
    assert code == 143, tuner.output[-3000:]
    assert f"interrupted by SIGTERM; run `tuner resume {name}` to continue" in tuner.output
    assert "Traceback" not in tuner.output, tuner.output[-3000:]


def test_port_moves_the_runs_servers_and_is_not_saved(tmp_path: Path, orphan_check: list[str]) -> None:
    study, marker = fault_study(tmp_path, {256: [], 257: []})
    orphan_check.append(marker)
    name, results = study.stem, tmp_path / "results"
    port = free_port_block()
    bad = run_tuner("run", str(study), "--results", str(results), "--port", "70000")
    assert bad.returncode == 2 and "--port: 70000 is not allowed" in bad.stderr, bad.stderr
    assert not results.exists()
    run = run_tuner("run", str(study), "--results", str(results), "--port", str(port), timeout=400)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    argv = [json.loads((d / "command.json").read_text())["argv"]
            for d in (results / name / "trials").iterdir()]
    assert len(argv) == 2 and all(a[a.index("--port") + 1] == str(port) for a in argv), argv
    # The saved spec keeps the study file's port: the same file runs again as the same study.
    assert f"port: {port}\n" not in (results / name / "spec.yaml").read_text()
    assert not wait_no_orphans(marker)


def test_a_finished_study_run_again_has_nothing_to_do(tmp_path: Path, orphan_check: list[str]) -> None:
    study, marker = fault_study(tmp_path, {256: [], 257: []}, n_trials=1)
    orphan_check.append(marker)
    name, results = study.stem, tmp_path / "results"
    first = run_tuner("run", str(study), "--results", str(results), timeout=400)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    kept = _digests(results / name)
    began = time.monotonic()
    again = run_tuner("run", str(study), "--results", str(results), timeout=120)
    took = time.monotonic() - began
    print(again.stdout, again.stderr, f"{took:.2f} s", sep="\n")
    assert again.returncode == 0, again.stderr
    assert f"study {name} has nothing to do: 1/1 trials finished" in again.stdout
    assert f"`tuner resume {name} --n-trials 2`" in again.stdout
    assert "[worker]" not in again.stdout          # no Ray, no server
    assert _digests(results / name) == kept
    assert not wait_no_orphans(marker)
