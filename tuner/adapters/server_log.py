"""The one reader of a server's log file: follows it as it grows, a line at a time.

:class:`LogFollower` is the file I/O: from where it stopped last, it reads what was
appended, in chunks of ``chunk_bytes``, and hands back the complete lines (without their
newline). What it handles, so that its readers need not:

* **A partial last line** stays behind until its newline arrives (a writer flushes at any
  byte); ``rest()`` hands it over at the end of input.
* **Bounded memory on any log**: a chunk at a time, lines handed on as the chunk is split,
  and a line longer than ``max_line_chars`` is cut: a progress bar redrawn with ``\\r`` and
  no newline keeps only its latest state, any other line its head (the logger header and
  the message's start, which is what a reader matches).
* **Bytes that are not UTF-8** become U+FFFD, a character split across two reads
  decoded whole (an incremental decoder).
* **A truncated log** (shorter than what was read: copytruncate) is read again from its
  start; the line in progress continues, as its writer's stream does.
* **A rotated log** (the path now names another file): the old file is read to its end,
  its last line ended, then the new file is followed from its start.

:class:`ServerLog` is one server's log: the follower feeding a
:class:`~tuner.vllm.log_digest.LogDigest` (the pure readings: fatal lines, effective
configuration, compile and startup records), plus the launcher's clock reading of the first
logger line.
"""

from __future__ import annotations

import codecs
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from tuner.vllm.log_digest import LogDigest
from tuner.vllm.startup import has_log_stamp

__all__ = ["CHUNK_BYTES", "MAX_LINE_CHARS", "LogFollower", "ServerLog"]

CHUNK_BYTES = 1 << 20
# vLLM's longest real lines (the engine config, a non-default-args dict) are a few thousand
# characters; a progress bar without newlines is the only line that grows past this.
MAX_LINE_CHARS = 1 << 16


class LogFollower:
    """Follows one growing text file by path (see the module docstring). Not thread-safe."""

    def __init__(self, path: Path, *, chunk_bytes: int = CHUNK_BYTES,
                 max_line_chars: int = MAX_LINE_CHARS) -> None:
        self.path = path
        self.chunk_bytes = chunk_bytes
        self.max_line_chars = max_line_chars
        self.offset = 0          # bytes of the current file read so far
        self.restarts = 0        # times the file was truncated or replaced under us
        self._file: BinaryIO | None = None
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._line = ""          # the line in progress (no newline yet), capped
        self._cut = False        # the line in progress went over the cap: drop to its end

    @property
    def partial(self) -> str:
        """The line in progress: what arrived after the last newline."""
        return self._line

    def lines(self) -> Iterator[str]:
        """The complete lines appended since the last call, read a chunk at a time (a
        consumer that handles each line as it comes holds one chunk at most)."""

        if self._file is None:
            try:
                self._file = open(self.path, "rb")  # kept open between calls: no `with`
            except FileNotFoundError:
                return
        replaced = self._replaced()
        yield from self._drain()
        if replaced:
            # The old file is done: its last line ends with it; the new one starts afresh.
            last = self.rest()
            if last is not None:
                yield last
            self.close()
            self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
            self.offset, self.restarts = 0, self.restarts + 1
            yield from self.lines()

    def rest(self) -> str | None:
        """End of input: the unterminated last line, if any (then gone from here)."""

        tail = self._decoder.decode(b"", final=True)
        if tail:
            self._append(tail)
        if not self._line and not self._cut:
            return None
        line, self._line, self._cut = self._line, "", False
        return line

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _replaced(self) -> bool:
        """True when the path names another file now (rotated); a missing path is not a
        rotation yet (the old file is still read to its end)."""

        assert self._file is not None
        try:
            named = os.stat(self.path)
        except FileNotFoundError:
            return False
        held = os.fstat(self._file.fileno())
        return (named.st_dev, named.st_ino) != (held.st_dev, held.st_ino)

    def _drain(self) -> Iterator[str]:
        assert self._file is not None
        if os.fstat(self._file.fileno()).st_size < self.offset:
            # Truncated: what is there now was written after the cut.
            self.offset, self.restarts = 0, self.restarts + 1
        self._file.seek(self.offset)
        while True:
            chunk = self._file.read(self.chunk_bytes)
            if not chunk:
                return
            self.offset += len(chunk)
            yield from self._split(self._decoder.decode(chunk))

    def _split(self, text: str) -> Iterator[str]:
        pieces = text.split("\n")
        for piece in pieces[:-1]:
            self._append(piece)
            line, self._line, self._cut = self._line, "", False
            yield line
        self._append(pieces[-1])

    def _append(self, piece: str) -> None:
        if self._cut:
            redraw = piece.rfind("\r")
            if redraw < 0:
                return  # still the overlong line's excess
            self._line, self._cut, piece = "", False, piece[redraw + 1:]
        self._line += piece
        if len(self._line) > self.max_line_chars:
            # A progress bar redrawn with \r: only its last state matters.
            self._line = self._line[self._line.rfind("\r") + 1:]
            if len(self._line) > self.max_line_chars:
                self._line, self._cut = self._line[: self.max_line_chars], True


class ServerLog:
    """One server start's log: its lines, as they arrive, into ``digest``.

    ``poll()`` reads what is new (cheap: only the appended bytes), ``finish()`` reads the
    rest at the end of input, unterminated last line included, settles the fatal verdict
    and closes the file; a later ``poll()`` or ``finish()`` opens it again where reading
    stopped (a log relay may still have written after the server exited). ``first_line_s`` is the
    launcher's clock reading of the first vLLM logger line (vllm.startup's ``imports``
    phase), from ``started_at`` (set when the server is spawned)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.digest = LogDigest()
        self.started_at: float | None = None
        self.first_line_s: float | None = None
        self._follower = LogFollower(path)

    def poll(self) -> LogDigest:
        for line in self._follower.lines():
            self.digest.feed(line)
        if (self.first_line_s is None and self.started_at is not None
                and (self.digest.stamped or has_log_stamp(self._follower.partial))):
            self.first_line_s = time.monotonic() - self.started_at
        return self.digest

    def finish(self) -> LogDigest:
        self.poll()
        last = self._follower.rest()
        if last is not None:
            self.digest.feed(last)
        self.digest.finish()
        self._follower.close()
        return self.digest
