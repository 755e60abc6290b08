"""A study's folder and Optuna storage: create, reopen, lock, and read back as records.

One study = one folder under the results root (``results/<name>``) holding the resolved
spec, metadata and per-trial files, plus an Optuna storage (a SQLite file in the folder
unless another URL is given). The lock file keeps two tuner processes from driving the
same study at once; the kernel drops it when the process dies, even by SIGKILL.

The storage waits out what is worth waiting for through the hooks SQLAlchemy and the
database have for it, never by overriding Optuna's storage (``make_storage``): a SQLite
file locked by another process (``tuner status``, a backup, a second writer) is waited for
by SQLite's own busy handler; a database server restarting, by replacing dead pooled
connections before use (``pool_pre_ping``) and trying a refused connection again with
exponential backoff (the engine's ``do_connect`` event). Each wait lasts up to
``RetryPolicy.budget_s``; what still fails with ``OperationalError`` after it (and a
connection lost in the middle of a call) becomes ``StorageUnavailable`` (the engine's
``handle_error`` event), which stops the study resumably. Other errors (bad data, a
finished trial updated) are bugs and are raised as they are.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import logging
import os
import platform
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import optuna
import sqlalchemy.event
import sqlalchemy.exc
import yaml
from optuna.storages import RDBStorage

from tuner import __version__
from tuner.adapters.artifacts import (
    StudyPaths,
    atomic_write_json,
    atomic_write_text,
    make_private_dir,
    open_private,
    read_text_bounded,
    redact_url,
)
from tuner.errors import ArtifactWriteError, SpecError, StorageUnavailable, StudyError
from tuner.secrets import public_spec
from tuner.study.integrity import saved_spec
from tuner.study.safe_yaml import load_bounded
from tuner.study.spec import StudySpec
from tuner.study.study_file import parse_study

__all__ = ["StudyHandle", "create_or_open", "write_new_study", "open_existing", "StudyLock", "make_storage",
           "spec_digest",
           "RetryPolicy", "connect_with_backoff"]

logger = logging.getLogger(__name__)
_T = TypeVar("_T")


def spec_digest(spec: StudySpec) -> str:
    """A digest of what decides the measurements (not the budget, which resume may extend)."""

    # Secrets as references: the saved spec never holds their values, the study file may.
    data = public_spec(spec).model_dump(mode="json", exclude={"budget", "description", "execution"})
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class RetryPolicy:
    budget_s: float = 120.0       # how long one storage call waits for the storage
    first_delay_s: float = 0.5    # between connection attempts: doubles after every failed one ...
    max_delay_s: float = 15.0     # ... up to this

    @classmethod
    def from_env(cls) -> RetryPolicy:
        """Defaults, or ``TUNER_STORAGE_RETRY_S`` seconds of waiting (e.g. for a flaky NFS)."""

        raw = os.environ.get("TUNER_STORAGE_RETRY_S")
        return cls(budget_s=float(raw)) if raw else cls()


def _is_transient(exc: BaseException) -> bool:
    """A lock, a busy database or a lost connection, as SQLAlchemy raises it (Optuna wraps
    errors inside its sessions in ``StorageInternalError``, the original as ``__cause__``)."""

    transient = (sqlalchemy.exc.OperationalError, sqlalchemy.exc.DisconnectionError)
    if isinstance(exc, transient):
        return True
    return isinstance(exc, optuna.exceptions.StorageInternalError) and isinstance(exc.__cause__, transient)


def _with_backoff(call: Callable[[], _T], policy: RetryPolicy, what: str,
                  transient: Callable[[BaseException], bool]) -> _T:
    """``call``, again after a pause that doubles while it fails ``transient``ly, until
    ``policy.budget_s`` is spent; then its last error."""

    began = time.monotonic()
    delay = policy.first_delay_s
    while True:
        try:
            return call()
        except Exception as exc:
            spent = time.monotonic() - began
            if not transient(exc) or spent >= policy.budget_s:
                raise
            wait = min(delay, policy.budget_s - spent)
            logger.warning("storage %s failed (%s); retrying in %.1fs", what, _first_line(exc), wait)
            time.sleep(wait)
            delay = min(delay * 2, policy.max_delay_s)


def _unavailable(shown: str, policy: RetryPolicy, cause: BaseException) -> StorageUnavailable:
    """What stops the study when the storage stays away (the run exits 3, resumably)."""

    return StorageUnavailable(f"the study storage {shown} failed: {_first_line(cause)} (a lock or a "
                              f"connection is waited for up to {policy.budget_s:g}s, TUNER_STORAGE_RETRY_S)")


def connect_with_backoff(policy: RetryPolicy, shown: str) -> Callable[..., Any]:
    """The engine's ``do_connect`` listener: a connection the database refuses (a server
    restarting) is tried again with backoff until the budget is spent."""

    def do_connect(dialect: Any, conn_rec: Any, cargs: Any, cparams: Any) -> Any:
        refused = dialect.loaded_dbapi.OperationalError
        return _with_backoff(lambda: dialect.connect(*cargs, **cparams), policy, f"{shown} connect",
                             lambda exc: isinstance(exc, refused))

    return do_connect


def _storage_unavailable(policy: RetryPolicy, shown: str) -> Callable[[Any], StorageUnavailable | None]:
    """The engine's ``handle_error`` listener: what still fails as ``OperationalError``
    after the waits (a lock held past the busy timeout, a connection lost mid-call, a full
    disk) stops the study resumably; SQLAlchemy raises the returned error instead."""

    def handle_error(context: Any) -> StorageUnavailable | None:
        if context.is_pre_ping or not isinstance(context.sqlalchemy_exception, sqlalchemy.exc.OperationalError):
            return None   # a dead pooled connection is replaced; anything else is a bug, raised as is
        return _unavailable(shown, policy, context.original_exception)

    return handle_error


def _sqlite_file(url: str) -> Path | None:
    """The database file of a SQLite URL; None for another database or an in-memory one."""

    parsed = sqlalchemy.engine.make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def make_storage(url: str, policy: RetryPolicy | None = None, *,
                 must_exist: bool = False) -> RDBStorage:
    """The study storage at ``url``, waited for as the module doc says.

    ``must_exist``: for commands that only read (status, report, export): a SQLite file
    that is not there is an error at once, never created (and never waited for).

    Raises:
        SpecError: ``url`` is no database URL SQLAlchemy knows.
        StudyError: the database is missing (``must_exist``) or is not an Optuna storage.
    """

    policy = policy or RetryPolicy.from_env()
    shown = redact_url(url)
    try:
        sqlite_file = _sqlite_file(url)
    except sqlalchemy.exc.ArgumentError as exc:
        raise SpecError(f"--storage {shown}: not a database URL ({_first_line(exc)}); "
                        "e.g. sqlite:///path/optuna.db or postgresql://user@host/db") from None
    if must_exist and sqlite_file is not None and not sqlite_file.is_file():
        raise StudyError(f"the study storage {shown} does not exist ({sqlite_file} is missing)")
    if sqlite_file is not None:
        # SQLite's own busy handler waits out a lock (lets `tuner status` read while the study
        # writes, a backup copy the file): sqlite3's timeout is the budget.
        engine_kwargs: dict[str, Any] = {"connect_args": {"timeout": policy.budget_s}}
    else:
        # A database server: a pooled connection that died (the server restarted) is
        # replaced before it is used.
        engine_kwargs = {"pool_pre_ping": True}
    opening = functools.partial(RDBStorage, url, engine_kwargs=engine_kwargs)
    try:
        # Opening connects and reads before the engine's listeners below are in place: a
        # database server is tried again here; for SQLite its busy handler did the waiting.
        storage = (opening() if sqlite_file is not None
                   else _with_backoff(opening, policy, f"{shown} open", _is_transient))
    except (sqlalchemy.exc.ArgumentError, ImportError) as exc:
        # An unknown dialect or a driver that is not installed.
        raise SpecError(f"--storage {shown}: cannot be opened ({_first_line(exc)})") from None
    except Exception as exc:
        if _is_transient(exc):
            raise _unavailable(shown, policy, exc.__cause__ or exc) from exc
        if isinstance(exc, sqlalchemy.exc.SQLAlchemyError | optuna.exceptions.StorageInternalError | RuntimeError):
            # A file that is no database, a foreign schema, an Optuna schema of another version.
            raise StudyError(f"the study storage {shown} cannot be read as an Optuna storage: "
                             f"{_first_line(exc)}") from None
        raise
    if sqlite_file is None:
        sqlalchemy.event.listen(storage.engine, "do_connect", connect_with_backoff(policy, shown))
    sqlalchemy.event.listen(storage.engine, "handle_error", _storage_unavailable(policy, shown))
    return storage


def _first_line(exc: BaseException) -> str:
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    text = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[0] if text else ''}"[:300]


@dataclass
class StudyHandle:
    name: str
    paths: StudyPaths
    storage_url: str
    spec: StudySpec
    # How spec.yaml differs from what the study recorded (tuner.store.spec_guard); only a
    # reader that shows an edited study (status) gets a handle with any.
    spec_changes: list[str] = field(default_factory=list)

    def load(self) -> optuna.Study:
        try:
            # Loading reads an existing study: a missing SQLite file is an error, not a new one.
            return optuna.load_study(study_name=self.name, storage=make_storage(self.storage_url, must_exist=True))
        except KeyError as exc:
            raise StudyError(f"study {self.name!r} has no Optuna study in {redact_url(self.storage_url)}") from exc


def _fingerprint(spec: StudySpec) -> dict[str, Any]:
    import ray

    return {
        "tuner": __version__,
        "python": platform.python_version(),
        "optuna": optuna.__version__,
        "ray": ray.__version__,
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "server_command": spec.server.command,
        "model": spec.server.model,
    }


def create_or_open(spec: StudySpec, results_root: Path, *, name: str | None = None,
                   storage_url: str | None = None, write: bool = True) -> StudyHandle:
    """The folder for a new study, or the existing one when the same spec is run again.

    ``write=False``: nothing is written yet; a run writes a new study's files with
    ``write_new_study`` once it holds the study's locks (a refused run writes nothing).
    """

    name = spec.name if name is None else name
    paths = StudyPaths.of(results_root, name)
    if paths.study_json.exists():
        handle = open_existing(results_root, name, storage_url=storage_url)
        if spec_digest(handle.spec) != spec_digest(spec):
            raise StudyError(
                f"study {name!r} already exists in {paths.root} with a different spec; "
                f"use `tuner resume {name}` to continue it, or --study NEW_NAME for a new study"
            )
        return StudyHandle(name, paths, handle.storage_url, spec)
    handle = StudyHandle(name, paths, storage_url or paths.default_storage_url(), spec)
    if write:
        write_new_study(handle)
    return handle


def write_new_study(handle: StudyHandle) -> None:
    """A new study's folder, saved spec and study.json (and its own SQLite file, created
    private); nothing when study.json is there already."""

    paths, spec, name, url = handle.paths, handle.spec, handle.name, handle.storage_url
    if paths.study_json.exists():
        return
    storage_is_default = url == paths.default_storage_url()
    make_private_dir(paths.root)
    if storage_is_default and not paths.sqlite.exists():
        # SQLite creates the file with the umask's mode; it keeps an existing file's.
        open_private(paths.sqlite, "ab").close()
    spec_text = yaml.safe_dump(public_spec(spec).model_dump(mode="json"), sort_keys=False)
    atomic_write_text(paths.spec_yaml, spec_text)
    meta = {
        "name": name,
        "storage": redact_url(url),
        "storage_is_default": storage_is_default,
        "spec_digest": spec_digest(spec),
        # What spec.yaml holds, as its own data: every reader holds the file to it.
        "saved_spec": saved_spec(load_bounded(spec_text)),
        "created_unix": time.time(),
        "fingerprint": _fingerprint(spec),
    }
    atomic_write_json(paths.study_json, meta)


def finished_trial_numbers(paths: StudyPaths) -> list[int]:
    """Trials whose folder holds an outcome: measured (or failed) and final, never to be
    written again."""

    # Only the study's own trial folders: a stray numbered one (a backup named 20261206)
    # is no finished trial of this study (tuner.study.trial_folders).
    return [n for n in paths.trial_folders().numbers if (paths.trial_dir(n) / "outcome.json").is_file()]


def check_storage_covers_folder(study: optuna.Study, paths: StudyPaths, storage_url: str) -> None:
    """Refuse a storage that knows fewer trials than the folder holds finished ones: the
    next trial numbers would be those folders', and their files would be overwritten.

    Raises:
        StudyError: one line naming the first such trial and what to do.
    """

    known = len(study.get_trials(deepcopy=False))
    beyond = [n for n in finished_trial_numbers(paths) if n >= known]
    if beyond:
        raise StudyError(
            f"the study storage {redact_url(storage_url)} knows {known} trial(s), but "
            f"{paths.trial_dir(beyond[0])} holds a finished one: the storage is older than the folder "
            "(restored, or another study's). Nothing was started and no trial file was touched; "
            "restore the matching storage, or move optuna.db away and `tuner resume` rebuilds it "
            "from the trial files")


def remember_budget(paths: StudyPaths, *, n_trials: int | None, timeout_s: float | None) -> str | None:
    """Keep --n-trials/--timeout given to `run` or `resume` in study.json, so a later
    `resume` without them, and `tuner status`, use the same budget. Best effort: a file
    that cannot be written (a full disk) is no reason not to run; the warning is returned."""

    if n_trials is None and timeout_s is None:
        return None
    meta = read_study_json(paths)
    budget = dict(meta.get("budget_override") or {})
    if n_trials is not None:
        budget["n_trials"] = n_trials
    if timeout_s is not None:
        budget["timeout_s"] = timeout_s
    meta["budget_override"] = budget
    try:
        atomic_write_json(paths.study_json, meta)
    except ArtifactWriteError as err:
        return f"the budget given on the command line is not kept for later resumes ({err.reason}): {err}"
    return None


def pin_environment(paths: StudyPaths, now: dict[str, Any], *, allow_change: bool,
                    name: str) -> list[str]:
    """Compare this machine's environment with the one the study pinned on its first run
    (tuner.study.environment); pin it when there is none yet.

    Returns what changed (empty when nothing did), after recording the change in
    study.json under ``environment_changes`` when ``allow_change``.

    Raises:
        StudyError: the environment changed and ``allow_change`` is false; the message
            names every change and both ways on.
    """

    from tuner.study.environment import differences

    meta = read_study_json(paths)
    pinned = meta.get("environment")
    if not isinstance(pinned, dict):
        meta["environment"] = now
        atomic_write_json(paths.study_json, meta)
        return []
    changed = differences(pinned, now)
    if not changed:
        return []
    if not allow_change:
        raise StudyError(
            f"study {name!r} was measured in another environment: {'; '.join(changed)}. Numbers "
            "from the two are not comparable (one configuration measured 46 % apart on two H200 "
            "boxes), so nothing was started. Start a new study (`tuner run FILE --study NEW_NAME`), "
            "or pass --allow-environment-change to continue this one anyway: the change is then "
            "recorded in study.json and shown by `tuner status`")
    finished = finished_trial_numbers(paths)
    meta.setdefault("environment_changes", []).append(
        {"unix": time.time(), "changes": changed, "environment": now,
         "from_trial": finished[-1] + 1 if finished else 0})
    atomic_write_json(paths.study_json, meta)
    return changed


def read_study_json(paths: StudyPaths) -> dict[str, Any]:
    """study.json as a mapping, or StudyError in one line when it is damaged."""

    try:
        meta = json.loads(read_text_bounded(paths.study_json, "study.json"))
    except (SpecError, ValueError) as exc:
        detail = str(exc).removeprefix(f"{paths.study_json}: ")
        raise StudyError(f"{paths.study_json} is damaged ({detail.splitlines()[0][:200]}); restore it "
                         "from a backup (the trial files are intact)") from None
    if not isinstance(meta, dict):
        raise StudyError(f"{paths.study_json} is damaged (not a JSON object)")
    return meta


def open_existing(results_root: Path, name: str, *, storage_url: str | None = None,
                  edited_spec_ok: bool = False) -> StudyHandle:
    """The study ``name`` as its folder records it. ``edited_spec_ok``: a spec.yaml edited
    since the study was created is returned with its changes (``spec_changes``) instead of
    refused (StudyError naming them; tuner.store.spec_guard)."""

    paths = StudyPaths.of(results_root, name)
    if not paths.study_json.exists():
        known = sorted(p.parent.name for p in results_root.glob("*/study.json")) if results_root.exists() else []
        hint = f"; known studies: {', '.join(known)}" if known else ""
        raise StudyError(f"no study named {name!r} under {results_root}{hint}")
    meta = read_study_json(paths)
    spec, changes = read_saved_spec(paths, meta, edited_spec_ok=edited_spec_ok)
    if storage_url is None:
        if not meta.get("storage_is_default", True):
            raise StudyError(
                f"study {name!r} uses a non-default storage ({meta.get('storage')}); pass --storage URL"
            )
        storage_url = paths.default_storage_url()
    return StudyHandle(name, paths, storage_url, spec, changes)


def read_saved_spec(paths: StudyPaths, meta: dict[str, Any] | None, *,
                    edited_spec_ok: bool = False) -> tuple[StudySpec, list[str]]:
    """The study's spec.yaml, validated and held to what the study recorded
    (``open_existing``); ``meta``: study.json, None when the folder has none."""

    from tuner.store.spec_guard import check_saved_spec

    text = read_text_bounded(paths.spec_yaml, "saved spec")
    try:
        spec = parse_study(text, str(paths.spec_yaml), saved=True)
    except SpecError as exc:
        raise StudyError(f"the saved spec of study {paths.root.name!r} no longer validates: {exc}") from None
    matches = meta is not None and meta.get("spec_digest") == spec_digest(spec)
    return spec, check_saved_spec(paths, meta, text, spec, digest_matches=matches, refuse=not edited_spec_ok)


class StudyLock:
    """An exclusive, non-blocking lock on the study folder for the life of a run."""

    def __init__(self, paths: StudyPaths) -> None:
        self.paths = paths
        self._fd: int | None = None

    def __enter__(self) -> StudyLock:
        make_private_dir(self.paths.root)
        fd = os.open(self.paths.lock, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise StudyError(
                f"study {self.paths.root.name!r} is already being run by {holder}; "
                "wait for it to finish or stop it first"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode())
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
