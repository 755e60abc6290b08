"""The OpenAI-compatible streaming protocol as data: where requests go, what they carry,
what a streamed response has said so far and the record it makes.

Pure: the I/O that sends the bytes is :mod:`tuner.load.request`. Every request streams
with ``stream_options.include_usage`` so token counts come from the server's usage, never
a client tokenizer (measurement.md §1).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from tuner.load.load_spec import Api
from tuner.load.records import RequestError, RequestRecord
from tuner.load.sse import SSEError
from tuner.load.token_counts import check_usage
from tuner.load.workload import RequestPlan

__all__ = ["API_PATHS", "IDLE_REUSE_LIMIT_S", "Live", "StreamState", "encode_body", "make_record", "request_body",
           "server_root"]

API_PATHS: dict[str, str] = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}

IDLE_REUSE_LIMIT_S = 2.0
"""A keep-alive connection idle this long is not reused; the next request opens a new one.

vLLM's HTTP server (uvicorn) closes a connection that has been idle for
``VLLM_HTTP_TIMEOUT_KEEP_ALIVE`` seconds, 5 by default, which is also httpx's default idle
expiry. A request written onto such a connection just as the server closes it is answered
with a TCP reset (httpx: an empty ``ReadError``), a failure of the client's timing, not of
the configuration. Seen in CI: the reference's probe failed that way twice in one run;
reproduced against uvicorn at 7 resets in 150 requests sent at its keep-alive timeout, none
once the client gave idle connections up first. Every client of the tuner's (load generator,
probe, /metrics and /tokenize calls) keeps its idle connections well below the server's
timeout."""


def server_root(base_url: str) -> str:
    """The server's root URL; accepts both http://host:port and http://host:port/v1, the
    two forms users copy."""
    url = base_url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def request_body(
    model: str, item: RequestPlan, api: Api, continuous_usage: bool, replies: Sequence[str] = ()
) -> dict[str, Any]:
    """The POST body of ``item``; ``replies``: the server's replies to the earlier turns of
    its conversation, sent in place of the dataset's assistant messages (what a chat client
    does, and what the server's prefix cache holds)."""
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": item.max_tokens,
        # vLLM no longer forces greedy in its bench; set it so every config decodes alike.
        "temperature": 0,
        "ignore_eos": item.ignore_eos,
        "stream": True,
        # continuous_usage_stats puts cumulative usage in every chunk: exact tokens per
        # chunk even when a speculative step emits several. Servers without it still send
        # the final usage chunk, and the metrics fall back to text-length weighting.
        "stream_options": {"include_usage": True, "continuous_usage_stats": continuous_usage},
    }
    if api == "chat":
        body["messages"] = (_with_replies(item.messages, replies) if item.messages is not None
                            else [{"role": "user", "content": item.prompt}])
    else:
        body["prompt"] = item.prompt
    return body


def _with_replies(messages: Sequence[tuple[str, str]], replies: Sequence[str]) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    answered = 0
    for role, content in messages:
        if role == "assistant" and answered < len(replies):
            content = replies[answered]
            answered += 1
        out.append({"role": role, "content": content})
    return out


def encode_body(body: dict[str, Any]) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


