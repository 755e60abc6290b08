"""An OpenAI-compatible streaming server that answers as fast as one core allows.

For measuring the *client*: every response is ``max_tokens`` one-token SSE chunks in
vLLM's exact shape (``/v1/completions`` and ``/v1/chat/completions``, ``include_usage``
usage-only last chunk, ``continuous_usage_stats`` when asked, ``data: [DONE]``), framed as
HTTP/1.1 chunked transfer encoding the way uvicorn frames vLLM's streams. The chunks of a
response are pre-encoded once per shape and cached, so the server does no JSON work per
token: per chunk it does one ``transport.write``.

Pacing: with ``--delay-ms 0`` each stream writes its next chunk from ``loop.call_soon``, so
concurrent streams interleave round-robin (like a batched decode step emitting one token
per running request) and a client that keeps up sees about one event per read.
``--burst N`` writes N chunks per step instead (still one token per SSE chunk), so that
the server, not only the client, can go faster than ~100k chunks/s on one core. With a
delay, chunk *i* is written at ``first_send + i * delay`` on an absolute schedule, so the
server's own inter-chunk time is exactly the delay on average whatever the timer jitter.

Per request it records ``(recv, first_send, last_send, chunks)`` in CLOCK_MONOTONIC
seconds (system-wide on Linux, so a client in another process can subtract its own
``time.monotonic()`` readings); ``GET /stats`` returns and clears them, keyed by the
request's ``user`` field or else its prompt.

Run: ``python benchmarks/instant_server.py --port 8123 [--cpu 1] [--delay-ms 20]``.
No dependency beyond the standard library (uses uvloop when it is installed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from typing import Any

_MODEL = "instant"
_WORD = " tok"
_HIGH_WATER = 256 * 1024  # bytes queued in the transport before a stream waits


def _frame(payload: bytes) -> bytes:
    """One HTTP/1.1 chunk (chunked transfer encoding) holding ``payload``."""
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _event(obj: dict[str, Any]) -> bytes:
    # Compact, as vLLM's pydantic model_dump_json writes it.
    return _frame(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


_cache: dict[tuple[bool, int, int, bool], list[bytes]] = {}


def _response_chunks(chat: bool, prompt_tokens: int, max_tokens: int, continuous: bool) -> list[bytes]:
    """Pre-encoded body chunks of one response: vLLM 0.32's field order and keys (as in
    tests/fixtures/vllm_streams/)."""
    key = (chat, prompt_tokens, max_tokens, continuous)
    cached = _cache.get(key)
    if cached is not None:
        return cached
    rid = "cmpl-0123456789abcdef0123456789abcdef"
    created = 1_700_000_000
    obj_kind = "chat.completion.chunk" if chat else "text_completion"
    out: list[bytes] = []

    def usage(done: int) -> dict[str, Any]:
        u: dict[str, Any] = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + done,
                             "completion_tokens": done}
        if chat:
            u["completion_tokens_details"] = None
        return u

    if chat:
        # vLLM's chat stream starts with a role chunk (empty content, no token).
        first = {"id": rid, "object": obj_kind, "created": created, "model": _MODEL,
                 "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                              "logprobs": None, "finish_reason": None}]}
        if continuous:
            first["usage"] = usage(0)
        out.append(_event(first))
    for i in range(1, max_tokens + 1):
        last = i == max_tokens
        if chat:
            choice: dict[str, Any] = {"index": 0, "delta": {"content": _WORD}, "logprobs": None,
                                      "finish_reason": "length" if last else None,
                                      "token_ids": None}
        else:
            choice = {"index": 0, "text": _WORD, "logprobs": None,
                      "finish_reason": "length" if last else None, "stop_reason": None,
                      "prompt_token_ids": None, "token_ids": None}
        ev: dict[str, Any] = {"id": rid, "object": obj_kind, "created": created, "model": _MODEL,
                              "choices": [choice]}
        if continuous:
            ev["usage"] = usage(i)
        out.append(_event(ev))
    final = usage(max_tokens)
    final.pop("completion_tokens_details", None)
    out.append(_event({"id": rid, "object": obj_kind, "created": created, "model": _MODEL,
                       "choices": [], "usage": final,
                       "system_fingerprint": "vllm-0.32.0-instant"}))
    out.append(_frame(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    _cache[key] = out
    return out


_STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\n"
    b"date: Thu, 01 Jan 2026 00:00:00 GMT\r\n"
    b"server: uvicorn\r\n"
    b"content-type: text/event-stream; charset=utf-8\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)


def _plain(status: str, body: bytes, ctype: bytes = b"application/json") -> bytes:
    return (b"HTTP/1.1 %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s"
            % (status.encode(), ctype, len(body), body))


class _Stats:
    def __init__(self) -> None:
        self.rows: dict[str, list[float]] = {}


STATS = _Stats()


class _Conn(asyncio.Protocol):
    __slots__ = ("loop", "tr", "buf", "paused", "busy", "delay", "burst", "pending")

    def __init__(self, delay: float, burst: int = 1) -> None:
        self.loop = asyncio.get_running_loop()
        self.tr: asyncio.Transport | None = None
        self.buf = b""
        self.paused = False
        self.busy = False  # a response is streaming; later requests wait in buf
        self.delay = delay
        self.burst = burst
        self.pending: Any = None  # resume callback while paused

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.tr = transport  # type: ignore[assignment]
        self.tr.set_write_buffer_limits(high=_HIGH_WATER)  # type: ignore[union-attr]

    def connection_lost(self, exc: Exception | None) -> None:
        self.tr = None

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        cb, self.pending = self.pending, None
        if cb is not None:
            self.loop.call_soon(cb)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.busy:
            self._next_request()

    def _next_request(self) -> None:
        buf = self.buf
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = buf[:end].decode("latin-1")
        lines = head.split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
        if len(buf) < end + 4 + length:
            return
        body = buf[end + 4:end + 4 + length]
        self.buf = buf[end + 4 + length:]
        self._handle(method, path, body, time.monotonic())

    def _done(self) -> None:
        self.busy = False
        if self.buf:
            self._next_request()

    def _handle(self, method: str, path: str, body: bytes, recv: float) -> None:
        tr = self.tr
        if tr is None:
            return
        if method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            req = json.loads(body)
            chat = path.endswith("chat/completions")
            prompt = req["messages"][-1]["content"] if chat else req["prompt"]
            key = str(req.get("user") or prompt)
            opts = req.get("stream_options") or {}
            chunks = _response_chunks(chat, max(1, len(prompt.split())), int(req["max_tokens"]),
                                      bool(opts.get("continuous_usage_stats")))
            if not req.get("stream"):
                self._send_plain("200 OK", b'{"error": "only streaming is served"}')
                return
            row = [recv, 0.0, 0.0, 0.0]
            STATS.rows[key] = row
            self.busy = True
            tr.write(_STREAM_HEAD)
            self._stream(chunks, row)
            return
        if method == "GET" and path == "/stats":
            # cpu_s: this server's CPU time so far, so a driver can tell a run the server
            # could not keep up with (server CPU ~ wall time) from a client-bound one.
            data = json.dumps({"rows": STATS.rows, "cpu_s": time.process_time()}).encode()
            STATS.rows = {}
            self._send_plain("200 OK", data)
        elif method == "GET" and path == "/health":
            self._send_plain("200 OK", b"")
        elif method == "GET" and path == "/v1/models":
            self._send_plain("200 OK", json.dumps(
                {"object": "list", "data": [{"id": _MODEL, "object": "model"}]}).encode())
        else:
            self._send_plain("404 Not Found", b'{"error": "not found"}')

    def _send_plain(self, status: str, body: bytes) -> None:
        if self.tr is not None:
            self.tr.write(_plain(status, body))
        self._done()

    def _stream(self, chunks: list[bytes], row: list[float]) -> None:
        loop = self.loop
        n_tokens = len(chunks) - 2  # the usage chunk and [DONE] carry no token
        delay = self.delay
        state = {"i": 0, "t0": 0.0}

        def step() -> None:
            tr = self.tr
            if tr is None:
                return  # client went away
            if self.paused:
                self.pending = step
                return
            i = state["i"]
            now = time.monotonic()
            if i == 0:
                state["t0"] = now
                row[1] = now
            if i < n_tokens:
                if delay > 0 or self.burst == 1:
                    tr.write(chunks[i])
                    k = 1
                else:
                    k = min(self.burst, n_tokens - i)
                    tr.write(b"".join(chunks[i:i + k]))
                row[2] = now
                row[3] += k
                state["i"] = i + k
                if delay > 0:
                    loop.call_at(state["t0"] + (i + 1) * delay, step)
                else:
                    loop.call_soon(step)
                return
            tr.write(chunks[-2] + chunks[-1])  # usage-only chunk, [DONE], terminator
            self._done()

        step()


async def _serve(host: str, port: int, delay: float, burst: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Conn(delay, burst), host, port, backlog=1024,
                                      reuse_address=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"instant server on http://{host}:{port} delay={delay * 1000:g}ms", flush=True)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--delay-ms", type=float, default=0.0, help="server inter-chunk time")
    ap.add_argument("--cpu", type=int, default=None, help="pin to this CPU")
    ap.add_argument("--burst", type=int, default=1,
                    help="without a delay: chunks written per step (one write); 1 = one each")
    args = ap.parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    try:
        import uvloop  # type: ignore[import-not-found]
        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    try:
        runner(_serve(args.host, args.port, args.delay_ms / 1000, max(1, args.burst)))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
