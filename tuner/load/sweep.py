"""A sweep: every level of a study's load section against one server.

Per concurrency level: prompt fitting through ``/tokenize`` → warm-up with different
prompts → ``/metrics`` scrape → measured level (× ``repeats``, fresh prompts each time) →
scrape, so the server-side deltas cover the measured requests only. Open-loop levels
(:mod:`tuner.load.open_levels`) follow the concurrency levels: the rate levels
(``LoadSpec.request_rates``), the trace level (``LoadSpec.trace``), then the ``max_rate@slo``
search's rate levels (:mod:`tuner.load.max_rate`). With an SLO every level carries its
goodput and verdict (:mod:`tuner.load.goodput`).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import httpx

from tuner.adapters.http_client import server_client
from tuner.energy.source import EnergySource
from tuner.load.closed_loop import run_level
from tuner.load.dataset_file import open_draw
from tuner.load.efficiency import Holding
from tuner.load.level_meter import LevelMeter
from tuner.load.load_spec import LoadSpec
from tuner.load.loop_lag import LoopLagMonitor
from tuner.load.metrics import LevelMetrics, compute_level_metrics, summarize_repeats
from tuner.load.open_levels import open_loop_levels
from tuner.load.rate_search import RateSearchSpec
from tuner.load.records import RequestRecord
from tuner.load.request import AUX_TIMEOUT_S, LevelContext
from tuner.load.results import (
    LevelResult,
    SweepResult,
    WarmupSummary,
    closing_notes,
    count_notes,
)
from tuner.load.server_calls import (
    calibrate_lengths,
    fetch_token_count,
    scrape_metrics,
)
from tuner.load.slo import SloSpec
from tuner.load.steady import SteadyRule
from tuner.load.steady_loop import SteadyRun, run_steady_level
from tuner.load.streams import LevelHalted
from tuner.load.sweep_context import SweepContext, fitted_plan, server_view
from tuner.load.warmup import warm_up
from tuner.load.window import SteadyWindow
from tuner.load.workload import (
    LengthModel,
    PromptStream,
    RequestPlan,
    level_stream,
)

__all__ = ["run_sweep"]

logger = logging.getLogger(__name__)


async def run_sweep(
    base_url: str,
    model: str,
    load_spec: LoadSpec,
    *,
    ignore_eos: bool,
    deadline_s: float | None = None,
    headers: dict[str, str] | None = None,
    levels: Sequence[int] | None = None,
    after_level: Callable[[dict[int | str, dict[str, float]], list[int]], bool] | None = None,
    inside_level: Callable[[int, dict[str, Any], list[int]], bool] | None = None,
    slo: SloSpec | None = None,
    max_rate: RateSearchSpec | None = None,
    stop_search: Callable[[dict[int | str, dict[str, float]], float], bool] | None = None,
    holding: Holding | None = None,
    energy: EnergySource | None = None,
) -> SweepResult:
    """Warm up and measure every concurrency level of ``load_spec``.

    Args:
        base_url: server root (see :func:`tuner.load.closed_loop.run_level`).
        model: served model name.
        load_spec: the study's load section.
        ignore_eos: resolved value (``WorkloadSpec.resolve_ignore_eos``).
        deadline_s: budget for the whole sweep in seconds from the call; levels that
            would start after it are skipped and listed. None: only ``max_level_seconds``.
        headers: extra HTTP headers for every call.
        levels: the order to measure ``load_spec.concurrency`` in (default: as configured).
        after_level: called after each measured level with the flat metrics of every level
            measured so far (in measuring order) and the levels still to run; True stops
            the sweep there (tuner.study.sweep_guard.SweepGuard.after_level). The levels left
            out are listed in ``stopped_levels``.
        inside_level: called during a level's measured run (``repeats: 1``, one client
            process, levels left after it) with the level, its steady-state window so far
            and the levels after it; True ends the level there and stops the sweep
            (tuner.study.sweep_guard.SweepGuard.inside_level). The halted level is not
            measured: it is listed first in ``stopped_levels``.
        holding: what the server holds and costs: every level then carries its per-GPU and
            per-dollar figures (tuner.load.efficiency). None: neither.
        energy: a readable energy counter (tuner.energy): every closed-loop level then carries
            its steady window's joules per token (tuner.load.level_meter). None: not measured.
    """
    t_start = time.monotonic()
    started_at = datetime.now(UTC).isoformat()
    notes: list[str] = []
    order = list(load_spec.concurrency) if levels is None else list(levels)
    if sorted(order) != sorted(load_spec.concurrency):
        raise ValueError(f"levels {order} are not a reordering of {load_spec.concurrency}")
    budget = _budget_clock(load_spec, deadline_s, t_start)

    async with server_client(timeout=AUX_TIMEOUT_S, headers=headers) as aux:
        draw = await open_draw(aux, base_url, model, load_spec, ignore_eos=ignore_eos, notes=notes)
        can_fit, lengths = (False, None) if draw is not None else await _prompt_lengths(
            aux, base_url, model, load_spec, notes)
        sweep = SweepContext(
            aux, base_url, model, load_spec, ignore_eos, can_fit, budget, headers, notes,
            lengths, slo, draw, holding, energy,
        )
        results, skipped, stopped = await _concurrency_levels(
            sweep, order, after_level, inside_level)
        rate_results, skipped_rates, stopped_rates, searched = await open_loop_levels(
            sweep, results, stopped=bool(stopped), max_rate=max_rate, stop_search=stop_search)
    notes += closing_notes(draw.note() if draw is not None else None, skipped, skipped_rates, deadline_s)
    return SweepResult(
        model=model,
        base_url=base_url,
        load=load_spec,
        ignore_eos=ignore_eos,
        started_at=started_at,
        duration_s=time.monotonic() - t_start,
        levels=results,
        skipped_levels=skipped,
        stopped_levels=stopped,
        warnings=[*notes, *count_notes([*results, *rate_results])],
        rate_levels=rate_results,
        skipped_rates=skipped_rates,
        stopped_rates=stopped_rates,
        max_rate=searched,
    )


def _budget_clock(
    load_spec: LoadSpec, deadline_s: float | None, t_start: float
) -> Callable[[], float | None]:
    """The sweep's budget as a clock: ``budget()`` is the seconds a level may issue for now."""

    def budget() -> float | None:
        """Seconds a level may issue for now; None once the sweep budget is spent."""
        if deadline_s is None:
            return load_spec.max_level_seconds
        remaining = deadline_s - (time.monotonic() - t_start)
        return min(load_spec.max_level_seconds, remaining) if remaining > 0 else None

    return budget


