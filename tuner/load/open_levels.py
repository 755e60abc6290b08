"""The open-loop levels of a sweep, after its concurrency levels: the rate levels
(``load.request_rates``: seeded arrival times), the trace level (``load.trace``: a timed
dataset replayed at its own timestamps, tuner.load.trace_spec) and the ``max_rate@slo``
search's rate levels (:mod:`tuner.load.max_rate`). Each is sent by
:func:`tuner.load.open_loop.run_rate_level` and judged against the SLO like any level.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tuner.load.dataset import TraceRequest
from tuner.load.level_meter import LevelMeter
from tuner.load.load_spec import rate_level_name
from tuner.load.loop_lag import LoopLagMonitor
from tuner.load.max_rate import search_max_rate
from tuner.load.metrics import LevelMetrics, summarize_repeats
from tuner.load.open_loop import rate_level_metrics, run_rate_level
from tuner.load.prometheus import MetricsSnapshot
from tuner.load.rate_search import MaxRateResult, RateSearchSpec
from tuner.load.records import RequestRecord
from tuner.load.results import LevelResult, WarmupSummary, level_key
from tuner.load.server_calls import scrape_metrics
from tuner.load.sweep_context import SweepContext, fitted_plan, server_view
from tuner.load.trace_spec import TRACE_LEVEL, select_trace, trace_schedule
from tuner.load.workload import RequestPlan, arrival_schedule, rate_stream

__all__ = ["open_loop_levels", "rate_levels", "search_rate", "trace_level"]


async def open_loop_levels(
    sweep: SweepContext, results: list[LevelResult], *, stopped: bool, max_rate: RateSearchSpec | None,
    stop_search: Callable[[dict[int | str, dict[str, float]], float], bool] | None,
) -> tuple[list[LevelResult], list[float], list[float], MaxRateResult | None]:
    """Every open-loop level after the concurrency levels ``results``, in order: the rate
    levels, the trace level, the max_rate@slo search's (with ``max_rate``). Returns (levels
    measured, rates skipped for the budget, rates stopped early, the search). ``stopped``:
    early stop ended the sweep, so none is run."""
    measured, skipped, stopped_rates = await rate_levels(sweep, sweep.spec.request_rates, stopped=stopped)
    replayed = None if stopped else await trace_level(sweep)
    if replayed is not None:
        measured.append(replayed)
    searched = None
    if max_rate is not None and not stopped:
        searched, probed = await search_rate(sweep, max_rate, results, measured, stop_search)
        measured.extend(probed)
    return measured, skipped, stopped_rates, searched


async def rate_levels(
    sweep: SweepContext, rates: Sequence[float], *, stopped: bool
) -> tuple[list[LevelResult], list[float], list[float]]:
    """The open-loop rate levels in order: (measured, skipped for budget, stopped early)."""
    rate_results: list[LevelResult] = []
    skipped_rates: list[float] = []
    stopped_rates: list[float] = []
    for rate in rates:
        if stopped:
            # Early stop ended the sweep: the trial is judged already.
            stopped_rates.append(rate)
            continue
        result = await _sweep_rate_level(sweep, rate)
        if result is None:
            skipped_rates.append(rate)
        else:
            rate_results.append(result)
    return rate_results, skipped_rates, stopped_rates


async def search_rate(
    sweep: SweepContext,
    max_rate: RateSearchSpec,
    results: list[LevelResult],
    rate_results: list[LevelResult],
    stop_search: Callable[[dict[int | str, dict[str, float]], float], bool] | None,
) -> tuple[MaxRateResult, list[LevelResult]]:
    """The ``max_rate@slo`` search after the configured levels: (its result, levels probed).

    ``stop_search`` sees the flat metrics of every level so far, the probed ones included.
    """
    def stop(bound: float, probed: list[LevelResult]) -> bool:
        if stop_search is None:
            return False
        flat: dict[int | str, dict[str, float]] = {
            lv.concurrency: lv.metrics.flat() for lv in results}
        flat.update({level_key(lv): lv.metrics.flat() for lv in (*rate_results, *probed)})
        return stop_search(flat, bound)

    return await search_max_rate(
        _SearchLevels(sweep).measure, max_rate,
        hint=max((lv.metrics.request_per_s for lv in results), default=None),
        known=[lv for lv in rate_results if not lv.trace], stop=stop)


async def _rate_plan_for(sw: SweepContext, rate: float, repeat: int) -> tuple[list[RequestPlan], bool]:
    """The measured plan of one repeat of a rate level (own seed stream, see _plan_for)."""
    purpose = "measure" if repeat == 0 else f"measure-r{repeat}"
    return await fitted_plan(sw, sw.spec.requests_for_rate(rate), rate_stream(purpose, rate),
                              rate_level_name(rate))


async def _sweep_rate_level(sw: SweepContext, rate: float) -> LevelResult | None:
    """With its goodput and SLO verdict (``SweepContext.judged``); see ``_rate_level``."""
    return sw.judged(await _rate_level(sw, rate))


@dataclass
class _RateRuns:
    """The runs of one open-loop level so far (its repeats, or the parts of a search level
    extended while its verdict was within noise), with the scrape before the first. A rate
    level has its ``rate``; the trace level its ``selected`` requests (``rate``: their mean
    arrival rate, 0.0 for a single request)."""

    rate: float
    selected: tuple[TraceRequest, ...] | None = None
    before: MetricsSnapshot | None = None
    runs: list[LevelMetrics] = field(default_factory=list)
    records: list[RequestRecord] = field(default_factory=list)
    fitted: bool = True
    deadline_hit: bool = False

    @property
    def name(self) -> str:
        return rate_level_name(self.rate) if self.selected is None else TRACE_LEVEL


async def _rate_level(sw: SweepContext, rate: float) -> LevelResult | None:
    """Fit → scrape → measure open loop (× repeats) → scrape for one rate level; None if
    out of budget before anything was measured. No warm-up of its own: rate levels run
    after the concurrency levels, on a server those already warmed (CUDA graphs, JIT),
    and their prompts come from their own seed streams (no prefix-cache warming)."""
    return await _repeated(sw, _RateRuns(rate))


async def trace_level(sw: SweepContext) -> LevelResult | None:
    """The trace level (``load.trace``): the selected requests of the timed dataset sent at
    their own timestamps, × repeats, judged; None without one, or out of budget before
    anything was measured. No warm-up of its own, like a rate level; its prompts are words
    no earlier level sent (DatasetDraw.replay)."""
    trace = sw.spec.trace
    if trace is None:
        return None
    selected = tuple(select_trace(sw.dataset.trace, trace)) if sw.dataset is not None else ()
    if not selected:
        # Checked when the study is read (tuner.load.trace_spec.trace_problem); a spec made
        # elsewhere (a dry run's shortened window) may still miss.
        sw.notes.append("the trace level was not measured: load.trace's window holds no request of the dataset")
        return None
    span = trace_schedule(selected, trace.time_scale)[-1]
    rate = (len(selected) - 1) / span if span > 0 else 0.0
    level = sw.judged(await _repeated(sw, _RateRuns(rate, selected)))
    if level is None:
        sw.notes.append("the trace level was skipped: the sweep's budget was spent")
    return level


async def _repeated(sw: SweepContext, acc: _RateRuns) -> LevelResult | None:
    spec = sw.spec
    for repeat in range(spec.repeats):
        if not await _rate_run(sw, acc, repeat):
            if not acc.runs:
                return None
            sw.notes.append(f"{acc.name}: {len(acc.runs)} of {spec.repeats} "
                            "repeats measured before the budget ran out")
            break
    return await _rate_result(sw, acc)


async def _run_plan(sw: SweepContext, acc: _RateRuns, repeat: int) -> tuple[list[RequestPlan], list[float], bool]:
    """(plan, due times, fitted) of run ``repeat``: a rate level's own seed streams (repeat 0
    ``measure``, then ``measure-r1`` ...), or the trace's requests at its timestamps."""
    spec = sw.spec
    if acc.selected is not None:
        assert sw.dataset is not None and spec.trace is not None
        return (sw.dataset.replay(acc.selected, run=repeat),
                trace_schedule(acc.selected, spec.trace.time_scale), False)
    plan, fitted = await _rate_plan_for(sw, acc.rate, repeat)
    purpose = "measure" if repeat == 0 else f"measure-r{repeat}"
    schedule = arrival_schedule(
        len(plan), acc.rate, arrival=spec.arrival, burstiness=spec.burstiness,
        seed=spec.seed, stream=rate_stream(purpose, acc.rate),
    )
    return plan, schedule, fitted


