"""``max_rate@slo``: which open-loop request rate to measure next, and what the answer is.

The highest request rate at which a server still meets its SLO is found by measuring rate
levels (``tuner.load.max_rate`` runs them) and deciding here, from their verdicts, which
rate comes next:

1. **Start** at ``start`` if the study gives one, else at the hint (the highest closed-loop
   ``request_per_s`` the trial measured: what the server completes when it is kept busy,
   the rate beyond which an open-loop queue can only grow), clamped to [low, high].
2. **Bracket**: after a level that met the SLO, go up; after one that missed, go down,
   until one rate met and a higher one missed. The step uses the level's margin (the
   largest value/bound over the SLO's terms): if latency grew in proportion to the rate,
   the bound would be reached at rate / margin; it grows faster than that near saturation,
   so rate / margin overshoots a met level's answer (the next level likely misses: a
   bracket in two levels) and undershoots a missed one's (likely meets). The step is
   widened by ``_OVERSHOOT`` and kept within [``_MIN_STEP``, ``_MAX_STEP``]: a queue that
   blew up reports margins of 20 and more, which say nothing about how far below the
   answer is, and a latency flat until a wall (TTFT before saturation) says nothing about
   how far above; doubling then bounds the bracket's width (a factor 4 cost ~0.3 levels
   more on average on the curves of tests/test_rate_search.py).
3. **Narrow** the bracket until high/low − 1 ≤ ``precision``: the next rate is where the
   line through (log rate, log margin) of the bracket's two ends crosses margin 1 (regula
   falsi, as vLLM's SLA scan interpolates to zero SLA distance), the missed end's margin
   taken as at most ``_MARGIN_CAP`` (a blown-up queue's margin would pin the estimate to
   the met end), kept within the middle 70 % of the bracket; when that estimate lies within ``precision`` of an end, the level
   goes just inside the precision of that end, so one more verdict can close the search.
   Two verdicts in a row on the same side mean the line keeps missing the curve (latency
   bends up near saturation): the next rate is then the bracket's geometric middle, which
   halves it whatever the curve (the Illinois safeguard). On synthetic latency curves
   (M/M/1-shaped, power laws, flat-then-wall; tests/test_rate_search.py) this takes
   4.8-5.4 levels on average to 5 %, against 6.7 for bisection after the same bracketing,
   never more than 7.
   A level whose verdict is within noise — a term's 95 % interval spans its bound — is
   measured again with fresh arrivals and prompts and pooled (``needs_more``, up to
   ``max_parts`` runs) before its verdict counts: near the boundary a p90 from a hundred
   requests flips either way, and a wrong verdict at either end of a 5 % bracket moves the
   answer by more than 5 % (``benchmarks/slo_truth.py``: 6 of 10 configurations within 5 %
   without it).
4. **Stop** at the precision, after ``max_levels`` levels, when the lowest allowed rate
   misses (``slo_unmet``: the configuration cannot serve the SLO at any rate allowed), or
   when the highest allowed rate meets (the answer is a lower bound, marked so). When one
   level is left and none has met yet, it goes to the lowest allowed rate, so a search
   always ends knowing whether the SLO can be met at all.

The answer is the highest rate that met below the lowest rate that missed. Verdicts near
the boundary are noisy: a rate may meet above one that missed. The lowest miss still
bounds the answer (a configuration is not credited with a rate it was seen to miss below),
and the search records such pairs as ``non_monotonic``.

Rates are rounded to three significant digits (level names such as ``r3.46``); a bracket
that rounding cannot split further ends the search.

Pure: no I/O, no clocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["MaxRateResult", "Probe", "RateSearch", "RateSearchSpec", "round_rate"]

_OVERSHOOT = 1.1
_MIN_STEP = 1.15
_MAX_STEP = 2.0
_DEFAULT_STEP = 2.0     # a level without a margin (no sample): double or halve
_INTERP_CLAMP = 0.15    # regula falsi stays within the middle 70 % of the bracket (log scale)
_INSIDE = 0.002         # how far inside an end's precision a closing level goes
_MARGIN_CAP = 2.0       # a missed level's margin as regula falsi uses it


class RateSearchSpec(BaseModel):
    """``load.rate_search``: where and how precisely ``max_rate@slo`` is searched."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    low: float = Field(default=0.1, gt=0, description="Lowest rate tried (requests/s); "
                       "missing the SLO here makes the trial infeasible (slo_unmet).")
    high: float = Field(default=100.0, gt=0, description="Highest rate tried; meeting the SLO "
                        "here reports a lower bound.")
    precision: float = Field(default=0.05, gt=0, lt=1, description="Stop when the bracket's "
                             "high/low - 1 is at most this (relative precision of the answer).")
    max_levels: int = Field(default=7, ge=2, le=30, description="Rate levels one search may "
                            "measure (levels of load.request_rates it reuses are free).")
    start: float | None = Field(default=None, gt=0, description="First rate tried; default: "
                                "the trial's highest closed-loop request_per_s.")
    max_parts: int = Field(default=3, ge=1, le=10, description="A rate level whose verdict is "
                           "within noise (a term's 95 % interval spans its bound) is measured "
                           "again with fresh arrivals and prompts, pooled, up to this many "
                           "parts; one level all the same (max_levels counts levels).")

    @model_validator(mode="after")
    def _order(self) -> RateSearchSpec:
        if self.high <= self.low:
            raise ValueError(f"rate_search: high={self.high} must be above low={self.low}")
        if self.start is not None and not self.low <= self.start <= self.high:
            raise ValueError(f"rate_search: start={self.start} is outside [low={self.low}, "
                             f"high={self.high}]")
        return self


