"""Time a fixed piece of CPU work back to back on chosen CPUs (the I/O half of
`tuner host-check`; the figures are tuner.load.host_steadiness's).

One process per CPU, pinned to it, so each series is that CPU's speed and nothing else's;
/proc/stat is read before and after for the steal share (time a hypervisor gave to
another guest). Standard library only: it has to run on a bare GPU box.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_module
import signal
import time
from typing import Any

from tuner.errors import TunerError

__all__ = ["default_cpus", "measure", "workload"]


def workload(n: int = 200_000) -> int:
    """The fixed work timed: ~15-25 ms of CPython on a server core."""
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


def _run_on(cpu: int, seconds: float, queue: Any) -> None:
    # Ctrl-C is the parent's to handle: it stops these processes (no traceback from each).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.sched_setaffinity(0, {cpu})
    times: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        began = time.perf_counter()
        workload()
        times.append(1e3 * (time.perf_counter() - began))
    queue.put((cpu, times))


def _cpu_ticks() -> list[int] | None:
    try:
        with open("/proc/stat", encoding="ascii") as f:
            return [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return None


def default_cpus() -> list[int]:
    """Up to three CPUs this process may use: the first, the middle and the last."""
    allowed = sorted(os.sched_getaffinity(0))
    return sorted({allowed[0], allowed[len(allowed) // 2], allowed[-1]})


def measure(cpus: list[int], seconds: float) -> tuple[dict[int, list[float]], float | None]:
    """Run times (ms) per CPU over ``seconds``, and the steal share over the whole probe."""

    before = _cpu_ticks()
    # spawn: a fresh interpreter per CPU, not a fork of whatever threads the caller runs.
    context = mp.get_context("spawn")
    queue = context.Queue()
    procs = [context.Process(target=_run_on, args=(cpu, seconds, queue), daemon=True) for cpu in cpus]
    try:
        # Ctrl-C (and SIGTERM) waits until every probe has started: one arriving while a child
        # reads its start-up data from the pipe would leave it orphaned, printing a traceback.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            for p in procs:
                p.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        try:
            results = dict(queue.get(timeout=seconds + 60) for _ in procs)
        except queue_module.Empty:
            lost = [str(cpu) for cpu, p in zip(cpus, procs, strict=True) if p.exitcode not in (None, 0)]
            raise TunerError(f"host-check: the probe on CPU(s) {', '.join(lost) or '?'} did not report "
                             f"within {seconds + 60:g} s") from None
    except BaseException:
        # Ctrl-C (even while they start) or a lost probe: the others stop now, not at the end
        # of their run.
        for p in procs:
            if p.pid is not None:
                p.kill()
        raise
    finally:
        for p in procs:
            if p.pid is None:
                continue
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
    after = _cpu_ticks()
    steal = None
    if before is not None and after is not None and len(before) > 7:
        delta = [b - a for a, b in zip(before, after, strict=False)]
        # /proc/stat's eighth column is steal.
        steal = delta[7] / sum(delta) if sum(delta) else None
    return results, steal
