"""Incremental Server-Sent Events parser for OpenAI-style streaming responses.

This is the load generator's hot path: at high concurrency the client must keep up with
tens of thousands of chunks per second on one core, or the measured latencies become the
client's own (measurement.md §4.8). So it works on bytes with ``bytes.split``/``find`` and
``startswith``, never per-line regexes or per-character loops, and hands ``json.loads``
the raw bytes.

What it handles: several events per read, events and lines split across reads at any
byte, ``\\n`` or ``\\r\\n`` line ends, comment/keep-alive lines (``:``), multi-line
``data:``, ``event: error``, ``data: [DONE]``, and a JSON ``{"error": ...}`` object
mid-stream (vLLM reports engine errors that way after the 200 status is sent).

What it bounds: a line, and the data of one event, at :data:`MAX_LINE_BYTES`. A line cut
by the reads is kept as a list of its pieces and joined once, when its end arrives, so a
long line costs time in proportion to its length (re-joining the whole buffer at every read
took 0.3 / 0.9 / 7.9 s of CPU for one 8 / 16 / 32 MB line: benchmarks/sse_long_line.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["MAX_LINE_BYTES", "SSEError", "SSEParser"]

MAX_LINE_BYTES = 1 << 20
"""The longest line (and event) a stream may send: 1 MiB. The largest event vLLM streams to
the load generator is one engine step's chunk, a few tokens of text plus the usage object,
a few hundred bytes (the generator asks for no logprobs); a megabyte is thousands of those.
A longer line is a broken or hostile server, and holding it would cost memory and CPU
without limit while the request waited for its timeout."""


@dataclass(frozen=True, slots=True)
class SSEError:
    """An error reported inside the stream (the HTTP status was already 200).

    ``kind`` is ``"server_error"`` for an error event or ``{"error": ...}`` object,
    ``"malformed"`` for data that is not a JSON object and ``"too_large"`` for a line or an
    event longer than the parser's limit (after which it reads nothing more).
    """

    kind: str
    message: str


class SSEParser:
    """Feed raw byte chunks; get back decoded JSON objects and :class:`SSEError` items.

    ``feed`` returns the events completed by that chunk in order. After ``data: [DONE]``
    :attr:`done` is True. Call :meth:`close` at end of stream to flush an event that was
    not terminated by a blank line (lenient: some proxies drop the final blank line).
    ``max_line``: the longest line and event accepted (:data:`MAX_LINE_BYTES`).
    """

    __slots__ = ("_pending", "_pending_len", "_data", "_data_len", "_event", "done",
                 "max_line", "overflowed")

    def __init__(self, max_line: int = MAX_LINE_BYTES) -> None:
        # The line still waiting for its end, as the pieces the reads brought.
        self._pending: list[bytes] = []
        self._pending_len = 0
        # Data lines of the event being assembled. Almost every event has exactly one,
        # so a single bytes object is kept and a list is only built for the rare rest.
        self._data: bytes | list[bytes] | None = None
        self._data_len = 0
        self._event: bytes | None = None
        self.done = False
        self.max_line = max_line
        self.overflowed = False

    def feed(self, chunk: bytes) -> list[dict[str, Any] | SSEError]:
        out: list[dict[str, Any] | SSEError] = []
        if self.overflowed:
            return out
        if (
            not self._pending
            and self._data is None
            and self._event is None
            and chunk.endswith(b"\n\n")
            and chunk.count(b"\n") == 2 * chunk.count(b"\n\n")
        ):
            # Fast path, what a server sends almost always: whole events of one line
            # each ("data: {...}\n\n"), nothing pending. Every newline is part of a
            # blank-line separator, so splitting on them yields exactly the lines the
            # general loop below would see, minus the blank ones.
            fast = _fast_chunk
            append = out.append
            for line in chunk.split(b"\n\n"):
                if line.startswith(b'data: {"id":'):
                    # A token chunk: straight to the partial decode, no dispatch step.
                    try:
                        obj = fast(line[6:].decode("utf-8"))
                    except UnicodeDecodeError:
                        obj = None
                    if obj is not None:
                        append(obj)
                        continue
                if line.endswith(b"\r"):
                    line = line[:-1]
                if line.startswith(b"data:"):
                    self._data = line[6:] if line.startswith(b"data: ") else line[5:]
                    self._dispatch(out)
                elif line.startswith(b"event:"):
                    self._event = line[6:].strip()
                    self._dispatch(out)
                # blank, comment (":"), id:, retry: -- nothing to dispatch
            return out
        if self._pending:
            if b"\n" not in chunk:
                # Still inside the same line: keep the piece, copy nothing.
                self._pending.append(chunk)
                self._pending_len += len(chunk)
                return self._overflow(out) if self._pending_len > self.max_line else out
            self._pending.append(chunk)
            buf = b"".join(self._pending)  # once per completed line: linear in its length
            self._pending = []
            self._pending_len = 0
        else:
            buf = chunk
        lines = buf.split(b"\n")
        tail = lines.pop()  # text after the last newline is an incomplete line
        for line in lines:
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if self._data is not None or self._event is not None:
                    self._dispatch(out)
                continue
            if line.startswith(b"data:"):
                value = line[6:] if line.startswith(b"data: ") else line[5:]
                self._data_len += len(value)
                if self._data_len > self.max_line:
                    return self._overflow(out)
                if self._data is None:
                    self._data = value
                elif isinstance(self._data, list):
                    self._data.append(value)
                else:
                    self._data = [self._data, value]
            elif line.startswith(b":"):
                continue  # comment / keep-alive
            elif line.startswith(b"event:"):
                self._event = line[6:].strip()
            # id:, retry: and unknown fields carry nothing the runner needs.
        if tail:
            if len(tail) > self.max_line:
                return self._overflow(out)
            self._pending = [tail]
            self._pending_len = len(tail)
        return out

    def _overflow(self, out: list[dict[str, Any] | SSEError]) -> list[dict[str, Any] | SSEError]:
        """Give up on the stream: drop what is held and report it once."""
        held = self._pending_len + self._data_len
        self._pending = []
        self._pending_len = 0
        self._data = None
        self._data_len = 0
        self._event = None
        self.overflowed = True
        out.append(SSEError("too_large", f"a stream line or event over {self.max_line:,} bytes "
                                         f"({held:,} bytes without its end)"))
        return out

    def close(self) -> list[dict[str, Any] | SSEError]:
        """Flush a pending final line and event at end of stream."""
        out = self.feed(b"\n\n") if self._pending else []
        if self._data is not None or self._event is not None:
            self._dispatch(out)
        return out

    def _dispatch(self, out: list[dict[str, Any] | SSEError]) -> None:
        data = self._data
        event = self._event
        self._data = None
        self._data_len = 0
        self._event = None
        if isinstance(data, list):
            data = b"\n".join(data)
        if event is not None and event not in (b"message", b""):
            if event == b"error":
                message = data.decode("utf-8", "replace") if data is not None else ""
                out.append(SSEError("server_error", _error_text(message)))
                return
            # Other named events (none sent by vLLM) are not part of the token stream.
            return
        if data is None:
            return
        if data == b"[DONE]":
            self.done = True
            return
        text: str | None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        obj = _fast_chunk(text) if text is not None else None
        if obj is not None:
            out.append(obj)
            return
        try:
            obj = json.loads(text if text is not None else data)
        except ValueError:
            out.append(SSEError("malformed", f"invalid JSON in data line: {data[:200]!r}"))
            return
        if not isinstance(obj, dict):
            out.append(SSEError("malformed", f"data is not a JSON object: {data[:200]!r}"))
        elif "choices" in obj:
            out.append(obj)  # every token and usage chunk: one lookup on the hot path
        elif obj.get("error") is not None:
            out.append(SSEError("server_error", _describe_error(obj["error"])))
        elif obj.get("object") == "error":
            # Older vLLM ErrorResponse shape: {"object": "error", "message", "type", "code"}.
            out.append(SSEError("server_error", _describe_error(obj)))
        else:
            out.append(obj)


# The C scanner: one JSON value at an index (an attribute the decoder sets in __init__,
# which typeshed does not declare: hence getattr, which mypy accepts and ruff's B009 would undo).
_scan_once: Callable[[str, int], tuple[Any, int]] = getattr(json.JSONDecoder(), "scan_once")  # noqa: B009


def _fast_chunk(text: str) -> dict[str, Any] | None:
    """``{"choices": ..., "usage": ...}`` of a compact vLLM/OpenAI stream chunk, or None.

    A token chunk is mostly fields the runner never reads (id, object, created, model);
    decoding only the ``choices`` array and the ``usage`` object that follows it costs
    about half of a full ``json.loads`` (benchmarks/client_capacity.py). It applies only
    to the exact compact shape ``{"id":…,"choices":[…](,"usage":…)?}`` with no object
    opened before ``choices``; anything else returns None and is parsed in full, so the
    result is always what ``json.loads`` would give for those two keys. A JSON string
    cannot contain the bytes ``"choices":[`` unescaped, so the match is the top-level key.
    """
    if not text.startswith('{"id":'):
        return None
    i = text.find('"choices":[')
    if i < 0 or text.find("{", 1, i) >= 0:
        return None
    try:
        choices, end = _scan_once(text, i + 10)
        usage = None
        if text.startswith(',"usage":', end):
            usage, end = _scan_once(text, end + 9)
    except (StopIteration, ValueError):
        return None
    if end != len(text) - 1 or text[end] != "}":
        return None
    return {"choices": choices, "usage": usage}


def _error_text(text: str) -> str:
    try:
        obj = json.loads(text)
    except ValueError:
        return text
    if isinstance(obj, dict) and "error" in obj:
        return _describe_error(obj["error"])
    return text


def _describe_error(err: Any) -> str:
    # vLLM sends {"error": {"message", "type", "code"}}; other servers send a string.
    if isinstance(err, dict):
        parts = [str(err.get(k)) for k in ("type", "code") if err.get(k) is not None]
        message = str(err.get("message", err))
        return f"{'/'.join(parts)}: {message}" if parts else message
    return str(err)
