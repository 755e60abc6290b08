"""The sort-based Pareto front (study.pareto, run after every trial) against the definition."""

from __future__ import annotations

import random

from tuner.study.pareto import Point, _dominates, pareto_front
from tuner.study.pareto import signed_values as _signed


def _by_definition(points: list[Point], directions: list[str]) -> list[Point]:
    cands = [p for p in points if p.feasible]
    signed = {p.number: _signed(p.values, directions) for p in cands}
    front = [p for p in cands if not any(_dominates(signed[q.number], signed[p.number]) for q in cands if q is not p)]
    return sorted(front, key=lambda p: signed[p.number])


def test_front_equals_the_definition_on_random_sets_with_ties() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        k = rng.randint(1, 3)
        directions = [rng.choice(["maximize", "minimize"]) for _ in range(k)]
        # Few distinct values: many ties and equal points, the cases a sweep gets wrong.
        points = [Point(i, tuple(float(rng.randint(0, 4)) for _ in range(k)), rng.random() < 0.8)
                  for i in range(rng.randint(0, 25))]
        got = pareto_front(points, directions)
        want = _by_definition(points, directions)
        assert sorted(p.number for p in got) == sorted(p.number for p in want)
        assert [_signed(p.values, directions) for p in got] == [_signed(p.values, directions) for p in want]
