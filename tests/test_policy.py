"""The study's ask/tell policy (tuner.study.policy), one decision at a time, on plain trial
records: no Optuna study, no executor, no processes."""

from __future__ import annotations

from typing import Any

import pytest

from tests.sim_studies import SMALL_STUDY
from tuner.study import policy, space
from tuner.study.outcome import TrialOutcome
from tuner.study.outcome_summary import Failure
from tuner.study.study_file import parse_study
from tuner.study.trials import TrialRecord

SPEC = parse_study(SMALL_STUDY, "small")
LABELS = [o.label for o in SPEC.objectives]          # output_tok_s@c16 (max), tpot_ms.mean@c1 (min)
DIRS = [o.direction for o in SPEC.objectives]
BASE = space.baseline_values(SPEC)
OTHER = {**BASE, "nccl_proto": "LL"}
FORBIDDEN = {"enforce_eager": True, "nccl_proto": "LL128", "spec_method": None}


def record(number: int, values: dict[str, Any], state: str = "COMPLETE", told: tuple[float, float] | None = None,
           constraints: dict[str, float] | None = None, kind: str = "run", **attrs: Any) -> TrialRecord:
    return TrialRecord(number, state, kind, dict(values),
                       values=dict(zip(LABELS, told)) if told is not None else {},
                       constraints=dict(constraints or {}), attrs={"kind": kind, "values": dict(values), **attrs})


def levels(*, thr: float = 900.0, tpot: float = 5.0, ttft: float = 100.0, failed: float = 0.0,
           mismatch: float = 0.0) -> dict[str, Any]:
    return {"1": {"tpot_ms.mean": tpot, "ttft_ms.p90": ttft, "failed": failed},
            "4": {"output_tok_s": thr / 2, "failed": 0.0},
            "16": {"output_tok_s": thr, "failed": 0.0, "token_mismatch": mismatch}}


def completed(**kw: Any) -> TrialOutcome:
    fields: dict[str, Any] = {"number": 3, "status": "completed", "applied": True, "probe_passed": True,
                              "levels": levels(), "trial_s": 60.0}
    fields.update(kw)
    return TrialOutcome(**fields)


def no_worst() -> list[float] | None:
    raise AssertionError("worst values read for an outcome that needs none")


# -- completed trials --------------------------------------------------------------------


def test_a_measured_trial_is_told_its_values_and_met_constraints() -> None:
    told = policy.told_for(SPEC, completed(), no_worst)
    assert told.how == "measured" and told.values == [900.0, 5.0] and told.verdict == "feasible"
    assert told.constraints == {"probe": 0.0, "applied": 0.0, "load_errors": 0.0,
                                "limit:ttft_ms.p90@c1<=5000.0": 100.0 - 5000.0}
    assert all(v <= 0 for v in told.constraints.values())


@pytest.mark.parametrize(("outcome", "violated", "verdict"), [
    (completed(probe_passed=False, probe_reason="garbled"), "probe", "probe_failed"),
    (completed(applied=False, mismatches=[{"target": "a"}, {"target": "b"}]), "applied", "not_applied"),
    (completed(levels=levels(ttft=7000.0)), "limit:ttft_ms.p90@c1<=5000.0", "limit_missed"),
    (completed(levels=levels(failed=3.0)), "load_errors", "load_errors"),
    (completed(levels=levels(mismatch=16.0)), "token_count_mismatch", "token_count_mismatch"),
])
def test_an_infeasible_trial_keeps_its_values_with_a_violated_constraint(outcome: TrialOutcome,
                                                                          violated: str, verdict: str) -> None:
    told = policy.told_for(SPEC, outcome, no_worst)
    assert told.how == "measured" and told.values == [900.0, 5.0] and told.verdict == verdict
    assert [k for k, v in told.constraints.items() if v > 0] == [violated]
    if violated == "applied":
        assert told.constraints["applied"] == 2.0          # one per knob not applied
    if violated == "limit:ttft_ms.p90@c1<=5000.0":
        assert told.constraints[violated] == 2000.0       # by how much


