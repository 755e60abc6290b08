"""From a trial's outcome to numbers: objective values, constraints, the outcome summary kept
in the storage, and the content of pareto.json.

Pure functions of (spec, outcome) and (records). Which of them a trial is told is the
policy's (``tuner.study.policy.told_for``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from tuner.load.max_rate_text import max_rate_value_text
from tuner.study.between_starts import StudyNoise
from tuner.study.noise import level_unstable, noisy_front, resolve_level
from tuner.study.objectives import MAX_RATE, ObjectiveSpec, open_level
from tuner.study.outcome import TrialOutcome
from tuner.study.outcome_summary import OutcomeSummary, read_quality
from tuner.study.pareto import pareto_front
from tuner.study.spec import StudySpec
from tuner.study.trial_metrics import TRIAL_METRICS, trial_metric_value
from tuner.study.trials import (
    EARLY_STOPPED,
    KIND_RUN,
    TOKEN_COUNT_MISMATCH,
    TrialRecord,
    noisy_points,
    record_points,
    stop_record_text,
)
from tuner.vllm.compile_cache import CompileRecord
from tuner.vllm.startup import StartupRecord

__all__ = ["stopped_told", "stop_text", "level_for", "level_of", "metric_value", "constraints", "outcome_summary",
           "pareto_payload", "result_text", "values_text", "TRIAL_METRICS", "max_rate_value"]


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


def max_rate_value(outcome: TrialOutcome) -> float | None:
    """The trial's max_rate@slo: its search's answer (0.0 when the SLO was unmet at every
    allowed rate); None when it was not searched or stopped early (told by its bound)."""

    record = outcome.max_rate or {}
    if record.get("status") == "stopped" or record.get("max_rate") is None:
        return None
    return float(record["max_rate"])


def metric_value(spec: StudySpec, outcome: TrialOutcome, item: Any) -> float | None:
    if item.metric in TRIAL_METRICS:
        return trial_metric_value(outcome, item.metric)
    if item.metric == MAX_RATE:
        return max_rate_value(outcome)
    if (name := open_level(item)) is not None:
        value = outcome.rate_levels.get(name, {}).get(item.metric)
        return None if value is None else float(value)
    level = outcome.levels.get(str(level_of(spec, item)), {})
    value = level.get(item.metric)
    return None if value is None else float(value)


def constraints(spec: StudySpec, outcome: TrialOutcome) -> dict[str, float]:
    """Optuna constraints (> 0 = violated) of a completed trial.

    ``load_errors`` counts measured requests that failed (HTTP 5xx, malformed streams,
    timeouts): the statistics of the rest would describe a server that does not really
    serve this load, so such a point never reaches the front. ``token_count_mismatch``
    (only when violated) counts completed requests, at any level, whose server token counts
    were not believed (tuner.load.token_counts): throughput rests on the server's word.
    """

    failed = sum(float(level.get("failed") or 0.0) for level in outcome.levels.values())
    result = {
        "probe": 0.0 if outcome.probe_passed in (True, None) else 1.0,
        "applied": 0.0 if (outcome.applied is not False or not spec.verify.require_applied)
        else float(max(1, len(outcome.mismatches))),
        "load_errors": failed,
    }
    if spec.quality is not None:
        # A lossy trial whose accuracy drop was not shown inside the budget (probe.quality_stats):
        # infeasible like a failed probe, its speed kept. Every trial of a quality study has it.
        result["quality"] = 1.0 if outcome.quality is not None and outcome.quality.verdict == "fail" else 0.0
    mismatched = sum(float(level.get("token_mismatch") or 0.0) for level in
                     (*outcome.levels.values(), *outcome.rate_levels.values()))
    if mismatched:
        result[TOKEN_COUNT_MISMATCH] = mismatched
    if spec.load.on_unstable == "infeasible":
        # A level that never settled measured noise; the study asked not to rank on it.
        result["unstable"] = float(len(level_unstable(outcome.levels)))
    if spec.searches_max_rate and (outcome.max_rate or {}).get("status") == "slo_unmet":
        # Missed even at load.rate_search.low: the configuration cannot serve the SLO.
        result["slo_unmet"] = 1.0
    elif spec.searches_max_rate:
        result["slo_unmet"] = 0.0
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


def stop_text(outcome: TrialOutcome) -> str:
    return stop_record_text(outcome.early_stop or {})


def outcome_summary(outcome: TrialOutcome) -> OutcomeSummary:
    """The part of an outcome worth keeping in the storage (full details are on disk),
    stored as its ``as_attr()``."""

    copied = {f.name: getattr(outcome, f.name) for f in fields(OutcomeSummary)
              if f.name not in ("version", "agreement_stored", "compile", "startup", "quality")}
    # The gate's record as the worker holds it (a QualityRecord or its JSON); an outcome
    # without the field (written before quality budgets) reads as lossless.
    return OutcomeSummary(**copied, compile=CompileRecord.from_json(outcome.compile),
                          startup=StartupRecord.from_json(outcome.startup),
                          quality=read_quality(getattr(outcome, "quality", None)))


def pareto_payload(name: str, records: list[TrialRecord], labels: list[str],
                   directions: Sequence[str], *, now: float, between: StudyNoise | None = None) -> dict[str, Any]:
    """pareto.json: the study's front with each point's command, gain over the baseline, each
    value's 95 % interval (``noise``; ``between``: the study's between-start noise, shown as
    ``between_starts``) and sample count, the unstable flag, and the ties noise leaves
    (tuner.study.noise), and for a lossy point the quality gate's drop, interval, verdict and
    items (``quality``); ``now``: when it was written, unix seconds."""
    by_number = {r.number: r for r in records}
    points = record_points(records, labels)
    front = pareto_front(points, directions)
    noisy = noisy_points(records, labels, between)
    near, ties = noisy_front(noisy, directions, labels)
    on_front = {p.number for p in front}
    baseline = next((r for r in records if r.is_baseline and r.state == "COMPLETE" and r.kind == KIND_RUN), None)
    base = baseline.measured_values() if baseline is not None else {}
    entries = []
    for point in front:
        record = by_number[point.number]
        entry = {
            "trial": point.number,
            "values": dict(zip(labels, point.values)),
            "noise": record.noise(labels, between),
            "samples": _samples(record, labels),
            "unstable": bool(record.unstable_levels),
            "unstable_levels": record.unstable_levels,
            "ties": sorted({n for t in ties for n in t.trials if point.number in t.trials} - {point.number}),
            "params": record.params,
            "command": record.command,
            "baseline": record.is_baseline,
        }
        searched = record.summary.max_rate
        if searched:
            # max_rate@slo's answer with how it was found: a lower bound (met at the highest
            # allowed rate) must not read as a measured maximum.
            entry["max_rate"] = {k: searched.get(k) for k in (
                "max_rate", "status", "lower_bound", "bracket", "precision", "levels", "probes")}
        quality = record.summary.quality
        if quality is not None:
            # What a lossy point gave up for its speed: the drop (fractions) with its interval.
            entry["quality"] = quality.model_dump(include={"drop", "drop_low", "drop_high", "verdict", "items"})
        if baseline is not None:
            entry["vs_baseline"] = {
                label: (v / base[label] if base.get(label) else None)
                for label, v in zip(labels, point.values)
            }
        entries.append(entry)
    return {
        "study": name,
        "objectives": [{"label": l, "direction": d} for l, d in zip(labels, directions)],
        "updated_unix": now,
        "trials_finished": sum(1 for r in records if r.kind == KIND_RUN and r.state in ("COMPLETE", "FAIL")),
        "baseline": None if baseline is None else {"trial": baseline.number, "values": base},
        "front": entries,
        # Points only noise keeps off the front, and front points noise cannot tell apart.
        "within_noise": [
            {"trial": n, "values": {label: by_number[n].measured_values().get(label) for label in labels},
             "noise": by_number[n].noise(labels, between), "unstable": bool(by_number[n].unstable_levels)}
            for n in near if n not in on_front],
        "ties": [t.as_dict() for t in ties],
        "unstable_on_front": [e["trial"] for e in entries if e["unstable"]],
        **({} if between is None else {"between_starts": between.as_dict()}),
    }


def _samples(record: TrialRecord, labels: list[str]) -> dict[str, float | None]:
    """Samples each objective's interval rests on (``<metric>.n`` of its level)."""
    out: dict[str, float | None] = {}
    levels = record.levels
    for label in labels:
        metric, sep, level = label.rpartition("@c")
        out[label] = (levels.get(resolve_level(levels, level)) or {}).get(f"{metric}.n") if sep else None
    return out


