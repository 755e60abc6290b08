"""Per-request records → per-level metrics, following vLLM's definitions.

Definitions (measurement.md §1, vLLM ``benchmarks/serve.py::calculate_metrics``):

* **TTFT** = first chunk with non-empty ``choices`` − dispatch (the usage-only chunk does
  not count; the first chunk may have empty text, e.g. the chat role chunk).
* **E2EL** = last such chunk − dispatch (usage chunk and ``[DONE]`` excluded).
* **TPOT** = (E2EL − TTFT)/(output_tokens − 1) per request; requests with ≤ 1 output
  token are dropped from it, and so are *burst* requests: more than one output token, but
  every content chunk read at one instant (one read held the whole reply), which tells
  nothing about the time between tokens: their TPOT would be 0.
* **ITL** = gaps between consecutive content chunks, pooled over requests (chunk-weighted).
  With speculative decoding one chunk carries several tokens, so compare speculative and
  plain configs on TPOT, E2EL and throughput, never on ITL.
* Failed requests are excluded from every latency statistic and counted in ``failed``.
* **Token mismatch**: completed requests whose server token counts were not believed
  (:mod:`tuner.load.token_counts`); their tokens are the client's count of chunks with text.
* **Client-bound**: the load generator's event loop ran late (tuner.load.loop_lag) by more
  than :data:`CLIENT_LAG_SHARE` of the level's median TTFT at its p99: the latencies then
  measure the client. The level counts as unstable (``flat()["unstable"]``), so the trial
  is flagged, or infeasible under ``load.on_unstable: infeasible``.

Throughput deliberately departs from vLLM's Σtokens/whole-run duration, which includes
the synchronized first prefill wave and the drain tail (§4.2): tokens are counted by their
own timestamps inside a steady-state window (:mod:`tuner.load.window`).

Times in records are seconds relative to the level start, from a monotonic clock;
statistics are reported in milliseconds (units are in the names).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict

from pydantic import BaseModel, ConfigDict, Field

from tuner.load.efficiency import Holding, efficiency_flat
from tuner.load.level_energy import LevelEnergy
from tuner.load.records import RequestRecord
from tuner.load.slo import LevelSlo
from tuner.load.stats import Stat
from tuner.load.stats import percentile as _percentile
from tuner.load.uncertainty import Z95, mean_ci, quantile_ci, with_noise_floor
from tuner.load.window import (
    STABILITY_MAX_RATIO,
    SteadyWindow,
    WindowPolicy,
    WindowRates,
    steady_rates,
    window_rates,
)

__all__ = [
    "CLIENT_LAG_SHARE",
    "EXTRA_FLAT_KEYS",
    "FLAT_KEYS",
    "NOISY_KEYS",
    "ClassMetrics",
    "LevelMetrics",
    "RepeatSummary",
    "Uncertainty",
    "compute_level_metrics",
    "summarize_repeats",
]

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

NOISY_KEYS: tuple[str, ...] = tuple(k for k in FLAT_KEYS if k not in ("failed", "completed"))
"""Flat metrics that carry an interval: ``<key>.ci95`` (95 % half-width) and ``<key>.n``."""

EXTRA_FLAT_KEYS: tuple[str, ...] = (
    "run_output_tok_s",
    "stability_ratio",
    "repeats",
    "output_tok_s_cv",
    "unstable",
    *(f"{k}.{suffix}" for k in NOISY_KEYS for suffix in ("ci95", "n")),
    *("client_lag_ms.p99", "client_bound", "burst_requests"),
    "token_mismatch",
)
"""Keys :meth:`LevelMetrics.flat` adds after :data:`FLAT_KEYS` (added later; NaN = none).
``unstable`` is 1.0 when the level's throughput never settled or the level was
client-bound (0.0 when neither, NaN when there was no window to judge)."""

# Flat keys kept last, in EXTRA_FLAT_KEYS' order.
_TAIL_KEYS = ("client_lag_ms.p99", "client_bound", "burst_requests", "token_mismatch")

CLIENT_LAG_SHARE = 0.5
"""A level is client-bound when the client loop's p99 lateness exceeds this share of its
median TTFT: the first token's time is then off by as much as half of it, and the replies
short enough to fit in one stall arrive as bursts."""


class Uncertainty(BaseModel):
    """The noise of one metric: its 95 % interval and what it rests on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ci95: float | None = Field(description="Half-width (the larger side of an asymmetric one).")
    low: float | None = None
    high: float | None = None
    n: int = Field(description="Samples: sub-windows (rates), requests (latencies), repeats.")
    method: str = Field(description="t_subwindows, poisson, t_mean, order_stat, t_repeats.")


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
    client_lag_ms: Stat = Field(
        default_factory=lambda: Stat(n=0),
        description="How late the client's event loop woke during the level "
        "(tuner.load.loop_lag); n=0: not monitored.")
    burst_requests: int = Field(
        default=0,
        description="Completed requests of more than one output token whose content chunks "
        "all arrived in one read: left out of TPOT (module docstring).")
    client_bound: bool | None = Field(
        default=None,
        description=f"client_lag_ms.p99 > {CLIENT_LAG_SHARE} x ttft_ms.p50: the latencies "
        "measure the client (module docstring). None: not monitored.")
    token_mismatch: int = Field(
        default=0,
        description="Completed measured requests whose server token counts were not believed "
        "(tuner.load.token_counts): counted by the client instead; > 0 makes a trial "
        "infeasible (token_count_mismatch).")
    token_mismatch_example: str | None = Field(
        default=None, description="Why the first of them was not believed.")

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
    subwindow_total_tok_s: list[float] = Field(
        default_factory=list,
        description="Total (prompt + output) tok/s in the same sub-windows (sizing: steady).",
    )
    window_completions: int | None = Field(
        default=None, description="Requests that finished inside the window (sizing: steady).")
    sizing: str = Field(
        default="requests",
        description="How the level was sized: 'requests' (a request count) or 'steady' "
        "(time and steady state, tuner.load.steady).")
    stop_reason: str | None = Field(
        default=None,
        description="sizing: steady: why the level stopped - 'stable' (the stability rule "
        "held), 'max_level_seconds' (it never did: unstable) or 'failures'.")
    uncertainty: dict[str, Uncertainty] = Field(
        default_factory=dict,
        description="95 % interval of each flat metric (tuner.load.uncertainty).")
    noise_floor: float = Field(
        default=0.0,
        description="LoadSpec.noise_floor: between-start CV added to every flat interval.")
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
    slo: LevelSlo | None = Field(
        default=None,
        description="Goodput and the SLO's verdict, when the study has an slo: section "
        "(tuner.load.goodput.level_slo; flat keys tuner.load.slo.GOODPUT_KEYS).")
    holding: Holding | None = Field(
        default=None, description="What the trial's server holds and costs, when the request says so: "
        "per-GPU and per-dollar figures (tuner.load.efficiency; flat keys EFFICIENCY_KEYS).")
    energy: LevelEnergy | None = Field(
        default=None, description="The steady window's energy, where a source could be read "
        "(tuner.load.level_energy; flat keys ENERGY_KEYS). With repeats: the median repeat's.")

    def flat(self) -> dict[str, float]:
        """Scalar metrics under the stable :data:`FLAT_KEYS` then :data:`EXTRA_FLAT_KEYS`;
        missing values are NaN. With repeats, each value is the median across repeats and
        its interval the wider of the representative run's and the repeats' own."""
        out = self.flat_single()
        rs = self.repeats
        if rs is not None:
            for key in (*FLAT_KEYS, "run_output_tok_s", "stability_ratio", "token_mismatch"):
                if key in rs.median:
                    out[key] = _nan(rs.median[key])
            out["repeats"] = float(rs.n)
            out["output_tok_s_cv"] = _nan(rs.cv.get("output_tok_s"))
            flags = [f for r in rs.per_repeat if (f := r.get("unstable")) is not None]
            out["unstable"] = max(flags) if flags else math.nan
            # A stall in any repeat is one in the level's median, as a failure is.
            bound = [f for r in rs.per_repeat if (f := r.get("client_bound")) is not None]
            out["client_bound"] = max(bound) if bound else math.nan
            out["burst_requests"] = math.fsum(r.get("burst_requests") or 0.0 for r in rs.per_repeat)
            lags = [v for r in rs.per_repeat if (v := r.get("client_lag_ms.p99")) is not None]
            out["client_lag_ms.p99"] = max(lags) if lags else math.nan
        for key in NOISY_KEYS:
            u = self.uncertainty.get(key)
            ci, n = (math.nan, math.nan) if u is None else (_nan(u.ci95), float(u.n))
            if rs is not None:
                across = mean_ci([v for r in rs.per_repeat if (v := r.get(key)) is not None])
                if across is not None and (math.isnan(ci) or across > ci):
                    ci, n = across, float(rs.n)
            # What changes between server starts, which no single run can see.
            out[f"{key}.ci95"] = with_noise_floor(ci, out.get(key, math.nan), self.noise_floor)
            out[f"{key}.n"] = n
        for key in _TAIL_KEYS:      # after the intervals, in EXTRA_FLAT_KEYS' order
            out[key] = out.pop(key)
        if self.slo is not None:
            out.update(self.slo.flat())
        if self.holding is not None:      # from the final figures: repeats' medians, noise floor in
            out.update(efficiency_flat(out, self.holding))
        if self.energy is not None:       # what changes between starts, as for the speed figures
            energy = self.energy.flat()
            for key in ("joules_per_token", "joules_per_request", "watts"):
                energy[f"{key}.ci95"] = with_noise_floor(energy[f"{key}.ci95"], energy[key], self.noise_floor)
            out.update(energy)
        return out

    def flat_json(self) -> dict[str, float | None]:
        """:meth:`flat` with NaN ("no sample") as null, which JSON and the Optuna storage want."""
        return {k: (None if v != v else v) for k, v in self.flat().items()}

    def flat_single(self) -> dict[str, float]:
        """:meth:`flat` of this one run without the intervals, ignoring :attr:`repeats`."""
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
        out["unstable"] = math.nan if self.unstable is None else float(self.unstable)
        if self.client_bound:
            out["unstable"] = 1.0
        out["client_lag_ms.p99"] = _nan(self.client_lag_ms.p99)
        out["client_bound"] = math.nan if self.client_bound is None else float(self.client_bound)
        out["burst_requests"] = float(self.burst_requests)
        out["token_mismatch"] = float(self.token_mismatch)
        return out


