"""One request's raw timings, as the load generator records them (JSON-lines friendly).

All ``*_s`` times are seconds since the level started, from a monotonic clock shared by
every client process. :func:`token_timeline` turns a record into (arrival, tokens) points,
the unit every throughput figure is counted in (:mod:`tuner.load.window`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["RequestError", "RequestRecord", "token_timeline"]


class RequestError(BaseModel):
    """Why a request failed. ``type`` is a fixed vocabulary set by the load generator:
    http_status, server_error, malformed_stream, reply_too_large (a stream line or event over
    tuner.load.sse.MAX_LINE_BYTES), incomplete_stream, no_content, timeout, connect_error,
    connection_error, client_exception."""

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
    phase: Literal["warmup", "measure", "drain"] = Field(
        default="measure",
        description=(
            "Levels sized by time (load.sizing: steady): dispatched before the measured "
            "window (warmup), inside it (measure), or after it, keeping the concurrency up "
            "until the window's last requests finished (drain). Latencies are taken over "
            "measure requests; throughput over every token inside the window."
        ),
    )
    prompt_tokens: int | None = Field(default=None, description="usage.prompt_tokens.")
    output_tokens: int | None = Field(
        default=None,
        description="usage.completion_tokens; None when the server sent none or it was not "
        "believed (usage_rejected): the client's count of chunks with text is used then.")
    usage_rejected: str | None = Field(
        default=None,
        description="Why the server's token counts were not believed: a count outside what "
        "the client received (tuner.load.token_counts); None: believed, or none sent.")
    ok: bool
    error: RequestError | None = None
    finish_reason: str | None = None
    http_status: int | None = None
    turn: int | None = Field(
        default=None, ge=0,
        description="Multi-turn conversations: which user turn of its conversation (0 first); "
                    "the conversation's turns have consecutive indices. None: a single request.")
    trace_offset_s: float | None = Field(
        default=None, ge=0.0,
        description="Trace level: the request's timestamp in the trace, seconds after the trace's first "
                    "request (before load.trace.time_scale); it was due at scheduled_s, sent at dispatch_s.")

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
        """True when tokens are estimated from chunks: the server sent no usage, or it was
        not believed."""
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
