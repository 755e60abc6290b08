"""Everything the tuner reads from one vLLM server log, kept current a line at a time.

The launcher's reader (tuner.adapters.server_log) hands every line of a starting server's
log to one :class:`LogDigest` as it arrives; the launcher asks it for a fatal line, the
start's early stop and the verifier for the configuration applied so far, the probe for
the shapes the server reports, and the trial's records for the compile and startup
breakdowns - one pass over the log for all of them, however long it grows.
:func:`read_log` reads a whole text (a finished log, or any prefix) the same way.

The fatal-line scanner reads each line as it is fed: the launcher checks its verdict after
every read of the log, and the other parsers (ten times its cost per line) must not delay
it. They read the lines when one of their answers is asked for, or once the lines waiting
for them pass :data:`BACKLOG_CHARS` (so memory stays bounded however long nobody asks).

Pure: lines in, records out.
"""

from __future__ import annotations

from tuner.probe.shapes import log_boundaries
from tuner.vllm.compile_cache import CompileLogScan, CompileRecord
from tuner.vllm.effective_config import EffectiveConfig, EffectiveConfigScan, text_lines
from tuner.vllm.failure_signatures import FatalLineScanner
from tuner.vllm.startup import StartupRecord, StartupScan, has_log_stamp

__all__ = ["BACKLOG_CHARS", "LogDigest", "read_log"]

BACKLOG_CHARS = 1 << 20

# Both log_boundaries patterns ('compile_ranges_endpoints', 'compile_sizes') contain it:
# the other lines skip the regexes.
_BOUNDARY_MARKER = "'compile_"


class LogDigest:
    """One server log, read a line at a time (lines without their newline; a reader
    delivers the unterminated last line at the end). ``fatal`` is the fail-fast scanner,
    current after every ``feed``; the other readings are computed on demand from all that
    was fed so far."""

    def __init__(self) -> None:
        self.fatal = FatalLineScanner()
        self.stamped = False  # a vLLM logger line was seen (the end of the imports phase)
        self._effective = EffectiveConfigScan()
        self._compile = CompileLogScan()
        self._startup = StartupScan()
        self._boundaries: set[int] = set()
        self._backlog: list[str] = []     # lines fed to the scanner only, so far
        self._backlog_chars = 0

    def feed(self, line: str) -> None:
        self.fatal.feed_line(line)
        if not self.stamped:
            self.stamped = has_log_stamp(line)
        self._backlog.append(line)
        self._backlog_chars += len(line)
        if self._backlog_chars > BACKLOG_CHARS:
            self._catch_up()

    def _catch_up(self) -> None:
        for line in self._backlog:
            self._effective.feed(line)
            self._compile.feed(line)
            self._startup.feed(line)
            if _BOUNDARY_MARKER in line:
                self._boundaries.update(log_boundaries(line))
        self._backlog.clear()
        self._backlog_chars = 0

    def finish(self) -> None:
        """End of input (the server exited, or was stopped): settle the fatal verdict."""
        self.fatal.finish()

    def effective(self) -> EffectiveConfig:
        """The configuration the lines so far establish (vllm.effective_config)."""
        self._catch_up()
        return self._effective.config()

    def compile_record(self) -> CompileRecord:
        """What the lines so far say about torch.compile and its cache (vllm.compile_cache)."""
        self._catch_up()
        return self._compile.record()

    def startup(self, *, first_line_s: float | None = None, ready_s: float | None = None,
                overlapped_s: float | None = None) -> StartupRecord:
        """The start's breakdown so far (vllm.startup; the launcher's two clock readings, and
        the imports a spare interpreter did ahead)."""
        self._catch_up()
        return self._startup.record(compiled=self._compile.record(), first_line_s=first_line_s, ready_s=ready_s,
                                    overlapped_s=overlapped_s)

    def boundaries(self) -> list[int]:
        """The prompt-length boundaries the lines so far report (probe.shapes.log_boundaries)."""
        self._catch_up()
        return sorted(self._boundaries)


def read_log(text: str) -> LogDigest:
    """The digest of a whole log text, fed as the launcher's reader delivers its lines."""
    digest = LogDigest()
    for line in text_lines(text):
        digest.feed(line)
    digest.finish()
    return digest
