"""Helpers of the fault-injection tests: small fault studies, a `tuner` process driven
like a user would, and waiting on the study folder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests import waiting
from tests.conftest import ROOT, load_trials, tuner_argv, write_study

STARTUP_TIMEOUT_S = 8
TRIAL_TIMEOUT_S = 15
STOP_TIMEOUT_S = 2

# Small and quick: one short workload class, two load levels, a four-item probe.
# Requests the simulator counts: probe 8 (idx 0-7), c1 warm-up 1 (8) + 2 measured (9-10),
# c4 warm-up 1 (11) + 4 measured (12-15).
FAST = {
    "load.concurrency": [1, 4], "load.requests_per_stream": 1, "load.min_requests": 2,
    "load.warmup_requests": 1,
    "load.workload.classes": [{"name": "chat", "kind": "open_ended", "weight": 1,
                               "prompt_tokens": 64, "output_tokens": 32}],
    "probe.concurrency": [1, 2],
    # The faults below are keyed on request counts that assume the known-answer layer alone;
    # the reference layer's requests would move them into the probe.
    "probe.reference.enabled": False,
    "server.startup_timeout": f"{STARTUP_TIMEOUT_S}s", "server.stop_timeout": f"{STOP_TIMEOUT_S}s",
    "budget.trial_timeout": f"{TRIAL_TIMEOUT_S}s", "sampler": {"name": "grid", "seed": 0},
    "forbidden": [],
    # Every case measured in full: a fault in the load phase must show in the trial's record,
    # not be cut short by early stopping's verdict on the first level.
    "execution.early_stop": False,
    # Every case once, in its grid order: no further baseline starts for the study's noise.
    "load.noise_starts": 1,
}
# The same short studies for tests that measure rather than inject faults: FAST's deadlines
# are sized for an idle box, and a suite busy beside these studies (the real-vLLM lane) must
# not turn a slow probe into a failed trial.
MEASURING = {**FAST, "budget.trial_timeout": "120s", "server.startup_timeout": "60s"}
SIM_ENV = {"TUNER_SIM_STARTUP_SCALE": 0.002, "TUNER_SIM_TIME_SCALE": 0.05}


def fault_study(tmp_path: Path, cases: dict[int, list[dict[str, Any]]], *, n_trials: int | None = None,
                updates: dict[str, Any] | None = None, env: dict[str, Any] | None = None) -> tuple[Path, str]:
    """A study over one knob, ``case`` (= --max-num-seqs), whose values select faults."""

    faults = [dict(f, when={"max_num_seqs": value}) for value, items in cases.items() for f in items]
    values = list(cases)
    all_updates = dict(FAST)
    all_updates.update({
        "parameters": [{"name": "case", "flag": "max_num_seqs", "kind": "categorical",
                        "values": values, "default": values[0]}],
        "budget.n_trials": n_trials or len(values),
    })
    all_updates.update(updates or {})
    return write_study(tmp_path, updates=all_updates,
                       env={**SIM_ENV, "TUNER_SIM_FAULTS": json.dumps(faults), **(env or {})})


class Tuner:
    """A `tuner` process in its own session (as from a terminal), output in a file."""

    def __init__(self, tmp_path: Path, *args: str, env: dict[str, str] | None = None, tag: str = "run") -> None:
        self.out_path = tmp_path / f"tuner-{tag}.out"
        with open(self.out_path, "wb") as out:
            self.proc = subprocess.Popen(tuner_argv(*args), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                         env=dict(os.environ, **(env or {})), start_new_session=True)

    @property
    def output(self) -> str:
        return self.out_path.read_text(errors="replace")

    @property
    def own_output(self) -> str:
        """The tuner's own lines: without the log tail Ray prints when a raylet dies (a few
        hundred "[state-dump]" lines that would fill any failure message)."""

        return "\n".join(line for line in self.output.splitlines()
                         if "[state-dump]" not in line and "(raylet)" not in line)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(f"tuner did not finish in {timeout}s:\n{self.output[-4000:]}") from None

    def ctrl_c(self) -> None:
        """What a terminal does: SIGINT to the whole foreground process group."""

        os.killpg(self.proc.pid, signal.SIGINT)

    def stop(self) -> None:
        """Test failed midway: stop the tuner the way a user would, then for sure."""

        for sig, wait in ((signal.SIGINT, 10), (signal.SIGINT, 10), (signal.SIGKILL, 10)):
            if self.proc.poll() is not None:
                return
            os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue


def trial_dir_of(results: Path, name: str, number: int) -> Path:
    return results / name / "trials" / f"{number:04d}"


def wait_for(predicate, timeout: float, what: str, tuner: Tuner | None = None) -> Any:
    """tests.waiting.wait_for, ended at once (with the tuner's output) if the tuner exits."""

    def tuner_exited() -> str | None:
        if tuner is None or tuner.proc.poll() is None:
            return None
        return f"tuner exited:\n{tuner.output[-4000:]}"

    return waiting.wait_for(predicate, timeout, what, unless=tuner_exited)


def first_ctrl_c_taken(tuner: Tuner, how: str = "Ctrl-C") -> None:
    """Wait until the tuner says it took the first stop signal and is stopping gracefully."""

    wait_for(lambda: f"[interrupt] {how}: stopping" in tuner.output, 30, f"the tuner to take the first {how}",
             tuner)


def assert_still_running(tuner: Tuner, for_s: float, why: str) -> None:
    """The tuner does not exit within ``for_s`` s: a wait on its exit, which must not come."""

    try:
        code = tuner.proc.wait(timeout=for_s)
    except subprocess.TimeoutExpired:
        return
    raise AssertionError(f"{why} (it exited {code} sooner):\n{tuner.output[-3000:]}")


def wait_server_starting(folder: Path, tuner: Tuner | None = None, timeout: float = 120) -> int:
    """The process group of the server whose folder (a trial's, the reference's, a re-run's)
    is ``folder``, once that server is under way: its EngineCore child started, so the
    simulator's signal handling (its faults' SIG_IGN included) is in place. Returns the pgid."""

    log = folder / "server.log"
    wait_for(lambda: log.exists() and "(EngineCore pid=" in log.read_text(errors="replace"), timeout,
             f"the server in {folder.name} to start its engine", tuner)
    pgid = server_pgid_of(folder)
    assert pgid is not None, f"no server.pid in {folder}"
    return pgid


def server_pgid_of(trial_dir: Path) -> int | None:
    try:
        return int(json.loads((trial_dir / "server.pid").read_text())["pgid"])
    except (OSError, ValueError, KeyError):
        return None


def running_trial_dirs(results: Path, name: str) -> list[Path]:
    return sorted(p.parent for p in (results / name / "trials").glob("*/server.pid"))


def counted(results: Path, name: str, storage: str | None = None) -> int:
    """Finished run trials that count toward the budget (interrupted ones are re-run)."""

    return sum(1 for t in load_trials(results, name, storage)
               if t.user_attrs.get("kind", "run") == "run" and t.state.name in ("COMPLETE", "FAIL")
               and t.user_attrs.get("failure", {}).get("reason") != "interrupted")


SLOW_START = [{"fault": "slow_start", "seconds": 1500}]  # 3 s of startup: time to press Ctrl-C


LOCKER = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
db.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
"""


def hold_lock(db: Path, seconds: float) -> subprocess.Popen[str]:
    locker = subprocess.Popen([sys.executable, "-c", LOCKER, str(db), str(seconds)],
                              stdout=subprocess.PIPE, text=True)
    assert locker.stdout.readline().strip() == "locked"
    return locker


def mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({result.stderr.strip()}); needs root")


def fill(path: Path) -> None:
    """Write zeros until the filesystem is full (ENOSPC is the point)."""

    with open(path / "filler", "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"\0" * 65536)
        except OSError:
            pass
