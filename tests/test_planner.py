"""The default sampler in enumerable spaces (tuner.study.planner + surrogate): an initial
design that fits the space, no wasted proposals, and points ranked by expected improvement."""

from __future__ import annotations

import math

import numpy as np
import optuna
import pytest

from tests.sim_studies import SMALL_STUDY, build_ground_truth
from tuner.engine import samplers
from tuner.sim.profile import load_profile
from tuner.sim.study import EarlyStopPolicy, run_study
from tuner.study import planner, space, surrogate
from tuner.study.planner import FAILED, FEASIBLE, INFEASIBLE, RUNNING, Observation, Planner
from tuner.study.sampling import grid_points
from tuner.study.study_file import parse_study


@pytest.fixture(scope="module")
def small():
    spec = parse_study(SMALL_STUDY, "small")
    return spec, build_ground_truth(spec, load_profile("glm5-8xpcie"))


def default(spec, seed):
    return samplers.make_sampler(spec.model_copy(update={"sampler": spec.sampler.model_copy(update={"seed": seed})}))


def _speed(values: dict) -> tuple[float, float]:
    """A made-up additive landscape: mtp and compiled help both objectives, k=2 more than 1."""

    thr = 100.0 * (1.5 if values.get("spec_method") == "mtp" else 1.0) * (0.6 if values["enforce_eager"] else 1.0)
    thr *= 1.1 if values.get("spec_k") == 2 else 1.0
    tpot = 20.0 * (0.8 if values.get("spec_method") == "mtp" else 1.0) * (1.5 if values["enforce_eager"] else 1.0)
    return thr, tpot


def test_the_default_sampler_plans_in_an_enumerable_space(small) -> None:
    spec, _ = small
    assert isinstance(samplers.make_sampler(spec), samplers.PlannedSampler)
    assert planner.enumerable(spec)
    tpe = spec.model_copy(update={"sampler": spec.sampler.model_copy(update={"name": "tpe"})})
    assert isinstance(samplers.make_sampler(tpe), samplers.ParetoLocalSampler)


@pytest.mark.parametrize(("workers", "policy"), [(1, None), (3, None), (1, EarlyStopPolicy())])
def test_no_repeated_or_forbidden_proposal_while_unmeasured_points_remain(small, workers, policy) -> None:
    """The whole allowed space, run through the orchestrator's loop (baseline enqueued,
    repeats told again, forbidden told infeasible, trials that fail or miss a constraint
    told as such, parallel trials pending): every proposal is a new allowed point until
    every allowed point is known."""

    spec, truth = small
    assert any(p.failed or not p.applied or not p.probe_passed for p in truth.points)
    # The baseline's two further starts for the study's noise (load.noise_starts) are the only
    # repeats: run on purpose, never told as duplicates.
    extra = spec.load.noise_starts - 1
    for seed in range(3):
        run = run_study(spec, truth, default, n_trials=len(truth.points) + extra, seed=seed, noise=0.03,
                        workers=workers, policy=policy)
        assert run.duplicates == 0 and run.forbidden == 0, (seed, run.duplicates, run.forbidden)
        keys = [t.key for t in run.trials]
        baseline = run.trials[0].key
        assert sorted(keys) == sorted([p.key for p in truth.points] + [baseline] * extra)
        assert run.proposals == len(truth.points) + extra


def test_failed_infeasible_and_running_points_are_never_planned_again(small) -> None:
    spec, _ = small
    plan = Planner(spec, budget=100)
    points = grid_points(spec)
    keep = points[-3:]
    statuses = [FAILED, INFEASIBLE, RUNNING, FEASIBLE]
    seen = [Observation(p, statuses[i % 4], _speed(p) if statuses[i % 4] in (FEASIBLE, INFEASIBLE) else None)
            for i, p in enumerate(points[:-3])]
    proposed = []
    for seed in range(len(keep)):
        values = plan.plan(seen, seed=seed)
        assert values is not None and space.params_key(values) in {space.params_key(p) for p in keep}
        proposed.append(values)
        seen.append(Observation(values, FEASIBLE, _speed(values)))
    assert len({space.params_key(p) for p in proposed}) == 3
    assert plan.plan(seen, seed=9) is None


def test_of_the_last_points_the_one_of_most_expected_improvement_comes_first(small) -> None:
    spec, _ = small
    plan = Planner(spec, budget=100)
    points = grid_points(spec)
    best = max(points, key=lambda p: _speed(p)[0] / _speed(p)[1])
    rest = [p for p in points if p is not best]
    worst = [p for p in rest if p["enforce_eager"] and p.get("spec_method") is None][:1]
    measured = [p for p in rest if p not in worst]
    seen = [Observation(p, FEASIBLE, _speed(p)) for p in measured if p is not measured[0]]
    # Remaining: the best point, one of the worst, and one measured-like point.
    assert plan.plan(seen, seed=0) == best


