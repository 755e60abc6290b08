"""The study's own noise: how far one configuration's figures move between fresh server starts.

One run's interval (tuner.load.uncertainty) sees only the noise inside that run. What a
fresh start changes - where the allocator put the KV cache, which kernels the autotuner
picked, how busy the host's CPUs were - no single run can see, and it is what decides
whether two configurations can be told apart. Its size depends on the box and the model:
~0.5 % on an 8B-class model that keeps an H100 busy, 3-17 % on a 135M model whose GPU waits
on the host (docs/measurement.md). So a study measures it instead of assuming it.

**Where the figures come from.** Every configuration measured more than once on fresh
servers: the baseline started ``load.noise_starts`` times at the start of the study, and
any confirmation or tie re-run (``confirm/``). Each objective label gets its own estimate,
because throughput at c=32 and TPOT at c=1 need not move alike.

**The estimate.** Values are compared on a log scale (a spread is relative): the pooled
standard deviation over the groups, s = sqrt(sum of squared deviations from each group's
mean / df) with df = sum(n_g - 1), is the between-start coefficient of variation. How sure
it is: its 99 % interval from the chi-square distribution with df degrees of freedom (exact
for log-normal noise; 99 % rather than 95 % so that a statement a study makes about its own
box is wrong once in a hundred studies, not once in twenty). A spread from 2 starts has
df = 1 and an interval that spans a factor of ~450; from 10 starts the factor is ~4.

**What intervals get.** One start's value v of a configuration whose true mean is m has
(ln v - ln m) / s ~ Student t(df) when s is estimated from df degrees of freedom: the
relative 95 % half-width a value gets is t95(df) * s, which is wide while df is small and
tends to 1.96 s. It is added in quadrature to the run's own interval. Before any repeat has
finished (df = 0) a prior of ``ASSUMED_CV`` stands in, said as assumed. A study that sets
``load.noise_floor`` uses that number instead (an override), as before.

**When a run's own interval claims more than the starts show.** A run's interval treats its
sub-windows as independent draws. On a replayed dataset whose level is a few bursty requests
long (long prefills stall the decodes between them) they are not: on the CPU chat study three
sub-windows of 0.6, 36 and 40 tok/s gave ±211 %, while four fresh starts of that configuration
moved 4.5 %. Each fresh start's value already holds its own run's sampling noise, so the
starts' spread bounds it: where the repeated configurations' own intervals (their median,
relative) are wider than 1.96 times the upper end of the spread's 99 % interval, every run's
own interval is scaled down by that ratio before it is combined, and the status says so.
Starts that agree exactly (a deterministic simulator) prove nothing about a run's own
sampling, and scale nothing.

Pure: plain numbers and records in, plain data out.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tuner.load.uncertainty import Z95, t95

__all__ = ["ASSUMED_CV", "CONFIDENCE", "NOISY_CV", "LabelNoise", "StudyNoise", "chi2_quantile", "estimate_label",
           "noise_tolerances", "own_part", "pooled_log_sd", "read_at_level", "study_noise"]

# Between-start CV used until the study has measured one: the figure benchmarks/level_stability.py
# targets on a GPU-bound box (3 % at c=32). Said as "assumed" wherever it is shown.
ASSUMED_CV = 0.03
# A measured CV above this is noise the study cannot see past: configurations closer than
# ~2.8 times it (the 95 % interval of a difference of two starts) tie.
NOISY_CV = 0.05
# How sure the estimate is: the confidence of its interval.
CONFIDENCE = 0.99
# The largest CV a worker is handed (a load spec's noise_floor is below 1).
MAX_FLOOR = 0.99

Source = Literal["measured", "assumed", "override"]


def read_at_level(label: str) -> bool:
    """Whether an objective is read at a load level (``metric@c32``, ``metric@r2.0``), which is
    what a fresh start moves. Trial-level metrics are not widened by it: ``startup_s`` is one
    reading, ``accuracy_drop`` carries its own paired interval from the quality gate, and
    ``max_rate@slo`` its search's bracket."""
    return "@" in label and label != "max_rate@slo"


def _lower_gamma_regularized(a: float, x: float) -> float:
    """P(a, x), the regularized lower incomplete gamma function (Numerical Recipes' split:
    the series below a + 1, the continued fraction above)."""
    if x <= 0:
        return 0.0
    log_front = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        ap = a
        for _ in range(500):
            ap += 1
            term *= x / ap
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return total * math.exp(log_front)
    tiny = 1e-300
    b = x + 1 - a
    c = 1 / tiny
    d = 1 / b
    h = d
    for i in range(1, 500):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return 1.0 - h * math.exp(log_front)


