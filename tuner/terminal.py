"""What may reach a terminal: text with every control character written as an escape.

A study's values, a trial's files and a server's log lines are printed by `tuner`
commands; an ESC in one of them (``"\\x1b]0;owned\\x07"`` retitles the terminal, other
sequences move the cursor, rewrite earlier lines or hide text) must arrive as the four
characters ``\\x1b``, not as the byte. Newlines and tabs are layout and stay.

Pure.
"""

from __future__ import annotations

import re

__all__ = ["for_terminal"]

# C0 controls but tab and newline, DEL, the C1 controls (0x9b is a one-byte CSI), and
# Unicode's bidirectional overrides and isolates, which reorder what a line appears to say.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def for_terminal(text: str) -> str:
    """``text`` with each control character but newline and tab as its Python escape."""

    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)
