"""How steady is this host's CPU, with nothing of ours running on it?

A small model decodes a token in 1-2 ms on an H200, and nearly all of that is host-side
Python (the API server, the engine core's scheduler, kernel launches). Its speed at low
concurrency is the CPU's, so no load setting can make it steadier than the host's own CPU.
This benchmark measures that floor directly: one process per chosen CPU (pinned to it) runs
a fixed pure-Python workload back to back for ``--seconds``; each run's time is recorded.
It prints, per CPU, the spread of 1-second and 5-second means (CV, min-max) and the
correlation of the 5-second series between CPUs (near 1: the whole host changes speed, e.g.
its clock; near 0: each CPU has its own neighbours), with /proc/stat's steal fraction over
the run (a hypervisor taking the CPU away; it does not see a busy hyperthread sibling).

    python benchmarks/host_steadiness.py --seconds 90 --cpus 0,7,15 --out host.json
    python benchmarks/host_steadiness.py --summarize host.json     # print a saved run again

Needs only the standard library (it runs on a bare GPU box before anything is installed).
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any


def workload(n: int = 200_000) -> int:
    """The fixed piece of work timed (~15-25 ms of CPython on a server core)."""
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


def _run_on(cpu: int, seconds: float, queue: Any) -> None:
    os.sched_setaffinity(0, {cpu})
    times: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        began = time.perf_counter()
        workload()
        times.append(time.perf_counter() - began)
    queue.put((cpu, times))


def _cpu_ticks() -> list[int]:
    with open("/proc/stat", encoding="ascii") as f:
        return [int(x) for x in f.readline().split()[1:]]


def measure(cpus: list[int], seconds: float) -> dict[str, Any]:
    before = _cpu_ticks()
    queue: Any = mp.Queue()
    procs = [mp.Process(target=_run_on, args=(c, seconds, queue)) for c in cpus]
    for p in procs:
        p.start()
    results = dict(queue.get() for _ in procs)
    for p in procs:
        p.join()
    delta = [b - a for a, b in zip(before, _cpu_ticks(), strict=False)]
    # /proc/stat's eighth column is steal (time the hypervisor ran someone else).
    steal = delta[7] / sum(delta) if len(delta) > 7 and sum(delta) else None
    return {"host": platform.node(), "cpus_online": os.cpu_count(), "seconds": seconds,
            "steal_fraction": steal,
            "per_cpu": {str(c): {"series_ms": [round(1e3 * t, 3) for t in results[c]]}
                        for c in cpus}}


def buckets(series_ms: list[float], width_s: float) -> list[float]:
    """Means of consecutive ``width_s`` stretches of the back-to-back run times."""
    out: dict[int, list[float]] = {}
    clock = 0.0
    for t in series_ms:
        # A run belongs to the stretch it started in.
        out.setdefault(int(clock / 1e3 / width_s), []).append(t)
        clock += t
    # The last stretch is cut by the end of the run: keep it only when nearly full.
    keys = sorted(out)
    if len(keys) > 1 and len(out[keys[-1]]) < 0.8 * len(out[keys[0]]):
        keys = keys[:-1]
    return [statistics.fmean(out[k]) for k in keys]


def summarize(data: dict[str, Any]) -> dict[str, Any]:
    per: dict[str, Any] = {}
    fives: dict[str, list[float]] = {}
    for cpu, rec in data["per_cpu"].items():
        s = rec["series_ms"]
        row: dict[str, Any] = {"runs": len(s), "mean_ms": statistics.fmean(s)}
        for width in (1.0, 5.0):
            b = buckets(s, width)
            row[f"cv_{width:g}s"] = statistics.stdev(b) / statistics.fmean(b) if len(b) > 1 else None
            row[f"min_max_{width:g}s"] = (min(b), max(b))
        fives[cpu] = buckets(s, 5.0)
        per[cpu] = row
    corr = {}
    for a, b in itertools.combinations(sorted(fives), 2):
        n = min(len(fives[a]), len(fives[b]))
        if n > 2:
            corr[f"{a}-{b}"] = statistics.correlation(fives[a][:n], fives[b][:n])
    return {"per_cpu": per, "correlation_5s": corr, "steal_fraction": data.get("steal_fraction")}


def print_summary(summary: dict[str, Any]) -> None:
    print("cpu   runs  mean ms   CV of 1-s means  CV of 5-s means  5-s means min-max ms")
    for cpu, r in summary["per_cpu"].items():
        lo, hi = r["min_max_5s"]
        print(f"{cpu:>3}  {r['runs']:5d}  {r['mean_ms']:7.2f}   {100 * (r['cv_1s'] or 0):13.1f} %"
              f"  {100 * (r['cv_5s'] or 0):13.1f} %   {lo:6.1f} - {hi:6.1f} (x{hi / lo:.2f})")
    if summary["correlation_5s"]:
        print("correlation of the 5-s series between CPUs: " + ", ".join(
            f"{k} {v:+.2f}" for k, v in summary["correlation_5s"].items()))
    steal = summary["steal_fraction"]
    print(f"steal (all CPUs, whole run): {'n/a' if steal is None else f'{100 * steal:.2f} %'}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--cpus", default="0", help="comma-separated CPUs, one process on each")
    p.add_argument("--out", help="JSON file to write (the raw series and the summary)")
    p.add_argument("--summarize", help="print the summary of a saved run and exit")
    args = p.parse_args(argv)
    if args.summarize:
        print_summary(summarize(json.loads(Path(args.summarize).read_text())))
        return 0
    cpus = [int(c) for c in args.cpus.split(",")]
    allowed = os.sched_getaffinity(0)
    if not set(cpus) <= allowed:
        p.error(f"--cpus {args.cpus}: not all of them are usable here (allowed: {sorted(allowed)})")
    data = measure(cpus, args.seconds)
    data["summary"] = summarize(data)
    if args.out:
        Path(args.out).write_text(json.dumps(data) + "\n", encoding="utf-8")
    print_summary(data["summary"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
