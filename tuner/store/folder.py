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
span from the first trial's start to the last trial's end. What it holds but cannot be
read is never such a silent gap: a trial whose outcome.json or command.json is damaged is
a ``damaged_record`` trial naming the file and what is wrong with it (``Damage``), and
only the study's own trial folders are read (tuner.study.trial_folders).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from tuner.adapters.artifacts import StudyPaths, open_private, read_json
from tuner.errors import StudyError
from tuner.probe.agreement import agreement_line
from tuner.store.handle import (
    StudyHandle,
    finished_trial_numbers,
    make_storage,
    open_existing,
    read_saved_spec,
    read_study_json,
)
from tuner.store.records import read_records
from tuner.study import space
from tuner.study.outcome import TrialOutcome
from tuner.study.outcome_summary import OutcomeSummary
from tuner.study.parameters import BoolParam, CategoricalParam, IntParam
from tuner.study.policy import told_for, worst_values
from tuner.study.scoring import outcome_summary
from tuner.study.spec import StudySpec
from tuner.study.trial_folders import DAMAGED_SUFFIX
from tuner.study.trials import KIND_DAMAGED, KIND_RUN
from tuner.vllm.knobs import RenderedCommand, shell_line

__all__ = ["FolderStudyHandle", "open_for_reading", "study_from_trial_files", "KIND_NOT_IN_FOLDER",
           "restore_storage", "distribution"]

KIND_NOT_IN_FOLDER = "not_in_folder"
FOLDER_STORAGE = "trial-files"  # StudyHandle.storage_url of a folder-backed handle


class FolderStudyHandle(StudyHandle):
    """A study handle whose ``load()`` rebuilds the study from the trial files (read-only)."""

    def load(self) -> optuna.Study:
        return study_from_trial_files(self.paths, self.spec, self.name)


def _has_storage(paths: StudyPaths) -> bool:
    if not paths.study_json.exists():
        return False
    meta = read_json(paths.study_json, dict)
    if meta is None:
        return True  # let open_existing report the broken file
    # A non-default storage (a database URL) is not in the folder; only the default
    # SQLite file can be known to be missing.
    return not meta.get("storage_is_default", True) or paths.sqlite.exists()


def open_for_reading(results_root: Path, name: str, *, storage_url: str | None = None,
                     edited_spec_ok: bool = False) -> StudyHandle:
    """The study's handle for reading: its Optuna storage when it has one, else its trial
    files. An edited spec.yaml is refused, or with ``edited_spec_ok`` returned with its
    changes (``store.open_existing``)."""

    paths = StudyPaths.of(results_root, name)
    if storage_url is not None or _has_storage(paths) or not paths.spec_yaml.exists() \
            or not (paths.root / "trials").is_dir():
        return open_existing(results_root, name, storage_url=storage_url, edited_spec_ok=edited_spec_ok)
    meta = read_study_json(paths) if paths.study_json.exists() else None
    spec, changes = read_saved_spec(paths, meta, edited_spec_ok=edited_spec_ok)
    return FolderStudyHandle(paths.root.name, paths, FOLDER_STORAGE, spec, changes)


def restore_storage(handle: StudyHandle, progress: Callable[[str], None] = lambda line: None) -> int:
    """Rebuild a lost default SQLite storage from the trial files, before a run; the
    number of trials it now holds (0: nothing to do).

    Only the study's own SQLite file, only when it is missing (or holds no study of this
    name) and the folder has finished trials: those are then told exactly as the run told
    them (``study_from_trial_files``), numbered as their folders, so the run continues
    after the last one instead of starting again at trial 0 over their files.

    A damaged trial file is set aside (``<file>.damaged-<time>``, never deleted) and named
    through ``progress``; its trial keeps its number as a ``KIND_DAMAGED`` trial, neither
    finished nor failed, and its configuration, when its command.json still says it, is
    queued to be measured again (user attribute ``remeasure_of``). Measuring it again is
    what gives the study its point back: told as a failure, a lost measurement of what may
    be the front's best point would count against the budget and steer the sampler away
    from it. Numbered folders that are not the study's trials are named and left alone.
    """

    paths = handle.paths
    if handle.storage_url != paths.default_storage_url() or not finished_trial_numbers(paths):
        return 0
    if paths.sqlite.exists() and paths.sqlite.stat().st_size > 0:
        if handle.name in optuna.study.get_all_study_names(make_storage(handle.storage_url)):
            return 0
    stamp = time.strftime("%Y%m%dT%H%M%S")
    rebuilt = study_from_trial_files(paths, handle.spec, handle.name,
                                     set_aside=lambda damage: _set_aside(paths, damage, stamp))
    if not paths.sqlite.exists():
        open_private(paths.sqlite, "ab").close()
    storage = make_storage(handle.storage_url)
    optuna.copy_study(from_study_name=handle.name, from_storage=rebuilt._storage, to_storage=storage)
    study = optuna.load_study(study_name=handle.name, storage=storage)
    baseline_key = space.params_key(space.baseline_values(handle.spec))
    for trial in rebuilt.get_trials(deepcopy=False):
        if trial.user_attrs.get("kind") == KIND_DAMAGED:
            _remeasure(study, trial.number, trial.user_attrs["damaged"], baseline_key, progress)
    for stray in paths.trial_folders().stray:
        progress(f"[resume] trials/{stray.name} is not one of the study's trial folders ({stray.reason}): "
                 "left alone, not read as a trial")
    return len(rebuilt.trials)


