"""Names of the open-loop levels, as level keys and objective labels read them (pure, no models:
`tuner status` reads them without importing pydantic)."""

from __future__ import annotations

__all__ = ["TRACE_LEVEL", "is_open_level"]

# The timed replay's level (tuner.load.trace_spec): objectives and limits read it with
# ``level: trace`` (label metric@trace), its records go to requests-trace.jsonl.
TRACE_LEVEL = "trace"


def is_open_level(name: str) -> bool:
    """Whether a level key names an open-loop level: a rate level (``r2.0``) or the trace."""

    return name == TRACE_LEVEL or (name.startswith("r") and name[1:2].isdigit())
