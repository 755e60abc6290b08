"""Process-group and port facts read from /proc (Linux), with a portable fallback.

Zombies are not counted as alive: they hold no memory or GPU context, and a zombie
grandchild is reaped by init, not by us.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

__all__ = ["group_members", "signal_group", "listening_pids", "cmdline", "process_alive", "descendants",
           "pids_with_env", "parent_pid", "start_ticks", "process_group"]

_PROC = Path("/proc")


def _stat_fields(pid_dir: Path) -> list[str] | None:
    try:
        raw = (pid_dir / "stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may contain spaces; fields follow the last ')'.
    return raw[raw.rfind(")") + 2 :].split()


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) pids whose process group is ``pgid``."""

    if not _PROC.exists():
        try:
            os.killpg(pgid, 0)
            return [pgid]
        except (ProcessLookupError, PermissionError):
            return []
    members = []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(entry)
        # fields[0] = state, fields[2] = pgrp (see proc(5)).
        if fields and len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def process_alive(pid: int) -> bool:
    fields = _stat_fields(_PROC / str(pid))
    if fields is None:
        try:
            os.kill(pid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False
    return fields[0] not in ("Z", "X")


def signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def cmdline(pid: int) -> list[str]:
    try:
        raw = (_PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def listening_pids(port: int) -> list[int]:
    """Pids with a socket listening on ``port`` (best effort; empty when unknown)."""

    inodes: set[str] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (_PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) > 9 and parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(parts[9])
    if not inodes:
        return []
    owners = []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (entry / "fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("socket:[") and target[8:-1] in inodes:
                        owners.append(int(entry.name))
                        break
    return sorted(set(owners))


def descendants(pid: int) -> list[int]:
    """All live descendants of ``pid`` (children, grandchildren, ...)."""

    children: dict[int, list[int]] = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(entry)
        # fields[1] = ppid (see proc(5)).
        if fields and len(fields) > 1 and fields[0] not in ("Z", "X"):
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    out: list[int] = []
    stack = list(children.get(pid, []))
    while stack:
        child = stack.pop()
        out.append(child)
        stack.extend(children.get(child, []))
    return out


def start_ticks(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (proc(5) field 22): with the pid it
    names one process for good, since a reused pid gets a later start. None if unknown."""

    fields = _stat_fields(_PROC / str(pid))
    # fields[0] is field 3 (state), so field 22 (starttime) is fields[19].
    return int(fields[19]) if fields and len(fields) > 19 and fields[19].isdigit() else None


def process_group(pid: int) -> int | None:
    fields = _stat_fields(_PROC / str(pid))
    return int(fields[2]) if fields and len(fields) > 2 else None


def parent_pid(pid: int) -> int | None:
    fields = _stat_fields(_PROC / str(pid))
    return int(fields[1]) if fields and len(fields) > 1 else None


def pids_with_env(name: str, value: str) -> list[int]:
    """Live pids whose environment holds ``name=value`` exactly.

    An environment variable is inherited by every descendant, including one that left
    its process group (setsid) and was re-parented to init; that is what makes it the
    check of last resort for "is anything of that server still alive". Processes whose
    environment we may not read (other users) are skipped: they cannot be ours.
    """

    needle = f"{name}={value}".encode()
    me = os.getpid()
    found = []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            fields = _stat_fields(entry)
            if fields and fields[0] not in ("Z", "X"):
                found.append(int(entry.name))
    return sorted(found)