def chi2_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of the chi-square distribution with ``df`` degrees of freedom."""
    if not 0 < p < 1 or df < 1:
        raise ValueError(f"chi2_quantile needs 0 < p < 1 and df >= 1, got p={p}, df={df}")
    a = df / 2.0
    lo, hi = 0.0, max(1.0, df + 20.0 * math.sqrt(2.0 * df))
    while _lower_gamma_regularized(a, hi / 2.0) < p:
        hi *= 2
    for _ in range(200):           # bisection to double precision
        mid = (lo + hi) / 2
        if _lower_gamma_regularized(a, mid / 2.0) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2


def pooled_log_sd(groups: Iterable[Sequence[float]]) -> tuple[float, int, int]:
    """(pooled SD of ln values within groups, degrees of freedom, values used) over the groups
    of two or more positive finite values; (nan, 0, 0) when none has two."""
    squares, df, used = 0.0, 0, 0
    for group in groups:
        logs = [math.log(v) for v in group if v > 0 and math.isfinite(v)]
        if len(logs) < 2:
            continue
        mean = math.fsum(logs) / len(logs)
        squares += math.fsum((x - mean) ** 2 for x in logs)
        df += len(logs) - 1
        used += len(logs)
    return (math.sqrt(squares / df) if df else math.nan), df, used


@dataclass(frozen=True)
class LabelNoise:
    """The between-start spread of one objective label."""

    label: str
    cv: float            # the point estimate (pooled SD of ln values ~ coefficient of variation)
    df: int              # its degrees of freedom: values used minus groups
    low: float           # its CONFIDENCE interval
    high: float
    starts: int          # values it rests on
    groups: int          # configurations they came from

    @property
    def half_width(self) -> float:
        """The relative 95 % half-width one start's value gets: t95(df) * cv."""
        return t95(self.df) * self.cv

    def as_dict(self) -> dict[str, Any]:
        return {"label": self.label, "cv": self.cv, "df": self.df, "cv_low": self.low, "cv_high": self.high,
                "confidence": CONFIDENCE, "starts": self.starts, "groups": self.groups,
                "half_width": self.half_width}


def estimate_label(label: str, groups: Sequence[Sequence[float]]) -> LabelNoise | None:
    """The estimate from groups of fresh-start values of identical configurations; None
    without a group of two."""
    sd, df, used = pooled_log_sd(groups)
    if df == 0:
        return None
    tail = (1 - CONFIDENCE) / 2
    low = sd * math.sqrt(df / chi2_quantile(1 - tail, df))
    high = sd * math.sqrt(df / chi2_quantile(tail, df))
    n_groups = sum(1 for g in groups if len([v for v in g if v > 0 and math.isfinite(v)]) >= 2)
    return LabelNoise(label, sd, df, low, high, used, n_groups)


