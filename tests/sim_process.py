"""The simulator as a real `vllm serve` stand-in process, for tests: Sim starts one on a free
port (conftest's ``start`` fixture starts them and kills them after the test), serving_sim
runs one serving 'smol' for a block, alive() tells a live process from a gone or zombie one,
chat() sends one chat completion."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.waiting import answers_health, wait_for

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still "exists": treat it as dead
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def wait_ready(proc: subprocess.Popen[bytes], url: str, log_path: Path, timeout: float) -> None:
    """Until the simulator ``proc`` answers ``url``/health; at once, with its log, if it exits."""

    def tail() -> str:
        return log_path.read_text(encoding="utf-8", errors="replace")[-3000:]

    def exited() -> str | None:
        return None if proc.poll() is None else f"sim exited {proc.returncode}:\n{tail()}"

    wait_for(lambda: answers_health(url), timeout, f"the simulator on {url} to be ready",
             unless=exited, context=tail)


@contextmanager
def serving_sim(folder: Path, *flags: str, **env: str) -> Iterator[str]:
    """The simulator serving 'smol' (fast clocks, tiny-cpu profile, ``flags`` and ``env`` on
    top) on a free port until the block ends; yields its URL, then kills its process group."""

    port = free_port()
    log = folder / f"sim-{port}.log"
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "TUNER_SIM_PROFILE": "tiny-cpu",
                "TUNER_SIM_TIME_SCALE": "0.02", "TUNER_SIM_STARTUP_SCALE": "0.001", **env}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tuner.sim", "serve", "--model", "/models/smol",
             "--served-model-name", "smol", "--port", str(port), *flags],
            stdout=out, stderr=subprocess.STDOUT, env=full_env, cwd=ROOT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, url, log, 60)
        yield url
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


class Sim:
    def __init__(self, tmp: Path, argv: list[str], env: dict[str, str]) -> None:
        self.port = free_port()
        self.log_path = tmp / f"sim-{self.port}.log"
        full_env = {**os.environ, "PYTHONPATH": str(ROOT), "TUNER_SIM_TIME_SCALE": "0.01",
                    "TUNER_SIM_PROFILE": "tiny-cpu", **env}
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tuner.sim", "serve", "--port", str(self.port), *argv],
                stdout=out, stderr=subprocess.STDOUT, env=full_env, cwd=ROOT,
                start_new_session=True)
        self.url = f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def wait_ready(self, timeout: float = 20.0) -> None:
        wait_ready(self.proc, self.url, self.log_path, timeout)

    def stays_up(self, seconds: float) -> bool:
        """Waits up to ``seconds`` on the process's exit: True if it did not come."""
        try:
            self.proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            return True
        return False

    def exited(self) -> str | None:
        """Why waiting on this simulator is hopeless: it exited (its log), or None."""
        if self.proc.poll() is None:
            return None
        return f"sim exited {self.proc.returncode}:\n{self.log()[-3000:]}"

    def child_pid(self) -> int:
        m = re.search(r"\(EngineCore pid=(\d+)\)", self.log())
        assert m, self.log()
        return int(m.group(1))

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=5)


def chat(url: str, content: str, **kw) -> dict:
    body = {"model": kw.pop("model", "/models/smol"),
            "messages": [{"role": "user", "content": content}], "temperature": 0, **kw}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=30)
    r.raise_for_status()
    return r.json()
