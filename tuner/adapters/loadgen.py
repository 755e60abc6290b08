"""Async closed-loop load generator for an OpenAI-compatible (vLLM) server.

One level = C streams, each sending its next request as soon as its previous one
finished, every request streamed with ``stream_options.include_usage`` so token counts
come from the server's usage, never a client tokenizer (measurement.md §1).

The streamed requests go through :mod:`tuner.adapters.http_stream`, a small asyncio
HTTP/1.1 client: each stream keeps one keep-alive connection, and response bytes are
de-chunked and parsed (:class:`tuner.core.sse.SSEParser`) inside the protocol's
``data_received`` with one timestamp per socket read, so a token costs no coroutine
switch. httpx, whose per-chunk overhead capped the generator near 8,000 tokens/s at 64
streams (benchmarks/client_capacity.py), remains the client for ``/tokenize`` and
``/metrics``. Where one core is still not enough, ``processes > 1`` shards the streams
over client processes (:mod:`tuner.adapters.loadgen_shards`).

Failures never escape a level: a non-200 status, an error event mid-stream, a reset
connection or a timeout becomes a record with ``ok=False`` and a typed reason; only
cancellation propagates. Times are ``time.monotonic()`` seconds since the level start
(CLOCK_MONOTONIC: one clock for every process, so sharded clients share a time base).

A sweep (:func:`run_sweep`) runs, per level: prompt fitting through ``/tokenize`` →
warm-up with different prompts → ``/metrics`` scrape → measured level (× ``repeats``,
fresh prompts each time) → scrape, so the server-side deltas cover the measured requests
only. Open-loop rate levels (``LoadSpec.request_rates``, :func:`run_rate_level`) follow the
concurrency levels: requests sent at seeded absolute arrival times, whatever is in flight.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import math
import time
from collections import Counter
from dataclasses import dataclass
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from tuner.adapters.artifacts import atomic_write_text
from tuner.adapters.http_stream import (
    Endpoint,
    HttpConnectError,
    HttpProtocolError,
    StreamConnection,
)
from pydantic import BaseModel, ConfigDict, Field

from tuner.core.load_spec import Api, LoadSpec, rate_level_name
from tuner.core.metrics import (
    STABILITY_MAX_RATIO,
    LevelMetrics,
    RequestError,
    RequestRecord,
    WindowPolicy,
    compute_level_metrics,
    summarize_repeats,
    token_timeline,
)
from tuner.core.prometheus import MetricsSnapshot, parse_prometheus_text, server_side_metrics
from tuner.core.sse import SSEError, SSEParser
from tuner.core.workload import (
    RequestDraft,
    RequestPlan,
    TokenFitter,
    arrival_schedule,
    draft_requests,
    level_stream,
    rate_stream,
)

__all__ = [
    "TOKEN_AGREEMENT_TOLERANCE",
    "LevelHalted",
    "LevelResult",
    "RateRun",
    "SweepResult",
    "TokenAgreement",
    "WarmupSummary",
    "fetch_token_count",
    "fit_plan",
    "rate_level_metrics",
    "read_records_jsonl",
    "run_level",
    "run_rate_level",
    "run_sweep",
    "scrape_metrics",
    "write_records_jsonl",
]

logger = logging.getLogger(__name__)

# aiperf flags client/server usage discrepancies; measurement.md §4.7 asks for 1 %.
TOKEN_AGREEMENT_TOLERANCE = 0.01
# Auxiliary calls (/tokenize, /metrics) are small; a server that needs longer is unwell.
_AUX_TIMEOUT_S = 30.0
_PATHS: dict[str, str] = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
# Early stop inside a level (tuner.study.early_stop rule 4): how often the window so far is
# judged (a scan of every token timestamp; once a second keeps it off the hot path) and in
# how many sub-windows its steadiness is checked.
INSIDE_CHECK_EVERY_S = 1.0
INSIDE_SUBWINDOWS = 3


def _root(base_url: str) -> str:
    # Accept both http://host:port and http://host:port/v1, the two forms users copy.
    url = base_url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def _request_body(
    model: str, item: RequestPlan, api: Api, continuous_usage: bool
) -> dict[str, Any]:
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
        body["messages"] = [{"role": "user", "content": item.prompt}]
    else:
        body["prompt"] = item.prompt
    return body


class _StreamState:
    """What one streamed response has told us so far (the per-event hot path)."""

    __slots__ = (
        "chat", "times", "chars", "cumulative", "per_chunk_usage", "finish",
        "prompt_tokens", "output_tokens", "error",
    )

    def __init__(self, chat: bool) -> None:
        self.chat = chat
        self.times: list[float] = []
        self.chars: list[int] = []
        self.cumulative: list[int] = []
        self.per_chunk_usage = True
        self.finish: str | None = None
        self.prompt_tokens: int | None = None
        self.output_tokens: int | None = None
        self.error: RequestError | None = None

    def on_events(self, events: list[dict[str, Any] | SSEError], now: float) -> None:
        for ev in events:
            if isinstance(ev, SSEError):
                kind = "server_error" if ev.kind == "server_error" else "malformed_stream"
                self.error = RequestError(type=kind, message=ev.message)
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
                    text = (delta.get("content") or "") + (
                        delta.get("reasoning_content") or delta.get("reasoning") or ""
                    )
                else:
                    text = c0.get("text") or ""
                self.chars.append(len(text))
                if c0.get("finish_reason"):
                    self.finish = c0["finish_reason"]
                if usage and usage.get("completion_tokens") is not None:
                    self.cumulative.append(usage["completion_tokens"])
                else:
                    self.per_chunk_usage = False
            elif usage:
                self.prompt_tokens = usage.get("prompt_tokens")
                self.output_tokens = usage.get("completion_tokens")


@dataclass(frozen=True, slots=True)
class _Level:
    """What every request of one level (or one shard of it) shares."""

    endpoint: Endpoint
    headers: dict[str, str] | None
    model: str
    api: Api
    concurrency: int
    t0: float  # time.monotonic() at the level start; records are relative to it
    request_timeout_s: float
    continuous_usage: bool


class _Stream:
    """One closed-loop stream: its keep-alive connection, reused request after request."""

    __slots__ = ("conn",)

    def __init__(self) -> None:
        self.conn: StreamConnection | None = None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def _encode_body(body: dict[str, Any]) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


async def _one_request(
    lv: _Level, stream: _Stream, item: RequestPlan, scheduled_s: float,
    live: dict[int, tuple[float, _StreamState, int]] | None = None, pos: int = 0,
) -> RequestRecord:
    clock = time.monotonic
    t0 = lv.t0
    request_timeout_s = lv.request_timeout_s
    st = _StreamState(chat=lv.api == "chat")
    parser = SSEParser()
    feed = parser.feed
    on_events = st.on_events
    status: int | None = None
    error: RequestError | None = None

    def sink(payload: bytes, now: float) -> bool:
        on_events(feed(payload), now - t0)
        return st.error is not None  # an error event ends the request; drop the rest

    body = _encode_body(_request_body(lv.model, item, lv.api, lv.continuous_usage))
    dispatch_s = clock() - t0
    if live is not None:
        # In flight: its tokens so far count in the window judged inside the level.
        live[pos] = (dispatch_s, st, item.max_tokens)
    try:
        # One total timeout over connect + request + stream: a server trickling bytes
        # forever would otherwise never trip a per-read timeout.
        async with asyncio.timeout(request_timeout_s):
            conn = stream.conn
            if conn is None or not conn.usable:
                stream.close()
                conn = StreamConnection(lv.endpoint, lv.headers)
                stream.conn = conn
                await conn.connect(min(request_timeout_s, _AUX_TIMEOUT_S))
            status = await conn.post(body, sink)
        if status != 200:
            text = conn.error_body[:500].decode("utf-8", "replace")
            error = RequestError(type="http_status", message=f"HTTP {status}: {text}")
        else:
            if st.error is None:
                on_events(parser.close(), clock() - t0)
            error = st.error
            if error is None and not parser.done:
                error = RequestError(
                    type="incomplete_stream", message="stream ended without data: [DONE]"
                )
    except TimeoutError:
        stream.close()
        error = RequestError(
            type="timeout", message=f"no complete response in {request_timeout_s}s"
        )
    except HttpConnectError as exc:
        stream.close()
        error = RequestError(type="connect_error", message=str(exc))
    except (HttpProtocolError, OSError) as exc:
        # The server closed or reset the connection mid-response, or broke the framing.
        stream.close()
        error = RequestError(type="connection_error", message=f"{type(exc).__name__}: {exc}")
    except Exception as exc:
        # One odd response must not take down a level that other requests are still
        # measuring; it is recorded (and logged with its traceback), not swallowed.
        stream.close()
        logger.exception("unexpected client error in request %d", item.index)
        error = RequestError(type="client_exception", message=f"{type(exc).__name__}: {exc}")
    done_s = clock() - t0
    if live is not None:
        live.pop(pos, None)

    times = st.times
    if error is None and not times:
        error = RequestError(type="no_content", message="stream carried no choices")
    exact = st.per_chunk_usage and bool(times) and len(st.cumulative) == len(times)
    output_tokens = st.output_tokens
    if output_tokens is None and exact:
        output_tokens = st.cumulative[-1]  # usage-only chunk lost; the last cumulative is it
    chunk_tokens = None
    if exact:
        chunk_tokens = [b - a for a, b in zip([0, *st.cumulative], st.cumulative, strict=False)]
    return RequestRecord(
        index=item.index,
        class_name=item.class_name,
        concurrency=lv.concurrency,
        scheduled_s=scheduled_s,
        dispatch_s=dispatch_s,
        chunk_times_s=times,
        chunk_tokens=chunk_tokens,
        chunk_chars=st.chars,
        done_s=done_s,
        prompt_tokens=st.prompt_tokens,
        output_tokens=output_tokens,
        ok=error is None,
        error=error,
        finish_reason=st.finish,
        http_status=status,
    )


class _Window:
    """The level's steady-state window so far, for early stop inside a level (rule 4 of
    tuner.study.early_stop): opened when the first C requests (plan positions < C) have all
    finished, as tuner.core.metrics opens it; token timestamps of finished requests are
    collected once, in-flight ones are read at each judgement."""

    def __init__(self, concurrency: int, planned: int) -> None:
        self.concurrency = concurrency
        self.planned = planned
        self.first_wave: dict[int, RequestRecord] = {}
        self.opened: float | None = None
        self.first_s = 0.0
        self.points: list[tuple[float, float]] = []
        self.pending: list[RequestRecord] = []
        self.completed = 0

    def add(self, pos: int, record: RequestRecord) -> None:
        self.completed += 1
        if pos < self.concurrency:
            self.first_wave[pos] = record
            if len(self.first_wave) == min(self.concurrency, self.planned):
                self.first_s = min(r.dispatch_s for r in self.first_wave.values())
                self.opened = max(r.done_s for r in self.first_wave.values())
                for r in self.pending + list(self.first_wave.values()):
                    self._take(r)
                self.pending = []
                return
        if self.opened is None:
            self.pending.append(record)
        else:
            self._take(record)

    def _take(self, record: RequestRecord) -> None:
        if record.ok:
            assert self.opened is not None
            self.points.extend(pt for pt in token_timeline(record) if pt[0] >= self.opened)

    def view(self, now: float, live: dict[int, tuple[float, _StreamState, int]],
             last_dispatch: float | None = None, done_tokens: float = 0.0) -> dict[str, Any] | None:
        """Output tok/s in the window so far, its steadiness and lengths; None when it cannot
        be counted (window not open, or an in-flight request without exact per-chunk usage).

        ``last_dispatch``: nothing more will be issued, so the level's window is known: it
        ends at the last dispatch and starts where tuner.core.metrics starts it. The rate
        is then an upper bound of the level's output tok/s (``exact``): the tokens in it
        have all arrived, and an in-flight request can only take its tokens out by failing.
        Should the drain still make the window degenerate (under ``min_fraction`` of the
        run), the level reports its whole-run rate instead, which is then at most every
        output token the level can still count (``done_tokens`` of finished requests plus
        each in-flight request's max_tokens) over ``window / min_fraction``; the larger of
        the two is returned."""
        exact = last_dispatch is not None
        opened = self.opened
        if opened is None:
            return None
        if exact:
            assert last_dispatch is not None
            now = last_dispatch
            policy = WindowPolicy()
            opened = max(self.first_s + policy.warmup_fraction * (last_dispatch - self.first_s), opened)
            # Timestamps of finished requests alone must keep the window non-degenerate.
            if sum(1 for t, _ in self.points if opened <= t < now) < policy.min_token_timestamps:
                return None
        if now <= opened:
            return None
        points = [pt for pt in self.points if opened <= pt[0] < now]
        for _, st, _ in list(live.values()):
            times, cum = list(st.times), list(st.cumulative)
            if not st.per_chunk_usage or len(cum) != len(times):
                return None   # its tokens per chunk are unknown until it ends
            points.extend((t, b - a) for t, a, b in zip(times, [0, *cum], cum, strict=False)
                          if opened <= t < now)
        window_s = now - opened
        width = window_s / INSIDE_SUBWINDOWS
        sub = [0.0] * INSIDE_SUBWINDOWS
        for t, k in points:
            sub[min(INSIDE_SUBWINDOWS - 1, int((t - opened) / width))] += k
        stable = min(sub) > 0 and max(sub) / min(sub) <= STABILITY_MAX_RATIO
        rate = math.fsum(sub) / window_s
        if exact:
            most = done_tokens + sum(m for _, _, m in live.values())
            rate = max(rate, most * WindowPolicy().min_fraction / window_s)
        assert self.opened is not None
        return {"output_tok_s": rate, "window_s": window_s, "exact": exact,
                "first_wave_s": self.opened - self.first_s, "stable": stable,
                "completed": self.completed, "planned": self.planned}


async def _run_streams(
    lv: _Level,
    plan: Sequence[RequestPlan],
    streams: int,
    claim: Callable[[], int],
    deadline_s: float | None,
    checkpoint: Callable[[dict[str, Any]], bool] | None = None,
) -> dict[int, RequestRecord]:
    """``streams`` closed-loop streams taking plan positions from ``claim`` until the plan
    or the deadline ends. Returns records by plan position (= issue order).

    ``checkpoint(window)``: judged at most every ``INSIDE_CHECK_EVERY_S`` after a request
    finishes, with ``_Window.view``; True ends the level at once, in-flight requests
    cancelled and not recorded."""
    out: dict[int, RequestRecord] = {}
    stop = False
    halted = False
    t0 = lv.t0
    window = _Window(streams, len(plan)) if checkpoint is not None else None
    live: dict[int, tuple[float, _StreamState, int]] | None = {} if checkpoint is not None else None
    last_check = -math.inf
    all_claimed = False         # the last plan position is dispatched: the window is complete
    judged_complete = False

    def judge() -> bool:
        """Rule 4 of tuner.study.early_stop after a request finished: throttled to every
        INSIDE_CHECK_EVERY_S, except the first judgement once the window is complete."""
        nonlocal last_check, halted, stop, judged_complete
        assert window is not None and checkpoint is not None and live is not None
        if len(out) == len(plan):
            return False          # the level is complete: nothing left to save
        now = time.monotonic() - t0
        complete = stop or all_claimed
        if not (complete and not judged_complete) and now - last_check < INSIDE_CHECK_EVERY_S:
            return False
        last_check = now
        ended = None
        if complete:   # nothing more is issued: the level's window ends at its last dispatch
            judged_complete = True
            ended = max([r.dispatch_s for r in out.values()] + [d for d, _, _ in live.values()])
        done_tokens = sum(r.n_output_tokens() for r in out.values() if r.ok)
        view = window.view(now, live, ended, done_tokens)
        if view is None or not checkpoint(view):
            return False
        halted = stop = True
        me = asyncio.current_task()
        for t in tasks:
            if t is not me:
                t.cancel()
        return True

    async def worker() -> None:
        nonlocal stop, all_claimed
        stream = _Stream()
        try:
            while not stop:
                # The moment this stream is free for its next request (vLLM's semaphore
                # acquisition); the deadline is judged on it.
                scheduled_s = time.monotonic() - t0
                if deadline_s is not None and scheduled_s >= deadline_s:
                    stop = True
                    break
                pos = claim()
                if pos >= len(plan):
                    stop = True
                    break
                all_claimed = all_claimed or pos == len(plan) - 1
                out[pos] = await _one_request(lv, stream, plan[pos], scheduled_s, live, pos)
                if window is not None and not halted:
                    window.add(pos, out[pos])
                    if judge():
                        break
        finally:
            stream.close()

    tasks = [asyncio.create_task(worker()) for _ in range(streams)]
    try:
        results = await asyncio.gather(*tasks, return_exceptions=True)
    except BaseException:
        # Cancelled (or a bug): leave no request running behind us.
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    for r in results:
        # Streams cancelled by a halting checkpoint are expected; anything else propagates.
        if isinstance(r, BaseException) and not (halted and isinstance(r, asyncio.CancelledError)):
            raise r
    if halted:
        raise LevelHalted(out)
    return out


class LevelHalted(Exception):
    """A level's checkpoint ended it early (early stop inside a level); carries the records
    of the requests finished by then."""

    def __init__(self, records: dict[int, RequestRecord]) -> None:
        super().__init__("level halted by its checkpoint")
        self.records = [records[i] for i in sorted(records)]


async def run_level(
    base_url: str,
    model: str,
    plan: Sequence[RequestPlan],
    *,
    concurrency: int,
    api: Api,
    deadline_s: float | None,
    request_timeout_s: float,
    headers: dict[str, str] | None = None,
    continuous_usage: bool = True,
    t0: float | None = None,
    processes: int = 1,
    checkpoint: Callable[[dict[str, Any]], bool] | None = None,
) -> list[RequestRecord]:
    """Run ``plan`` in a closed loop of ``concurrency`` streams.

    Args:
        base_url: server root, e.g. ``http://127.0.0.1:8000`` (a trailing ``/v1`` is
            accepted).
        model: served model name sent in every request.
        plan: requests in issue order.
        concurrency: number of concurrent streams C.
        api: ``completions`` or ``chat``.
        deadline_s: no request is issued later than this many seconds after the level
            starts (None: no limit). In-flight requests still finish, each bounded by
            ``request_timeout_s``.
        request_timeout_s: total time allowed per request, stream included.
        headers: extra HTTP headers (e.g. an API key).
        continuous_usage: ask for per-chunk usage (exact tokens per chunk on vLLM).
        t0: ``time.monotonic()`` value the record times are relative to (default: now).
        processes: client processes to shard the streams over (see :mod:`._shards`);
            1 runs every stream in this event loop.
        checkpoint: early stop inside the level (one client process only; ignored when
            sharded): called with the steady-state window so far (``_Window.view``); True
            ends the level and raises :class:`LevelHalted` with the finished records.

    Returns:
        One record per issued request, in issue order.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if request_timeout_s <= 0:
        raise ValueError(f"request_timeout_s must be > 0, got {request_timeout_s}")
    if processes < 1:
        raise ValueError(f"processes must be >= 1, got {processes}")
    url = _root(base_url) + _PATHS[api]
    endpoint = Endpoint.from_url(url)
    if processes > 1 and concurrency > 1:
        from tuner.adapters.loadgen_shards import run_sharded

        records = await run_sharded(
            base_url, model, plan, concurrency=concurrency, api=api, deadline_s=deadline_s,
            request_timeout_s=request_timeout_s, headers=headers,
            continuous_usage=continuous_usage, t0=t0, processes=min(processes, concurrency),
        )
    else:
        lv = _Level(
            endpoint, headers, model, api, concurrency,
            time.monotonic() if t0 is None else t0, request_timeout_s, continuous_usage,
        )
        counter = itertools.count()
        by_pos = await _run_streams(lv, plan, concurrency, counter.__next__, deadline_s, checkpoint)
        records = [by_pos[i] for i in sorted(by_pos)]
    if len(records) < len(plan):
        logger.info(
            "c=%d: deadline %.1fs reached after %d of %d requests",
            concurrency, deadline_s or 0.0, len(records), len(plan),
        )
    return records


