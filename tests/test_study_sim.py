"""Simulated studies run the tuner's own loop and policy (budget, baseline, forbidden and
duplicate proposals, parallel pending trials) through the in-process executor, so benchmark
numbers mean what a real run does."""

from __future__ import annotations

import optuna
import pytest

from tests.sim_studies import SMALL_STUDY, build_ground_truth
from tuner.sim.profile import load_profile
from tuner.sim.study import EarlyStopPolicy, run_study
from tuner.study import space
from tuner.study.study_file import parse_study


@pytest.fixture(scope="module")
def small():
    spec = parse_study(SMALL_STUDY, "small")
    return spec, build_ground_truth(spec, load_profile("glm5-8xpcie"))


def rand(spec, seed):
    return optuna.samplers.RandomSampler(seed=seed)


def test_budget_counts_runs_and_the_baseline_runs_first(small) -> None:
    spec, truth = small
    run = run_study(spec, truth, rand, n_trials=12, seed=1)
    assert len(run.trials) == 12
    assert run.trials[0].values == space.baseline_values(spec)
    # The baseline's two further starts for the study's noise are the only repeats.
    keys = [t.key for t in run.trials[spec.load.noise_starts:]]
    assert all(t.key == run.trials[0].key for t in run.trials[:spec.load.noise_starts])
    assert len(set(keys)) == len(keys) and run.trials[0].key not in keys, "a point ran twice"
    assert all(space.forbidden_reason(spec, t.values) is None for t in run.trials)
    assert run.proposals == 12 + run.forbidden + run.duplicates
    assert run.forbidden > 0    # eager + LL128 is proposed now and then, and never run


def test_grid_visits_every_allowed_point_once(small) -> None:
    spec, truth = small
    extra = spec.load.noise_starts - 1      # the baseline's further starts for the study's noise
    run = run_study(spec, truth, rand, n_trials=len(truth.points) + extra, seed=2, grid=True)
    assert sorted(t.key for t in run.trials) == sorted([p.key for p in truth.points] + [run.trials[0].key] * extra)
    assert run.hv_curve(truth)[-1] == pytest.approx(truth.hypervolume)


def test_parallel_workers_overlap_and_tell_in_finishing_order(small) -> None:
    spec, truth = small
    one = run_study(spec, truth, rand, n_trials=10, seed=3)
    four = run_study(spec, truth, rand, n_trials=10, seed=3, workers=4)
    assert one.makespan == pytest.approx(one.total_seconds)
    assert four.makespan < 0.5 * four.total_seconds
    finished = [t.finished_s for t in four.trials]
    assert finished == sorted(finished)


def test_early_stopped_trials_are_told_infeasible(small) -> None:
    spec, truth = small
    run = run_study(spec, truth, rand, n_trials=20, seed=4, policy=EarlyStopPolicy())
    stopped = [t for t in run.trials if t.stopped]
    assert {t.stopped for t in stopped if not t.stopped.startswith("limit:")} <= {
        "not_applied", "probe_failed", "dominated", "dominated_exact"}
    cut = [t for t in stopped if t.stopped != "dominated_exact"]
    assert cut and all(not t.feasible and t.measured is None for t in cut)
    # Dominated once its objective levels are measured: a normal result, minus extra levels.
    exact = [t for t in stopped if t.stopped == "dominated_exact"]
    assert exact and all(t.measured is not None for t in exact)
    for t in exact:
        p = truth.get(t.values)
        full = p.startup_s + p.probe_s + sum(lv.load_s for lv in p.levels.values()) + p.stop_s
        assert t.seconds < full
    # Not applied is known at verification: no probe, no load.
    for t in stopped:
        if t.stopped == "not_applied":
            p = truth.get(t.values)
            assert t.seconds == pytest.approx(p.startup_s + p.stop_s)
