"""Noise as a number: 95 % confidence intervals of a level's metrics.

* **Rates** (output/total tok/s) are the mean of the steady window's equal sub-windows, so
  their interval is Student's t over the sub-window rates (aiperf's multi-run rule,
  measurement.md §4). ``request_per_s`` counts completions: Poisson, 1.96·√k / window.
* **Means** (``*.mean``, per-user tok/s): Student's t over the requests.
* **Percentiles** (``*.p50`` …): distribution-free, from the order statistics whose ranks
  bracket the quantile with 95 % binomial probability; a rank past the sample is clamped
  to its end (with too few requests for p99 the interval reaches the sample maximum).
* **Repeats** (``load.repeats`` ≥ 2): Student's t over the repeats' values, when wider.

Intervals are stored as a symmetric half-width (``<metric>.ci95``, the larger side of an
asymmetric one) and the sample count it rests on (``<metric>.n``). Which differences are
ties is :mod:`tuner.study.noise`'s decision.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["Z95", "mean_ci", "quantile_ci", "t95", "with_noise_floor"]

Z95 = 1.959964
# Two-sided 95 % Student t quantiles by degrees of freedom (1..30); beyond, the normal.
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201,
        2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069,
        2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t95(df: int) -> float:
    """Two-sided 95 % Student t quantile for ``df`` degrees of freedom (>= 1)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    return _T95[df - 1] if df <= len(_T95) else Z95 + 2.4 / df


def with_noise_floor(ci95: float, value: float, noise_floor: float) -> float:
    """A run's 95 % half-width widened by the between-start spread ``noise_floor`` (a CV),
    which no single run can see; ``ci95`` may be NaN (unknown), the floor alone is then left."""
    if noise_floor <= 0 or math.isnan(value):
        return ci95
    floor = Z95 * noise_floor * abs(value)
    return floor if math.isnan(ci95) else math.hypot(ci95, floor)


def mean_ci(values: Sequence[float]) -> float | None:
    """Half-width of the 95 % t interval of the mean; None below two values."""
    n = len(values)
    if n < 2:
        return None
    mean = math.fsum(values) / n
    var = math.fsum((x - mean) ** 2 for x in values) / (n - 1)
    return t95(n - 1) * math.sqrt(var / n)


def quantile_ci(sorted_values: Sequence[float], q: float) -> tuple[float, float] | None:
    """95 % distribution-free interval of the ``q`` quantile (0 < q < 1) of sorted data:
    order statistics x(l) <= Q <= x(u) (1-based) with P(l <= B < u) >= 0.95 for
    B ~ Binomial(n, q), ranks clamped to the sample. None for an empty sample."""
    n = len(sorted_values)
    if n == 0:
        return None
    if not 0 < q < 1:
        raise ValueError(f"quantile must be inside (0, 1), got {q}")
    if n > 2000:
        # Normal approximation of the binomial: the exact walk adds nothing here.
        half = Z95 * math.sqrt(n * q * (1 - q))
        lo, hi = math.floor(n * q - half), math.ceil(n * q + half) + 1
    else:
        # One pass over the binomial pmf in log space: l is the largest rank with
        # P(B < l) <= 2.5 %, u the smallest with P(B < u) >= 97.5 %.
        lq, lp = math.log(q), math.log1p(-q)
        log_pmf = n * lp        # log P(B = 0)
        cdf = 0.0
        lo, hi = 1, n
        for k in range(1, n + 1):
            cdf += math.exp(log_pmf)                      # P(B < k)
            if cdf <= 0.025:
                lo = k
            if cdf >= 0.975:
                hi = k
                break
            log_pmf += math.log(n - k + 1) - math.log(k) + lq - lp   # log P(B = k)
    lo = min(max(lo, 1), n)
    hi = min(max(hi, 1), n)
    return sorted_values[lo - 1], sorted_values[hi - 1]
