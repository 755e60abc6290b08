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

__all__ = ["TOKEN_AGREEMENT_TOLERANCE", "LevelResult", "SweepResult", "TokenAgreement",
           "WarmupSummary", "agreement_of"]

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
        default=None, description="Open-loop level: target requests/s (None: closed loop).")
    prompts_fitted: bool = Field(description="Prompts trimmed to exact length via /tokenize.")
    deadline_hit: bool = Field(description="The level stopped issuing before its plan ended.")
    warmup: WarmupSummary
    metrics: LevelMetrics
    server_side: dict[str, Any] | None = Field(
        description="server_side_metrics() over the measured requests; None without /metrics."
    )
    token_agreement: TokenAgreement
    records: list[RequestRecord]


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
        description="Open-loop levels (LoadSpec.request_rates), measured after the others.")
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

    def flat_by_level(self) -> dict[int, dict[str, float]]:
        """``LevelMetrics.flat()`` of each level, keyed by concurrency."""
        return {lv.concurrency: lv.metrics.flat() for lv in self.levels}

    def flat_by_rate(self) -> dict[str, dict[str, float]]:
        """``LevelMetrics.flat()`` of each rate level, keyed by its name (``r2.0``)."""
        return {rate_level_name(lv.request_rate or 0.0): lv.metrics.flat()
                for lv in self.rate_levels}


def agreement_of(
    records: Sequence[RequestRecord], server: dict[str, Any] | None
) -> TokenAgreement:
    """Client Σ usage.completion_tokens of ``records`` against the server's delta."""
    client = sum(r.output_tokens or 0 for r in records)
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
