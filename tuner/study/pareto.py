"""The Pareto front over finished trials, and the policies that pick one point from it.

Only feasible points (probe passed, configuration applied, limits met) are candidates;
``include_infeasible`` exists for ``export --force`` and for plots.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Point", "pareto_front", "knee_point", "Filter", "parse_filter", "pick_point", "check_pick", "signed_values"]


@dataclass(frozen=True)
class Point:
    number: int
    values: tuple[float, ...]
    feasible: bool = True
    params: dict[str, Any] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)


def signed_values(values: Sequence[float], directions: Sequence[str]) -> tuple[float, ...]:
    """Values turned into 'smaller is better' for every objective."""

    return tuple(-v if d == "maximize" else v for v, d in zip(values, directions, strict=True))


def _dominates(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return all(x <= y for x, y in zip(a, b)) and any(x < y for x, y in zip(a, b))


def pareto_front(points: Sequence[Point], directions: Sequence[str]) -> list[Point]:
    """Non-dominated feasible points, ordered by the first objective (best first).

    Points with identical values are all kept (equal points do not dominate each other).
    """

    candidates = [(signed_values(p.values, directions), p) for p in points
                  if p.feasible and all(math.isfinite(v) for v in p.values)]
    # Sorted lexicographically, a point's dominators all come before it, and a dominated
    # dominator has a dominator on the front: so each point is compared with the front found
    # so far only - O(n x front) instead of O(n^2), which the tuner pays after every trial.
    candidates.sort(key=lambda sp: sp[0])
    front: list[tuple[tuple[float, ...], Point]] = []
    for s, p in candidates:
        if not any(_dominates(f, s) for f, _ in front):
            front.append((s, p))
    return [p for _, p in front]


def knee_point(front: Sequence[Point], directions: Sequence[str]) -> Point | None:
    """The front point closest to the ideal point after scaling each objective to [0, 1]."""

    if not front:
        return None
    signed = [signed_values(p.values, directions) for p in front]
    lows = [min(col) for col in zip(*signed)]
    highs = [max(col) for col in zip(*signed)]

    def distance(vals: tuple[float, ...]) -> float:
        return math.sqrt(sum(
            ((v - lo) / (hi - lo)) ** 2 if hi > lo else 0.0 for v, lo, hi in zip(vals, lows, highs)
        ))

    return min(zip(front, signed), key=lambda pair: (distance(pair[1]), pair[0].number))[0]


@dataclass(frozen=True)
class Filter:
    label: str
    op: str
    bound: float

    def accepts(self, value: float | None) -> bool:
        if value is None or not math.isfinite(value):
            return False
        return value <= self.bound if self.op == "<=" else value >= self.bound


_FILTER = re.compile(r"^\s*([A-Za-z0-9_.@]+)\s*(<=|>=)\s*(-?[0-9.]+(?:e-?\d+)?)\s*$")


def parse_filter(text: str) -> Filter:
    match = _FILTER.match(text)
    if not match:
        raise ValueError(
            f"{text!r} is not a filter; write OBJECTIVE<=NUMBER or OBJECTIVE>=NUMBER, "
            "e.g. 'tpot_ms.mean@c1<=30'"
        )
    return Filter(match.group(1), match.group(2), float(match.group(3)))


def check_pick(policy: str, labels: Sequence[str]) -> None:
    """Raise ValueError (one line) unless ``policy`` is a pick ``pick_point`` knows, for
    these objective labels; callers check before any work (a report, an export)."""

    if policy in ("knee", "best-throughput", "lowest-latency"):
        return
    if policy.startswith("best:"):
        if policy[5:] not in labels:
            raise ValueError(f"{policy[5:]!r} is not an objective; objectives: {', '.join(labels)}")
        return
    shown = policy if len(policy) <= 60 else policy[:57] + "..."
    raise ValueError(
        f"unknown pick {shown!r}; use knee, best-throughput, lowest-latency or best:<objective>"
    )


def pick_point(
    points: Sequence[Point],
    labels: Sequence[str],
    directions: Sequence[str],
    *,
    policy: str,
    filters: Sequence[Filter] = (),
    include_infeasible: bool = False,
) -> Point | None:
    """Choose one point.

    Policies: ``knee`` (balanced), ``best:<label>`` (best value of that objective) and the
    shorthands ``best-throughput`` / ``lowest-latency`` (the first maximised / minimised
    objective). Filters on objective labels are applied first.
    """

    check_pick(policy, labels)
    for f in filters:
        if f.label not in labels:
            raise ValueError(f"filter {f.label!r} names no objective; objectives: {', '.join(labels)}")
    pool = [
        p for p in points
        if (include_infeasible or p.feasible)
        and all(f.accepts(p.values[labels.index(f.label)]) for f in filters)
    ]
    if include_infeasible:
        pool = [replace_feasible(p) for p in pool]
    if not pool:
        return None
    if policy == "knee":
        return knee_point(pareto_front(pool, directions), directions)
    if policy == "best-throughput":
        policy = _first(labels, directions, "maximize", policy)
    elif policy == "lowest-latency":
        policy = _first(labels, directions, "minimize", policy)
    if policy.startswith("best:"):
        label = policy[5:]
        if label not in labels:
            raise ValueError(f"{label!r} is not an objective; objectives: {', '.join(labels)}")
        i = labels.index(label)
        sign = -1.0 if directions[i] == "maximize" else 1.0
        return min(pool, key=lambda p: (sign * p.values[i], p.number))
    raise ValueError(
        f"unknown pick {policy!r}; use knee, best-throughput, lowest-latency or best:<objective>"
    )


def replace_feasible(point: Point) -> Point:
    return Point(point.number, point.values, True, point.params, point.info)


def _first(labels: Sequence[str], directions: Sequence[str], direction: str, policy: str) -> str:
    for label, d in zip(labels, directions):
        if d == direction:
            return f"best:{label}"
    raise ValueError(f"pick {policy!r} needs an objective to {direction}; objectives: {', '.join(labels)}")
