"""Shared helpers for tests that run real tuner, simulator and Ray processes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def free_port_block(size: int = 4) -> int:
    """A base port with ``size`` consecutive free ports after it."""

    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + size >= 65535:
            continue
        ok = True
        for port in range(base, base + size):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free port block")


def processes_with_env(marker: str) -> list[int]:
    """Pids whose environment contains TUNER_TEST_ID=<marker> (our simulators)."""

    needle = f"TUNER_TEST_ID={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes():
                stat = (entry / "stat").read_text()
                if stat[stat.rfind(")") + 2] not in "ZX":
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def write_study(tmp_path: Path, *, base: str = "demo.yaml", name: str | None = None,
                updates: dict[str, Any] | None = None, env: dict[str, Any] | None = None) -> tuple[Path, str]:
    """A copy of a shipped study with a unique port block, marker and optional changes."""

    data = yaml.safe_load((ROOT / "search_spaces" / base).read_text())
    marker = uuid.uuid4().hex[:12]
    data["name"] = name or f"t{marker}"
    data["server"]["port"] = free_port_block()
    data["server"].setdefault("env", {})["TUNER_TEST_ID"] = marker
    data["server"]["env"].update(env or {})
    for dotted, value in (updates or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    path = tmp_path / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path, marker


def tuner_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "tuner.cli", *args]


def run_tuner(*args: str, timeout: float = 600, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(tuner_argv(*args), cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def orphan_check():
    """Yields a list to append markers to; fails if any process with a marker survives."""

    markers: list[str] = []
    yield markers
    leftovers: dict[str, list[int]] = {}
    for marker in markers:
        deadline = time.monotonic() + 5
        while (pids := processes_with_env(marker)) and time.monotonic() < deadline:
            time.sleep(0.2)
        if pids:
            leftovers[marker] = pids
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    assert not leftovers, f"orphan processes left behind: {leftovers}"
