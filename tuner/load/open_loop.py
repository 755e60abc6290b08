"""One open-loop rate level: requests sent at seeded absolute arrival times, however many
are still in flight (measurement.md §2), up to a safety cap."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tuner.load.load_spec import Api
from tuner.load.metrics import LevelMetrics, compute_level_metrics
from tuner.load.records import RequestRecord
from tuner.load.request import LevelContext, Stream, one_request
from tuner.load.workload import RequestPlan

__all__ = ["RateRun", "rate_level_metrics", "run_rate_level"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RateRun:
    """What one open-loop run produced: the records (issue order), how many requests
    waited for the in-flight cap, and the most requests in flight at once."""

    records: list[RequestRecord]
    cap_waits: int
    peak_in_flight: int


async def run_rate_level(
    base_url: str,
    model: str,
    plan: Sequence[RequestPlan],
    schedule: Sequence[float],
    *,
    api: Api,
    deadline_s: float | None,
    request_timeout_s: float,
    max_in_flight: int,
    headers: dict[str, str] | None = None,
    continuous_usage: bool = True,
    on_start: Callable[[float], None] | None = None,
) -> RateRun:
    """Run ``plan`` open loop: request i is sent at ``t0 + schedule[i]``.

    The schedule holds absolute times from the level start (``time.monotonic``), so each
    send waits for its own due time, never for a gap after the previous send: a slow
    client or server cannot shift later arrivals. Requests are sent however many are
    still in flight, up to ``max_in_flight`` — a safety cap, not a load shape; a request
    that finds it full waits (counted in ``cap_waits``) and is sent as soon as a slot
    frees, its record keeping the scheduled time (``scheduled_s``) next to the send time
    (``dispatch_s``), so the client-side queueing shows as ``client_queue_ms``.
    Idle keep-alive connections are reused; a new one is opened when none is idle.

    Args:
        schedule: due times in seconds from the level start, one per plan item,
            non-decreasing (:func:`tuner.load.workload.arrival_schedule`).
        deadline_s: no request due at or after this many seconds is sent (None: no limit).
        max_in_flight: the safety cap (>= 1).
        Other arguments (``on_start``: told the level's time base) as
        :func:`tuner.load.closed_loop.run_level`.

    Returns:
        :class:`RateRun`; records are in issue order, ``concurrency`` = ``max_in_flight``.
    """
    if len(schedule) != len(plan):
        raise ValueError(f"schedule has {len(schedule)} times for {len(plan)} requests")
    if any(b < a for a, b in zip(schedule, schedule[1:])):
        raise ValueError("schedule must be non-decreasing")
    if max_in_flight < 1:
        raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
    if request_timeout_s <= 0:
        raise ValueError(f"request_timeout_s must be > 0, got {request_timeout_s}")
    lv = LevelContext.create(
        base_url, model, api, concurrency=max_in_flight,
        request_timeout_s=request_timeout_s, headers=headers, continuous_usage=continuous_usage,
    )
    if on_start is not None:
        on_start(lv.t0)
    sender = _Sender(lv, plan, max_in_flight)
    # A full collection walks every object of the process (a worker with Ray, Optuna and
    # pydantic loaded: 65-115 ms measured on two cores), and a send due meanwhile goes out
    # that late. Frozen, the objects from before the level are not walked; the level's own
    # garbage is still collected.
    gc.freeze()
    try:
        for pos, due in enumerate(schedule):
            if deadline_s is not None and due >= deadline_s:
                break
            if not await sender.dispatch(pos, due, deadline_s):
                break
        await sender.finish()
    except BaseException:
        await sender.cancel()
        raise
    finally:
        sender.close_idle()
        gc.unfreeze()
    records = [sender.out[i] for i in sorted(sender.out)]
    if len(records) < len(plan):
        logger.info(
            "open loop: deadline %.1fs reached after %d of %d requests",
            deadline_s or 0.0, len(records), len(plan),
        )
    return RateRun(records=records, cap_waits=sender.cap_waits, peak_in_flight=sender.peak)


class _Sender:
    """The in-flight requests of one open-loop run, their cap and idle connections."""

    def __init__(self, lv: LevelContext, plan: Sequence[RequestPlan], cap: int) -> None:
        self.lv, self.plan = lv, plan
        self.idle: list[Stream] = []
        self.slots = asyncio.Semaphore(cap)
        self.out: dict[int, RequestRecord] = {}
        self.tasks: list[asyncio.Task[None]] = []
        self.in_flight = 0
        self.peak = 0
        self.cap_waits = 0

    async def dispatch(self, pos: int, due: float, deadline_s: float | None) -> bool:
        """Send plan position ``pos`` at its due time; False if the deadline passed while
        it waited for the cap (it is then not sent)."""
        t0 = self.lv.t0
        delay = t0 + due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        if self.slots.locked():
            self.cap_waits += 1
        await self.slots.acquire()
        if deadline_s is not None and time.monotonic() - t0 >= deadline_s:
            self.slots.release()
            return False
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        self.tasks.append(asyncio.create_task(self._send(pos, due)))
        return True

    async def _send(self, pos: int, due: float) -> None:
        stream = self.idle.pop() if self.idle else Stream()
        try:
            self.out[pos] = await one_request(self.lv, stream, self.plan[pos], due)
        finally:
            self.in_flight -= 1
            self.slots.release()
            if stream.conn is not None and stream.conn.usable:
                self.idle.append(stream)
            else:
                stream.close()

    async def finish(self) -> None:
        """Wait for every request sent; a bug in one propagates."""
        if self.tasks:
            for r in await asyncio.gather(*self.tasks, return_exceptions=True):
                if isinstance(r, BaseException):
                    raise r

    async def cancel(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    def close_idle(self) -> None:
        for st in self.idle:
            st.close()


def rate_level_metrics(run: RateRun, rate: float, *, cap: int, planned: int | None = None,
                       client_lag_ms: Sequence[float] | None = None) -> LevelMetrics:
    """:func:`compute_level_metrics` of an open-loop run, with its rate-level fields."""
    metrics = compute_level_metrics(run.records, concurrency=cap, planned=planned, first_wave=1,
                                    client_lag_ms=client_lag_ms)
    return metrics.model_copy(update={
        "request_rate": rate, "cap_waits": run.cap_waits, "peak_in_flight": run.peak_in_flight,
    })
