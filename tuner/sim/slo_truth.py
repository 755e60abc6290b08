"""Ground truth of ``max_rate@slo`` on the simulator: its model, evaluated without a server.

For one point of a study's space (``tuner.sim.truth.Evaluator`` resolves it to the
simulated engine configuration and calibrates the workload from the study's own requests),
an open-loop level at rate λ is the simulator's open-loop model
(:func:`tuner.sim.open_loop.simulate_open_loop`) fed with the load generator's own arrival
schedule (:func:`tuner.load.workload.arrival_schedule`: the study's arrival process and
burstiness, ``load.requests_for_rate(λ)`` requests); the level's statistics come from the
tuner's own code (``tuner.load.stats.Stat``) and its verdict from
``tuner.load.slo.level_verdict``, so nothing here re-implements what is being checked.

**The true value** (``true_max_rate``): the rate where the SLO's statistics over
``seeds`` (64) independent levels of the study's size, pooled, reach their bounds,
bisected to 0.2 %. Many seeds, because a level's latencies come in correlated bursts: the
pooled p90 of 8 levels still moved the answer by ±3 % between seed sets. The seeds use
common random numbers across rates (the same stream names at every rate: a gamma draw
scales with 1/λ), so the pooled statistic moves smoothly with the rate.
It is defined for the study's level size on purpose: near saturation a longer level lets a
queue grow further, so "the highest rate that meets the SLO" depends on how long the SLO is
watched; the tuner measures levels of that size, and this is what it estimates.

**One measurement** (``measure_level``): a level with the sweep's own seed streams for that
rate (``rate_stream("measure", λ)``, then its repeats' for each extra part), i.e. exactly
the requests and arrival times a trial sends, so it carries the sampling noise a real
measurement has.

Pure: no I/O, no clocks (simulated seconds).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tuner.load.load_spec import LoadSpec
from tuner.load.slo import SloSpec, SloVerdict, level_verdict, term_ci
from tuner.load.workload import arrival_schedule, rate_stream
from tuner.sim.open_loop import OpenLoopRun, simulate_open_loop
from tuner.sim.perf_config import PerfConfig
from tuner.sim.perf_model import Workload
from tuner.sim.truth import Evaluator, ngram_of
from tuner.sim.truth_verify import sim_start
from tuner.study.space import trial_ignore_eos
from tuner.study.spec import StudySpec

__all__ = ["COARSE_SEEDS", "OpenLoopPoint", "TRUTH_SEEDS", "level_flat", "measure_level", "model_clock",
           "open_loop_point", "pooled_verdict", "true_max_rate"]

TRUTH_SEEDS = 64
COARSE_SEEDS = 8
TRUTH_PRECISION = 0.002


def model_clock(spec: StudySpec) -> tuple[StudySpec, float]:
    """``spec`` restated in the model's clock, and the served simulator's time scale.

    A study against the served simulator runs its clock ``TUNER_SIM_TIME_SCALE`` times the
    model's (0.1: ten times faster), so its SLO bounds are that much smaller and its rates
    and level durations that much larger; the model here runs in simulated seconds. Rates
    found in the model's clock are the study's times 1/scale."""
    scale = float(spec.server.env.get("TUNER_SIM_TIME_SCALE") or 1.0)
    if scale == 1.0 or spec.slo is None:
        return spec, scale
    load = spec.load
    search = load.rate_search.model_copy(update={
        "low": load.rate_search.low * scale, "high": load.rate_search.high * scale,
        "start": None if load.rate_search.start is None else load.rate_search.start * scale})
    load = load.model_copy(update={
        "rate_duration_s": load.rate_duration_s / scale, "rate_search": search,
        "request_rates": tuple(r * scale for r in load.request_rates)})
    slo = SloSpec.model_validate({t.key: t.bound_ms / scale for t in spec.slo.terms})
    return spec.model_copy(update={"load": load, "slo": slo}), scale


@dataclass(frozen=True)
class OpenLoopPoint:
    """What the open-loop model needs of one point of the space."""

    values: dict[str, Any]
    perf: PerfConfig
    workload: Workload


def open_loop_point(ev: Evaluator, values: dict[str, Any]) -> OpenLoopPoint | None:
    """The point's engine configuration and calibrated workload; None when it would fail to
    start, not apply a knob, or fail the probe (no rate to speak of)."""
    spec = ev.spec
    start = sim_start(spec, values, ev.profile, ev.render)
    if start is None or start.effective.corruption is not None:
        return None
    eff = start.effective
    ignore_eos = trial_ignore_eos(spec, start.asked)
    ngram = ngram_of(eff)
    # The request mix of rate levels is the study's workload, as at every level: calibrated
    # from the requests of the top concurrency level (their mean lengths and n-gram hits).
    workload = ev.workload(max(spec.load.concurrency), ignore_eos, ngram)
    return OpenLoopPoint(dict(values), eff.perf, workload)


def _run(ev: Evaluator, point: OpenLoopPoint, rate: float, stream: str) -> OpenLoopRun:
    load: LoadSpec = ev.spec.load
    n = load.requests_for_rate(rate)
    arrivals = arrival_schedule(n, rate, arrival=load.arrival, burstiness=load.burstiness,
                                seed=load.seed, stream=stream)
    return simulate_open_loop(ev.profile, point.perf, point.workload, arrivals)


def level_flat(runs: Sequence[OpenLoopRun]) -> dict[str, float]:
    """The flat latency statistics (``ttft_ms.p99`` ...) of one or more pooled levels, with
    the 95 % half-widths the tuner's verdict takes (``tuner.load.slo.term_ci``)."""
    samples: dict[str, list[list[float]]] = {"ttft_ms": [], "tpot_ms": [], "e2el_ms": []}
    for run in runs:
        # In arrival order (the batch-means interval cuts each run into consecutive blocks);
        # TPOT, as the tuner's statistics, over requests with more than one token.
        samples["ttft_ms"].append([x * 1000 for x in run.ttft_s])
        samples["e2el_ms"].append([x * 1000 for x in run.e2el_s])
        samples["tpot_ms"].append([x * 1000 for x, n in zip(run.tpot_s(), run.output_tokens,
                                                            strict=True) if n > 1])
    out: dict[str, float] = {"completed": float(sum(len(r.ttft_s) for r in runs)), "failed": 0.0}
    for name, per_run in samples.items():
        for field in ("mean", "p50", "p90", "p99"):
            found = term_ci(per_run, field)
            if found is None:
                out[f"{name}.{field}"] = math.nan
                continue
            out[f"{name}.{field}"], ci = found
            if ci is not None:
                out[f"{name}.{field}.ci95"] = ci
    return out


