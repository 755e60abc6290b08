"""Recognise the log lines that mean a vLLM server will not come up (or just died).

`match_fatal_line(line)` classifies one line, statelessly. `FatalLineScanner` is fed the
server log's lines as they arrive (tuner.vllm.log_digest, from the launcher's reader); it
adds the context a single line lacks:

* **Root cause first.** vLLM often logs a generic wrapper (`EngineCore failed to start.`)
  *before* the traceback that names the cause (`ValueError: Free memory on device ...`).
  Rule: a specific reason is reported at once; a generic one (``GENERIC_REASONS``) is held
  as ``pending`` while up to ``grace_lines`` more lines are read, and the first specific
  reason among them wins. Without one, the generic reason is reported when the grace runs
  out or at ``finish()`` (end of the log / process exit).
* **Startup vs serving.** After ``Application startup complete.`` a `ValueError`,
  `KeyError` or `ImportError` belongs to one request, not to the server, so only reasons
  that kill the engine (``RUNTIME_REASONS``) still count.
* **Shutdown.** Once a ``[shutdown]`` line appears, the server is being stopped (usually
  by us): lines after it are teardown noise — e.g. the API server logs
  ``EngineDeadError: EngineCore encountered an issue`` when its SIGTERMed engine goes away
  (cudagraph-piecewise.log) — and are not classified.

Only ERROR/CRITICAL log records and unprefixed lines (raw tracebacks, NCCL output) are
examined: a DEBUG/INFO/WARNING record never is, however alarming its words. Exception
patterns are anchored at the start of the message, so a traceback's indented code line
(``    raise ValueError(``) is not mistaken for its final line.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from tuner.vllm.effective_config import LogLine, excerpt, split_log_line, strip_ansi

__all__ = [
    "CONFIG_REASONS",
    "GENERIC_REASONS",
    "REASONS",
    "RUNTIME_REASONS",
    "FatalLineScanner",
    "FatalSignature",
    "match_fatal_line",
    "trial_reason",
    "vllm_message",
]


class FatalSignature(BaseModel):
    """A fatal line: a stable snake_case ``reason``, a human ``summary`` and the line."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    reason: str
    summary: str
    line: str


@dataclass(frozen=True)
class _Rule:
    reason: str
    summary: str
    pattern: re.Pattern[str]


# An exception name at the start of the message, maybe module-qualified
# (`torch.OutOfMemoryError`, `vllm.v1.engine.exceptions.EngineDeadError`).
_EXC = r"^(?:[A-Za-z_][\w.]*\.)?"

