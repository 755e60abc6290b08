"""The early-stop rule: bounds, dominance, and - against the simulator's ground truth - that
it never stops a trial that would have reached the front."""

from __future__ import annotations

import math

import pytest

from tuner.study.early_stop import Target, decide, dominated, infeasible_reason, learned_ratio, level_order, optimistic

THR = Target("output_tok_s", 64, "maximize")
TPOT = Target("tpot_ms.mean", 1, "minimize")
TARGETS = [THR, TPOT]


def lv(**levels: dict[str, float]) -> dict[int, dict[str, float]]:
    return {int(k[1:]): v for k, v in levels.items()}


def test_measured_objective_is_exact() -> None:
    measured = lv(c1={"tpot_ms.mean": 20.0, "output_tok_s": 45.0})
    assert optimistic(TPOT, measured, []) == 20.0


def test_throughput_bound_is_physical_without_history() -> None:
    # One stream at 45 tok/s: 64 streams can at most go 64 times as fast.
    measured = lv(c1={"output_tok_s": 45.0}, c16={"output_tok_s": 150.0})
    assert optimistic(THR, measured, []) == pytest.approx(150.0 * 64 / 16)


def test_throughput_bound_uses_learned_ratio_with_margin() -> None:
    history = [lv(c16={"output_tok_s": 100.0}, c64={"output_tok_s": 180.0}),
               lv(c16={"output_tok_s": 150.0}, c64={"output_tok_s": 300.0}),
               lv(c16={"output_tok_s": 120.0}, c64={"output_tok_s": 200.0})]
    assert learned_ratio(history, "output_tok_s", 16, 64) == (2.0, 3)
    measured = lv(c1={"output_tok_s": 45.0}, c16={"output_tok_s": 150.0})
    assert optimistic(THR, measured, history, margin=0.25) == pytest.approx(150.0 * 2.0 * 1.25)
    # Too little history: back to the physical bound.
    assert optimistic(THR, measured, history[:2], min_history=3) == pytest.approx(600.0)


def test_learned_ratio_never_exceeds_the_physical_bound() -> None:
    history = [lv(c16={"output_tok_s": 10.0}, c64={"output_tok_s": 90.0})] * 3   # 9x: noise
    assert optimistic(THR, lv(c16={"output_tok_s": 10.0}), history) == pytest.approx(40.0)


def test_no_throughput_bound_across_a_wide_gap() -> None:
    # 1 -> 64: batching gains differ threefold between configurations (eager vs MTP), so a
    # ratio learned from other trials says too little; the trial must measure closer.
    history = [lv(c1={"output_tok_s": 40.0}, c64={"output_tok_s": 290.0})] * 5
    assert optimistic(THR, lv(c1={"output_tok_s": 20.0}), history) == math.inf
    assert optimistic(THR, lv(c1={"output_tok_s": 20.0}), history, max_gap=64) == pytest.approx(20 * 7.25 * 1.25)


def test_latency_bound_is_the_lower_level_and_unknown_metrics_are_unbounded() -> None:
    measured = lv(c1={"tpot_ms.mean": 20.0, "e2el_ms.p90": 900.0})
    assert optimistic(Target("tpot_ms.mean", 16, "minimize"), measured, []) == 20.0
    assert optimistic(Target("e2el_ms.p90", 64, "minimize"), measured, []) == 900.0
    assert optimistic(Target("probe_s", 64, "minimize"), measured, []) == -math.inf
    assert optimistic(Target("tpot_ms.mean", 16, "maximize"), measured, []) == math.inf
    # A level below every measured one cannot be bounded from above it.
    assert optimistic(Target("output_tok_s", 1, "maximize"), lv(c4={"output_tok_s": 9.0}), []) == math.inf


