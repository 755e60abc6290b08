"""A GPU group's leftover server processes, found by their tag and ended before its next start."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

from tuner.adapters import proctree
from tuner.adapters.launcher import TAG_VAR
from tuner.errors import GpusNotFree

__all__ = ["clear_leftovers"]


async def clear_leftovers(tag: str, *, grace_s: float, group: int) -> list[int]:
    """Wait up to ``grace_s`` for the processes tagged ``tag`` to leave, then SIGKILL them.
    Returns the pids it had to kill; raises GpusNotFree when some survive that.

    Normally the previous stop already made sure; this catches a server whose worker died
    (its watchdog may still be stopping it) and anything that escaped a stop.
    """

    def ours() -> list[int]:
        return proctree.pids_with_env(TAG_VAR, tag)

    left = await asyncio.to_thread(ours)
    deadline = time.monotonic() + grace_s
    while left and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        left = await asyncio.to_thread(ours)
    if not left:
        return []
    for pid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    for _ in range(20):
        await asyncio.sleep(0.1)
        still = await asyncio.to_thread(ours)
        if not still:
            return left
    raise GpusNotFree(f"processes of an earlier server of GPU group {group} are still alive "
                      f"after SIGKILL: pids {still}")
