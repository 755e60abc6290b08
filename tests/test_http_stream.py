"""The load generator's HTTP/1.1 streaming client, byte level (no sockets)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tuner.load.http_stream import (
    Endpoint,
    HttpConnectError,
    HttpProtocolError,
    StreamConnection,
)


class FakeTransport:
    def __init__(self) -> None:
        self.written = b""
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.written += data

    def abort(self) -> None:
        self.aborted = True


def run(pieces: list[bytes], *, stop_on: bytes | None = None, lose: bool = False,
        headers: dict[str, str] | None = None) -> dict[str, Any]:
    """POST once, feed ``pieces`` as socket reads; what came out."""

    async def go() -> dict[str, Any]:
        conn = StreamConnection(Endpoint.from_url("http://example.test:8000/v1/completions"),
                                headers)
        tr = FakeTransport()
        conn.connection_made(tr)  # type: ignore[arg-type]
        body = bytearray()
        stamps: list[float] = []

        def sink(payload: bytes, now: float) -> bool:
            body.extend(payload)
            stamps.append(now)
            return stop_on is not None and stop_on in payload

        task = asyncio.ensure_future(conn.post(b'{"a":1}', sink))
        await asyncio.sleep(0)
        for p in pieces:
            conn.data_received(p)
        if lose:
            conn.connection_lost(None)
        out: dict[str, Any] = {"conn": conn, "transport": tr, "body": bytes(body),
                               "stamps": stamps}
        try:
            out["status"] = await asyncio.wait_for(task, 2)
        except Exception as exc:
            out["error"] = exc
        return out

    return asyncio.run(go())


def test_request_bytes() -> None:
    out = run([b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"],
              headers={"Authorization": "Bearer k"})
    sent = out["transport"].written
    head, _, body = sent.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /v1/completions HTTP/1.1"
    assert b"Host: example.test:8000" in lines
    assert b"Content-Length: 7" in lines and b"Authorization: Bearer k" in lines
    assert b"Accept-Encoding: identity" in lines
    assert body == b'{"a":1}'
    assert out["status"] == 200 and out["body"] == b"ok"
    assert out["conn"].usable  # keep-alive: ready for the next request


def test_endpoint_parsing() -> None:
    ep = Endpoint.from_url("https://h.example/proxy/v1/chat/completions?x=1")
    assert (ep.host, ep.port, ep.tls, ep.path, ep.host_header) == (
        "h.example", 443, True, "/proxy/v1/chat/completions?x=1", "h.example")
    assert Endpoint.from_url("http://[::1]:81/v1").host_header == "[::1]:81"
    with pytest.raises(ValueError):
        Endpoint.from_url("ftp://x/")


def test_chunked_with_extensions_trailers_and_a_split_size_line() -> None:
    out = run([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhel",
               b"lo\r\n", b"1", b"\r\n!\r\n0\r\nX-Trailer: y\r\n", b"\r\n"])
    assert out["status"] == 200 and out["body"] == b"hello!"
    assert out["conn"].usable


def test_one_timestamp_per_read() -> None:
    out = run([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n2\r\ncd\r\n",
               b"2\r\nef\r\n0\r\n\r\n"])
    assert out["body"] == b"abcdef"
    assert len(out["stamps"]) == 2  # two reads → two deliveries, however many chunks


def test_interim_100_continue_then_the_response() -> None:
    out = run([b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx"])
    assert out["status"] == 200 and out["body"] == b"x"


def test_error_status_body_is_collected_not_streamed() -> None:
    out = run([b"HTTP/1.1 400 Bad Request\r\nContent-Length: 13\r\n\r\n{\"error\":\"x\"}"])
    assert out["status"] == 400 and out["body"] == b""
    assert out["conn"].error_body == b'{"error":"x"}'


def test_an_error_body_is_read_up_to_its_cap_and_no_further() -> None:
    # A 100 MB error page: the request ends at 64 KiB, the connection is dropped unread.
    head = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 100000000\r\n\r\n"
    out = run([head + b"<html>" + b"x" * 65536, b"y" * 65536])
    assert out["status"] == 500 and len(out["conn"].error_body) == 64 * 1024
    assert out["conn"].error_body.startswith(b"<html>")
    assert out["transport"].aborted and not out["conn"].usable


def test_body_until_close_and_connection_close_header() -> None:
    out = run([b"HTTP/1.0 200 OK\r\n\r\nsome", b" data"], lose=True)
    assert out["status"] == 200 and out["body"] == b"some data"
    assert not out["conn"].usable
    out = run([b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\nx"])
    assert out["status"] == 200 and not out["conn"].usable and out["transport"].aborted


def test_close_mid_response_is_a_protocol_error() -> None:
    out = run([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhe"], lose=True)
    assert isinstance(out["error"], HttpProtocolError)
    assert "mid-response" in str(out["error"])
    out = run([], lose=True)
    assert isinstance(out["error"], HttpProtocolError)
    assert "before the response head" in str(out["error"])


@pytest.mark.parametrize("bad", [
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\naXX",
    b"garbage\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 1\r\n\r\nx",
])
def test_broken_framing_fails_the_request_and_closes(bad: bytes) -> None:
    out = run([bad])
    assert isinstance(out["error"], HttpProtocolError)
    assert out["transport"].aborted and not out["conn"].usable


def test_sink_can_end_the_request() -> None:
    out = run([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nSTOP\r\n",
               b"4\r\nmore\r\n0\r\n\r\n"], stop_on=b"STOP")
    assert out["status"] == 200 and out["body"] == b"STOP"
    assert out["transport"].aborted and not out["conn"].usable


def test_connect_refused_is_a_connect_error() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

        async def go() -> None:
            conn = StreamConnection(Endpoint.from_url(f"http://127.0.0.1:{port}/v1/completions"))
            await conn.connect(2.0)

        with pytest.raises(HttpConnectError):
            asyncio.run(go())
