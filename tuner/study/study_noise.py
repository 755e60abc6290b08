"""The study's between-start noise from its records: which measurements are fresh starts, and
the records read with it (tuner.study.between_starts holds the estimate itself).

Pure: records and confirmation verdicts (plain JSON) in, plain data out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from tuner.study.between_starts import StudyNoise, noise_tolerances, study_noise
from tuner.study.trials import KIND_RUN, TrialRecord

__all__ = ["confirmation_tolerances", "fresh_starts", "noise_of_study", "with_study_noise"]


def fresh_starts(records: Sequence[TrialRecord], confirmations: Mapping[int, Mapping[str, Any]],
                 labels: Sequence[str]) -> list[tuple[dict[str, Any], dict[str, float]]]:
    """Every fresh-start measurement of the study as (configuration, values by label): each
    completed run trial that measured its whole sweep (an early stop's values are bounds or
    a partial window's), and each re-run of ``confirm/`` (its verdicts as JSON, by trial)
    that was feasible, under its trial's configuration."""
    out: list[tuple[dict[str, Any], dict[str, float]]] = []
    by_number = {}
    for r in _whole_runs(records):
        by_number[r.number] = r
        values = {label: v for label, v in r.measured_values().items() if label in labels}
        if values:
            out.append((dict(r.params), values))
    for number, verdict in confirmations.items():
        trial = by_number.get(int(number))
        checks = verdict.get("objectives")
        if trial is None or not isinstance(checks, list):
            continue
        order = [c.get("label") for c in checks if isinstance(c, Mapping)]
        for run in verdict.get("runs") or []:
            if not isinstance(run, Mapping) or not run.get("feasible") or not isinstance(run.get("values"), list):
                continue
            values = {str(label): float(v) for label, v in zip(order, run["values"])
                      if label in labels and isinstance(v, (int, float))}
            if values:
                out.append((dict(trial.params), values))
    return out


def _whole_runs(records: Sequence[TrialRecord]) -> list[TrialRecord]:
    """The completed run trials that measured their whole sweep."""
    return [r for r in records if r.kind == KIND_RUN and r.state == "COMPLETE" and not r.summary.early_stop
            and not r.placeholder_values]


def noise_of_study(records: Sequence[TrialRecord], confirmations: Mapping[int, Mapping[str, Any]],
                   labels: Sequence[str], *, override: float | None) -> StudyNoise:
    """``study_noise`` over the study's trials and confirmation re-runs (the trials' own
    intervals too, to see whether they claim more than the fresh starts moved)."""
    own = [(dict(r.params), r.own_noise(labels)) for r in _whole_runs(records)]
    return study_noise(labels, fresh_starts(records, confirmations, labels), override=override, own=own)


def with_study_noise(records: Sequence[TrialRecord], between: StudyNoise) -> list[TrialRecord]:
    """The records, each reading its intervals with the study's between-start noise."""
    return [dataclasses.replace(r, between=between) for r in records]


def confirmation_tolerances(record: TrialRecord, records: Sequence[TrialRecord],
                            confirmations: Mapping[int, Mapping[str, Any]], labels: Sequence[str], *,
                            override: float | None, reruns: int, min_change: float = 0.0) -> list[float]:
    """Each objective's tolerance for ``reruns`` confirmation re-runs of ``record``: the 95 %
    interval of the difference between two fresh starts of it, from its value's own interval
    and the study's noise as measured without this trial's re-runs (they are what is judged:
    a fluke counted in the noise would widen the very tolerance it is judged by), and never
    below ``min_change`` (confirm.min_change: a difference must also be big enough to matter)."""
    others = {n: v for n, v in confirmations.items() if int(n) != record.number}
    noise = noise_of_study(records, others, labels, override=override)
    half = record.noise(list(labels), noise)
    relative = []
    for label in labels:
        value, ci = record.values.get(label), half.get(label)
        relative.append(ci / abs(value) if ci is not None and value else noise.half_width(label))
    return [max(t, min_change) for t in noise_tolerances(relative, reruns)]
