"""What a sweep produced: per level its metrics, warm-up, server-side view and raw records;
the client/server token agreement. Pure data (crosses Ray as ``model_dump()``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tuner.load.load_spec import LoadSpec, rate_level_name
from tuner.load.metrics import LevelMetrics
from tuner.load.rate_search import MaxRateResult
from tuner.load.records import RequestRecord
from tuner.load.trace_spec import TRACE_LEVEL

__all__ = ["TOKEN_AGREEMENT_TOLERANCE", "LevelResult", "SweepResult", "TokenAgreement",
           "WarmupSummary", "agreement_of", "closing_notes", "count_notes", "failure_text", "level_key",
           "level_label"]

# aiperf flags client/server usage discrepancies; measurement.md §4.7 asks for 1 %.
TOKEN_AGREEMENT_TOLERANCE = 0.01


class TokenAgreement(BaseModel):
    """Client Σ usage.completion_tokens vs the server's generation_tokens delta."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    client_output_tokens: int
    server_generation_tokens: float | None
    relative_diff: float | None = Field(description="|client − server| / server.")
    agree: bool | None = Field(description=f"relative_diff <= {TOKEN_AGREEMENT_TOLERANCE}.")
    note: str | None = None


class WarmupSummary(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    requests: int
    completed: int
    failed: int
    failure_reasons: dict[str, int]
    duration_s: float


class LevelResult(BaseModel):
    """One concurrency level: metrics, the server's view, and the raw records."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    concurrency: int = Field(description="Closed-loop C; at a rate level, the in-flight cap.")
    request_rate: float | None = Field(
        default=None, description="Open-loop level: target requests/s (None: closed loop, or the trace).")
    trace: bool = Field(
        default=False, description="The trace level (load.trace): a timed dataset replayed at its "
        "timestamps, open loop; its metrics' request_rate is the replay's mean arrival rate.")
    prompts_fitted: bool = Field(description="Prompts trimmed to exact length via /tokenize.")
    deadline_hit: bool = Field(description="The level stopped issuing before its plan ended.")
    warmup: WarmupSummary
    metrics: LevelMetrics
    server_side: dict[str, Any] | None = Field(
        description="server_side_metrics() over the measured requests; None without /metrics."
    )
    token_agreement: TokenAgreement
    records: list[RequestRecord]

    @property
    def open_loop(self) -> bool:
        """A rate level or the trace: requests sent at their own times, however many are in flight."""
        return self.request_rate is not None or self.trace


_NO_RECORDS: dict[str, Any] = {
    "levels": {"__all__": {"records"}}, "rate_levels": {"__all__": {"records"}},
}


class SweepResult(BaseModel):
    """Everything a trial's load measurement produced. Crosses Ray as ``model_dump()``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str
    base_url: str
    load: LoadSpec
    ignore_eos: bool
    started_at: str = Field(description="Wall-clock start, ISO 8601 UTC (for humans only).")
    duration_s: float
    levels: list[LevelResult]
    skipped_levels: list[int] = Field(description="Levels not run because the budget ran out.")
    stopped_levels: list[int] = Field(
        default_factory=list,
        description="Levels not run because after_level stopped the sweep (early stop).")
    warnings: list[str] = Field(description="Degraded measurement: missing endpoints, budget.")
    rate_levels: list[LevelResult] = Field(
        default_factory=list,
        description="Open-loop levels, measured after the others: LoadSpec.request_rates', the "
        "trace level (load.trace), then the max_rate@slo search's.")
    skipped_rates: list[float] = Field(
        default_factory=list, description="Rate levels not run because the budget ran out.")
    stopped_rates: list[float] = Field(
        default_factory=list,
        description="Rate levels not run because early stop ended the sweep.")
    max_rate: MaxRateResult | None = Field(
        default=None,
        description="The max_rate@slo search (tuner.load.max_rate): every probed rate, its "
        "verdict, the bracket and the answer; its levels are in rate_levels.")

    def to_json(self, *, include_records: bool = True, indent: int | None = None) -> str:
        exclude = _NO_RECORDS if not include_records else None
        return self.model_dump_json(exclude=exclude, indent=indent)

    def summary(self) -> dict[str, Any]:
        """JSON-ready dict of everything but the raw records (for metrics.json)."""
        return self.model_dump(mode="json", exclude=_NO_RECORDS)

    def load_failures(self) -> dict[str, str]:
        """:func:`failure_text` of every level with failed measured requests, keyed as a
        trial's outcome keys its levels (``"4"``, ``"r2.0"``, ``"trace"``)."""
        return {level_key(lv): failure_text(lv.metrics)
                for lv in (*self.levels, *self.rate_levels) if lv.metrics.failed}

    def problems(self) -> list[str]:
        """Why the sweep's numbers cannot stand for the server, one line per level: measured
        requests failed at a concurrency level (a trial is then infeasible, ``load_errors``),
        every request failed at a rate level (an overloaded rate level may time some out by
        design), or the server's token counts were not believed (``token_count_mismatch``).
        Empty: nothing of the kind."""
        out = []
        for lv in (*self.levels, *self.rate_levels):
            m = lv.metrics
            if m.failed and (not lv.open_loop or not m.completed):
                out.append(f"{level_label(lv)}: {failure_text(m)}")
            if m.token_mismatch:
                out.append(f"{level_label(lv)}: {_mismatch_text(m)}")
        return out


def level_label(level: LevelResult) -> str:
    """``c=4`` for a concurrency level, ``r2.0`` for a rate level, ``trace`` for the trace
    (how messages name them)."""
    return f"c={level.concurrency}" if not level.open_loop else level_key(level)


def level_key(level: LevelResult) -> str:
    """The level as a trial's outcome keys it: ``"4"``, ``"r2.0"``, ``"trace"``."""
    if level.trace:
        return TRACE_LEVEL
    return str(level.concurrency) if level.request_rate is None else rate_level_name(level.request_rate)


def failure_text(m: LevelMetrics) -> str:
    """The failed requests of a level in one line: how many, of which type, the first
    message of each type (``4 of 4 measured requests failed: 4 http_status (HTTP 500: ...)``)."""
    kinds = ", ".join(f"{n} {kind} ({_short(m.failure_examples.get(kind, ''))})"
                      for kind, n in sorted(m.failure_reasons.items(), key=lambda kv: -kv[1]))
    return f"{m.failed} of {m.issued} measured requests failed: {kinds}"


def _mismatch_text(m: LevelMetrics) -> str:
    return (f"the server's token counts were not believed for {m.token_mismatch} of "
            f"{m.completed} completed requests ({m.token_mismatch_example}); tokens were "
            "counted by the client, one per chunk of text")


def _short(text: str, limit: int = 120) -> str:
    one = " ".join(text.split())
    return one if len(one) <= limit else one[:limit - 3] + "..."


def count_notes(levels: Sequence[LevelResult]) -> list[str]:
    """The sweep's warnings about token counts: a level whose server counts were not believed,
    and one whose clients' sum and the server's /metrics disagree by more than
    TOKEN_AGREEMENT_TOLERANCE (recorded in metrics.json; said here too)."""
    out = []
    for lv in levels:
        if lv.metrics.token_mismatch:
            out.append(f"{level_label(lv)}: {_mismatch_text(lv.metrics)}")
        a = lv.token_agreement
        if a.agree is False:
            apart = "" if a.relative_diff is None else f" ({a.relative_diff:.1%} apart)"
            out.append(f"{level_label(lv)}: the clients counted {a.client_output_tokens:,} "
                       f"output tokens, the server's /metrics "
                       f"{a.server_generation_tokens or 0:,.0f}{apart}"
                       + (f"; {a.note}" if a.note else ""))
    return out


def agreement_of(
    records: Sequence[RequestRecord], server: dict[str, Any] | None
) -> TokenAgreement:
    """Client Σ usage.completion_tokens of ``records`` against the server's delta (where a
    request's usage was not believed, the client's own count of it)."""
    client = sum((r.output_tokens if r.usage_rejected is None else r.n_output_tokens()) or 0
                 for r in records)
    gen = server.get("generation_tokens") if server else None
    if gen is None:
        return TokenAgreement(
            client_output_tokens=client,
            server_generation_tokens=None,
            relative_diff=None,
            agree=None,
            note="server exposes no vllm:generation_tokens_total",
        )
    note = None
    failed = sum(1 for r in records if not r.ok)
    if failed:
        # Aborted requests generated tokens the client never got a usage count for.
        note = f"{failed} failed requests: their server-side tokens have no client usage"
    if gen <= 0:
        # No relative difference exists; inf would not survive JSON either.
        return TokenAgreement(
            client_output_tokens=client,
            server_generation_tokens=gen,
            relative_diff=None,
            agree=client == 0,
            note=note or "server counted no generated tokens",
        )
    rel = abs(client - gen) / gen
    return TokenAgreement(
        client_output_tokens=client,
        server_generation_tokens=gen,
        relative_diff=rel,
        agree=rel <= TOKEN_AGREEMENT_TOLERANCE,
        note=note,
    )


def closing_notes(used_up: str | None, skipped: list[int], skipped_rates: list[float],
                  deadline_s: float | None) -> list[str]:
    """What a sweep says once its levels are done: a used-up dataset (``DatasetDraw.note``),
    levels left out for the budget."""
    notes = [used_up] if used_up else []
    if skipped:
        notes.append(f"levels {skipped} skipped: sweep budget of {deadline_s}s exhausted")
    if skipped_rates:
        notes.append(f"rate levels {skipped_rates} skipped: sweep budget of {deadline_s}s exhausted")
    return notes
