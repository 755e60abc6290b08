"""One closed-loop level sized by time and steady state (``load.sizing: steady``).

C streams send request after request, as in :mod:`tuner.load.streams`, while a ticker asks
:class:`tuner.load.steady.SteadyTracker` every ``check_every_s`` whether the level has
measured enough. Prompts come from two seed streams: the warm-up stream until the first
wave has finished, the measured stream after it (measured prompts never warm a cache).

When the tracker says stop, the window [start, end) is fixed. Requests still in flight
that were dispatched before its end carry tokens the window counts, so they finish; to
keep them at the level's concurrency until they do (their latencies are measured), the
streams go on sending *drain* requests (warm-up prompts) until the last of them has
finished, and then let the drain requests finish too. Cancelling those instead would
save at most one request's time but leave the server generating tokens no client counts
(the client/server token agreement would fail on every level).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tuner.load.protocol import Live
from tuner.load.records import RequestRecord
from tuner.load.request import LevelContext, Stream, one_request
from tuner.load.steady import SteadyCheck, SteadyRule, SteadyTracker, live_points
from tuner.load.streams import LevelHalted
from tuner.load.uncertainty import mean_ci
from tuner.load.workload import RequestStream

__all__ = ["SteadyRun", "run_steady_level"]

# How often the early-stop judgement inside a level runs (tuner.study.early_stop rule 4).
INSIDE_CHECK_EVERY_S = 1.0


@dataclass(frozen=True, slots=True)
class SteadyRun:
    """What one steady level produced: every record (phase set), the window the level
    stopped on (None: the first wave never finished) and why it stopped."""

    records: list[RequestRecord]
    check: SteadyCheck | None
    stop_reason: str               # "stable" | "max_level_seconds" | "failures"


class _SteadyLoop:
    def __init__(self, lv: LevelContext, warm: RequestStream, measure: RequestStream,
                 rule: SteadyRule, checkpoint: Callable[[dict[str, Any]], bool] | None) -> None:
        self.lv, self.warm, self.measure, self.rule = lv, warm, measure, rule
        self.checkpoint = checkpoint
        self.tracker = SteadyTracker(rule, lv.concurrency)
        self.live: Live = {}
        self.records: dict[int, RequestRecord] = {}
        self.next_pos = 0
        self.check: SteadyCheck | None = None
        self.stop_reason: str | None = None
        self.pending: set[int] | None = None   # in flight with tokens the window may count
        self.halted = False
        self.tasks: list[asyncio.Task[None]] = []

    def now(self) -> float:
        return time.monotonic() - self.lv.t0

    async def worker(self) -> None:
        stream = Stream()
        try:
            while True:
                if self.pending is not None:
                    if not self.pending:
                        return
                    group = self.warm.next_group()    # drain: keep the concurrency up
                elif self.tracker.opened_s is None:
                    group = self.warm.next_group()
                else:
                    group = self.measure.next_group()
                # A conversation's turns go one after the other on this stream, each after
                # the previous reply (tuner.load.streams); a failed turn ends it.
                replies: list[str] | None = [] if len(group) > 1 else None
                for item in group:
                    if item.think_s:
                        await asyncio.sleep(item.think_s)   # the user reading and typing
                    pos = self.next_pos
                    self.next_pos += 1
                    record = await one_request(self.lv, stream, item, self.now(), self.live, pos, replies)
                    self.records[pos] = record
                    self.tracker.add(pos, record)
                    if self.pending is not None:
                        self.pending.discard(pos)
                    if not record.ok:
                        break
        finally:
            stream.close()

    def cancel_others(self) -> None:
        me = asyncio.current_task()
        for t in self.tasks:
            if t is not me:
                t.cancel()

    async def ticker(self) -> None:
        every = min(0.5, max(0.05, self.rule.min_window_s / self.rule.subwindows / 4))
        last_inside = -math.inf
        while self.pending is None:
            await asyncio.sleep(every)
            now = self.now()
            check = self.tracker.check(now, live_points(self.live))
            stop = self.tracker.done(check, now)
            if self.checkpoint is not None and (stop or now - last_inside >= INSIDE_CHECK_EVERY_S):
                last_inside = now
                view = self.view(check, exact=stop)
                if view is not None and self.checkpoint(view):
                    self.halted = True
                    self.cancel_others()
                    return
            if stop:
                self.stop(check)

    def stop(self, check: SteadyCheck | None) -> None:
        self.check = check
        if check is not None and check.enough and check.stable:
            self.stop_reason = "stable"
        elif self.tracker.failed >= self.rule.needed_completions(self.lv.concurrency):
            self.stop_reason = "failures"
        else:
            self.stop_reason = "max_level_seconds"
        end = check.end_s if check is not None else self.now()
        self.pending = {pos for pos, (d, _, _) in self.live.items() if d < end}

    def view(self, check: SteadyCheck | None, *, exact: bool) -> dict[str, Any] | None:
        """The window so far for early stop inside a level (as
        :meth:`tuner.load.live_window.InsideWindow.view`); None while it cannot be counted
        exactly (no window yet, or an in-flight request without per-chunk usage)."""
        tr = self.tracker
        if check is None or tr.opened_s is None or tr.first_s is None:
            return None
        if any(not st.per_chunk_usage or len(st.cumulative) != len(st.times)
               for _, st, _ in list(self.live.values())):
            return None
        return {"output_tok_s": check.output_tok_s, "window_s": check.window_s,
                "output_tok_s_ci95": mean_ci(check.rates) or 0.0,
                "exact": exact, "first_wave_s": tr.opened_s - tr.first_s,
                "stable": check.stable, "completed": len(self.records), "planned": None}

    def finished_records(self) -> list[RequestRecord]:
        start, end = ((self.check.start_s, self.check.end_s) if self.check is not None
                      else (math.inf, math.inf))
        out = []
        for pos in sorted(self.records):
            r = self.records[pos]
            phase = "warmup" if r.dispatch_s < start else "measure" if r.dispatch_s < end \
                else "drain"
            out.append(r.model_copy(update={"phase": phase}))
        return out


async def run_steady_level(
    lv: LevelContext, warm: RequestStream, measure: RequestStream, rule: SteadyRule,
    checkpoint: Callable[[dict[str, Any]], bool] | None = None,
) -> SteadyRun:
    """Run one steady level (module docstring). ``checkpoint``: early stop inside the level,
    as :func:`tuner.load.closed_loop.run_level`'s (raises
    :class:`tuner.load.streams.LevelHalted` with the finished records)."""
    loop = _SteadyLoop(lv, warm, measure, rule, checkpoint)
    loop.tasks = [asyncio.create_task(loop.worker()) for _ in range(lv.concurrency)]
    ticker = asyncio.create_task(loop.ticker())
    everything = [*loop.tasks, ticker]
    try:
        results = await asyncio.gather(*loop.tasks, return_exceptions=True)
    except BaseException:
        for t in everything:
            t.cancel()
        await asyncio.gather(*everything, return_exceptions=True)
        raise
    ticker.cancel()
    await asyncio.gather(ticker, return_exceptions=True)
    for r in results:
        # Streams cancelled by a halting checkpoint are expected; anything else propagates.
        if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError):
            raise r
    if loop.halted:
        raise LevelHalted(loop.records)
    assert loop.stop_reason is not None
    return SteadyRun(loop.finished_records(), loop.check, loop.stop_reason)
