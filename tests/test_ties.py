"""Decisions that respect noise (tuner.study.noise, tuner.study.ties), on hand-made numbers:
the noisy front and its ties, picks, pooled repeats, early stop's noisy bounds, and what
status, pareto.json and export show."""

from __future__ import annotations

import pytest

from tuner.study.early_stop import Target, optimistic
from tuner.study.noise import NoisyPoint, label_noise, level_unstable, noisy_front, unmeasured_level
from tuner.study.scoring import pareto_payload
from tuner.study.study_file import parse_study
from tuner.study.ties import candidates, next_runs, pooled, remaining_ties, ties_record
from tuner.study.trials import TrialRecord
from tuner.views.export import noise_notes, render_export
from tuner.views.status import _unstable_text, _value

LABELS = ["output_tok_s@c32", "tpot_ms.mean@c1"]
DIRS = ["maximize", "minimize"]


def test_front_records_ties_inside_the_noise_and_keeps_winners_beyond_it() -> None:
    points = [
        NoisyPoint(4, (8648.0, 12.0), (210.0, 0.3)),
        NoisyPoint(7, (8590.0, 12.1), (190.0, 0.3)),    # within noise of 4 in both: a tie
        NoisyPoint(9, (7000.0, 12.0), (100.0, 0.2)),    # clearly slower, same TPOT: dominated
        NoisyPoint(2, (6000.0, 9.0), (100.0, 0.2)),     # the low-latency end of the front
    ]
    near, ties = noisy_front(points, DIRS, LABELS)
    assert sorted(near) == [2, 4, 7]
    assert [t.trials for t in ties] == [(4, 7)]
    assert ties[0].as_dict()["text"] == (
        "trials 4 and 7 are within noise at output_tok_s@c32, tpot_ms.mean@c1")


def test_a_gap_beyond_noise_is_no_tie() -> None:
    a = NoisyPoint(1, (100.0,), (2.0,))
    b = NoisyPoint(2, (104.0,), (2.0,))     # 4 > sqrt(8) = 2.83: b wins
    near, ties = noisy_front([a, b], ["maximize"], ["x@c1"])
    assert near == [2] and ties == []
    # Without any interval, only equal values tie.
    assert noisy_front([NoisyPoint(1, (100.0,), (None,)), NoisyPoint(2, (100.5,), (None,))],
                       ["maximize"], ["x@c1"]) == ([2], [])


def test_labels_find_their_noise_and_unstable_levels() -> None:
    levels = {"1": {"tpot_ms.mean.ci95": 0.3, "unstable": 0.0},
              "32": {"output_tok_s.ci95": 210.0, "unstable": 1.0}}
    assert label_noise(levels, "output_tok_s@c32") == 210.0
    assert label_noise(levels, "output_tok_s@cmax") == 210.0
    assert label_noise(levels, "tpot_ms.mean@cmin") == 0.3
    assert label_noise(levels, "startup_s") is None
    assert level_unstable(levels) == [32]


def test_a_level_an_early_stop_never_measured_lends_no_value_or_noise() -> None:
    # Stopped inside c=32 (rule 4b, the H200 study's trial 8): only c=1 was measured.
    levels = {"1": {"output_tok_s": 162.0, "output_tok_s.ci95": 78.0, "tpot_ms.mean": 7.552,
                    "tpot_ms.mean.ci95": 2.9}}
    assert unmeasured_level("output_tok_s@cmax", levels, [32]) == 32
    assert unmeasured_level("output_tok_s@c32", levels, [32]) == 32
    assert unmeasured_level("tpot_ms.mean@c1", levels, [32]) is None
    assert unmeasured_level("tpot_ms.mean@cmin", levels, [32]) is None
    assert unmeasured_level("startup_s", levels, [32]) is None
    # Stopped at c=32's last dispatch (rule 4a): c=32's rate is recorded, so it is measured.
    assert unmeasured_level("output_tok_s@cmax", {**levels, "32": {"output_tok_s": 4466.0}}, [32]) is None
    stopped = TrialRecord(8, "COMPLETE", "run", {}, values={"output_tok_s@cmax": 4581.0, "tpot_ms.mean@c1": 7.552},
                          attrs={"outcome": {"levels": levels, "early_stop": {
                              "reason": "dominated_inside", "after": "inside c32",
                              "bounds": [4581.0, 4.663], "skipped_levels": [32]}}})
    labels = ["output_tok_s@cmax", "tpot_ms.mean@c1"]
    assert stopped.bound_labels(labels) == {"output_tok_s@cmax": 32}
    # "@cmax" of the bound is c=32, not c=1, the highest level it reached: c=1's noise (78)
    # must not appear as the bound's interval.
    assert stopped.noise(labels) == {"output_tok_s@cmax": None, "tpot_ms.mean@c1": 2.9}
    from tuner.views.report import _pm
    assert _pm(stopped, "output_tok_s@cmax") == "4581 (bound, c=32 not measured)"
    assert _pm(stopped, "tpot_ms.mean@c1") == "7.552 ± 2.9"
    # A trial that was not stopped has no bounds, whatever its levels.
    done = TrialRecord(9, "COMPLETE", "run", {}, values=dict(stopped.values), attrs={"outcome": {"levels": levels}})
    assert done.bound_labels(labels) == {}


