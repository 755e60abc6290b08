"""What the driver does with a trial's files when the trial's worker cannot: stop servers
recorded in ``server.pid`` files, read back an ``outcome.json`` the storage never got, and
write one for a trial whose worker was lost.

A pid file names the server's process group, its argv, host and tag. Pids are reused, so
a group is only signalled when its leader's command line is still the recorded one, and
only on the host that wrote the file (other hosts: the launcher's watchdog there).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tuner.adapters import proctree
from tuner.adapters.artifacts import StudyPaths, atomic_write_json
from tuner.adapters.launcher import TAG_VAR
from tuner.study.outcome import TrialOutcome
from tuner.errors import ArtifactWriteError

__all__ = ["stop_leftover_servers", "kill_servers_now", "read_outcome", "write_driver_outcome"]


def _ours(record: dict[str, Any]) -> int | None:
    """The recorded process group if it is alive on this host and still our server."""

    if record.get("host") != socket.gethostname():
        return None
    pgid = int(record["pgid"])
    leader = proctree.cmdline(pgid)
    argv = record.get("argv") or []
    if proctree.group_members(pgid) and leader and leader[: len(argv)] == argv[: len(leader)]:
        return pgid
    return None


def _read(pid_file: Path) -> dict[str, Any] | None:
    try:
        return json.loads(pid_file.read_text())
    except (OSError, ValueError):
        return None


def _kill_escaped(record: dict[str, Any]) -> None:
    if record.get("tag"):
        for pid in proctree.pids_with_env(TAG_VAR, record["tag"]):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def stop_leftover_servers(paths: StudyPaths, stop_timeout_s: float,
                          progress: Callable[[str], None]) -> None:
    """Stop servers an earlier, killed run left behind (SIGTERM, grace, SIGKILL)."""

    for pid_file in paths.pid_files():
        record = _read(pid_file)
        if record is None:
            continue
        if record.get("host") != socket.gethostname():
            progress(f"[resume] {pid_file} names a server on {record.get('host')}: stop it there")
            continue
        pgid = _ours(record)
        if pgid is not None:
            proctree.signal_group(pgid, signal.SIGTERM)
            deadline = time.monotonic() + stop_timeout_s
            while proctree.group_members(pgid) and time.monotonic() < deadline:
                time.sleep(0.1)
            proctree.signal_group(pgid, signal.SIGKILL)
            _kill_escaped(record)
            progress(f"[resume] stopped a server left running by an earlier run (pgid {pgid})")
        pid_file.unlink(missing_ok=True)


def kill_servers_now(pid_files: list[Path]) -> list[int]:
    """SIGKILL the local servers these pid files name at once (a second Ctrl-C); their pgids."""

    killed = []
    for pid_file in pid_files:
        record = _read(pid_file)
        if record is None:
            continue
        pgid = _ours(record)
        if pgid is not None:
            proctree.signal_group(pgid, signal.SIGKILL)
            _kill_escaped(record)
            killed.append(pgid)
    return killed


def read_outcome(paths: StudyPaths, number: int) -> TrialOutcome | None:
    """The outcome a worker wrote for trial ``number``, if any and readable."""

    try:
        outcome = TrialOutcome.model_validate_json((paths.trial_dir(number) / "outcome.json").read_text())
    except (OSError, ValueError, ValidationError):
        return None
    return outcome if outcome.number == number else None


def write_driver_outcome(paths: StudyPaths, outcome: TrialOutcome) -> None:
    """Record a failure the worker could not write (it was lost), next to the trial's files.

    Only into an existing trial folder without an outcome: the worker's own file, when
    there is one, has more detail. A full disk here must not stop the study.
    """

    trial_dir = paths.trial_dir(outcome.number)
    target = trial_dir / "outcome.json"
    if not trial_dir.is_dir() or target.exists():
        return
    with contextlib.suppress(ArtifactWriteError):
        atomic_write_json(target, outcome.model_dump(mode="json"))
