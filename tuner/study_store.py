"""A study's folder and Optuna storage: create, reopen, lock, and read back as records.

One study = one folder under the results root (``results/<name>``) holding the resolved
spec, metadata and per-trial files, plus an Optuna storage (a SQLite file in the folder
unless another URL is given). The lock file keeps two tuner processes from driving the
same study at once; the kernel drops it when the process dies, even by SIGKILL.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import yaml

from tuner import __version__
from tuner.adapters.artifacts import StudyPaths, atomic_write_json, atomic_write_text, redact_url
from tuner.core.spec import StudySpec, parse_study
from tuner.errors import SpecError, StudyError

__all__ = ["StudyHandle", "create_or_open", "open_existing", "StudyLock", "make_storage", "spec_digest"]


def spec_digest(spec: StudySpec) -> str:
    """A digest of what decides the measurements (not the budget, which resume may extend)."""

    data = spec.model_dump(mode="json", exclude={"budget", "description", "execution"})
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def make_storage(url: str) -> optuna.storages.BaseStorage:
    if url.startswith("sqlite:"):
        # A long busy timeout lets `tuner status` read while the study writes.
        return optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 60}})
    return optuna.storages.RDBStorage(url)


@dataclass
class StudyHandle:
    name: str
    paths: StudyPaths
    storage_url: str
    spec: StudySpec

    def load(self) -> optuna.Study:
        try:
            return optuna.load_study(study_name=self.name, storage=make_storage(self.storage_url))
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
                   storage_url: str | None = None) -> StudyHandle:
    """The folder for a new study, or the existing one when the same spec is run again."""

    name = name or spec.name
    paths = StudyPaths(results_root / name)
    if paths.study_json.exists():
        handle = open_existing(results_root, name, storage_url=storage_url)
        if spec_digest(handle.spec) != spec_digest(spec):
            raise StudyError(
                f"study {name!r} already exists in {paths.root} with a different spec; "
                f"use `tuner resume {name}` to continue it, or --study NEW_NAME for a new study"
            )
        return StudyHandle(name, paths, handle.storage_url, spec)
    paths.root.mkdir(parents=True, exist_ok=True)
    url = storage_url or paths.default_storage_url()
    atomic_write_text(paths.spec_yaml, yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False))
    meta = {
        "name": name,
        "storage": redact_url(url),
        "storage_is_default": storage_url is None,
        "spec_digest": spec_digest(spec),
        "created_unix": time.time(),
        "fingerprint": _fingerprint(spec),
    }
    atomic_write_json(paths.study_json, meta)
    return StudyHandle(name, paths, url, spec)


def open_existing(results_root: Path, name: str, *, storage_url: str | None = None) -> StudyHandle:
    paths = StudyPaths(results_root / name)
    if not paths.study_json.exists():
        known = sorted(p.parent.name for p in results_root.glob("*/study.json")) if results_root.exists() else []
        hint = f"; known studies: {', '.join(known)}" if known else ""
        raise StudyError(f"no study named {name!r} under {results_root}{hint}")
    meta = json.loads(paths.study_json.read_text())
    try:
        spec = parse_study(paths.spec_yaml.read_text(), str(paths.spec_yaml))
    except SpecError as exc:
        raise StudyError(f"the saved spec of study {name!r} no longer validates:\n{exc}") from exc
    if storage_url is None:
        if not meta.get("storage_is_default", True):
            raise StudyError(
                f"study {name!r} uses a non-default storage ({meta['storage']}); pass --storage URL"
            )
        storage_url = paths.default_storage_url()
    return StudyHandle(name, paths, storage_url, spec)


class StudyLock:
    """An exclusive, non-blocking lock on the study folder for the life of a run."""

    def __init__(self, paths: StudyPaths) -> None:
        self.paths = paths
        self._fd: int | None = None

    def __enter__(self) -> StudyLock:
        self.paths.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.paths.lock, os.O_RDWR | os.O_CREAT, 0o644)
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