@dataclass(frozen=True, slots=True)
class RateRun:
    """What one open-loop run produced: the records (issue order), how many requests
    waited for the in-flight cap, and the most requests in flight at once."""

    records: list[RequestRecord]
    cap_waits: int
    peak_in_flight: int


async def run_rate_level(
    base_url: str,
    model: str,
    plan: Sequence[RequestPlan],
    schedule: Sequence[float],
    *,
    api: Api,
    deadline_s: float | None,
    request_timeout_s: float,
    max_in_flight: int,
    headers: dict[str, str] | None = None,
    continuous_usage: bool = True,
    t0: float | None = None,
) -> RateRun:
    """Run ``plan`` open loop: request i is sent at ``t0 + schedule[i]``.

    The schedule holds absolute times from the level start (``time.monotonic``), so each
    send waits for its own due time, never for a gap after the previous send: a slow
    client or server cannot shift later arrivals. Requests are sent however many are
    still in flight, up to ``max_in_flight`` — a safety cap, not a load shape; a request
    that finds it full waits (counted in ``cap_waits``) and is sent as soon as a slot
    frees, its record keeping the scheduled time (``scheduled_s``) next to the send time
    (``dispatch_s``), so the client-side queueing shows as ``client_queue_ms``.
    Idle keep-alive connections are reused; a new one is opened when none is idle.

    Args:
        schedule: due times in seconds from the level start, one per plan item,
            non-decreasing (:func:`tuner.core.workload.arrival_schedule`).
        deadline_s: no request due at or after this many seconds is sent (None: no limit).
        max_in_flight: the safety cap (>= 1).
        Other arguments as :func:`run_level`.

    Returns:
        :class:`RateRun`; records are in issue order, ``concurrency`` = ``max_in_flight``.
    """
    if len(schedule) != len(plan):
        raise ValueError(f"schedule has {len(schedule)} times for {len(plan)} requests")
    if any(b < a for a, b in zip(schedule, schedule[1:])):
        raise ValueError("schedule must be non-decreasing")
    if max_in_flight < 1:
        raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
    if request_timeout_s <= 0:
        raise ValueError(f"request_timeout_s must be > 0, got {request_timeout_s}")
    endpoint = Endpoint.from_url(_root(base_url) + _PATHS[api])
    lv = _Level(
        endpoint, headers, model, api, max_in_flight,
        time.monotonic() if t0 is None else t0, request_timeout_s, continuous_usage,
    )
    clock = time.monotonic
    idle: list[_Stream] = []
    slots = asyncio.Semaphore(max_in_flight)
    out: dict[int, RequestRecord] = {}
    tasks: list[asyncio.Task[None]] = []
    in_flight = 0
    peak = 0
    cap_waits = 0

    async def send(pos: int, due: float) -> None:
        nonlocal in_flight
        stream = idle.pop() if idle else _Stream()
        try:
            out[pos] = await _one_request(lv, stream, plan[pos], due)
        finally:
            in_flight -= 1
            slots.release()
            if stream.conn is not None and stream.conn.usable:
                idle.append(stream)
            else:
                stream.close()

    try:
        for pos, due in enumerate(schedule):
            if deadline_s is not None and due >= deadline_s:
                break
            delay = lv.t0 + due - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            if slots.locked():
                cap_waits += 1
            await slots.acquire()
            if deadline_s is not None and clock() - lv.t0 >= deadline_s:
                slots.release()  # the cap held it past the deadline: not sent
                break
            in_flight += 1
            peak = max(peak, in_flight)
            tasks.append(asyncio.create_task(send(pos, due)))
        if tasks:
            results = await asyncio.gather(*tasks, return_exceptions=True)
            for r in results:
                if isinstance(r, BaseException):
                    raise r
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    finally:
        for st in idle:
            st.close()
    records = [out[i] for i in sorted(out)]
    if len(records) < len(plan):
        logger.info(
            "open loop: deadline %.1fs reached after %d of %d requests",
            deadline_s or 0.0, len(records), len(plan),
        )
    return RateRun(records=records, cap_waits=cap_waits, peak_in_flight=peak)


