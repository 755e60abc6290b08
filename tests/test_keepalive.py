"""Idle keep-alive connections and the server's close: the race that failed CI's reference probe.

uvicorn (vLLM's HTTP server) closes a connection idle for its keep-alive timeout; a request
written onto it at that moment is answered with a TCP reset. The server below makes that
race deterministic: a request arriving on a connection idle longer than ``SERVER_KEEP_ALIVE``
is reset (RST, SO_LINGER 0) instead of answered. The clients must never lose a request to
it: they give idle connections up first (``IDLE_REUSE_LIMIT_S``), and the probe sends a
reset request once more. The controls with the limit switched off show the server does
reset, so these tests can fail.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import httpx
import pytest

import tuner.adapters.http_client as http_client
import tuner.load.http_stream as http_stream
import tuner.probe.http as probe_http
from tuner.load.request import LevelContext, Stream, one_request
from tuner.load.workload import RequestPlan
from tuner.probe.spec import ProbeSpec

SERVER_KEEP_ALIVE = 0.4  # the server's idle timeout, scaled down from uvicorn's 5 s
CLIENT_LIMIT = 0.2       # the client's idle limit, scaled the same way (2 s against 5 s)
GAP = 0.3                # idle time between requests: past the client's limit, not the server's
STALE = 0.5              # past the server's timeout too (the server resets, never closes first)
NEVER = 1e9

_SSE = (
    b'data: {"id":"x","object":"text_completion","choices":[{"index":0,"text":"hi",'
    b'"finish_reason":null}]}\n\n'
    b'data: {"id":"x","object":"text_completion","choices":[{"index":0,"text":"",'
    b'"finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":1,'
    b'"total_tokens":4}}\n\n'
    b"data: [DONE]\n\n"
)


@dataclass
class Counts:
    connections: int = 0
    answered: int = 0
    resets: int = 0
    reset_all: bool = False
    seen: list[float] = field(default_factory=list)


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@asynccontextmanager
async def keepalive_server(counts: Counts) -> AsyncIterator[str]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        counts.connections += 1
        idle_since = time.monotonic()
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if counts.reset_all or time.monotonic() - idle_since > SERVER_KEEP_ALIVE:
                    counts.resets += 1
                    _reset(writer)
                    return
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                body = await reader.readexactly(length)
                if b'"stream": true' in body or b'"stream":true' in body:
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                 b"Transfer-Encoding: chunked\r\n\r\n")
                    writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(_SSE), _SSE))
                else:
                    payload = json.dumps({"ok": True}).encode()
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload))
                await writer.drain()
                counts.answered += 1
                idle_since = time.monotonic()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            writer.close()  # the client went away, or the test ended

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()


def _plan(i: int) -> RequestPlan:
    return RequestPlan(index=i, class_name="c", kind="open_ended", prompt="hello", max_tokens=1,
                       ignore_eos=True, target_prompt_tokens=3)


async def _load_requests(n: int, counts: Counts, gap: float = GAP) -> list[str | None]:
    async with keepalive_server(counts) as url:
        lv = LevelContext.create(url, "m", "completions", concurrency=1,
                                 request_timeout_s=5, headers=None, continuous_usage=True)
        stream = Stream()
        errors = []
        for i in range(n):
            if i:
                await asyncio.sleep(gap)
            record = await one_request(lv, stream, _plan(i), 0.0)
            errors.append(None if record.error is None else record.error.type)
        stream.close()
        return errors


def test_load_generator_gives_up_idle_connections_before_the_server_does(monkeypatch) -> None:
    monkeypatch.setattr(http_stream, "IDLE_REUSE_LIMIT_S", CLIENT_LIMIT)
    counts = Counts()
    errors = asyncio.run(_load_requests(3, counts))
    assert errors == [None, None, None]
    assert counts.resets == 0 and counts.answered == 3
    assert counts.connections == 3  # each idle connection was given up and a new one opened


def test_load_generator_reuses_a_connection_inside_the_limit(monkeypatch) -> None:
    monkeypatch.setattr(http_stream, "IDLE_REUSE_LIMIT_S", 10.0)
    counts = Counts()

    async def go() -> list[str | None]:
        async with keepalive_server(counts) as url:
            lv = LevelContext.create(url, "m", "completions", concurrency=1,
                                     request_timeout_s=5, headers=None, continuous_usage=True)
            stream = Stream()
            out = []
            for i in range(3):
                record = await one_request(lv, stream, _plan(i), 0.0)
                out.append(None if record.error is None else record.error.type)
            stream.close()
            return out

    assert asyncio.run(go()) == [None, None, None]
    assert counts.connections == 1  # keep-alive still works for back-to-back requests


def test_control_without_the_limit_the_load_generator_loses_requests(monkeypatch) -> None:
    monkeypatch.setattr(http_stream, "IDLE_REUSE_LIMIT_S", NEVER)
    counts = Counts()
    errors = asyncio.run(_load_requests(2, counts, STALE))
    assert errors[0] is None and errors[1] == "connection_error"
    assert counts.resets == 1


def _spec() -> ProbeSpec:
    return ProbeSpec()


async def _probe_posts(n: int, counts: Counts, gap: float = GAP) -> list[object]:
    async with keepalive_server(counts) as url:
        async with probe_http.make_client(url, None, _spec(), 1) as client:
            out: list[object] = []
            for i in range(n):
                if i:
                    await asyncio.sleep(gap)
                try:
                    out.append(await probe_http.post_json(client, "/v1/completions", {}, 5.0))
                except ValueError as exc:
                    out.append(str(exc))
            return out


def test_probe_client_gives_up_idle_connections_before_the_server_does(monkeypatch) -> None:
    monkeypatch.setattr(http_client, "IDLE_REUSE_LIMIT_S", CLIENT_LIMIT)
    counts = Counts()
    assert asyncio.run(_probe_posts(3, counts)) == [{"ok": True}] * 3
    assert counts.resets == 0 and counts.connections == 3


def test_probe_resends_a_request_reset_on_a_stale_connection(monkeypatch) -> None:
    # httpx's own default idle expiry equals uvicorn's timeout: the race CI lost. With the
    # limit off, the reset happens; the probe's second attempt on a new connection answers.
    monkeypatch.setattr(http_client, "IDLE_REUSE_LIMIT_S", NEVER)
    counts = Counts()
    assert asyncio.run(_probe_posts(3, counts, STALE)) == [{"ok": True}] * 3
    assert counts.resets == 2 and counts.answered == 3


def test_probe_reports_both_attempts_when_the_server_keeps_resetting() -> None:
    counts = Counts(reset_all=True)
    [message] = asyncio.run(_probe_posts(1, counts))
    assert counts.resets == 2
    assert isinstance(message, str)
    assert message.startswith("ReadError: ") and "after ReadError" in message
    assert "first attempt" in message


def test_probe_does_not_resend_a_timeout(monkeypatch) -> None:
    calls = 0

    async def slow(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        raise httpx.ReadTimeout("slow", request=request)

    async def go() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(slow),
                                     base_url="http://x") as client:
            with pytest.raises(ValueError, match="timeout after 1.0 s"):
                await probe_http.post_json(client, "/v1/completions", {}, 1.0)

    asyncio.run(go())
    assert calls == 1