def test_bound_from_an_unsteady_level_starts_from_its_fastest_pace() -> None:
    # The smollm2-engine landscape (real CPU build, busy cores): level 1 at 5.9 tok/s with
    # sub-windows 1.83x apart, then 30.4 tok/s at level 4 - more than 4 x 5.9. Carried to
    # level 4 the level-1 rate is taken at its fastest sub-window's pace.
    thr4 = Target("output_tok_s", 4, "maximize")
    steady = lv(c1={"output_tok_s": 5.9, "tpot_ms.mean": 169.9, "stability_ratio": 1.0})
    shaky = lv(c1={"output_tok_s": 5.9, "tpot_ms.mean": 169.9, "stability_ratio": 1.83})
    assert optimistic(thr4, steady, []) == pytest.approx(23.6)
    assert optimistic(thr4, shaky, []) == pytest.approx(5.9 * 1.83 * 4) and optimistic(thr4, shaky, []) > 30.4
    # Latency carried upwards: divided by the spread (a disturbance inflates it).
    assert optimistic(Target("tpot_ms.mean", 4, "minimize"), shaky, []) == pytest.approx(169.9 / 1.83)
    # The level's own value is what it measured: the spread only moves bounds to other levels.
    assert optimistic(Target("output_tok_s", 1, "maximize"), shaky, []) == pytest.approx(5.9)
    # Not reported, NaN or steady: no widening.
    for ratio in (None, math.nan, 0.9):
        level = {"output_tok_s": 5.9} if ratio is None else {"output_tok_s": 5.9, "stability_ratio": ratio}
        assert optimistic(thr4, {1: level}, []) == pytest.approx(23.6)
    # Flagged unstable with no ratio (a sub-window without tokens, or no window): no bound.
    blank = {1: {"output_tok_s": 5.9, "tpot_ms.mean": 169.9, "stability_ratio": math.nan, "unstable": 1.0}}
    assert optimistic(thr4, blank, []) == math.inf
    assert optimistic(Target("tpot_ms.mean", 4, "minimize"), blank, []) == -math.inf


def test_real_landscape_replay_never_stops_a_trial_that_would_enter_the_front() -> None:
    # benchmarks/landscapes/smollm2-engine.json replayed as benchmarks/anytime.py does: before
    # the unsteady-level widening, 4 of 30 seeds stopped the eager float32 n-gram point after
    # level 1 although its full measurement would have entered the study's front.
    import json
    from pathlib import Path

    from tuner.engine.samplers import make_sampler
    from tuner.sim.landscape import ground_truth
    from tuner.sim.study import EarlyStopPolicy, run_study
    from tuner.study.spec import ExecutionSpec, SamplerSpec
    from tuner.study.study_file import parse_study

    root = Path(__file__).resolve().parents[1]
    data = json.loads((root / "benchmarks/landscapes/smollm2-engine.json").read_text(encoding="utf-8"))
    path = root / data["study_file"]
    spec = parse_study(path.read_text(encoding="utf-8"), str(path)).model_copy(
        update={"sampler": SamplerSpec(), "execution": ExecutionSpec()})
    truth = ground_truth(spec, data)
    policy = EarlyStopPolicy(reorder=True, streaming_verify=True, inside=True)
    stopped = wrong = 0
    for seed in (3, 9, 10, 27):       # the seeds that stopped it wrongly
        def factory(s, sd):
            return make_sampler(s.model_copy(update={"sampler": SamplerSpec(name="auto", seed=sd)}),
                                budget=len(truth.points))
        run = run_study(spec, truth, factory, n_trials=len(truth.points), seed=seed, noise=0.03,
                        policy=policy, compile_cache=True)
        stopped += sum(1 for t in run.trials if t.stopped)
        wrong += sum(1 for t in run.trials if t.would_enter_front)
    assert stopped > 0, "nothing stopped: the replay would prove nothing"
    assert wrong == 0


def test_dominance_needs_strictly_better_somewhere() -> None:
    dirs = ["maximize", "minimize"]
    assert dominated((300.0, 14.0), [(300.0, 14.0)], dirs) is None            # equal: not dominated
    assert dominated((300.0, 14.0), [(301.0, 14.0)], dirs) == 0
    assert dominated((300.0, 14.0), [(250.0, 10.0), (310.0, 13.0)], dirs) == 1
    assert dominated((300.0, 14.0), [(350.0, 15.0)], dirs) is None            # trade-off