async def fetch_token_count(
    client: httpx.AsyncClient, base_url: str, model: str, text: str, *, chat: bool = False
) -> int | None:
    """Token count of ``text`` by the server's ``/tokenize``; None if unavailable.

    With ``chat`` the text is sent as one user message with the generation prompt, so the
    chat template's tokens are counted as the chat endpoint will see them.
    """
    body: dict[str, Any] = {"model": model}
    if chat:
        body["messages"] = [{"role": "user", "content": text}]
        body["add_generation_prompt"] = True
    else:
        body["prompt"] = text
    try:
        resp = await client.post(_root(base_url) + "/tokenize", json=body, timeout=_AUX_TIMEOUT_S)
        if resp.status_code != 200:
            return None
        data = resp.json()
    except (httpx.HTTPError, ValueError) as exc:
        logger.debug("/tokenize failed: %s", exc)
        return None
    if not isinstance(data, dict):
        return None
    count = data.get("count")
    if isinstance(count, int):
        return count
    tokens = data.get("tokens")
    return len(tokens) if isinstance(tokens, list) else None


async def fit_plan(
    client: httpx.AsyncClient,
    base_url: str,
    model: str,
    drafts: Sequence[RequestDraft],
    *,
    ignore_eos: bool,
    api: Api = "completions",
    parallel: int = 8,
) -> list[RequestPlan] | None:
    """Trim every draft to its exact target length with ``/tokenize``.

    Returns None as soon as the endpoint fails, so the caller can fall back to estimates
    for the whole level rather than mixing exact and estimated prompts.
    """
    sem = asyncio.Semaphore(parallel)
    chat = api == "chat"

    async def fit_one(d: RequestDraft) -> RequestPlan | None:
        fitter = TokenFitter(d.draft, d.target_prompt_tokens)
        while (n := fitter.next_probe()) is not None:
            async with sem:
                text = d.draft.render(n)
                count = await fetch_token_count(client, base_url, model, text, chat=chat)
            if count is None:
                return None
            fitter.observe(n, count)
        return d.to_plan(ignore_eos=ignore_eos, prompt=d.draft.render(fitter.result()))

    plans = await asyncio.gather(*(fit_one(d) for d in drafts))
    if any(p is None for p in plans):
        return None
    return [p for p in plans if p is not None]


