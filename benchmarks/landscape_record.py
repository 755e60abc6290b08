"""Turn a finished grid study on a real server into a landscape file the benchmarks replay.

    PYTHONPATH=. .venv/bin/python benchmarks/landscape_record.py STUDY_FOLDER STUDY_FILE \\
        [--loadavg FILE] [--out benchmarks/landscapes/NAME.json]

STUDY_FOLDER is the study's results folder (``tuner run --results ROOT`` wrote it as
ROOT/NAME), STUDY_FILE the grid study that measured it (``benchmarks/landscapes/*.yaml``:
``sampler: grid``, ``execution: {early_stop: false}``, so every allowed point ran in full).
Each trial's ``command.json`` (its point), ``outcome.json`` (what the tuner was told:
status, applied, probe, level metrics, startup/probe/load seconds) and ``metrics.json``
(each level's warm-up and run seconds) become one point; the objectives and constraints are
recomputed with ``tuner.study.scoring``, the tuner's own rule. ``--loadavg`` is a file of
"unix-time 1min 5min 15min ..." lines sampled while the study ran (the machine is shared:
each point records the mean one-minute load average during its trial, and the file the
range). ``tuner.sim.landscape.ground_truth`` reads the result.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner.sim.landscape import LANDSCAPE_VERSION, ground_truth  # noqa: E402
from tuner.study import space  # noqa: E402
from tuner.study.outcome import TrialOutcome  # noqa: E402
from tuner.study.scoring import constraints, metric_value  # noqa: E402
from tuner.study.study_file import parse_study  # noqa: E402

NOTE = ("Measured on a shared machine: other sessions ran tests, benchmarks and simulated studies on the "
        "same cores (real vLLM servers were serialised by a lock, so no two ran at once). The load "
        "average during each trial is recorded with it; absolute values carry that noise, the shape of "
        "the landscape (which points dominate which) is what the benchmarks use.")


def _json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _loadavg(path: Path | None) -> list[tuple[float, float]]:
    if path is None:
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        parts = line.split()
        if len(parts) >= 2:
            rows.append((float(parts[0]), float(parts[1])))
    return rows


def _level_seconds(metrics: dict[str, Any] | None) -> dict[str, float]:
    """Warm-up + measured run of each level, as the load generator timed them."""

    out: dict[str, float] = {}
    for level in (metrics or {}).get("levels") or []:
        warm = float(((level.get("warmup") or {}).get("duration_s")) or 0.0)
        run = float((level.get("metrics") or {}).get("run_duration_s") or 0.0)
        out[str(level["concurrency"])] = warm + run
    return out


def point_of(spec: Any, trial_dir: Path, load: list[tuple[float, float]]) -> dict[str, Any] | None:
    """One trial folder as a landscape point (None: not a finished trial)."""

    command = _json(trial_dir / "command.json")
    data = _json(trial_dir / "outcome.json")
    if command is None or data is None:
        return None
    outcome = TrialOutcome.model_validate(data)
    seconds = _level_seconds(_json(trial_dir / "metrics.json"))
    levels = {c: {"metrics": {k: v for k, v in lv.items() if isinstance(v, (int, float)) and v is not None},
                  "load_s": round(seconds.get(c, 0.0), 3)} for c, lv in outcome.levels.items()}
    objectives = {o.label: metric_value(spec, outcome, o) for o in spec.objectives}
    violated = constraints(spec, outcome) if outcome.status == "completed" else {}
    during = [v for t, v in load if (outcome.started_unix or 0) <= t <= (outcome.finished_unix or 0)]
    return {
        "trial": outcome.number,
        "values": dict(command["values"]),
        "status": outcome.status, "reason": outcome.reason, "message": outcome.message,
        "applied": outcome.applied is not False,
        "mismatches": [m.get("target") if isinstance(m, dict) else str(m) for m in outcome.mismatches],
        "probe_passed": outcome.probe_passed is not False,
        "objectives": objectives,
        "constraints": violated,
        "feasible": outcome.status == "completed" and all(v <= 0 for v in violated.values())
        and all(v is not None for v in objectives.values()),
        "startup_s": outcome.startup_s, "probe_s": outcome.probe_s, "load_s": outcome.load_s,
        "stop_s": (outcome.stop or {}).get("seconds"), "trial_s": outcome.trial_s,
        "levels": levels,
        "compile": outcome.compile,
        "started_unix": outcome.started_unix, "finished_unix": outcome.finished_unix,
        "loadavg_1m": round(statistics.mean(during), 2) if during else None,
    }


def _vllm_version(folder: Path) -> str | None:
    for log in sorted(folder.glob("trials/*/server.log")):
        match = re.search(r"Initializing a V1 LLM engine \(v([^)]+)\)", log.read_text(errors="replace"))
        if match:
            return match.group(1)
    return None


def _machine() -> dict[str, Any]:
    cpu = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = None
    try:
        mem = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30, 1)
    except (OSError, ValueError):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": mem, "system": platform.platform(),
            "python": platform.python_version()}


def _points(spec: Any, folder: Path, load: list[tuple[float, float]]) -> list[dict[str, Any]]:
    out = []
    for trial_dir in sorted((folder / "trials").iterdir()):
        point = point_of(spec, trial_dir, load)
        if point is not None:
            point["study"] = folder.name
            out.append(point)
    return out


def record(folder: Path, study_file: Path, loadavg: Path | None, also: Sequence[Path] = ()) -> dict[str, Any]:
    spec = parse_study(study_file.read_text(encoding="utf-8"), str(study_file))
    load = _loadavg(loadavg)
    # A grid study runs each point once; a re-run (interrupted, resumed) keeps the last.
    by_key = {space.params_key(p["values"]): p for p in _points(spec, folder, load)}
    replaced = []
    for extra in also:
        # Points measured again by another study (same settings): they replace the grid's
        # trials of the same points, which are kept in the record's "replaced" list.
        for point in _points(spec, extra, load):
            key = space.params_key(point["values"])
            if key in by_key:
                old = by_key[key]
                replaced.append({k: old[k] for k in ("study", "trial", "values", "status", "reason", "message")})
            by_key[key] = point
    points = sorted(by_key.values(), key=lambda p: (p["started_unix"] or 0))
    starts = [p["started_unix"] for p in points if p["started_unix"]]
    ends = [p["finished_unix"] for p in points if p["finished_unix"]]
    during = [v for t, v in load if starts and min(starts) <= t <= max(ends)]
    landscape = {
        "version": LANDSCAPE_VERSION,
        "name": spec.name,
        "study_file": (str(study_file.relative_to(ROOT)) if study_file.resolve().is_relative_to(ROOT)
                       else str(study_file)),
        "study_sha256": hashlib.sha256(study_file.read_bytes()).hexdigest(),
        "vllm_version": _vllm_version(folder),
        "machine": _machine(),
        "note": NOTE,
        "measured": {
            "first_start_unix": min(starts) if starts else None,
            "last_end_unix": max(ends) if ends else None,
            "trial_seconds_total": round(sum(p["trial_s"] or 0.0 for p in points), 1),
            "loadavg_1m": ({"min": min(during), "median": statistics.median(during), "max": max(during),
                            "samples": len(during)} if during else None),
        },
        "objectives": [o.model_dump(mode="json") for o in spec.objectives],
        "load": spec.load.model_dump(mode="json"),
        "replaced": replaced,
        "points": points,
    }
    truth = ground_truth(spec, landscape)    # refuses a landscape that does not cover the space
    landscape["front"] = [truth.points[i].values for i in truth.front]
    return landscape


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path)
    ap.add_argument("study_file", type=Path)
    ap.add_argument("--loadavg", type=Path)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--also", type=Path, action="append", default=[],
                    help="a study folder whose trials replace the grid's trials of the same points")
    ap.add_argument("--note", default="", help="added to the landscape's note (why points were replaced)")
    args = ap.parse_args()
    landscape = record(args.folder, args.study_file.resolve(), args.loadavg, args.also)
    if args.note:
        landscape["note"] += " " + args.note
    out = args.out or ROOT / "benchmarks" / "landscapes" / f"{landscape['name']}.json"
    out.write_text(json.dumps(landscape, indent=1) + "\n", encoding="utf-8")
    feasible = sum(p["feasible"] for p in landscape["points"])
    print(f"{out}: {len(landscape['points'])} points ({feasible} feasible), front {len(landscape['front'])}, "
          f"vLLM {landscape['vllm_version']}, trials {landscape['measured']['trial_seconds_total']:.0f} s")
    for p in landscape["points"]:
        objs = ", ".join(f"{k}={v:.2f}" if v is not None else f"{k}=-" for k, v in p["objectives"].items())
        print(f"  {p['study']:<22} {p['trial']:>3} {'ok ' if p['feasible'] else 'NO '} {objs}  "
              f"{p['trial_s'] or 0:.0f}s load {p['loadavg_1m']}  {p['values']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
