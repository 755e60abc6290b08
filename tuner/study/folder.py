"""Read a study folder that has no Optuna storage (a copied or committed example).

A study folder keeps, per trial, what the worker measured (``outcome.json``) and what it
was asked to run (``command.json``), next to the resolved ``spec.yaml``. That is enough to
rebuild what the orchestrator told Optuna — the objective values, the constraints and the
outcome attributes come from the same functions (``tuner.study.scoring``) — so ``tuner report``,
``export`` and ``status`` work on a folder copied without its ``optuna.db``, e.g.
``results/examples/smollm2-cpu``. The rebuilt study lives in memory: nothing is written
into the folder.

What the folder does not hold is left out: proposals that never ran (duplicates,
forbidden points) have no trial folder and appear as ``kind = "not_in_folder"`` gaps so
trial numbers stay those of the original run; the run's wall-clock time is taken as the
span from the first trial's start to the last trial's end.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.adapters.artifacts import StudyPaths, open_private, read_text_bounded
from tuner.study import samplers, space
from tuner.probe.agreement import agreement_line
from tuner.study.outcome import TrialOutcome
from tuner.vllm.knobs import RenderedCommand, shell_line
from tuner.study.spec import StudySpec
from tuner.study.study_file import parse_study
from tuner.errors import SpecError, StudyError
from tuner.study.trials import KIND_RUN
from tuner.study.policy import told_for, worst_values
from tuner.study.records import read_records
from tuner.study.scoring import outcome_attrs
from tuner.study.store import StudyHandle, finished_trial_numbers, make_storage, open_existing

__all__ = ["FolderStudyHandle", "open_for_reading", "study_from_trial_files", "KIND_NOT_IN_FOLDER",
           "restore_storage"]

KIND_NOT_IN_FOLDER = "not_in_folder"
FOLDER_STORAGE = "trial-files"  # StudyHandle.storage_url of a folder-backed handle


class FolderStudyHandle(StudyHandle):
    """A study handle whose ``load()`` rebuilds the study from the trial files (read-only)."""

    def load(self) -> optuna.Study:
        return study_from_trial_files(self.paths, self.spec, self.name)


def _has_storage(paths: StudyPaths) -> bool:
    if not paths.study_json.exists():
        return False
    try:
        meta = json.loads(paths.study_json.read_text())
    except (OSError, ValueError):
        return True  # let open_existing report the broken file
    # A non-default storage (a database URL) is not in the folder; only the default
    # SQLite file can be known to be missing.
    return not meta.get("storage_is_default", True) or paths.sqlite.exists()


def open_for_reading(results_root: Path, name: str, *, storage_url: str | None = None) -> StudyHandle:
    """The study's handle for reading: its Optuna storage when it has one, else its trial files."""

    paths = StudyPaths.of(results_root, name)
    if storage_url is not None or _has_storage(paths) or not paths.spec_yaml.exists() \
            or not (paths.root / "trials").is_dir():
        return open_existing(results_root, name, storage_url=storage_url)
    try:
        spec = parse_study(read_text_bounded(paths.spec_yaml, "saved spec"), str(paths.spec_yaml))
    except SpecError as exc:
        raise StudyError(f"the saved spec of study {name!r} no longer validates: {exc}") from None
    return FolderStudyHandle(paths.root.name, paths, FOLDER_STORAGE, spec)


def restore_storage(handle: StudyHandle) -> int:
    """Rebuild a lost default SQLite storage from the trial files, before a run; the
    number of trials it now holds (0: nothing to do).

    Only the study's own SQLite file, only when it is missing (or holds no study of this
    name) and the folder has finished trials: those are then told exactly as the run told
    them (``study_from_trial_files``), numbered as their folders, so the run continues
    after the last one instead of starting again at trial 0 over their files.
    """

    paths = handle.paths
    if handle.storage_url != paths.default_storage_url() or not finished_trial_numbers(paths):
        return 0
    if paths.sqlite.exists() and paths.sqlite.stat().st_size > 0:
        if handle.name in optuna.study.get_all_study_names(make_storage(handle.storage_url)):
            return 0
    elif not paths.sqlite.exists():
        open_private(paths.sqlite, "ab").close()
    rebuilt = study_from_trial_files(paths, handle.spec, handle.name)
    optuna.copy_study(from_study_name=handle.name, from_storage=rebuilt._storage,
                      to_storage=make_storage(handle.storage_url))
    return len(rebuilt.trials)


