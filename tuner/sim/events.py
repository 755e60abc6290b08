"""What the simulated startup reports: log notices and startup failures.

Kept apart from ``effective`` (which decides them) so that ``comm`` (NCCL and all-reduce
decisions, used by ``effective``) can report them without importing ``effective``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Notice", "Failure"]


@dataclass(frozen=True)
class Notice:
    phase: str     # "api" (API-server config time), "comm" (engine comm init), "attn", "capture"
    level: str     # INFO / WARNING
    source: str    # "file.py:line" shown in the log prefix
    text: str


@dataclass(frozen=True)
class Failure:
    """A startup failure, rendered by logs.py as the traceback vLLM prints."""

    phase: str          # "api" (before EngineCore exists) or "engine"
    exc_type: str       # e.g. "NotImplementedError"
    message: str
    frames: tuple[str, ...] = ()
    nccl_line: str | None = None
    stage: str = "init"   # engine failures: init, comm, load, attn, kv or kv_backend (when printed)
