"""Every committed example study under results/ read back as typed trial records, and one
real GPU study folder kept as a fixture (tests/fixtures/study_folders/README.md).

Some are kept without their Optuna storage: they are rebuilt from their trial files
(tuner/store/folder.py) as the orchestrator stores a trial (the ``outcome`` and ``failure``
user attributes, this version). Those with their optuna.db hold the attributes as the run
stored them, before the summary named its version (version 1). Either is read through
``TrialRecord`` as status, report and export read it, and what comes back typed must be
what the worker wrote in the trial's outcome.json.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tuner.store.folder import open_for_reading
from tuner.store.records import read_records
from tuner.study.outcome_summary import SUMMARY_VERSION, OutcomeSummary
from tuner.study.trials import KIND_RUN
from tuner.vllm.compile_cache import CompileRecord
from tuner.vllm.startup import StartupRecord

EXAMPLES = ROOT / "results" / "examples"
# The first H200 run (2026-12-02): rebuilt from its trial files, with an interrupted trial.
GPU_FOLDERS = ROOT / "tests" / "fixtures" / "study_folders"
STUDIES = [(root, p.name) for root in (EXAMPLES, GPU_FOLDERS)
           for p in sorted(root.iterdir()) if (p / "spec.yaml").is_file()]


def test_the_studies_cover_every_kind_of_record() -> None:
    # An example removed must not take a kind of record out of the test below unnoticed.
    seen = set()
    for root, name in STUDIES:
        kept_db = (root / name / "optuna.db").exists()
        for path in (root / name / "trials").glob("*/outcome.json"):
            written = json.loads(path.read_text())
            seen.add((kept_db, written["status"], (written.get("compile") or {}).get("cache")))
            seen.add((kept_db, "probe_passed", written.get("probe_passed")))
    for kept_db in (True, False):
        assert {(kept_db, "completed", "miss"), (kept_db, "completed", "none"),
                (kept_db, "probe_passed", False)} <= seen, (kept_db, seen)
    assert (True, "completed", "hit") in seen and (False, "failed", None) in seen, seen


@pytest.mark.parametrize(("root", "name"), STUDIES, ids=[name for _, name in STUDIES])
def test_an_example_study_reads_back_typed(root: Path, name: str) -> None:
    handle = open_for_reading(root, name)
    records = [r for r in read_records(handle.load()) if r.kind == KIND_RUN]
    assert records, name
    for record in records:
        written = json.loads((root / name / "trials" / f"{record.number:04d}" / "outcome.json").read_text())
        summary = record.summary
        stored_by_run = (root / name / "optuna.db").exists()
        # Studies run before the summary named its version read as version 1 (the d8b studies
        # were run after and stored it).
        versioned = "version" in (record.attrs.get("outcome") or {})
        assert summary.version == (1 if stored_by_run and not versioned else SUMMARY_VERSION)
        for key in ("status", "trial_s", "startup_s", "probe_s", "applied", "probe_passed", "probe_reason",
                    "early_stop", "max_rate", "started_unix", "finished_unix"):
            assert getattr(summary, key) == written.get(key), (name, record.number, key)
        for key, typed in (("startup", summary.startup), ("compile", summary.compile)):
            assert (None if typed is None else typed.to_json()) == written.get(key), (name, record.number, key)
        if summary.startup is not None:
            assert record.startup_record is summary.startup and summary.startup.phases
        assert record.compile_cache == (written.get("compile") or {}).get("cache")
        assert summary.levels == written.get("levels", {}) and summary.mismatches == written.get("mismatches", [])
        assert record.levels == summary.levels
        if written["status"] == "failed":
            assert record.state == "FAIL" and record.failure is not None
            assert record.failure.reason == written["reason"] and record.failure.phase == written.get("phase")
        elif record.outcome == "feasible":
            assert summary.levels and record.measured_values(), (name, record.number)
        if record.state == "COMPLETE" and not record.placeholder_values:
            assert set(record.measured_values()) <= set(record.values)
        assert record.ran_values is not None and record.command and record.attempt == 1

        # The same summary as stored before it carried a version, and as stored now.
        legacy = {k: v for k, v in record.attrs["outcome"].items() if k != "version"}
        old = OutcomeSummary.from_attr(legacy)
        assert old.version == 1 and dataclasses.replace(old, version=summary.version) == summary
        assert OutcomeSummary.from_attr(old.as_attr()) == dataclasses.replace(old, version=SUMMARY_VERSION)


def test_a_summary_without_later_fields_reads_them_as_unknown() -> None:
    """The oldest stored summaries lack the fields added since (probe agreement, startup,
    compile, rate levels, GPU wait): unknown, and the agreement marked as not stored so it
    is read back from the trial's probe.json instead."""

    old = OutcomeSummary.from_attr({"status": "completed", "trial_s": 12, "levels": {"1": {"tpot_ms.mean": 3.0}},
                                    "probe_passed": True, "mismatches": []})
    assert old.version == 1 and old.trial_s == 12 and isinstance(old.trial_s, int)
    assert old.startup is None and old.compile is None and old.rate_levels == {} and old.gpu_wait_s is None
    assert old.probe_agreement is None and not old.agreement_stored
    assert OutcomeSummary.from_attr({"probe_agreement": None}).agreement_stored
    none = OutcomeSummary.from_attr(None)
    assert none.levels == {} and none.status is None and not none.agreement_stored


def test_a_stored_summary_round_trips(tmp_path: Path) -> None:
    summary = OutcomeSummary(status="completed", trial_s=40.5, levels={"4": {"output_tok_s": 50.0}},
                             compile=CompileRecord(cache="hit", compile_s=3.1),
                             startup=StartupRecord(phases={"weights": 3.0}, complete=True, total_s=40.0),
                             probe_agreement="88 of 88 answers identical")
    stored = json.loads(json.dumps(summary.as_attr()))
    assert stored["version"] == SUMMARY_VERSION
    assert OutcomeSummary.from_attr(stored) == summary and summary.compile_cache == "hit"