@dataclass(frozen=True)
class StudyNoise:
    """What a study's intervals are widened by, per objective label, and where it came from."""

    labels: tuple[str, ...]
    override: float | None = None                   # load.noise_floor, when the study set one
    measured: Mapping[str, LabelNoise] = field(default_factory=dict)
    # Per measured label: the median relative 95 % half-width the repeated configurations'
    # runs gave themselves (their own intervals, without any between-start part).
    run_widths: Mapping[str, float] = field(default_factory=dict)

    def source(self, label: str) -> Source:
        if self.override is not None:
            return "override"
        return "measured" if label in self.measured else "assumed"

    def half_width(self, label: str) -> float:
        """The relative 95 % half-width a value at ``label`` gets for the noise no run sees."""
        if self.override is not None:
            return Z95 * self.override
        found = self.measured.get(label)
        return Z95 * ASSUMED_CV if found is None else found.half_width

    def floor(self) -> float:
        """One CV for a worker's own decisions inside a trial (its early stops): the widest
        label's half-width as the CV that ``with_noise_floor`` turns into it, below 1 (a
        spread from one degree of freedom can ask for more: 12.7 x a 17 % CV is past any
        bound a value could have)."""
        if self.override is not None:
            return self.override
        return min(MAX_FLOOR, max((self.half_width(label) for label in self.labels if read_at_level(label)),
                                  default=Z95 * ASSUMED_CV) / Z95)

    def widen(self, label: str, value: float, ci95: float | None, baked_floor: float | None) -> float | None:
        """A stored half-width as the study's noise says it should be: the between-start part the
        worker added when it measured (``baked_floor``, a CV) is taken out and the study's current
        one put in. A record without ``baked_floor`` (measured before studies measured their
        noise) carries its study's fixed floor already and is left as it is."""
        if baked_floor is None or self.override is not None or not math.isfinite(value):
            return ci95
        return math.hypot(own_part(ci95, value, baked_floor) * self.run_scale(label),
                          self.half_width(label) * abs(value))

    def run_scale(self, label: str) -> float:
        """What a run's own interval at ``label`` is multiplied by: below 1 where the repeated
        configurations' own intervals were wider than even the upper end of the starts' spread
        (its 99 % bound, so two starts that agree by chance prove little; module doc)."""
        ref, found = self.run_widths.get(label), self.measured.get(label)
        if ref is None or found is None or self.override is not None:
            return 1.0
        bound = Z95 * found.high
        return bound / ref if ref > bound > 0 else 1.0

    def too_noisy(self) -> list[str]:
        """The labels whose measured spread is above ``NOISY_CV``."""
        return [n.label for n in self.measured.values() if n.cv > NOISY_CV and read_at_level(n.label)]

    def as_dict(self) -> dict[str, Any]:
        return {"override": self.override, "assumed_cv": ASSUMED_CV,
                "labels": {label: {"source": self.source(label), "half_width": self.half_width(label),
                                   "run_width": self.run_widths.get(label), "run_scale": self.run_scale(label),
                                   **({} if label not in self.measured else self.measured[label].as_dict())}
                           for label in self.labels if read_at_level(label)},
                "too_noisy": self.too_noisy()}

    def lines(self) -> list[str]:
        """What status and the report say about it, one line per label, then the advice."""
        if self.override is not None:
            return [f"load.noise_floor {self.override:g} set by the study: every interval gets "
                    f"±{Z95 * self.override:.1%} for what a fresh start changes (not measured)"]
        out = []
        for label in filter(read_at_level, self.labels):
            found = self.measured.get(label)
            if found is None:
                out.append(f"{label}: not measured yet (no configuration has two fresh starts); "
                           f"assumed {ASSUMED_CV:.0%} between starts")
                continue
            out.append(f"{label}: {found.cv:.2%} between starts ({CONFIDENCE:.0%} interval {found.low:.2%}-"
                       f"{found.high:.2%}; {found.starts} starts of {found.groups} configuration(s), "
                       f"df {found.df}) -> values ±{found.half_width:.1%}")
            if self.run_scale(label) < 1:
                out.append(f"{label}: one run's own interval (median ±{self.run_widths[label]:.0%} on the repeated "
                           f"configuration) is wider than its fresh starts moved: own intervals scaled by "
                           f"{self.run_scale(label):.2f}")
        noisy = self.too_noisy()
        if noisy:
            out.append(f"too noisy to tell configurations apart at {', '.join(noisy)}: differences under "
                       f"~{2.8 * min(self.measured[n].cv for n in noisy):.0%} are ties. What helps: longer "
                       "levels (load.max_level_seconds), a model that keeps the GPU busy, and `tuner "
                       "host-check` to see whether the host's CPUs move")
        return out


def _group_key(params: Mapping[str, Any]) -> str:
    return repr(sorted((str(k), repr(v)) for k, v in params.items()))


def own_part(ci95: float | None, value: float, baked_floor: float | None) -> float:
    """A run's own 95 % half-width: its stored one without the between-start part the worker
    added when it measured (``baked_floor``, a CV)."""
    run = 0.0 if ci95 is None or not math.isfinite(ci95) else ci95
    baked = Z95 * (baked_floor or 0.0) * abs(value)
    return math.sqrt(max(0.0, run * run - baked * baked))


def study_noise(labels: Sequence[str], runs: Iterable[tuple[Mapping[str, Any], Mapping[str, float]]],
                *, override: float | None = None,
                own: Iterable[tuple[Mapping[str, Any], Mapping[str, float]]] = ()) -> StudyNoise:
    """The study's noise from its fresh-start measurements: ``runs`` are (configuration,
    measured objective values by label) pairs, one per fresh start (trials and re-runs);
    ``own`` the same for the trials' own relative interval half-widths."""
    if override is not None:
        return StudyNoise(tuple(labels), override=override)
    grouped: dict[str, dict[str, list[float]]] = {}
    for params, values in runs:
        by_label = grouped.setdefault(_group_key(params), {})
        for label, value in values.items():
            by_label.setdefault(label, []).append(float(value))
    measured = {}
    for label in labels:
        found = estimate_label(label, [g.get(label, []) for g in grouped.values()])
        if found is not None:
            measured[label] = found
    widths: dict[str, list[float]] = {}
    for params, own_widths in own:
        repeated = grouped.get(_group_key(params), {})
        for label, width in own_widths.items():
            if label in measured and len(repeated.get(label, [])) >= 2 and math.isfinite(width):
                widths.setdefault(label, []).append(width)
    return StudyNoise(tuple(labels), measured=measured,
                      run_widths={label: statistics.median(w) for label, w in widths.items()})


def noise_tolerances(half_widths: Sequence[float], reruns: int) -> list[float]:
    """Each objective's tolerance from the study's noise: a re-run median and the trial are
    both fresh starts of one configuration, so their difference has the 95 % half-width
    h * sqrt(1 + 1/k) for ``reruns`` k, h being the trial value's relative 95 % half-width
    (its run's own interval and the noise between starts, tuner.study.between_starts)."""

    return [h * math.sqrt(1 + 1 / max(1, reruns)) for h in half_widths]
