"""Confirmation re-runs, the pure part: which front points are re-run first, and the verdict
from hand-computed re-run values."""

from __future__ import annotations

import pytest

from tuner.errors import SpecError
from tuner.study.confirmation import RunResult, choose_candidates, confirmable, judge
from tuner.study.confirmation_text import blocks_export, confirmation_brief, summary_text
from tuner.study.pareto import Point
from tuner.study.study_file import parse_study
from tuner.study.trials import TrialRecord
from tuner.views.export import ExportError, choose_record

LABELS = ["output_tok_s@c16", "tpot_ms.mean@c1"]
DIRS = ["maximize", "minimize"]


def _run(folder: str, tok: float, tpot: float) -> RunResult:
    return RunResult(folder=folder, values=[tok, tpot], feasible=True, outcome="feasible")


def test_candidates_best_of_each_objective_then_knee_then_outwards() -> None:
    # Front (by throughput, best first): 5 (100, 40), 3 (90, 30), 7 (80, 22), 2 (60, 20), 9 (50, 19.5)
    # plus a dominated point (4) and an infeasible one (8) that must never be chosen.
    points = [Point(5, (100, 40)), Point(3, (90, 30)), Point(7, (80, 22)), Point(2, (60, 20)),
              Point(9, (50, 19.5)), Point(4, (70, 35)), Point(8, (200, 10), feasible=False)]
    # Scaled to [0, 1] (signed, smaller is better): 5 (0, 1), 3 (0.2, 0.488), 7 (0.4, 0.123),
    # 2 (0.8, 0.024), 9 (1, 0): distances 1, 0.53, 0.42, 0.80, 1 -> the knee is 7. Its
    # neighbours on the front, 3 and 2, are equally far from it: the lower number first.
    assert choose_candidates(points, DIRS, 10) == [5, 9, 7, 2, 3]
    assert choose_candidates(points, DIRS, 3) == [5, 9, 7]
    assert choose_candidates(points, DIRS, 1) == [5]
    assert choose_candidates(points, DIRS, 0) == []
    assert choose_candidates([Point(8, (1, 1), feasible=False)], DIRS, 3) == []


def test_reproduced_only_within_tolerance_either_way() -> None:
    # Throughput 100 -> median(97, 99, 104) = 99: -1 %; TPOT 20 -> median(21, 20.5, 19) = 20.5: +2.5 %.
    v = judge(4, LABELS, DIRS, [100.0, 20.0], [_run("0004-1", 97, 21), _run("0004-2", 99, 20.5),
                                               _run("0004-3", 104, 19)], tolerance=0.1, repeats=3)
    assert v.verdict == "reproduced"
    tok, tpot = v.objectives
    assert tok.median == 99 and tok.change == pytest.approx(-0.01) and tok.worse_by == pytest.approx(0.01)
    assert tok.spread == pytest.approx((104 - 97) / 99)
    assert tpot.median == 20.5 and tpot.change == pytest.approx(0.025) and tpot.worse_by == pytest.approx(0.025)
    # Better than measured by more than the tolerance is as untrustworthy as worse: the H200
    # winner that re-ran +23.8 % (8,648 -> 10,705 tok/s) is not reproducible, both numbers shown.
    better = judge(4, LABELS, DIRS, [8648.0, 20.0], [_run("0004-1", 10705, 20)], tolerance=0.1,
                   repeats=1)
    assert better.verdict == "not_reproducible"
    assert "output_tok_s@c16 8648 -> 1.07e+04 (+23.8%, better by more than 10%)" in better.reason
    assert better.objectives[0].worse_by == 0 and better.objectives[0].spread is None
    assert "did not reproduce" in blocks_export(better.model_dump(mode="json"))


def test_not_reproducible_names_each_objective_beyond_tolerance() -> None:
    # Throughput 100 -> 85 (-15 %, worse by 15 % > 10 %); TPOT 20 -> 21.8 (+9 %, within).
    v = judge(6, LABELS, DIRS, [100.0, 20.0], [_run("0006-1", 85, 21.8)], tolerance=0.1, repeats=1)
    assert v.verdict == "not_reproducible"
    assert "output_tok_s@c16 100 -> 85 (-15.0%, worse" in v.reason and "tpot" not in v.reason
    # Latency worse: 20 -> 23 ms is +15 % in the minimised objective.
    v = judge(6, LABELS, DIRS, [100.0, 20.0], [_run("0006-1", 100, 23)], tolerance=0.1, repeats=1)
    assert v.verdict == "not_reproducible" and "tpot_ms.mean@c1 20 -> 23 (+15.0%, worse" in v.reason
    # Latency better by 15 %: not reproducible either.
    v = judge(6, LABELS, DIRS, [100.0, 20.0], [_run("0006-1", 100, 17)], tolerance=0.1, repeats=1)
    assert v.verdict == "not_reproducible" and "(-15.0%, better" in v.reason
    # Exactly at the tolerance still reproduces (beyond means strictly more).
    v = judge(6, LABELS, DIRS, [100.0, 20.0], [_run("0006-1", 90, 20)], tolerance=0.1, repeats=1)
    assert v.verdict == "reproduced" and v.objectives[0].worse_by == pytest.approx(0.1)


def test_a_rerun_that_is_infeasible_fails_the_point() -> None:
    bad = RunResult(folder="0002-2", values=[120, 15], feasible=False, outcome="probe_failed",
                    message="known answers 3/10")
    v = judge(2, LABELS, DIRS, [100.0, 20.0], [_run("0002-1", 100, 20), bad], tolerance=0.1, repeats=2)
    assert v.verdict == "failed"
    assert "0002-2: probe_failed (known answers 3/10)" in v.reason
    # Medians come from the feasible re-runs only.
    assert v.objectives[0].reruns == [100]
    assert judge(2, LABELS, DIRS, [100.0, 20.0], [], tolerance=0.1, repeats=1).verdict == "failed"


