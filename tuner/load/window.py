"""The steady-state window of one level and its throughput (measurement.md §4.2, §4.5).

Tokens are counted by their own timestamps inside the window. Levels sized by request
count (``load.sizing: requests``): [t_warm, t_stop), where t_warm is the later of
``warmup_fraction`` of the issuing span and the completion of the first wave of requests,
and t_stop is the last dispatch; a degenerate window falls back to the whole run (flagged);
the window is cut into 3-5 sub-windows whose max/min is the stability ratio. Levels sized
by time (``load.sizing: steady``): the window the level stopped on
(:mod:`tuner.load.steady`), cut into the study's number of sub-windows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from tuner.load.records import RequestRecord, token_timeline

__all__ = ["STABILITY_MAX_RATIO", "SteadyWindow", "WindowPolicy", "WindowRates", "steady_rates",
           "window_rates"]

# Perf Analyzer's stability rule (measurement.md §4, recommended default 5): throughput in
# 3-5 sub-windows of the steady-state window must agree within max/min <= 1.10.
STABILITY_MAX_RATIO = 1.10
_SUBWINDOW_MIN_S = 5.0


class WindowPolicy(BaseModel):
    """How the steady-state window is chosen and when it is rejected as degenerate."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    warmup_fraction: float = Field(
        default=0.15, ge=0, lt=1, description="t_warm is at least this far into the issuing span."
    )
    min_fraction: float = Field(
        default=0.10,
        ge=0,
        le=1,
        description="A window shorter than this share of the whole run is degenerate.",
    )
    min_token_timestamps: int = Field(
        default=3, ge=1, description="A window with fewer chunk arrivals is degenerate."
    )



def _rate(amount: float, seconds: float | None) -> float:
    return amount / seconds if seconds and seconds > 0 else 0.0



@dataclass(frozen=True, slots=True)
class WindowRates:
    """The throughput fields of a level's metrics (window, fallback, ramp-up, drain)."""

    output_tok_s: float = 0.0
    total_tok_s: float = 0.0
    request_per_s: float = 0.0
    window_start_s: float | None = None
    window_end_s: float | None = None
    window_s: float | None = None
    window_fallback: bool = True
    window_fallback_reason: str | None = "no requests were issued"
    ramp_up_s: float | None = None
    drain_s: float | None = None
    run_duration_s: float | None = None
    run_output_tok_s: float | None = None
    subwindow_s: float | None = None
    subwindow_output_tok_s: list[float] = field(default_factory=list)
    subwindow_total_tok_s: list[float] = field(default_factory=list)
    window_completions: int | None = None
    stability_ratio: float | None = None
    unstable: bool | None = None