def test_a_trial_without_an_objective_value_fails_no_measurement() -> None:
    lv = levels()
    del lv["1"]["tpot_ms.mean"]
    told = policy.told_for(SPEC, completed(levels=lv), no_worst)
    assert told.how == "no_measurement" and told.values is None
    assert told.missing == ["tpot_ms.mean@c1"] and told.failure.reason == "no_measurement"


def test_a_trial_whose_objective_level_only_failed_fails_load_errors_with_the_reason() -> None:
    # A server answering HTTP 500 to everything is no slow server with too few samples.
    lv = levels(failed=4.0)
    del lv["1"]["tpot_ms.mean"]
    text = "4 of 4 measured requests failed: 4 http_status (HTTP 500: Internal Server Error)"
    told = policy.told_for(SPEC, completed(levels=lv, load_failures={"1": text}), no_worst)
    assert told.how == "load_errors" and told.values is None
    assert told.verdict == "failed:load_errors" and told.missing == ["tpot_ms.mean@c1"]
    assert told.failure == Failure("load_errors", f"no value for tpot_ms.mean@c1: c=1: {text}", "load")
    # An outcome from before load_failures was kept: the count alone.
    told = policy.told_for(SPEC, completed(levels=lv), no_worst)
    assert told.failure.message == "no value for tpot_ms.mean@c1: c=1: 4 measured requests failed"


# -- failed trials ---------------------------------------------------------------------


@pytest.mark.parametrize(("reason", "phase"), [
    ("server_exited", "start"), ("invalid_config", "start"), ("gpu_memory_insufficient", "start"),
    ("startup_timeout", "start"), ("server_died", "load"), ("trial_timeout", "load"),
    ("worker_lost", None), ("interrupted", None),
])
def test_a_failed_trial_is_told_fail_with_its_typed_reason(reason: str, phase: str | None) -> None:
    outcome = TrialOutcome(number=4, status="failed", reason=reason, phase=phase, message="why",
                           log_excerpt="x" * 5000)
    told = policy.told_for(SPEC, outcome, no_worst)
    assert told.how == "failed" and told.values is None and told.constraints == {}
    assert told.verdict == f"failed:{reason}"
    failure = told.failure
    assert (failure.reason, failure.phase, failure.message) == (reason, phase, "why")
    assert len(failure.log_excerpt) == 2000            # the tail, bounded
    assert told.user_attrs()["failure"] == {"reason": reason, "message": "why", "phase": phase,
                                            "log_excerpt": "x" * 2000}


# -- early-stopped trials ----------------------------------------------------------------


def test_a_trial_stopped_on_a_bound_is_told_its_bounds_and_never_feasible() -> None:
    lv = {"1": levels()["1"]}                              # TPOT measured, throughput level skipped
    outcome = completed(levels=lv, early_stop={"reason": "dominated", "after": "c1", "bounds": [400.0, None]})
    told = policy.told_for(SPEC, outcome, lambda: [10.0, 99.0])
    assert told.how == "stopped"
    assert told.values == [400.0, 5.0]                     # bound for the unmeasured, measured TPOT
    assert told.constraints["early_stopped"] == 1.0 and "placeholder_values" not in told.attrs
    assert told.verdict == "stopped_early"


def test_a_trial_stopped_before_measuring_takes_the_worst_values_or_fails_first() -> None:
    outcome = completed(levels={}, applied=False, probe_passed=None,
                        early_stop={"reason": "not_applied", "after": "verify", "bounds": None})
    told = policy.told_for(SPEC, outcome, lambda: [10.0, 99.0])
    assert told.values == [10.0, 99.0] and told.attrs["placeholder_values"] is True
    assert told.constraints["early_stopped"] == 1.0 and told.constraints["applied"] > 0
    first = policy.told_for(SPEC, outcome, lambda: None)   # the study's first trial: nothing to copy
    assert first.values is None and first.failure.reason == "early_stopped"


