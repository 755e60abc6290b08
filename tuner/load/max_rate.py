"""The ``max_rate@slo`` search against a server: measure the rate levels the pure search
(:mod:`tuner.load.rate_search`) asks for, until it has its answer.

Each level is an ordinary open-loop rate level (the sweep's own: seeded arrivals, the same
window, noise and records as every ``load.request_rates`` level), so a probed rate is
measured exactly like a configured one; configured rate levels already measured are
handed to the search as free verdicts. The level's SLO verdict
(:func:`tuner.load.slo.level_verdict`, on ``LevelMetrics.slo``) decides.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

from tuner.load.rate_search import MaxRateResult, RateSearch, RateSearchSpec
from tuner.load.results import LevelResult

__all__ = ["search_max_rate"]

logger = logging.getLogger(__name__)

MeasureRate = Callable[[float, int], Awaitable[LevelResult | None]]


def _verdict(level: LevelResult) -> tuple[bool, float | None, bool]:
    slo = level.metrics.slo
    if slo is None:
        raise ValueError("a rate level of the max_rate@slo search carries no SLO verdict")
    return slo.met, slo.margin, slo.within_noise


async def search_max_rate(
    measure: MeasureRate,
    spec: RateSearchSpec,
    *,
    hint: float | None,
    known: Sequence[LevelResult] = (),
    stop: Callable[[float, list[LevelResult]], bool] | None = None,
) -> tuple[MaxRateResult, list[LevelResult]]:
    """Search the highest rate that meets the SLO.

    Args:
        measure: ``measure(rate, part)`` measures part ``part`` of the level at ``rate``
            (part 0 starts it) and returns the level with every part so far and its SLO
            verdict; None when the trial's time budget is spent (the search then ends with
            status ``budget``). A level is extended by parts while its verdict is within
            noise (``RateSearch.needs_more``).
        spec: the study's ``load.rate_search``.
        hint: the first rate when ``spec.start`` is unset (the highest closed-loop
            request_per_s).
        known: rate levels measured already (``load.request_rates``), used as verdicts.
        stop: asked after every level with the largest answer still possible and the levels
            measured so far; True ends the search (early stop: the trial cannot reach the
            front; status ``stopped``).

    Returns:
        The result and the levels this search measured (in measuring order).
    """
    search = RateSearch(spec, hint=hint)
    for level in known:
        met, margin, near = _verdict(level)
        search.observe(level.request_rate or 0.0, met, margin, within_noise=near, reused=True)
    measured: list[LevelResult] = []
    while (rate := search.next_rate()) is not None:
        level = await measure(rate, 0)
        if level is None:
            search.ended = "budget"
            break
        parts = 1
        while search.needs_more(_verdict(level)[2], parts):
            more = await measure(rate, parts)
            if more is None:
                break           # out of time: the verdict as it stands
            level, parts = more, parts + 1
        measured.append(level)
        met, margin, near = _verdict(level)
        search.observe(rate, met, margin, within_noise=near, parts=parts)
        logger.info("max_rate@slo: r=%g %s (margin %s, %d part(s))", rate,
                    "met" if met else "missed", "-" if margin is None else f"{margin:.3g}", parts)
        if stop is not None and search.next_rate() is not None and stop(search.optimistic(), measured):
            search.ended = "stopped"
            break
    return search.result(), measured