async def scrape_metrics(client: httpx.AsyncClient, base_url: str) -> MetricsSnapshot | None:
    """Parsed ``/metrics``, or None when the server has no usable metrics endpoint."""
    try:
        resp = await client.get(_root(base_url) + "/metrics", timeout=_AUX_TIMEOUT_S)
    except httpx.HTTPError as exc:
        logger.warning("/metrics unreachable: %s", exc)
        return None
    if resp.status_code != 200:
        return None
    try:
        return parse_prometheus_text(resp.text)
    except ValueError as exc:
        logger.warning("/metrics unparsable: %s", exc)
        return None


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


def write_records_jsonl(path: Path, records: Sequence[RequestRecord]) -> None:
    """Write records one JSON object per line, atomically (a full disk raises ArtifactWriteError)."""
    atomic_write_text(path, "".join(r.model_dump_json() + "\n" for r in records))


def read_records_jsonl(path: Path) -> list[RequestRecord]:
    with path.open(encoding="utf-8") as f:
        return [RequestRecord.model_validate_json(line) for line in f if line.strip()]


def _agreement(records: Sequence[RequestRecord], server: dict[str, Any] | None) -> TokenAgreement:
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


async def run_sweep(
    base_url: str,
    model: str,
    load_spec: LoadSpec,
    *,
    ignore_eos: bool,
    deadline_s: float | None = None,
    headers: dict[str, str] | None = None,
    levels: Sequence[int] | None = None,
    after_level: Callable[[dict[int, dict[str, float]], list[int]], bool] | None = None,
    inside_level: Callable[[int, dict[str, Any], list[int]], bool] | None = None,
) -> SweepResult:
    """Warm up and measure every concurrency level of ``load_spec``.

    Args:
        base_url: server root (see :func:`run_level`).
        model: served model name.
        load_spec: the study's load section.
        ignore_eos: resolved value (``WorkloadSpec.resolve_ignore_eos``).
        deadline_s: budget for the whole sweep in seconds from the call; levels that
            would start after it are skipped and listed. None: only ``max_level_seconds``.
        headers: extra HTTP headers for every call.
        levels: the order to measure ``load_spec.concurrency`` in (default: as configured).
        after_level: called after each measured level with the flat metrics of every level
            measured so far (in measuring order) and the levels still to run; True stops
            the sweep there (tuner.study.early_stop.SweepGuard.after_level). The levels left
            out are listed in ``stopped_levels``.
        inside_level: called during a level's measured run (``repeats: 1``, one client
            process, levels left after it) with the level, its steady-state window so far
            and the levels after it; True ends the level there and stops the sweep
            (tuner.study.early_stop.SweepGuard.inside_level). The halted level is not
            measured: it is listed first in ``stopped_levels``.
    """
    t_start = time.monotonic()
    started_at = datetime.now(UTC).isoformat()
    notes: list[str] = []
    results: list[LevelResult] = []
    skipped: list[int] = []
    stopped: list[int] = []
    order = list(load_spec.concurrency) if levels is None else list(levels)
    if sorted(order) != sorted(load_spec.concurrency):
        raise ValueError(f"levels {order} are not a reordering of {load_spec.concurrency}")

    def budget() -> float | None:
        """Seconds a level may issue for now; None once the sweep budget is spent."""
        if deadline_s is None:
            return load_spec.max_level_seconds
        remaining = deadline_s - (time.monotonic() - t_start)
        return min(load_spec.max_level_seconds, remaining) if remaining > 0 else None

    async with httpx.AsyncClient(timeout=_AUX_TIMEOUT_S, headers=headers) as aux:
        can_fit = False
        if load_spec.fit_prompt_tokens:
            can_fit = await fetch_token_count(aux, base_url, model, "hello") is not None
            if not can_fit:
                notes.append("/tokenize unavailable: prompt lengths are ~1.3 tokens/word estimates")
        sweep = _Sweep(
            aux, base_url, model, load_spec, ignore_eos, can_fit, budget, headers, notes
        )
        for i, c in enumerate(order):
            later = [x for x in order[i + 1:] if x not in skipped]
            check = None
            # Like after_level, only while levels remain: the last level is measured whole.
            if (inside_level is not None and later and load_spec.repeats == 1
                    and load_spec.client_processes == 1):
                def check(view: dict[str, Any], c: int = c, later: list[int] = later) -> bool:
                    return inside_level(c, view, later)
            try:
                result = await _sweep_level(sweep, c, check)
            except LevelHalted:
                stopped = [c, *later]
                break
            if result is None:
                skipped.append(c)
                continue
            results.append(result)
            remaining = [x for x in order[i + 1:] if x not in skipped]
            if after_level is not None and remaining and after_level(
                    {lv.concurrency: lv.metrics.flat() for lv in results}, remaining):
                stopped = remaining
                break
        rate_results: list[LevelResult] = []
        skipped_rates: list[float] = []
        stopped_rates: list[float] = []
        for rate in load_spec.request_rates:
            if stopped:
                # Early stop ended the sweep: the trial is judged already.
                stopped_rates.append(rate)
                continue
            result = await _sweep_rate_level(sweep, rate)
            if result is None:
                skipped_rates.append(rate)
            else:
                rate_results.append(result)
    if skipped:
        notes.append(f"levels {skipped} skipped: sweep budget of {deadline_s}s exhausted")
    if skipped_rates:
        notes.append(
            f"rate levels {skipped_rates} skipped: sweep budget of {deadline_s}s exhausted")
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
        warnings=notes,
        rate_levels=rate_results,
        skipped_rates=skipped_rates,
        stopped_rates=stopped_rates,
    )


