"""One study in one storage is one run at a time, wherever its files go.

The folder's lock (``store.StudyLock``) keeps two runs out of one study folder, but two
folders can share one storage (``--storage``, or one study file run from two working
directories), and each would then run the study as if alone: two references, trials
numbered past the budget, trial folders split between the two. This lock lives with the
storage:

- a marker in the Optuna study's system attributes (any storage URL): the run that holds
  the study (its id, host, pid and that pid's start, its results folder), its heartbeat
  refreshed every ``HEARTBEAT_S``. A run is refused while the marker names a live holder:
  on this host, a process with that pid and start; on another host, a heartbeat younger
  than ``STALE_S``. A run killed outright leaves its marker behind, and the next run
  takes it over: at once on the same host, after ``STALE_S`` from another one;
- for a SQLite file outside the study folder, also an ``flock`` on ``<file>.<study>.lock``
  beside it, which the kernel drops when its holder dies: atomic where the marker is not
  (two runs that read "free" in the same instant). A study's own SQLite file is covered by
  its folder's lock.

The check is read-only and comes before the run writes anything (``__enter__``); the
marker is written once the folder is locked and the study exists (``hold``).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import optuna
from optuna.study import StudyDirection

from tuner.adapters import proctree
from tuner.adapters.artifacts import redact_url
from tuner.errors import StudyError
from tuner.store.handle import RetryPolicy, _sqlite_file, make_storage

__all__ = ["StorageLock", "MARKER"]

logger = logging.getLogger(__name__)

MARKER = "tuner:run"     # the study's system attribute that names the run holding it
HEARTBEAT_S = 30.0       # how often a run refreshes its marker
STALE_S = 300.0          # a marker from another host this old is a dead run's (> the storage retries)
CONFIRM_S = 0.3          # written, then read back after this: a run that wrote at the same instant loses
# A heartbeat and the release wait a second at most: a missed beat costs nothing, and a
# release must not hold up a run that is stopping because its storage is gone (the marker
# is then taken over as a dead run's). Taking the lock waits like any storage call.
_ONE_TRY = RetryPolicy(budget_s=1.0)


class StorageLock:
    """Held for the life of a run: ``with StorageLock(...) as lock: ... lock.hold(...)``."""

    def __init__(self, storage_url: str, name: str, folder: Path) -> None:
        self.url = storage_url
        self.name = name
        self.folder = folder
        self.me = {"run": uuid.uuid4().hex[:12], "host": socket.gethostname(), "pid": os.getpid(),
                   "start_ticks": proctree.start_ticks(os.getpid()), "since_unix": time.time(),
                   "folder": str(folder.resolve())}
        self._fd: int | None = None
        self._storage: optuna.storages.BaseStorage | None = None
        self._quick: optuna.storages.BaseStorage | None = None   # heartbeat and release (_ONE_TRY)
        self._study_id: int | None = None
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    # -- taking and giving back ------------------------------------------------------

    def __enter__(self) -> StorageLock:
        try:
            self._lock_sqlite_file()
            self._refuse_if_held()
        except BaseException:
            self._unlock_file()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=5)
        if self._study_id is not None and self._beat is not None:
            with contextlib.suppress(Exception):   # stopping anyway: a stale marker is taken over
                quick = self._quick_storage()
                if self._is_mine(self._holder(quick)):
                    quick.set_study_system_attr(self._study_id, MARKER, None)
        self._unlock_file()

    def hold(self, directions: list[str]) -> None:
        """Write this run's marker (the study is created in the storage when it has none
        yet, with ``directions``), check it is still ours a moment later, and keep it fresh.

        Raises:
            StudyError: another run holds the study (or took it in the same instant).
        """

        storage = self._open()
        try:
            self._study_id = storage.get_study_id_from_name(self.name)
        except KeyError:
            with contextlib.suppress(optuna.exceptions.DuplicatedStudyError):
                storage.create_new_study([StudyDirection[d.upper()] for d in directions], self.name)
            self._study_id = storage.get_study_id_from_name(self.name)
        self._refuse_if_held()
        storage.set_study_system_attr(self._study_id, MARKER, self._marker())
        time.sleep(CONFIRM_S)
        holder = self._holder()
        if not self._is_mine(holder):
            self._study_id = None    # not ours to clear
            raise StudyError(self._refusal(holder))
        self._beat = threading.Thread(target=self._heartbeat, name="storage-lock-heartbeat", daemon=True)
        self._beat.start()

    # -- the marker ------------------------------------------------------------------

    def _marker(self) -> dict[str, Any]:
        return {**self.me, "heartbeat_unix": time.time()}

    def _open(self) -> optuna.storages.BaseStorage:
        if self._storage is None:
            self._storage = make_storage(self.url)
        return self._storage

    def _quick_storage(self) -> optuna.storages.BaseStorage:
        if self._quick is None:
            self._quick = make_storage(self.url, _ONE_TRY)
        return self._quick

    def _holder(self, storage: optuna.storages.BaseStorage | None = None) -> Any:
        storage = storage or self._storage
        assert storage is not None and self._study_id is not None
        return storage.get_study_system_attrs(self._study_id).get(MARKER)

    def _is_mine(self, holder: Any) -> bool:
        return isinstance(holder, dict) and holder.get("run") == self.me["run"]

    def _refuse_if_held(self) -> None:
        """Read-only: StudyError when a live run other than this one holds the study."""

        sqlite = _sqlite_file(self.url)
        if sqlite is not None and (not sqlite.is_file() or sqlite.stat().st_size == 0):
            return   # no storage yet: nothing can hold it (and nothing is created here)
        storage = self._open()
        if self._study_id is None:
            try:
                self._study_id = storage.get_study_id_from_name(self.name)
            except KeyError:
                return
        holder = self._holder()
        if not self._is_mine(holder) and _alive(holder):
            raise StudyError(self._refusal(holder))

    def _refusal(self, holder: Any) -> str:
        """``holder``: the marker, or what the lock file beside a SQLite file says."""

        who = holder if isinstance(holder, str) else "another run"
        if isinstance(holder, dict):
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(holder.get("since_unix") or 0)))
            who = (f"pid {holder.get('pid')} on {holder.get('host')} since {since} "
                   f"(its results: {holder.get('folder')})")
            if holder.get("host") != socket.gethostname() and isinstance(holder.get("heartbeat_unix"), float):
                silent = time.time() - holder["heartbeat_unix"]
                who += (f", last heard from {silent:.0f} s ago (a run on another host that is gone is "
                        f"taken over once it has been silent for {STALE_S / 60:.0f} minutes)")
        return (f"study {self.name!r} in the storage {redact_url(self.url)} is already being run by {who}; "
                "one study in one storage is one run at a time, so nothing was started or written: "
                "wait for that run to finish or stop it first")

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                quick = self._quick_storage()
                if not self._is_mine(self._holder(quick)):
                    logger.warning("study %s: another run took over this run's storage lock", self.name)
                    return
                assert self._study_id is not None
                quick.set_study_system_attr(self._study_id, MARKER, self._marker())
            except Exception:
                logger.warning("study %s: storage lock heartbeat failed", self.name, exc_info=True)

    # -- the SQLite file's own lock ------------------------------------------------------

    def _lock_sqlite_file(self) -> None:
        sqlite = _sqlite_file(self.url)
        if sqlite is None or sqlite.resolve().parent == self.folder.resolve() or not sqlite.parent.is_dir():
            return   # another database, the folder's own file (its lock covers it), or none yet
        path = sqlite.with_name(f"{sqlite.name}.{self.name}.lock")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            logger.warning("no lock file beside %s (%s): the storage's marker alone guards it", sqlite, exc)
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            held_by = os.read(fd, 400).decode(errors="replace").strip()
            os.close(fd)
            self._refuse_if_held()   # names the holder from its marker, when it has written one
            raise StudyError(self._refusal(held_by or None)) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}, results {self.me['folder']}".encode())
        self._fd = fd

    def _unlock_file(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def _alive(holder: Any) -> bool:
    """Whether the run a marker names may still be running."""

    if not isinstance(holder, dict):
        return False
    if holder.get("host") == socket.gethostname():
        try:
            pid = int(holder["pid"])
        except (KeyError, TypeError, ValueError):
            return False
        if not proctree.process_alive(pid):
            return False
        ticks = holder.get("start_ticks")
        return ticks is None or proctree.start_ticks(pid) == ticks
    try:
        return time.time() - float(holder["heartbeat_unix"]) < STALE_S
    except (KeyError, TypeError, ValueError):
        return False
