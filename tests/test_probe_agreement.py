"""How far a trial's answers moved from the reference's (tuner.probe.agreement), and where
a user sees it: ``tuner status``, ``tuner export`` and the report, read back from the real
H200 study's trial folders (results/examples/smollm2-h200, recorded before the line was
stored, so through probe.json)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import run_tuner
from tuner.adapters.artifacts import StudyPaths
from tuner.probe.agreement import agreement_line
from tuner.study.outcome_summary import OutcomeSummary

ROOT = Path(__file__).resolve().parents[1]
H200 = ROOT / "results" / "examples" / "smollm2-h200"


def _level(c: int, prompts: int, exact: int, close: int, *, corrupt: int = 0,
           forced_top1: float | None = None, subset: bool = False) -> dict:
    return {"concurrency": c, "prompts": prompts, "exact": exact, "close": close,
            "far": prompts - exact - close, "exact_fraction": exact / prompts,
            "corrupt": corrupt, "forced_top1": forced_top1, "subset": subset}


def test_counts_every_level_and_quotes_the_largest_batch() -> None:
    reference = {
        "levels": [_level(1, 2, 2, 0, subset=True), _level(4, 8, 7, 1, forced_top1=1.0),
                   _level(32, 32, 20, 12, forced_top1=0.975)],
        "scores": [{"verdict": "close", "gap": 0.25}, {"verdict": "close", "gap": 0.0625},
                   {"verdict": "exact", "gap": None}, {"verdict": "far", "gap": 3.0}],
    }
    assert agreement_line(reference) == (
        "answers identical to the reference's: 29/42 over 3 batch sizes (20/32 at batch 32); "
        "13 diverged at a near tie (largest 0.25 nats), 0 corrupt positions; "
        "teacher-forced top-1 98%")


def test_corruption_and_a_single_level() -> None:
    line = agreement_line({"levels": [_level(8, 10, 4, 2, corrupt=1)], "scores": []})
    assert line == ("answers identical to the reference's: 4/10 over batch size; "
                    "2 diverged at a near tie, 1 corrupt position")


def test_a_record_without_the_corrupt_count_counts_far_answers() -> None:
    level = _level(8, 10, 6, 1)
    del level["corrupt"]
    assert "3 corrupt positions" in agreement_line({"levels": [level]})


@pytest.mark.parametrize("reference", [None, {}, {"levels": []}, {"levels": [_level(1, 1, 1, 0) | {"prompts": 0}]}])
def test_nothing_compared_gives_no_line(reference: dict | None) -> None:
    assert agreement_line(reference) is None


def test_study_paths_prefers_the_stored_line_and_reads_old_folders(tmp_path: Path) -> None:
    paths = StudyPaths.of(H200.parent, H200.name)
    def stored(**attr: object) -> OutcomeSummary:
        return OutcomeSummary.from_attr(attr)

    assert paths.probe_agreement(2, stored(probe_agreement="stored")) == "stored"
    assert paths.probe_agreement(2, stored()) is None          # no probe ran
    # Stored as None (no reference compared): not looked for in probe.json again.
    assert paths.probe_agreement(2, stored(probe_agreement=None, probe_passed=True)) is None
    probe = json.loads((H200 / "trials" / "0002" / "probe.json").read_text())
    assert paths.probe_agreement(2, stored(probe_passed=True)) == agreement_line(probe["reference"])
    missing = StudyPaths.of(tmp_path, "gone")
    assert missing.probe_agreement(2, stored(probe_passed=True)) is None


@pytest.fixture(scope="module")
def h200_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    results = tmp_path_factory.mktemp("h200")
    shutil.copytree(H200, results / H200.name)
    return results


# The real H200 figures (vLLM 0.26.0, SmolLM2-135M bf16, against the eager reference):
# FULL_DECODE_ONLY passed with a third of its answers changed at near ties, FULL failed
# with 41 corrupt positions.
FDO = ("answers identical to the reference's: 55/88 over 7 batch sizes (21/32 at batch 32); "
       "33 diverged at a near tie (largest 0.25 nats), 0 corrupt positions; teacher-forced top-1 98%")


def test_status_shows_it_on_the_front_and_per_trial(h200_copy: Path) -> None:
    out = run_tuner("status", H200.name, "--results", str(h200_copy))
    assert out.returncode == 0, out.stderr
    front = out.stdout.split("Pareto front", 1)[1].split("Trials:", 1)[0]
    assert FDO in front
    assert out.stdout.count(FDO) == 2
    assert "41 corrupt positions" in out.stdout.split("Trials:", 1)[1]
    rows = json.loads(run_tuner("status", H200.name, "--results", str(h200_copy), "--json").stdout)
    assert next(r for r in rows["trials"] if r["trial"] == 2)["probe_agreement"] == FDO


def test_export_and_report_carry_it(h200_copy: Path) -> None:
    out = run_tuner("export", H200.name, "--results", str(h200_copy), "--trial", "2", "--force",
                    "--format", "json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["probe_agreement"] == FDO
    shell = run_tuner("export", H200.name, "--results", str(h200_copy), "--trial", "2", "--force")
    assert f"#   probe: {FDO}" in shell.stdout
    report = run_tuner("report", H200.name, "--results", str(h200_copy))
    assert report.returncode == 0, report.stderr
    folder = h200_copy / H200.name / "report"
    assert FDO in (folder / "report.md").read_text()
    assert "41 corrupt positions" in (folder / "report.html").read_text()
    assert json.loads((folder / "report.json").read_text())["probe_agreement"]["2"] == FDO


def test_a_folder_study_derives_it_from_each_probe(tmp_path: Path) -> None:
    """results/examples/smollm2-cpu has no Optuna storage: status rebuilds it from the trial
    files (tuner.store.folder), which predate the stored line. The real CPU figures: eager
    float32 with n-gram speculation left every answer identical to the eager float32
    reference's, bfloat16 changed 3 of 18 at near ties."""

    shutil.copytree(ROOT / "results" / "examples" / "smollm2-cpu", tmp_path / "smollm2-cpu")
    rows = json.loads(run_tuner("status", "smollm2-cpu", "--results", str(tmp_path), "--json").stdout)
    by_trial = {r["trial"]: r for r in rows["trials"]}
    assert by_trial[2]["params"]["dtype"] == "bfloat16"
    assert by_trial[2]["probe_agreement"].startswith(
        "answers identical to the reference's: 15/18 over 2 batch sizes (14/16 at batch 8); "
        "3 diverged at a near tie, 0 corrupt positions")
    assert by_trial[4]["params"]["spec_method"] == "ngram"
    assert by_trial[4]["probe_agreement"].startswith("answers identical to the reference's: 18/18 ")
    assert by_trial[1]["probe_agreement"] is None          # stopped before its probe