def _record(n: int, tok: float, tok_ci: float, tpot: float, tpot_ci: float,
            unstable: bool = False) -> TrialRecord:
    levels = {"1": {"tpot_ms.mean": tpot, "tpot_ms.mean.ci95": tpot_ci, "tpot_ms.mean.n": 40,
                    "unstable": 0.0},
              "32": {"output_tok_s": tok, "output_tok_s.ci95": tok_ci, "output_tok_s.n": 5,
                     "unstable": 1.0 if unstable else 0.0}}
    return TrialRecord(n, "COMPLETE", "run", {"mode": n},
                       values={LABELS[0]: tok, LABELS[1]: tpot},
                       attrs={"outcome": {"levels": levels}})


def test_pareto_json_status_and_export_carry_intervals_ties_and_the_unstable_flag() -> None:
    records = [_record(4, 8648, 210, 12.0, 0.3, unstable=True), _record(7, 8590, 190, 12.1, 0.3),
               _record(2, 6000, 100, 9.0, 0.2)]
    payload = pareto_payload("s", records, LABELS, DIRS, now=0.0)
    by = {e["trial"]: e for e in payload["front"]}
    assert by[4]["noise"] == {LABELS[0]: 210.0, LABELS[1]: 0.3}
    assert by[4]["samples"] == {LABELS[0]: 5, LABELS[1]: 40}
    assert by[4]["unstable"] and by[4]["unstable_levels"] == [32] and not by[2]["unstable"]
    # 7 is dominated by 4 by less than the noise: off the front, listed as tied with it.
    assert 7 not in by and [w["trial"] for w in payload["within_noise"]] == [7]
    assert by[4]["ties"] == [7] and payload["unstable_on_front"] == [4]
    assert payload["ties"][0]["text"].startswith("trials 4 and 7 are within noise")
    row = {"values": records[0].values, "noise": records[0].noise(LABELS),
           "unstable_levels": records[0].unstable_levels}
    assert _value(row, LABELS[0]) == "output_tok_s@c32=8648±210"
    assert _unstable_text(row) == " UNSTABLE (c=32 never settled)"
    notes = noise_notes(records, LABELS, DIRS, records[0])
    assert notes == ["trials 4 and 7 are within noise at output_tok_s@c32, tpot_ms.mean@c1"]
    spec = parse_study("name: s\nserver: {model: m}\n")
    text = render_export(spec, "s", records[0], "shell", notes)
    assert "output_tok_s@c32 = 8648 ± 210 (95 %)" in text
    assert "UNSTABLE: c=32 never settled; these numbers are not the server's steady figures" in text
    assert "trials 4 and 7 are within noise" in text


def test_early_stop_bounds_move_by_the_trials_own_noise() -> None:
    t = Target("output_tok_s", 4, "maximize")
    measured = {4: {"output_tok_s": 100.0, "output_tok_s.ci95": 8.0}}
    assert optimistic(t, measured, []) == 108.0
    lat = Target("tpot_ms.mean", 16, "minimize")
    assert optimistic(lat, {4: {"tpot_ms.mean": 20.0, "tpot_ms.mean.ci95": 1.5}}, []) == 18.5
    # Extrapolated from a lower level: the noisy value scales.
    up = Target("output_tok_s", 8, "maximize")
    assert optimistic(up, measured, [], max_gap=4) == pytest.approx(216.0)


def test_pooled_repeats_separate_or_stay_tied() -> None:
    # Two candidates overlapping on one run each ...
    a1 = pooled(4, [[8648.0]], [210.0])
    b1 = pooled(7, [[8500.0]], [190.0])
    ties = remaining_ties([a1, b1], ["maximize"], ["x@c32"])
    assert [t.trials for t in ties] == [(4, 7)]
    assert next_runs(ties, {4: 1, 7: 1}, budget=5) == [4, 7]
    assert next_runs(ties, {4: 2, 7: 1}, budget=1) == [7]
    # ... re-runs on fresh servers: 4 stays near 8,650, 7 near 8,490 - separated.
    a = pooled(4, [[8648.0], [8660.0], [8640.0]], [210.0])
    b = pooled(7, [[8500.0], [8480.0], [8490.0]], [190.0])
    assert a.runs == 3 and a.noise[0] is not None and a.noise[0] < 50
    assert remaining_ties([a, b], ["maximize"], ["x@c32"]) == []
    # Same configuration twice (true difference 0): it stays a tie, whatever is spent.
    c = pooled(9, [[8600.0], [8700.0], [8500.0]], [200.0])
    d = pooled(3, [[8650.0], [8550.0], [8620.0]], [200.0])
    assert [t.trials for t in remaining_ties([c, d], ["maximize"], ["x@c32"])] == [(3, 9)]


