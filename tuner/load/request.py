"""One streamed request end to end over a stream's keep-alive connection.

The POST goes through :mod:`tuner.load.http_stream`, a small asyncio HTTP/1.1 client:
response bytes are de-chunked and parsed (:class:`tuner.load.sse.SSEParser`) inside the
protocol's ``data_received`` with one timestamp per socket read, so a token costs no
coroutine switch. httpx, whose per-chunk overhead capped the generator near 8,000 tokens/s
at 64 streams (benchmarks/client_capacity.py), remains the client for ``/tokenize`` and
``/metrics`` (:mod:`tuner.load.server_calls`).

Failures never escape a request: a non-200 status, an error event mid-stream, a reset
connection or a timeout becomes a record with ``ok=False`` and a typed reason; only
cancellation propagates. Times are ``time.monotonic()`` seconds since the level start
(CLOCK_MONOTONIC: one clock for every process, so sharded clients share a time base).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from tuner.load.http_stream import (
    Endpoint,
    HttpConnectError,
    HttpProtocolError,
    StreamConnection,
)
from tuner.load.load_spec import Api
from tuner.load.protocol import (
    API_PATHS,
    Live,
    StreamState,
    encode_body,
    make_record,
    request_body,
    server_root,
)
from tuner.load.records import RequestError, RequestRecord
from tuner.load.sse import SSEParser
from tuner.load.workload import RequestPlan

__all__ = ["AUX_TIMEOUT_S", "LevelContext", "Stream", "one_request"]

logger = logging.getLogger(__name__)

# Auxiliary calls (connect, /tokenize, /metrics) are small; a server that needs longer is
# unwell.
AUX_TIMEOUT_S = 30.0

@dataclass(frozen=True, slots=True)
class LevelContext:
    """What every request of one level (or one shard of it) shares."""

    endpoint: Endpoint
    headers: dict[str, str] | None
    model: str
    api: Api
    concurrency: int
    t0: float  # time.monotonic() at the level start; records are relative to it
    request_timeout_s: float
    continuous_usage: bool

    @classmethod
    def create(
        cls, base_url: str, model: str, api: Api, *, concurrency: int,
        request_timeout_s: float, headers: dict[str, str] | None, continuous_usage: bool,
    ) -> LevelContext:
        """The context for ``api`` on the server at ``base_url``, its time base now."""
        endpoint = Endpoint.from_url(server_root(base_url) + API_PATHS[api])
        return cls(endpoint, headers, model, api, concurrency,
                   time.monotonic(), request_timeout_s, continuous_usage)


class Stream:
    """One stream's keep-alive connection, reused request after request."""

    __slots__ = ("conn",)

    def __init__(self) -> None:
        self.conn: StreamConnection | None = None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def _body(lv: LevelContext, item: RequestPlan, replies: list[str] | None) -> tuple[bytes, int]:
    """The POST body, and the prompt characters it carries (every message of a conversation)."""
    payload = request_body(lv.model, item, lv.api, lv.continuous_usage, replies or ())
    chars = (sum(len(m["content"]) for m in payload["messages"]) if "messages" in payload
             else len(item.prompt))
    return encode_body(payload), chars


async def one_request(
    lv: LevelContext, stream: Stream, item: RequestPlan, scheduled_s: float,
    live: Live | None = None, pos: int = 0, replies: list[str] | None = None,
) -> RequestRecord:
    """Send ``item`` on ``stream`` and record it; ``live`` (if given) holds it while in
    flight under ``pos``. ``replies``: the server's replies to the earlier turns of the
    item's conversation (sent in place of the dataset's); this reply is appended to it when
    the request succeeded and a later turn follows."""
    clock = time.monotonic
    t0 = lv.t0
    request_timeout_s = lv.request_timeout_s
    follows = replies is not None and item.turn + 1 < item.turns
    st = StreamState(chat=lv.api == "chat", keep_reply=follows)
    parser = SSEParser()
    feed = parser.feed
    on_events = st.on_events
    status: int | None = None
    error: RequestError | None = None

    def sink(payload: bytes, now: float) -> bool:
        on_events(feed(payload), now - t0)
        return st.error is not None  # an error event ends the request; drop the rest

    body, sent_chars = _body(lv, item, replies)
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
                await conn.connect(min(request_timeout_s, AUX_TIMEOUT_S))
            status = await conn.post(body, sink)
        if status != 200:
            text = conn.error_body[:500].decode("utf-8", "replace")
            error = RequestError(type="http_status", message=f"HTTP {status}: {text}")
        else:
            if st.error is None:
                on_events(parser.close(), clock() - t0)
            error = st.error
            if error is None and not st.times and "event-stream" not in conn.content_type:
                # A proxy's login page or an API that ignored "stream": named, not "empty".
                error = RequestError(type="malformed_stream", message=(
                    f"a {conn.content_type or 'Content-Type-less'} reply, not an event stream"))
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
    if follows and error is None and st.reply is not None and replies is not None:
        replies.append("".join(st.reply))
    return make_record(st, item, concurrency=lv.concurrency, scheduled_s=scheduled_s,
                       dispatch_s=dispatch_s, done_s=done_s, error=error, status=status,
                       prompt_chars=sent_chars)