def test_rule_4a_measured_its_objectives_and_is_told_as_measured() -> None:
    outcome = completed(early_stop={"reason": "dominated_exact", "after": "c16 at last dispatch",
                                    "bounds": [900.0, 5.0]})
    told = policy.told_for(SPEC, outcome, no_worst)
    assert told.how == "measured" and told.values == [900.0, 5.0] and "early_stopped" not in told.constraints


# -- points that never run ---------------------------------------------------------------


def test_a_forbidden_point_is_told_the_worst_values_or_fail_before_any_measurement() -> None:
    trials = [record(0, BASE, told=(500.0, 6.0)), record(1, OTHER, told=(800.0, 9.0))]
    told = policy.screen(SPEC, FORBIDDEN, 2, trials, LABELS, DIRS)
    assert told is not None and told.how == "forbidden"
    assert told.values == [500.0, 9.0]                     # worst of each objective
    assert told.constraints == {"forbidden": 1.0}
    assert told.attrs["kind"] == "forbidden" and told.attrs["placeholder_values"] is True
    assert told.failure == Failure("forbidden", "tests need a forbidden rule")
    assert told.verdict == "forbidden"
    first = policy.screen(SPEC, FORBIDDEN, 0, [], LABELS, DIRS)
    assert first is not None and first.values is None and first.constraints == {}


def test_a_repeat_of_a_measured_point_is_told_the_earlier_result_again() -> None:
    earlier = record(0, BASE, told=(500.0, 6.0), constraints={"probe": 0.0, "applied": 1.0})
    told = policy.screen(SPEC, dict(BASE), 5, [earlier, record(5, BASE, state="RUNNING")], LABELS, DIRS)
    assert told is not None and told.how == "duplicate"
    assert told.values == [500.0, 6.0] and told.constraints == {"probe": 0.0, "applied": 1.0}
    assert told.attrs == {"kind": "duplicate", "duplicate_of": 0} and told.verdict == "duplicate"


@pytest.mark.parametrize("state", ["FAIL", "RUNNING"])
def test_a_repeat_of_a_failed_or_running_point_is_infeasible(state: str) -> None:
    trials = [record(0, OTHER, told=(500.0, 6.0)), record(1, BASE, state=state)]
    told = policy.screen(SPEC, dict(BASE), 2, trials, LABELS, DIRS)
    assert told is not None and told.how == "duplicate" and told.values == [500.0, 6.0]
    assert told.constraints == {"failed_before": 1.0} and told.attrs["duplicate_of"] == 1
    assert told.failure.reason == "duplicate"


def test_a_new_point_runs_and_an_interrupted_one_runs_again() -> None:
    assert policy.screen(SPEC, dict(OTHER), 1, [record(0, BASE, told=(1.0, 1.0))], LABELS, DIRS) is None
    # The trial being screened is itself in the study (RUNNING with its values): not a repeat.
    assert policy.screen(SPEC, dict(BASE), 0, [record(0, BASE, state="RUNNING")], LABELS, DIRS) is None
    interrupted = record(0, BASE, state="FAIL", failure={"reason": "interrupted"})
    assert policy.screen(SPEC, dict(BASE), 1, [interrupted], LABELS, DIRS) is None


# -- bookkeeping ------------------------------------------------------------------------------


