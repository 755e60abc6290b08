"""Fault injection through real `tuner run` processes (Ray, Optuna SQLite, simulators).

Each scenario checks: the failure is recorded with its typed reason, no completed trial is
lost (every completed outcome.json is a COMPLETE trial in the storage), no process of the
study survives (the TUNER_TEST_ID marker in the simulators' and watchdogs' environment),
and the study finishes or stops resumably. Each adds a row to the table printed at the end
of the session (tests/conftest.py: pytest_terminal_summary).

Detection time, precisely:
- a server that dies (at start or mid-load): ``detected_unix`` (the worker's wall clock
  when it raised the typed failure) minus the mtime of ``server.log`` (the server's last
  write, just before it exits); the write precedes the exit, so this is an upper bound of
  exit -> detection. A fatal log line is detected before the exit, from the line itself;
- a hang: ``detected_unix - started_unix`` of the trial, against the configured timeout;
- a killed worker: the driver's ``detected_unix`` minus the moment the test sent SIGKILL;
- Ctrl-C / storage: the tuner's exit minus the moment of the signal / of the lock.

Most server faults share one study (one Ray start): a grid over ``max_num_seqs`` whose
values each trigger one simulator fault through ``when``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import waiting
from tests.conftest import (
    LOADED_BOX_SLACK_S,
    ROOT,
    failure_reasons,
    load_trials,
    lost_completed,
    record_fault_row,
    wait_no_orphans,
)
from tests.faultkit import (
    SLOW_START,
    STARTUP_TIMEOUT_S,
    STOP_TIMEOUT_S,
    TRIAL_TIMEOUT_S,
    Tuner,
    assert_still_running,
    counted,
    fault_study,
    fill,
    first_ctrl_c_taken,
    hold_lock,
    mount_tmpfs,
    running_trial_dirs,
    server_pgid_of,
    trial_dir_of,
    wait_for,
    wait_server_starting,
)
from tuner.adapters import proctree

pytestmark = pytest.mark.slow

# -- the server fault matrix -------------------------------------------------------------

# Load-phase faults count the load generator's (streamed) requests only, so they land in the
# measured levels whatever the probe sends first.
IN_LOAD = {"counting": "streamed"}

MATRIX: dict[int, tuple[str, list[dict[str, Any]]]] = {
    256: ("clean (baseline)", []),
    257: ("crash at start", [{"fault": "crash_at_start"}]),
    258: ("out-of-memory log at start", [{"fault": "oom_at_start"}]),
    259: ("hang at start", [{"fault": "hang_at_start"}]),
    260: ("crash mid-load", [{"fault": "crash_mid_load", "after_requests": 2, **IN_LOAD}]),
    261: ("hang mid-stream", [{"fault": "hang_mid_stream", "after_requests": 2, **IN_LOAD}]),
    262: ("ignores SIGTERM", [{"fault": "ignore_sigterm"}]),
    263: ("garbage SSE", [{"fault": "garbage_sse", "after_requests": 2, **IN_LOAD}]),
    264: ("HTTP 5xx burst", [{"fault": "http_5xx", "after_requests": 2, "count": 2, **IN_LOAD}]),
    # Started slowly (1500 simulated s x 0.002 = 3 s) so the worker can be killed mid-trial.
    265: ("trial worker SIGKILLed", [{"fault": "slow_start", "seconds": 1500}]),
}
KILL_CASE = 265


class WorkerKiller(threading.Thread):
    """SIGKILLs the Ray worker running the KILL_CASE trial, found as its server's parent."""

    def __init__(self, trials: Path) -> None:
        super().__init__(daemon=True)
        self.trials = trials
        self.done = threading.Event()
        self.killed: dict[str, Any] = {}
        self.error: str | None = None

    def _kill_case_server(self) -> tuple[Path, int] | None:
        for command in self.trials.glob("*/command.json"):
            try:
                case = json.loads(command.read_text())["values"]["case"]
            except (OSError, ValueError, KeyError):
                continue
            pgid = server_pgid_of(command.parent)
            if case == KILL_CASE and pgid is not None:
                return command.parent, pgid
        return None

    def run(self) -> None:
        def study_over() -> str | None:
            return "the study ended first" if self.done.is_set() else None

        try:
            trial_dir, pgid = waiting.wait_for(self._kill_case_server, 600, "the kill case's server",
                                               unless=study_over)
            # Killed well into its startup: once its EngineCore runs.
            log = trial_dir / "server.log"
            waiting.wait_for(lambda: log.exists() and "(EngineCore pid=" in log.read_text(errors="replace"), 60,
                             "the kill case's server to start its engine", unless=study_over)
        except AssertionError:
            return   # the test's own asserts say the worker was never found
        self._kill(trial_dir, pgid)

    def _kill(self, trial_dir: Path, pgid: int) -> None:
        worker = proctree.parent_pid(pgid)
        title = " ".join(proctree.cmdline(worker)) if worker else ""
        if "TrialWorker" not in title:
            self.error = f"parent of server {pgid} is {worker} ({title!r}), not the trial worker"
            return
        os.kill(worker, signal.SIGKILL)
        self.killed = {"trial": int(trial_dir.name), "worker": worker, "pgid": pgid, "at": time.time()}


