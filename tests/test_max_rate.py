"""max_rate@slo end to end without a server: the search loop over measured levels
(tuner.load.max_rate), early stop during the search (SweepGuard.during_search), and what
the study is told (scoring: the value, slo_unmet, a stopped search's bound)."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest

from tests.test_slo import rec, study
from tuner.load.goodput import level_slo
from tuner.load.max_rate import search_max_rate
from tuner.load.metrics import compute_level_metrics
from tuner.load.rate_search import RateSearchSpec
from tuner.load.results import LevelResult, TokenAgreement, WarmupSummary
from tuner.load.slo import SloSpec
from tuner.study.early_stop import TRIAL_LEVEL, Target
from tuner.study.outcome import TrialOutcome, TrialRequest
from tuner.study.policy import told_for
from tuner.study.scoring import constraints, metric_value, stopped_told
from tuner.study.study_file import parse_study
from tuner.study.sweep_guard import MAX_RATE, SweepGuard, sweep_plan

SLO = SloSpec.model_validate({"ttft_ms.p90": 1000})


def level_at(rate: float, margin: float, n: int = 20) -> LevelResult:
    """A rate level whose every request has TTFT = margin x the bound."""
    records = [rec(i, margin, margin + 1.0, 11, dispatch=i / rate) for i in range(n)]
    metrics = compute_level_metrics(records, concurrency=64, first_wave=1)
    metrics = metrics.model_copy(update={"request_rate": rate,
                                         "slo": level_slo(records, metrics, SLO)})
    return LevelResult(concurrency=64, request_rate=rate, prompts_fitted=True, deadline_hit=False,
                       warmup=WarmupSummary(requests=0, completed=0, failed=0, failure_reasons={},
                                            duration_s=0.0),
                       metrics=metrics, server_side=None,
                       token_agreement=TokenAgreement(client_output_tokens=0,
                                                      server_generation_tokens=None,
                                                      relative_diff=None, agree=None),
                       records=records)


def curve(rate: float) -> float:
    return rate / 3.0            # the SLO holds up to 3 req/s


def test_search_measures_what_it_decides_and_keeps_every_level() -> None:
    asked: list[float] = []

    async def measure(rate: float, part: int) -> LevelResult:
        if part == 0:
            asked.append(rate)
        return level_at(rate, curve(rate))

    result, levels = asyncio.run(search_max_rate(measure, RateSearchSpec(low=0.1, high=50),
                                                 hint=8.0))
    assert asked[0] == 8.0 and [lv.request_rate for lv in levels] == asked
    assert result.status == "found" and result.levels == len(asked) <= 7
    assert 3.0 / 1.05 <= result.max_rate <= 3.0 < result.bracket[1]


def test_configured_levels_are_reused_not_measured_again() -> None:
    asked: list[float] = []

    async def measure(rate: float, part: int) -> LevelResult:
        asked.append(rate)
        return level_at(rate, curve(rate))

    known = [level_at(2.0, curve(2.0)), level_at(4.0, curve(4.0))]
    result, _ = asyncio.run(search_max_rate(measure, RateSearchSpec(low=0.1, high=50), hint=8.0,
                                            known=known))
    assert 8.0 not in asked and all(2.0 < r < 4.0 for r in asked)
    assert [p["reused"] for p in result.probes[:2]] == [True, True]


def test_a_level_within_noise_is_extended_by_parts_then_judged() -> None:
    calls: list[tuple[float, int]] = []

    def noisy_level(rate: float, parts: int) -> LevelResult:
        # TTFTs spread evenly over 0.85-1.05 x the bound: the p90 (~1.02) misses, but from
        # 20 requests its 95 % interval reaches below the bound; pooled parts narrow it.
        n = 20 * parts
        lv = level_at(rate, 1.0)
        records = [rec(i, 0.85 + 0.2 * ((i * 7) % n) / n, 2.0, 11, dispatch=i / rate)
                   for i in range(n)]
        metrics = lv.metrics.model_copy(update={"slo": level_slo(records, lv.metrics, SLO)})
        return lv.model_copy(update={"metrics": metrics, "records": records})

    async def measure(rate: float, part: int) -> LevelResult:
        calls.append((rate, part))
        return noisy_level(rate, part + 1)

    assert noisy_level(3.0, 1).metrics.slo.within_noise
    spec = RateSearchSpec(low=0.1, high=50, start=3.0, max_parts=3, max_levels=2)
    result, levels = asyncio.run(search_max_rate(measure, spec, hint=None))
    at_start = [c for c in calls if c[0] == 3.0]
    assert at_start[:2] == [(3.0, 0), (3.0, 1)]            # extended at least once
    first = result.probes[0]
    assert first["parts"] == len(at_start) and first["met"] is False
    assert first["parts"] == 3 or not first["within_noise"]  # decided, or out of parts
    assert result.levels == 2                              # parts are not levels


def test_budget_ends_the_search_with_what_it_has() -> None:
    async def measure(rate: float, part: int) -> LevelResult | None:
        return None if rate < 8.0 else level_at(rate, curve(rate))

    result, levels = asyncio.run(search_max_rate(measure, RateSearchSpec(low=0.1, high=50), hint=8.0))
    assert result.status == "budget" and len(levels) == 1 and result.max_rate is None


def test_stop_is_asked_with_the_bound_and_the_levels() -> None:
    seen: list[tuple[float, int]] = []

    async def measure(rate: float, part: int) -> LevelResult:
        return level_at(rate, curve(rate))

    def stop(bound: float, levels: list[LevelResult]) -> bool:
        seen.append((bound, len(levels)))
        return bound < 5.0          # a front point with 5 req/s dominates once we miss below 5

    result, levels = asyncio.run(search_max_rate(measure, RateSearchSpec(low=0.1, high=50),
                                                 stop=stop, hint=2.0))
    assert seen[0] == (50, 1)                       # 2.0 met: nothing above it missed yet
    first_miss = next(p["rate"] for p in result.probes if not p["met"])
    assert seen[-1] == (first_miss, len(levels)) and first_miss < 5.0
    assert result.status == "stopped" and result.max_rate == 2.0


# ---------------------------------------------------------------- early stop and scoring


def guard(front: list[list[float]], limits: list[dict] | None = None) -> SweepGuard:
    targets = [Target(MAX_RATE, TRIAL_LEVEL, "maximize"), Target("output_tok_s", 16, "maximize")]
    return SweepGuard(sweep_plan(targets, limits or [], [1, 16], front, []))


def test_during_search_stops_a_trial_whose_best_rate_cannot_reach_the_front() -> None:
    g = guard([[6.0, 900.0]])
    levels = {1: {"output_tok_s": 100.0}, 16: {"output_tok_s": 800.0}}
    assert not g.during_search(levels, 50.0)            # could still reach 50 req/s
    assert not g.stopped
    assert g.during_search(levels, 5.0)                 # missed at 5: at best 5 < 6, 800 < 900
    assert g.record["reason"] == "dominated" and g.record["bounds"] == [5.0, 800.0]
    assert g.record["max_rate_bound"] == 5.0 and "max_rate@slo search" in g.record["after"]


def test_during_search_a_min_limit_below_reach_is_infeasible() -> None:
    g = guard([], [{"label": "max_rate@slo>=2.0", "metric": MAX_RATE, "level": TRIAL_LEVEL,
                    "max": None, "min": 2.0}])
    levels = {16: {"output_tok_s": 800.0}}
    assert not g.during_search(levels, 4.0)
    assert g.during_search(levels, 1.5)
    assert g.record["reason"] == "limit:max_rate@slo>=2.0"


def test_rate_level_targets_are_exact_once_measured_and_unbounded_before() -> None:
    targets = [Target("ttft_ms.p90", "r2.0", "minimize")]
    g = SweepGuard(sweep_plan(targets, [], [1, 16], [[100.0]], []))
    assert g.targets[0].level == "r2.0"
    assert not g.during_search({16: {}}, 9.0)             # r2.0 not measured: no bound
    assert g.during_search({16: {}, "r2.0": {"ttft_ms.p90": 250.0}}, 9.0)


SLO_STUDY = study("slo: {ttft_ms.p90: 1000}",
                  "objectives:\n  - {metric: max_rate@slo, direction: maximize}\n"
                  "  - {metric: goodput_tok_s, concurrency: 16, direction: maximize}\n"
                  "  - {metric: ttft_ms.p90, rate: 2.0, direction: minimize}\n",
                  "  request_rates: [2.0]\n")


def outcome(max_rate: dict | None) -> TrialOutcome:
    return TrialOutcome(number=3, status="completed", applied=True, probe_passed=True,
                        levels={"1": {"goodput_tok_s": 10.0, "failed": 0.0},
                                "16": {"goodput_tok_s": 120.0, "failed": 0.0}},
                        rate_levels={"r2.0": {"ttft_ms.p90": 300.0}}, max_rate=max_rate)


def test_scoring_reads_max_rate_goodput_and_rate_levels() -> None:
    spec = parse_study(SLO_STUDY)
    o = outcome({"max_rate": 3.2, "status": "found"})
    assert [metric_value(spec, o, item) for item in spec.objectives] == [3.2, 120.0, 300.0]
    assert constraints(spec, o)["slo_unmet"] == 0.0
    told = told_for(spec, o, lambda: None)
    assert told.how == "measured" and told.values == [3.2, 120.0, 300.0]


def test_slo_unmet_is_an_infeasible_trial_told_with_rate_zero() -> None:
    spec = parse_study(SLO_STUDY)
    o = outcome({"max_rate": 0.0, "status": "slo_unmet"})
    told = told_for(spec, o, lambda: None)
    assert told.values[0] == 0.0 and told.constraints["slo_unmet"] == 1.0


def test_a_stopped_search_is_told_its_bound() -> None:
    spec = parse_study(SLO_STUDY)
    o = outcome({"max_rate": 2.5, "status": "stopped"})
    o.early_stop = {"reason": "dominated", "after": "max_rate@slo search", "bounds": [2.8, 120.0, 300.0]}
    assert metric_value(spec, o, spec.objectives[0]) is None
    values, violated, placeholder = stopped_told(spec, o, None)
    assert values == [2.8, 120.0, 300.0] and violated["early_stopped"] == 1.0 and not placeholder


def test_goodput_is_bounded_by_the_throughput_it_is_part_of() -> None:
    from tuner.study.early_stop import optimistic
    t = Target("goodput_tok_s", 16, "maximize")
    measured = {4: {"output_tok_s": 100.0, "goodput_tok_s": 80.0}}
    # output tok/s at 16 is at most 4x that at 4 (the physical bound): so is goodput.
    assert optimistic(t, measured, []) == pytest.approx(400.0)
    assert optimistic(Target("slo_attained", 16, "maximize"), measured, []) == 1.0
    assert math.isinf(optimistic(Target("goodput_tok_s", "r2.0", "maximize"), measured, []))


def test_a_trial_whose_max_rate_cannot_reach_the_front_stops_its_search(tmp_path: Path) -> None:
    # A real trial (TrialWorker against the simulator): the front holds a point with 1000
    # req/s within the SLO, beyond this search's highest rate (20), so after its first rate
    # level the trial is dominated whatever it finds; it stops there, recorded, and is told
    # with its bound (never on the front).
    from tests.conftest import write_study
    from tests.test_search_early_stop_worker import _run
    from tuner.commands.run import load_spec_file
    from tuner.study.policy import early_stop_plan
    from tuner.study.space import trial_command

    study, _ = write_study(tmp_path, env={"TUNER_SIM_STARTUP_SCALE": 0.002}, updates={
        "slo": {"ttft_ms.p90": 300, "tpot_ms.p90": 10},
        "objectives": [{"metric": "max_rate@slo", "direction": "maximize"},
                       {"metric": "tpot_ms.mean", "concurrency": 1, "direction": "minimize"}],
        "load.rate_duration_s": 4, "load.rate_search": {"low": 0.5, "high": 20, "max_levels": 5},
        "server.startup_timeout": "120s", "budget.trial_timeout": "5m"})
    spec = load_spec_file(str(study))
    values = {"enforce_eager": True, "nccl_proto": None, "spec_method": None}
    command = trial_command(spec, values, port=spec.server.port)
    plan = early_stop_plan(spec, []).model_copy(update={"front": [[1000.0, 1e-3]]})
    request = TrialRequest(
        study=study.stem, number=0, values=values, asked=command.asked, argv=command.argv,
        env=command.launch_env, host=spec.server.host, port=spec.server.port,
        served_model_name=spec.server.served_model_name, trial_dir=str(tmp_path / "trial"),
        startup_timeout_s=120, stop_timeout_s=10, deadline_s=300, load=spec.load,
        probe=spec.probe, ignore_eos=True, early_stop=plan, slo=spec.slo,
        search_max_rate=spec.searches_max_rate)
    out = _run(request.model_dump(mode="json"))
    assert out.status == "completed" and out.probe_passed is True
    assert out.early_stop is not None and out.early_stop["reason"] == "dominated"
    assert "max_rate@slo search" in out.early_stop["after"]
    assert out.max_rate is not None and out.max_rate["status"] == "stopped"
    assert out.max_rate["levels"] == 1
    bound = out.early_stop["max_rate_bound"]
    assert bound == pytest.approx(min(out.max_rate["probes"][0]["rate"] if not
                                      out.max_rate["probes"][0]["met"] else 20.0, 20.0) * 1.05)
    values_told, violated, _ = stopped_told(spec, out, None)
    assert values_told[0] == pytest.approx(bound) and violated["early_stopped"] == 1.0
