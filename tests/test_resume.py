"""kill -9 of the tuner in the middle of a trial, then `tuner resume`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import optuna
import pytest

from tests.conftest import ROOT, processes_with_env, record_fault_row, run_tuner, tuner_argv, write_study
from tests.faultkit import wait_server_starting
from tests.waiting import wait_for
from tuner.adapters import proctree

pytestmark = pytest.mark.slow


def completed_runs(storage: str, name: str) -> dict[int, tuple[str, tuple[float, ...] | None, str]]:
    study = optuna.load_study(study_name=name, storage=storage)
    out = {}
    for t in study.get_trials(deepcopy=False):
        if t.user_attrs.get("kind", "run") == "run":
            out[t.number] = (t.state.name, tuple(t.values) if t.values else None,
                             json.dumps(t.user_attrs.get("values"), sort_keys=True))
    return out


def test_sigkill_mid_trial_then_resume(tmp_path: Path, orphan_check: list[str]) -> None:
    study, marker = write_study(
        # Unapplied knobs are not held against a trial here, so none is stopped early at
        # verify (cudagraph FULL is downgraded by the simulated backend): such a trial ends
        # in a second, before the kill could land in it.
        tmp_path, updates={"budget.n_trials": 6, "verify.require_applied": False},
        # A slower start widens the window in which the kill lands mid-trial.
        # (simulated seconds: 400 x the demo's startup scale 0.005 = 2 s)
        env={"TUNER_SIM_FAULTS": json.dumps([{"fault": "slow_start", "seconds": 400}])},
    )
    orphan_check.append(marker)
    name = study.stem
    results = tmp_path / "results"
    storage = f"sqlite:///{(results / name / 'optuna.db').resolve()}"
    proc = subprocess.Popen(tuner_argv("run", str(study), "--results", str(results)), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    trials = results / name / "trials"

    def third_trial_server() -> Path | None:
        if len(list(trials.glob("*/outcome.json"))) < 2:
            return None
        return next(iter(trials.glob("*/server.pid")), None)

    # Kill while the third run trial's server is starting (two trials completed before),
    # once it is under way (its EngineCore started).
    def tuner_exited() -> str | None:
        return None if proc.poll() is None else f"tuner exited {proc.returncode}:\n{proc.stdout.read()}"

    victim_pid_file = wait_for(third_trial_server, 300, "the third trial's server", unless=tuner_exited)
    server_pgid = wait_server_starting(victim_pid_file.parent, timeout=60)
    before = completed_runs(storage, name)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdout.close()
    done_before = {n: v for n, v in before.items() if v[0] == "COMPLETE"}
    assert done_before, "no trial had completed before the kill"
    # The killed run's time up to its last finished trial is in the storage (status, report
    # and a resume's --timeout count it), although the run never reached its own ending.
    killed_elapsed = optuna.load_study(study_name=name, storage=storage).user_attrs.get("elapsed_s", 0.0)
    assert killed_elapsed > 0.0
    # The storage still holds the trial the kill cut off as running; status says nothing runs it.
    cut_off = [n for n, v in before.items() if v[0] == "RUNNING"]
    status = run_tuner("status", name, "--results", str(results), "--brief").stdout
    assert f"nothing is running: trial(s) {', '.join(map(str, cut_off))} were cut off" in status, status
    assert f"`tuner resume {name}`" in status and "\n  running: trial" not in status, status

    # A second resume while the first runs must refuse; start the first in the background.
    first = subprocess.Popen(tuner_argv("resume", name, "--results", str(results)), cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # ... once it holds the study folder (its pid in the folder's lock).
    lock = results / name / "run.lock"
    wait_for(lambda: lock.read_text().startswith(f"pid {first.pid} "), 120, "the first resume to take the study",
             unless=lambda: first.poll() is not None and f"the first resume exited {first.returncode}")
    refused_began = time.monotonic()
    second = run_tuner("resume", name, "--results", str(results), timeout=120)
    refused_after = time.monotonic() - refused_began
    out, _ = first.communicate(timeout=600)
    print(out[-3000:])
    assert first.returncode == 0, out[-3000:]
    assert second.returncode == 3 and "already being run" in second.stderr, second.stderr

    assert not proctree.group_members(server_pgid), "resume did not stop the leftover server"
    after = completed_runs(storage, name)
    for number, (state, values, params) in done_before.items():
        assert after[number] == (state, values, params), f"completed trial {number} changed"
    interrupted = [n for n in after if n not in done_before and after[n][0] == "FAIL"]
    study_obj = optuna.load_study(study_name=name, storage=storage)
    assert study_obj.user_attrs["elapsed_s"] > killed_elapsed
    reasons = {t.number: t.user_attrs.get("failure", {}).get("reason") for t in study_obj.trials}
    counted = [n for n, v in after.items() if v[0] in ("COMPLETE", "FAIL") and reasons.get(n) != "interrupted"]
    assert len(counted) == 6, (after, reasons)
    assert any(reasons.get(n) == "interrupted" for n in interrupted)
    assert all(v[0] != "RUNNING" for v in after.values())
    # No completed configuration was measured twice, but for the baseline's fresh starts for
    # the study's noise (load.noise_starts), which are repeats on purpose.
    noise_starts = {t.number for t in study_obj.trials if t.user_attrs.get("noise_start")}
    complete_params = [v[2] for n, v in after.items() if v[0] == "COMPLETE" and n not in noise_starts]
    assert len(complete_params) == len(set(complete_params))
    assert not processes_with_env(marker)
    record_fault_row("tuner SIGKILL, then resume", detection="on resume (reconcile)", lost=0, orphans=0,
                     reason="interrupted; leftover server stopped; re-run")
    record_fault_row("two resumes at once", detection=f"second refused in {refused_after:.2f} s", lost=0,
                     orphans=0, reason="exit 3 'already being run'")


def test_resume_stops_a_server_left_by_a_killed_run(tmp_path: Path, orphan_check: list[str]) -> None:
    """The pid-file path of reconcile: a live server recorded in trials/*/server.pid."""

    import sys

    from tuner.commands.run import load_spec_file
    from tuner.engine.recovery import stop_leftover_servers
    from tuner.store.handle import create_or_open

    study, marker = write_study(tmp_path)
    orphan_check.append(marker)
    spec = load_spec_file(str(study))
    handle = create_or_open(spec, tmp_path / "results")
    trial_dir = handle.paths.trial_dir(3)
    trial_dir.mkdir(parents=True)
    argv = [sys.executable, "-m", "tuner.sim", "--model", "m", "--port", str(spec.server.port)]
    env = dict(os.environ, TUNER_TEST_ID=marker, TUNER_SIM_PROFILE="tiny-cpu", TUNER_SIM_TIME_SCALE="0.01")
    server = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    import socket as socket_mod
    (trial_dir / "server.pid").write_text(json.dumps(
        {"pgid": server.pid, "argv": argv, "host": socket_mod.gethostname(), "port": spec.server.port}))
    wait_for(lambda: len(proctree.group_members(server.pid)) >= 2, 30, "the simulator and its EngineCore child")
    assert len(proctree.group_members(server.pid)) == 2
    lines: list[str] = []
    stop_leftover_servers(handle.paths, spec.server.stop_timeout, lines.append)
    server.wait(timeout=10)
    assert not proctree.group_members(server.pid)
    assert not (trial_dir / "server.pid").exists()
    assert any("stopped a server left running" in line for line in lines)

    # A pid file whose process is no longer ours (pid reused by something else) is left alone.
    other = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                             start_new_session=True)   # lives until the test lets go
    try:
        (trial_dir / "server.pid").write_text(json.dumps(
            {"pgid": other.pid, "argv": argv, "host": socket_mod.gethostname(), "port": 1}))
        stop_leftover_servers(handle.paths, spec.server.stop_timeout, lines.append)
        assert other.poll() is None, "killed a process that was not our server"
    finally:
        other.kill()
        other.wait()