# Most specific first: the first matching rule names the line.
_RULES: tuple[_Rule, ...] = (
    _Rule("gpu_memory_insufficient", "free GPU memory is below --gpu-memory-utilization",
          re.compile(r"Free memory on device\b.*\bis less than desired GPU memory utilization")),
    _Rule("no_kv_cache_memory", "no GPU memory is left for the KV cache",
          re.compile(r"No available memory for the cache blocks")),
    # vLLM has printed both "model's" and "models's" here.
    _Rule("max_model_len_too_large", "the KV cache cannot hold one request of max_model_len",
          re.compile(r"To serve at least one request with the models?'s max seq len")),
    _Rule("cuda_oom", "CUDA out of memory",
          re.compile(r"\bCUDA out of memory\b|\bCUDA error: out of memory\b|"
                     + _EXC + r"OutOfMemoryError\b")),
    _Rule("nccl_error", "NCCL error",
          re.compile(r"\bnccl(?:InvalidUsage|InvalidArgument|UnhandledCudaError|SystemError"
                     r"|InternalError|RemoteError)\b|\bNCCL error\b")),
    # The raise (support NEVER) says "please try cudagraph_mode=PIECEWISE"; the
    # downgrade WARNING says "; setting cudagraph_mode=..." and is not fatal.
    _Rule("unsupported_cudagraph_mode",
          "the attention backend cannot run the requested cudagraph mode",
          re.compile(r"CUDAGraphMode\.\w+ is not\s+supported with .*please try cudagraph_mode=")),
    _Rule("unsupported_speculative_method",
          "the model does not support the requested speculative method",
          re.compile(_EXC + r"NotImplementedError: Unsupported speculative method\b")),
    # vLLM's CPU attention backend refuses an fp8 KV cache on an x86 host without AVX-512 or
    # AMX, and for a head size not divisible by 32 (cpu_attn.py, _get_attn_isa): the platform
    # cannot run this value, as an unsupported cudagraph mode, not a broken server.
    _Rule("unsupported_kv_cache_dtype",
          "this platform cannot run the requested KV-cache dtype",
          re.compile(_EXC + r"NotImplementedError: FP8 KV cache (?:on CPU )?requires\b")),
    _Rule("missing_dependency", "a Python dependency is missing",
          re.compile(_EXC + r"(?:ImportError|ModuleNotFoundError): ")),
    _Rule("cuda_error", "CUDA error",
          re.compile(_EXC + r"\w*(?:Error|Exception): CUDA error: ")),
    _Rule("invalid_config", "vLLM rejected the configuration",
          re.compile(
              r"\bInvalid compilation mode: "
              r"|^\s*Value error, "  # pydantic's detail line under a ValidationError
              r"|" + _EXC + r"ValidationError: \d+ validation errors? for "
              r"|^KeyError: '"  # e.g. an unknown CUDAGraphMode name (fail-bad-cudagraph-mode.log)
              r"|" + _EXC + r"ValueError: "
              r"|" + _EXC + r"TypeError: .*\bunexpected keyword argument\b"
              r"|^[\w.\- ]+: error: (?:argument |unrecognized arguments: "
              r"|the following arguments are required: )"  # argparse
          )),
    _Rule("worker_failed", "a worker process failed to start or died",
          re.compile(r"\bWorkerProc failed to start\b|\bWorker proc \S+ died unexpectedly\b")),
    _Rule("engine_core_failed", "the engine core failed to start",
          re.compile(r"\bEngineCore failed to start\b|\bEngine core initialization failed\b")),
    _Rule("engine_dead", "the engine core died",
          re.compile(r"\bEngineCore encountered an issue\b|" + _EXC + r"EngineDeadError\b")),
)

REASONS: tuple[str, ...] = tuple(rule.reason for rule in _RULES)
# Wrappers that say *that* something failed, not *what*: a root cause may follow.
GENERIC_REASONS = frozenset({"worker_failed", "engine_core_failed", "engine_dead"})
# Reasons that still mean "the server is broken" once it serves requests.
RUNTIME_REASONS = frozenset({"cuda_oom", "nccl_error", "cuda_error"}) | GENERIC_REASONS

# Signatures that mean "vLLM refuses this configuration" (at argument parsing, config
# building or engine init): a trial failing with one of them is told ``invalid_config``,
# whatever the detail; the signature's own reason stays in the trial's outcome.
CONFIG_REASONS = frozenset({"invalid_config", "unsupported_cudagraph_mode", "unsupported_speculative_method",
                            "unsupported_kv_cache_dtype"})

_QUIET_LEVELS = frozenset({"DEBUG", "INFO", "WARNING"})
_SHUTDOWN_RE = re.compile(r"^\[shutdown\] ")
_READY = "Application startup complete."
_SIGNATURE_LINE_WIDTH = 1000


def trial_reason(signature: FatalSignature) -> str:
    """The typed reason a trial that failed with ``signature`` is told with."""
    return "invalid_config" if signature.reason in CONFIG_REASONS else signature.reason


def vllm_message(signature: FatalSignature, width: int = 600) -> str:
    """vLLM's own words on the fatal line: the line without its process tag and logger
    header (``NotImplementedError: Unsupported speculative method: 'mtp'``)."""
    text = split_log_line(signature.line).message.strip()
    return text if len(text) <= width else text[: width - 1] + "…"