def test_only_a_completed_run_with_every_objective_measured_can_be_confirmed() -> None:
    levels = {"1": {"tpot_ms.mean": 20.0}, "16": {"output_tok_s": 100.0}}
    measured = TrialRecord(3, "COMPLETE", "run", {}, values={LABELS[0]: 100.0, LABELS[1]: 20.0},
                           attrs={"outcome": {"levels": levels}})
    assert confirmable(measured)
    assert not confirmable(None)
    assert not confirmable(TrialRecord(4, "FAIL", "run", {}))
    # Told the worst values seen (a level never measured): numbers for the sampler, not a result.
    told_worst = TrialRecord(5, "COMPLETE", "run", {}, values={LABELS[0]: 100.0, LABELS[1]: 20.0},
                             attrs={"outcome": {"levels": {"1": {"tpot_ms.mean": 20.0}}},
                                    "placeholder_values": True})
    assert not confirmable(told_worst)
    assert not confirmable(TrialRecord(6, "COMPLETE", "duplicate", {}, values=dict(measured.values)))


def test_texts_and_export_block_from_the_json_form() -> None:
    ok = judge(4, LABELS, DIRS, [100.0, 20.0], [_run("0004-1", 98, 20.4)], tolerance=0.1, repeats=1)
    data = ok.model_dump(mode="json")
    assert summary_text(data) == ("reproduced (1 re-run): output_tok_s@c16 100 -> 98 (-2.0%), "
                                  "tpot_ms.mean@c1 20 -> 20.4 (+2.0%)")
    assert blocks_export(data) is None and blocks_export(None) is None
    brief = confirmation_brief(data)
    assert brief["verdict"] == "reproduced" and brief["change"]["output_tok_s@c16"] == pytest.approx(-0.02)
    bad = judge(4, LABELS, DIRS, [100.0, 20.0], [_run("0004-1", 50, 20)], tolerance=0.1, repeats=1)
    assert "did not reproduce" in blocks_export(bad.model_dump(mode="json"))
    # Verdicts stored before the rename read as today's words.
    legacy = {**data, "verdict": "not_confirmed"}
    assert blocks_export(legacy) and summary_text(legacy).startswith("not reproducible")
    assert confirmation_brief({**data, "verdict": "confirmed"})["verdict"] == "reproduced"


def _record(number: int, tok: float, tpot: float) -> TrialRecord:
    return TrialRecord(number, "COMPLETE", "run", {"x": number},
                       values={LABELS[0]: tok, LABELS[1]: tpot})


def test_export_leaves_unconfirmed_points_out_unless_forced() -> None:
    records = [_record(1, 100, 30), _record(2, 80, 20)]
    failed = judge(1, LABELS, DIRS, [100.0, 30.0], [_run("0001-1", 60, 30)], tolerance=0.1,
                   repeats=1).model_dump(mode="json")
    confirmations = {1: failed}
    pick = choose_record(records, LABELS, DIRS, trial=None, pick="best-throughput", filters=[],
                         force=False, confirmations=confirmations)
    assert pick.number == 2
    assert choose_record(records, LABELS, DIRS, trial=None, pick="best-throughput", filters=[],
                         force=True, confirmations=confirmations).number == 1
    with pytest.raises(ExportError, match="trial 1 did not reproduce.*--force"):
        choose_record(records, LABELS, DIRS, trial=1, pick=None, filters=[], force=False,
                      confirmations=confirmations)
    assert choose_record(records, LABELS, DIRS, trial=1, pick=None, filters=[], force=True,
                         confirmations=confirmations).number == 1


STUDY = """
name: c
server: {model: m}
parameters:
  - {name: eager, flag: enforce_eager, kind: bool}
confirm: %s
"""


@pytest.mark.parametrize("section, field, shown", [
    ("{candidates: -1}", "confirm.candidates", "-1"),
    ("{candidates: 2, repeats: 9}", "confirm.repeats", "9"),
    ("{tolerance: 1.5}", "confirm.tolerance", "1.5"),
    ("{candidate: 2}", "confirm: unknown key", "allowed: candidates, min_change, repeats, tie_runs, tolerance"),
])
def test_confirm_section_is_validated(section: str, field: str, shown: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_study(STUDY % section, "study.yaml")
    assert field in str(err.value) and shown in str(err.value)


def test_confirm_defaults_are_off() -> None:
    spec = parse_study(STUDY % "{}", "study.yaml")
    # No tolerance set: each objective's comes from the study's measured noise.
    assert (spec.confirm.candidates, spec.confirm.repeats, spec.confirm.tolerance) == (0, 1, None)


def test_reserve_is_rounds_of_parallel_reruns_at_the_median_full_trial() -> None:
    from tuner.study.confirmation import reserve_seconds

    # Median of 100, 300, 120 is 120; 2 candidates x 2 repeats on 3 groups = 2 rounds, after
    # one trial's time for the trials still running when new ones stop.
    assert reserve_seconds([100, 300, 120], candidates=2, repeats=2, groups=3) == 360
    assert reserve_seconds([100, 300, 120], candidates=2, repeats=2, groups=4) == 240
    assert reserve_seconds([100, 300, 120], candidates=0, repeats=2, groups=1) == 0
    assert reserve_seconds([], candidates=2, repeats=1, groups=1) == 0