def test_decide_stops_only_a_sure_loser_and_only_with_levels_left() -> None:
    front = [(330.0, 13.7), (287.0, 11.1)]
    history = [lv(c16={"output_tok_s": 150.0}, c64={"output_tok_s": 294.0})] * 3
    slow = lv(c1={"tpot_ms.mean": 50.0, "output_tok_s": 20.0}, c16={"output_tok_s": 120.0})
    d = decide(TARGETS, slow, [64], front, history)
    assert d.stop and d.reason == "dominated" and d.bounds[0] == pytest.approx(120 * 1.96 * 1.25)
    assert not decide(TARGETS, slow, [], front, history).stop           # nothing left to save
    # Low TPOT: nothing on the front is better in both, whatever its throughput turns out.
    fast = lv(c1={"tpot_ms.mean": 10.0, "output_tok_s": 95.0}, c16={"output_tok_s": 120.0})
    assert not decide(TARGETS, fast, [64], front, history).stop
    # Same TPOT as a front point but a bound above its throughput: keep measuring.
    close = lv(c1={"tpot_ms.mean": 13.8, "output_tok_s": 72.0}, c16={"output_tok_s": 140.0})
    assert not decide(TARGETS, close, [64], front, history).stop
    # Every objective measured (levels 1 and 64 first): exact, only extra levels remain.
    done = lv(c1={"tpot_ms.mean": 20.0}, c64={"output_tok_s": 300.0})
    d = decide(TARGETS, done, [4, 16], front, history)
    assert d.stop and d.reason == "dominated_exact" and d.bounds == (300.0, 20.0)


def test_level_order_puts_objective_levels_first() -> None:
    assert level_order([1, 4, 16, 64], [64, 1]) == [1, 64, 4, 16]
    assert level_order([1, 4, 16, 64], [64, 1, 4]) == [1, 4, 64, 16]
    assert level_order([2, 8], []) == [2, 8]


def test_infeasible_reasons() -> None:
    assert infeasible_reason(applied=False, probe_passed=None) == "not_applied"
    assert infeasible_reason(applied=False, probe_passed=True, require_applied=False) is None
    assert infeasible_reason(applied=True, probe_passed=False) == "probe_failed"
    assert infeasible_reason(applied=True, probe_passed=True,
                             limit_violations={"ttft_ms.p90@c1<=5000": 12.0}) == "limit:ttft_ms.p90@c1<=5000"
    assert infeasible_reason(applied=None, probe_passed=None, limit_violations={"x": -3.0}) is None


# -- against ground truth -------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_truth():
    from tests.sim_studies import SMALL_STUDY, build_ground_truth
    from tuner.sim.profile import load_profile
    from tuner.study.study_file import parse_study

    spec = parse_study(SMALL_STUDY, "es-small")
    return spec, build_ground_truth(spec, load_profile("glm5-8xpcie"))


def test_never_stops_a_front_point_in_simulated_studies(small_truth) -> None:
    import optuna

    from tuner.engine.samplers import make_sampler
    from tuner.sim.study import EarlyStopPolicy, run_study

    spec, truth = small_truth
    assert len(truth.front) >= 2
    policy = EarlyStopPolicy()
    stopped = wrong = true_front = 0
    saved = []
    for seed in range(2):
        for factory in (lambda s, seed: optuna.samplers.RandomSampler(seed=seed),
                        lambda s, seed: make_sampler(s.model_copy(update={
                            "sampler": s.sampler.model_copy(update={"seed": seed})}))):
            for noise in (0.05,):
                on = run_study(spec, truth, factory, n_trials=16, seed=seed, noise=noise, policy=policy)
                off = run_study(spec, truth, factory, n_trials=16, seed=seed, noise=noise)
                stopped += sum(1 for t in on.trials if t.stopped)
                wrong += sum(1 for t in on.trials if t.would_enter_front)
                true_front += sum(1 for t in on.trials if t.stopped and t.true_front)
                saved.append(1 - on.total_seconds / off.total_seconds)
    assert stopped > 0, "the rule never fired: the test would prove nothing"
    assert wrong == 0
    assert true_front == 0
    # Startup dominates this small workload's trials, so the saving is small but real;
    # benchmarks/search_efficiency.py --early-stop measures it on the glm5 spaces.
    assert min(saved) > 0


# -- the worker's guard and what the orchestrator tells ------------------------------------

def _plan(front, history=(), limits=()):
    from tuner.study.sweep_guard import sweep_plan

    return sweep_plan(TARGETS, list(limits), [1, 4, 16, 64], front, list(history))


