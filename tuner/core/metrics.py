"""Per-request records → per-level metrics, following vLLM's definitions.

Definitions (measurement.md §1, vLLM ``benchmarks/serve.py::calculate_metrics``):

* **TTFT** = first chunk with non-empty ``choices`` − dispatch (the usage-only chunk does
  not count; the first chunk may have empty text, e.g. the chat role chunk).
* **E2EL** = last such chunk − dispatch (usage chunk and ``[DONE]`` excluded).
* **TPOT** = (E2EL − TTFT)/(output_tokens − 1) per request; requests with ≤ 1 output
  token are dropped from it.
* **ITL** = gaps between consecutive content chunks, pooled over requests (chunk-weighted).
  With speculative decoding one chunk carries several tokens, so compare speculative and
  plain configs on TPOT, E2EL and throughput, never on ITL.
* Failed requests are excluded from every latency statistic and counted in ``failed``.

Throughput deliberately departs from vLLM's Σtokens/whole-run duration, which includes
the synchronized first prefill wave and the drain tail (§4.2): tokens are counted by their
own timestamps inside a steady-state window [t_warm, t_stop), where t_warm is the later of
15 % of the issuing span and the completion of the first C requests, and t_stop is the last
dispatch. When that window is degenerate, the whole-run figure is used and flagged.

Times in records are seconds relative to the level start, from a monotonic clock;
statistics are reported in milliseconds (units are in the names).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "EXTRA_FLAT_KEYS",
    "FLAT_KEYS",
    "P99_MIN_SAMPLES",
    "STABILITY_MAX_RATIO",
    "ClassMetrics",
    "LevelMetrics",
    "RepeatSummary",
    "RequestError",
    "RequestRecord",
    "Stat",
    "WindowPolicy",
    "compute_level_metrics",
    "percentile",
    "summarize_repeats",
    "token_timeline",
]

# aiperf's rule of thumb (measurement.md §4, "Sample-size guidance" and recommended default
# 3): p99 needs >= 1000 samples. Below that p99 is essentially the maximum of a few
# requests, so it is still reported but flagged; objectives should prefer p90 there.
P99_MIN_SAMPLES = 1000

_STAT_FIELDS = ("mean", "p50", "p90", "p99")
_LATENCIES = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")
FLAT_KEYS: tuple[str, ...] = (
    "output_tok_s",
    "total_tok_s",
    "request_per_s",
    "output_tok_s_per_user",
    *(f"{m}.{s}" for m in _LATENCIES for s in _STAT_FIELDS),
    "failed",
    "completed",
)
"""Keys of :meth:`LevelMetrics.flat`; study-file objectives name these."""

EXTRA_FLAT_KEYS: tuple[str, ...] = (
    "run_output_tok_s",
    "stability_ratio",
    "repeats",
    "output_tok_s_cv",
)
"""Keys :meth:`LevelMetrics.flat` adds after :data:`FLAT_KEYS` (added later; NaN = none)."""

# Perf Analyzer's stability rule (measurement.md §4, recommended default 5): throughput in
# 3-5 sub-windows of the steady-state window must agree within max/min <= 1.10.
STABILITY_MAX_RATIO = 1.10
_SUBWINDOW_MIN_S = 5.0


class RequestError(BaseModel):
    """Why a request failed. ``type`` is a fixed vocabulary set by the load generator:
    http_status, server_error, malformed_stream, incomplete_stream, no_content, timeout,
    connect_error, connection_error, client_exception."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: str
    message: str


