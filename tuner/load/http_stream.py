"""A minimal asyncio HTTP/1.1 client for the load generator's streamed POSTs.

Why not httpx here: profiling the generator against an instant server showed httpx's
stack (httpcore's pool bookkeeping, h11's event machine, an ``await`` and several
generator frames per received chunk, and httpcore re-attempting ``import sniffio`` on every
request when it is not installed) using more than half of the client's CPU; at 64 streams
it capped the client near 8,000 tokens/s on one core, far below what a fast server emits
(benchmarks/client_capacity.py). This client is an :class:`asyncio.Protocol`: the body is
de-chunked and handed to a callback inside ``data_received``, with one timestamp per
socket read, so a streamed token costs no coroutine switch at all. httpx remains the
client for everything else (``/tokenize``, ``/metrics``, the probe).

Scope, deliberately small: one request at a time per connection (keep-alive, no
pipelining), ``Content-Length`` request bodies, responses framed by chunked transfer
encoding, ``Content-Length`` or connection close, no compression (``Accept-Encoding:
identity`` is sent), http and https, no proxies (a benchmark talks to the server
directly), no redirects.
"""

from __future__ import annotations

import asyncio
import ssl as _ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from tuner.load.protocol import IDLE_REUSE_LIMIT_S

__all__ = ["Endpoint", "HttpConnectError", "HttpProtocolError", "StreamConnection"]

_MAX_HEAD = 64 * 1024
_MAX_ERROR_BODY = 64 * 1024


class HttpConnectError(OSError):
    """The TCP (or TLS) connection could not be opened."""


class HttpProtocolError(Exception):
    """The server broke HTTP/1.1 framing or closed the connection mid-response."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where requests go: parsed once per level from a URL."""

    host: str
    port: int
    tls: bool
    path: str  # request target, e.g. /v1/completions
    host_header: str

    @classmethod
    def from_url(cls, url: str) -> Endpoint:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"unsupported URL scheme in {url!r} (http or https)")
        if not parts.hostname:
            raise ValueError(f"no host in URL {url!r}")
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        default = port == (443 if tls else 80)
        host = parts.hostname
        shown = f"[{host}]" if ":" in host else host
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        return cls(host, port, tls, path, shown if default else f"{shown}:{port}")


BodySink = Callable[[bytes, float], bool | None]
"""Called with each piece of de-chunked response body and the monotonic time it was read.
A true return value ends the request there: the connection is closed (the rest of the
response is not wanted, e.g. after an error event) and :meth:`StreamConnection.post`
returns normally."""

_HEAD, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_CRLF, _TRAILER, _LENGTH, _UNTIL_CLOSE, _IDLE = range(8)