def test_the_design_moves_one_knob_from_the_best_point_to_values_never_seen(small) -> None:
    spec, _ = small
    plan = Planner(spec, budget=30)
    base = space.baseline_values(spec)
    seen = [Observation(base, FEASIBLE, _speed(base))]
    new_values: set[tuple[str, str]] = set()
    moves = 0
    for seed in range(plan.design_limit - 1):
        values = plan.plan(seen, seed=seed)
        assert values is not None
        front = planner._front_rows(surrogate.to_model_units(
            np.array([o.objectives for o in seen]), ["maximize", "minimize"])[0])
        anchors = [seen[i].values for i in front]
        fresh = {(k, repr(v)) for k, v in values.items()} - {(k, repr(v)) for o in seen for k, v in o.values.items()}
        if len(seen) % 2 == 1:
            # Every other proposal is a design move (the others are the model's picks).
            if not fresh:
                break      # the design is done: every value reachable this way was seen
            # One knob changed from a point on the front, bringing a value no trial had.
            assert any(space.params_key(values) in {space.params_key(n) for n in _neighbours(spec, a)}
                       for a in anchors)
            moves += 1
        new_values |= fresh
        seen.append(Observation(values, FEASIBLE, _speed(values)))
    assert moves >= 3
    assert ("spec_method", "'mtp'") in new_values and ("enforce_eager", "True") in new_values


def _neighbours(spec, values):
    from tuner.study.sampling import neighbours

    return neighbours(spec, values)


def test_the_additive_model_predicts_an_unmeasured_combination(small) -> None:
    """Measured one knob at a time, the model expects the combination of two good changes
    to beat both, within the noise of its log-unit effects."""

    spec, _ = small
    enc = surrogate.Encoder(spec)
    base = space.baseline_values(spec)
    mtp = {**base, "spec_method": "mtp", "spec_k": 2}
    eager = {"enforce_eager": True, "nccl_proto": base.get("nccl_proto"), "spec_method": None}
    measured = [base, mtp, eager]
    y, _ = surrogate.to_model_units(np.array([_speed(p) for p in measured]), ["maximize", "minimize"])
    fit = surrogate.fit(enc.encode(measured), y, np.full(len(measured), surrogate.NOISE))
    both = {**eager, "spec_method": "mtp", "spec_k": 2}
    predicted = fit.predict(enc.encode([both]))[0]
    truth, _ = surrogate.to_model_units(np.array([_speed(both)]), ["maximize", "minimize"])
    assert np.all(np.abs(predicted - truth[0]) < 0.15)
    # Unmeasured values keep their prior spread; measured ones are known up to the noise.
    assert fit.std(enc.encode([base]))[0] < fit.std(enc.encode([{**base, "cudagraph_mode": "NONE"}]))[0]


def test_a_value_that_is_always_infeasible_drags_its_points_down(small) -> None:
    spec, _ = small
    enc = surrogate.Encoder(spec)
    points = grid_points(spec)
    tried = [p for p in points if p.get("cudagraph_mode") != "NONE"][:12] + \
        [p for p in points if p.get("cudagraph_mode") == "FULL"][:3]
    feasible = np.array([p.get("cudagraph_mode") != "FULL" for p in tried])
    p_ok = surrogate.probability(enc.encode(points), surrogate.feasibility_weights(enc.encode(tried), feasible))
    full = [p_ok[i] for i, p in enumerate(points) if p.get("cudagraph_mode") == "FULL"]
    others = [p_ok[i] for i, p in enumerate(points) if p.get("cudagraph_mode") == "FULL_AND_PIECEWISE"]
    assert max(full) < 0.3 < 0.7 < min(others)


def test_a_space_that_cannot_be_enumerated_gets_the_design_then_tpe() -> None:
    text = SMALL_STUDY.replace(
        "  - {name: nccl_proto, env: NCCL_PROTO, kind: categorical, values: [null, LL, LL128]}",
        "  - {name: nccl_proto, env: NCCL_PROTO, kind: categorical, values: [null, LL, LL128]}\n"
        "  - {name: gpu_mem, flag: gpu_memory_utilization, kind: float, low: 0.8, high: 0.95, default: 0.9}")
    spec = parse_study(text, "continuous")
    assert not planner.enumerable(spec)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    sampler = samplers.make_sampler(spec)
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=sampler)
    study.enqueue_trial(space.baseline_values(spec))
    keys = []
    for _ in range(20):
        trial = study.ask()
        values = {}
        for param in space.ordered_parameters(spec):
            if space.is_active(param, values):
                values[param.name] = samplers.suggest(trial, param)
        trial.set_user_attr("values", values)
        keys.append(space.params_key(values))
        thr, tpot = _speed(values)
        study.tell(trial, [thr, tpot + (values.get("gpu_mem") or 0.9)])
    assert len(set(keys)) == len(keys)
    assert all(math.isfinite(v) for t in study.trials for v in t.values)