async def _rate_run(sw: SweepContext, acc: _RateRuns, repeat: int) -> bool:
    """Measure run ``repeat`` of an open-loop level into ``acc``; False when the budget is
    spent."""
    spec = sw.spec
    plan, schedule, fitted_r = await _run_plan(sw, acc, repeat)
    level_budget = sw.budget()
    if level_budget is None:
        return False
    acc.fitted = acc.fitted and fitted_r
    if acc.before is None:
        acc.before = await scrape_metrics(sw.aux, sw.base_url)
    async with LoopLagMonitor() as lag:
        with LevelMeter(sw.energy, sw.notes, acc.name) as meter:
            run = await run_rate_level(
                sw.base_url, sw.model, plan, schedule,
                api=spec.api, deadline_s=level_budget, request_timeout_s=spec.request_timeout_s,
                max_in_flight=spec.max_in_flight, headers=sw.headers, on_start=meter.started,
            )
    if run.cap_waits:
        held = "the trace's timing was" if acc.selected is not None else "the arrival rate was"
        sw.notes.append(
            f"{acc.name}: {run.cap_waits} requests waited for the in-flight cap "
            f"(max_in_flight={spec.max_in_flight}); {held} not held"
        )
    acc.deadline_hit = acc.deadline_hit or len(run.records) < len(plan)
    acc.runs.append(meter.attach(rate_level_metrics(run, acc.rate, cap=spec.max_in_flight, planned=len(plan),
                                                    client_lag_ms=lag.samples_ms)))
    recs = run.records
    if acc.selected is not None:
        # Each record says where its request sits in the trace, beside when it was due and sent.
        assert sw.dataset is not None
        first_ms = sw.dataset.trace[0].timestamp_ms
        recs = [r.model_copy(update={"trace_offset_s": (acc.selected[r.index].timestamp_ms - first_ms) / 1000.0})
                for r in recs]
    if repeat:
        recs = [r.model_copy(update={"repeat": repeat}) for r in recs]
    acc.records.extend(recs)
    return True