@dataclass(frozen=True, slots=True)
class _Sweep:
    """What every level of one sweep shares."""

    aux: httpx.AsyncClient  # for /tokenize and /metrics
    base_url: str
    model: str
    spec: LoadSpec
    ignore_eos: bool
    can_fit: bool
    budget: Callable[[], float | None]  # seconds a level may issue now; None = spent
    headers: dict[str, str] | None
    notes: list[str]  # appended to


async def _plan_for(sw: _Sweep, c: int, repeat: int) -> tuple[list[RequestPlan], bool]:
    """The measured plan of one repeat of a level, fitted to exact lengths when possible.

    Every repeat draws fresh prompts of the same shape (its own seed stream): re-sending
    the same prompts would be served from the prefix cache and inflate later repeats
    (measurement.md §4, vLLM sweep notes).
    """
    spec, ignore_eos = sw.spec, sw.ignore_eos
    purpose = "measure" if repeat == 0 else f"measure-r{repeat}"
    drafts = draft_requests(
        spec.workload, spec.requests_for(c), seed=spec.seed, stream=level_stream(purpose, c)
    )
    plan = None
    if sw.can_fit:
        plan = await fit_plan(
            sw.aux, sw.base_url, sw.model, drafts, ignore_eos=ignore_eos, api=spec.api
        )
        if plan is None:
            sw.notes.append(f"c={c}: /tokenize failed while fitting; prompt lengths estimated")
    if plan is None:
        return [d.to_plan(ignore_eos=ignore_eos) for d in drafts], False
    return plan, True


