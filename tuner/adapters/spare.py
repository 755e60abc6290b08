"""The next server's interpreter, started while the current trial runs (a "spare").

A vLLM start spends its first 15-20 s in Python imports before it touches a GPU
(docs/gpu-box.md, "Reading the startup breakdown"). With ``execution.startup.prestart`` the
worker starts the next server's interpreter as soon as the current server is launched: it
imports what the server will import (tuner/adapters/spare_main.py) and then waits. The next
trial releases it with its own arguments, environment and log instead of spawning a process,
so it waits only for the engine. The worker never lets a spare import while a load level
measures (tuner.engine.prestart).

A spare is used only where that cannot change the server:

* the same interpreter and module (``server.command`` of the form ``[PYTHON, -m, MODULE]``);
* no variable in which the trial's environment differs from the spare's was read during the
  imports, and none is of a kind native libraries read as they load (:data:`LOAD_TIME_PREFIXES`);
* CUDA was not initialised by the imports (a forked engine would have to spawn, and the GPU
  would look busy).

Otherwise the spare is discarded and the server starts cold; the trial says why.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.adapters.artifacts import read_json

__all__ = ["LOAD_TIME_PREFIXES", "SPARE_MAIN", "Spare", "spare_target", "env_refusal"]

SPARE_MAIN = Path(__file__).with_name("spare_main.py")

# Read by native code when it loads (the dynamic linker, the interpreter, torch, the CUDA
# runtime, OpenMP, Triton, Hugging Face's libraries): a change in one of them is refused even
# though Python never read it.
LOAD_TIME_PREFIXES = ("LD_", "PYTHON", "TORCH", "PYTORCH_", "CUDA_", "NVIDIA_", "OMP_", "MKL_", "KMP_",
                      "TRITON_", "HF_", "TRANSFORMERS_", "TOKENIZERS_", "MALLOC_", "GLIBC_")


def spare_target(argv: Sequence[str]) -> tuple[str, str, list[str]] | None:
    """(interpreter, module, arguments) of a ``[PYTHON, -m, MODULE, *args]`` command; None
    for any other form (``vllm serve``, interpreter options), which is started cold."""

    if len(argv) >= 3 and argv[1] == "-m" and not argv[0].startswith("-") and argv[2]:
        return argv[0], argv[2], list(argv[3:])
    return None


def env_refusal(spare_env: Mapping[str, str], env: Mapping[str, str], read: Sequence[str],
                ignored: Sequence[str] = ()) -> str | None:
    """Why a spare started with ``spare_env``, whose imports read ``read``, cannot become a
    server that needs ``env``; None: it can. ``ignored``: variables only the tuner reads.

    A library that walks the whole environment at import reads every variable there is, so
    a variable that changes from trial to trial should be absent from the spare's
    environment: one added at release was seen only if looked up by name."""

    changed = sorted(k for k in set(spare_env) | set(env)
                     if spare_env.get(k) != env.get(k) and k not in ignored)
    seen = set(read)
    blocked = [k for k in changed if k in seen or k.startswith(LOAD_TIME_PREFIXES)]
    if not blocked:
        return None
    shown = ", ".join(blocked[:4]) + (f" and {len(blocked) - 4} more" if len(blocked) > 4 else "")
    return f"the trial changes {shown}, which the spare's imports read or native libraries read as they load"


@dataclass
class Spare:
    """One spare interpreter: spawned, then released into a server or discarded."""

    python: str
    module: str
    env: dict[str, str]
    ignored: tuple[str, ...] = ()   # variables only the tuner reads (its process tag)
    process: subprocess.Popen[bytes] | None = None
    folder: Path | None = None
    spawned_at: float | None = None
    _status: dict[str, Any] | None = field(default=None, init=False, repr=False)

    def spawn(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="tuner-spare-"))
        out = open(self.folder / "imports.log", "wb")
        try:
            self.process = subprocess.Popen(   # argument vector only, never a shell
                [self.python, str(SPARE_MAIN), str(self.folder / "status.json"), self.module],
                env=self.env, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, close_fds=True,
            )
        finally:
            out.close()
        self.spawned_at = time.monotonic()

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def status(self) -> dict[str, Any] | None:
        """What the spare wrote once its imports were done; None before (or if it died). Read
        from its file until it is there, then kept: the spare writes it once."""

        if self._status is None and self.folder is not None:
            self._status = read_json(self.folder / "status.json", dict)
        return self._status

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def refusal(self, python: str, module: str, env: Mapping[str, str]) -> str | None:
        """Why this spare cannot run ``python -m module`` with ``env`` now; None: it can."""

        status = self.status()
        if not self.alive():
            return "the spare interpreter exited" + ("" if status else " before its imports were done")
        if status is None:
            return "the spare was still importing"
        if (python, module) != (self.python, self.module):
            return "the server command changed"
        if status.get("cuda_initialized"):
            return "the spare's imports initialised CUDA"
        return env_refusal(self.env, env, status.get("env_read") or [], self.ignored)

    def release(self, args: Sequence[str], env: Mapping[str, str], log_path: Path) -> subprocess.Popen[bytes]:
        """Make the spare the server: what it printed while importing goes first into
        ``log_path``, then it runs the module with ``args`` and ``env``, writing there."""

        assert self.process is not None and self.process.stdin is not None and self.folder is not None
        with contextlib.suppress(OSError), open(self.folder / "imports.log", "rb") as src, \
                open(log_path, "ab") as dst:
            shutil.copyfileobj(src, dst)
        order = json.dumps({"args": list(args), "env": dict(env), "log": str(log_path)}) + "\n"
        self.process.stdin.write(order.encode())
        self.process.stdin.close()
        process, self.process = self.process, None
        self._remove_folder()
        return process

    def discard(self, grace_s: float = 2.0) -> None:
        """End it: end of input first (it leaves by itself once its imports are done), then
        SIGKILL of its group (an import can take a while)."""

        process, self.process = self.process, None
        if process is not None:
            with contextlib.suppress(OSError, ValueError):
                if process.stdin is not None:
                    process.stdin.close()
            try:
                process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=5)
        self._remove_folder()

    def _remove_folder(self) -> None:
        folder, self.folder = self.folder, None
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