async def _rate_result(sw: SweepContext, acc: _RateRuns) -> LevelResult:
    """The level of every run in ``acc`` (scraped now, so the server-side deltas cover them)."""
    spec = sw.spec
    server, agreement = await server_view(sw, acc.before, acc.records, acc.name)
    return LevelResult(
        concurrency=spec.max_in_flight,
        request_rate=acc.rate if acc.selected is None else None,
        trace=acc.selected is not None,
        prompts_fitted=acc.fitted,
        deadline_hit=acc.deadline_hit,
        warmup=WarmupSummary(requests=0, completed=0, failed=0, failure_reasons={},
                             duration_s=0.0),
        metrics=summarize_repeats(acc.runs).model_copy(update={"noise_floor": spec.noise_floor or 0.0}),
        server_side=server,
        token_agreement=agreement,
        records=list(acc.records),
    )


class _SearchLevels:
    """The max_rate@slo search's levels: ``measure(rate, part)`` runs part ``part`` of the
    level at ``rate`` (part 0 starts it) and returns it with every part so far, judged;
    None when the budget is spent. A search level is one run per part (``load.repeats``
    does not apply: parts are added while the verdict is within noise)."""

    def __init__(self, sw: SweepContext) -> None:
        self.sw = sw
        self.levels: dict[float, _RateRuns] = {}

    async def measure(self, rate: float, part: int) -> LevelResult | None:
        acc = self.levels.setdefault(rate, _RateRuns(rate))
        if part == 0:
            acc = self.levels[rate] = _RateRuns(rate)
        if not await _rate_run(self.sw, acc, part):
            return None         # the budget is spent (the search keeps what it has)
        return self.sw.judged(await _rate_result(self.sw, acc))