def _nan(x: float | None) -> float:
    return math.nan if x is None else float(x)



def _per_user(records: Sequence[RequestRecord]) -> float | None:
    speeds = [
        r.n_output_tokens() / e2el for r in records if (e2el := r.e2el_s) is not None and e2el > 0
    ]
    return math.fsum(speeds) / len(speeds) if speeds else None


def _is_burst(r: RequestRecord) -> bool:
    """More than one output token, every content chunk stamped at one instant: one socket
    read held the whole reply (chunks are stamped per read, tuner.load.http_stream).

    Only the whole reply: a server that writes a few steps back to back (the simulator at a
    fast clock, a busy API server) lands some chunks in one read without the reply's span
    being wrong, and such replies keep their TPOT (on CI, a looser rule - half the gaps
    zero - dropped one reply in two of the simulator's at c=1 while the client loop was
    never more than 1.2 ms late)."""
    ts = r.chunk_times_s
    return r.n_output_tokens() > 1 and bool(ts) and ts[-1] <= ts[0]


def _tpot_ms(records: Iterable[RequestRecord]) -> list[float]:
    out = []
    for r in records:
        n = r.n_output_tokens()
        if n > 1 and len(r.chunk_times_s) >= 1 and not _is_burst(r):
            out.append((r.chunk_times_s[-1] - r.chunk_times_s[0]) / (n - 1) * 1000)
    return out


