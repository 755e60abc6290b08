"""The run file: which processes a tuner run started, so a later run can clean up after a
``kill -9``.

Servers are recorded per trial (``trials/NNNN/server.pid``, by the launcher). This file
records the driver and the local Ray runtime it started: when the driver is killed, Ray
stops its workers but a few agent processes outlive it, and they are stopped on resume.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import time
from pathlib import Path

from tuner.adapters import proctree
from tuner.adapters.artifacts import atomic_write_json, read_json
from tuner.errors import ArtifactWriteError

__all__ = ["record_run", "clean_up_previous_run", "clear_run"]

logger = logging.getLogger(__name__)


def _path(study_root: Path) -> Path:
    return study_root / "run.json"


def record_run(study_root: Path, *, local_ray: bool) -> bool:
    """Write the run file; False (and a warning) when it cannot be written, e.g. a full disk.

    Without it a later run cannot clean up after a ``kill -9`` of this one, which is no
    reason to refuse to run: the trials' own pid files still cover the servers.
    """

    me = os.getpid()
    pids = proctree.descendants(me) if local_ray else []
    try:
        atomic_write_json(_path(study_root), {
            "driver_pid": me,
            "driver_cmdline": proctree.cmdline(me),
            "host": socket.gethostname(),
            "started_unix": time.time(),
            "local_processes": [{"pid": p, "cmdline": proctree.cmdline(p), "start_ticks": proctree.start_ticks(p)}
                                for p in pids],
        })
    except ArtifactWriteError as err:
        logger.warning("run file not written (%s): cleanup after a kill -9 will miss the Ray processes", err)
        return False
    return True


def clean_up_previous_run(study_root: Path) -> list[int]:
    """Stop processes a dead earlier run left behind on this host; return their pids."""

    path = _path(study_root)
    record = read_json(path, dict)
    if record is None:
        return []
    if record.get("host") != socket.gethostname():
        return []
    driver = int(record.get("driver_pid", 0))
    if driver and driver != os.getpid() and proctree.process_alive(driver) and \
            proctree.cmdline(driver) == record.get("driver_cmdline"):
        return []  # still running: the study lock will refuse this run anyway
    stopped = []
    for item in record.get("local_processes", []):
        try:
            pid = int(item["pid"])
        except (KeyError, TypeError, ValueError):
            continue
        if pid <= 1 or pid == os.getpid() or pid == os.getpgrp() or not item.get("cmdline"):
            continue   # an empty command line matches any kernel thread or exited process
        # Only a process that started when the recorded one did (or, in an older run file,
        # whose command line is unchanged) is ours: pids get reused.
        ticks = item.get("start_ticks")
        same = (proctree.start_ticks(pid) == ticks) if ticks is not None else True
        if same and proctree.process_alive(pid) and proctree.cmdline(pid) == item.get("cmdline"):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                stopped.append(pid)
    path.unlink(missing_ok=True)
    return stopped


def clear_run(study_root: Path) -> None:
    _path(study_root).unlink(missing_ok=True)
