"""What do the startup levers (execution.startup) save, on a real study?

Issue 35's target: on one H100 with the 8B-class model (search_spaces/d8b-h100.yaml), a
cache-hit start <= 40 s and starting servers <= 35 % of trial time at the study's levels.

What it does: runs the study twice with ``tuner run``, the same trials in the same order,
first with every lever off, then with the ones named in ``--levers`` on; each run in its own
results folder with its own vLLM cache root (both start cold). The trials are the
baseline (with ``--noise-starts`` fresh starts of it: the first a torch.compile cache miss,
the others hits) and the study's first ``--points`` starting points. For each run it prints:
median start, cold (cache miss or nothing to compile) and cache-hit; what the trials waited
for their servers (a spare's imports are done ahead, tuner.adapters.spare); the share of
trial time spent waiting; the median phases; the gap between one trial's end and the next
server's launch (the trial loop's own overhead). Writes it all to ``--out`` as JSON.

Needs the tuner and, for a real server, what the study's command needs. Usage::

    python3 benchmarks/startup_levers.py search_spaces/d8b-h100.yaml --points 3 \\
        --noise-starts 2 --out benchmarks/results/startup_levers-h100.json
    # CPU build (eager starts; ~6 min on 2 cores):
    .venv/bin/python benchmarks/startup_levers.py search_spaces/smollm2-cpu.yaml --points 1 \\
        --noise-starts 2 --levers prestart --set probe.enabled=false --out /tmp/levers-cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
# The H100 run of 2026-12-06 also had vLLM's VLLM_ENABLE_STARTUP_PLAN on: its re-used memory
# profile gave cache-hit servers 257,904 KV-cache tokens where a fresh profile gives 267,504,
# another configuration than the one measured, so it is no lever (docs/gpu-box.md).
LEVERS = ("prestart", "triton_cache")


def _set(data: dict[str, Any], dotted: str, text: str) -> None:
    *path, last = dotted.split(".")
    for key in path:
        data = data.setdefault(key, {})
    data[last] = yaml.safe_load(text)


def study_variant(study: dict[str, Any], name: str, levers: list[str], args: argparse.Namespace) -> dict[str, Any]:
    data = json.loads(json.dumps(study))
    data["name"] = name
    data["starting_points"] = list(data.get("starting_points") or [])[:args.points]
    data.setdefault("load", {})["noise_starts"] = args.noise_starts
    # The baseline's further starts are trials of the budget too.
    data["budget"] = {**(data.get("budget") or {}), "n_trials": args.noise_starts + len(data["starting_points"])}
    execution = data.setdefault("execution", {})
    execution.pop("compile_cache_dir", None)   # each run its own cache root, cold at its start
    execution["startup"] = {lever: lever in levers for lever in LEVERS}
    data.pop("confirm", None)
    for item in args.set:
        key, _, value = item.partition("=")
        _set(data, key, value)
    return data


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


def figures(folder: Path) -> dict[str, Any]:
    """Per-trial start figures of one run's study folder, and their summary."""

    rows = []
    for path in sorted(folder.glob("trials/*/outcome.json")):
        out = json.loads(path.read_text())
        start = out.get("startup") or {}
        rows.append({
            "trial": out["number"], "status": out["status"], "startup_s": out.get("startup_s"),
            "wait_s": out.get("start_wait_s") if out.get("start_wait_s") is not None else out.get("startup_s"),
            "trial_s": out.get("trial_s"), "cache": start.get("compile_cache"),
            "phases": start.get("phases") or {}, "overlapped_s": start.get("overlapped_s"),
            "began": out.get("started_unix"), "ended": out.get("finished_unix"),
            "stop_s": (out.get("stop") or {}).get("seconds"), "gpu_wait_s": out.get("gpu_wait_s"),
            "prestart": out.get("prestart"),
        })
    started = [r for r in rows if r["startup_s"] is not None]
    cold = [r for r in started if r["cache"] in ("miss", "none", None)]
    hit = [r for r in started if r["cache"] == "hit"]
    trial_s = sum(r["trial_s"] or 0.0 for r in rows)
    # Between two servers: the previous one's stop, the driver's hand-over to the next trial,
    # that trial's wait for free GPUs (record writing falls in the first two).
    gaps = [round((a["stop_s"] or 0.0) + (b["began"] - a["ended"]) + (b["gpu_wait_s"] or 0.0), 3)
            for a, b in zip(rows, rows[1:]) if a["ended"] is not None and b["began"] is not None]
    phases = sorted({p for r in started for p in r["phases"]})
    return {
        "trials": rows,
        "median_start_s": {"all": _median([r["startup_s"] for r in started]),
                           "cold": _median([r["startup_s"] for r in cold]),
                           "hit": _median([r["startup_s"] for r in hit])},
        "median_wait_s": {"all": _median([r["wait_s"] for r in started]),
                          "cold": _median([r["wait_s"] for r in cold]),
                          "hit": _median([r["wait_s"] for r in hit])},
        "startup_share": round(sum(r["wait_s"] or 0.0 for r in rows) / trial_s, 3) if trial_s else None,
        "median_phases_s": {p: _median([r["phases"][p] for r in started if p in r["phases"]]) for p in phases},
        "loop_gap_s": {"median": _median(gaps), "max": max(gaps) if gaps else None, "all": gaps},
    }


def run(study_file: Path, results: Path, timeout_s: float) -> dict[str, Any]:
    began = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "tuner", "run", str(study_file), "--results", str(results),
                           "--timeout", f"{timeout_s:.0f}s"], cwd=os.getcwd(), check=False)
    return {"rc": proc.returncode, "wall_s": round(time.monotonic() - began, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("study", type=Path)
    ap.add_argument("--points", type=int, default=3, help="starting points run after the baseline")
    ap.add_argument("--noise-starts", type=int, default=2, help="fresh starts of the baseline")
    ap.add_argument("--levers", default=",".join(LEVERS), help=f"comma-separated, of {', '.join(LEVERS)}")
    ap.add_argument("--set", action="append", default=[], help="KEY.PATH=YAML value in both runs")
    ap.add_argument("--timeout", type=float, default=900.0, help="each run's wall-clock budget, seconds")
    ap.add_argument("--results", type=Path, default=None, help="where both runs' study folders go")
    ap.add_argument("--order", default="off,on", choices=("off,on", "on,off", "off", "on"),
                    help="which arms run, in this order (a lease cut short keeps the first)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    levers = [x for x in args.levers.split(",") if x]
    if unknown := sorted(set(levers) - set(LEVERS)):
        ap.error(f"--levers: unknown {unknown}; known: {', '.join(LEVERS)}")
    study = yaml.safe_load(args.study.read_text())
    results = args.results or Path(tempfile.mkdtemp(prefix="startup-levers-"))
    report: dict[str, Any] = {"study": str(args.study), "levers": levers, "host": os.uname().nodename, "runs": {}}
    for arm in args.order.split(","):
        name = f"{study['name']}-levers-{arm}"
        variant = study_variant(study, name, levers if arm == "on" else [], args)
        path = results / f"{name}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(variant, sort_keys=False))
        outcome = run(path, results, args.timeout)
        report["runs"][arm] = {**outcome, **figures(results / name)}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))   # after each run: a cut lease keeps the first
        fig = report["runs"][arm]
        print(f"levers {arm}: start median {fig['median_start_s']}, trial waited {fig['median_wait_s']}, "
              f"startup share {fig['startup_share']}, loop gap {fig['loop_gap_s']['median']} s "
              f"(max {fig['loop_gap_s']['max']})", flush=True)
        print(f"  phases: {fig['median_phases_s']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