def round_rate(rate: float) -> float:
    """Three significant digits: level names stay short, precision stays far below 5 %."""
    return float(f"{rate:.3g}")


@dataclass(frozen=True, slots=True)
class Probe:
    """One measured rate and its verdict."""

    rate: float
    met: bool
    margin: float | None            # max over terms of value / bound
    within_noise: bool = False      # a term's interval spans its bound
    reused: bool = False            # a configured rate level, not measured for the search
    parts: int = 1                  # runs pooled into the verdict (extended while within noise)

    def as_dict(self) -> dict[str, Any]:
        return {"rate": self.rate, "met": self.met, "margin": self.margin,
                "within_noise": self.within_noise, "reused": self.reused, "parts": self.parts}


class MaxRateResult(BaseModel):
    """What a search found (``max_rate@slo`` and how it was found)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_rate: float | None = Field(description="Highest rate that met the SLO below the lowest "
                                   "that missed; 0.0 when none did (slo_unmet).")
    status: str = Field(description="found: bracket within precision; lower_bound: met at the "
                        "highest allowed rate; slo_unmet: missed at the lowest; levels: "
                        "max_levels spent first; budget: the trial's time ran out; stopped: "
                        "early stop ended it.")
    lower_bound: bool = Field(description="max_rate is only a lower bound (no rate above it "
                              "missed, or none was measured).")
    bracket: tuple[float | None, float | None] = Field(description="(highest met, lowest missed).")
    precision: float | None = Field(description="bracket high/low - 1 at the end (None: open).")
    precision_target: float
    levels: int = Field(description="Rate levels measured for the search.")
    probes: list[dict[str, Any]] = Field(description="Every rate in measuring order, verdict, margin.")
    non_monotonic: list[tuple[float, float]] = Field(
        default_factory=list, description="(missed, met above it) pairs: noise near the boundary.")
    low: float
    high: float


@dataclass
class RateSearch:
    """The decisions of one search. ``observe`` each measured level, ask ``next_rate``."""

    spec: RateSearchSpec
    hint: float | None = None
    probes: list[Probe] = field(default_factory=list)
    ended: str | None = None        # budget | stopped, set by the caller

    # -- what is known -------------------------------------------------------------------
    @property
    def measured(self) -> int:
        return sum(1 for p in self.probes if not p.reused)

    def bracket(self) -> tuple[float | None, float | None]:
        """(highest rate met below the lowest missed, lowest missed)."""
        misses = [p.rate for p in self.probes if not p.met]
        hi = min(misses) if misses else None
        met = [p.rate for p in self.probes if p.met and (hi is None or p.rate < hi)]
        return (max(met) if met else None), hi

    def _probe_at(self, rate: float) -> Probe | None:
        for p in reversed(self.probes):
            if math.isclose(p.rate, rate, rel_tol=1e-9):
                return p
        return None

    def observe(self, rate: float, met: bool, margin: float | None = None, *,
                within_noise: bool = False, reused: bool = False, parts: int = 1) -> None:
        if not rate > 0:
            raise ValueError(f"rate must be > 0, got {rate}")
        self.probes.append(Probe(float(rate), bool(met), margin, within_noise, reused, parts))

    def needs_more(self, within_noise: bool, parts: int) -> bool:
        """Whether a level measured in ``parts`` runs so far gets one more before its
        verdict counts: while the verdict is within noise (its interval spans the bound),
        up to ``max_parts``. Noise rule of every level (docs/measurement.md): a decision
        is not taken on a difference the measurement could produce by chance."""
        return within_noise and parts < self.spec.max_parts

    def optimistic(self) -> float:
        """The largest answer this search can still give (early stop's bound)."""
        _, hi = self.bracket()
        return self.spec.high if hi is None else hi

    # -- decisions -----------------------------------------------------------------------
    def _step(self, margin: float | None, up: bool) -> float:
        if margin is None or not math.isfinite(margin) or margin <= 0:
            return _DEFAULT_STEP
        step = (1 / margin if up else margin) * _OVERSHOOT
        return min(_MAX_STEP, max(_MIN_STEP, step))

    def _done_reason(self) -> str | None:
        s = self.spec
        lo, hi = self.bracket()
        if self.ended is not None:
            return self.ended
        if hi is not None and lo is None and hi <= s.low * (1 + 1e-9):
            return "slo_unmet"
        if hi is None and lo is not None and lo >= s.high * (1 - 1e-9):
            return "lower_bound"
        if lo is not None and hi is not None:
            if hi / lo - 1 <= s.precision + 1e-12:
                return "found"
            mid = round_rate(math.sqrt(lo * hi))
            if not lo < mid < hi:
                return "found"      # rounding cannot split the bracket further
        if self.measured >= s.max_levels:
            return "levels"
        return None

    def next_rate(self) -> float | None:
        """The next rate to measure, or None when the search is over."""
        if self._done_reason() is not None:
            return None
        s = self.spec
        lo, hi = self.bracket()
        left = s.max_levels - self.measured
        if lo is None and hi is None:
            first = s.start if s.start is not None else self.hint
            if first is None or not math.isfinite(first) or first <= 0:
                first = math.sqrt(s.low * s.high)
            return self._fresh(round_rate(min(s.high, max(s.low, first))))
        if lo is None:
            assert hi is not None
            if left <= 1:
                return self._fresh(s.low)
            last = self._probe_at(hi)
            return self._fresh(max(s.low, round_rate(hi / self._step(last.margin if last else None, False))))
        if hi is None:
            last = self._probe_at(lo)
            return self._fresh(min(s.high, round_rate(lo * self._step(last.margin if last else None, True))))
        return self._fresh(self._narrow(lo, hi))

    def _narrow(self, lo: float, hi: float) -> float:
        """The next rate inside a bracket (module docstring, step 3)."""
        p = self.spec.precision
        middle = round_rate(math.sqrt(lo * hi))
        a, b = self._probe_at(lo), self._probe_at(hi)
        last = [q.met for q in self.probes[-2:]]
        if (a is None or b is None or a.margin is None or b.margin is None
                or not 0 < a.margin < 1 < b.margin or (len(last) == 2 and last[0] == last[1])):
            return middle
        high = min(b.margin, _MARGIN_CAP)
        t = -math.log(a.margin) / (math.log(high) - math.log(a.margin))
        t = min(1 - _INTERP_CLAMP, max(_INTERP_CLAMP, t))
        rate = lo * (hi / lo) ** t
        if rate >= hi / (1 + p):
            rate = hi / (1 + p) * (1 + _INSIDE)
        elif rate <= lo * (1 + p):
            rate = lo * (1 + p) * (1 - _INSIDE)
        rate = round_rate(rate)
        return rate if lo < rate < hi else middle

    def _fresh(self, rate: float) -> float | None:
        """``rate`` unless it was measured already (then the search cannot move: over)."""
        if self._probe_at(rate) is not None:
            self.ended = self.ended or "levels"
            return None
        return rate

    def result(self) -> MaxRateResult:
        s = self.spec
        lo, hi = self.bracket()
        status = self._done_reason() or "levels"
        pairs = sorted({(m.rate, p.rate) for m in self.probes if not m.met
                        for p in self.probes if p.met and p.rate > m.rate})
        if status == "slo_unmet" or (lo is None and hi is not None):
            value: float | None = 0.0 if status == "slo_unmet" else None
        else:
            value = lo
        return MaxRateResult(
            max_rate=value,
            status=status,
            lower_bound=value is not None and hi is None,
            bracket=(lo, hi),
            precision=(hi / lo - 1) if lo and hi else None,
            precision_target=s.precision,
            levels=self.measured,
            probes=[p.as_dict() for p in self.probes],
            non_monotonic=pairs,
            low=s.low,
            high=s.high,
        )