def test_worst_values_and_the_budget_count_only_run_trials() -> None:
    trials = [record(0, BASE, told=(500.0, 6.0)), record(1, OTHER, told=(800.0, 9.0)),
              record(2, FORBIDDEN, told=(1.0, 99.0), kind="forbidden"),      # placeholder, not a run
              record(3, BASE, told=(400.0, 20.0), kind="duplicate"),
              record(4, OTHER, state="FAIL", failure={"reason": "server_exited"}),
              record(5, OTHER, state="FAIL", failure={"reason": "interrupted"}),
              record(6, OTHER, state="RUNNING")]
    assert policy.worst_values(trials, LABELS, DIRS) == [500.0, 9.0]
    assert policy.worst_values([], LABELS, DIRS) is None
    assert policy.finished_runs(trials) == 3               # 0, 1 and the failed start 4
    assert set(policy.known_points(trials)) == {space.params_key(BASE), space.params_key(OTHER)}
    assert policy.known_points(trials)[space.params_key(OTHER)].number == 1


def test_the_baseline_then_the_starting_points_are_queued_once() -> None:
    spec = SPEC.model_copy(update={"starting_points": [OTHER],
                                   "load": SPEC.load.model_copy(update={"noise_floor": 0.05})})
    first = policy.first_points(spec, [])
    assert [p.attrs for p in first] == [{"baseline": True, "attempt": 1}, {"starting_point": 0, "attempt": 1}]
    assert first[0].values == BASE
    queued = [record(0, BASE, state="WAITING", baseline=True), record(1, OTHER, state="WAITING", starting_point=0)]
    assert policy.first_points(spec, queued) == []


def test_the_baseline_starts_again_for_the_study_noise_unless_a_floor_is_set() -> None:
    spec = SPEC.model_copy(update={"starting_points": [OTHER]})
    first = policy.first_points(spec, [])
    assert [p.attrs for p in first] == [{"baseline": True, "attempt": 1}, {"noise_start": 2, "attempt": 1},
                                        {"noise_start": 3, "attempt": 1}, {"starting_point": 0, "attempt": 1}]
    assert first[1].values == first[2].values == BASE
    # A resumed study queues only what is missing.
    queued = [record(0, BASE, baseline=True, told=(1.0, 1.0)), record(1, BASE, state="WAITING", noise_start=2)]
    assert [p.attrs for p in policy.first_points(spec, queued)] == [
        {"noise_start": 3, "attempt": 1}, {"starting_point": 0, "attempt": 1}]
    # A fresh start of the baseline is run on purpose, never told as a duplicate of it; an
    # interrupted one is retried as one.
    running = record(2, BASE, state="RUNNING", noise_start=3)
    assert policy.screen(spec, dict(BASE), 2, [queued[0], running], LABELS, DIRS) is None
    again = policy.retry(record(2, BASE, state="FAIL", noise_start=3), max_retries=2)
    assert again is not None and again.attrs["noise_start"] == 3


def test_fill_in_after_rejections_and_on_a_grid() -> None:
    trials = [record(0, BASE, told=(1.0, 1.0))]
    assert policy.fill_in(SPEC, trials, rejected_in_a_row=policy.MAX_REJECTED_IN_A_ROW - 1) is None
    extra = policy.fill_in(SPEC, trials, rejected_in_a_row=policy.MAX_REJECTED_IN_A_ROW)
    assert extra is not None and extra.attrs == {"attempt": 1, "filled_in": True}
    assert space.params_key(extra.values) != space.params_key(BASE)
    assert space.forbidden_reason(SPEC, extra.values) is None
    # Seeded by the study's seed and size: a resumed study continues the same sequence.
    again = policy.fill_in(SPEC, trials, rejected_in_a_row=policy.MAX_REJECTED_IN_A_ROW)
    assert again == extra
    grid = policy.grid_order(SPEC)
    assert grid == policy.grid_order(SPEC) and len(grid) == len({space.params_key(g) for g in grid})
    known = [record(i, values, told=(1.0, 1.0)) for i, values in enumerate(grid[:3])]
    nxt = policy.fill_in(SPEC, known, rejected_in_a_row=0, grid=grid)
    assert nxt is not None and nxt.values == grid[3]
    assert policy.fill_in(SPEC, [*known, record(9, grid[3], state="WAITING")], rejected_in_a_row=0,
                          grid=grid) is None          # one waiting point at a time
    assert policy.fill_in(SPEC, [record(i, g, told=(1.0, 1.0)) for i, g in enumerate(grid)],
                          rejected_in_a_row=0, grid=grid) is None


