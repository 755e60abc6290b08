"""The steady-state window of a level still running, for early stop inside a level (rule 4
of :mod:`tuner.study.early_stop`).

Pure: the running loop (:mod:`tuner.load.streams`) feeds it finished records and hands it
the clock reading and the in-flight stream states at each judgement.
"""

from __future__ import annotations

import math
from typing import Any

from tuner.load.protocol import Live
from tuner.load.records import RequestRecord, token_timeline
from tuner.load.window import STABILITY_MAX_RATIO, WindowPolicy

__all__ = ["INSIDE_SUBWINDOWS", "InsideWindow"]

# In how many sub-windows the steadiness of the window so far is checked.
INSIDE_SUBWINDOWS = 3


class InsideWindow:
    """The level's steady-state window so far, for early stop inside a level (rule 4 of
    tuner.study.early_stop): opened when the first C requests (plan positions < C) have all
    finished, as tuner.load.window opens it; token timestamps of finished requests are
    collected once, in-flight ones are read at each judgement."""

    def __init__(self, concurrency: int, planned: int) -> None:
        self.concurrency = concurrency
        self.planned = planned
        self.first_wave: dict[int, RequestRecord] = {}
        self.opened: float | None = None
        self.first_s = 0.0
        self.points: list[tuple[float, float]] = []
        self.pending: list[RequestRecord] = []
        self.completed = 0

    def add(self, pos: int, record: RequestRecord) -> None:
        self.completed += 1
        if pos < self.concurrency:
            self.first_wave[pos] = record
            if len(self.first_wave) == min(self.concurrency, self.planned):
                self.first_s = min(r.dispatch_s for r in self.first_wave.values())
                self.opened = max(r.done_s for r in self.first_wave.values())
                for r in self.pending + list(self.first_wave.values()):
                    self._take(r)
                self.pending = []
                return
        if self.opened is None:
            self.pending.append(record)
        else:
            self._take(record)

    def _take(self, record: RequestRecord) -> None:
        if record.ok:
            assert self.opened is not None
            self.points.extend(pt for pt in token_timeline(record) if pt[0] >= self.opened)

    def view(self, now: float, live: Live,
             last_dispatch: float | None = None, done_tokens: float = 0.0) -> dict[str, Any] | None:
        """Output tok/s in the window so far, its steadiness and lengths; None when it cannot
        be counted (window not open, or an in-flight request without exact per-chunk usage).

        ``last_dispatch``: nothing more will be issued, so the level's window is known: it
        ends at the last dispatch and starts where tuner.load.window starts it. The rate
        is then an upper bound of the level's output tok/s (``exact``): the tokens in it
        have all arrived, and an in-flight request can only take its tokens out by failing.
        Should the drain still make the window degenerate (under ``min_fraction`` of the
        run), the level reports its whole-run rate instead, which is then at most every
        output token the level can still count (``done_tokens`` of finished requests plus
        each in-flight request's max_tokens) over ``window / min_fraction``; the larger of
        the two is returned."""
        exact = last_dispatch is not None
        opened = self.opened
        if opened is None:
            return None
        if exact:
            assert last_dispatch is not None
            now = last_dispatch
            policy = WindowPolicy()
            opened = max(self.first_s + policy.warmup_fraction * (last_dispatch - self.first_s), opened)
            # Timestamps of finished requests alone must keep the window non-degenerate.
            if sum(1 for t, _ in self.points if opened <= t < now) < policy.min_token_timestamps:
                return None
        if now <= opened:
            return None
        points = [pt for pt in self.points if opened <= pt[0] < now]
        for _, st, _ in list(live.values()):
            times, cum = list(st.times), list(st.cumulative)
            if not st.per_chunk_usage or len(cum) != len(times):
                return None   # its tokens per chunk are unknown until it ends
            points.extend((t, b - a) for t, a, b in zip(times, [0, *cum], cum, strict=False)
                          if opened <= t < now)
        window_s = now - opened
        width = window_s / INSIDE_SUBWINDOWS
        sub = [0.0] * INSIDE_SUBWINDOWS
        for t, k in points:
            sub[min(INSIDE_SUBWINDOWS - 1, int((t - opened) / width))] += k
        stable = min(sub) > 0 and max(sub) / min(sub) <= STABILITY_MAX_RATIO
        rate = math.fsum(sub) / window_s
        if exact:
            most = done_tokens + sum(m for _, _, m in live.values())
            rate = max(rate, most * WindowPolicy().min_fraction / window_s)
        assert self.opened is not None
        return {"output_tok_s": rate, "window_s": window_s, "exact": exact,
                "first_wave_s": self.opened - self.first_s, "stable": stable,
                "completed": self.completed, "planned": self.planned}
