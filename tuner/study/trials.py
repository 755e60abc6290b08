"""A study's trials as plain records: the data every decision and every view of a study
reads (the ask/tell policy, status, report, export, pareto.json).

Pure: no Optuna, no storage. ``tuner.store.records`` reads records from an Optuna storage,
``tuner.store.folder`` rebuilds them from a study folder's trial files. A record reads its
stored attributes once, into the typed parts of ``tuner.study.outcome_summary`` (what was
measured, why it failed): readers use those, never the attribute dictionaries.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from tuner.load.level_names import is_open_level
from tuner.study.between_starts import own_part
from tuner.study.noise import (
    NoisyPoint,
    label_noise,
    level_client_bound,
    level_unstable,
    max_rate_noise,
    resolve_level,
    unmeasured_level,
)
from tuner.study.outcome_summary import Failure, OutcomeSummary
from tuner.study.pareto import Point, pareto_front
from tuner.study.trial_metrics import ACCURACY_DROP, TRIAL_METRICS, trial_metric_value
from tuner.vllm.compile_cache import CompileRecord
from tuner.vllm.startup import StartupRecord

if TYPE_CHECKING:
    from tuner.study.between_starts import StudyNoise

__all__ = ["TrialRecord", "KIND_RUN", "KIND_DUPLICATE", "KIND_FORBIDDEN", "KIND_DAMAGED", "EARLY_STOPPED",
           "TOKEN_COUNT_MISMATCH", "label_measured", "noisy_points", "outcome_word", "point_key",
           "record_points", "front_records", "stop_record_text"]

# max_rate@slo (tuner.study.objectives.MAX_RATE), named here so the record stays free of
# the spec's pydantic models.
_MAX_RATE = "max_rate@slo"


def point_key(values: Mapping[str, Any]) -> str:
    """A canonical text of a parameter set, to spot duplicates (``space.params_key``)."""

    return json.dumps({k: values[k] for k in sorted(values)}, sort_keys=True, default=str)


def stop_record_text(record: Mapping[str, Any]) -> str:
    """Where and why a trial stopped early, from its early-stop record: ``stopped after c1:
    dominated``, or ``stopped inside c32: dominated_inside`` for a stop during a level."""

    after = str(record.get("after"))
    where = after if after.startswith("inside ") else f"after {after}"
    return f"stopped {where}: {record.get('reason')}"


def label_measured(label: str, outcome: OutcomeSummary) -> bool:
    """Whether a trial's outcome holds a measurement for the objective ``label``: its level's
    metric (``metric@cN``, ``@cmax``/``@cmin`` at the highest/lowest level run, ``metric@r2.0``
    at an open-loop level), its own reading (``startup_s``), or a finished max_rate@slo search.

    A value told for a label without one is a bound or a placeholder the optimizer needed,
    never something to show a person as measured."""

    if label == _MAX_RATE:
        record = outcome.max_rate or {}
        return record.get("status") != "stopped" and record.get("max_rate") is not None
    if label in TRIAL_METRICS:
        return trial_metric_value(outcome, label) is not None
    metric, sep, level = label.rpartition("@c")
    levels: Mapping[str, Any] = outcome.levels
    if not sep:
        metric, sep, level = label.rpartition("@")
        if not (sep and is_open_level(level)):
            return False
        levels = outcome.rate_levels
    found = (levels.get(resolve_level(levels, level)) or {}).get(metric)
    return isinstance(found, (int, float)) and not isinstance(found, bool) and math.isfinite(found)


KIND_RUN = "run"
KIND_DUPLICATE = "duplicate"
KIND_FORBIDDEN = "forbidden"
# A trial rebuilt from its files whose outcome.json or command.json could not be read
# (tuner.store.folder): not a measurement, not a failure of its configuration.
KIND_DAMAGED = "damaged_record"
# The constraint of a trial whose server token counts were not believed
# (tuner.study.scoring.constraints).
TOKEN_COUNT_MISMATCH = "token_count_mismatch"
# The constraint a trial stopped early carries (tuner.study.scoring.stopped_told).
EARLY_STOPPED = "early_stopped"


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
    # The study's between-start noise (tuner.study.between_starts.with_study_noise): what
    # ``noise`` widens the stored intervals by; None: they are read as stored.
    between: StudyNoise | None = field(default=None, repr=False, compare=False)

    @cached_property
    def summary(self) -> OutcomeSummary:
        """What the worker measured, as stored (the ``outcome`` attribute, read once)."""

        return OutcomeSummary.from_attr(self.attrs.get("outcome"))

    @cached_property
    def failure(self) -> Failure | None:
        """Why the trial failed or was not run (the ``failure`` attribute); None: it did not."""

        return Failure.from_attr(self.attrs.get("failure"))

    @property
    def interrupted(self) -> bool:
        """Failed because the tuner stopped during it: re-run, never counted."""

        return self.failure is not None and self.failure.reason == "interrupted"

    @property
    def ran_values(self) -> dict[str, Any] | None:
        """The configuration the trial was asked to run (the ``values`` attribute, every
        parameter named, unset ones too); None for a trial enqueued without it."""

        values = self.attrs.get("values")
        return dict(values) if isinstance(values, Mapping) else None

    @property
    def attempt(self) -> int:
        return int(self.attrs.get("attempt", 1))

    @property
    def command(self) -> str | None:
        """The shell line that started the trial's server (export and pareto.json)."""

        command = self.attrs.get("command")
        return None if command is None else str(command)

    @property
    def placeholder_values(self) -> bool:
        """Whether the values told are the worst seen, not a measurement (an early stop
        that measured nothing, a forbidden point, a duplicate of a failed one)."""

        return bool(self.attrs.get("placeholder_values"))

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
        """One word for tables and plots: the verdict stored when the trial was told
        (``policy.verdict``), or for a trial told before verdicts were stored, the same
        word derived from what it was told."""

        if self.state in ("RUNNING", "WAITING"):
            return self.state.lower()
        stored = self.attrs.get("verdict")
        if isinstance(stored, str):
            return stored
        return outcome_word(self.state, self.kind, self.constraints,
                            None if self.failure is None else self.failure.reason)

    @property
    def levels(self) -> dict[str, dict[str, Any]]:
        """Flat metrics per load level, as the worker measured them."""

        return dict(self.summary.levels)

    @property
    def unstable_levels(self) -> list[int]:
        """Levels whose throughput never met the stability rule (the trial is unstable)."""

        return level_unstable(self.levels)

    @property
    def client_bound_levels(self) -> list[int]:
        """Unstable levels whose cause was the load generator running late."""

        return level_client_bound(self.levels)

    def noise(self, labels: list[str], between: StudyNoise | None = None) -> dict[str, float | None]:
        """The 95 % half-width of each objective value (None: unknown or exact); ``between``:
        the study's between-start noise, which replaces what the worker added when it measured
        (tuner.study.between_starts)."""

        # Open-loop levels by name (r2.0), next to the concurrency levels: labels metric@r2.0.
        levels = {**self.summary.levels, **self.summary.rate_levels}
        bounds = self.bound_labels(labels)
        out: dict[str, float | None] = {}
        for label in labels:
            if label in bounds:
                out[label] = None
            elif label == "max_rate@slo":
                out[label] = max_rate_noise(self.summary.max_rate)
            elif label == ACCURACY_DROP:
                out[label] = self._drop_half_width()
            else:
                ci = label_noise(levels, label)
                value = self.values.get(label)
                study = between or self.between
                if study is not None and value is not None and "@" in label:   # read at a level
                    ci = study.widen(label, value, ci, self.summary.noise_floor)
                out[label] = ci
        return out

    def _drop_half_width(self) -> float | None:
        """The larger side of the quality gate's interval on the drop (docs/probe.md); None for a
        lossless trial, whose drop is 0 by construction."""
        q = self.summary.quality
        return None if q is None else max(q.drop_high - q.drop, q.drop - q.drop_low)

    def own_noise(self, labels: Sequence[str]) -> dict[str, float]:
        """Each objective read at a level: its run's own 95 % half-width relative to its value,
        without the between-start part the worker added (records that predate the stored
        noise_floor are left out: their part is unknown)."""

        levels = {**self.summary.levels, **self.summary.rate_levels}
        floor = self.summary.noise_floor
        out: dict[str, float] = {}
        for label in labels:
            value = self.values.get(label)
            ci = label_noise(levels, label) if "@" in label and label != "max_rate@slo" else None
            if ci is not None and value and floor is not None and math.isfinite(value):
                out[label] = own_part(ci, value, floor) / abs(value)
        return out

    def bound_labels(self, labels: Sequence[str]) -> dict[str, int]:
        """The objectives a trial stopped early was told as bounds because it never measured
        their level (label -> that level): ``@cmax`` then means the highest level it would
        have run, not the highest it reached, so no lower level's value or noise stands in."""

        stop = self.summary.early_stop or {}
        if not stop.get("bounds"):
            return {}
        skipped = [int(c) for c in stop.get("skipped_levels") or [] if str(c).isdigit()]
        found = {label: unmeasured_level(label, self.levels, skipped) for label in labels}
        return {label: level for label, level in found.items() if level is not None}

    def measured_values(self) -> dict[str, float]:
        """The objective values this trial measured: what a person is shown as its numbers.

        A trial told without measuring (not applied, stopped before a level, forbidden, a
        duplicate) was told bounds or the worst values seen, because the optimizer needs a
        number for every point; those stay between the study and its sampler. A label is
        measured when its level holds the metric and no early stop made it a bound."""

        if self.kind != KIND_RUN or self.state != "COMPLETE":
            return {}
        if not self.summary.early_stop and not self.placeholder_values:
            return dict(self.values)
        bounds = self.bound_labels(list(self.values))
        return {label: value for label, value in self.values.items()
                if label not in bounds and label_measured(label, self.summary)}

    @property
    def compile_record(self) -> CompileRecord | None:
        """The trial's torch.compile record (cache hit/miss/partial/none, compile, capture
        and init-engine seconds), from the
        outcome's ``compile`` field, or the ``compile`` user attribute early studies kept it
        in; None when unknown (trials recorded before compile records existed, or a log that
        never got there)."""

        rec = self.attrs.get("compile")
        if isinstance(rec, dict):
            return CompileRecord.from_json(rec)
        return self.summary.compile

    @property
    def startup_record(self) -> StartupRecord | None:
        """The trial's startup breakdown (seconds per phase, KV-cache size, graph capture),
        from the outcome's ``startup`` field;
        None for trials recorded before startup records existed or that started no server."""

        return self.summary.startup

    @property
    def compile_cache(self) -> str | None:
        """"hit", "miss", "partial", "none" or None (unknown)."""

        rec = self.compile_record
        return None if rec is None else rec.cache

    @cached_property
    def point(self) -> str | None:
        """``point_key`` of the values the trial ran (None: it has none), computed once: the
        policy compares every proposal with every trial's point."""

        values = self.ran_values
        return None if values is None else point_key(values)

    def ordered_values(self, labels: Sequence[str]) -> tuple[float, ...] | None:
        """The objective values in ``labels`` order; None unless every one was told."""

        if not self.values or any(label not in self.values for label in labels):
            return None
        return tuple(self.values[label] for label in labels)


