"""Read a study's Optuna trials back as plain records: what status, report and export show.

The orchestrator stores everything it knows about a trial as JSON user attributes (so
``optuna-dashboard`` and any script can read them too); this module is their one reader.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.core.pareto import Point, pareto_front

__all__ = ["TrialRecord", "read_records", "record_points", "front_records", "KIND_RUN"]

KIND_RUN = "run"
KIND_DUPLICATE = "duplicate"
KIND_FORBIDDEN = "forbidden"


@dataclass
class TrialRecord:
    number: int
    state: str
    kind: str
    params: dict[str, Any]
    values: dict[str, float] = field(default_factory=dict)
    constraints: dict[str, float] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)
    seconds: float | None = None

    @property
    def feasible(self) -> bool:
        return (
            self.state == "COMPLETE" and self.kind == KIND_RUN
            and all(v <= 0 for v in self.constraints.values())
        )

    @property
    def is_baseline(self) -> bool:
        return bool(self.attrs.get("baseline"))

    @property
    def outcome(self) -> str:
        """One word for tables and plots."""

        if self.state in ("RUNNING", "WAITING"):
            return self.state.lower()
        if self.kind != KIND_RUN:
            return self.kind
        if self.state == "FAIL":
            return "failed:" + str(self.attrs.get("failure", {}).get("reason", "unknown"))
        if self.constraints.get("applied", 0) > 0:
            return "not_applied"
        if self.constraints.get("probe", 0) > 0:
            return "probe_failed"
        if self.constraints.get("load_errors", 0) > 0:
            return "load_errors"
        if any(v > 0 for k, v in self.constraints.items() if k.startswith("limit:")):
            return "limit_missed"
        return "feasible"


def _record(trial: FrozenTrial, labels: list[str]) -> TrialRecord:
    values: dict[str, float] = {}
    if trial.values is not None:
        values = dict(zip(labels, trial.values, strict=False))
    seconds = None
    if trial.datetime_start and trial.datetime_complete:
        seconds = (trial.datetime_complete - trial.datetime_start).total_seconds()
    return TrialRecord(
        number=trial.number,
        state=trial.state.name,
        kind=str(trial.user_attrs.get("kind", KIND_RUN)),
        params=dict(trial.user_attrs.get("values", trial.params)),
        values=values,
        constraints=dict(trial.constraints),
        attrs=dict(trial.user_attrs),
        seconds=seconds,
    )


def read_records(study: optuna.Study) -> list[TrialRecord]:
    labels = list(study.metric_names or [f"objective{i}" for i in range(len(study.directions))])
    return [_record(t, labels) for t in study.get_trials(deepcopy=False)]


def record_points(records: list[TrialRecord], labels: list[str]) -> list[Point]:
    """Finished run trials with values, as Pareto points (infeasible ones marked)."""

    return [
        Point(r.number, tuple(r.values[label] for label in labels), r.feasible, r.params,
              {"outcome": r.outcome})
        for r in records
        if r.kind == KIND_RUN and r.state == "COMPLETE" and all(label in r.values for label in labels)
    ]


def front_records(records: list[TrialRecord], labels: list[str], directions: list[str]) -> list[TrialRecord]:
    by_number = {r.number: r for r in records}
    return [by_number[p.number] for p in pareto_front(record_points(records, labels), directions)]


def state_of(name: str) -> TrialState:
    return TrialState[name]
