"""Resume and the budget on the simulator (issue 16, defects 4 and 10):

- `run --n-trials 2` is the study's target from then on: `tuner status` says 2/2 (not the
  file's 12) and `resume` without --n-trials runs nothing more;
- with optuna.db lost, `resume` rebuilds it from the trial files and continues after the
  last trial - no finished trial's files are touched;
- with a storage that knows fewer trials than the folder, `resume` refuses in one line and
  starts nothing;
- `tuner run` exits non-zero when every trial failed and the front is empty.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import optuna
import pytest

from tests.conftest import run_tuner, wait_no_orphans, write_study

pytestmark = pytest.mark.slow


def _files(folder: Path) -> dict[str, str]:
    """Digest of every file of the finished trials (what must never change)."""

    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for d in sorted((folder / "trials").iterdir()) if (d / "outcome.json").exists()
            for p in sorted(d.iterdir()) if p.is_file()}


def _status(results: Path, name: str) -> dict:
    run = run_tuner("status", name, "--results", str(results), "--json")
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("resume16")
    path, marker = write_study(tmp)          # demo.yaml: budget.n_trials 12
    results = tmp / "results"
    run = run_tuner("run", str(path), "--results", str(results), "--n-trials", "2", timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    yield {"name": path.stem, "results": results, "folder": results / path.stem, "marker": marker}
    assert not wait_no_orphans(marker)


def test_status_counts_against_the_n_trials_given_to_run(study: dict) -> None:
    status = _status(study["results"], study["name"])
    assert (status["finished_trials"], status["target_trials"]) == (2, 2), status
    text = run_tuner("status", study["name"], "--results", str(study["results"]), "--brief").stdout
    assert "2/2 trials finished" in text


def test_resume_remembers_n_trials(study: dict) -> None:
    before = _files(study["folder"])
    run = run_tuner("resume", study["name"], "--results", str(study["results"]), timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    # The remembered target (2, not the file's 12) is reached: nothing runs.
    assert f"study {study['name']} has nothing to do: 2/2 trials finished" in run.stdout, run.stdout[-2000:]
    assert _status(study["results"], study["name"])["finished_trials"] == 2
    assert _files(study["folder"]) == before


def test_a_lost_storage_is_rebuilt_and_finished_trials_are_never_overwritten(study: dict) -> None:
    folder = study["folder"]
    before = _files(folder)
    last = max(int(d.name) for d in (folder / "trials").iterdir())
    shutil.move(folder / "optuna.db", folder.parent / "optuna.db.lost")
    run = run_tuner("resume", study["name"], "--results", str(study["results"]), "--n-trials", "3",
                    timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "rebuilt it from the trial files" in run.stdout, run.stdout[-2000:]
    after = _files(folder)
    assert {k: v for k, v in after.items() if k in before} == before, "a finished trial's files changed"
    new = sorted(int(d.name) for d in (folder / "trials").iterdir() if int(d.name) > last)
    assert new, "no trial ran after the rebuilt ones"
    status = _status(study["results"], study["name"])
    assert (status["finished_trials"], status["target_trials"]) == (3, 3), status


def test_a_storage_behind_the_folder_is_refused_in_one_line(study: dict, tmp_path: Path) -> None:
    folder = study["folder"]
    before = _files(folder)
    trials_before = sorted(d.name for d in (folder / "trials").iterdir())
    stale = tmp_path / "stale.db"
    optuna.create_study(study_name=study["name"], storage=f"sqlite:///{stale}",
                        directions=["maximize", "minimize"])
    shutil.copy(stale, folder / "optuna.db")
    run = run_tuner("resume", study["name"], "--results", str(study["results"]), "--n-trials", "5",
                    timeout=600)
    assert run.returncode == 3, (run.returncode, run.stderr[-2000:])
    lines = run.stderr.strip().splitlines()
    assert "Traceback" not in run.stderr and "older than the folder" in lines[-1], run.stderr[-2000:]
    assert _files(folder) == before
    assert sorted(d.name for d in (folder / "trials").iterdir()) == trials_before


def test_run_exits_non_zero_when_every_trial_failed(tmp_path: Path) -> None:
    path, marker = write_study(tmp_path, updates={
        "server.command": ["{python}", "-c", "import sys; sys.exit(3)"],   # every server dies at once
        "server.model": "glm5-stand-in",   # a path that is not there would stop it before the first trial
        "probe.enabled": False, "budget.n_trials": 2, "server.startup_timeout": "20s"})
    run = run_tuner("run", str(path), "--results", str(tmp_path / "results"), timeout=600)
    assert run.returncode == 4, (run.returncode, run.stdout[-2000:], run.stderr[-2000:])
    assert "no feasible configuration" in run.stderr.strip().splitlines()[-1]
    assert not wait_no_orphans(marker)