def test_candidates_pool_each_front_point_with_its_feasible_reruns_and_the_record_says_what_was_separated(
) -> None:
    records = [_record(4, 8648, 210, 12.0, 0.3), _record(7, 8590, 190, 12.1, 0.3),
               _record(9, 7000, 100, 12.0, 0.2)]          # 9: dominated beyond noise, no candidate
    confirmations = {7: {"runs": [{"feasible": True, "values": [8400.0, 12.2]},
                                  {"feasible": False, "values": [9999.0, 1.0]},   # infeasible: left out
                                  {"feasible": True, "values": None}]}}         # no values: left out
    first = candidates(records, {}, DIRS, LABELS)
    assert [(c.number, c.runs) for c in first] == [(4, 1), (7, 1)]
    assert first[0].noise == (210.0, 0.3)                  # one run: the trial's own interval
    ties = remaining_ties(first, DIRS, LABELS)
    assert [t.trials for t in ties] == [(4, 7)]
    now = candidates(records, confirmations, DIRS, LABELS)
    assert [(c.number, c.runs) for c in now] == [(4, 1), (7, 2)]
    assert now[1].values == pytest.approx((8495.0, 12.15))
    assert now[1].noise[0] is not None and now[1].noise[0] > 1000   # two runs 190 apart: t with 1 dof
    record = ties_record(budget=3, spent=1, spent_s=2.5, rounds=[{"trials": [7]}], first=ties,
                         pooled_now=now, directions=DIRS, labels=LABELS)
    assert record["spent_runs"] == 1 and record["budget_runs"] == 3 and record["spent_s"] == 2.5
    # The re-run widened 7's interval: still a tie, nothing separated yet.
    assert [t["trials"] for t in record["remaining_ties"]] == [[4, 7]] and record["separated"] == []
    assert record["ties_at_start"] == [t.as_dict() for t in ties]
    assert record["pooled"]["7"]["runs"] == 2 and record["pooled"]["7"]["values"][LABELS[0]] == 8495.0


def test_on_unstable_infeasible_is_a_constraint_flag_is_not() -> None:
    from tuner.study.outcome import TrialOutcome
    from tuner.study.scoring import constraints

    outcome = TrialOutcome(number=3, status="completed", applied=True, probe_passed=True,
                           levels={"1": {"failed": 0.0, "unstable": 0.0},
                                   "4": {"failed": 0.0, "unstable": 1.0}})
    flag = parse_study("name: s\nserver: {model: m}\n")
    assert "unstable" not in constraints(flag, outcome)
    strict = parse_study("name: s\nserver: {model: m}\nload: {on_unstable: infeasible}\n")
    violated = constraints(strict, outcome)
    assert violated["unstable"] == 1.0
    record = TrialRecord(3, "COMPLETE", "run", {}, values={"x": 1.0}, constraints=violated)
    assert record.outcome == "unstable" and not record.feasible


def test_a_client_bound_level_says_so_rather_than_never_settled() -> None:
    """A level flagged client-bound (the load generator's loop ran late) is unstable, and
    every text names that cause for it and the stability rule for the others."""

    record = _record(4, 8648, 210, 12.0, 0.3, unstable=True)
    levels = record.levels
    levels["1"] = {**levels["1"], "unstable": 1.0, "client_bound": 1.0}
    record = TrialRecord(4, "COMPLETE", "run", {"mode": 4}, values=record.values,
                         attrs={"outcome": {"levels": levels}})
    assert record.unstable_levels == [1, 32] and record.client_bound_levels == [1]
    row = {"unstable_levels": record.unstable_levels,
           "client_bound_levels": record.client_bound_levels}
    assert _unstable_text(row) == (" UNSTABLE (c=1 client-bound (the load generator's loop ran "
                                   "late), c=32 never settled)")
    spec = parse_study("name: s\nserver: {model: m}\n")
    assert "c=1 client-bound" in render_export(spec, "s", record, "shell", [])


def test_noisy_front_checks_strong_points_first_with_the_same_answer() -> None:
    """The front is taken with likely dominators tried first; it must equal the plain
    all-pairs definition on random studies (ties, unknown noise, equal values included)."""

    import random

    from tuner.study.noise import _dominates, _dominates_beyond

    directions = ("maximize", "minimize")
    for seed in range(40):
        rng = random.Random(seed)
        points = [NoisyPoint(n, (float(rng.randint(50, 60)), float(rng.randint(1, 8))),
                             (rng.choice([None, 0.0, 1.0, 3.0]), rng.choice([None, 0.5, 2.0])))
                  for n in range(rng.randint(1, 60))]
        front = [p for p in points if not any(_dominates_beyond(q, p, directions) for q in points if q is not p)]
        strict = {p.number for p in front if not any(_dominates(q, p, directions) for q in points if q is not p)}
        got, ties = noisy_front(points, directions, ("tok/s", "tpot"))
        assert got == [p.number for p in front], seed
        assert {n for t in ties for n in t.trials} <= {p.number for p in front}
        assert strict <= set(got)
