"""A sidecar that stops a server's process group when the process that started it dies.

``python -m tuner.adapters.watchdog PARENT_PID PGID GRACE_S``

The launcher starts one next to every server, as a child of the same trial worker but in
a session of its own. A trial worker that dies abruptly (SIGKILL, the OOM killer, a lost
Ray node agent) runs no ``finally``, and its server — in its own session on purpose, so
our signals reach its whole tree — would live on holding the GPUs and the port. Ray does
not clean up after a crashed worker by default (``kill_child_processes_on_worker_exit``
needs a graceful exit; the raylet subreaper is opt-in and only on clusters we start), so
the watchdog does: when it is re-parented (its parent is gone) it sends SIGTERM to the
group, waits ``GRACE_S``, then SIGKILL. When the group is gone it exits by itself; the
launcher also stops it after a normal stop.

Standard library plus ``proctree`` only, so it starts in tens of milliseconds.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from tuner.adapters import proctree

POLL_S = 0.2  # how soon after the worker's death the server gets its SIGTERM


def _stop_group(pgid: int, grace_s: float) -> None:
    proctree.signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while proctree.group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    proctree.signal_group(pgid, signal.SIGKILL)


def main(argv: list[str]) -> int:
    parent, pgid, grace_s = int(argv[0]), int(argv[1]), float(argv[2])
    # Ctrl-C in a terminal must not stop the guard before the server is stopped.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while proctree.group_members(pgid):
        if os.getppid() != parent:  # re-parented: the trial worker is gone
            _stop_group(pgid, grace_s)
            return 1
        time.sleep(POLL_S)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
