"""Human durations in study files and on the command line: '8h', '90m', '1h30m', '45s', 120."""

from __future__ import annotations

import re
from typing import Any

_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)", re.IGNORECASE)
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: Any) -> Any:
    """Seconds as float from a number or a string like '1h30m'; other input passes through.

    Non-strings and non-numbers are returned unchanged so pydantic reports the type error
    with the field's own path.
    """

    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if not isinstance(value, str):
        return value
    text = value.strip()
    try:
        return float(text)
    except ValueError:
        pass
    pos = 0
    total = 0.0
    for match in _PART.finditer(text):
        if text[pos:match.start()].strip():
            break
        total += float(match.group(1)) * _UNIT_S[match.group(2).lower()]
        pos = match.end()
    if pos == 0 or text[pos:].strip():
        raise ValueError(
            f"{value!r} is not a duration; use a number of seconds or e.g. '45s', '20m', '8h', '1h30m'"
        )
    return total


def format_duration(seconds: float) -> str:
    seconds = max(0.0, float(seconds))
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, sec = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{sec:02d}s"
