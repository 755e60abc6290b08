"""`tuner status`: what a study has done so far, readable while it runs."""

from __future__ import annotations

import collections
import json
import fcntl
import os
from typing import Any

import optuna

from tuner.core.durations import format_duration
from tuner.records import KIND_RUN, TrialRecord, front_records, read_records_direct
from tuner.study_store import StudyHandle

__all__ = ["build_status", "format_status", "study_is_running"]


def study_is_running(handle: StudyHandle) -> bool:
    """True when a tuner process holds the study's lock right now."""

    try:
        fd = os.open(handle.paths.lock, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def read_checks(handle: StudyHandle, number: int) -> list[dict[str, Any]]:
    """The trial's full asked-vs-got table from its verification.json (empty if absent)."""

    path = handle.paths.trial_dir(number) / "verification.json"
    try:
        return list(json.loads(path.read_text()).get("checks", []))
    except (OSError, ValueError):
        return []


def _trial_row(record: TrialRecord, handle: StudyHandle | None = None) -> dict[str, Any]:
    outcome = record.attrs.get("outcome", {})
    return {
        "trial": record.number,
        "state": record.state,
        "outcome": record.outcome,
        "baseline": record.is_baseline,
        "params": record.params,
        "values": record.values,
        "seconds": record.seconds,
        "failure": record.attrs.get("failure"),
        "mismatches": outcome.get("mismatches", []),
        "probe_passed": outcome.get("probe_passed"),
        "probe_reason": outcome.get("probe_reason"),
        "startup_s": outcome.get("startup_s"),
        "checks": read_checks(handle, record.number) if handle is not None else [],
    }


def build_status(handle: StudyHandle, study: optuna.Study) -> dict[str, Any]:
    # Straight from the tables: status runs in a fresh process, where Optuna would decode
    # every trial into a FrozenTrial first (about 1 s at 1,000 trials).
    records = read_records_direct(study)
    labels = list(study.metric_names or [])
    directions = [d.name.lower() for d in study.directions]
    runs = [r for r in records if r.kind == KIND_RUN]
    finished = [r for r in runs if r.state in ("COMPLETE", "FAIL")
                and r.attrs.get("failure", {}).get("reason") != "interrupted"]
    failures = collections.Counter(
        r.attrs.get("failure", {}).get("reason", "unknown") for r in runs if r.state == "FAIL"
    )
    outcomes = collections.Counter(r.outcome for r in runs)
    elapsed = float(study.user_attrs.get("elapsed_s", 0.0))
    spec = handle.spec
    timeout = spec.budget.timeout
    front = front_records(records, labels, directions)
    baseline = next((r for r in runs if r.is_baseline and r.state == "COMPLETE"), None)
    return {
        "study": handle.name,
        "running_now": study_is_running(handle),
        "target_trials": spec.budget.n_trials,
        "finished_trials": len(finished),
        "outcomes": dict(outcomes),
        "failures": dict(failures),
        "running": [r.number for r in runs if r.state == "RUNNING"],
        "skipped": {"duplicate": sum(r.kind == "duplicate" for r in records),
                    "forbidden": sum(r.kind == "forbidden" for r in records)},
        "elapsed_s": elapsed,
        "time_left_s": None if timeout is None else max(0.0, timeout - elapsed),
        "objectives": [{"label": l, "direction": d} for l, d in zip(labels, directions)],
        "baseline": None if baseline is None else {"trial": baseline.number, "values": baseline.values},
        "front": [_trial_row(r) for r in front],
        "trials": [_trial_row(r, handle) for r in runs],
    }


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "unset" if value is None else str(value)


def format_status(status: dict[str, Any], *, verbose: bool = True) -> str:
    lines = [
        f"study {status['study']}: {status['finished_trials']}/{status['target_trials']} trials finished"
        + (" (running now)" if status["running_now"] else ""),
        f"  outcomes: " + (", ".join(f"{k} {v}" for k, v in sorted(status["outcomes"].items())) or "none yet"),
        f"  time used {format_duration(status['elapsed_s'])}"
        + (f", left {format_duration(status['time_left_s'])}" if status["time_left_s"] is not None else ""),
    ]
    if status["running"]:
        lines.append(f"  running: trial(s) {', '.join(map(str, status['running']))}")
    skipped = status["skipped"]
    if skipped["duplicate"] or skipped["forbidden"]:
        lines.append(f"  not run: {skipped['duplicate']} duplicate, {skipped['forbidden']} forbidden proposals")
    labels = [o["label"] for o in status["objectives"]]
    base = status["baseline"]
    lines.append("")
    lines.append("Pareto front (feasible trials only):")
    if not status["front"]:
        lines.append("  (empty)")
    for row in status["front"]:
        vals = "  ".join(f"{label}={_fmt(row['values'].get(label))}" for label in labels)
        gain = ""
        if base:
            ratios = [
                f"{row['values'][l] / base['values'][l]:.2f}x"
                for l in labels if base["values"].get(l) and l in row["values"]
            ]
            gain = f"  (vs baseline: {' / '.join(ratios)})"
        params = " ".join(f"{k}={_fmt(v)}" for k, v in row["params"].items())
        lines.append(f"  trial {row['trial']:>3}{' [baseline]' if row['baseline'] else ''}: {vals}{gain}")
        lines.append(f"             {params}")
    if verbose:
        lines.append("")
        lines.append("Trials:")
        for row in status["trials"]:
            vals = "  ".join(f"{label}={_fmt(row['values'].get(label))}" for label in labels if label in row["values"])
            lines.append(f"  {row['trial']:>3} {row['outcome']:<22} {vals}")
            if row["failure"] and row["state"] == "FAIL":
                lines.append(f"        reason: {row['failure'].get('message') or row['failure'].get('reason')}")
            checked = [c for c in row["checks"] if c.get("status") != "unverifiable"]
            if checked:
                lines.append("        asked vs got: " + ", ".join(
                    f"{c['target']}={_fmt(c.get('asked'))}"
                    + ("" if c.get("status") == "applied" else f" -> GOT {_fmt(c.get('got'))}")
                    for c in checked))
            for m in row["mismatches"]:
                lines.append(f"        not applied: {m.get('target')}: asked {m.get('asked')!r}, got {m.get('got')!r}")
                if m.get("evidence"):
                    lines.append(f"          evidence: {m['evidence'][:200]}")
            if row["probe_passed"] is False:
                lines.append(f"        probe failed: {row['probe_reason']}")
    return "\n".join(lines)