def measure_level(ev: Evaluator, point: OpenLoopPoint, rate: float, slo: SloSpec,
                  parts: int = 1) -> SloVerdict:
    """One rate level as a trial measures it: ``parts`` runs with the sweep's seed streams
    for this rate (``measure``, then ``measure-r1``, ... as its repeats), pooled."""
    runs = [_run(ev, point, rate, rate_stream("measure" if k == 0 else f"measure-r{k}", rate))
            for k in range(parts)]
    return level_verdict(level_flat(runs), slo)


def pooled_verdict(ev: Evaluator, point: OpenLoopPoint, rate: float, slo: SloSpec,
                   seeds: int = TRUTH_SEEDS) -> SloVerdict:
    """The SLO over ``seeds`` pooled levels at ``rate`` (common random numbers across rates)."""
    runs = [_run(ev, point, rate, f"truth-{s}") for s in range(seeds)]
    return level_verdict(level_flat(runs), slo)


def true_max_rate(ev: Evaluator, point: OpenLoopPoint, slo: SloSpec, *, low: float, high: float,
                  seeds: int = TRUTH_SEEDS, precision: float = TRUTH_PRECISION) -> float | None:
    """The highest rate in [low, high] where the pooled SLO verdict holds, bisected to
    ``precision`` (relative); ``high`` if it holds there, None if it misses at ``low``.

    Coarse first: bisection with ``COARSE_SEEDS`` seeds to 2 %, then the bracket around it
    (±15 %, widened while its ends do not hold / miss with every seed) refined with all of
    them — the pooled statistic of a few seeds is itself a few percent off (open-loop
    latencies come in correlated bursts), so the reference uses many."""
    def holds(r: float, n: int) -> bool:
        return pooled_verdict(ev, point, r, slo, n).met

    if holds(high, seeds):
        return high
    if not holds(low, seeds):
        return None
    lo, hi = _bisect(lambda r: holds(r, min(COARSE_SEEDS, seeds)), low, high, 0.02)
    lo, hi = max(low, lo / 1.15), min(high, hi * 1.15)
    while lo > low and not holds(lo, seeds):
        lo = max(low, lo / 1.15)
    while hi < high and holds(hi, seeds):
        hi = min(high, hi * 1.15)
    return _bisect(lambda r: holds(r, seeds), lo, hi, precision)[0]


def _bisect(holds: Callable[[float], bool], lo: float, hi: float,
            precision: float) -> tuple[float, float]:
    """Geometric bisection of [lo, hi] (lo holds, hi does not) to ``precision``: the true
    value, on purpose not the tuner's search (``tuner.load.rate_search``), which the
    benchmark measures against it."""
    while hi / lo - 1 > precision:
        mid = math.sqrt(lo * hi)
        if holds(mid):
            lo = mid
        else:
            hi = mid
    return lo, hi