class RequestRecord(BaseModel):
    """Raw timings of one request. JSON-lines friendly (``model_dump_json()`` per line).

    All ``*_s`` times are seconds since the level started (``time.monotonic`` based: one
    system-wide clock, so records of sharded client processes share the time base).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    index: int = Field(description="Index in the level's request plan.")
    class_name: str = Field(description="Workload class of the request.")
    concurrency: int = Field(ge=1, description="Concurrency level the request ran in.")
    scheduled_s: float = Field(
        description=(
            "When the request was due: the moment a closed-loop slot freed up (semaphore "
            "acquired), or at an open-loop rate level its scheduled arrival time. "
            "scheduled→dispatch is client-side event-loop lag (open loop: plus any wait for "
            "the in-flight cap)."
        )
    )
    dispatch_s: float = Field(description="Taken just before the POST (vLLM's start_time).")
    chunk_times_s: list[float] = Field(
        default_factory=list,
        description="Arrival of every chunk with non-empty choices, in order.",
    )
    chunk_tokens: list[int] | None = Field(
        default=None,
        description=(
            "Exact tokens per content chunk, from per-chunk cumulative usage "
            "(continuous_usage_stats) when the server sent it; None otherwise."
        ),
    )
    chunk_chars: list[int] = Field(
        default_factory=list,
        description="Characters of generated text per content chunk (fallback weighting).",
    )
    done_s: float = Field(description="When the request finished: stream end, error or timeout.")
    repeat: int = Field(
        default=0, ge=0, description="Which repeat of the level (LoadSpec.repeats) it ran in."
    )
    prompt_tokens: int | None = Field(default=None, description="usage.prompt_tokens.")
    output_tokens: int | None = Field(default=None, description="usage.completion_tokens.")
    ok: bool
    error: RequestError | None = None
    finish_reason: str | None = None
    http_status: int | None = None

    @property
    def client_queue_s(self) -> float:
        return self.dispatch_s - self.scheduled_s

    @property
    def ttft_s(self) -> float | None:
        return self.chunk_times_s[0] - self.dispatch_s if self.chunk_times_s else None

    @property
    def end_s(self) -> float | None:
        """Arrival of the last content chunk."""
        return self.chunk_times_s[-1] if self.chunk_times_s else None

    @property
    def e2el_s(self) -> float | None:
        return self.chunk_times_s[-1] - self.dispatch_s if self.chunk_times_s else None

    @property
    def tokens_estimated(self) -> bool:
        """True when the server sent no usage and tokens are estimated from chunks."""
        return self.output_tokens is None

    def n_output_tokens(self) -> int:
        """usage.completion_tokens, else the number of chunks that carried text."""
        if self.output_tokens is not None:
            return self.output_tokens
        return sum(1 for c in self.chunk_chars if c > 0) or len(self.chunk_times_s)


def token_timeline(record: RequestRecord) -> list[tuple[float, float]]:
    """(arrival time, tokens) per content chunk, summing to the request's output tokens.

    Exact per-chunk counts are used when they add up to the total. Otherwise the total
    (from the final usage chunk) is spread in proportion to each chunk's text length: a
    speculative chunk carrying three tokens carries about three tokens of text, so
    counting one token per chunk would undercount exactly the configs under test. Chunks
    without text (the chat role chunk) get none; with no text at all, spread evenly.
    """
    times = record.chunk_times_s
    if not times:
        return []
    total = record.n_output_tokens()
    exact = record.chunk_tokens
    if exact is not None and len(exact) == len(times) and sum(exact) == total:
        return [(t, float(k)) for t, k in zip(times, exact, strict=True)]
    chars = record.chunk_chars
    weight = sum(chars) if len(chars) == len(times) else 0
    if weight > 0:
        return [(t, total * c / weight) for t, c in zip(times, chars, strict=True)]
    return [(t, total / len(times)) for t in times]


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


class ClassMetrics(BaseModel):
    """Latency of one workload class within a level (speculation helps classes unequally)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    completed: int
    ttft_ms: Stat
    tpot_ms: Stat
    e2el_ms: Stat
    output_tok_s_per_user: float | None


