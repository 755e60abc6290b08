"""Joules per output token over a level's steady window, and the idle draw (pure).

**Joules per token** is the window's energy over the window's output tokens: the ratio of
the two sums, so it is exactly ``mean watts / output tok/s`` of the same window. Its 95 %
interval has two parts, added (the second is a bound, not a spread, so it is not combined
in quadrature):

* the *spread*: the window is cut into the same equal sub-windows the throughput's interval
  uses (:mod:`tuner.load.window`), each gets its own joules per token, and the half-width
  is Student's t over those values (:func:`tuner.load.uncertainty.mean_ci`), as for
  ``output_tok_s``. It sees what moves within the level: batches forming and finishing,
  clocks and power limits settling.
* the *counter's resolution*: each end of the window is read off a counter that steps by
  ``quantum_j`` and may be up to ``update_s`` stale, so each end can be off by
  ``quantum_j + watts * update_s``; both ends over the window's tokens is the bound.

**Idle draw** is the mean power over a quiet interval (no requests; measured once per
study): what the machine costs doing nothing, reported beside the per-token figure, never
subtracted from it (a served token pays for the idle GPU too).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tuner.energy.series import EnergySeries, energy_between
from tuner.load.uncertainty import mean_ci
from tuner.load.window import WindowRates

__all__ = ["CounterResolution", "EnergyPerToken", "IdleDraw", "idle_draw", "joules_per_token",
           "window_joules_per_token"]

# Parts of the idle interval whose spread gives the idle draw's interval: 5, the most
# sub-windows the throughput's stability rule uses.
IDLE_PARTS = 5


@dataclass(frozen=True, slots=True)
class CounterResolution:
    """How exactly one reading of a source's counter is known."""

    quantum_j: float    # the counter's step (RAPL: 1 uJ; NVML: 1 mJ)
    update_s: float     # how stale a reading may be: the period the counter is refreshed at

    def end_error_j(self, watts: float) -> float:
        """Bound on the error of the energy read at one end of a window at ``watts``."""
        return self.quantum_j + max(watts, 0.0) * self.update_s


@dataclass(frozen=True, slots=True)
class EnergyPerToken:
    """Energy of one level's steady window and its joules per output token."""

    window_start_s: float
    window_end_s: float
    joules: float
    output_tokens: float
    mean_watts: float
    joules_per_token: float
    # 95 % half-width: the spread's (None with fewer than two sub-windows holding tokens)
    # plus the resolution's; None when the spread is unknown. The resolution's share alone
    # is ``resolution_j_per_token``.
    ci95: float | None
    n: int                          # sub-windows the spread rests on
    subwindow_joules_per_token: list[float]
    resolution_j_per_token: float


def joules_per_token(series: EnergySeries, start_s: float, end_s: float,
                     subwindow_tokens: Sequence[float],
                     resolution: CounterResolution) -> EnergyPerToken | None:
    """Joules per output token over [start_s, end_s], cut into ``len(subwindow_tokens)``
    equal sub-windows holding those output tokens; None when the window holds no tokens.

    Raises ValueError when the series does not cover the window (the sampler started late
    or stopped early): an energy figure for part of the window would be wrong, not noisy.
    """
    n = len(subwindow_tokens)
    if n < 1:
        raise ValueError("at least one sub-window is needed")
    if end_s <= start_s:
        raise ValueError(f"an empty window [{start_s}, {end_s}]")
    tokens = math.fsum(subwindow_tokens)
    if tokens <= 0:
        return None
    width = (end_s - start_s) / n
    edges = [start_s + i * width for i in range(n)] + [end_s]
    parts = [energy_between(series, a, b) for a, b in zip(edges, edges[1:])]
    joules = math.fsum(parts)
    watts = joules / (end_s - start_s)
    ratios = [j / k for j, k in zip(parts, subwindow_tokens) if k > 0]
    resolution_part = 2 * resolution.end_error_j(watts) / tokens
    spread = mean_ci(ratios)
    return EnergyPerToken(
        window_start_s=start_s,
        window_end_s=end_s,
        joules=joules,
        output_tokens=tokens,
        mean_watts=watts,
        joules_per_token=joules / tokens,
        ci95=None if spread is None else spread + resolution_part,
        n=len(ratios),
        subwindow_joules_per_token=ratios,
        resolution_j_per_token=resolution_part,
    )


def window_joules_per_token(series: EnergySeries, rates: WindowRates,
                            resolution: CounterResolution) -> EnergyPerToken | None:
    """:func:`joules_per_token` over the window and sub-windows a level's throughput was
    counted in (``series`` on the records' time base: seconds since the level start, see
    :func:`tuner.energy.series.shifted`). A level that fell back to its whole run has no
    sub-windows: its one window gives the figure without a spread (ci95 None)."""
    start, end = rates.window_start_s, rates.window_end_s
    if start is None or end is None or end <= start:
        return None
    if rates.subwindow_output_tok_s and rates.subwindow_s:
        width = rates.subwindow_s
        tokens = [r * width for r in rates.subwindow_output_tok_s]
    else:
        tokens = [rates.output_tok_s * (end - start)]
    return joules_per_token(series, start, end, tokens, resolution)


@dataclass(frozen=True, slots=True)
class IdleDraw:
    """Mean power over a quiet interval, with its 95 % half-width (None: too few parts)."""

    watts: float
    ci95: float | None
    seconds: float
    n: int


def idle_draw(series: EnergySeries, start_s: float, end_s: float, resolution: CounterResolution,
              parts: int = IDLE_PARTS) -> IdleDraw:
    """Mean watts over [start_s, end_s], its interval from ``parts`` equal parts' spread
    plus the counter's resolution at both ends."""
    if end_s <= start_s:
        raise ValueError(f"an empty interval [{start_s}, {end_s}]")
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    seconds = end_s - start_s
    width = seconds / parts
    edges = [start_s + i * width for i in range(parts)] + [end_s]
    watts_parts = [energy_between(series, a, b) / width for a, b in zip(edges, edges[1:])]
    watts = math.fsum(watts_parts) / parts
    spread = mean_ci(watts_parts)
    resolution_w = 2 * resolution.end_error_j(watts) / seconds
    return IdleDraw(watts=watts, ci95=None if spread is None else spread + resolution_w,
                    seconds=seconds, n=parts)