def test_an_interrupted_trial_is_retried_while_its_attempts_last() -> None:
    trial = record(7, OTHER, state="FAIL", attempt=1, baseline=False, failure={"reason": "interrupted"})
    again = policy.retry(trial, max_retries=1)
    assert again is not None and again.values == OTHER
    assert again.attrs == {"retry_of": 7, "attempt": 2, "baseline": False}
    assert policy.retry(record(8, OTHER, state="FAIL", attempt=2), max_retries=1) is None


def test_on_resume_a_running_trial_is_recorded_from_its_outcome_or_failed_and_retried() -> None:
    running = record(2, OTHER, state="RUNNING", attempt=1)
    assert policy.resume(running, completed(number=2), max_retries=1) == policy.Resume(record=True)
    for written in (None, TrialOutcome(number=2, status="failed", reason="interrupted")):
        decision = policy.resume(running, written, max_retries=1)
        assert not decision.record and decision.failure is not None
        assert decision.failure.reason == "interrupted"
        assert decision.retry is not None and decision.retry.attrs["retry_of"] == 2
    # A trial that failed for a reason of its own before the stop is recorded as such.
    crashed = policy.resume(running, TrialOutcome(number=2, status="failed", reason="server_died"), 1)
    assert crashed.record
    # A duplicate left RUNNING never ran a server: failed, not retried.
    dup = policy.resume(record(3, BASE, state="RUNNING", kind="duplicate"), None, max_retries=1)
    assert not dup.record and dup.retry is None


def test_full_trial_seconds_leave_out_stopped_and_failed_trials() -> None:
    trials = [record(0, BASE, told=(1.0, 1.0), outcome={"trial_s": 600.0}),
              record(1, OTHER, told=(1.0, 1.0), outcome={"trial_s": 90.0, "early_stop": {"reason": "dominated"}}),
              record(2, OTHER, state="FAIL", outcome={"trial_s": 30.0})]
    assert policy.full_trial_seconds(trials) == [600.0]


def test_the_early_stop_plan_uses_the_measured_feasible_front_and_full_histories() -> None:
    lv = levels()
    trials = [record(0, BASE, told=(900.0, 5.0), constraints={"probe": 0.0}, outcome={"levels": lv}),
              record(1, OTHER, told=(800.0, 6.0), constraints={"probe": 0.0}, outcome={"levels": lv}),
              record(2, OTHER, told=(2000.0, 1.0), constraints={"probe": 1.0}, outcome={"levels": lv}),
              record(3, OTHER, told=(2000.0, 1.0), constraints={"early_stopped": 1.0}, outcome={"levels": lv}),
              record(4, OTHER, told=(2000.0, 1.0), placeholder_values=True)]
    plan = policy.early_stop_plan(SPEC, trials)
    assert plan.front == [[900.0, 5.0]]
    assert len(plan.history) == 3                       # 0, 1 and the infeasible 2
    assert sorted(plan.order[:2]) == [1, 16]            # objective levels first


def test_a_record_reads_the_stored_verdict_and_derives_one_for_older_trials() -> None:
    stored = record(0, BASE, told=(1.0, 1.0), constraints={"probe": 1.0}, verdict="probe_failed")
    assert stored.outcome == "probe_failed"
    older = record(1, BASE, told=(1.0, 1.0), constraints={"probe": 1.0})      # no verdict attribute
    assert older.outcome == "probe_failed"
    assert record(2, BASE, state="RUNNING", verdict="feasible").outcome == "running"
    # load.on_unstable: infeasible - a level that never held steady is a violated constraint.
    assert record(3, BASE, told=(1.0, 1.0), constraints={"unstable": 1.0}).outcome == "unstable"