def outcome_word(state: str, kind: str, constraints: Mapping[str, float], failure_reason: Any) -> str:
    """A finished trial's verdict in one word: ``failed:<reason>``, ``forbidden``,
    ``duplicate``, ``not_applied``, ``probe_failed``, ``quality_failed``, ``load_errors``,
    ``token_count_mismatch``, ``limit_missed``,
    ``unstable``, ``stopped_early`` (its values are bounds, not measurements) or ``feasible``."""

    if kind != KIND_RUN:
        return kind
    if state == "FAIL":
        return "failed:" + str(failure_reason or "unknown")
    if constraints.get("applied", 0) > 0:
        return "not_applied"
    if constraints.get("probe", 0) > 0:
        return "probe_failed"
    if constraints.get("quality", 0) > 0:
        return "quality_failed"
    if constraints.get("load_errors", 0) > 0:
        return "load_errors"
    if constraints.get(TOKEN_COUNT_MISMATCH, 0) > 0:
        return TOKEN_COUNT_MISMATCH
    if any(v > 0 for k, v in constraints.items() if k.startswith("limit:")):
        return "limit_missed"
    if constraints.get("unstable", 0) > 0:
        return "unstable"        # load.on_unstable: infeasible
    if constraints.get(EARLY_STOPPED, 0) > 0:
        return "stopped_early"
    return "feasible"


