"""A study folder read back from its files says what is wrong with them (issue 39, items 4
and 5), on a real (simulated) study:

- a damaged trial file (a truncated outcome.json, with optuna.db gone) is named by
  `status` and never a silent gap; `resume` sets it aside and measures the trial's
  configuration again under a new number;
- a stray numbered folder (`mkdir trials/5000000`, a backup named 20261206, a hand-made
  `trials/7`) is named and left out: no placeholder trial per number up to it.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import optuna
import pytest

from tests.conftest import run_tuner, wait_no_orphans, write_study
from tuner.adapters.artifacts import StudyPaths
from tuner.store.folder import study_from_trial_files
from tuner.store.handle import finished_trial_numbers, open_existing
from tuner.study import policy
from tuner.study.trial_folders import MAX_GAP, sort_out
from tuner.study.trials import KIND_DAMAGED

pytestmark = pytest.mark.slow

TRIALS = 3


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("folder39")
    # Three different trials, no further baseline starts for the study's noise.
    path, marker = write_study(tmp, updates={"load.noise_starts": 1})
    results = tmp / "results"
    run = run_tuner("run", str(path), "--results", str(results), "--n-trials", str(TRIALS), timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    yield {"name": path.stem, "results": results, "marker": marker}
    assert not wait_no_orphans(marker)


def _copy(study: dict, tmp_path: Path, *, storage: bool = False) -> Path:
    """The study copied to a results folder of its own, without optuna.db unless ``storage``."""

    target = tmp_path / "copy"
    ignore = shutil.ignore_patterns("run.lock", *(() if storage else ("optuna.db",)))
    shutil.copytree(study["results"] / study["name"], target / study["name"], ignore=ignore)
    return target


def _status(results: Path, name: str, *args: str, timeout: float = 120) -> tuple[dict, str]:
    as_json = run_tuner("status", name, "--results", str(results), "--json", *args, timeout=timeout)
    assert as_json.returncode == 0, as_json.stderr[-2000:]
    text = run_tuner("status", name, "--results", str(results), "--brief", timeout=timeout)
    assert text.returncode == 0, text.stderr[-2000:]
    return json.loads(as_json.stdout), text.stdout


def _truncate(path: Path) -> bytes:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path.read_bytes()


# -- item 4: a damaged trial file ----------------------------------------------------------


def test_status_names_a_damaged_trial_file_and_touches_nothing(study: dict, tmp_path: Path) -> None:
    results = _copy(study, tmp_path)
    outcome = results / study["name"] / "trials" / "0001" / "outcome.json"
    damaged = _truncate(outcome)
    status, text = _status(results, study["name"])
    assert status["finished_trials"] == TRIALS - 1
    [row] = status["damaged"]
    assert (row["trial"], row["file"], row["kept_as"]) == (1, "trials/0001/outcome.json", None)
    assert row["reason"].startswith("is not valid JSON") and row["params"], row
    assert "!! trial 1 not counted: trials/0001/outcome.json is not valid JSON" in text, text
    assert f"`tuner resume {study['name']}` sets it aside" in text
    assert outcome.read_bytes() == damaged, "a reading command changed the damaged file"
    assert not (results / study["name"] / "optuna.db").exists()


def test_resume_sets_a_damaged_file_aside_and_measures_it_again(study: dict, tmp_path: Path) -> None:
    results = _copy(study, tmp_path)
    folder = results / study["name"]
    damaged = _truncate(folder / "trials" / "0001" / "outcome.json")
    run = run_tuner("resume", study["name"], "--results", str(results), timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    [kept] = list((folder / "trials" / "0001").glob("outcome.json.damaged-*"))
    assert kept.read_bytes() == damaged and not (folder / "trials" / "0001" / "outcome.json").exists()
    said = [line for line in run.stdout.splitlines() if "trials/0001/outcome.json is not valid JSON" in line]
    assert said and f"set aside as trials/0001/{kept.name}" in said[0] \
        and f"measured again as trial {TRIALS}" in said[0], run.stdout[-3000:]

    trials = optuna.load_study(study_name=study["name"], storage=f"sqlite:///{folder / 'optuna.db'}").trials
    assert trials[1].user_attrs["kind"] == KIND_DAMAGED and trials[1].values is None
    again = trials[TRIALS]
    assert again.user_attrs["remeasure_of"] == 1 and again.state.name == "COMPLETE", again
    original = json.loads((study["results"] / study["name"] / "trials" / "0001" / "command.json").read_text())
    assert again.user_attrs["values"] == original["values"]
    assert len(trials) == TRIALS + 1, "the budget (the study's 3) is met again by the re-measure alone"

    status, text = _status(results, study["name"])
    assert status["finished_trials"] == TRIALS
    assert status["damaged"][0]["remeasured_as"] == TRIALS
    assert f"set aside as trials/0001/{kept.name}, measured again as trial {TRIALS}" in text, text


def test_each_kind_of_damage_is_named(study: dict, tmp_path: Path) -> None:
    results = _copy(study, tmp_path)
    paths = StudyPaths.of(results, study["name"])
    trials = paths.root / "trials"
    (trials / "0000" / "outcome.json").write_text("[1, 2, 3]")
    outcome = json.loads((trials / "0001" / "outcome.json").read_text())
    (trials / "0001" / "outcome.json").write_text(json.dumps({**outcome, "number": 2}))
    (trials / "0002" / "command.json").write_text(json.dumps({"argv": []}))
    handle = open_existing(results, study["name"])
    rebuilt = study_from_trial_files(paths, handle.spec, handle.name)
    damage = [t.user_attrs["damaged"] for t in rebuilt.trials]
    assert [t.user_attrs["kind"] for t in rebuilt.trials] == [KIND_DAMAGED] * 3
    assert (damage[0]["file"], damage[0]["reason"]) == ("trials/0000/outcome.json", "is not a JSON object (a list)")
    assert damage[1]["reason"] == "holds trial 2's outcome, not trial 1's" and damage[1]["values"]
    assert (damage[2]["file"], damage[2]["values"]) == ("trials/0002/command.json", None)
    assert "values" in damage[2]["reason"]
    (trials / "0000" / "outcome.json").write_text(json.dumps({**outcome, "number": 0, "status": "fine"}))
    reason = study_from_trial_files(paths, handle.spec, handle.name).trials[0].user_attrs["damaged"]["reason"]
    assert reason.startswith("is not a trial outcome (status") and "completed" in reason, reason


# -- item 5: stray numbered folders --------------------------------------------------------


def _plant_strays(folder: Path) -> None:
    trials = folder / "trials"
    (trials / "5000000").mkdir()                     # empty
    (trials / "7").mkdir()                           # trial 7's folder would be 0007
    shutil.copytree(trials / "0001", trials / "20261206")   # a backup of a trial, far beyond


def test_status_names_stray_folders_and_builds_no_placeholders(study: dict, tmp_path: Path) -> None:
    results = _copy(study, tmp_path)
    _plant_strays(results / study["name"])
    began = time.monotonic()
    status, text = _status(results, study["name"], timeout=60)
    took = time.monotonic() - began
    assert status["finished_trials"] == TRIALS and not status["damaged"]
    assert [s["folder"] for s in status["stray_folders"]] == ["trials/7", "trials/5000000", "trials/20261206"]
    assert "holds no trial files" in status["stray_folders"][1]["reason"]
    assert "numbers past trial 2's folder" in status["stray_folders"][2]["reason"]
    assert "!! not read as trials: trials/7: named like no trial folder" in text, text
    assert took < 40, f"status of a 3-trial folder took {took:.1f}s"
    handle = open_existing(results, study["name"])
    assert len(study_from_trial_files(handle.paths, handle.spec, handle.name).trials) == TRIALS


def test_resume_rebuilds_without_the_stray_folders_and_leaves_them_alone(study: dict, tmp_path: Path) -> None:
    results = _copy(study, tmp_path)
    folder = results / study["name"]
    _plant_strays(folder)
    backup = sorted(p.name for p in (folder / "trials" / "20261206").iterdir())
    run = run_tuner("resume", study["name"], "--results", str(results), timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert f"rebuilt it from the trial files ({TRIALS} trials)" in run.stdout, run.stdout[-2000:]
    assert "[resume] trials/20261206 is not one of the study's trial folders" in run.stdout
    trials = optuna.load_study(study_name=study["name"], storage=f"sqlite:///{folder / 'optuna.db'}").trials
    assert len(trials) == TRIALS
    assert sorted(p.name for p in (folder / "trials" / "20261206").iterdir()) == backup
    assert (folder / "trials" / "5000000").is_dir() and (folder / "trials" / "7").is_dir()


def test_a_backup_beside_the_storage_is_no_finished_trial(study: dict, tmp_path: Path) -> None:
    """With the storage there, a backup folder holding a trial's files used to read as a
    finished trial the storage did not know, and resume refused the study."""

    results = _copy(study, tmp_path, storage=True)
    paths = StudyPaths.of(results, study["name"])
    _plant_strays(paths.root)
    assert finished_trial_numbers(paths) == list(range(TRIALS))


def test_the_gap_rule() -> None:
    assert MAX_GAP >= 10 * policy.EXHAUSTED_AFTER, "a real study's gaps must fit"
    last = 3 + MAX_GAP + 1                      # exactly MAX_GAP numbers past trial 3: still a trial
    folders = sort_out([("0000", True), ("0003", True), (f"{last:04d}", True), (f"{last + MAX_GAP + 2:04d}", True),
                        ("0002", False), ("12", True), ("00012", True)])
    assert folders.numbers == [0, 3, last]
    assert [s.name for s in folders.stray] == ["12", "0002", f"{last + MAX_GAP + 2:04d}", "00012"]
    far = sort_out([(f"{MAX_GAP + 1:04d}", True)])
    assert far.numbers == [] and "past the start" in far.stray[0].reason
