"""A vLLM log line's anatomy: ANSI codes, the ``(Proc pid=N)`` tags, the logger header, and
the excerpts of long lines kept as evidence. Shared by effective_config, failure_signatures
and the other log readers.

Pure.
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["EVIDENCE_WIDTH", "LogLine", "RAY_DEDUP_RE", "excerpt", "excerpt_around_key",
           "split_log_line", "strip_ansi", "text_lines"]

EVIDENCE_WIDTH = 300


class LogLine(NamedTuple):
    """A log line split into the process tag, the log level and the message."""

    process: str | None
    level: str | None
    message: str


_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# vLLM tags each child's output with `(Name pid=N) `; output from two processes can
# interleave, giving two tags in a row (seen in spec-ngram-k4.log).
_PREFIX_RE = re.compile(r"(?:\(([\w.\-]+) pid=\d+\) ?)+")
_HEADER_RE = re.compile(
    r"(DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]*\] ?"
)
_UVICORN_RE = re.compile(r"(DEBUG|INFO|WARNING|ERROR|CRITICAL):\s+")
# Ray's log deduplication folds identical worker lines into one and appends this suffix
# (`... NCCL_PROTO set by environment to LL [repeated 7x across cluster]`); left in place it
# would become part of the parsed value.
RAY_DEDUP_RE = re.compile(r"\s*\[repeated \d+x across cluster\]\s*$")


def strip_ansi(text: str) -> str:
    """Remove terminal colour codes (vLLM colours its process tags and levels)."""
    return _ANSI_RE.sub("", text) if "\x1b" in text else text


def text_lines(text: str) -> list[str]:
    """The lines of a whole log text as a line reader delivers them: split at ``\n`` only,
    the last one kept even without its newline, no empty line after a final newline."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


def split_log_line(raw: str) -> LogLine:
    """Strip ANSI codes, the `(Proc pid=N)` tags and the logger header from one line.

    Leading spaces of the message are kept: in a traceback they tell a code line
    (indented) from the final exception line (not indented).
    """
    line = strip_ansi(raw).rstrip("\r\n")
    process = None
    pos = 0
    if m := _PREFIX_RE.match(line):
        process, pos = m.group(1), m.end()
    if (h := _HEADER_RE.match(line, pos)) or (h := _UVICORN_RE.match(line, pos)):
        return LogLine(process, h.group(1), line[h.end():])
    return LogLine(process, None, line[pos:])


def excerpt(line: str, start: int = 0, end: int | None = None, width: int = EVIDENCE_WIDTH) -> str:
    """The line itself if short, else a window of at most `width` chars around [start, end)."""
    line = line.rstrip("\r\n")
    if len(line) <= width:
        return _shown(line)
    end = start if end is None else end
    room = max(width - 2 - (end - start), 0)  # two chars for the ellipses
    lo = max(0, start - room // 2)
    hi = min(len(line), lo + width - 2)
    lo = max(0, hi - (width - 2))
    return _shown(("…" if lo > 0 else "") + line[lo:hi] + ("…" if hi < len(line) else ""))


def _shown(text: str) -> str:
    # tqdm redraws are joined by bare carriage returns, which would make a printed
    # excerpt overwrite itself; show them as a visible mark of the same length.
    return text.replace("\r", "⏎")


def excerpt_around_key(line: str, path: str) -> str | None:
    """Excerpt of a python-repr dict line around the dotted key `path`, or None if absent."""
    pos = 0
    for key in path.split("."):
        found = line.find(f"'{key}':", pos)
        if found < 0:
            return None
        pos = found
    return excerpt(line, pos, pos + len(path.rsplit(".", 1)[-1]) + 3)
