"""`tuner status` per trial: the probe's share of the trial and the server-side acceptance
of speculative decoding, in --json (the row) and in the verbose text (from the same row)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tuner.adapters.artifacts import StudyPaths
from tuner.study.trials import TrialRecord
from tuner.views.status import _trial_row, format_status

NO_SPEC = {"spec_drafts": None, "spec_draft_tokens": None, "spec_accepted_tokens": None,
           "spec_acceptance_rate": None, "spec_mean_acceptance_length": None,
           "spec_acceptance_rate_per_position": None}


def _record(number: int, outcome: dict[str, Any]) -> TrialRecord:
    return TrialRecord(number=number, state="COMPLETE", kind="run", params={"spec_method": "ngram"},
                       values={"output_tok_s@cmax": 40.0}, attrs={"outcome": outcome})


def _status(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"study": "s", "running_now": False, "target_trials": 5, "finished_trials": len(rows),
            "outcomes": {"feasible": len(rows)}, "failures": {}, "running": [],
            "skipped": {"duplicate": 0, "forbidden": 0}, "elapsed_s": 60.0, "time_left_s": None,
            "objectives": [{"label": "output_tok_s@cmax", "direction": "maximize"}], "baseline": None,
            "front": [], "trials": rows}


def _verification(paths: StudyPaths, number: int, method: str) -> None:
    folder = paths.trial_dir(number)
    folder.mkdir(parents=True)
    (folder / "verification.json").write_text(json.dumps({"checks": [
        {"target": "speculative_config.method", "asked": method, "got": method, "status": "applied"}]}))


def test_probe_cost_per_trial(tmp_path: Path) -> None:
    paths = StudyPaths(tmp_path / "s")
    full = _trial_row(_record(0, {"probe_s": 11.8, "trial_s": 67.0}), paths)
    assert full["probe_s"] == 11.8 and full["trial_s"] == 67.0
    assert abs(full["probe_share"] - 11.8 / 67.0) < 1e-12
    no_total = _trial_row(_record(1, {"probe_s": 3.24, "trial_s": None}), paths)
    assert no_total["probe_share"] is None
    no_probe = _trial_row(_record(2, {"probe_s": None, "trial_s": 50.0}), paths)
    assert no_probe["probe_share"] is None
    text = format_status(_status([full, no_total, no_probe])).splitlines()
    assert "        probe 11.8s (18% of 67s)" in text
    assert "        probe 3.2s" in text
    # Trial 2 measured no probe: no probe line under it.
    assert text[-1].strip().startswith("2 feasible")
    assert format_status(_status([full]), verbose=False).count("probe") == 0


def test_speculative_acceptance_per_level(tmp_path: Path) -> None:
    paths = StudyPaths(tmp_path / "s")
    _verification(paths, 3, "ngram")
    server_side = {   # as stored: level keys are strings, and "16" sorts before "4" as text
        "16": {**NO_SPEC, "spec_drafts": 90.0, "spec_acceptance_rate": 0.5, "spec_mean_acceptance_length": 2.0},
        "4": {**NO_SPEC, "spec_drafts": 54.0, "spec_acceptance_rate": 0.71, "spec_mean_acceptance_length": 2.6},
        "1": {**NO_SPEC, "spec_drafts": 32.0, "spec_acceptance_rate": 0.78, "spec_mean_acceptance_length": 2.9},
        "64": dict(NO_SPEC),     # a level without counters is left out
    }
    row = _trial_row(_record(3, {"probe_s": 11.8, "trial_s": 67.0, "server_side": server_side}), paths)
    assert row["spec_method"] == "ngram"
    assert list(row["speculation"]) == ["1", "4", "16"]
    assert row["speculation"]["4"] == {"spec_acceptance_rate": 0.71, "spec_mean_acceptance_length": 2.6,
                                       "spec_drafts": 54.0}
    json.dumps(row)     # --json prints the same row
    text = format_status(_status([row])).splitlines()
    assert text[-2:] == ["        probe 11.8s (18% of 67s)",
                         "        n-gram acceptance: c=1 78% (mean length 2.9), c=4 71% (2.6), c=16 50% (2.0)"]


def test_no_speculation_no_line(tmp_path: Path) -> None:
    paths = StudyPaths(tmp_path / "s")
    row = _trial_row(_record(0, {"server_side": {"1": dict(NO_SPEC), "4": dict(NO_SPEC)}}), paths)
    assert row["speculation"] is None and row["spec_method"] is None
    assert "acceptance" not in format_status(_status([row]))


def test_acceptance_without_a_known_method_or_length(tmp_path: Path) -> None:
    paths = StudyPaths(tmp_path / "s")       # no verification.json: the method is not known
    server_side = {"1": {**NO_SPEC, "spec_drafts": 10.0, "spec_acceptance_rate": 0.4}}
    row = _trial_row(_record(5, {"server_side": server_side}), paths)
    assert row["spec_method"] is None
    assert format_status(_status([row])).splitlines()[-1] == "        speculative acceptance: c=1 40%"


def test_stopped_trials_show_what_was_measured_not_placeholders(tmp_path: Path) -> None:
    paths = StudyPaths(tmp_path / "s")
    objectives = [{"label": "output_tok_s@cmax", "direction": "maximize"},
                  {"label": "tpot_ms.mean@c1", "direction": "minimize"}]
    before_load = TrialRecord(number=1, state="COMPLETE", kind="run", params={},
                              values={"output_tok_s@cmax": 43.68, "tpot_ms.mean@c1": 56.38},
                              attrs={"placeholder_values": True, "outcome": {"early_stop": {
                                  "reason": "not_applied", "after": "verify", "bounds": None,
                                  "skipped_levels": [1, 4]}}})
    after_c1 = TrialRecord(number=5, state="COMPLETE", kind="run", params={},
                           values={"output_tok_s@cmax": 40.12, "tpot_ms.mean@c1": 52.11},
                           attrs={"outcome": {
                               "levels": {"1": {"output_tok_s": 12.5, "tpot_ms.mean": 52.11}},
                               "early_stop": {"reason": "dominated", "after": "c1",
                                              "bounds": [40.12, 52.11], "skipped_levels": [4]}}})
    status = _status([_trial_row(before_load, paths), _trial_row(after_c1, paths)])
    status["objectives"] = objectives
    text = format_status(status)
    assert "    1 " in text and "not measured (stopped after verify: not_applied)" in text
    assert "43.68" not in text and "56.38" not in text
    assert ("output_tok_s@cmax<=40.12 (bound, c=4 skipped)  tpot_ms.mean@c1=52.11  "
            "[stopped after c1: dominated]") in text
    # Stopped during its top level (rule 4b): that level was part-measured, not skipped.
    inside = TrialRecord(number=8, state="COMPLETE", kind="run", params={},
                         values={"output_tok_s@cmax": 4581.0, "tpot_ms.mean@c1": 4.663},
                         attrs={"outcome": {
                             "levels": {"1": {"output_tok_s": 180.0, "tpot_ms.mean": 4.663}},
                             "early_stop": {"reason": "dominated_inside", "after": "inside c32",
                                            "bounds": [4581.0, 4.663], "skipped_levels": [32]}}})
    status = _status([_trial_row(inside, paths)])
    status["objectives"] = objectives
    assert ("output_tok_s@cmax<=4581 (bound, c=32 stopped inside)  tpot_ms.mean@c1=4.663  "
            "[stopped inside c32: dominated_inside]") in format_status(status)