async def _sweep_level(
    sw: _Sweep, c: int, checkpoint: Callable[[dict[str, Any]], bool] | None = None
) -> LevelResult | None:
    """Fit → warm up → scrape → measure (× repeats) → scrape for one level; None if out
    of budget before anything was measured. ``checkpoint``: see :func:`run_level` (raises
    :class:`LevelHalted` through)."""
    aux, base_url, model, spec = sw.aux, sw.base_url, sw.model, sw.spec
    ignore_eos, budget, headers = sw.ignore_eos, sw.budget, sw.headers
    if budget() is None:
        return None
    plan, fitted = await _plan_for(sw, c, 0)

    warm_budget = budget()
    if warm_budget is None:
        return None
    warmup = await _warm_up(base_url, model, spec, c, ignore_eos, warm_budget, headers)
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
        run = await run_level(
            base_url, model, plan,
            concurrency=c, api=spec.api, deadline_s=level_budget,
            request_timeout_s=spec.request_timeout_s, headers=headers,
            processes=spec.client_processes, checkpoint=checkpoint,
        )
        deadline_hit = deadline_hit or len(run) < len(plan)
        runs.append(compute_level_metrics(run, concurrency=c, planned=len(plan)))
        if repeat:
            run = [r.model_copy(update={"repeat": repeat}) for r in run]
        records.extend(run)
    server, agreement = await _server_view(sw, before, records, f"c={c}")
    # Instability is reported per level (metrics.unstable, stability_ratio), not as a sweep
    # warning: short levels are often flagged, and that is information, not degradation.
    metrics = summarize_repeats(runs)
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


