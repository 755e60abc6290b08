"""The ground-truth table of a study's space on the simulator: every point's outcome
(``tuner.sim.truth``), scored as the tuner scores trials, with the true Pareto front and its
hypervolume.

Noise (``measure``): multiplicative lognormal per trial, level and metric, seeded, so a
simulated study can see the spread real measurements have.

Hypervolume: 2 objectives; values are turned into "smaller is better" and measured against
a reference point: the true front's nadir (its worst value of each objective) pushed out by
``REF_MARGIN`` (50 %) of the front's range in each objective. Why: the baseline as reference
gives no credit to trade-off points that beat it in one objective only (NCCL LL + MTP has
the best TPOT but less throughput than the baseline); the worst feasible point (eager mode)
makes almost any decent configuration score > 90 %; and a thin 10 % margin makes 95 %
depend on front points 1 % apart - less than measurement noise - instead of on finding
both ends of the front. With 50 %, 95 % on glm5-8xpcie needs the best-throughput region
and the best-TPOT point. The strict variant (``STRICT_REF_MARGIN``, 10 %) is reported too.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tuner.probe.quality_stats import QualityRecord
from tuner.sim.quality_gate import simulated_reference, true_record
from tuner.sim.truth import PointTruth
from tuner.study import space
from tuner.study.outcome import TrialOutcome
from tuner.study.pareto import Point, pareto_front, signed_values
from tuner.study.scoring import constraints as scoring_constraints
from tuner.study.scoring import metric_value
from tuner.study.spec import StudySpec

__all__ = [
    "GroundTruth", "Measured", "hypervolume", "reference_point", "measure",
    "REF_MARGIN", "STRICT_REF_MARGIN",
]

REF_MARGIN = 0.5
STRICT_REF_MARGIN = 0.1


# ------------------------------------------------------------------------------- scoring


def _outcome(truth: PointTruth, levels: Mapping[int, Mapping[str, float]],
             quality: QualityRecord | None) -> TrialOutcome:
    """The outcome a worker would report for this point: what tuner.study.scoring reads."""

    return TrialOutcome(number=0, status="completed", applied=truth.applied,
                        mismatches=[{"target": t} for t in truth.mismatches],
                        probe_passed=truth.probe_passed,
                        levels={str(c): dict(m) for c, m in levels.items()}, quality=quality)


@dataclass(frozen=True)
class Measured:
    """One (possibly noisy) measurement of a point: what the tuner would be told."""

    objectives: tuple[float, ...] | None       # None: failed trial
    constraints: dict[str, float]
    levels: dict[int, dict[str, float]]

    @property
    def feasible(self) -> bool:
        return self.objectives is not None and all(v <= 0 for v in self.constraints.values())


def measure(spec: StudySpec, truth: PointTruth, *, noise: float = 0.0,
            rng: random.Random | None = None, quality: QualityRecord | None = None) -> Measured:
    """The outcome a trial reports: level metrics with multiplicative lognormal noise
    (sigma ``noise``), objectives and constraints as tuner.study.scoring computes them.
    ``quality``: the quality gate's record of a lossy trial (its ``accuracy_drop`` and
    ``quality`` constraint); None: no gate ran."""

    if truth.failed:
        return Measured(None, {}, {})
    levels: dict[int, dict[str, float]] = {}
    for c, lv in truth.levels.items():
        if noise > 0:
            assert rng is not None, "noise needs an rng"
            levels[c] = {k: v * math.exp(rng.gauss(0.0, noise)) for k, v in lv.metrics.items()}
        else:
            levels[c] = dict(lv.metrics)
    # Objectives and constraints exactly as the orchestrator computes them (tuner.study.scoring).
    outcome = _outcome(truth, levels, quality)
    objectives = []
    for o in spec.objectives:
        value = metric_value(spec, outcome, o)
        if value is None:
            raise ValueError(f"ground truth has no {o.metric} at concurrency {o.concurrency}")
        objectives.append(value)
    constraints = scoring_constraints(spec, outcome)
    return Measured(tuple(objectives), constraints, levels)


# ------------------------------------------------------------------------------- hypervolume


def reference_point(front: Sequence[Sequence[float]], directions: Sequence[str],
                    margin: float = REF_MARGIN) -> tuple[float, ...]:
    """Nadir of ``front`` pushed out by ``margin`` of its range (in objective units)."""

    if not front:
        raise ValueError("an empty front has no reference point")
    signed = [signed_values(v, directions) for v in front]
    ref = []
    for col in zip(*signed):
        lo, hi = min(col), max(col)
        span = hi - lo if hi > lo else abs(hi) or 1.0
        ref.append(hi + margin * span)
    # back to objective units
    return tuple(-r if d == "maximize" else r for r, d in zip(ref, directions))


def hypervolume(points: Iterable[Sequence[float]], directions: Sequence[str],
                reference: Sequence[float]) -> float:
    """Area dominated by ``points`` and bounded by ``reference`` (2 objectives)."""

    if len(directions) != 2:
        raise ValueError("hypervolume is implemented for 2 objectives")
    ref = signed_values(reference, directions)
    pts = sorted({s for s in (signed_values(p, directions) for p in points) if all(a < r for a, r in zip(s, ref))})
    area = 0.0
    best_y = ref[1]
    for x, y in pts:            # ascending first objective; keep only improving second
        if y < best_y:
            area += (ref[0] - x) * (best_y - y)
            best_y = y
    return area


# ------------------------------------------------------------------------------- table


@dataclass
class GroundTruth:
    spec_name: str
    labels: list[str]
    directions: list[str]
    points: list[PointTruth]
    front: list[int] = field(default_factory=list)           # indices into points
    reference: tuple[float, ...] = ()
    hypervolume: float = 0.0
    strict_reference: tuple[float, ...] = ()
    strict_hypervolume: float = 0.0

    def __post_init__(self) -> None:
        self._by_key = {p.key: i for i, p in enumerate(self.points)}

    def index(self, values: Mapping[str, Any]) -> int:
        return self._by_key[space.params_key(values)]

    def get(self, values: Mapping[str, Any]) -> PointTruth:
        return self.points[self.index(values)]

    def front_keys(self) -> set[str]:
        return {self.points[i].key for i in self.front}

    def hv_of(self, objective_rows: Iterable[Sequence[float]], *, strict: bool = False) -> float:
        return hypervolume(objective_rows, self.directions, self.strict_reference if strict else self.reference)

    @classmethod
    def build(cls, spec: StudySpec, points: list[PointTruth]) -> GroundTruth:
        labels = [o.label for o in spec.objectives]
        directions: list[str] = [o.direction for o in spec.objectives]
        table = cls(spec.name, labels, directions, points)
        pts = []
        answers = [] if spec.quality is None else simulated_reference(spec.probe, spec.quality.max_items)
        for i, p in enumerate(points):
            # A lossy point of a quality study is on the true front only if its true drop is
            # within the budget (what a gate with no sampling error would find).
            m = measure(spec, p, quality=true_record(spec, p, answers))
            if m.objectives is not None:
                pts.append(Point(i, m.objectives, m.feasible))
        front = pareto_front(pts, directions)
        table.front = [p.number for p in front]
        if front:
            values = [p.values for p in front]
            table.reference = reference_point(values, directions)
            table.hypervolume = hypervolume(values, directions, table.reference)
            table.strict_reference = reference_point(values, directions, STRICT_REF_MARGIN)
            table.strict_hypervolume = hypervolume(values, directions, table.strict_reference)
        return table

    def to_json(self) -> dict[str, Any]:
        return {"spec": self.spec_name, "labels": self.labels, "directions": self.directions,
                "front": self.front, "reference": list(self.reference), "hypervolume": self.hypervolume,
                "strict_reference": list(self.strict_reference), "strict_hypervolume": self.strict_hypervolume,
                "points": [p.to_json() for p in self.points]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GroundTruth:
        return cls(data["spec"], list(data["labels"]), list(data["directions"]),
                   [PointTruth.from_json(p) for p in data["points"]], list(data["front"]),
                   tuple(data["reference"]), float(data["hypervolume"]),
                   tuple(data.get("strict_reference", ())), float(data.get("strict_hypervolume", 0.0)))


def dumps(truth: GroundTruth) -> str:
    return json.dumps(truth.to_json(), separators=(",", ":"))
