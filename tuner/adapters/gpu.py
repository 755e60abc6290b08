"""Is the GPU group free? Checked before every server start.

With NVIDIA GPUs: ``nvidia-smi --query-compute-apps`` must list no process on the
worker's GPUs (the previous trial's server tree releases its memory only when its last
process exits). Everywhere, GPUs or not, the worker first checks the process tree: no
process carrying the group's server tag may be alive (see TrialWorker._wait_group_free);
without nvidia-smi (CPU build, simulator) that check is the whole guarantee.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
from dataclasses import dataclass

from tuner.errors import GpusNotFree

__all__ = ["GpuProcess", "parse_compute_apps", "select_uuids", "busy_processes", "wait_until_free"]


@dataclass(frozen=True)
class GpuProcess:
    gpu_uuid: str
    pid: int
    used_mib: int


def parse_compute_apps(csv_text: str) -> list[GpuProcess]:
    """Parse ``nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader,nounits``."""

    out = []
    for line in csv_text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3 or not parts[1].isdigit():
            continue
        used = int(parts[2]) if parts[2].isdigit() else 0
        out.append(GpuProcess(parts[0], int(parts[1]), used))
    return out


def select_uuids(index_uuid_csv: str, wanted: list[str]) -> set[str]:
    """UUIDs of the GPUs named in ``wanted`` (indices or UUIDs, as CUDA_VISIBLE_DEVICES
    allows), from ``nvidia-smi --query-gpu=index,uuid --format=csv,noheader``."""

    uuids = set()
    for line in index_uuid_csv.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and (parts[0] in wanted or parts[1] in wanted):
            uuids.add(parts[1])
    return uuids


def _visible_uuids(smi: str) -> set[str] | None:
    """UUIDs of the GPUs this process may use, or None for all of them."""

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return None
    wanted = [v.strip() for v in visible.split(",") if v.strip()]
    listing = subprocess.run(
        [smi, "--query-gpu=index,uuid", "--format=csv,noheader"],
        capture_output=True, text=True, timeout=30, check=False,
    ).stdout
    return select_uuids(listing, wanted)


def busy_processes() -> list[GpuProcess] | None:
    """Processes holding memory on this worker's GPUs; None when there is no nvidia-smi."""

    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        result = subprocess.run(
            [smi, "--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=30, check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode != 0:
        return None
    try:
        uuids = _visible_uuids(smi)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return [p for p in parse_compute_apps(result.stdout) if uuids is None or p.gpu_uuid in uuids]


async def wait_until_free(timeout_s: float, poll_s: float = 1.0) -> None:
    """Return when no process holds this group's GPUs; raise GpusNotFree after ``timeout_s``."""

    deadline = time.monotonic() + timeout_s
    while True:
        busy = await asyncio.to_thread(busy_processes)
        if not busy:
            return
        if time.monotonic() >= deadline:
            listed = ", ".join(f"pid {p.pid} ({p.used_mib} MiB)" for p in busy)
            raise GpusNotFree(f"GPUs still in use after {timeout_s:.0f}s: {listed}")
        await asyncio.sleep(poll_s)