async def _server_view(
    sw: _Sweep, before: MetricsSnapshot | None, records: Sequence[RequestRecord], label: str
) -> tuple[dict[str, Any] | None, TokenAgreement]:
    """Scrape after a level: server-side deltas since ``before`` and the token agreement."""
    aux, base_url = sw.aux, sw.base_url
    after = await scrape_metrics(aux, base_url)
    server = server_side_metrics(before, after) if before and after else None
    agreement = _agreement(records, server)
    if agreement.agree is False and before is not None:
        # vLLM records stats just after handing tokens out; one late scrape rules out a
        # race before a disagreement is reported.
        await asyncio.sleep(1.0)
        late = await scrape_metrics(aux, base_url)
        if late is not None:
            server = server_side_metrics(before, late)
            agreement = _agreement(records, server)
    if agreement.agree is False:
        logger.warning(
            "%s: client/server token counts disagree: %d vs %s",
            label, agreement.client_output_tokens, agreement.server_generation_tokens,
        )
    return server, agreement


async def _rate_plan_for(sw: _Sweep, rate: float, repeat: int) -> tuple[list[RequestPlan], bool]:
    """The measured plan of one repeat of a rate level (own seed stream, see _plan_for)."""
    spec, ignore_eos = sw.spec, sw.ignore_eos
    purpose = "measure" if repeat == 0 else f"measure-r{repeat}"
    drafts = draft_requests(
        spec.workload, spec.requests_for_rate(rate), seed=spec.seed,
        stream=rate_stream(purpose, rate),
    )
    plan = None
    if sw.can_fit:
        plan = await fit_plan(
            sw.aux, sw.base_url, sw.model, drafts, ignore_eos=ignore_eos, api=spec.api
        )
        if plan is None:
            sw.notes.append(
                f"{rate_level_name(rate)}: /tokenize failed while fitting; prompt lengths estimated")
    if plan is None:
        return [d.to_plan(ignore_eos=ignore_eos) for d in drafts], False
    return plan, True