def _when(unix: float | None) -> dt.datetime | None:
    return None if unix is None else dt.datetime.fromtimestamp(unix)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _trial(spec: StudySpec, trial_dir: Path, number: int, baseline_key: str,
           worst: Callable[[], list[float] | None]) -> FrozenTrial | None:
    """The trial as the orchestrator recorded it (Orchestrator._record), or None when its
    files are incomplete. ``worst``: the worst values told before it, for early stops."""

    outcome_data = _read_json(trial_dir / "outcome.json")
    command = _read_json(trial_dir / "command.json")
    if outcome_data is None or command is None or "values" not in command:
        return None
    try:
        outcome = TrialOutcome.model_validate(outcome_data)
    except ValueError:
        return None
    if outcome.number != number:
        return None
    if "probe_agreement" not in outcome_data and outcome.probe_passed is not None:
        # Recorded before the worker stored this line: derived from the trial's probe.json.
        probe = _read_json(trial_dir / "probe.json")
        outcome.probe_agreement = agreement_line(probe.get("reference")) if probe else None
    values: dict[str, Any] = dict(command["values"])
    params: dict[str, Any] = {}
    distributions: dict[str, optuna.distributions.BaseDistribution] = {}
    for param in space.ordered_parameters(spec):
        if param.name in values:
            params[param.name] = values[param.name]
            distributions[param.name] = samplers.distribution(param)
    attrs: dict[str, Any] = {
        "kind": KIND_RUN,
        "values": values,
        "attempt": 1,
        "baseline": space.params_key(values) == baseline_key,
        "outcome": outcome_attrs(outcome),
        "command": shell_line(RenderedCommand(list(command.get("argv", [])), dict(command.get("env", {})))),
        "from_trial_files": True,
    }
    # Told exactly as the study loop tells it (tuner.study.policy.told_for).
    told = told_for(spec, outcome, worst)
    attrs.update(told.attrs)
    attrs["verdict"] = told.verdict
    state = TrialState.FAIL if told.values is None else TrialState.COMPLETE
    objective_values = told.values
    violated = told.constraints if told.values is not None else None
    trial = optuna.trial.create_trial(state=state, values=objective_values, params=params,
                                      distributions=distributions, user_attrs=attrs,
                                      constraints=violated)
    trial.datetime_start = _when(outcome.started_unix)
    trial.datetime_complete = _when(outcome.finished_unix)
    return trial


def study_from_trial_files(paths: StudyPaths, spec: StudySpec, name: str) -> optuna.Study:
    """An in-memory Optuna study holding what the folder's trial files say (see module doc)."""

    numbers = sorted(int(d.name) for d in (paths.root / "trials").iterdir()
                     if d.is_dir() and d.name.isdigit())
    directions = [o.direction for o in spec.objectives]
    labels = [o.label for o in spec.objectives]
    study = optuna.create_study(study_name=name, directions=directions)
    study.set_metric_names(labels)
    baseline_key = space.params_key(space.baseline_values(spec))
    starts: list[float] = []
    ends: list[float] = []
    for number in range(numbers[-1] + 1 if numbers else 0):
        trial = None
        if number in numbers:
            trial = _trial(spec, paths.trial_dir(number), number, baseline_key,
                           lambda: worst_values(read_records(study), labels, directions))
        if trial is None:
            # Keeps later trials at their original numbers; never a run, so never shown.
            trial = optuna.trial.create_trial(state=TrialState.FAIL, user_attrs={"kind": KIND_NOT_IN_FOLDER})
        else:
            outcome = trial.user_attrs["outcome"]
            if outcome.get("started_unix") is not None:
                starts.append(outcome["started_unix"])
            if outcome.get("finished_unix") is not None:
                ends.append(outcome["finished_unix"])
        study.add_trial(trial)
    if starts and ends:
        study.set_user_attr("elapsed_s", max(ends) - min(starts))
    study.set_user_attr("from_trial_files", str(paths.root))
    return study
