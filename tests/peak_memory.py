"""The peak resident memory of this process alone, for tests that bound a command's memory.

``getrusage(RUSAGE_SELF).ru_maxrss`` is the wrong figure in a child process: Linux folds the
parent's high-water mark into it at exec (subprocess forks or vforks the pytest worker, which
may hold hundreds of MB by then), so a small command reads as large as the worker that started
it. ``VmHWM`` in /proc/self/status belongs to the process's own address space since exec.
"""

from __future__ import annotations

import resource
from pathlib import Path


def own_peak_rss_kb() -> int:
    """Peak RSS in kB of this process's own address space (ru_maxrss where /proc is absent)."""

    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