def client_bound(lag: Stat, ttft: Stat) -> bool | None:
    """The client-bound rule (module docstring); None when the loop was not monitored."""
    if lag.n == 0 or lag.p99 is None:
        return None
    if ttft.p50 is None:
        return False
    return lag.p99 > CLIENT_LAG_SHARE * ttft.p50


def compute_level_metrics(
    records: Sequence[RequestRecord],
    *,
    concurrency: int,
    window: WindowPolicy | None = None,
    planned: int | None = None,
    first_wave: int | None = None,
    steady: SteadyWindow | None = None,
    client_lag_ms: Sequence[float] | None = None,
) -> LevelMetrics:
    """Metrics of one level from its request records (see module docstring).

    Args:
        records: every issued request of the level, failed ones included.
        concurrency: the level's closed-loop concurrency C (defines the first wave).
        window: steady-state window policy; defaults to :class:`WindowPolicy`.
        planned: requests the plan held, to show when a deadline cut the level short.
        first_wave: requests whose completion opens the steady-state window (default
            ``concurrency``; open-loop levels pass 1, having no synchronized first wave).
        steady: the window a level sized by time stopped on. Latencies and failures are
            then those of its ``measure`` requests, throughput counts every token inside
            the window (warm-up and drain requests included: the concurrency was C).
        client_lag_ms: the client loop's lateness samples during the level
            (:class:`tuner.load.loop_lag.LoopLagMonitor`); None: not monitored.
    """
    measured = list(records) if steady is None else [r for r in records if r.phase == "measure"]
    ok = [r for r in measured if r.ok]
    bad = [r for r in measured if not r.ok]
    reasons = Counter(r.error.type if r.error else "unknown" for r in bad)
    examples: dict[str, str] = {}
    for r in bad:
        kind = r.error.type if r.error else "unknown"
        examples.setdefault(kind, r.error.message if r.error else "")
    rejected = [r.usage_rejected for r in ok if r.usage_rejected is not None]
    total_out = sum(r.n_output_tokens() for r in ok)
    total_prompt = sum(r.prompt_tokens or 0 for r in ok)
    if steady is not None and records:
        rates = steady_rates(records, steady, total_out, ok)
    else:
        wave = concurrency if first_wave is None else max(1, first_wave)
        rates = window_rates(records, ok, wave, window or WindowPolicy(), total_out, total_prompt)
    samples = _samples(ok)
    lag = Stat.of(client_lag_ms or ())
    ttft = Stat.of(samples["ttft_ms"])
    by_class: dict[str, ClassMetrics] = {}
    for name in sorted({r.class_name for r in measured}):
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
        issued=len(measured),
        completed=len(ok),
        failed=len(bad),
        failure_reasons=dict(sorted(reasons.items())),
        failure_examples=examples,
        tokens_estimated=sum(1 for r in ok if r.tokens_estimated),
        **{name: Stat.of(values) for name, values in samples.items()},
        client_queue_ms=Stat.of(r.client_queue_s * 1000 for r in measured),
        client_lag_ms=lag,
        burst_requests=sum(1 for r in ok if _is_burst(r)),
        client_bound=client_bound(lag, ttft),
        token_mismatch=len(rejected),
        token_mismatch_example=rejected[0] if rejected else None,
        output_tok_s_per_user=_per_user(ok),
        total_output_tokens=total_out,
        total_prompt_tokens=total_prompt,
        by_class=by_class,
        sizing="requests" if steady is None else "steady",
        stop_reason=None if steady is None else steady.stop_reason,
        uncertainty=_uncertainty(rates, samples, ok),
        **asdict(rates),
    )


