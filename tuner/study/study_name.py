"""What a study may be called: one rule, checked wherever a name enters.

A study name becomes a folder under the results root, the Optuna study name, a process
tag and words in exported units and scripts, so it is a single path component of plain
characters: no '/', no '..', no whitespace or control characters, nothing a shell, a
systemd unit or a file system would read differently. Pure.
"""

from __future__ import annotations

import re

__all__ = ["check_study_name", "MAX_STUDY_NAME", "STUDY_NAME_RULE"]

MAX_STUDY_NAME = 128
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
STUDY_NAME_RULE = (f"letters, digits, '_', '.' and '-', starting with a letter or digit, "
                   f"at most {MAX_STUDY_NAME} characters")


def check_study_name(name: object) -> str:
    """``name`` when it is a valid study name.

    Raises:
        ValueError: the message names the rule and shows the name (escaped, shortened).
    """

    if not isinstance(name, str):
        raise ValueError(f"a study name must be text, got {type(name).__name__}")
    shown = repr(name) if len(name) <= 60 else repr(name[:57]) + "..."
    if len(name) > MAX_STUDY_NAME:
        raise ValueError(f"study name {shown} has {len(name)} characters; use {STUDY_NAME_RULE}")
    if not _NAME.fullmatch(name):
        raise ValueError(f"study name {shown} is not allowed; use {STUDY_NAME_RULE}")
    return name