def record_points(records: list[TrialRecord], labels: list[str]) -> list[Point]:
    """Finished run trials with values, as Pareto points (infeasible ones marked)."""

    return [
        Point(r.number, tuple(r.values[label] for label in labels), r.feasible, r.params,
              {"outcome": r.outcome})
        for r in records
        if r.kind == KIND_RUN and r.state == "COMPLETE" and all(label in r.values for label in labels)
        # Placeholder values (worst seen, told to an early-stopped trial that measured
        # nothing) are no measurement: never plotted, never a front candidate.
        and not r.placeholder_values
    ]


def noisy_points(records: list[TrialRecord], labels: list[str],
                 between: StudyNoise | None = None) -> list[NoisyPoint]:
    """The feasible measured trials with each value's 95 % half-width (``between``: the
    study's between-start noise): what ties are found among. A tie names an alternative a
    person could pick, so a trial that failed its probe, was not applied or stopped early is
    never one, however close its numbers."""

    by_number = {r.number: r for r in records}
    out = []
    for p in record_points(records, labels):
        if p.feasible:
            noise = by_number[p.number].noise(labels, between)
            out.append(NoisyPoint(p.number, p.values, tuple(noise[label] for label in labels)))
    return out


def front_records(records: list[TrialRecord], labels: list[str], directions: list[str]) -> list[TrialRecord]:
    by_number = {r.number: r for r in records}
    return [by_number[p.number] for p in pareto_front(record_points(records, labels), directions)]
