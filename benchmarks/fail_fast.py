"""How soon after a server's fatal line or exit does the launcher fail the start?

The tests only check that detection ends the wait long before the startup timeout (they run
beside a busy vLLM server in CI, where a 0.1 s poll can take seconds). This prints the figure
itself, on this box as it is: for each recorded vLLM 0.26.0 H200 failure log, replayed by a
stand-in that prints the real lines and then hangs (optionally holding its port open and
silent), and for the simulator's crash and out-of-memory starts, ``--repeats`` starts each.

Latency is wall time from the stand-in's last line (or the simulator log's last write) to the
moment ``wait_ready`` raised. The launcher's own floor is ``POLL_S`` (0.1 s), plus
``PENDING_GRACE_S`` (1 s) for a generic line whose root cause never follows.

Usage::

    PYTHONPATH=. .venv/bin/python benchmarks/fail_fast.py --repeats 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.conftest import free_port_block  # noqa: E402
from tests.test_gpu_fail_fast import CASES, LOGS, REPLAY  # noqa: E402
from tuner.adapters.launcher import PENDING_GRACE_S, POLL_S, ServerProcess  # noqa: E402
from tuner.errors import ServerExited, ServerFatalLog  # noqa: E402

SIM_FAULTS = ("crash_at_start", "oom_at_start")


async def _detect(server: ServerProcess) -> float:
    server.start()
    try:
        await server.wait_ready(60)
    except (ServerExited, ServerFatalLog):
        return time.time()
    finally:
        await server.stop(2.0)
    raise RuntimeError("the failing server became ready")


def replayed(log: Path, hold_port: bool, work: Path) -> float:
    port = free_port_block(1)
    printed = work / "printed"
    argv = [sys.executable, "-c", REPLAY, str(log), str(printed), *(["hold_port", str(port)] if hold_port else [])]
    server = ServerProcess(argv, {"PATH": "/usr/bin:/bin"}, work / "server.log", host="127.0.0.1", port=port,
                           served_model_name="smol", stop_grace_s=2.0, ready_request_timeout_s=60.0)
    detected = asyncio.run(_detect(server))
    return detected - float(printed.read_text())


def simulated(fault: str, work: Path) -> float:
    port = free_port_block(1)
    env = dict(os.environ, PYTHONPATH=str(ROOT), TUNER_SIM_PROFILE="tiny-cpu", TUNER_SIM_TIME_SCALE="0.01",
               TUNER_SIM_FAULTS=json.dumps([{"fault": fault}]))
    argv = [sys.executable, "-m", "tuner.sim", "--model", "smol", "--port", str(port)]
    server = ServerProcess(argv, env, work / "server.log", host="127.0.0.1", port=port,
                           served_model_name="smol", stop_grace_s=2.0)
    detected = asyncio.run(_detect(server))
    return detected - (work / "server.log").stat().st_mtime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    runs: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        starts = 0

        def folder() -> Path:
            nonlocal starts
            starts += 1
            work = Path(tmp) / str(starts)
            work.mkdir()
            return work

        for _ in range(args.repeats):
            for log, *_case in CASES:
                for hold in (False, True):
                    file = Path(log).name if Path(log).name != "server.log" else Path(log).parent.name
                    name = f"{file}{' (port held)' if hold else ''}"
                    runs.setdefault(name, []).append(replayed(LOGS / log, hold, folder()))
            for fault in SIM_FAULTS:
                runs.setdefault(f"simulator {fault}", []).append(simulated(fault, folder()))

    load = os.getloadavg()[0]
    print(f"detection latency, {args.repeats} starts each (POLL_S {POLL_S} s, PENDING_GRACE_S "
          f"{PENDING_GRACE_S} s; load average {load:.2f})")
    print(f"{'case':<48} {'median s':>9} {'max s':>7}")
    for name, values in runs.items():
        print(f"{name:<48} {statistics.median(values):>9.2f} {max(values):>7.2f}")
    out = args.out or ROOT / "benchmarks" / "results" / f"fail_fast-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"load_average": load, "repeats": args.repeats, "latency_s": runs}, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
