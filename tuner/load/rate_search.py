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
   the met end), kept within the middle 70 % of the bracket; when that estimate lies within
   ``precision`` of an end, the level goes just inside the precision of that end, so one more
   verdict can close the search.
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
   answer by more than 5 %.
4. **Stop** at the precision — unless an end of the bracket is a verdict within noise
   and a boundary fit is in use (below): the levels left then go to the fit's crossing
   (``_refine_rate``), where a level says the most about it — after ``max_levels``
   levels, when the lowest allowed rate misses (``slo_unmet``: the configuration cannot
   serve the SLO at any rate allowed), or when the highest allowed rate meets (the answer
   is a lower bound, marked so). When one level is left and none has met yet, it goes to
   the lowest allowed rate, so a search always ends knowing whether the SLO can be met
   at all (a rate that met above the lowest miss already says it can).

The answer is the highest rate that met below the lowest rate that missed. Verdicts near
the boundary are noisy: a rate may meet above one that missed. The lowest miss still
bounds the answer (a configuration is not credited with a rate it was seen to miss below),
and the search records such pairs as ``non_monotonic``.

**When the bracket's verdicts are within noise** even after ``max_parts`` runs, they are
close to coin flips, and the highest rate that met is the noisiest estimate at hand: near
the boundary a p90 of a 120-s level moves by ±8-12 % (one standard deviation) between
runs while the margin moves by only ~0.8 % per 1 % of rate (TPOT grows slowly with the
batch), so one run's verdict places the boundary to ±10-15 % and three pooled runs to
±6-9 % (the simulator, glm5-8xpcie-slo.yaml). The margins of all the levels near
the boundary carry that information together: the answer is then where the weighted
least-squares line through (log rate, log margin) of the levels with margins in
``_FIT_BAND`` — each weighted by its runs, the inverse of its variance — crosses margin 1
(``boundary_fit``), kept between the highest rate that met and the lowest rate that
missed with verdicts *outside* noise (a clear verdict is never contradicted): a crossing
below the highest clear meet is raised to it (the verdicts' answer, the highest met below
a miss *within noise*, would otherwise fall below a rate seen to meet clearly: -9.5 % on
one set of arrivals), one at or above the lowest clear miss is not used. Without two such
rates or a rising line, the answer stays the verdicts' one. The result says which
(``answer``: ``verdicts`` | ``fit``). The same holds when no rate met below the lowest
miss but one met above it (the verdicts contradict each other): the levels left go to the
fit's crossing, not to the lowest allowed rate (which answered 0.05 for a truth of 0.47). On 10
configurations of the simulator and four sets of arrivals, the fit with the levels left
spent on it cut the mean error against the ground truth from 3.6 % (fit over the same
levels, stopping at the precision) and ~5 % (verdicts alone) to 2.9 %, at 6.4-7 levels
instead of ~4.9 (``benchmarks/slo_truth.py``).

Rates are rounded to three significant digits (level names such as ``r3.46``); a bracket
that rounding cannot split further ends the search.

Pure: no I/O, no clocks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["BoundaryFit", "MaxRateResult", "Probe", "RateSearch", "RateSearchSpec", "boundary_fit",
           "round_rate"]

_OVERSHOOT = 1.1
_MIN_STEP = 1.15
_MAX_STEP = 2.0
_DEFAULT_STEP = 2.0     # a level without a margin (no sample): double or halve
_INTERP_CLAMP = 0.15    # regula falsi stays within the middle 70 % of the bracket (log scale)
_INSIDE = 0.002         # how far inside an end's precision a closing level goes
_MARGIN_CAP = 2.0       # a missed level's margin as regula falsi uses it
# Margins a boundary fit uses: near the boundary the log margin is close to linear in the
# log rate; a blown-up queue's margin (2 and more) or a nearly idle level's lies on
# another part of the curve and would tilt the line.
_FIT_BAND = (0.7, 1.4)
_FIT_MIN_SLOPE = 0.1    # flatter: the margin says nearly nothing about the rate


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
class BoundaryFit:
    """Where the line through the levels' (log rate, log margin) crosses margin 1."""

    rate: float
    slope: float        # d log margin / d log rate
    levels: int         # distinct rates it rests on
    runs: int           # their runs (weights)


