"""The study folder on disk, and writes that never leave a half-written file.

    results/<study>/
        study.json          name, storage URL (credentials removed), versions, created,
                            what spec.yaml held then (saved_spec: readers refuse an edit)
        spec.yaml           the resolved study spec (resume runs exactly this)
        optuna.db           the Optuna storage, unless another URL was given
        pareto.json         the current front, rewritten atomically after every trial
        trials/0007/
            command.json    argv and environment (secrets redacted)
            server.log      the server's stdout and stderr
            server.pid      while a server runs: its process group (for crash recovery)
            effective_config.json, verification.json, probe.json
            requests-c16.jsonl   raw per-request records of each load level
            metrics.json, outcome.json
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
from pathlib import Path
from typing import Any, TypeVar

from tuner.errors import ArtifactWriteError, SpecError
from tuner.probe.agreement import agreement_line
from tuner.study.outcome_summary import OutcomeSummary
from tuner.study.safe_yaml import MAX_BYTES
from tuner.study.study_name import check_study_name
from tuner.study.trial_folders import DAMAGED_SUFFIX, TRIAL_FILES, TrialFolders, looks_numbered, sort_out

__all__ = [
    "DRY_RUN_JSON",
    "StudyPaths",
    "atomic_write_text",
    "atomic_write_json",
    "redact_url",
    "make_private_dir",
    "open_private",
    "read_json",
    "saved_budget",
    "read_text_bounded",
]

# Study folders hold what a study measured and how its servers were started: readable by
# their owner only (0700 folders, 0600 files), whatever the umask.
DIR_MODE = 0o700
FILE_MODE = 0o600
DRY_RUN_JSON = "dry-run.json"
_T = TypeVar("_T")


def make_private_dir(path: Path) -> None:
    """Create ``path`` and any missing parent as owner-only folders (mkdir's ``parents``
    would create the parents with the umask's mode)."""

    missing = []
    node = path
    while not node.exists():
        missing.append(node)
        if node.parent == node:
            break
        node = node.parent
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):
            folder.mkdir(mode=DIR_MODE)
            os.chmod(folder, DIR_MODE)   # mkdir's mode is filtered by the umask


def open_private(path: Path, mode: str) -> Any:
    """``open(path, mode)`` for a file created owner-only (0600); binary files unbuffered."""

    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if "a" in mode else os.O_TRUNC)
    fd = os.open(path, flags, FILE_MODE)
    os.fchmod(fd, FILE_MODE)   # a file left by an earlier run keeps its mode otherwise
    return os.fdopen(fd, mode, buffering=0) if "b" in mode else os.fdopen(fd, mode, encoding="utf-8")


def redact_url(url: str) -> str:
    """Drop the password from a storage URL such as postgresql://user:pw@host/db."""

    return re.sub(r"(//[^:/@]+):[^@/]*@", r"\1:<redacted>@", url)


def atomic_write_text(path: Path, text: str) -> None:
    """Write via a temporary file, fsync and rename: readers see old or new, never half.

    A full disk raises ArtifactWriteError and leaves the previous file untouched.
    """

    if not path.parent.is_dir():
        make_private_dir(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open_private(tmp, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        with contextlib.suppress(OSError):
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        reason = "disk_full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else "artifact_write_failed"
        raise ArtifactWriteError(f"could not write {path}: {exc}", reason=reason) from exc


def read_text_bounded(path: Path, what: str = "study file", max_bytes: int = MAX_BYTES) -> str:
    """A small UTF-8 text file (a study file, a saved spec), or SpecError in one line:
    unreadable, larger than ``max_bytes`` (read no further), or not UTF-8."""

    try:
        with open(path, "rb") as fh:
            raw = fh.read(max_bytes + 1)
    except OSError as exc:
        raise SpecError(f"{path}: cannot read the {what}: {exc.strerror or exc}") from None
    if len(raw) > max_bytes:
        raise SpecError(f"{path}: the {what} is larger than {max_bytes:,} bytes; a {what} may have at most "
                        f"{max_bytes:,}")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path}: the {what} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset "
                        f"{exc.start}); save it as UTF-8") from None


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def read_json(path: Path, kind: type[_T]) -> _T | None:
    """The JSON in ``path``, or None when it cannot be read or parsed or is not a ``kind``
    (a file missing, half-written or foreign is shown as absent, never raised)."""

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, kind) else None


