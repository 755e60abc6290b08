"""Start and stop a real vLLM CPU server for the benchmark scripts (not used by the tuner).

The server runs from the vLLM venv prepared by ``scripts/setup_vllm_cpu.sh``
(``.venv-vllm``) with the small test model (``.models/smollm2-135m-instruct``), in its own
process group so that stopping it also stops its EngineCore child.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
MODEL_DIR = ROOT / ".models" / "smollm2-135m-instruct"
SERVED = "smollm2"
BASE_FLAGS = ["--enforce-eager", "--dtype", "float32", "--max-model-len", "2048"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def available() -> str | None:
    """None when the vLLM venv and model are there, else what is missing."""
    if not VLLM_PYTHON.exists():
        return f"{VLLM_PYTHON} not found (run scripts/setup_vllm_cpu.sh)"
    if not (MODEL_DIR / "config.json").exists():
        return f"{MODEL_DIR} not found (run scripts/setup_vllm_cpu.sh)"
    return None


class VllmServer:
    """``with VllmServer(log_path, extra_flags) as srv: srv.url ...``"""

    def __init__(self, log_path: Path, extra_flags: list[str] | None = None,
                 startup_timeout: float = 600.0, cpus: set[int] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.argv = [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server",
                     "--model", str(MODEL_DIR), "--served-model-name", SERVED,
                     "--host", "127.0.0.1", "--port", str(self.port),
                     *BASE_FLAGS, *(extra_flags or [])]
        self.startup_timeout = startup_timeout
        self.cpus = cpus
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> VllmServer:
        env = dict(os.environ)
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("wb")
        cpus = self.cpus

        def pin() -> None:
            if cpus:
                os.sched_setaffinity(0, cpus)

        self.proc = subprocess.Popen(self.argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True, cwd=ROOT, preexec_fn=pin)
        log.close()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _wait_ready(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"vLLM exited with {self.proc.returncode}:\n{tail}")
            try:
                with urllib.request.urlopen(self.url + "/v1/models", timeout=2) as r:
                    if SERVED in r.read().decode():
                        return
            except OSError:
                pass
            time.sleep(1.0)
        raise RuntimeError(f"vLLM not ready after {self.startup_timeout}s; log {self.log_path}")

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM the process group, wait, SIGKILL what is left, reap."""
        proc = self.proc
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the EngineCore child may outlive the parent
        except ProcessLookupError:
            pass
        proc.wait()
        self.proc = None

    def post_json(self, path: str, body: dict, timeout: float = 120.0) -> dict:
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())