def match_fatal_line(line: str) -> FatalSignature | None:
    """Classify one log line; None unless it is one of the fatal signatures."""
    return _classify(split_log_line(line), line)


def _classify(parsed: LogLine, line: str) -> FatalSignature | None:
    if parsed.level in _QUIET_LEVELS:
        return None
    for rule in _RULES:
        if rule.pattern.search(parsed.message):
            return FatalSignature(reason=rule.reason, summary=rule.summary,
                                  line=excerpt(strip_ansi(line), width=_SIGNATURE_LINE_WIDTH))
    return None


class FatalLineScanner:
    """Incremental fatal-line detection over a growing log (see the module docstring).

    ``feed_line(line)`` takes one complete line (a line reader's, without its newline; the
    reader keeps a partial last line until it ends) and returns the settled signature (the
    same one on every later call) or None. ``signature`` is the best answer so far: the
    settled one, else a generic failure still waiting for its root cause (also in
    ``pending``). ``settled()`` tells which. ``finish()`` settles at end of input (the
    process exited): call it before reading the final verdict.
    """

    def __init__(self, *, grace_lines: int = 200, excerpt_lines: int = 40) -> None:
        self._grace_lines = grace_lines
        self._tail: deque[str] = deque(maxlen=excerpt_lines)
        self._decided: FatalSignature | None = None
        self._frozen_excerpt: list[str] | None = None
        self._pending: FatalSignature | None = None
        self._lines_since_pending = 0
        self.ready_seen = False
        self.shutdown_seen = False
        # A fatal line after vLLM's own "[shutdown]" line: never the configuration's verdict
        # (the stop caused it), but a server that failed while stopping need not get the
        # whole stop grace (launcher.ServerProcess.stop).
        self.failed_while_stopping: FatalSignature | None = None

    @property
    def signature(self) -> FatalSignature | None:
        return self._decided if self._decided is not None else self._pending

    @property
    def pending(self) -> FatalSignature | None:
        return self._pending if self._decided is None else None

    def settled(self) -> bool:
        """True once the verdict can no longer change."""
        return self._decided is not None

    def feed_line(self, line: str) -> FatalSignature | None:
        if self._decided is None:
            self._scan_line(line)
        return self._decided

    def finish(self) -> FatalSignature | None:
        """End of input: settle a pending failure (the unterminated last line, if any, is
        the reader's to deliver first)."""
        if self._decided is None and self._pending is not None:
            self._decide(self._pending)
        return self._decided

    def excerpt(self) -> str:
        """The last lines up to the decision (or up to now while undecided)."""
        lines = self._frozen_excerpt if self._frozen_excerpt is not None else list(self._tail)
        return "\n".join(lines)

    def _decide(self, signature: FatalSignature) -> None:
        self._decided = signature
        self._frozen_excerpt = list(self._tail)

    def _scan_line(self, line: str) -> None:
        parsed = split_log_line(line)
        self._tail.append(strip_ansi(line).rstrip("\r"))
        if self.shutdown_seen:
            if self.failed_while_stopping is None and parsed.level not in _QUIET_LEVELS:
                self.failed_while_stopping = _classify(parsed, line)
            return
        if parsed.level in _QUIET_LEVELS:
            # Fast path for the bulk of a log; quiet records are never fatal.
            if _SHUTDOWN_RE.match(parsed.message):
                self.shutdown_seen = True
            elif parsed.message.startswith(_READY):
                self.ready_seen = True
        else:
            found = _classify(parsed, line)
            if found is not None and (not self.ready_seen or found.reason in RUNTIME_REASONS):
                if found.reason not in GENERIC_REASONS:
                    self._decide(found)
                    return
                if self._pending is None:
                    self._pending, self._lines_since_pending = found, 0
                    return
        if self._pending is not None:
            self._lines_since_pending += 1
            if self._lines_since_pending >= self._grace_lines:
                self._decide(self._pending)

