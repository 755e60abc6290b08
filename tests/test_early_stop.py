"""The early-stop rule: bounds, dominance, and - against the simulator's ground truth - that
it never stops a trial that would have reached the front."""

from __future__ import annotations

import math

import pytest

from tuner.core.early_stop import (Target, decide, dominated, infeasible_reason, learned_ratio,
                                   level_order, optimistic)

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
    from tests.sim_studies import SMALL_STUDY
    from tuner.core.spec import parse_study
    from tuner.search_truth import build_ground_truth
    from tuner.sim.profile import load_profile

    spec = parse_study(SMALL_STUDY, "es-small")
    return spec, build_ground_truth(spec, load_profile("glm5-8xpcie"))


def test_never_stops_a_front_point_in_simulated_studies(small_truth) -> None:
    import optuna

    from tuner.core.sampling import make_sampler
    from tuner.study_sim import EarlyStopPolicy, run_study

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