def _samples(ok: Sequence[RequestRecord]) -> dict[str, list[float]]:
    """Latency samples in ms by metric name (ITL pooled over chunks)."""
    itl: list[float] = []
    for r in ok:
        ts = r.chunk_times_s
        itl.extend((b - a) * 1000 for a, b in zip(ts, ts[1:]))
    return {
        "ttft_ms": [r.ttft_s * 1000 for r in ok if r.ttft_s is not None],
        "tpot_ms": _tpot_ms(ok),
        "itl_ms": itl,
        "e2el_ms": [r.e2el_s * 1000 for r in ok if r.e2el_s is not None],
    }


_QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}


def _uncertainty(rates: WindowRates, samples: dict[str, list[float]],
                 ok: Sequence[RequestRecord]) -> dict[str, Uncertainty]:
    """95 % intervals of the flat metrics (tuner.load.uncertainty)."""
    out: dict[str, Uncertainty] = {}
    subs = rates.subwindow_output_tok_s
    if len(subs) >= 2 and not rates.window_fallback:
        ci = mean_ci(subs)
        out["output_tok_s"] = Uncertainty(ci95=ci, n=len(subs), method="t_subwindows")
        totals = rates.subwindow_total_tok_s
        if len(totals) == len(subs):
            out["total_tok_s"] = Uncertainty(ci95=mean_ci(totals), n=len(totals),
                                             method="t_subwindows")
        elif ci is not None and rates.output_tok_s > 0:
            # Sized by request count: the prompt share is steady, the relative noise alike.
            out["total_tok_s"] = Uncertainty(ci95=ci / rates.output_tok_s * rates.total_tok_s,
                                             n=len(subs), method="t_subwindows")
    if rates.window_s and rates.window_s > 0 and not rates.window_fallback:
        k = rates.window_completions if rates.window_completions is not None \
            else round(rates.request_per_s * rates.window_s)
        out["request_per_s"] = Uncertainty(ci95=Z95 * math.sqrt(max(k, 1)) / rates.window_s,
                                           n=k, method="poisson")
    speeds = [r.n_output_tokens() / e for r in ok if (e := r.e2el_s) is not None and e > 0]
    out["output_tok_s_per_user"] = Uncertainty(ci95=mean_ci(speeds), n=len(speeds),
                                               method="t_mean")
    for name, values in samples.items():
        xs = sorted(values)
        out[f"{name}.mean"] = Uncertainty(ci95=mean_ci(xs), n=len(xs), method="t_mean")
        for field, q in _QUANTILES.items():
            band = quantile_ci(xs, q)
            if band is None:
                out[f"{name}.{field}"] = Uncertainty(ci95=None, n=0, method="order_stat")
                continue
            mid = _percentile(xs, q * 100)
            out[f"{name}.{field}"] = Uncertainty(
                ci95=max(mid - band[0], band[1] - mid), low=band[0], high=band[1], n=len(xs),
                method="order_stat")
    return out


_COUNT_KEYS = ("failed", "completed", "token_mismatch")
_NOT_SUMMARIZED = ("repeats", "output_tok_s_cv")


def summarize_repeats(runs: Sequence[LevelMetrics]) -> LevelMetrics:
    """One level measured ``len(runs)`` times → the median run, carrying :class:`RepeatSummary`.

    The detailed fields (latency stats, window, sub-windows) are those of the run with the
    median output_tok_s (the lower median for an even count), so they stay one consistent
    measurement; ``flat()`` then reports per-key medians across runs, except ``failed`` and
    ``completed`` and ``token_mismatch``, which are totals: a failure in any repeat must
    stay visible.
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
    # A count the server was not believed on in any repeat stays visible, as a failure does.
    examples = [r.token_mismatch_example for r in runs if r.token_mismatch_example]
    return runs[rep].model_copy(update={
        "repeats": summary, "token_mismatch": sum(r.token_mismatch for r in runs),
        "token_mismatch_example": examples[0] if examples else None})
