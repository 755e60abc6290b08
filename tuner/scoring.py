"""From a trial's outcome to what the optimizer and the study files are told.

Pure functions of (spec, outcome) and (records): objective values, constraints, the
outcome summary kept in the storage, and the content of pareto.json.
"""

from __future__ import annotations

import time
from typing import Any

from tuner.core.outcome import TrialOutcome
from tuner.core.pareto import pareto_front
from tuner.core.spec import ObjectiveSpec, StudySpec
from tuner.records import KIND_RUN, TrialRecord, record_points

__all__ = ["level_of", "metric_value", "constraints", "outcome_attrs", "pareto_payload",
           "result_text", "values_text"]


def level_of(spec: StudySpec, item: ObjectiveSpec | Any) -> int:
    levels = spec.load.concurrency
    if item.concurrency == "max":
        return max(levels)
    if item.concurrency == "min":
        return min(levels)
    return int(item.concurrency)


def metric_value(spec: StudySpec, outcome: TrialOutcome, item: Any) -> float | None:
    if item.metric in ("startup_s", "probe_s", "trial_s"):
        return getattr(outcome, item.metric)
    level = outcome.levels.get(str(level_of(spec, item)), {})
    value = level.get(item.metric)
    return None if value is None else float(value)


def constraints(spec: StudySpec, outcome: TrialOutcome) -> dict[str, float]:
    """Optuna constraints (> 0 = violated) of a completed trial.

    ``load_errors`` counts measured requests that failed (HTTP 5xx, malformed streams,
    timeouts): the statistics of the rest would describe a server that does not really
    serve this load, so such a point never reaches the front.
    """

    failed = sum(float(level.get("failed") or 0.0) for level in outcome.levels.values())
    result = {
        "probe": 0.0 if outcome.probe_passed in (True, None) else 1.0,
        "applied": 0.0 if (outcome.applied is not False or not spec.verify.require_applied)
        else float(max(1, len(outcome.mismatches))),
        "load_errors": failed,
    }
    for limit in spec.limits:
        value = metric_value(spec, outcome, limit)
        if value is None:
            violation = 1.0
        elif limit.max is not None:
            violation = value - limit.max
        else:
            violation = limit.min - value  # type: ignore[operator]
        result[f"limit:{limit.label}"] = float(violation)
    return result


def outcome_attrs(outcome: TrialOutcome) -> dict[str, Any]:
    """The part of an outcome worth keeping in the storage (full details are on disk)."""

    return {
        "status": outcome.status,
        "host": outcome.host,
        "startup_s": outcome.startup_s,
        "probe_s": outcome.probe_s,
        "load_s": outcome.load_s,
        "trial_s": outcome.trial_s,
        "applied": outcome.applied,
        "mismatches": outcome.mismatches,
        "probe_passed": outcome.probe_passed,
        "probe_reason": outcome.probe_reason,
        "levels": outcome.levels,
        "server_side": outcome.server_side,
        "started_unix": outcome.started_unix,
        "finished_unix": outcome.finished_unix,
        "detected_unix": outcome.detected_unix,
        "warnings": outcome.warnings,
        "stop": outcome.stop,
    }


def pareto_payload(name: str, records: list[TrialRecord], labels: list[str],
                   directions: list[str]) -> dict[str, Any]:
    by_number = {r.number: r for r in records}
    front = pareto_front(record_points(records, labels), directions)
    baseline = next((r for r in records if r.is_baseline and r.state == "COMPLETE" and r.kind == KIND_RUN), None)
    entries = []
    for point in front:
        record = by_number[point.number]
        entry = {
            "trial": point.number,
            "values": dict(zip(labels, point.values)),
            "params": record.params,
            "command": record.attrs.get("command"),
            "baseline": record.is_baseline,
        }
        if baseline is not None:
            entry["vs_baseline"] = {
                label: (v / baseline.values[label] if baseline.values.get(label) else None)
                for label, v in zip(labels, point.values)
            }
        entries.append(entry)
    return {
        "study": name,
        "objectives": [{"label": l, "direction": d} for l, d in zip(labels, directions)],
        "updated_unix": time.time(),
        "trials_finished": sum(1 for r in records if r.kind == KIND_RUN and r.state in ("COMPLETE", "FAIL")),
        "baseline": None if baseline is None else {"trial": baseline.number, "values": baseline.values},
        "front": entries,
    }


def values_text(values: dict[str, Any]) -> str:
    return " ".join(f"{k}={'unset' if v is None else v}" for k, v in values.items()) or "(no parameters)"


def result_text(labels: list[str], values: list[float | None], outcome: TrialOutcome,
                violated: dict[str, float]) -> str:
    parts = [f"{label}={value:.4g}" for label, value in zip(labels, values) if value is not None]
    probe = {True: "pass", False: "FAIL", None: "off"}[outcome.probe_passed]
    applied = {True: "yes", False: "NO", None: "?"}[outcome.applied]
    text = " ".join(parts) + f" probe={probe} applied={applied}"
    if violated.get("load_errors", 0) > 0:
        text += f" failed_requests={violated['load_errors']:.0f}"
    return text