def test_guard_orders_levels_and_stops_a_dominated_trial_after_its_objective_levels() -> None:
    import json

    from tuner.study.sweep_guard import SweepGuard

    plan = json.loads(_plan([(330.0, 13.7), (287.0, 11.1)]).model_dump_json())  # as it crosses Ray
    guard = SweepGuard(plan)
    assert guard.levels([1, 4, 16, 64]) == [1, 64, 4, 16]
    assert not guard.stop_after("verify", applied=True)
    assert not guard.stop_after("probe", probe_passed=True)
    assert not guard.after_level(lv(c1={"tpot_ms.mean": 20.0}), [64, 4, 16])    # throughput unknown
    assert guard.after_level(lv(c1={"tpot_ms.mean": 20.0}, c64={"output_tok_s": 300.0}), [4, 16])
    assert guard.record["reason"] == "dominated_exact" and guard.record["after"] == "c64"
    assert guard.record["skipped_levels"] == [4, 16] and guard.record["bounds"] == [300.0, 20.0]
    # A front point is never stopped: better TPOT than every front point.
    keep = SweepGuard(plan)
    assert not keep.after_level(lv(c1={"tpot_ms.mean": 10.0}, c64={"output_tok_s": 200.0}), [4, 16])
    assert keep.record is None


def test_guard_stops_infeasible_trials_at_once_and_never_without_a_plan() -> None:
    from tuner.study.sweep_guard import SweepGuard

    g = SweepGuard(_plan([]))
    assert g.stop_after("verify", applied=False) and g.record["reason"] == "not_applied"
    assert g.stop_after("probe", probe_passed=None)          # stays stopped
    g = SweepGuard(_plan([]))
    assert not g.stop_after("verify", applied=None) and g.stop_after("probe", probe_passed=False)
    assert g.record == {"reason": "probe_failed", "after": "probe", "bounds": None, "skipped_levels": [1, 64, 4, 16]}
    limit = {"label": "ttft_ms.p90@c1<=5000", "metric": "ttft_ms.p90", "level": 1, "max": 5000.0, "min": None}
    g = SweepGuard(_plan([], limits=[limit]))
    assert not g.after_level(lv(c1={"ttft_ms.p90": 4000.0, "tpot_ms.mean": 9.0}), [64, 4, 16])
    g = SweepGuard(_plan([], limits=[limit]))
    assert g.after_level(lv(c1={"ttft_ms.p90": 6000.0, "tpot_ms.mean": 9.0}), [64, 4, 16])
    assert g.record["reason"] == "limit:ttft_ms.p90@c1<=5000"
    none = SweepGuard(None)
    assert none.levels([1, 4, 16, 64]) == [1, 4, 16, 64]
    assert not none.stop_after("verify", applied=False) and not none.after_level(lv(c1={}), [4])


def test_stopped_trials_are_told_infeasible_with_bounds_or_worst_values() -> None:
    from tests.sim_studies import SMALL_STUDY
    from tuner.study.outcome import TrialOutcome
    from tuner.study.scoring import stopped_told
    from tuner.study.study_file import parse_study
    from tuner.study.trials import TrialRecord

    spec = parse_study(SMALL_STUDY, "es-small")
    dominated = TrialOutcome(number=3, status="completed", applied=True, probe_passed=True,
                             levels={"1": {"tpot_ms.mean": 20.0, "output_tok_s": 40.0, "ttft_ms.p90": 90.0}},
                             early_stop={"reason": "dominated", "after": "c1", "bounds": [150.0, 20.0]})
    values, violated, placeholder = stopped_told(spec, dominated, worst=[10.0, 99.0])
    assert values[[o.metric for o in spec.objectives].index("tpot_ms.mean")] == 20.0
    assert violated["early_stopped"] == 1.0 and not placeholder
    record = TrialRecord(3, "COMPLETE", "run", {}, constraints=violated)
    assert not record.feasible and record.outcome == "stopped_early"
    unapplied = TrialOutcome(number=4, status="completed", applied=False, mismatches=[{"target": "x"}],
                             early_stop={"reason": "not_applied", "after": "verify", "bounds": None})
    values, violated, placeholder = stopped_told(spec, unapplied, worst=[10.0, 99.0])
    assert values == [10.0, 99.0] and placeholder and violated["applied"] > 0
    assert TrialRecord(4, "COMPLETE", "run", {}, constraints=violated).outcome == "not_applied"
    assert stopped_told(spec, unapplied, worst=None)[0] is None      # first trial: told FAIL


