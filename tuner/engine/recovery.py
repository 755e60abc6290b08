"""What the driver does with a trial's files when the trial's worker cannot: stop servers
recorded in ``server.pid`` files, read back an ``outcome.json`` the storage never got, and
write one for a trial whose worker was lost.

A pid file names the server's process group, its argv, host and tag. Pids are reused, so
a group is only signalled when its leader's command line is still the recorded one, and
only on the host that wrote the file (other hosts: the launcher's watchdog there).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tuner.adapters import proctree
from tuner.adapters.artifacts import StudyPaths, atomic_write_json, read_json
from tuner.adapters.launcher import TAG_VAR
from tuner.errors import ArtifactWriteError
from tuner.study.outcome import TrialOutcome

__all__ = ["stop_leftover_servers", "kill_servers_now", "read_outcome", "write_driver_outcome"]


def _ours(record: dict[str, Any]) -> int | None:
    """The recorded process group if it is alive on this host and still our server.

    Never init's group (1), never this process's own group, never a process whose
    identity the file does not establish: with ``start_ticks`` (written since the launcher
    records it) the leader must have started at that very tick - a reused pid starts
    later; an older file needs its non-empty argv to be the leader's command line, whole
    (or the same script started through its interpreter).
    """

    if record.get("host") != socket.gethostname():
        return None
    try:
        pgid = int(record["pgid"])
    except (KeyError, TypeError, ValueError):
        return None
    if pgid <= 1 or pgid in (os.getpgrp(), os.getpid()) or not proctree.group_members(pgid):
        return None
    if proctree.process_group(pgid) != pgid:
        return None   # the pid is no longer a group leader: not the server that was started
    if record.get("start_ticks") is not None:
        return pgid if proctree.start_ticks(pgid) == record["start_ticks"] else None
    argv = record.get("argv") or []
    leader = proctree.cmdline(pgid)
    if not argv or not leader:
        return None
    through_interpreter = (len(leader) == len(argv) + 1 and leader[2:] == argv[1:]
                           and Path(leader[1]).name == Path(argv[0]).name)
    return pgid if leader == argv or through_interpreter else None


def _kill_escaped(record: dict[str, Any]) -> None:
    if record.get("tag"):
        for pid in proctree.pids_with_env(TAG_VAR, record["tag"]):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def stop_leftover_servers(paths: StudyPaths, stop_timeout_s: float,
                          progress: Callable[[str], None]) -> None:
    """Stop servers an earlier, killed run left behind (SIGTERM, grace, SIGKILL)."""

    for pid_file in paths.pid_files():
        record = read_json(pid_file, dict)
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
        elif record.get("tag") and (left := proctree.pids_with_env(TAG_VAR, record["tag"])):
            # The group's leader (the API server) is gone but processes of its tree live on,
            # e.g. rank workers of a multi-rank server: the run's own tag names them.
            _kill_escaped(record)
            progress(f"[resume] killed {len(left)} process(es) of a server left by an earlier run "
                     f"(its leader is gone; found by the run's tag): pids {left}")
        pid_file.unlink(missing_ok=True)


def kill_servers_now(pid_files: list[Path]) -> list[int]:
    """SIGKILL the local servers these pid files name at once (a second Ctrl-C); their pgids."""

    killed = []
    for pid_file in pid_files:
        record = read_json(pid_file, dict)
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