class StreamConnection(asyncio.Protocol):
    """One keep-alive connection; :meth:`post` sends a request and streams its answer."""

    def __init__(self, endpoint: Endpoint, headers: Mapping[str, str] | None = None) -> None:
        self.endpoint = endpoint
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._head_prefix = (
            f"POST {endpoint.path} HTTP/1.1\r\nHost: {endpoint.host_header}\r\n"
            "Content-Type: application/json\r\nAccept: text/event-stream\r\n"
            f"Accept-Encoding: identity\r\nConnection: keep-alive\r\n{extra}"
        ).encode("latin-1")
        self._transport: asyncio.Transport | None = None
        self._closed = True
        self._state = _IDLE
        self._buf = b""
        self._remaining = 0
        self._keep_alive = True
        self._sink: BodySink | None = None
        self._done: asyncio.Future[None] | None = None
        self._head_seen: asyncio.Future[int] | None = None
        self.status = 0
        self.content_type = ""  # of the last response, as sent
        self._error_body = bytearray()
        self._idle_since = 0.0  # time.monotonic() when the last response ended

    # -- lifecycle ----------------------------------------------------------------------

    @property
    def usable(self) -> bool:
        """Open, idle, and idle for less than ``IDLE_REUSE_LIMIT_S``: can carry the next
        request without racing the server's keep-alive close."""
        return self._open_idle and time.monotonic() - self._idle_since < IDLE_REUSE_LIMIT_S

    @property
    def _open_idle(self) -> bool:
        return not self._closed and self._state == _IDLE and self._keep_alive

    async def connect(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        ep = self.endpoint
        ctx = _ssl.create_default_context() if ep.tls else None
        try:
            async with asyncio.timeout(timeout):
                await loop.create_connection(
                    lambda: self, ep.host, ep.port, ssl=ctx,
                    server_hostname=ep.host if ctx else None,
                )
        except TimeoutError as exc:
            raise HttpConnectError(f"connect to {ep.host}:{ep.port} timed out after {timeout}s") from exc
        except OSError as exc:
            raise HttpConnectError(f"cannot connect to {ep.host}:{ep.port}: {exc}") from exc

    def close(self) -> None:
        """Drop the connection now (also mid-response: that aborts the request)."""
        tr = self._transport
        self._closed = True
        if tr is not None:
            tr.abort()
            self._transport = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._closed = False
        self._state = _IDLE
        self._keep_alive = True
        self._idle_since = time.monotonic()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._transport = None
        if self._state == _UNTIL_CLOSE and exc is None:
            self._finish()
            return
        if self._state != _IDLE:
            where = "before the response head" if self._state == _HEAD else "mid-response"
            err = HttpProtocolError(
                f"server closed the connection {where}" + (f": {exc}" if exc else "")
            )
            self._state = _IDLE
            self._fail(err)

    # -- one request --------------------------------------------------------------------

    async def post(self, body: bytes, sink: BodySink) -> int:
        """Send ``body`` and feed the response body to ``sink`` until it ends.

        Returns the HTTP status. For a status other than 200 the body is not streamed to
        ``sink``; it is collected (up to 64 KiB, then the connection is dropped) and
        available as :attr:`error_body`.

        Raises:
            HttpProtocolError: the server closed the connection or broke the framing.
            asyncio.CancelledError / TimeoutError from an enclosing timeout: the connection
                is closed (a half-read response cannot be resumed).
        """
        if not self._open_idle or self._transport is None:
            raise HttpProtocolError("connection is not open and idle")
        loop = asyncio.get_running_loop()
        self._sink = sink
        self._done = loop.create_future()
        self._head_seen = None
        self._buf = b""
        self._error_body.clear()
        self.status = 0
        self.content_type = ""
        self._state = _HEAD
        self._transport.write(
            self._head_prefix + b"Content-Length: %d\r\n\r\n" % len(body) + body
        )
        try:
            await self._done
        except BaseException:
            if self._state != _IDLE:
                self.close()
                self._state = _IDLE
            raise
        finally:
            self._sink = None
            self._done = None
        return self.status

    @property
    def error_body(self) -> bytes:
        return bytes(self._error_body)

    # -- parsing --------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        try:
            if self._state == _HEAD:
                self._buf += data
                while self._state == _HEAD:  # a 1xx interim head may precede the real one
                    end = self._buf.find(b"\r\n\r\n")
                    if end < 0:
                        if len(self._buf) > _MAX_HEAD:
                            raise HttpProtocolError("response head larger than 64 KiB")
                        return
                    head, data = self._buf[:end], self._buf[end + 4:]
                    self._buf = data
                    self._parse_head(head)
                self._buf = b""
                if self._state == _IDLE:  # no body (e.g. Content-Length: 0)
                    return
                if not data:
                    return
            state = self._state
            if state == _CHUNK_SIZE or state == _CHUNK_DATA or state == _CHUNK_CRLF or state == _TRAILER:
                self._chunked(data, now)
            elif state == _LENGTH:
                take = data[: self._remaining]
                self._remaining -= len(take)
                if len(take) < len(data):
                    raise HttpProtocolError("bytes after the end of a Content-Length body")
                self._deliver(take, now)
                if self._remaining == 0:
                    self._finish()
            elif state == _UNTIL_CLOSE:
                self._deliver(data, now)
            else:
                # Bytes while idle: the server broke the framing of the previous response.
                self._keep_alive = False
        except HttpProtocolError as exc:
            self._fail(exc)
            self.close()
        except Exception as exc:  # a bug in a sink must not leave the request hanging
            self._fail(exc)
            self.close()

    def _parse_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        status_line = lines[0].split(None, 2)
        if len(status_line) < 2 or not status_line[0].startswith(b"HTTP/1."):
            raise HttpProtocolError(f"bad status line {lines[0][:100]!r}")
        try:
            self.status = int(status_line[1])
        except ValueError:
            raise HttpProtocolError(f"bad status line {lines[0][:100]!r}") from None
        if 100 <= self.status < 200:
            # Interim response (100 Continue): the real head follows.
            self._state = _HEAD
            self.status = 0
            return
        chunked = False
        length: int | None = None
        self._keep_alive = status_line[0] != b"HTTP/1.0"
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"content-length":
                try:
                    length = int(value.strip())
                except ValueError:
                    raise HttpProtocolError(f"bad Content-Length {value[:40]!r}") from None
            elif name == b"connection":
                v = value.strip().lower()
                if v == b"close":
                    self._keep_alive = False
                elif v == b"keep-alive":
                    self._keep_alive = True
            elif name == b"content-type":
                self.content_type = value.strip()[:100].decode("latin-1")
            elif name == b"content-encoding" and value.strip().lower() not in (b"identity", b""):
                raise HttpProtocolError(f"compressed response ({value.strip().decode()!r})")
        if chunked:
            self._state = _CHUNK_SIZE
        elif length is not None:
            self._remaining = length
            self._state = _LENGTH
            if length == 0:
                self._finish()
        else:
            self._keep_alive = False
            self._state = _UNTIL_CLOSE

    def _chunked(self, data: bytes, now: float) -> None:
        """De-chunk one socket read of a ``Transfer-Encoding: chunked`` body and deliver it.

        Long because it runs once per socket read at tens of thousands of reads per second,
        and a helper call per chunk costs measurably (benchmarks/client_capacity.py).
        """
        buf = self._buf + data if self._buf else data
        self._buf = b""
        pos = 0
        n = len(buf)
        out: list[bytes] = []
        state = self._state
        if state == _CHUNK_SIZE:
            # Fast path: whole "size CRLF payload CRLF" chunks, as a streaming server
            # writes them (one SSE event each). Anything unusual -- a chunk extension, a
            # chunk cut by the read, the last chunk -- drops to the general loop below.
            find = buf.find
            while True:
                eol = find(b"\r\n", pos)
                if eol < 0:
                    break
                try:
                    size = int(buf[pos:eol], 16)
                except ValueError:
                    break
                end = eol + 2 + size
                if size <= 0 or end + 2 > n or not buf.startswith(b"\r\n", end):
                    break
                out.append(buf[eol + 2:end])
                pos = end + 2
        while pos < n:
            if state == _CHUNK_SIZE:
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    if n - pos > 1024:
                        raise HttpProtocolError("chunk size line too long")
                    break
                field = buf[pos:eol]
                semi = field.find(b";")
                if semi >= 0:
                    field = field[:semi]
                try:
                    size = int(field, 16)
                except ValueError:
                    size = -1
                if size < 0:
                    raise HttpProtocolError(f"bad chunk size {field[:40]!r}")
                pos = eol + 2
                if size == 0:
                    state = _TRAILER
                    continue
                self._remaining = size
                state = _CHUNK_DATA
            elif state == _CHUNK_DATA:
                end = pos + self._remaining
                if end <= n:
                    out.append(buf[pos:end])
                    self._remaining = 0
                    pos = end
                    state = _CHUNK_CRLF
                else:
                    out.append(buf[pos:])
                    self._remaining = end - n
                    pos = n
            elif state == _CHUNK_CRLF:
                if n - pos < 2:
                    break
                if buf[pos] != 13 or buf[pos + 1] != 10:
                    raise HttpProtocolError("chunk not terminated by CRLF")
                pos += 2
                state = _CHUNK_SIZE
            else:  # _TRAILER: trailer fields, then an empty line
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    break
                empty = eol == pos
                pos = eol + 2
                if empty:
                    if pos < n:
                        self._keep_alive = False  # unexpected bytes after the response
                    self._state = state
                    if out:
                        self._deliver(out[0] if len(out) == 1 else b"".join(out), now)
                    self._finish()
                    return
        self._state = state
        if pos < n:
            self._buf = buf[pos:]
        if out:
            self._deliver(out[0] if len(out) == 1 else b"".join(out), now)

    def _deliver(self, payload: bytes, now: float) -> None:
        if self.status == 200:
            sink = self._sink
            if sink is not None and sink(payload, now):
                self._keep_alive = False
                self._finish()
        else:
            room = _MAX_ERROR_BODY - len(self._error_body)
            self._error_body += payload[:room]
            if len(payload) >= room:
                # Enough to say what went wrong; the rest of an error page (however many
                # megabytes) is not read, so a bad status costs no more than its cap.
                self._keep_alive = False
                self._finish()

    def _finish(self) -> None:
        self._state = _IDLE
        self._idle_since = time.monotonic()
        done = self._done
        if done is not None and not done.done():
            done.set_result(None)
        if not self._keep_alive:
            self.close()

    def _fail(self, exc: BaseException) -> None:
        self._state = _IDLE
        self._keep_alive = False
        done = self._done
        if done is not None and not done.done():
            done.set_exception(exc)