async def _prompt_lengths(aux: httpx.AsyncClient, base_url: str, model: str, spec: LoadSpec,
                          notes: list[str]) -> tuple[bool, LengthModel | None]:
    """Whether /tokenize can fit prompts, and (levels sized by time) the calibrated lengths."""
    if not spec.fit_prompt_tokens:
        return False, None
    if await fetch_token_count(aux, base_url, model, "hello") is None:
        notes.append("/tokenize unavailable: prompt lengths are ~1.3 tokens/word estimates")
        return False, None
    if spec.sizing != "steady":
        return True, None
    lengths = await calibrate_lengths(aux, base_url, model, spec.workload, seed=spec.seed,
                                      api=spec.api)
    if lengths is None:
        notes.append("/tokenize failed while calibrating: prompt lengths are estimates")
    return True, lengths


async def _concurrency_levels(
    sweep: SweepContext,
    order: list[int],
    after_level: Callable[[dict[int | str, dict[str, float]], list[int]], bool] | None,
    inside_level: Callable[[int, dict[str, Any], list[int]], bool] | None,
) -> tuple[list[LevelResult], list[int], list[int]]:
    """The closed-loop levels in ``order``: (measured, skipped for budget, stopped early)."""
    spec = sweep.spec
    results: list[LevelResult] = []
    skipped: list[int] = []
    for i, c in enumerate(order):
        later = [x for x in order[i + 1:] if x not in skipped]
        check = None
        # Every level, the last one too (its drain is what early stop rule 4 can skip there).
        if (inside_level is not None and spec.repeats == 1
                and spec.client_processes == 1):
            def check(view: dict[str, Any], c: int = c, later: list[int] = later) -> bool:
                return inside_level(c, view, later)
        try:
            result = sweep.judged(await _sweep_level(sweep, c, check))
        except LevelHalted:
            return results, skipped, [c, *later]
        if result is None:
            skipped.append(c)
            continue
        results.append(result)
        remaining = [x for x in order[i + 1:] if x not in skipped]
        if after_level is not None and remaining and after_level(
                {lv.concurrency: lv.metrics.flat() for lv in results}, remaining):
            return results, skipped, remaining
    return results, skipped, []