class StudyPaths:
    """Names of every file of one study folder (no I/O in the constructor)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @classmethod
    def of(cls, results_root: Path, name: str) -> StudyPaths:
        """The folder of study ``name`` under ``results_root``; the name is checked first
        (core.study_name), so no name can reach outside the results root."""

        try:
            check_study_name(name)
        except ValueError as exc:
            raise SpecError(str(exc)) from None
        return cls(results_root / name)

    @property
    def study_json(self) -> Path:
        return self.root / "study.json"

    @property
    def spec_yaml(self) -> Path:
        return self.root / "spec.yaml"

    @property
    def sqlite(self) -> Path:
        return self.root / "optuna.db"

    @property
    def pareto_json(self) -> Path:
        return self.root / "pareto.json"

    @property
    def lock(self) -> Path:
        return self.root / "run.lock"

    @property
    def host_check_json(self) -> Path:
        """The host's own CPU steadiness, one entry per `run`/`resume` (load.host_check_s)."""
        return self.root / "host-check.json"

    @property
    def workload_json(self) -> Path:
        """The workload the study measures (tuner.load.workload_profile), written at each
        `run`/`resume`."""
        return self.root / "workload.json"

    def workload_profile(self) -> dict[str, Any] | None:
        """workload.json as plain JSON, or None (a study run before it existed has none)."""

        return read_json(self.workload_json, dict)

    def trial_dir(self, number: int) -> Path:
        return self.root / "trials" / f"{number:04d}"

    def trial_folders(self) -> TrialFolders:
        """The study's trial folders and the numbered entries of ``trials/`` that are not
        (tuner.study.trial_folders). One listing of ``trials/`` and of each numbered folder."""

        entries = []
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            with os.scandir(self.root / "trials") as listing:
                for entry in listing:
                    if looks_numbered(entry.name) and entry.is_dir(follow_symlinks=False):
                        entries.append((entry.name, _holds_trial_files(entry.path)))
        return sort_out(entries)

    @property
    def confirm_root(self) -> Path:
        """Confirmation re-runs: ``NNNN-K/`` per re-run, ``NNNN.json`` per trial's verdict."""

        return self.root / "confirm"

    def confirm_dir(self, number: int, rerun: int) -> Path:
        return self.confirm_root / f"{number:04d}-{rerun}"

    def confirmation_json(self, number: int) -> Path:
        return self.confirm_root / f"{number:04d}.json"

    def probe_mode(self) -> str | None:
        """What the study's probe judges, when not everything (reference_probe.json's
        ``probe_mode``: "reference-only (dummy weights: known answers not judged)"), or None."""

        said = (read_json(self.reference_probe_json, dict) or {}).get("probe_mode")
        return said if isinstance(said, str) else None

    @property
    def dry_run_json(self) -> Path:
        """Written by `tuner run --dry-run`: the folder is a rehearsal on the simulator."""
        return self.root / DRY_RUN_JSON

    def dry_run_of(self) -> str | None:
        """The study file this folder's dry run stood in for, or None: not a dry run."""

        said = (read_json(self.dry_run_json, dict) or {}).get("study_file")
        return said if isinstance(said, str) else None

    def last_host_check(self) -> dict[str, Any] | None:
        """The newest entry of host-check.json (load.host_check_s), or None."""

        entries = read_json(self.host_check_json, list)
        return entries[-1] if entries and isinstance(entries[-1], dict) else None

    def probe_agreement(self, number: int, outcome: OutcomeSummary) -> str | None:
        """How far trial ``number``'s answers moved from the reference's, one line
        (tuner.probe.agreement): the stored attribute, or read back from its probe.json for
        a trial recorded before that attribute existed. None without a reference probe."""

        if outcome.agreement_stored:    # stored - None when no reference was compared
            return outcome.probe_agreement
        if outcome.probe_passed is None:
            return None
        try:
            data = json.loads((self.trial_dir(number) / "probe.json").read_text(encoding="utf-8"))
            return agreement_line(data.get("reference")) if isinstance(data, dict) else None
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def environment(self) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        """The environment the study pinned on its first run and the changes allowed since
        (study.json; tuner.study.environment), read as plain JSON for status and report."""

        meta = read_json(self.study_json, dict) or {}
        pinned = meta.get("environment")
        changes = [c for c in meta.get("environment_changes") or [] if isinstance(c, dict)]
        return (pinned if isinstance(pinned, dict) else None), changes

    def confirmations(self) -> dict[int, dict[str, Any]]:
        """Every readable confirmation verdict, by trial number (plain JSON: status reads
        these without importing the models)."""

        found: dict[int, dict[str, Any]] = {}
        for path in sorted(self.confirm_root.glob("[0-9]*.json")):
            try:
                data = json.loads(path.read_text())
                found[int(data["trial"])] = data
            except (OSError, ValueError, KeyError, TypeError):
                continue   # half-written or foreign: the re-run is simply not shown
        return found

    def rerun_startup(self, folder: str) -> dict[str, Any] | None:
        """The startup record of confirmation re-run ``folder`` (``confirm/0002-1``), if any."""

        return read_json(self.confirm_root / folder / "startup.json", dict)

    @property
    def reference_dir(self) -> Path:
        """The study's reference job (command, server log, outcome)."""

        return self.root / "reference"

    @property
    def reference_json(self) -> Path:
        """The study's trusted reference (reused on resume)."""

        return self.root / "reference.json"

    @property
    def reference_probe_json(self) -> Path:
        """What the reference job returned, trusted or not (the evidence)."""

        return self.root / "reference_probe.json"

    @property
    def quality_reference_json(self) -> Path:
        """The reference's answers to the quality items (a study with a quality budget)."""

        return self.root / "quality_reference.json"

    def pid_files(self) -> list[Path]:
        # Every server a worker starts writes one: trials, confirmation re-runs, the reference.
        return sorted([*(self.root / "trials").glob("*/server.pid"),
                       *self.confirm_root.glob("*/server.pid"),
                       *self.reference_dir.glob("server.pid")])

    def default_storage_url(self) -> str:
        return f"sqlite:///{self.sqlite.resolve()}"


def _holds_trial_files(folder: str) -> bool:
    """A trial's own files in ``folder``, or one of them set aside as damaged
    (``outcome.json.damaged-<time>``)."""

    # One stat for nearly every folder (`tuner status` lists them all); a listing only for
    # a folder without command.json.
    if os.path.isfile(os.path.join(folder, TRIAL_FILES[0])):
        return True
    try:
        with os.scandir(folder) as listing:
            return any(entry.name.split(DAMAGED_SUFFIX)[0] in TRIAL_FILES for entry in listing)
    except OSError:
        return False


def saved_budget(meta: dict[str, Any]) -> tuple[int | None, float | None]:
    """(n_trials, timeout seconds) last given on the command line, or None for each."""

    budget = meta.get("budget_override") if isinstance(meta.get("budget_override"), dict) else {}
    n_trials, timeout = budget.get("n_trials"), budget.get("timeout_s")
    return (n_trials if type(n_trials) is int and n_trials > 0 else None,
            float(timeout) if type(timeout) in (int, float) and 0 < timeout < float("inf") else None)