class RepeatSummary(BaseModel):
    """Median and spread of one level's flat metrics over its repeats (aiperf multi-run)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    n: int = Field(ge=1, description="Repeats measured.")
    representative: int = Field(
        description="Repeat whose detailed metrics are shown (median output_tok_s)."
    )
    median: dict[str, float | None]
    min: dict[str, float | None]
    max: dict[str, float | None]
    cv: dict[str, float | None] = Field(
        description="Sample standard deviation / mean (None below 2 values or at mean 0)."
    )
    per_repeat: list[dict[str, float | None]] = Field(description="flat() of each repeat.")


class LevelMetrics(BaseModel):
    """Everything measured at one concurrency level."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    concurrency: int
    planned: int | None = Field(description="Requests planned; more than issued if cut short.")
    issued: int
    completed: int
    failed: int
    failure_reasons: dict[str, int] = Field(description="Failed requests per error type.")
    failure_examples: dict[str, str] = Field(description="First message seen per error type.")
    tokens_estimated: int = Field(description="Completed requests without usage (estimated).")

    ttft_ms: Stat
    tpot_ms: Stat
    itl_ms: Stat
    e2el_ms: Stat
    client_queue_ms: Stat = Field(
        description="dispatch − scheduled: client event-loop lag (open loop: + cap wait).")

    output_tok_s: float
    total_tok_s: float
    request_per_s: float
    output_tok_s_per_user: float | None = Field(
        description="Mean over completed requests of output_tokens / E2EL."
    )

    window_start_s: float | None
    window_end_s: float | None
    window_s: float | None = Field(description="Length of the window the rates were taken on.")
    window_fallback: bool
    window_fallback_reason: str | None
    ramp_up_s: float | None = Field(description="First dispatch → t_warm.")
    drain_s: float | None = Field(description="t_stop (last dispatch) → last request finished.")
    run_duration_s: float | None = Field(description="vLLM's dur_s: first dispatch → last done.")
    run_output_tok_s: float | None = Field(description="vLLM-style Σoutput / run_duration_s.")
    subwindow_s: float | None = Field(
        default=None, description="Length of each stability sub-window (window_s / 3..5)."
    )
    subwindow_output_tok_s: list[float] = Field(
        default_factory=list,
        description="Output tok/s in consecutive sub-windows of the steady-state window.",
    )
    stability_ratio: float | None = Field(
        default=None,
        description="max/min of subwindow_output_tok_s; None when not assessable.",
    )
    unstable: bool | None = Field(
        default=None,
        description=(
            f"stability_ratio > {STABILITY_MAX_RATIO} (or a sub-window without tokens): "
            "throughput drifted within the window. None: no steady-state window to judge."
        ),
    )
    repeats: RepeatSummary | None = Field(
        default=None,
        description=(
            "Set when the level ran several times (LoadSpec.repeats): the detailed fields are "
            "the median repeat's, flat() reports per-key medians across repeats."
        ),
    )
    request_rate: float | None = Field(
        default=None,
        description=(
            "Open-loop levels only: the target arrival rate (requests/s). None for "
            "closed-loop levels. client_queue_ms is then actual send − scheduled arrival."
        ),
    )
    cap_waits: int | None = Field(
        default=None,
        description=(
            "Open-loop levels only: requests that had to wait for the in-flight safety cap "
            "(LoadSpec.max_in_flight); > 0 means the arrival rate was not held."
        ),
    )
    peak_in_flight: int | None = Field(
        default=None, description="Open-loop levels only: most requests in flight at once."
    )
    total_output_tokens: int = Field(description="Σ output tokens of completed requests.")
    total_prompt_tokens: int = Field(description="Σ prompt tokens of completed requests.")
    by_class: dict[str, ClassMetrics]

    def flat(self) -> dict[str, float]:
        """Scalar metrics under the stable :data:`FLAT_KEYS` then :data:`EXTRA_FLAT_KEYS`;
        missing values are NaN. With repeats, each value is the median across repeats."""
        out = self.flat_single()
        rs = self.repeats
        if rs is not None:
            for key in (*FLAT_KEYS, "run_output_tok_s", "stability_ratio"):
                if key in rs.median:
                    out[key] = _nan(rs.median[key])
            out["repeats"] = float(rs.n)
            out["output_tok_s_cv"] = _nan(rs.cv.get("output_tok_s"))
        return out

    def flat_single(self) -> dict[str, float]:
        """:meth:`flat` of this one run, ignoring :attr:`repeats`."""
        out: dict[str, float] = {
            "output_tok_s": self.output_tok_s,
            "total_tok_s": self.total_tok_s,
            "request_per_s": self.request_per_s,
            "output_tok_s_per_user": _nan(self.output_tok_s_per_user),
        }
        for name in _LATENCIES:
            stat: Stat = getattr(self, name)
            for field in _STAT_FIELDS:
                out[f"{name}.{field}"] = _nan(getattr(stat, field))
        out["failed"] = float(self.failed)
        out["completed"] = float(self.completed)
        out["run_output_tok_s"] = _nan(self.run_output_tok_s)
        out["stability_ratio"] = _nan(self.stability_ratio)
        out["repeats"] = 1.0
        out["output_tok_s_cv"] = math.nan
        return out