async def _sweep_rate_level(sw: _Sweep, rate: float) -> LevelResult | None:
    """Fit → scrape → measure open loop (× repeats) → scrape for one rate level; None if
    out of budget before anything was measured. No warm-up of its own: rate levels run
    after the concurrency levels, on a server those already warmed (CUDA graphs, JIT),
    and their prompts come from their own seed streams (no prefix-cache warming)."""
    spec = sw.spec
    name = rate_level_name(rate)
    if sw.budget() is None:
        return None
    before = None
    records: list[RequestRecord] = []
    runs: list[LevelMetrics] = []
    fitted = True
    deadline_hit = False
    for repeat in range(spec.repeats):
        plan, fitted_r = await _rate_plan_for(sw, rate, repeat)
        fitted = fitted and fitted_r
        level_budget = sw.budget()
        if level_budget is None:
            if not runs:
                return None
            sw.notes.append(
                f"{name}: {len(runs)} of {spec.repeats} repeats measured before the budget ran out"
            )
            break
        if before is None:
            before = await scrape_metrics(sw.aux, sw.base_url)
        purpose = "measure" if repeat == 0 else f"measure-r{repeat}"
        schedule = arrival_schedule(
            len(plan), rate, arrival=spec.arrival, burstiness=spec.burstiness,
            seed=spec.seed, stream=rate_stream(purpose, rate),
        )
        run = await run_rate_level(
            sw.base_url, sw.model, plan, schedule,
            api=spec.api, deadline_s=level_budget, request_timeout_s=spec.request_timeout_s,
            max_in_flight=spec.max_in_flight, headers=sw.headers,
        )
        if run.cap_waits:
            sw.notes.append(
                f"{name}: {run.cap_waits} requests waited for the in-flight cap "
                f"(max_in_flight={spec.max_in_flight}); the arrival rate was not held"
            )
        deadline_hit = deadline_hit or len(run.records) < len(plan)
        runs.append(rate_level_metrics(run, rate, cap=spec.max_in_flight, planned=len(plan)))
        recs = run.records
        if repeat:
            recs = [r.model_copy(update={"repeat": repeat}) for r in recs]
        records.extend(recs)
    server, agreement = await _server_view(sw, before, records, name)
    return LevelResult(
        concurrency=spec.max_in_flight,
        request_rate=rate,
        prompts_fitted=fitted,
        deadline_hit=deadline_hit,
        warmup=WarmupSummary(requests=0, completed=0, failed=0, failure_reasons={},
                             duration_s=0.0),
        metrics=summarize_repeats(runs),
        server_side=server,
        token_agreement=agreement,
        records=records,
    )


def rate_level_metrics(run: RateRun, rate: float, *, cap: int, planned: int | None = None
                       ) -> LevelMetrics:
    """:func:`compute_level_metrics` of an open-loop run, with its rate-level fields."""
    metrics = compute_level_metrics(run.records, concurrency=cap, planned=planned, first_wave=1)
    return metrics.model_copy(update={
        "request_rate": rate, "cap_waits": run.cap_waits, "peak_in_flight": run.peak_in_flight,
    })


async def _warm_up(
    base_url: str,
    model: str,
    spec: LoadSpec,
    concurrency: int,
    ignore_eos: bool,
    budget_s: float,
    headers: dict[str, str] | None,
) -> WarmupSummary:
    n = spec.warmup_for(concurrency)
    # A separate seed stream: warming the prefix or suffix cache with the measured
    # prompts would inflate the level's numbers (measurement.md §4.4, §6).
    plan = [
        d.to_plan(ignore_eos=ignore_eos)
        for d in draft_requests(
            spec.workload, n, seed=spec.seed, stream=level_stream("warmup", concurrency)
        )
    ]
    t = time.monotonic()
    records = (
        await run_level(
            base_url, model, plan,
            concurrency=concurrency, api=spec.api, deadline_s=budget_s,
            request_timeout_s=spec.request_timeout_s, headers=headers,
            processes=spec.client_processes,
        )
        if plan
        else []
    )
    failed = [r for r in records if not r.ok]
    return WarmupSummary(
        requests=len(records),
        completed=len(records) - len(failed),
        failed=len(failed),
        failure_reasons=dict(Counter(r.error.type if r.error else "unknown" for r in failed)),
        duration_s=time.monotonic() - t,
    )
