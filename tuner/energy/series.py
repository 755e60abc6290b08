"""A sampled energy counter as a function of time (pure).

A series is a list of ``(t, joules)`` pairs: ``t`` in seconds on one monotonic clock,
``joules`` cumulative and never decreasing (the sources undo counter wrap-around with
:func:`counter_delta` before a value gets here). Between two samples the energy is taken to
grow linearly: the counter is read every few tens of milliseconds while a level's window
lasts tens of seconds, so the only error that matters is at the window's two ends, and
linear interpolation there is the best a sampled counter allows (its bound is the source's
resolution, :mod:`tuner.energy.per_token`).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

__all__ = ["EnergySeries", "counter_delta", "energy_at", "energy_between", "mean_watts", "shifted"]

EnergySeries = Sequence[tuple[float, float]]


def counter_delta(previous: float, current: float, wrap_range: float | None) -> float:
    """Energy between two raw readings of one counter, across at most one wrap.

    RAPL's ``energy_uj`` wraps to zero past ``max_energy_range_uj`` (a 32-bit counter in
    some CPUs wraps after ~4 kJ, a minute of one busy package), so a smaller reading means
    it went round once: the rest of the range plus the new reading. The sampler reads far
    more often than any counter can wrap twice. A counter with no known range (NVML's,
    64-bit millijoules) that goes down was reset (a driver reload): what it counts since the
    reset is all that is known, the new reading itself.
    """
    if current >= previous:
        return current - previous
    if wrap_range is not None and wrap_range > 0:
        return wrap_range - previous + current
    return current


def shifted(series: EnergySeries, origin: float) -> list[tuple[float, float]]:
    """The series on another time base: ``t - origin`` (e.g. seconds since the level start,
    the time base of the level's request records)."""
    return [(t - origin, j) for t, j in series]


def energy_at(series: EnergySeries, t: float) -> float:
    """Cumulative joules at ``t`` by linear interpolation between the samples around it.

    Raises ValueError when ``t`` lies outside the sampled span: extrapolating would guess
    the very energy the window is meant to measure.
    """
    if not series:
        raise ValueError("no energy samples")
    t_first, t_last = series[0][0], series[-1][0]
    if not t_first <= t <= t_last:
        raise ValueError(f"t={t:.3f}s is outside the sampled span [{t_first:.3f}, {t_last:.3f}]s")
    times = [s[0] for s in series]
    i = bisect.bisect_right(times, t)
    if i >= len(series):
        return series[-1][1]
    (ta, ja), (tb, jb) = series[i - 1], series[i]
    if tb <= ta:
        return jb
    return ja + (jb - ja) * (t - ta) / (tb - ta)


def energy_between(series: EnergySeries, t0: float, t1: float) -> float:
    """Joules spent in [t0, t1] (t0 <= t1, both inside the sampled span)."""
    if t1 < t0:
        raise ValueError(f"window end {t1} is before its start {t0}")
    return energy_at(series, t1) - energy_at(series, t0)


def mean_watts(series: EnergySeries, t0: float, t1: float) -> float:
    """Mean power over [t0, t1] (t0 < t1)."""
    if t1 <= t0:
        raise ValueError(f"an empty interval [{t0}, {t1}] has no mean power")
    return energy_between(series, t0, t1) / (t1 - t0)
