"""The storage's own lock (tuner.store.storage_lock) on a SQLite file, in-process: who holds
a study, when a marker is a dead run's, the flock beside a shared file, the heartbeat.
The same rules through real `tuner` processes: tests/test_study_isolation.py."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from tests.waiting import wait_for
from tuner.errors import StudyError
from tuner.store import storage_lock
from tuner.store.handle import make_storage
from tuner.store.storage_lock import MARKER, StorageLock

NAME = "shared-study"


def _url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'shared.db'}"


def _marker(url: str) -> object:
    storage = make_storage(url)
    return storage.get_study_system_attrs(storage.get_study_id_from_name(NAME)).get(MARKER)


def _plant(url: str, holder: dict) -> None:
    storage = make_storage(url)
    try:
        study_id = storage.get_study_id_from_name(NAME)
    except KeyError:
        study_id = storage.create_new_study([optuna.study.StudyDirection.MAXIMIZE], NAME)
    storage.set_study_system_attr(study_id, MARKER, holder)


def _hold(url: str, folder: Path) -> StorageLock:
    lock = StorageLock(url, NAME, folder).__enter__()
    lock.hold(["maximize"])
    return lock


def test_a_live_run_holds_the_study_and_gives_it_back(tmp_path: Path) -> None:
    url = _url(tmp_path)
    first = _hold(url, tmp_path / "a")
    try:
        assert _marker(url)["run"] == first.me["run"]
        with pytest.raises(StudyError) as refused:
            StorageLock(url, NAME, tmp_path / "b").__enter__()
        text = str(refused.value)
        assert f"study {NAME!r} in the storage {url} is already being run by pid" in text
        assert str((tmp_path / "a").resolve()) in text and "nothing was started or written" in text
    finally:
        first.__exit__(None, None, None)
    assert _marker(url) is None
    second = _hold(url, tmp_path / "b")     # free again
    second.__exit__(None, None, None)


def test_a_marker_left_by_a_dead_process_on_this_host_is_taken_over(tmp_path: Path) -> None:
    url = _url(tmp_path)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    import socket

    _plant(url, {"run": "killed", "host": socket.gethostname(), "pid": gone.pid, "start_ticks": 1,
                 "since_unix": time.time(), "heartbeat_unix": time.time(), "folder": "/elsewhere"})
    lock = _hold(url, tmp_path / "a")
    assert _marker(url)["run"] == lock.me["run"]
    lock.__exit__(None, None, None)


@pytest.mark.parametrize(("age_s", "refused"), [(5.0, True), (storage_lock.STALE_S + 5, False)])
def test_another_hosts_marker_holds_until_its_heartbeat_is_stale(tmp_path: Path, age_s: float,
                                                                 refused: bool) -> None:
    url = _url(tmp_path)
    planted = time.time()
    _plant(url, {"run": "far", "host": "another-host.invalid", "pid": 1, "since_unix": planted - 999,
                 "heartbeat_unix": planted - age_s, "folder": "/far/results/x"})
    if refused:
        with pytest.raises(StudyError, match=r"pid 1 on another-host.invalid .*last heard from (\d+) s ago") as err:
            StorageLock(url, NAME, tmp_path / "a").__enter__()
        # The age as of the refusal: the planted 5 s plus however long this (maybe busy) host took.
        heard = int(re.search(r"last heard from (\d+) s ago", str(err.value)).group(1))
        assert int(age_s) <= heard <= age_s + time.time() - planted + 1
        assert _marker(url)["run"] == "far"
    else:
        lock = _hold(url, tmp_path / "a")
        assert _marker(url)["run"] == lock.me["run"]
        lock.__exit__(None, None, None)


def test_two_runs_on_one_sqlite_file_exclude_each_other_before_any_marker(tmp_path: Path) -> None:
    """The flock beside the file: the second is refused although the first has not written
    its marker yet (the moment two runs started together would both read "free")."""

    url = _url(tmp_path)
    first = StorageLock(url, NAME, tmp_path / "a").__enter__()
    try:
        assert (tmp_path / f"shared.db.{NAME}.lock").is_file()
        with pytest.raises(StudyError, match=r"already being run by pid \d+ on .*, results .*/a"):
            StorageLock(url, NAME, tmp_path / "b").__enter__()
    finally:
        first.__exit__(None, None, None)
    StorageLock(url, NAME, tmp_path / "b").__enter__().__exit__(None, None, None)


def test_the_check_creates_no_storage(tmp_path: Path) -> None:
    url = _url(tmp_path)
    lock = StorageLock(url, NAME, tmp_path / "a").__enter__()   # the check alone
    assert not (tmp_path / "shared.db").exists()
    lock.__exit__(None, None, None)


def test_the_heartbeat_keeps_the_marker_fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage_lock, "HEARTBEAT_S", 0.2)
    url = _url(tmp_path)
    lock = _hold(url, tmp_path / "a")
    try:
        first = _marker(url)["heartbeat_unix"]
        wait_for(lambda: _marker(url)["heartbeat_unix"] != first, 10, "a heartbeat to refresh the marker")
    finally:
        lock.__exit__(None, None, None)
    assert _marker(url) is None