class StreamState:
    """What one streamed response has told us so far (the per-event hot path)."""

    __slots__ = (
        "chat", "times", "chars", "cumulative", "per_chunk_usage", "bad_cumulative", "finish",
        "prompt_tokens", "output_tokens", "error", "reply",
    )

    def __init__(self, chat: bool, keep_reply: bool = False) -> None:
        self.chat = chat
        # The reply's text, kept only where a later turn of a conversation sends it back.
        self.reply: list[str] | None = [] if keep_reply else None
        self.times: list[float] = []
        self.chars: list[int] = []
        self.cumulative: list[int] = []
        self.per_chunk_usage = True
        self.bad_cumulative: Any = None  # the first per-chunk count that was no integer
        self.finish: str | None = None
        # As the server sent them, whatever their JSON type: make_record checks them.
        self.prompt_tokens: Any = None
        self.output_tokens: Any = None
        self.error: RequestError | None = None

    def on_events(self, events: list[dict[str, Any] | SSEError], now: float) -> None:
        for ev in events:
            if isinstance(ev, SSEError):
                self.error = RequestError(type=_ERROR_TYPES[ev.kind], message=ev.message)
                return
            choices = ev.get("choices")
            usage = ev.get("usage")
            if choices:
                # Every chunk with choices counts for TTFT/ITL/E2EL, empty text included
                # (the chat role chunk, a finish-only chunk), exactly as vLLM's bench.
                self.times.append(now)
                c0 = choices[0]
                if self.chat:
                    delta = c0.get("delta") or {}
                    # Reasoning text counts too: "reasoning_content" in older vLLM, "reasoning"
                    # in newer releases.
                    content = delta.get("content") or ""
                    text = content + (delta.get("reasoning_content") or delta.get("reasoning") or "")
                    if self.reply is not None:   # a chat client sends back the answer, not the reasoning
                        self.reply.append(content)
                else:
                    text = c0.get("text") or ""
                self.chars.append(len(text))
                if c0.get("finish_reason"):
                    self.finish = c0["finish_reason"]
                count = usage.get("completion_tokens") if usage else None
                if type(count) is int:
                    # Integers only: in-flight counts are summed while the level runs
                    # (tuner.load.live_window), before make_record judges them.
                    self.cumulative.append(count)
                else:
                    self.per_chunk_usage = False
                    if count is not None and self.bad_cumulative is None:
                        self.bad_cumulative = count
            elif usage:
                self.prompt_tokens = usage.get("prompt_tokens")
                self.output_tokens = usage.get("completion_tokens")


_ERROR_TYPES = {"server_error": "server_error", "malformed": "malformed_stream",
                "too_large": "reply_too_large"}

# In-flight requests by plan position: (dispatch time, stream state, max_tokens). Read by
# the early-stop judgement inside a level (tuner.load.live_window).
Live = dict[int, tuple[float, StreamState, int]]


def make_record(
    st: StreamState, item: RequestPlan, *, concurrency: int, scheduled_s: float,
    dispatch_s: float, done_s: float, error: RequestError | None, status: int | None,
    prompt_chars: int | None = None,
) -> RequestRecord:
    """The record of one finished request from what its stream said; ``prompt_chars``: the
    characters sent (every message of a conversation), default the plan's prompt."""
    times = st.times
    if error is None and not times:
        error = RequestError(type="no_content", message="stream carried no choices")
    exact = st.per_chunk_usage and bool(times) and len(st.cumulative) == len(times)
    claimed = st.output_tokens
    if claimed is None and exact:
        claimed = st.cumulative[-1]  # usage-only chunk lost; the last cumulative is it
    # The server's counts are believed only within what the client received
    # (tuner.load.token_counts); otherwise the client counts its chunks and says why.
    sent = len(item.prompt) if prompt_chars is None else prompt_chars
    usage = check_usage(prompt_tokens=st.prompt_tokens, output_tokens=claimed,
                        cumulative=st.cumulative, bad_cumulative=st.bad_cumulative,
                        chars=st.chars, max_tokens=item.max_tokens, prompt_chars=sent)
    output_tokens = usage.output_tokens
    chunk_tokens = None
    if exact and usage.cumulative is not None:
        chunk_tokens = [b - a for a, b in zip([0, *usage.cumulative], usage.cumulative,
                                              strict=False)]
    return RequestRecord(
        index=item.index,
        class_name=item.class_name,
        concurrency=concurrency,
        scheduled_s=scheduled_s,
        dispatch_s=dispatch_s,
        chunk_times_s=times,
        chunk_tokens=chunk_tokens,
        chunk_chars=st.chars,
        done_s=done_s,
        prompt_tokens=usage.prompt_tokens,
        output_tokens=output_tokens,
        usage_rejected=usage.problem,
        ok=error is None,
        error=error,
        finish_reason=st.finish,
        http_status=status,
        turn=item.turn if item.turns > 1 else None,
    )