def _nan(x: float | None) -> float:
    return math.nan if x is None else float(x)


def _rate(amount: float, seconds: float | None) -> float:
    return amount / seconds if seconds and seconds > 0 else 0.0


def _per_user(records: Sequence[RequestRecord]) -> float | None:
    speeds = [
        r.n_output_tokens() / e2el for r in records if (e2el := r.e2el_s) is not None and e2el > 0
    ]
    return math.fsum(speeds) / len(speeds) if speeds else None


def _tpot_ms(records: Iterable[RequestRecord]) -> list[float]:
    out = []
    for r in records:
        n = r.n_output_tokens()
        if n > 1 and len(r.chunk_times_s) >= 1:
            out.append((r.chunk_times_s[-1] - r.chunk_times_s[0]) / (n - 1) * 1000)
    return out


def compute_level_metrics(
    records: Sequence[RequestRecord],
    *,
    concurrency: int,
    window: WindowPolicy | None = None,
    planned: int | None = None,
    first_wave: int | None = None,
) -> LevelMetrics:
    """Metrics of one level from its request records (see module docstring).

    Args:
        records: every issued request of the level, failed ones included.
        concurrency: the level's closed-loop concurrency C (defines the first wave).
        window: steady-state window policy; defaults to :class:`WindowPolicy`.
        planned: requests the plan held, to show when a deadline cut the level short.
        first_wave: requests whose completion opens the steady-state window (default
            ``concurrency``; open-loop levels pass 1, having no synchronized first wave).
    """
    policy = window or WindowPolicy()
    ok = [r for r in records if r.ok]
    bad = [r for r in records if not r.ok]
    reasons = Counter(r.error.type if r.error else "unknown" for r in bad)
    examples: dict[str, str] = {}
    for r in bad:
        kind = r.error.type if r.error else "unknown"
        examples.setdefault(kind, r.error.message if r.error else "")

    itl: list[float] = []
    for r in ok:
        ts = r.chunk_times_s
        itl.extend((b - a) * 1000 for a, b in zip(ts, ts[1:]))

    total_out = sum(r.n_output_tokens() for r in ok)
    total_prompt = sum(r.prompt_tokens or 0 for r in ok)
    wave = concurrency if first_wave is None else max(1, first_wave)
    rates = _window_rates(records, ok, wave, policy, total_out, total_prompt)

    by_class: dict[str, ClassMetrics] = {}
    for name in sorted({r.class_name for r in records}):
        mine = [r for r in ok if r.class_name == name]
        by_class[name] = ClassMetrics(
            completed=len(mine),
            ttft_ms=Stat.of(r.ttft_s * 1000 for r in mine if r.ttft_s is not None),
            tpot_ms=Stat.of(_tpot_ms(mine)),
            e2el_ms=Stat.of(r.e2el_s * 1000 for r in mine if r.e2el_s is not None),
            output_tok_s_per_user=_per_user(mine),
        )

    return LevelMetrics(
        concurrency=concurrency,
        planned=planned,
        issued=len(records),
        completed=len(ok),
        failed=len(bad),
        failure_reasons=dict(sorted(reasons.items())),
        failure_examples=examples,
        tokens_estimated=sum(1 for r in ok if r.tokens_estimated),
        ttft_ms=Stat.of(r.ttft_s * 1000 for r in ok if r.ttft_s is not None),
        tpot_ms=Stat.of(_tpot_ms(ok)),
        itl_ms=Stat.of(itl),
        e2el_ms=Stat.of(r.e2el_s * 1000 for r in ok if r.e2el_s is not None),
        client_queue_ms=Stat.of(r.client_queue_s * 1000 for r in records),
        output_tok_s_per_user=_per_user(ok),
        total_output_tokens=total_out,
        total_prompt_tokens=total_prompt,
        by_class=by_class,
        **asdict(rates),
    )