def values_text(values: dict[str, Any]) -> str:
    return " ".join(f"{k}={'unset' if v is None else v}" for k, v in values.items()) or "(no parameters)"


def result_text(labels: list[str], values: list[float | None], outcome: TrialOutcome,
                violated: dict[str, float]) -> str:
    parts = [f"{label}={max_rate_value_text(outcome.max_rate)}" if label == MAX_RATE and outcome.max_rate
             else f"{label}={value:.4g}" for label, value in zip(labels, values) if value is not None]
    probe = {True: "pass", False: "FAIL", None: "off"}[outcome.probe_passed]
    applied = {True: "yes", False: "NO", None: "?"}[outcome.applied]
    text = " ".join(parts) + f" probe={probe} applied={applied}"
    if outcome.quality is not None:
        text += f" quality={outcome.quality.summary()}"
    if outcome.max_rate and MAX_RATE not in labels:
        text += f" max_rate@slo={max_rate_value_text(outcome.max_rate)}"
    if violated.get("load_errors", 0) > 0:
        text += f" failed_requests={violated['load_errors']:.0f}"
    if violated.get(TOKEN_COUNT_MISMATCH, 0) > 0:
        text += f" token_counts_not_believed={violated[TOKEN_COUNT_MISMATCH]:.0f}"
    return text