def _set_aside(paths: StudyPaths, damage: Damage, stamp: str) -> Damage:
    """Move a damaged file out of the way, to the name it is known by from now on."""

    if damage.kept_as is not None:
        return damage
    kept_as = f"{damage.file}{DAMAGED_SUFFIX}{stamp}"
    try:
        os.replace(paths.root / damage.file, paths.root / kept_as)
    except OSError as exc:
        raise StudyError(f"{paths.root / damage.file} is damaged ({damage.reason}) and could not be set "
                         f"aside ({exc.strerror}); nothing was started. Move it away by hand and resume") from None
    return replace(damage, kept_as=kept_as)


def _remeasure(study: optuna.Study, number: int, damage: dict[str, Any], baseline_key: str,
               progress: Callable[[str], None]) -> None:
    """Queue a damaged trial's configuration again, when it is known, and say so."""

    said = f"[resume] {damage['file']} {damage['reason']}: set aside as {damage['kept_as']}; trial {number} "
    values = damage.get("values")
    if values is None:
        progress(said + "is not counted, and its configuration is unknown (command.json), so it is not "
                 "measured again")
        return
    study.enqueue_trial(values, user_attrs={"remeasure_of": number, "attempt": 1,
                                            "baseline": space.params_key(values) == baseline_key},
                        skip_if_exists=False)
    progress(said + "is not counted; its configuration is measured again as trial "
             f"{len(study.get_trials(deepcopy=False)) - 1}")


def _when(unix: float | None) -> dt.datetime | None:
    return None if unix is None else dt.datetime.fromtimestamp(unix)


@dataclass(frozen=True)
class Damage:
    """A trial file that is there but cannot be read as what the worker wrote.

    ``file`` and ``kept_as`` (where a resume set it aside) are relative to the study folder;
    ``values``: the trial's configuration, when its command.json still says it."""

    file: str
    reason: str
    kept_as: str | None = None
    values: dict[str, Any] | None = None

    def as_attr(self) -> dict[str, Any]:
        return {"file": self.file, "reason": self.reason, "kept_as": self.kept_as, "values": self.values}


def _read_file(trial_dir: Path, name: str) -> tuple[dict[str, Any] | None, str | None, str | None]:
    """(data, what is wrong with it, where an earlier resume set it aside): all None when
    the worker never wrote it."""

    path = trial_dir / name
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        kept = sorted(trial_dir.glob(f"{name}{DAMAGED_SUFFIX}*"))
        if kept:
            return None, "set aside as damaged by an earlier resume", kept[-1].name
        return None, None, None
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"cannot be read ({getattr(exc, 'strerror', None) or exc})", None
    try:
        data = json.loads(text)
    except ValueError as exc:
        return None, f"is not valid JSON ({exc}; {len(text)} bytes)", None
    if not isinstance(data, dict):
        return None, f"is not a JSON object (a {type(data).__name__})", None
    return data, None, None


def _trial_files(trial_dir: Path, number: int) -> tuple[TrialOutcome, dict[str, Any]] | Damage | None:
    """The trial's outcome and command, a ``Damage`` naming the file that keeps it from
    being rebuilt, or None for a trial that never finished (no outcome.json)."""

    where = f"trials/{trial_dir.name}"
    command, command_problem, command_kept = _read_file(trial_dir, "command.json")
    values = command.get("values") if command is not None else None
    values = dict(values) if isinstance(values, dict) else None
    outcome_data, problem, kept = _read_file(trial_dir, "outcome.json")
    if outcome_data is None and problem is None:
        return None
    if outcome_data is None:
        return Damage(f"{where}/outcome.json", str(problem), kept and f"{where}/{kept}", values)
    try:
        outcome = TrialOutcome.model_validate(outcome_data)
    except ValueError as exc:
        first = str(exc).splitlines()
        detail = "; ".join(line.strip() for line in first[1:3]) if len(first) > 1 else str(exc)
        return Damage(f"{where}/outcome.json", f"is not a trial outcome ({detail[:200]})", values=values)
    if outcome.number != number:
        return Damage(f"{where}/outcome.json", f"holds trial {outcome.number}'s outcome, not trial {number}'s",
                      values=values)
    if command is None or values is None:
        why = command_problem or ("is missing" if command is None else 'has no "values" (the configuration)')
        return Damage(f"{where}/command.json", why, command_kept and f"{where}/{command_kept}")
    if "probe_agreement" not in outcome_data and outcome.probe_passed is not None:
        # Recorded before the worker stored this line: derived from the trial's probe.json.
        probe = read_json(trial_dir / "probe.json", dict)
        outcome.probe_agreement = agreement_line(probe.get("reference")) if probe else None
    return outcome, command