def test_plan_front_and_history_come_from_measured_feasible_trials() -> None:
    from optuna.trial import TrialState, create_trial

    from tests.sim_studies import SMALL_STUDY
    from tuner.store.records import to_record
    from tuner.study.policy import early_stop_plan
    from tuner.study.study_file import parse_study

    spec = parse_study(SMALL_STUDY, "es-small")
    labels = [o.metric for o in spec.objectives]
    levels = {str(c): {"output_tok_s": 10.0 * c, "tpot_ms.mean": 12.0, "ttft_ms.p90": 50.0}
              for c in spec.load.concurrency}

    def trial(values, constraints, **attrs):
        return create_trial(state=TrialState.COMPLETE, values=values,
                            user_attrs={"kind": "run", "outcome": {"levels": levels}, **attrs},
                            system_attrs={f"constraints:{k}": v for k, v in constraints.items()})

    dirs = [o.direction for o in spec.objectives]
    good = [300.0 if d == "maximize" else 12.0 for d in dirs]
    worse = [200.0 if d == "maximize" else 15.0 for d in dirs]
    trials = [trial(good, {"probe": 0.0}), trial(worse, {"probe": 0.0}),
              trial([900.0, 1.0], {"probe": 1.0}),                       # infeasible: not on the front
              trial([900.0, 1.0], {"early_stopped": 1.0}),                # bounds: neither front nor history
              trial([900.0, 1.0], {"forbidden": 1.0}, kind="forbidden")]
    plan = early_stop_plan(spec, [to_record(t, [o.label for o in spec.objectives]) for t in trials])
    assert plan.front == [good]
    assert len(plan.history) == 3 and set(plan.history[0]) == {str(c) for c in spec.load.concurrency}
    assert set(plan.history[0][str(spec.load.concurrency[0])]) <= set(labels)


def test_startup_time_as_an_objective_and_as_a_limit() -> None:
    """Trial-level metrics (startup_s) are exact before the sweep: a third objective on them
    stops nothing by itself, and a limit on them is read from the trial, never missed for
    lack of a load-level value."""

    from tuner.study.early_stop import TRIAL_LEVEL
    from tuner.study.sweep_guard import SweepGuard, sweep_plan

    startup = Target("startup_s", TRIAL_LEVEL, "minimize")
    limit = {"label": "startup_s<=600", "metric": "startup_s", "level": TRIAL_LEVEL, "max": 600.0, "min": None}
    front = [(330.0, 13.7, 400.0)]
    plan = sweep_plan([THR, TPOT, startup], [limit], [1, 4, 16, 64], front, [])
    assert plan.order == [1, 64, 4, 16]
    slow_start = SweepGuard(plan)
    slow_start.trial_metrics = {"startup_s": 500.0, "probe_s": 9.0}
    measured = lv(c1={"tpot_ms.mean": 20.0}, c64={"output_tok_s": 300.0})
    assert slow_start.after_level(measured, [4, 16])         # worse in all three: dominated, exact
    assert slow_start.record["reason"] == "dominated_exact"
    fast_start = SweepGuard(plan)
    fast_start.trial_metrics = {"startup_s": 200.0, "probe_s": 9.0}
    assert not fast_start.after_level(measured, [4, 16])     # a faster start is a trade-off
    too_slow = SweepGuard(plan)
    too_slow.trial_metrics = {"startup_s": 700.0, "probe_s": 9.0}
    assert too_slow.after_level(lv(c1={"tpot_ms.mean": 5.0}), [64, 4, 16])
    assert too_slow.record["reason"] == "limit:startup_s<=600"


def test_plan_with_startup_time_as_a_third_objective_keeps_its_history() -> None:
    from optuna.trial import TrialState, create_trial

    from tests.sim_studies import SMALL_STUDY
    from tuner.store.records import to_record
    from tuner.study.early_stop import TRIAL_LEVEL
    from tuner.study.policy import early_stop_plan
    from tuner.study.study_file import parse_study

    spec = parse_study(SMALL_STUDY, "es-small")
    spec = spec.model_copy(update={"objectives": [*spec.objectives, spec.objectives[0].model_copy(
        update={"metric": "startup_s", "direction": "minimize"})]})
    levels = {str(c): {"output_tok_s": 10.0 * c, "tpot_ms.mean": 12.0} for c in spec.load.concurrency}
    trial = create_trial(state=TrialState.COMPLETE, values=[300.0, 12.0, 400.0],
                         user_attrs={"kind": "run", "outcome": {"levels": levels, "startup_s": 400.0}},
                         system_attrs={"constraints:probe": 0.0})
    plan = early_stop_plan(spec, [to_record(trial, [o.label for o in spec.objectives])])
    assert [t.level for t in plan.targets][-1] == TRIAL_LEVEL
    assert plan.front == [[300.0, 12.0, 400.0]] and len(plan.history) == 1
