"""What an unbounded reply costs the client (issue #39, item 12).

1. The SSE parser alone: CPU seconds to parse one line of 8 / 16 / 32 MB fed in 64 KiB reads
   with the line cap lifted (the time must grow with the length, not its square), and with
   the default cap a 100 MB line (read up to its first MiB, then one error).
2. With ``--measure``: ``tuner measure --probe`` against the simulator answering every
   generation request with 100 MB (the ``huge_reply`` fault): wall and CPU seconds and the
   measuring process's peak RSS, its exit status and first reason line.

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/untrusted_replies.py [--measure]``
(part 1 takes a second, part 2 about ten). Writes benchmarks/results/untrusted_replies.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner.load.sse import SSEParser  # noqa: E402

READ = 65536
STUDY = """
name: untrusted-bench
server: {command: ["python", -m, tuner.sim], model: /models/smol, served_model_name: smol}
load:
  api: completions
  concurrency: [1]
  requests_per_stream: 4
  min_requests: 4
  warmup_requests: 1
  workload: {classes: [{name: chat, kind: open_ended, prompt_tokens: 32, output_tokens: 12}]}
probe: {items: 4, concurrency: [1], min_accuracy: 0.0, reference: {enabled: false}}
"""


def parse_cpu_s(megabytes: int, max_line: int | None) -> tuple[float, int]:
    """CPU seconds to feed one ``megabytes`` MB line in 64 KiB reads; events returned."""
    line = b'data: {"id":"x","choices":[{"text":"' + b"a" * (megabytes << 20) + b'"}]}\n\n'
    parser = SSEParser() if max_line is None else SSEParser(max_line=max_line)
    began = time.process_time()
    events = 0
    for i in range(0, len(line), READ):
        events += len(parser.feed(line[i:i + READ]))
        if parser.overflowed:
            break
    return time.process_time() - began, events


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def measure_huge(megabytes: float) -> dict[str, Any]:
    """``tuner measure --probe`` against a simulator sending ``megabytes`` MB replies."""
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TUNER_SIM_PROFILE": "tiny-cpu",
           "TUNER_SIM_TIME_SCALE": "0.02", "TUNER_SIM_STARTUP_SCALE": "0.001",
           "TUNER_SIM_FAULTS": json.dumps([{"fault": "huge_reply", "megabytes": megabytes}])}
    with tempfile.TemporaryDirectory() as tmp:
        study = Path(tmp) / "study.yaml"
        study.write_text(STUDY)
        sim = subprocess.Popen([sys.executable, "-m", "tuner.sim", "serve", "--model", "/models/smol",
                                "--served-model-name", "smol", "--port", str(port)],
                               env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            for _ in range(600):
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.1)
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            began = time.monotonic()
            run = subprocess.run([sys.executable, "-m", "tuner", "measure", str(study),
                                  "--url", f"http://127.0.0.1:{port}", "--probe",
                                  "-o", str(Path(tmp) / "out")],
                                 cwd=ROOT, capture_output=True, text=True, timeout=900)
            wall = time.monotonic() - began
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
        finally:
            os.killpg(sim.pid, signal.SIGKILL)
            sim.wait()
    reasons = [ln for ln in run.stderr.splitlines() if ln.startswith("tuner measure: ")]
    return {"megabytes": megabytes, "exit": run.returncode, "wall_s": round(wall, 1),
            "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1),
            "peak_rss_mb": after.ru_maxrss // 1024, "first_reason": reasons[0] if reasons else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--measure", action="store_true", help="also part 2 (about 10 s)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/untrusted_replies.json"))
    args = parser.parse_args()
    out: dict[str, Any] = {"load_average": os.getloadavg(), "parse_uncapped": {}}
    print("line MB   parse CPU s (cap lifted)")
    for mb in (8, 16, 32):
        cpu, events = parse_cpu_s(mb, 1 << 30)
        assert events == 1
        out["parse_uncapped"][mb] = round(cpu, 3)
        print(f"{mb:7d}   {cpu:.3f}")
    cpu, events = parse_cpu_s(100, None)
    out["parse_100mb_capped"] = {"cpu_s": round(cpu, 4), "events": events}
    print(f"    100   {cpu:.4f} with the 1 MiB cap ({events} error event)")
    if args.measure:
        out["measure_probe_100mb"] = got = measure_huge(100)
        print(f"tuner measure --probe, 100 MB replies: exit {got['exit']}, {got['wall_s']} s wall, "
              f"{got['cpu_s']} s CPU, peak RSS {got['peak_rss_mb']} MB")
        print(f"  {got['first_reason']}")
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
