"""Summary statistics of a latency sample (percentiles as numpy's linear default)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["P99_MIN_SAMPLES", "Stat", "percentile"]

# aiperf's rule of thumb (measurement.md §4, "Sample-size guidance" and recommended default
# 3): p99 needs >= 1000 samples. Below that p99 is essentially the maximum of a few
# requests, so it is still reported but flagged; objectives should prefer p90 there.
P99_MIN_SAMPLES = 1000


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """``q``-th percentile with linear interpolation (numpy's default), of sorted data."""
    if not sorted_values:
        raise ValueError("percentile of an empty sequence")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be within [0, 100], got {q}")
    h = (len(sorted_values) - 1) * q / 100
    lo = math.floor(h)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (h - lo) * (sorted_values[hi] - sorted_values[lo])


class Stat(BaseModel):
    """Summary of one latency sample. Empty samples have ``n=0`` and None values."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    n: int
    mean: float | None = None
    std: float | None = None
    min: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    max: float | None = None
    low_confidence_p99: bool = Field(
        default=True, description=f"n < {P99_MIN_SAMPLES}: p99 is close to the sample max."
    )

    @classmethod
    def of(cls, values: Iterable[float]) -> Stat:
        xs = sorted(values)
        n = len(xs)
        if n == 0:
            return cls(n=0)
        mean = math.fsum(xs) / n
        var = math.fsum((x - mean) ** 2 for x in xs) / n  # population std, as numpy
        return cls(
            n=n,
            mean=mean,
            std=math.sqrt(var),
            min=xs[0],
            p50=percentile(xs, 50),
            p90=percentile(xs, 90),
            p95=percentile(xs, 95),
            p99=percentile(xs, 99),
            max=xs[-1],
            low_confidence_p99=n < P99_MIN_SAMPLES,
        )
