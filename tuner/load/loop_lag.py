"""How late the load generator's own event loop ran while a level was measured.

Every timestamp the client takes (a chunk's arrival, a request's dispatch) is taken when the
event loop gets round to it. A loop that falls behind (a busy host, thousands of chunks a
second in one process) stamps chunks late and in bunches: several chunks read in one go
share one time, a short reply can arrive "all at once", and TTFT, ITL and TPOT then measure
the client rather than the server. The monitor is a task that asks to wake every
``period_s`` and records how much later than asked it woke; a level whose lateness is large
against the latencies it reports is flagged client-bound (tuner.load.metrics).
"""

from __future__ import annotations

import asyncio
import time
from types import TracebackType

__all__ = ["DEFAULT_PERIOD_S", "LoopLagMonitor"]

# Short enough to see a stall of a few milliseconds, long enough to cost nothing: one wake-up
# every 5 ms is far below the loop's work at any concurrency worth measuring.
DEFAULT_PERIOD_S = 0.005


class LoopLagMonitor:
    """Samples this event loop's lateness in milliseconds while entered (``async with``).

    Samples from other loops (client shard processes) are added with :meth:`extend`, so one
    monitor holds the whole level's lateness however its streams were spread.
    """

    def __init__(self, period_s: float = DEFAULT_PERIOD_S) -> None:
        if period_s <= 0:
            raise ValueError(f"period_s must be > 0, got {period_s}")
        self.period_s = period_s
        self.samples_ms: list[float] = []
        self._task: asyncio.Task[None] | None = None

    def extend(self, samples_ms: list[float]) -> None:
        self.samples_ms.extend(samples_ms)

    async def _run(self) -> None:
        while True:
            asked = time.monotonic()
            await asyncio.sleep(self.period_s)
            self.samples_ms.append(max(0.0, (time.monotonic() - asked - self.period_s) * 1000))

    async def __aenter__(self) -> LoopLagMonitor:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