def test_server_fault_matrix(tmp_path: Path, orphan_check: list[str]) -> None:
    study, marker = fault_study(tmp_path, {case: faults for case, (_, faults) in MATRIX.items()})
    orphan_check.append(marker)
    name, results = study.stem, tmp_path / "results"
    (results / name / "trials").mkdir(parents=True)
    killer = WorkerKiller(results / name / "trials")
    killer.start()
    began = time.monotonic()
    tuner = Tuner(tmp_path, "run", str(study), "--results", str(results))
    try:
        code = tuner.wait(timeout=400)
    finally:
        killer.done.set()
        tuner.stop()
    print(tuner.output[-5000:])
    print(f"fault matrix study took {time.monotonic() - began:.1f}s")
    assert code == 0, tuner.output[-4000:]
    assert killer.error is None, killer.error
    assert killer.killed, "the worker of the kill case was never found"
    assert not proctree.group_members(killer.killed["pgid"]), "the killed worker's server survived"

    orphans = wait_no_orphans(marker)
    lost = lost_completed(results, name)
    trials = [t for t in load_trials(results, name) if t.user_attrs.get("kind", "run") == "run"]
    by_case = {t.user_attrs["values"]["case"]: t for t in trials}
    assert sorted(by_case) == sorted(MATRIX), "every case ran once"
    assert all(t.state.name in ("COMPLETE", "FAIL") for t in trials)

    def outcome(case: int) -> dict[str, Any]:
        return json.loads((trial_dir_of(results, name, by_case[case].number) / "outcome.json").read_text())

    def failure(case: int) -> str | None:
        return by_case[case].user_attrs.get("failure", {}).get("reason")

    def after_exit(case: int) -> float:
        log = trial_dir_of(results, name, by_case[case].number) / "server.log"
        return outcome(case)["detected_unix"] - log.stat().st_mtime

    def since_start(case: int) -> float:
        o = outcome(case)
        return o["detected_unix"] - o["started_unix"]

    def failed_requests(case: int) -> dict[str, int]:
        metrics = json.loads((trial_dir_of(results, name, by_case[case].number) / "metrics.json").read_text())
        reasons: dict[str, int] = {}
        for level in metrics["levels"]:
            for kind, n in level["metrics"]["failure_reasons"].items():
                reasons[kind] = reasons.get(kind, 0) + n
        return reasons

    rows: list[tuple[str, str, str]] = []
    # Clean: completed and feasible.
    assert by_case[256].state.name == "COMPLETE" and all(v <= 0 for v in by_case[256].constraints.values())
    rows.append(("clean (baseline)", "-", "completed, feasible"))
    # Deaths at start: typed reason from the log, detected within 2 s of the exit.
    for case, reason in ((257, "cuda_error"), (258, "gpu_memory_insufficient")):
        assert failure(case) == reason, (case, by_case[case].user_attrs.get("failure"))
        latency = after_exit(case)
        assert latency < 2.0 + LOADED_BOX_SLACK_S, f"{MATRIX[case][0]}: detected {latency:.2f}s after its last write"
        how = "after exit" if outcome(case)["stop"]["signal"] == "none" else "after its fatal line (before exit)"
        rows.append((MATRIX[case][0], f"{latency:.2f} s {how}", reason))
    # Hang at start: the startup timeout, not the trial timeout.
    assert failure(259) == "startup_timeout"
    took = since_start(259)
    assert STARTUP_TIMEOUT_S <= took < STARTUP_TIMEOUT_S + 4 + LOADED_BOX_SLACK_S, took
    rows.append(("hang at start", f"{took:.2f} s (startup_timeout {STARTUP_TIMEOUT_S} s)", "startup_timeout"))
    # Crash mid-load: the watcher sees the exit, not an empty measurement.
    assert failure(260) == "server_died"
    latency = after_exit(260)
    assert latency < 2.0 + LOADED_BOX_SLACK_S, latency
    rows.append(("crash mid-load", f"{latency:.2f} s after exit", "server_died"))
    # Hang mid-stream: the trial deadline ends it and the server is stopped.
    assert failure(261) == "trial_timeout"
    took = since_start(261)
    assert TRIAL_TIMEOUT_S <= took < TRIAL_TIMEOUT_S + 4 + LOADED_BOX_SLACK_S, took
    assert outcome(261)["stop"]["signal"] in ("SIGTERM", "SIGKILL")
    rows.append(("hang mid-stream", f"{took:.2f} s (trial_timeout {TRIAL_TIMEOUT_S} s)", "trial_timeout"))
    # Ignores SIGTERM: the stop escalates after the grace and leaves nothing behind.
    stop = outcome(262)["stop"]
    assert by_case[262].state.name == "COMPLETE"
    assert stop["signal"] == "SIGKILL" and stop["seconds"] >= STOP_TIMEOUT_S and not stop["leftover_pids"], stop
    rows.append(("ignores SIGTERM", f"SIGKILL after {stop['seconds']:.2f} s (grace {STOP_TIMEOUT_S} s)",
                 "completed; stop escalated to SIGKILL"))
    # Garbage SSE and a 5xx burst: measured, but failed requests make the point infeasible.
    for case, kind in ((263, "malformed_stream"), (264, "http_status")):
        trial = by_case[case]
        assert trial.state.name == "COMPLETE", trial.user_attrs.get("failure")
        assert trial.constraints["load_errors"] > 0, trial.constraints
        reasons = failed_requests(case)
        assert set(reasons) == {kind}, reasons
        rows.append((MATRIX[case][0], f"per request ({sum(reasons.values())} x {kind})",
                     f"load_errors={trial.constraints['load_errors']:.0f} (infeasible)"))
    pareto = json.loads((results / name / "pareto.json").read_text())
    front = {entry["trial"] for entry in pareto["front"]}
    assert front and front <= {by_case[256].number, by_case[262].number, by_case[265].number}, front
    # The killed worker: its trial is worker_lost, a new worker ran the rest.
    assert by_case[KILL_CASE].number == killer.killed["trial"]
    assert failure(KILL_CASE) == "worker_lost"
    lost_after = by_case[KILL_CASE].user_attrs["outcome"]["detected_unix"] - killer.killed["at"]
    assert lost_after < 10, lost_after
    later = [t for t in trials if t.number > killer.killed["trial"]]
    assert "replacing its trial worker" in tuner.output
    assert all(t.state.name in ("COMPLETE", "FAIL") for t in later)
    driver_outcome = json.loads((trial_dir_of(results, name, killer.killed["trial"]) / "outcome.json").read_text())
    assert driver_outcome["reason"] == "worker_lost"
    rows.append(("trial worker SIGKILLed", f"{lost_after:.2f} s after the kill", "worker_lost; worker replaced"))

    for scenario, detection, reason in rows:
        record_fault_row(scenario, detection=detection, lost=lost, orphans=len(orphans), reason=reason)
    assert lost == 0
    assert not orphans, orphans