def boundary_fit(points: Sequence[tuple[float, float, int]]) -> BoundaryFit | None:
    """Weighted least-squares fit of log margin on log rate over ``points`` (rate, margin,
    runs pooled into that margin), restricted to margins in ``_FIT_BAND``; the rate where
    the line reaches margin 1. A level of k runs weighs k: its pooled statistic's variance
    is about 1/k of one run's. None with fewer than two distinct rates in the band or a
    line flatter than ``_FIT_MIN_SLOPE`` (falling, or too flat to place the crossing)."""
    lo_m, hi_m = _FIT_BAND
    pts = [(math.log(r), math.log(m), w) for r, m, w in points
           if r > 0 and w > 0 and math.isfinite(m) and lo_m <= m <= hi_m]
    if len({x for x, _, _ in pts}) < 2:
        return None
    total = sum(w for _, _, w in pts)
    mx = sum(w * x for x, _, w in pts) / total
    my = sum(w * y for _, y, w in pts) / total
    sxx = sum(w * (x - mx) ** 2 for x, _, w in pts)
    slope = sum(w * (x - mx) * (y - my) for x, y, w in pts) / sxx
    if not slope >= _FIT_MIN_SLOPE:
        return None
    return BoundaryFit(rate=math.exp(mx - my / slope), slope=slope,
                       levels=len({x for x, _, _ in pts}), runs=int(total))


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
                                   "that missed, or the boundary fit's rate (answer: fit); 0.0 "
                                   "when none did (slo_unmet).")
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
    answer: str = Field(default="verdicts", description="verdicts: max_rate is the highest "
                        "rate that met below the lowest that missed; fit: the bracket's "
                        "verdicts were within noise, max_rate is where the line through the "
                        "margins near the boundary crosses 1 (between the clear verdicts).")
    fit: dict[str, float] | None = Field(default=None, description="The boundary fit "
                                         "(rate, slope, levels, runs), when one was possible.")


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

    def clear_bounds(self) -> tuple[float | None, float | None] | None:
        """(highest rate met, lowest missed) among verdicts outside noise: what a boundary
        fit may not contradict. None when the clear verdicts disagree (a clear meet above
        a clear miss): the search then keeps to its verdicts."""
        misses = [p.rate for p in self.probes if not p.met and not p.within_noise]
        hi = min(misses) if misses else None
        met = [p.rate for p in self.probes if p.met and not p.within_noise]
        lo = max(met) if met else None
        if lo is not None and hi is not None and lo >= hi:
            return None
        return lo, hi

    def optimistic(self) -> float:
        """The largest answer this search can still give (early stop's bound): the lowest
        miss; when that miss is within noise, a boundary fit may place the answer up to
        the lowest miss outside noise (or ``high``)."""
        _, hi = self.bracket()
        if hi is None:
            return self.spec.high
        clear = self.clear_bounds()
        if clear is None:
            return hi
        return self.spec.high if clear[1] is None else clear[1]

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
        if lo is not None and hi is not None and self._bracket_closed(lo, hi):
            if self.measured < s.max_levels and self._refine_rate() is not None:
                return None         # verdicts within noise: levels left go to the fit
            return "found"
        if self.measured >= s.max_levels:
            return "levels"
        return None

    def _bracket_closed(self, lo: float, hi: float) -> bool:
        """Within the precision, or too narrow for a three-digit rate to split."""
        if hi / lo - 1 <= self.spec.precision + 1e-12:
            return True
        mid = round_rate(math.sqrt(lo * hi))
        return not lo < mid < hi

    def _fitted(self) -> tuple[float | None, BoundaryFit | None]:
        """(the boundary fit's answer where it replaces the verdicts' — the verdicts near
        the boundary within noise (``_noisy_boundary``) and clear verdicts that agree —
        else None; the fit). The answer is the fit's crossing, raised to the highest clear
        meet when it lies below it (that rate met outside noise: a noisy miss below it
        does not overrule it); a crossing at or above the lowest clear miss is not used,
        nor one that is the verdicts' own answer."""
        fit = self._fit()
        estimate = self._estimate(fit)
        if estimate is None or estimate == self.bracket()[0]:
            return None, fit
        return estimate, fit

    def _fit(self) -> BoundaryFit | None:
        return boundary_fit([(p.rate, p.margin, p.parts) for p in self.probes
                             if p.margin is not None])

    def _estimate(self, fit: BoundaryFit | None) -> float | None:
        """Where the fit places the boundary within the clear verdicts (``_fitted``), None
        when the verdicts near the boundary are clear, the clear verdicts disagree, or the
        crossing lies at or beyond the lowest clear miss."""
        clear = self.clear_bounds()
        if fit is None or clear is None or not self._noisy_boundary():
            return None
        floor, ceiling = clear
        estimate = round_rate(fit.rate)
        if floor is not None and estimate <= floor:
            estimate = floor
        return estimate if ceiling is None or estimate < ceiling else None

    def _refine_rate(self) -> float | None:
        """Where a level left after the bracket closed goes when its verdicts are within
        noise: at the fit's crossing (where a level tells the most about it), or just
        beside it when that rate was measured; None when the fit is not in use."""
        estimate = self._estimate(self._fit())
        clear = self.clear_bounds()
        if estimate is None or clear is None:
            return None
        floor, ceiling = clear
        step = 1 + self.spec.precision / 4
        for rate in (estimate, round_rate(estimate * step), round_rate(estimate / step)):
            if (self._probe_at(rate) is None and (floor is None or rate > floor)
                    and (ceiling is None or rate < ceiling)):
                return rate
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
            if any(p.met for p in self.probes):
                # Met above the lowest miss: the SLO can be met, the verdicts near the
                # boundary disagree; the fit places it, else a step down as before.
                refine = self._refine_rate()
                if refine is not None:
                    return self._fresh(refine)
            elif left <= 1:
                return self._fresh(s.low)
            last = self._probe_at(hi)
            return self._fresh(max(s.low, round_rate(hi / self._step(last.margin if last else None, False))))
        if hi is None:
            last = self._probe_at(lo)
            return self._fresh(min(s.high, round_rate(lo * self._step(last.margin if last else None, True))))
        if self._bracket_closed(lo, hi):
            return self._refine_rate()      # not done (_done_reason): a level for the fit
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
        estimate, fit = self._fitted()
        answer = "verdicts"
        if estimate is not None and status != "slo_unmet":
            value, answer = estimate, "fit"
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
            answer=answer,
            fit=None if fit is None else {"rate": fit.rate, "slope": fit.slope,
                                          "levels": fit.levels, "runs": fit.runs},
        )

    def _noisy_boundary(self) -> bool:
        """Whether the verdicts that place the boundary are within noise: an end of the
        verdicts' bracket is a verdict within noise, or a rate met above the lowest that
        missed (the verdicts contradict each other: noise by definition)."""
        lo, hi = self.bracket()
        if hi is not None and any(p.met and p.rate > hi for p in self.probes):
            return True
        return any(p is not None and p.within_noise
                   for p in (self._probe_at(lo) if lo is not None else None,
                             self._probe_at(hi) if hi is not None else None))
