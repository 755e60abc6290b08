"""Levels sized by time and steady state: when a closed-loop level has measured enough.

A level sized by request count can be over before a fast server reaches steady state (on
an H200 a c=32 level of 3 requests per stream lasted 1.1-1.6 s, its steady window ~0.5 s,
and repeated measurements differed by up to 24 %). A steady level instead runs its streams
until the numbers have settled, then stops:

* **Warm-up** lasts at least until the first wave (the first C requests, which start
  together and prefill together) has finished, and then as long as throughput still moves:
  the measured window is always the *latest* stretch of the level, so everything before it
  is warm-up, however long a slow ramp takes.
* **The window** ends at the moment of the decision and is at least ``max(min_window_s,
  the time the last max(min_requests, C) completions took)`` long, cut into
  ``subwindows`` equal sub-windows. It counts output tokens by their own arrival times
  (measurement.md §4.2).
* **The stability rule** (Perf Analyzer's, measurement.md §4.5): the window's sub-window
  output rates agree within ``max_ratio`` (max/min). While they do not, the level goes on:
  the window slides forward (past a slow ramp) and longer windows back to the first wave
  are judged too (a noisy level settles as sub-windows grow); a level that reaches
  ``max_level_s`` without the rule holding stops there and is marked unstable.

Pure: the running loop (:mod:`tuner.load.steady_loop`) feeds finished records, asks with
the clock reading and the in-flight stream states, and acts on the answer. Tokens are
binned in ``bin_s`` slots as they arrive, and window edges are whole bins, so a decision
costs one pass over the window's bins and matches what :mod:`tuner.load.window` later
computes from the records.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from tuner.load.protocol import Live
from tuner.load.records import RequestRecord, token_timeline

__all__ = ["SteadyCheck", "SteadyRule", "SteadyTracker", "live_points"]


@dataclass(frozen=True, slots=True)
class SteadyRule:
    """When a steady level has measured enough (the study's ``load:`` settings)."""

    min_window_s: float
    min_requests: int
    subwindows: int
    max_ratio: float
    max_level_s: float
    bin_s: float = 0.01

    def needed_completions(self, concurrency: int) -> int:
        """Requests that must finish inside the window: every stream cycles at least once,
        and percentiles need a floor of samples at low concurrency."""
        return max(self.min_requests, concurrency)


@dataclass(frozen=True, slots=True)
class SteadyCheck:
    """One judgement of the window ending now."""

    start_s: float
    end_s: float
    rates: tuple[float, ...]       # output tok/s per sub-window
    completions: int               # requests that finished inside the window
    enough: bool                   # long enough, enough completions, after the first wave
    stable: bool                   # the sub-window rates agree within max_ratio

    @property
    def window_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def output_tok_s(self) -> float:
        return math.fsum(self.rates) / len(self.rates) if self.rates else 0.0

    @property
    def ratio(self) -> float | None:
        low = min(self.rates, default=0.0)
        return max(self.rates) / low if low > 0 else None


def live_points(live: Live) -> list[tuple[float, float]]:
    """Tokens of in-flight requests so far: exact with per-chunk usage, else one per chunk
    (a judgement only; the level's figures are computed from the finished records)."""
    out: list[tuple[float, float]] = []
    for _, st, _ in list(live.values()):
        times, cum = list(st.times), list(st.cumulative)
        if st.per_chunk_usage and len(cum) == len(times):
            out.extend((t, float(b - a)) for t, a, b in zip(times, [0, *cum], cum, strict=False))
        else:
            out.extend((t, 1.0) for t in times)
    return out


class SteadyTracker:
    """The token arrivals and completions of one running level, and the stability rule."""

    def __init__(self, rule: SteadyRule, concurrency: int) -> None:
        if rule.subwindows < 2:
            raise ValueError(f"subwindows must be >= 2, got {rule.subwindows}")
        self.rule = rule
        self.concurrency = concurrency
        self._bins: list[float] = []
        self._ends: list[tuple[float, float]] = []   # (end, duration) of completed requests
        self._first_wave: list[RequestRecord] = []
        self.opened_s: float | None = None  # when the first wave had all finished
        self.first_s: float | None = None   # the first dispatch
        self.failed = 0

    def add(self, pos: int, record: RequestRecord) -> None:
        """A request finished; ``pos`` is its dispatch order in the level (0-based)."""
        if pos < self.concurrency:
            self._first_wave.append(record)
            if len(self._first_wave) == self.concurrency:
                self.first_s = min(r.dispatch_s for r in self._first_wave)
                self.opened_s = max(r.done_s for r in self._first_wave)
        if not record.ok:
            self.failed += 1
            return
        self._bin(token_timeline(record), self._bins)
        if record.end_s is not None:
            self._ends.append((record.end_s, record.done_s - record.dispatch_s))

    def _bin(self, points: Iterable[tuple[float, float]], bins: list[float]) -> None:
        b = self.rule.bin_s
        for t, k in points:
            i = int(t / b)
            if i >= len(bins):
                bins.extend([0.0] * (i + 1 - len(bins)))
            bins[i] += k

    def check(self, now: float, live: Iterable[tuple[float, float]] = ()) -> SteadyCheck | None:
        """The window to judge at ``now`` (rounded down to a bin); None before the first
        wave has finished or before any window fits after it.

        The shortest admissible window is ``max(min_window_s, the time the latest
        max(min_requests, C) completions took)``. Longer windows ending now (x1.5 each,
        back to the first wave) are judged too, and the longest that meets the rule is the
        answer: a level whose short sub-windows see the saw-tooth of single prefills and
        completions settles as its sub-windows grow, while a window reaching back into a
        slow ramp fails the rule and is not taken."""
        if self.opened_s is None:
            return None
        rule, b = self.rule, self.rule.bin_s
        n = rule.subwindows
        end_bin = int(now / b)
        open_bin = math.ceil(self.opened_s / b - 1e-9)
        end = end_bin * b
        ends = sorted(e for e, _ in self._ends if e < end)
        need = rule.needed_completions(self.concurrency)
        span = math.ceil(rule.min_window_s / b - 1e-9)
        if len(ends) >= need:
            span = max(span, end_bin - int(ends[-need] / b))
        span = -(-span // n) * n                    # whole bins per sub-window
        room = (end_bin - open_bin) // n * n
        if room <= 0:
            return None
        if span > room or len(ends) < need:
            # Not yet: judge what there is since the first wave (for early stop's view).
            return self._judge(end_bin - min(span, room), end_bin, live, ends, enough=False)
        best = self._judge(end_bin - span, end_bin, live, ends, enough=True)
        longer = span
        while True:
            longer = -(-int(longer * 1.5) // n) * n
            if longer > room:
                break
            candidate = self._judge(end_bin - longer, end_bin, live, ends, enough=True)
            if candidate.stable:
                best = candidate
        if not best.stable:
            # Judged on the whole stretch since the first wave when nothing is stable.
            whole = self._judge(end_bin - room, end_bin, live, ends, enough=True)
            if whole.stable:
                best = whole
        return best

    def _judge(self, start_bin: int, end_bin: int, live: Iterable[tuple[float, float]],
               ends: list[float], *, enough: bool) -> SteadyCheck:
        rule, b, n = self.rule, self.rule.bin_s, self.rule.subwindows
        bins = self._bins[start_bin:end_bin]
        bins += [0.0] * (end_bin - start_bin - len(bins))
        start, end = start_bin * b, end_bin * b
        extra: list[float] = []
        self._bin(((t - start, k) for t, k in live if start <= t < end), extra)
        for i, k in enumerate(extra[: len(bins)]):
            bins[i] += k
        per = len(bins) // n
        width = per * b
        rates = tuple(math.fsum(bins[j * per:(j + 1) * per]) / width for j in range(n))
        completions = sum(1 for e in ends if e >= start)
        low = min(rates)
        stable = low > 0 and max(rates) / low <= rule.max_ratio
        return SteadyCheck(start, end, rates, completions, enough, stable)

    def done(self, check: SteadyCheck | None, now: float) -> bool:
        """Whether the level stops now: the rule holds, its time is up, or as many requests
        failed as the window needs to complete (a server failing fast would otherwise be
        sent requests as quickly as it refuses them until the time is up; its failures
        make the trial infeasible anyway)."""
        if now >= self.rule.max_level_s:
            return True
        if self.failed >= self.rule.needed_completions(self.concurrency):
            return True
        return check is not None and check.enough and check.stable
