"""A person sees only what was measured (issue 39, item 9).

A trial stopped before its load (not applied) or before a level (dominated) is told bounds or
the worst values seen, because the optimizer needs a number for every point. Those numbers
were shown as the trial's own in `status --json`, the report's trial table and ties. Here
every view is checked against the committed CPU example, whose trial 1 was not applied
(told the baseline's values) and whose trial 5 stopped after c=1 (told a bound for c=4).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_tuner
from tuner.study.outcome_summary import OutcomeSummary
from tuner.study.trials import KIND_DUPLICATE, KIND_RUN, TrialRecord, label_measured, noisy_points

EXAMPLE = ROOT / "results" / "examples" / "smollm2-cpu"
LABELS = ["output_tok_s@cmax", "tpot_ms.mean@c1"]


def _record(number: int, values: dict[str, float], *, outcome: dict | None = None, kind: str = KIND_RUN,
            constraints: dict[str, float] | None = None, **attrs: object) -> TrialRecord:
    return TrialRecord(number, "COMPLETE", kind, {"k": number}, values,
                       constraints or {"probe": 0.0}, {"outcome": outcome or {}, **attrs})


def test_a_label_is_measured_only_where_its_level_holds_the_metric() -> None:
    outcome = OutcomeSummary.from_attr(
        {"levels": {"1": {"tpot_ms.mean": 2.0}, "4": {"output_tok_s": 50.0}},
         "rate_levels": {"r2.0": {"goodput_req_s": 1.9}}, "startup_s": 30.0,
         "max_rate": {"status": "stopped", "max_rate": None}})
    assert label_measured("tpot_ms.mean@c1", outcome)
    assert label_measured("output_tok_s@cmax", outcome)       # the highest level run: 4
    assert not label_measured("output_tok_s@cmin", outcome)   # c=1 has no output_tok_s
    assert not label_measured("output_tok_s@c16", outcome)
    assert label_measured("goodput_req_s@r2.0", outcome)
    assert not label_measured("goodput_req_s@r4.0", outcome)
    assert label_measured("startup_s", outcome) and not label_measured("probe_s", outcome)
    assert not label_measured("max_rate@slo", outcome)        # its search was stopped
    found = OutcomeSummary.from_attr({"max_rate": {"status": "found", "max_rate": 2.5}})
    assert label_measured("max_rate@slo", found)
    not_finite = OutcomeSummary.from_attr({"levels": {"1": {"tpot_ms.mean": float("nan")}}})
    assert not label_measured("tpot_ms.mean@c1", not_finite)


def test_measured_values_drop_bounds_placeholders_and_other_kinds() -> None:
    full = _record(0, {LABELS[0]: 100.0, LABELS[1]: 5.0},
                   outcome={"levels": {"1": {"tpot_ms.mean": 5.0}, "4": {"output_tok_s": 100.0}}})
    assert full.measured_values() == full.values
    not_applied = _record(1, dict(full.values), placeholder_values=True, outcome={
        "early_stop": {"reason": "not_applied", "after": "verify", "bounds": None, "skipped_levels": [1, 4]}})
    assert not_applied.measured_values() == {}
    stopped = _record(2, {LABELS[0]: 90.0, LABELS[1]: 6.0}, outcome={
        "levels": {"1": {"tpot_ms.mean": 6.0, "output_tok_s": 20.0}},
        "early_stop": {"reason": "dominated", "after": "c1", "bounds": [90.0, 6.0], "skipped_levels": [4]}})
    # @cmax would resolve to c=1 among the levels measured: the bound rule keeps it out.
    assert stopped.measured_values() == {LABELS[1]: 6.0}
    duplicate = _record(3, dict(full.values), kind=KIND_DUPLICATE, outcome=full.attrs["outcome"])
    assert duplicate.measured_values() == {}
    failed = TrialRecord(4, "FAIL", KIND_RUN, {}, {}, {}, {})
    assert failed.measured_values() == {}


def test_a_trial_that_failed_its_probe_is_never_a_tie() -> None:
    """Ties name alternatives to pick; a point within noise of the front that failed its
    probe (or was stopped early) is no alternative, however close its numbers."""

    levels = {"1": {"tpot_ms.mean": 5.0, "tpot_ms.mean.ci95": 1.0},
              "4": {"output_tok_s": 100.0, "output_tok_s.ci95": 10.0}}
    front = _record(0, {LABELS[0]: 100.0, LABELS[1]: 5.0}, outcome={"levels": levels})
    broken = _record(1, {LABELS[0]: 101.0, LABELS[1]: 5.1}, outcome={"levels": levels},
                     constraints={"probe": 1.0})
    assert [p.number for p in noisy_points([front, broken], LABELS)] == [0]


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("results")
    shutil.copytree(EXAMPLE, root / EXAMPLE.name)
    return root


def test_status_shows_no_number_a_trial_did_not_measure(example: Path) -> None:
    out = run_tuner("status", EXAMPLE.name, "--results", str(example), "--json", timeout=120)
    assert out.returncode == 0, out.stderr
    rows = {row["trial"]: row for row in json.loads(out.stdout)["trials"]}
    assert rows[1]["outcome"] == "not_applied" and rows[1]["values"] == {} and rows[1]["noise"] == {}
    assert rows[5]["outcome"] == "stopped_early"
    assert rows[5]["values"] == {LABELS[1]: pytest.approx(45.68217932187432)}
    assert rows[5]["bound_labels"] == {LABELS[0]: 4}
    assert set(rows[0]["values"]) == set(LABELS)


def test_report_table_says_not_measured(example: Path) -> None:
    out = run_tuner("report", EXAMPLE.name, "--results", str(example), timeout=300)
    assert out.returncode == 0, out.stderr
    page = (example / EXAMPLE.name / "report" / "report.html").read_text()
    row = re.search(r'<tr class="not_applied"><td>1</td>.*?</tr>', page)
    assert row is not None, "trial 1's row is missing from the report"
    assert row.group(0).count("not measured") == 2 and "49.95" not in row.group(0)
    stopped = re.search(r'<tr class="stopped_early"><td>5</td>.*?</tr>', page)
    assert stopped is not None and "(bound, c=4 not measured)" in stopped.group(0)
