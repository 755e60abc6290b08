"""From a trial's outcome to what the optimizer and the study files are told.

Pure functions of (spec, outcome) and (records): objective values, constraints, the
outcome summary kept in the storage, and the content of pareto.json.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tuner.study import early_stop
from tuner.study.outcome import TrialOutcome
from tuner.study.pareto import Point, pareto_front
from tuner.study.spec import ObjectiveSpec, StudySpec
from tuner.study.records import EARLY_STOPPED, KIND_RUN, TrialRecord, record_points

__all__ = ["Told", "told_for", "early_stop_plan", "stopped_told", "EARLY_STOPPED", "level_for", "level_of", "metric_value", "constraints", "outcome_attrs", "pareto_payload",
           "result_text", "values_text"]


def level_for(spec: StudySpec, concurrency: int | str) -> int:
    """The load level that ``concurrency`` ("max", "min" or a number) names."""

    levels = spec.load.concurrency
    if concurrency == "max":
        return max(levels)
    if concurrency == "min":
        return min(levels)
    return int(concurrency)


def level_of(spec: StudySpec, item: ObjectiveSpec | Any) -> int:
    """The load level an objective or limit is read at."""

    return level_for(spec, item.concurrency)


TRIAL_METRICS = ("startup_s", "probe_s", "trial_s")


def metric_value(spec: StudySpec, outcome: TrialOutcome, item: Any) -> float | None:
    if item.metric in TRIAL_METRICS:
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


# Bounded history: the learned ratio is a maximum over trials, and the newest few hundred
# trials are the ones near the front; shipping the whole study to every worker would cost
# more than it adds.
HISTORY_LIMIT = 300


def early_stop_plan(spec: StudySpec, trials: Any) -> dict[str, Any]:
    """The ``TrialRequest.early_stop`` of a trial starting now (study.early_stop.sweep_plan).

    ``trials``: the study's FrozenTrials. Front: objective values of the feasible measured
    trials' front; history: the objective metrics, per level, of trials that measured every
    objective level (a trial stopped on a bound did not, and its values are bounds).
    """

    targets = [early_stop.Target(o.metric, early_stop.TRIAL_LEVEL if o.metric in TRIAL_METRICS
                                 else level_of(spec, o), o.direction) for o in spec.objectives]
    limits = [{"label": lim.label, "metric": lim.metric,
               "level": early_stop.TRIAL_LEVEL if lim.metric in TRIAL_METRICS else level_of(spec, lim),
               "max": lim.max, "min": lim.min} for lim in spec.limits]
    metrics = {t.metric for t in targets}
    needed = {str(t.level) for t in targets if t.level != early_stop.TRIAL_LEVEL}
    directions = [t.direction for t in targets]
    rows: list[tuple[float, ...]] = []
    history: list[dict[int, dict[str, float]]] = []
    for t in trials:
        if t.state.name != "COMPLETE" or t.values is None or t.user_attrs.get("kind", KIND_RUN) != KIND_RUN:
            continue
        if EARLY_STOPPED in t.constraints or t.user_attrs.get("placeholder_values"):
            continue
        if all(v <= 0 for v in t.constraints.values()):
            rows.append(tuple(t.values))
        levels = (t.user_attrs.get("outcome") or {}).get("levels") or {}
        if needed <= set(levels):
            history.append({int(c): {m: v for m, v in lv.items() if m in metrics and v is not None}
                            for c, lv in levels.items()})
    front = [p.values for p in pareto_front([Point(i, r) for i, r in enumerate(rows)], directions)]
    return early_stop.sweep_plan(targets, limits, spec.load.concurrency, front, history[-HISTORY_LIMIT:],
                                 require_applied=spec.verify.require_applied)


def stopped_told(spec: StudySpec, outcome: TrialOutcome,
                 worst: list[float] | None) -> tuple[list[float] | None, dict[str, float], bool]:
    """What a trial the worker stopped early is told as: (values, constraints, placeholder).

    Its measured objectives are kept, an objective it never measured takes its optimistic
    bound (what the trial could at best have reached) or else the worst value seen, and the
    ``early_stopped`` constraint is violated, so it is never on the front and the sampler
    ranks it with the infeasible trials. ``values`` None: nothing to tell values with (the
    study's first trial): the caller tells it FAIL.
    """

    record = outcome.early_stop or {}
    bounds = record.get("bounds") or [None] * len(spec.objectives)
    values: list[float] = []
    placeholder = False
    for i, o in enumerate(spec.objectives):
        value = metric_value(spec, outcome, o)
        if value is None:
            value = bounds[i]
        if value is None and worst is not None:
            value, placeholder = worst[i], True
        if value is None:
            return None, {}, True
        values.append(float(value))
    violated = constraints(spec, outcome)
    violated[EARLY_STOPPED] = 1.0
    return values, violated, placeholder


@dataclass
class Told:
    """What a finished trial's outcome is told to Optuna as.

    ``values`` None: told FAIL. ``attrs``: user attributes besides ``outcome`` (``failure``,
    ``placeholder_values``). ``how``: ``failed`` (the worker reported a failure),
    ``no_measurement`` (completed without a value for an objective), ``stopped`` (stopped
    early by its worker), ``measured``; ``missing``: the objectives without a value.
    """

    how: str
    values: list[float] | None
    constraints: dict[str, float] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)


def stop_text(outcome: TrialOutcome) -> str:
    why = outcome.early_stop or {}
    return f"stopped after {why.get('after')}: {why.get('reason')}"


def told_for(spec: StudySpec, outcome: TrialOutcome, worst: Callable[[], list[float] | None]) -> Told:
    """The one rule for telling an outcome (the orchestrator's record of a trial, and the
    study rebuilt from a folder's trial files, which must agree with it).

    ``worst``: the worst value per objective told so far, asked for only when a trial
    stopped early needs placeholders (reading it means reading every trial).
    """

    if outcome.status == "failed":
        return Told("failed", None, attrs={"failure": {
            "reason": outcome.reason, "message": outcome.message, "phase": outcome.phase,
            "log_excerpt": (outcome.log_excerpt or "")[-2000:]}})
    if outcome.early_stop and outcome.early_stop.get("reason") != "dominated_exact":
        # dominated_exact measured its objectives: told like any completed trial.
        values, violated, placeholder = stopped_told(spec, outcome, worst())
        if values is None:
            return Told("stopped", None, attrs={"failure": {
                "reason": EARLY_STOPPED, "message": stop_text(outcome), "phase": "load"}})
        return Told("stopped", values, violated, {"placeholder_values": True} if placeholder else {})
    measured = [metric_value(spec, outcome, o) for o in spec.objectives]
    missing = [o.label for o, v in zip(spec.objectives, measured) if v is None]
    if missing:
        return Told("no_measurement", None, missing=missing, attrs={"failure": {
            "reason": "no_measurement", "message": f"no value for {', '.join(missing)}", "phase": "load"}})
    return Told("measured", [float(v) for v in measured], constraints(spec, outcome))  # type: ignore[arg-type]


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
        "early_stop": outcome.early_stop,
        "compile": outcome.compile,
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
