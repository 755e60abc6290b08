"""benchmarks/anytime.py's floor under issue 17's first target: the fewest trials after which
any sampler that runs the baseline first can hold 95 % of a landscape's true hypervolume."""

from __future__ import annotations

import importlib.util
import sys
from itertools import combinations
from typing import Any

from tests.conftest import ROOT


def _bench():  # type: ignore[no-untyped-def]
    """benchmarks/anytime.py as a module (benchmarks/ is not a package; it imports its siblings)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("anytime", ROOT / "benchmarks" / "anytime.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules["anytime"] = bench           # its dataclasses look their module up there
    spec.loader.exec_module(bench)
    return bench


def test_the_fewest_trials_on_the_real_landscapes_checked_against_every_subset() -> None:
    from tuner.sim.ground_truth import measure
    from tuner.study import space

    bench = _bench()
    for name, fewest in (("smollm2-ngram", 4), ("smollm2-engine", 3)):
        assert bench.fewest_trials(name) == fewest, name
        # Independently of the front-only search: over every point of the landscape, no set of
        # fewest - 2 points beside the baseline reaches 95 %, and some set of fewest - 1 does.
        spec, truth, _ = bench.load(name)
        rows = [measure(spec, p) for p in truth.points]
        ok = [r.objectives for r in rows if r.feasible and r.objectives is not None]
        base = rows[truth.index(space.baseline_values(spec))].objectives
        goal = bench.TARGET * truth.hypervolume - 1e-12
        assert _reaches(truth, base, ok, goal, fewest - 1), name
        assert not _reaches(truth, base, ok, goal, fewest - 2), name


def _reaches(truth: Any, base: Any, points: list[Any], goal: float, size: int) -> bool:
    """Some set of `size` points, beside the baseline, reaches the goal hypervolume."""
    return any(truth.hv_of([base, *chosen]) >= goal for chosen in combinations(points, size))


def test_the_verdict_says_when_the_target_asks_for_an_oracle() -> None:
    bench = _bench()
    samplers = {"default": {"t95": {"median": 6.0}, "hv_at": {"8": {"median": 1.0}}},
                "random": {"t95": {"median": 8.0}, "hv_at": {"16": {"median": 1.0}}}}
    v = bench.verdict({"samplers": samplers}, fewest=4)
    assert v["t95_target"] == 4.0 and v["t95_target_needs_oracle"] and not v["t95_ok"]
    assert not bench.verdict({"samplers": samplers}, fewest=3)["t95_target_needs_oracle"]
    assert not bench.verdict({"samplers": samplers}, fewest=None)["t95_target_needs_oracle"]