def _trial(spec: StudySpec, trial_dir: Path, number: int, baseline_key: str,
           worst: Callable[[], list[float] | None], baselines: list[int]) -> FrozenTrial | Damage | None:
    """The trial as the orchestrator recorded it (Orchestrator._record), what keeps it from
    being rebuilt (``Damage``), or None for a trial that never finished. ``worst``: the
    worst values told before it, for early stops; ``baselines``: the finished trials of the
    baseline's configuration so far (this one is added): the first is the baseline, the later
    ones its fresh starts for the study's noise (policy.first_points), as the loop marked them."""

    files = _trial_files(trial_dir, number)
    if not isinstance(files, tuple):
        return files
    outcome, command = files
    values: dict[str, Any] = dict(command["values"])
    params: dict[str, Any] = {}
    distributions: dict[str, optuna.distributions.BaseDistribution] = {}
    for param in space.ordered_parameters(spec):
        if param.name in values:
            params[param.name] = values[param.name]
            distributions[param.name] = distribution(param)
    attrs: dict[str, Any] = {
        "kind": KIND_RUN,
        "values": values,
        "attempt": 1,
        "outcome": outcome_summary(outcome).as_attr(),
        "command": shell_line(RenderedCommand(list(command.get("argv", [])), dict(command.get("env", {})))),
        "from_trial_files": True,
    }
    if space.params_key(values) == baseline_key:
        baselines.append(number)
        attrs.update({"baseline": True} if len(baselines) == 1 else {"baseline": False,
                                                                      "noise_start": len(baselines)})
    else:
        attrs["baseline"] = False
    # Told exactly as the study loop tells it (tuner.study.policy.told_for).
    told = told_for(spec, outcome, worst)
    attrs.update(told.user_attrs())
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


def _damaged_placeholder(damage: Damage) -> FrozenTrial:
    """A damaged trial's place in the study: its number kept, nothing told about its
    configuration (a FAIL of a run would steer the sampler away from what may be the best
    point; its measurement is lost, not bad)."""

    return optuna.trial.create_trial(state=TrialState.FAIL,
                                     user_attrs={"kind": KIND_DAMAGED, "damaged": damage.as_attr()})


def study_from_trial_files(paths: StudyPaths, spec: StudySpec, name: str, *,
                           set_aside: Callable[[Damage], Damage] | None = None) -> optuna.Study:
    """An in-memory Optuna study holding what the folder's trial files say (see module doc).

    A trial whose files are damaged is a ``KIND_DAMAGED`` placeholder naming the file and
    what is wrong with it (after ``set_aside``, when given, has moved it); numbered entries
    of ``trials/`` that are not the study's trial folders (tuner.study.trial_folders) are
    left out, and cost nothing."""

    folders = paths.trial_folders()
    present = set(folders.numbers)
    directions = [o.direction for o in spec.objectives]
    labels = [o.label for o in spec.objectives]
    study = optuna.create_study(study_name=name, directions=directions)
    study.set_metric_names(labels)
    baseline_key = space.params_key(space.baseline_values(spec))
    baselines: list[int] = []
    starts: list[float] = []
    ends: list[float] = []
    for number in range(folders.numbers[-1] + 1 if folders.numbers else 0):
        trial = None
        if number in present:
            trial = _trial(spec, paths.trial_dir(number), number, baseline_key,
                           lambda: worst_values(read_records(study), labels, directions), baselines)
        if isinstance(trial, Damage):
            trial = _damaged_placeholder(set_aside(trial) if set_aside is not None else trial)
        elif trial is None:
            # Keeps later trials at their original numbers; never a run, so never shown.
            trial = optuna.trial.create_trial(state=TrialState.FAIL, user_attrs={"kind": KIND_NOT_IN_FOLDER})
        else:
            summary = OutcomeSummary.from_attr(trial.user_attrs["outcome"])
            if summary.started_unix is not None:
                starts.append(summary.started_unix)
            if summary.finished_unix is not None:
                ends.append(summary.finished_unix)
        study.add_trial(trial)
    if starts and ends:
        study.set_user_attr("elapsed_s", max(ends) - min(starts))
    study.set_user_attr("from_trial_files", str(paths.root))
    return study


def distribution(param: Any) -> BaseDistribution:
    """A study parameter as the Optuna distribution its suggestions come from."""

    if isinstance(param, CategoricalParam):
        return CategoricalDistribution(param.values)
    if isinstance(param, BoolParam):
        return CategoricalDistribution([False, True])
    if isinstance(param, IntParam):
        return IntDistribution(param.low, param.high, step=param.step, log=param.log)
    return FloatDistribution(param.low, param.high, step=param.step, log=param.log)