async def _plan_for(sw: SweepContext, c: int, repeat: int) -> tuple[list[RequestPlan], bool]:
    """The measured plan of one repeat of a level, fitted to exact lengths when possible.

    Every repeat draws fresh prompts of the same shape (its own seed stream): re-sending
    the same prompts would be served from the prefix cache and inflate later repeats
    (measurement.md §4, vLLM sweep notes).
    """
    purpose = "measure" if repeat == 0 else f"measure-r{repeat}"
    return await fitted_plan(sw, sw.spec.requests_for(c), level_stream(purpose, c), f"c={c}")


async def _sweep_level(
    sw: SweepContext, c: int, checkpoint: Callable[[dict[str, Any]], bool] | None = None
) -> LevelResult | None:
    """Fit → warm up → scrape → measure (× repeats) → scrape for one level; None if out
    of budget before anything was measured. ``checkpoint``: see :func:`run_level` (raises
    :class:`LevelHalted` through)."""
    aux, base_url, model, spec = sw.aux, sw.base_url, sw.model, sw.spec
    ignore_eos, budget, headers = sw.ignore_eos, sw.budget, sw.headers
    if budget() is None:
        return None
    if spec.sizing == "steady":
        return await _sweep_steady_level(sw, c, checkpoint)
    plan, fitted = await _plan_for(sw, c, 0)

    warm_budget = budget()
    if warm_budget is None:
        return None
    warmup = await warm_up(base_url, model, spec, c, ignore_eos, warm_budget, headers, sw.dataset)
    before = None
    records: list[RequestRecord] = []
    runs: list[LevelMetrics] = []
    deadline_hit = False
    for repeat in range(spec.repeats):
        if repeat:
            plan, fitted_r = await _plan_for(sw, c, repeat)
            fitted = fitted and fitted_r
        level_budget = budget()
        if level_budget is None:
            if not runs:
                return None
            sw.notes.append(
                f"c={c}: {len(runs)} of {spec.repeats} repeats measured before the budget ran out"
            )
            break
        if before is None:
            before = await scrape_metrics(aux, base_url)
        lag = LoopLagMonitor()
        with LevelMeter(sw.energy, sw.notes, f"c={c}") as meter:
            run = await run_level(
                base_url, model, plan,
                concurrency=c, api=spec.api, deadline_s=level_budget,
                request_timeout_s=spec.request_timeout_s, headers=headers,
                processes=spec.client_processes, checkpoint=checkpoint, lag=lag, on_start=meter.started,
            )
        deadline_hit = deadline_hit or len(run) < len(plan)
        runs.append(meter.attach(compute_level_metrics(run, concurrency=c, planned=len(plan),
                                                       client_lag_ms=lag.samples_ms)))
        if repeat:
            run = [r.model_copy(update={"repeat": repeat}) for r in run]
        records.extend(run)
    server, agreement = await server_view(sw, before, records, f"c={c}")
    # Instability is reported per level (metrics.unstable, stability_ratio), not as a sweep
    # warning: short levels are often flagged, and that is information, not degradation.
    metrics = summarize_repeats(runs).model_copy(update={"noise_floor": spec.noise_floor or 0.0})
    return LevelResult(
        concurrency=c,
        prompts_fitted=fitted,
        deadline_hit=deadline_hit,
        warmup=warmup,
        metrics=metrics,
        server_side=server,
        token_agreement=agreement,
        records=records,
    )


