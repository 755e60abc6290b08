"""How steady is this host's CPU, with nothing of ours running on it? (the evidence run
behind `tuner host-check`, keeping the raw series).

A small model decodes a token in 1-2 ms on an H200, and nearly all of that is host-side
Python, so at low concurrency its speed is the CPU's and no load setting makes it steadier
than the host. One process per chosen CPU runs a fixed piece of work back to back for
``--seconds`` (tuner.adapters.host_probe); it prints the spread of 1-s and 5-s means, their
correlation between CPUs and the steal share (tuner.load.host_steadiness), and writes the
raw series with the summary to ``--out``.

    python benchmarks/host_steadiness.py --seconds 90 --cpus 0,7,15 --out host.json
    python benchmarks/host_steadiness.py --summarize host.json     # print a saved run again

Needs the tuner package only (standard library underneath: it runs on a bare GPU box).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tuner.adapters.host_probe import measure  # noqa: E402
from tuner.load.host_steadiness import HostSteadiness, summarize  # noqa: E402


def from_saved(data: dict[str, Any]) -> HostSteadiness:
    """The summary of a saved run (``per_cpu: {cpu: {series_ms: [...]}}``, ``steal_fraction``)."""
    return summarize({int(c): v["series_ms"] for c, v in data["per_cpu"].items()}, data.get("steal_fraction"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--cpus", default="0", help="comma-separated CPUs, one process on each")
    p.add_argument("--out", help="JSON file to write (the raw series and the summary)")
    p.add_argument("--summarize", help="print the summary of a saved run and exit")
    args = p.parse_args(argv)
    if args.summarize:
        print(from_saved(json.loads(Path(args.summarize).read_text())).render())
        return 0
    cpus = [int(c) for c in args.cpus.split(",")]
    if not set(cpus) <= os.sched_getaffinity(0):
        p.error(f"--cpus {args.cpus}: not all of them are usable here "
                f"(allowed: {sorted(os.sched_getaffinity(0))})")
    series, steal = measure(cpus, args.seconds)
    host = summarize(series, steal)
    if args.out:
        Path(args.out).write_text(json.dumps({
            "seconds": args.seconds, "steal_fraction": steal,
            "per_cpu": {str(c): {"series_ms": [round(t, 3) for t in s]} for c, s in series.items()},
            "summary": host.to_dict()}) + "\n", encoding="utf-8")
    print(host.render())
    for line in host.verdict(None):
        print(f"- {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
