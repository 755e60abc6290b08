"""`tuner status` on a study in its default SQLite file reads study.json, the budget in
spec.yaml and the tables with sqlite3, without importing Optuna (records.read_sqlite_study,
status.status_from_folder). It must show exactly what the Optuna path shows, and step
aside for anything else."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import optuna
from optuna.trial import TrialState, create_trial

from tests.test_overhead_records import _study
from tuner.store.handle import create_or_open
from tuner.store.records import read_records, read_sqlite_study
from tuner.study import space
from tuner.study.study_file import parse_study
from tuner.views.status import build_status, format_status, status_from_folder

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("optuna", "sqlalchemy", "alembic", "numpy", "pydantic", "ray", "httpx")


def test_sqlite_read_equals_the_optuna_read(tmp_path: Path) -> None:
    study = _study(tmp_path)
    study.set_user_attr("elapsed_s", 12.5)
    fresh = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    stored = read_sqlite_study(tmp_path / "optuna.db", "s")
    assert stored is not None
    assert stored.records == read_records(fresh)
    assert stored.metric_names == fresh.metric_names == ["output_tok_s@cmax", "tpot_ms.mean@c1"]
    assert stored.directions == ["maximize", "minimize"]
    assert stored.user_attrs == fresh.user_attrs == {"elapsed_s": 12.5}


def test_sqlite_read_steps_aside_for_what_it_does_not_know(tmp_path: Path) -> None:
    _study(tmp_path)
    assert read_sqlite_study(tmp_path / "optuna.db", "no-such-study") is None
    assert read_sqlite_study(tmp_path / "missing.db", "s") is None
    assert not (tmp_path / "missing.db").exists()          # never creates a database
    (tmp_path / "junk.db").write_text("not a database")
    assert read_sqlite_study(tmp_path / "junk.db", "s") is None


def _filled_study(results: Path) -> tuple[object, optuna.Study]:
    spec = parse_study((ROOT / "search_spaces" / "demo.yaml").read_text(), "demo.yaml")
    handle = create_or_open(spec, results)
    study = optuna.create_study(study_name=handle.name, storage=handle.storage_url,
                                directions=[o.direction for o in spec.objectives])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names([o.label for o in spec.objectives])
    study.set_user_attr("elapsed_s", 300.0)
    baseline = space.baseline_values(spec)
    study.add_trial(create_trial(
        state=TrialState.COMPLETE, values=[100.0, 20.0],
        user_attrs={"kind": "run", "values": baseline, "baseline": True,
                    "outcome": {"probe_s": 3.0, "trial_s": 30.0, "probe_passed": True}},
        system_attrs={"constraints:probe": 0.0, "constraints:applied": 0.0}))
    study.add_trial(create_trial(
        state=TrialState.COMPLETE, values=[150.0, 15.0], user_attrs={"kind": "run", "values": {"x": 1}},
        system_attrs={"constraints:probe": 0.0, "constraints:applied": 0.0}))
    study.add_trial(create_trial(
        state=TrialState.COMPLETE, values=[150.0, 15.0], user_attrs={"kind": "duplicate", "duplicate_of": 1}))
    study.add_trial(create_trial(
        state=TrialState.FAIL, user_attrs={"kind": "run", "values": {"x": 2},
                                           "failure": {"reason": "server_exited", "message": "boom"}}))
    return handle, study


def test_status_from_folder_equals_build_status(tmp_path: Path) -> None:
    handle, _ = _filled_study(tmp_path)
    fast = status_from_folder(tmp_path, handle.name)
    full = build_status(handle, handle.load())
    assert fast is not None and fast == full
    assert fast["finished_trials"] == 3 and fast["skipped"]["duplicate"] == 1
    assert format_status(fast) == format_status(full)


def test_status_from_folder_leaves_other_storages_to_the_full_path(tmp_path: Path) -> None:
    handle, _ = _filled_study(tmp_path)
    assert status_from_folder(tmp_path, "no-such-study") is None
    meta = json.loads(handle.paths.study_json.read_text())
    handle.paths.study_json.write_text(json.dumps({**meta, "storage_is_default": False}))
    assert status_from_folder(tmp_path, handle.name) is None
    handle.paths.study_json.write_text(json.dumps(meta))
    handle.paths.spec_yaml.write_text("budget: [not, a, mapping]\n")
    assert status_from_folder(tmp_path, handle.name) is None
    handle.paths.spec_yaml.write_text("budget: {n_trials: 5\n")       # not YAML at all
    assert status_from_folder(tmp_path, handle.name) is None


def test_status_command_imports_nothing_heavy(tmp_path: Path) -> None:
    handle, _ = _filled_study(tmp_path)
    code = (
        "import json, sys\n"
        "from tuner.commands.main import main\n"
        f"rc = main(['status', {handle.name!r}, '--results', {str(tmp_path)!r}, '--brief'])\n"
        f"heavy = sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})\n"
        "print(json.dumps({'rc': rc, 'heavy': heavy}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.splitlines()[-1])
    assert result == {"rc": 0, "heavy": []}
    assert f"study {handle.name}: 3/" in out.stdout