async def _sweep_steady_level(
    sw: SweepContext, c: int, checkpoint: Callable[[dict[str, Any]], bool] | None
) -> LevelResult | None:
    """Scrape → steady level (× repeats, fresh prompts each) → scrape. The warm-up is the
    level's own first stretch (tuner.load.steady), so the server-side deltas include it."""
    spec = sw.spec
    before = await scrape_metrics(sw.aux, sw.base_url)
    records: list[RequestRecord] = []
    runs: list[LevelMetrics] = []
    warm: list[RequestRecord] = []
    warm_s = 0.0
    stopped_unsteady = False
    for repeat in range(spec.repeats):
        level_budget = sw.budget()
        if level_budget is None:
            if not runs:
                return None
            sw.notes.append(
                f"c={c}: {len(runs)} of {spec.repeats} repeats measured before the budget ran out")
            break
        suffix = "" if repeat == 0 else f"-r{repeat}"
        streams: list[Any] = [sw.dataset.stream() if sw.dataset is not None else PromptStream(
            spec.workload, seed=spec.seed, ignore_eos=sw.ignore_eos, stream=level_stream(purpose + suffix, c),
            lengths=sw.lengths) for purpose in ("warmup", "measure")]
        rule = SteadyRule(spec.min_window_s, spec.min_requests, spec.stability_subwindows,
                          spec.stability_max_ratio, max_level_s=level_budget)
        lv = LevelContext.create(sw.base_url, sw.model, spec.api, concurrency=c,
                                 request_timeout_s=spec.request_timeout_s, headers=sw.headers,
                                 continuous_usage=True)
        async with LoopLagMonitor() as lag:
            with LevelMeter(sw.energy, sw.notes, f"c={c}") as meter:
                run = await run_steady_level(lv, streams[0], streams[1], rule, checkpoint)
        runs.append(meter.attach(steady_metrics(run, c, spec.stability_subwindows, spec.stability_max_ratio,
                                                client_lag_ms=lag.samples_ms), lv.t0))
        stopped_unsteady = stopped_unsteady or run.stop_reason != "stable"
        recs = run.records if not repeat else [
            r.model_copy(update={"repeat": repeat}) for r in run.records]
        records.extend(recs)
        warm.extend(r for r in recs if r.phase == "warmup")
        warm_s += runs[-1].ramp_up_s or 0.0
    server, agreement = await server_view(sw, before, records, f"c={c}")
    failed = [r for r in warm if not r.ok]
    return LevelResult(
        concurrency=c,
        prompts_fitted=sw.lengths is not None,
        deadline_hit=stopped_unsteady,
        warmup=WarmupSummary(
            requests=len(warm), completed=len(warm) - len(failed), failed=len(failed),
            failure_reasons=dict(Counter(r.error.type if r.error else "unknown" for r in failed)),
            duration_s=warm_s),
        metrics=summarize_repeats(runs).model_copy(update={"noise_floor": spec.noise_floor or 0.0}),
        server_side=server,
        token_agreement=agreement,
        records=records,
    )


def steady_metrics(run: SteadyRun, c: int, subwindows: int, max_ratio: float,
                   client_lag_ms: Sequence[float] | None = None) -> LevelMetrics:
    """The metrics of one steady level run (its window, else the whole run, flagged)."""
    check = run.check
    if check is None:
        # The first wave never finished in time: no window; the whole-run figure, unstable.
        m = compute_level_metrics(run.records, concurrency=c, client_lag_ms=client_lag_ms)
        return m.model_copy(update={"sizing": "steady", "stop_reason": run.stop_reason,
                                    "unstable": True})
    window = SteadyWindow(check.start_s, check.end_s, subwindows, max_ratio, run.stop_reason)
    return compute_level_metrics(run.records, concurrency=c, steady=window,
                                 client_lag_ms=client_lag_ms)


