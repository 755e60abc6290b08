"""Is the GPU group free? Checked before every server start.

With NVIDIA GPUs: ``nvidia-smi --query-compute-apps`` must list no process on the
worker's GPUs (the previous trial's server tree releases its memory only when its last
process exits; another user's job may hold them too). Where nvidia-smi cannot see the
processes that hold memory (a container without the host's PID namespace lists none), the
GPUs' own ``memory.used`` beyond what the listed processes account for counts as well:
more than ``UNSEEN_BUSY_MIB`` in use by nobody visible means someone else is there.
Everywhere, GPUs or not, the worker first checks the process tree: no process carrying
the group's server tag may be alive (see TrialWorker._wait_group_free); without nvidia-smi
(CPU build, simulator) that check is the whole guarantee.

The wait is bounded (``execution.gpu_free_timeout``); when it runs out the trial fails
``gpus_not_free`` naming the processes (pid, name, MiB) or the unexplained memory.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
from dataclasses import dataclass

from tuner.errors import GpusNotFree

__all__ = ["GpuProcess", "GpuMemory", "Busy", "parse_compute_apps", "parse_gpu_memory", "select_uuids",
           "busy_on", "gpu_state", "wait_until_free", "UNSEEN_BUSY_MIB"]

# Memory in use on one of the group's GPUs that no listed process accounts for, above which
# the GPU counts as busy. An idle GPU reports a few MiB; one CUDA context alone is ~0.5 GiB.
UNSEEN_BUSY_MIB = 2048

_APPS_QUERY = "--query-compute-apps=gpu_uuid,pid,used_memory,process_name"
_GPU_QUERY = "--query-gpu=index,uuid,memory.used,memory.total"


@dataclass(frozen=True)
class GpuProcess:
    gpu_uuid: str
    pid: int
    used_mib: int
    name: str = ""


@dataclass(frozen=True)
class GpuMemory:
    index: str
    uuid: str
    used_mib: int
    total_mib: int


@dataclass(frozen=True)
class Busy:
    """What holds the group's GPUs: listed processes, and memory nobody listed explains."""

    processes: tuple[GpuProcess, ...] = ()
    unseen_mib: tuple[tuple[str, int], ...] = ()   # (GPU index, MiB)

    def __bool__(self) -> bool:
        return bool(self.processes or self.unseen_mib)

    def text(self) -> str:
        parts = [f"pid {p.pid}" + (f" ({p.name}, {p.used_mib} MiB)" if p.name else f" ({p.used_mib} MiB)")
                 for p in self.processes]
        parts += [f"{mib} MiB on GPU {index} held by processes nvidia-smi does not list "
                  "(another container or VM?)" for index, mib in self.unseen_mib]
        return ", ".join(parts)


def _int(text: str) -> int:
    return int(text) if text.isdigit() else 0


def parse_compute_apps(csv_text: str) -> list[GpuProcess]:
    """Parse ``nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory[,process_name]
    --format=csv,noheader,nounits`` (the name, last, may itself hold commas)."""

    out = []
    for line in csv_text.splitlines():
        parts = [p.strip() for p in line.split(",", 3)]
        if len(parts) < 3 or not parts[1].isdigit():
            continue
        name = parts[3] if len(parts) == 4 and not parts[3].startswith("[") else ""
        out.append(GpuProcess(parts[0], int(parts[1]), _int(parts[2]), name))
    return out


def parse_gpu_memory(csv_text: str) -> list[GpuMemory]:
    """Parse ``nvidia-smi --query-gpu=index,uuid,memory.used,memory.total
    --format=csv,noheader,nounits``."""

    out = []
    for line in csv_text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4 and parts[1].startswith(("GPU-", "MIG-")):
            out.append(GpuMemory(parts[0], parts[1], _int(parts[2]), _int(parts[3])))
    return out


def select_uuids(index_uuid_csv: str, wanted: list[str]) -> set[str]:
    """UUIDs of the GPUs named in ``wanted`` (indices or UUIDs, as CUDA_VISIBLE_DEVICES
    allows), from ``nvidia-smi --query-gpu=index,uuid[,...] --format=csv,noheader``."""

    uuids = set()
    for line in index_uuid_csv.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2 and (parts[0] in wanted or parts[1] in wanted):
            uuids.add(parts[1])
    return uuids


def busy_on(processes: list[GpuProcess], memory: list[GpuMemory], uuids: set[str] | None,
            unseen_busy_mib: int = UNSEEN_BUSY_MIB) -> Busy:
    """What holds the GPUs ``uuids`` (None: every GPU): their listed processes, and per GPU
    the memory in use beyond what those account for when it exceeds ``unseen_busy_mib``."""

    mine = [p for p in processes if uuids is None or p.gpu_uuid in uuids]
    unseen = []
    for gpu in memory:
        if uuids is not None and gpu.uuid not in uuids:
            continue
        listed = sum(p.used_mib for p in processes if p.gpu_uuid == gpu.uuid)
        if gpu.used_mib - listed > unseen_busy_mib:
            unseen.append((gpu.index, gpu.used_mib - listed))
    return Busy(tuple(mine), tuple(unseen))


def _query(smi: str, *args: str) -> str | None:
    try:
        result = subprocess.run([smi, *args, "--format=csv,noheader,nounits"],
                                capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout if result.returncode == 0 else None


def gpu_state() -> Busy | None:
    """What holds this worker's GPUs (CUDA_VISIBLE_DEVICES, or all); None without nvidia-smi."""

    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    apps = _query(smi, _APPS_QUERY)
    if apps is None:
        return None
    listing = _query(smi, _GPU_QUERY) or ""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    uuids = None if visible is None else select_uuids(
        listing, [v.strip() for v in visible.split(",") if v.strip()])
    return busy_on(parse_compute_apps(apps), parse_gpu_memory(listing), uuids)


async def wait_until_free(timeout_s: float, poll_s: float = 0.25) -> tuple[float, Busy | None]:
    """Wait until nothing holds this group's GPUs: (seconds waited, what held them when the
    wait began, None if nothing did). Raises GpusNotFree after ``timeout_s``."""

    began = time.monotonic()
    first: Busy | None = None
    while True:
        busy = await asyncio.to_thread(gpu_state)
        if not busy:
            # Free at the first look: no wait at all (the look itself is not waiting).
            return (0.0 if first is None else time.monotonic() - began), first
        first = first or busy
        if time.monotonic() - began >= timeout_s:
            raise GpusNotFree(f"the trial's GPUs are still in use after waiting {timeout_s:g}s: "
                              f"{busy.text()}; the server was not started")
        await asyncio.sleep(poll_s)