def _stability(
    timeline: Sequence[tuple[float, float]], t_warm: float, window_s: float
) -> dict[str, object]:
    """Output tok/s in 3-5 equal sub-windows of [t_warm, t_warm + window_s), and max/min.

    As many sub-windows of at least 5 s as fit, but never fewer than 3 (a short window
    gives short, noisier sub-windows: the ratio then errs towards flagging).
    """
    k = min(5, max(3, int(window_s // _SUBWINDOW_MIN_S)))
    width = window_s / k
    sums = [0.0] * k
    for t, tokens in timeline:
        j = int((t - t_warm) // width)
        if 0 <= j < k:
            sums[j] += tokens
        elif j == k and t < t_warm + window_s:  # float rounding at the right edge
            sums[k - 1] += tokens
    rates = [x / width for x in sums]
    low, high = min(rates), max(rates)
    ratio = high / low if low > 0 else None
    return {
        "subwindow_s": width,
        "subwindow_output_tok_s": rates,
        "stability_ratio": ratio,
        "unstable": ratio is None or ratio > STABILITY_MAX_RATIO,
    }


def _degenerate_reason(
    policy: WindowPolicy,
    concurrency: int,
    first_wave_done: float,
    t_stop: float,
    window_s: float,
    run_s: float,
    chunk_arrivals: int,
) -> str | None:
    """Why the window [t_warm, t_stop) is degenerate (the level falls back to the whole run),
    or None when it is a usable steady state."""
    if window_s <= 0:
        return (
            f"no steady state: the first {concurrency} requests finished at "
            f"{first_wave_done:.3f}s, after the last dispatch at {t_stop:.3f}s"
        )
    if run_s > 0 and window_s < policy.min_fraction * run_s:
        return (
            f"window {window_s:.3f}s is under {policy.min_fraction:.0%} of the "
            f"{run_s:.3f}s run"
        )
    if chunk_arrivals < policy.min_token_timestamps:
        return (
            f"only {chunk_arrivals} chunk arrivals in the window "
            f"(< {policy.min_token_timestamps})"
        )
    return None


def window_rates(
    records: Sequence[RequestRecord],
    ok: Sequence[RequestRecord],
    concurrency: int,
    policy: WindowPolicy,
    total_out: int,
    total_prompt: int,
) -> WindowRates:
    """Throughput fields of :class:`LevelMetrics` (window, fallback, ramp-up, drain)."""
    if not records:
        return WindowRates()

    by_dispatch = sorted(records, key=lambda r: (r.dispatch_s, r.index))
    first = by_dispatch[0].dispatch_s
    t_stop = by_dispatch[-1].dispatch_s
    run_end = max(r.done_s for r in records)
    run_s = run_end - first
    # The first C requests start together and prefill together; until they have all
    # finished the batch has not reached its steady mix of prefill and decode.
    first_wave_done = max(r.done_s for r in by_dispatch[:concurrency])
    t_warm = max(first + policy.warmup_fraction * (t_stop - first), first_wave_done)
    window_s = t_stop - t_warm

    # Half-open [t_warm, t_stop): adjacent windows tile without counting a token twice.
    timeline = [pt for r in ok for pt in token_timeline(r)]
    in_window = [k for t, k in timeline if t_warm <= t < t_stop]

    reason = _degenerate_reason(policy, concurrency, first_wave_done, t_stop, window_s, run_s,
                                len(in_window))
    ramp_up_s = t_warm - first
    drain_s = run_end - t_stop
    run_output_tok_s = _rate(total_out, run_s)
    if reason is not None:
        return WindowRates(
            output_tok_s=run_output_tok_s,
            total_tok_s=_rate(total_out + total_prompt, run_s),
            request_per_s=_rate(len(ok), run_s),
            window_start_s=first,
            window_end_s=run_end,
            window_s=run_s,
            window_fallback=True,
            window_fallback_reason=reason,
            ramp_up_s=ramp_up_s,
            drain_s=drain_s,
            run_duration_s=run_s,
            run_output_tok_s=run_output_tok_s,
        )

    out_tokens = math.fsum(in_window)
    # Prompt tokens are processed by the time the first token appears, so that is the
    # timestamp they are counted at.
    prompt_tokens = sum(
        r.prompt_tokens or 0
        for r in ok
        if r.chunk_times_s and t_warm <= r.chunk_times_s[0] < t_stop
    )
    finished = sum(1 for r in ok if (e := r.end_s) is not None and t_warm <= e < t_stop)
    return WindowRates(
        **_stability(timeline, t_warm, window_s),  # type: ignore[arg-type]
        output_tok_s=out_tokens / window_s,
        total_tok_s=(out_tokens + prompt_tokens) / window_s,
        request_per_s=finished / window_s,
        window_start_s=t_warm,
        window_end_s=t_stop,
        window_s=window_s,
        window_fallback=False,
        window_fallback_reason=None,
        ramp_up_s=ramp_up_s,
        drain_s=drain_s,
        run_duration_s=run_s,
        run_output_tok_s=run_output_tok_s,
    )


@dataclass(frozen=True, slots=True)
class SteadyWindow:
    """The window a level sized by time stopped on (:class:`tuner.load.steady.SteadyCheck`)
    and its stability rule."""

    start_s: float
    end_s: float
    subwindows: int
    max_ratio: float
    stop_reason: str        # "stable" | "max_level_seconds" | "failures"


def _sub_rates(points: Sequence[tuple[float, float]], start: float, end: float,
               n: int) -> list[float]:
    width = (end - start) / n
    sums = [0.0] * n
    for t, k in points:
        if start <= t < end:
            sums[min(n - 1, int((t - start) / width))] += k
    return [x / width for x in sums]


def steady_rates(records: Sequence[RequestRecord], sw: SteadyWindow, total_out: int,
                 measured_ok: Sequence[RequestRecord]) -> WindowRates:
    """Throughput fields of a level sized by time: every token inside [start, end), of
    whichever request carried it (the concurrency was C throughout), in ``subwindows``
    equal sub-windows; unstable when the level stopped without the rule holding."""
    ok = [r for r in records if r.ok]
    start, end, n = sw.start_s, sw.end_s, sw.subwindows
    window_s = end - start
    first = min(r.dispatch_s for r in records)
    pending = [r.done_s for r in records if r.dispatch_s < end]
    run_start = min((r.dispatch_s for r in measured_ok), default=start)
    run_end = max((r.done_s for r in measured_ok), default=end)
    run_s = run_end - run_start
    timeline = [pt for r in ok for pt in token_timeline(r)]
    totals = [(r.chunk_times_s[0], float(r.prompt_tokens or 0)) for r in ok if r.chunk_times_s]
    rates = _sub_rates(timeline, start, end, n)
    total_rates = [a + b for a, b in zip(rates, _sub_rates(totals, start, end, n), strict=True)]
    low = min(rates)
    ratio = max(rates) / low if low > 0 else None
    finished = sum(1 for r in ok if (e := r.end_s) is not None and start <= e < end)
    return WindowRates(
        output_tok_s=math.fsum(rates) / n,
        total_tok_s=math.fsum(total_rates) / n,
        request_per_s=_rate(finished, window_s),
        window_start_s=start,
        window_end_s=end,
        window_s=window_s,
        window_fallback=False,
        window_fallback_reason=None,
        ramp_up_s=start - first,
        drain_s=max(pending, default=end) - end,
        run_duration_s=run_s,
        run_output_tok_s=_rate(total_out, run_s),
        subwindow_s=window_s / n,
        subwindow_output_tok_s=rates,
        subwindow_total_tok_s=total_rates,
        window_completions=finished,
        stability_ratio=ratio,
        unstable=ratio is None or ratio > sw.max_ratio or sw.stop_reason != "stable",
    )