# -- port taken ----------------------------------------------------------------------------


def test_port_taken(tmp_path: Path, orphan_check: list[str]) -> None:
    """A port held by something else is found before anything starts (the pre-flight, issue 39
    item 15): the run stops at once, naming the port and its holder, and makes no folder. A
    port taken later, between the pre-flight and a trial's start, fails that trial
    ``port_in_use`` before its server starts (tests/test_launcher.py)."""

    study, marker = fault_study(tmp_path, {256: [], 257: []})
    orphan_check.append(marker)
    name, results = study.stem, tmp_path / "results"
    port = yaml.safe_load(study.read_text())["server"]["port"]
    holder = subprocess.Popen(
        [sys.executable, "-c", "import socket,sys\n"
         "s=socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen()\n"
         "print('listening', flush=True); sys.stdin.read()", str(port)],   # holds it until let go
        env=dict(os.environ, TUNER_TEST_ID=marker), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "listening"
        began = time.monotonic()
        tuner = Tuner(tmp_path, "run", str(study), "--results", str(results))
        code = tuner.wait(timeout=300)
        took = time.monotonic() - began
    finally:
        holder.kill()
        holder.wait()
    assert code == 3, tuner.output[-3000:]
    assert f"server.port: port {port} on 127.0.0.1 is already in use (held by pid {holder.pid})" in tuner.output
    assert not (results / name).exists(), "a refused study made its folder"
    orphans = wait_no_orphans(marker)
    record_fault_row("port taken", detection=f"{took:.2f} s (pre-flight, before Ray)", lost=0,
                     orphans=len(orphans), reason=f"refused, names pid {holder.pid}")
    assert not orphans


# -- Ctrl-C -----------------------------------------------------------------------------------



def test_ctrl_c_aborts_the_trial_cleanly_and_resume_reruns_it(tmp_path: Path, orphan_check: list[str]) -> None:
    study, marker = fault_study(tmp_path, {256: [], 257: SLOW_START, 258: SLOW_START})
    orphan_check.append(marker)
    name, results = study.stem, tmp_path / "results"
    tuner = Tuner(tmp_path, "run", str(study), "--results", str(results))
    try:
        # Press Ctrl-C while the second trial's server is starting.
        victim = wait_for(lambda: [d for d in running_trial_dirs(results, name) if d.name != "0000"], 120,
                          "the second trial", tuner)[0]
        pgid = wait_server_starting(victim, tuner)
        pressed = time.monotonic()
        tuner.ctrl_c()
        code = tuner.wait(timeout=60)
        took = time.monotonic() - pressed
    finally:
        tuner.stop()
    print(tuner.output[-3000:])
    assert code == 130, tuner.output[-3000:]
    assert f"tuner resume {name}" in tuner.output
    assert took < STOP_TIMEOUT_S + 10, took
    assert pgid is not None and not proctree.group_members(pgid)
    orphans = wait_no_orphans(marker, timeout=5)
    number = int(victim.name)
    # ray.cancel reached run_trial as CancelledError: the worker stopped the server
    # (SIGTERM, no SIGKILL needed) and wrote the outcome with the reason it was sent.
    outcome = json.loads((victim / "outcome.json").read_text())
    assert outcome["reason"] == "interrupted" and outcome["stop"]["signal"] == "SIGTERM", outcome
    assert failure_reasons(results, name)[number] == "interrupted"
    waiting = [t for t in load_trials(results, name) if t.state.name == "WAITING"]
    assert len(waiting) == 1 and waiting[0].user_attrs["retry_of"] == number
    done_before = {t.number: t.values for t in load_trials(results, name) if t.state.name == "COMPLETE"}
    assert done_before

    resume = Tuner(tmp_path, "resume", name, "--results", str(results), tag="resume")
    assert resume.wait(timeout=300) == 0, resume.output[-3000:]
    after = {t.number: t for t in load_trials(results, name)}
    assert all(after[n].values == v for n, v in done_before.items()), "a completed trial changed"
    retried = [t for t in after.values() if t.user_attrs.get("retry_of") == number]
    assert len(retried) == 1 and retried[0].state.name == "COMPLETE"
    assert counted(results, name) == 3
    lost = lost_completed(results, name)
    orphans += wait_no_orphans(marker)
    record_fault_row("tuner Ctrl-C, then resume", detection=f"exit 130 {took:.2f} s after Ctrl-C",
                     lost=lost, orphans=len(orphans), reason="interrupted; re-run on resume")
    assert lost == 0 and not orphans


def test_second_ctrl_c_stops_at_once(tmp_path: Path, orphan_check: list[str]) -> None:
    """The servers ignore SIGTERM and the grace is long: only the second Ctrl-C ends it soon."""

    grace = 60
    study, marker = fault_study(tmp_path, {256: [{"fault": "ignore_sigterm"}, *SLOW_START], 257: []},
                                updates={"server.stop_timeout": f"{grace}s"})
    orphan_check.append(marker)
    name, results = study.stem, tmp_path / "results"
    tuner = Tuner(tmp_path, "run", str(study), "--results", str(results))
    try:
        victim = wait_for(lambda: running_trial_dirs(results, name), 120, "the first trial", tuner)[0]
        pgid = wait_server_starting(victim, tuner)
        tuner.ctrl_c()
        first_ctrl_c_taken(tuner)
        # The first stop is now waiting out the SIGTERM grace the server ignores.
        assert_still_running(tuner, 1.0, "the first Ctrl-C must wait for the servers")
        pressed = time.monotonic()
        tuner.ctrl_c()
        code = tuner.wait(timeout=30)
        took = time.monotonic() - pressed
    finally:
        tuner.stop()
    print(tuner.output[-3000:])
    assert code == 130, tuner.output[-3000:]
    assert took < 10, f"second Ctrl-C took {took:.1f}s"
    assert pgid is not None and not proctree.group_members(pgid)
    orphans = wait_no_orphans(marker, timeout=5)
    reasons = failure_reasons(results, name)
    assert reasons.get(int(victim.name)) == "interrupted", reasons
    lost = lost_completed(results, name)
    record_fault_row("tuner Ctrl-C twice", detection=f"exit 130 {took:.2f} s after 2nd (grace {grace} s)",
                     lost=lost, orphans=len(orphans), reason="interrupted; servers SIGKILLed")
    assert lost == 0 and not orphans


# -- storage ----------------------------------------------------------------------------------

def test_storage_locked_stops_resumably(tmp_path: Path, orphan_check: list[str]) -> None:
    study, marker = fault_study(tmp_path, {256: [], 257: SLOW_START})
    orphan_check.append(marker)
    name, results = study.stem, tmp_path / "results"
    retry_s = 3
    tuner = Tuner(tmp_path, "run", str(study), "--results", str(results), env={"TUNER_STORAGE_RETRY_S": str(retry_s)})
    locker = None
    try:
        victim = wait_for(lambda: [d for d in running_trial_dirs(results, name) if d.name != "0000"], 120,
                          "the second trial", tuner)[0]
        locker = hold_lock(results / name / "optuna.db", 120)
        locked_at = time.monotonic()
        code = tuner.wait(timeout=120)
        took = time.monotonic() - locked_at
    finally:
        tuner.stop()
        if locker is not None:
            locker.kill()
            locker.wait()
    print(tuner.output[-3000:])
    assert code == 3, tuner.output[-3000:]
    assert "database is locked" in tuner.output and f"tuner resume {name}" in tuner.output
    assert retry_s <= took < retry_s + STOP_TIMEOUT_S + 15, took
    orphans = wait_no_orphans(marker, timeout=5)
    assert not (victim / "server.pid").exists(), "the running trial's server was not stopped"

    resume = Tuner(tmp_path, "resume", name, "--results", str(results), tag="resume")
    assert resume.wait(timeout=300) == 0, resume.output[-3000:]
    assert counted(results, name) == 2
    assert failure_reasons(results, name)[int(victim.name)] == "interrupted"
    lost = lost_completed(results, name)
    orphans += wait_no_orphans(marker)
    record_fault_row("storage locked (sqlite)", detection=f"exit 3 {took:.2f} s after lock (retry {retry_s} s)",
                     lost=lost, orphans=len(orphans), reason="StorageUnavailable; resumed OK")
    assert lost == 0 and not orphans


# -- disk full ----------------------------------------------------------------------------------


def test_disk_full(tmp_path: Path, orphan_check: list[str]) -> None:
    """Real ENOSPC from small tmpfs mounts: one trial's folder is full from the start; later
    the whole results disk fills up while pareto.json must be rewritten."""

    study, marker = fault_study(tmp_path, {256: [], 257: [], 258: [], 259: []}, n_trials=3)
    orphan_check.append(marker)
    name, results = study.stem, tmp_path / "results"
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"  # the storage is not on the full disk
    mounts: list[Path] = []
    try:
        mount_tmpfs(results, "8m")
        mounts.append(results)
        full_trial = trial_dir_of(results, name, 1)
        mount_tmpfs(full_trial, "64k")
        mounts.append(full_trial)
        fill(full_trial)
        tuner = Tuner(tmp_path, "run", str(study), "--results", str(results), "--storage", storage)
        assert tuner.wait(timeout=300) == 0, tuner.output[-3000:]
        reasons = failure_reasons(results, name, storage)
        assert reasons[1] == "disk_full", reasons
        trial1 = next(t for t in load_trials(results, name, storage) if t.number == 1)
        assert trial1.user_attrs["failure"]["phase"] == "prepare"
        assert not (full_trial / "server.log").exists(), "no server may start without its files"
        assert sum(1 for r in reasons.values() if r is None) == 2, reasons  # the study went on
        pareto_path = results / name / "pareto.json"
        before = json.loads(pareto_path.read_text())
        assert before["trials_finished"] == 3

        fill(results)  # now the whole results disk is full
        resume = Tuner(tmp_path, "resume", name, "--results", str(results), "--storage", storage,
                       "--n-trials", "4", tag="resume")
        assert resume.wait(timeout=300) == 0, resume.output[-3000:]
        assert "pareto.json not updated (disk_full)" in resume.output
        after = json.loads(pareto_path.read_text())  # parses: never half-written
        assert after == before, "pareto.json changed although it could not be written"
        reasons = failure_reasons(results, name, storage)
        new = max(reasons)
        assert reasons[new] == "disk_full", reasons
        lost = lost_completed(results, name, storage)
    finally:
        for mount in reversed(mounts):
            subprocess.run(["umount", "-l", str(mount)], check=False)
    orphans = wait_no_orphans(marker)
    record_fault_row("disk full (tmpfs)", detection="at the first write (prepare)", lost=lost,
                     orphans=len(orphans), reason="disk_full; pareto.json kept intact")
    assert lost == 0 and not orphans


# -- the driver's deadline: ray.cancel into an async actor ---------------------------------------


def test_driver_deadline_cancels_into_the_actor_and_stops_the_server(tmp_path: Path,
                                                                       orphan_check: list[str]) -> None:
    """The worker's own deadline is out of reach (10 min), so only the driver's can end the
    trial: ray.cancel must arrive in run_trial as CancelledError, the server must be
    stopped before the ref resolves, and the reason sent ahead (note_cancel) recorded."""

    import ray

    from tuner.commands.run import load_spec_file
    from tuner.engine.ray_executor import RayExecutor
    from tuner.study.outcome import TrialRequest
    from tuner.study.space import trial_command

    study, marker = fault_study(tmp_path, {256: [{"fault": "hang_at_start"}]},
                                updates={"server.startup_timeout": "10m", "budget.trial_timeout": "10m"})
    orphan_check.append(marker)
    spec = load_spec_file(str(study))
    values = {"case": 256}
    command = trial_command(spec, values, port=spec.server.port)
    trial_dir = tmp_path / "trial"
    request = TrialRequest(
        study=study.stem, number=0, values=values,
        asked=command.asked, argv=command.argv, env=command.launch_env,
        host=spec.server.host, port=spec.server.port, served_model_name=spec.server.served_model_name,
        trial_dir=str(trial_dir), startup_timeout_s=600, stop_timeout_s=STOP_TIMEOUT_S, deadline_s=600,
        load=spec.load.model_dump(mode="json"), probe=spec.probe.model_dump(mode="json"), ignore_eos=True,
    ).model_dump(mode="json")
    ray.init(address="local", num_cpus=2, num_gpus=8, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    try:
        executor = RayExecutor(gpus_per_trial=8, cpus_per_trial=1)
        executor.start()
        wait_for(lambda: executor.poll(0.2, stop_grace_s=STOP_TIMEOUT_S) or executor.idle_groups(), 60,
                 "the worker")
        began = time.monotonic()
        executor.submit(0, request, deadline_s=3.0)
        wait_for(lambda: server_pgid_of(trial_dir), 30, "the server")
        pgid = server_pgid_of(trial_dir)
        finished = []
        while not finished and time.monotonic() - began < 60:
            finished = executor.poll(0.5, stop_grace_s=STOP_TIMEOUT_S)
        took = time.monotonic() - began
        executor.shutdown()
    finally:
        ray.shutdown()
    assert finished and finished[0].error == "trial_timeout", finished
    assert not proctree.group_members(pgid), "the server outlived the cancelled trial"
    outcome = json.loads((trial_dir / "outcome.json").read_text())
    assert outcome["reason"] == "trial_timeout" and outcome["phase"] == "start", outcome
    assert outcome["stop"]["signal"] == "SIGTERM" and not outcome["stop"]["leftover_pids"], outcome["stop"]
    assert not (trial_dir / "server.pid").exists()
    orphans = wait_no_orphans(marker)
    record_fault_row("driver deadline (ray.cancel)", detection=f"{took:.2f} s after submit (deadline 3 s)",
                     lost=0, orphans=len(orphans), reason="trial_timeout; server stopped by the actor")
    assert not orphans


# -- storage retries and recovery, in process --------------------------------------------------


def test_storage_waits_through_a_short_lock_and_gives_up_on_a_long_one(tmp_path: Path) -> None:
    import optuna

    from tuner.errors import StorageUnavailable
    from tuner.store.handle import RetryPolicy, make_storage

    db = tmp_path / "optuna.db"
    storage = make_storage(f"sqlite:///{db}", RetryPolicy(budget_s=4, first_delay_s=0.2))
    study = optuna.create_study(study_name="s", storage=storage)
    locker = hold_lock(db, 1.5)
    try:
        began = time.monotonic()
        study.set_user_attr("k", 1)  # blocked, waited for, then through once the lock is gone
        assert time.monotonic() - began >= 1.0
    finally:
        locker.kill()
        locker.wait()
    assert study.user_attrs["k"] == 1

    locker = hold_lock(db, 60)
    try:
        began = time.monotonic()
        with pytest.raises(StorageUnavailable, match="database is locked"):
            study.set_user_attr("k", 2)
        assert 4.0 <= time.monotonic() - began < 9.0  # the budget, then the study stops
    finally:
        locker.kill()
        locker.wait()
    assert optuna.load_study(study_name="s", storage=f"sqlite:///{db}").user_attrs["k"] == 1
    study.set_user_attr("k", 3)  # the same storage works again once the lock is gone
    assert study.user_attrs["k"] == 3


def test_a_refused_connection_is_tried_again_until_the_budget_is_spent() -> None:
    """A database server restarting: the engine's connect listener backs off and retries."""

    from tuner.store.handle import RetryPolicy, connect_with_backoff

    class Refused(Exception):
        pass

    class Dialect:
        loaded_dbapi = type("dbapi", (), {"OperationalError": Refused})

        def __init__(self, refusals: int) -> None:
            self.refusals, self.calls = refusals, []

        def connect(self, *cargs: object, **cparams: object) -> str:
            self.calls.append((cargs, cparams))
            if len(self.calls) <= self.refusals:
                raise Refused("connection refused")
            return "connection"

    policy = RetryPolicy(budget_s=2.0, first_delay_s=0.1, max_delay_s=0.4)
    back = Dialect(refusals=3)
    began = time.monotonic()
    assert connect_with_backoff(policy, "db")(back, None, ("dsn",), {"x": 1}) == "connection"
    assert back.calls == [(("dsn",), {"x": 1})] * 4
    assert 0.1 + 0.2 + 0.4 <= time.monotonic() - began < 2.0   # 0.1, 0.2, 0.4: doubling pauses

    gone = Dialect(refusals=1000)
    began = time.monotonic()
    with pytest.raises(Refused):
        connect_with_backoff(policy, "db")(gone, None, (), {})
    assert 2.0 <= time.monotonic() - began < 3.0
    assert 5 <= len(gone.calls) <= 9   # 0.1, 0.2, 0.4, 0.4, ... then one at the budget's end


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_resume_records_a_finished_trial_the_storage_never_got(tmp_path: Path) -> None:
    """The worker wrote a completed outcome.json, then the tuner died before `tell`."""

    import optuna

    from tuner.commands.run import load_spec_file
    from tuner.engine.orchestrator import Orchestrator
    from tuner.sim.executor import SimExecutor
    from tuner.store.handle import create_or_open
    from tuner.study.outcome import TrialOutcome

    study_file, _ = fault_study(tmp_path, {256: [], 257: []})
    spec = load_spec_file(str(study_file))
    handle = create_or_open(spec, tmp_path / "results")
    lines: list[str] = []

    def no_trial(values: dict) -> Any:
        raise AssertionError(f"reconcile started a trial: {values}")

    orchestrator = Orchestrator(handle, SimExecutor(spec, no_trial), progress=lines.append)
    study = orchestrator.open_study()
    finished, unfinished = study.ask(), study.ask()
    for trial, case in ((finished, 256), (unfinished, 257)):
        trial.suggest_categorical("case", [256, 257])
        trial.set_user_attr("values", {"case": case})
        trial.set_user_attr("kind", "run")
    outcome = TrialOutcome(number=finished.number, status="completed", started_unix=1.0, finished_unix=2.0,
                           trial_s=1.0, probe_passed=True, applied=True,
                           levels={"1": {"tpot_ms.mean": 5.0, "failed": 0.0},
                                   "4": {"output_tok_s": 900.0, "tpot_ms.mean": 6.0, "failed": 0.0}})
    trial_dir = handle.paths.trial_dir(finished.number)
    trial_dir.mkdir(parents=True)
    (trial_dir / "outcome.json").write_text(outcome.model_dump_json())

    orchestrator.reconcile(study)
    trials = {t.number: t for t in optuna.load_study(study_name=handle.name, storage=handle.storage_url).trials}
    assert trials[finished.number].state.name == "COMPLETE"
    assert trials[finished.number].values == [900.0, 5.0]
    assert trials[finished.number].user_attrs["recovered"] is True
    assert trials[unfinished.number].state.name == "FAIL"
    assert trials[unfinished.number].user_attrs["failure"]["reason"] == "interrupted"
    assert any(t.user_attrs.get("retry_of") == unfinished.number for t in trials.values())
    assert json.loads(handle.paths.pareto_json.read_text())["front"][0]["trial"] == finished.number
