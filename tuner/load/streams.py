"""Closed-loop streams in one event loop: each sends its next request as soon as its
previous one finished, taking plan positions from a shared ``claim`` counter.

The counter is a plain ``itertools.count`` in one process, or a file under ``flock`` shared
by client processes (:mod:`tuner.load.shards`), so requests are issued in plan order
across all streams either way.

A multi-turn conversation (plans with ``turns > 1``, consecutive, turn 0 first) is claimed
whole: its stream sends turn k+1 only after turn k's reply has fully arrived, carrying the
server's replies so far, so a stream is a conversation in flight. A turn that failed ends its
conversation (the next turn has no reply to carry).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from tuner.load.live_window import InsideWindow
from tuner.load.protocol import Live
from tuner.load.records import RequestRecord
from tuner.load.request import LevelContext, Stream, one_request
from tuner.load.workload import RequestPlan

__all__ = ["INSIDE_CHECK_EVERY_S", "LevelHalted", "run_streams"]

# Early stop inside a level (tuner.study.early_stop rule 4): how often the window so far is
# judged (a scan of every token timestamp; once a second keeps it off the hot path).
INSIDE_CHECK_EVERY_S = 1.0


class LevelHalted(Exception):
    """A level's checkpoint ended it early (early stop inside a level); carries the records
    of the requests finished by then."""

    def __init__(self, records: dict[int, RequestRecord]) -> None:
        super().__init__("level halted by its checkpoint")
        self.records = [records[i] for i in sorted(records)]


class _ClosedLoop:
    """The state the streams of one run share."""

    def __init__(
        self, lv: LevelContext, plan: Sequence[RequestPlan], streams: int,
        claim: Callable[[], int], deadline_s: float | None,
        checkpoint: Callable[[dict[str, Any]], bool] | None,
    ) -> None:
        self.lv, self.plan, self.claim, self.deadline_s = lv, plan, claim, deadline_s
        self.checkpoint = checkpoint
        self.out: dict[int, RequestRecord] = {}
        self.stop = False
        self.halted = False
        self.window = InsideWindow(streams, len(plan)) if checkpoint is not None else None
        self.live: Live | None = {} if checkpoint is not None else None
        self.last_check = -math.inf
        self.all_claimed = False    # the last plan position is dispatched: the window is complete
        self.judged_complete = False
        self.tasks: list[asyncio.Task[None]] = []
        # Where each conversation begins (every position, for single requests): the counter
        # hands out conversations.
        self.starts = [i for i, p in enumerate(plan) if p.turn == 0]

    def judge(self) -> bool:
        """Rule 4 of tuner.study.early_stop after a request finished: throttled to every
        INSIDE_CHECK_EVERY_S, except the first judgement once the window is complete."""
        window, checkpoint, live, out = self.window, self.checkpoint, self.live, self.out
        assert window is not None and checkpoint is not None and live is not None
        if len(out) == len(self.plan):
            return False          # the level is complete: nothing left to save
        now = time.monotonic() - self.lv.t0
        complete = self.stop or self.all_claimed
        if (not (complete and not self.judged_complete)
                and now - self.last_check < INSIDE_CHECK_EVERY_S):
            return False
        self.last_check = now
        ended = None
        if complete:   # nothing more is issued: the level's window ends at its last dispatch
            self.judged_complete = True
            ended = max([r.dispatch_s for r in out.values()] + [d for d, _, _ in live.values()])
        done_tokens = sum(r.n_output_tokens() for r in out.values() if r.ok)
        view = window.view(now, live, ended, done_tokens)
        if view is None or not checkpoint(view):
            return False
        self.halted = self.stop = True
        me = asyncio.current_task()
        for t in self.tasks:
            if t is not me:
                t.cancel()
        return True

    async def worker(self) -> None:
        stream = Stream()
        plan, t0, deadline_s = self.plan, self.lv.t0, self.deadline_s
        try:
            while not self.stop:
                # The moment this stream is free for its next request (vLLM's semaphore
                # acquisition); the deadline is judged on it.
                scheduled_s = time.monotonic() - t0
                if deadline_s is not None and scheduled_s >= deadline_s:
                    self.stop = True
                    break
                k = self.claim()
                if k >= len(self.starts):
                    self.stop = True
                    break
                self.all_claimed = self.all_claimed or k == len(self.starts) - 1
                first = self.starts[k]
                if plan[first].turns == 1:
                    if await self._send(stream, first, scheduled_s):
                        break
                elif await self._conversation(stream, first, scheduled_s):
                    break
        finally:
            stream.close()

    async def _send(self, stream: Stream, pos: int, scheduled_s: float,
                    replies: list[str] | None = None) -> bool:
        """One request at ``pos``; True when the level's checkpoint halted it."""
        self.out[pos] = await one_request(
            self.lv, stream, self.plan[pos], scheduled_s, self.live, pos, replies)
        if self.window is not None and not self.halted:
            self.window.add(pos, self.out[pos])
            return self.judge()
        return False

    async def _conversation(self, stream: Stream, first: int, scheduled_s: float) -> bool:
        plan, t0, deadline_s = self.plan, self.lv.t0, self.deadline_s
        replies: list[str] = []
        for pos in range(first, first + plan[first].turns):
            if pos > first:
                if not self.out[pos - 1].ok or self.stop:
                    return False
                if plan[pos].think_s:
                    await asyncio.sleep(plan[pos].think_s)   # the user reading and typing
                scheduled_s = time.monotonic() - t0
                if deadline_s is not None and scheduled_s >= deadline_s:
                    self.stop = True
                    return False
            if await self._send(stream, pos, scheduled_s, replies):
                return True
        return False


async def run_streams(
    lv: LevelContext,
    plan: Sequence[RequestPlan],
    streams: int,
    claim: Callable[[], int],
    deadline_s: float | None,
    checkpoint: Callable[[dict[str, Any]], bool] | None = None,
) -> dict[int, RequestRecord]:
    """``streams`` closed-loop streams taking plan positions from ``claim`` until the plan
    or the deadline ends. Returns records by plan position (= issue order).

    ``checkpoint(window)``: judged at most every ``INSIDE_CHECK_EVERY_S`` after a request
    finishes, with :meth:`InsideWindow.view`; True ends the level at once, in-flight
    requests cancelled and not recorded (raises :class:`LevelHalted`)."""
    loop = _ClosedLoop(lv, plan, streams, claim, deadline_s, checkpoint)
    loop.tasks = [asyncio.create_task(loop.worker()) for _ in range(streams)]
    try:
        results = await asyncio.gather(*loop.tasks, return_exceptions=True)
    except BaseException:
        # Cancelled (or a bug): leave no request running behind us.
        for t in loop.tasks:
            t.cancel()
        await asyncio.gather(*loop.tasks, return_exceptions=True)
        raise
    for r in results:
        # Streams cancelled by a halting checkpoint are expected; anything else propagates.
        if isinstance(r, BaseException) and not (
                loop.halted and isinstance(r, asyncio.CancelledError)):
            raise r
    if loop.halted:
        raise LevelHalted(loop.out)
    return loop.out