@dataclass(frozen=True, slots=True)
class _Rates:
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


def _window_rates(
    records: Sequence[RequestRecord],
    ok: Sequence[RequestRecord],
    concurrency: int,
    policy: WindowPolicy,
    total_out: int,
    total_prompt: int,
) -> _Rates:
    """Throughput fields of :class:`LevelMetrics` (window, fallback, ramp-up, drain)."""
    if not records:
        return _Rates()

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

    reason = None
    if window_s <= 0:
        reason = (
            f"no steady state: the first {concurrency} requests finished at "
            f"{first_wave_done:.3f}s, after the last dispatch at {t_stop:.3f}s"
        )
    elif run_s > 0 and window_s < policy.min_fraction * run_s:
        reason = (
            f"window {window_s:.3f}s is under {policy.min_fraction:.0%} of the "
            f"{run_s:.3f}s run"
        )
    elif len(in_window) < policy.min_token_timestamps:
        reason = (
            f"only {len(in_window)} chunk arrivals in the window "
            f"(< {policy.min_token_timestamps})"
        )

    ramp_up_s = t_warm - first
    drain_s = run_end - t_stop
    run_output_tok_s = _rate(total_out, run_s)
    if reason is not None:
        return _Rates(
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
    return _Rates(
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


_COUNT_KEYS = ("failed", "completed")
_NOT_SUMMARIZED = ("repeats", "output_tok_s_cv")


def summarize_repeats(runs: Sequence[LevelMetrics]) -> LevelMetrics:
    """One level measured ``len(runs)`` times → the median run, carrying :class:`RepeatSummary`.

    The detailed fields (latency stats, window, sub-windows) are those of the run with the
    median output_tok_s (the lower median for an even count), so they stay one consistent
    measurement; ``flat()`` then reports per-key medians across runs, except ``failed`` and
    ``completed``, which are totals: a failure in any repeat must stay visible.
    """
    if not runs:
        raise ValueError("summarize_repeats needs at least one run")
    if len(runs) == 1:
        return runs[0]
    flats = [r.flat_single() for r in runs]
    keys = [k for k in flats[0] if k not in _NOT_SUMMARIZED]
    median: dict[str, float | None] = {}
    low: dict[str, float | None] = {}
    high: dict[str, float | None] = {}
    cv: dict[str, float | None] = {}
    for k in keys:
        xs = [f[k] for f in flats if not math.isnan(f[k])]
        if not xs:
            median[k] = low[k] = high[k] = cv[k] = None
            continue
        median[k] = math.fsum(xs) if k in _COUNT_KEYS else statistics.median(xs)
        low[k], high[k] = min(xs), max(xs)
        mean = math.fsum(xs) / len(xs)
        cv[k] = statistics.stdev(xs) / mean if len(xs) > 1 and mean != 0 else None
    order = sorted(range(len(runs)), key=lambda i: runs[i].output_tok_s)
    rep = order[(len(runs) - 1) // 2]
    summary = RepeatSummary(
        n=len(runs),
        representative=rep,
        median=median,
        min=low,
        max=high,
        cv=cv,
        per_repeat=[{k: (None if math.isnan(f[k]) else f[k]) for k in keys} for f in flats],
    )
    return runs[rep].model_copy(update={"repeats": summary})
