"""Run confirmation re-runs of chosen trials on the study's GPU groups and record verdicts.

A re-run is a whole trial again - fresh server, verification, the probe against the
study's reference, the full load sweep with no early stop - in its own folder
``confirm/NNNN-K/`` (the worker's usual files). When a trial's re-runs are all back, the
verdict (``study.confirmation.judge``) is written atomically to ``confirm/NNNN.json``; an
interrupted confirmation leaves its finished folders and no verdict, and the next attempt
takes new folder numbers, so nothing measured is overwritten.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import optuna

from tuner.adapters.artifacts import StudyPaths, atomic_write_json, make_private_dir
from tuner.engine.execution import Finished, JobHost, NoWorkersLeft
from tuner.errors import ArtifactWriteError, StudyError
from tuner.store.records import read_records
from tuner.study.confirmation import Confirmation, RunResult, confirmable, judge, summary_text
from tuner.study.outcome import TrialOutcome
from tuner.study.policy import rerun_result
from tuner.study.spec import StudySpec
from tuner.study.study_noise import confirmation_tolerances
from tuner.study.trials import TrialRecord

__all__ = ["confirm_trials", "CONFIRM_JOB_BASE", "rejudge"]

# Request numbers of re-runs: below the reference job's -1, never a trial's number.
CONFIRM_JOB_BASE = -1000


@dataclass
class _Job:
    number: int          # request number (negative)
    trial: int
    folder: Path


@dataclass
class _Pending:
    jobs: list[_Job] = field(default_factory=list)
    runs: dict[int, list[RunResult]] = field(default_factory=dict)


def _next_rerun(paths: StudyPaths, trial: int) -> int:
    used = [int(p.name.rsplit("-", 1)[1]) for p in paths.confirm_root.glob(f"{trial:04d}-*")
            if p.is_dir() and p.name.rsplit("-", 1)[1].isdigit()]
    return max(used, default=0) + 1


def confirm_trials(host: JobHost, study: optuna.Study, trials: list[int], *, repeats: int,
                   tolerance: float | None, keep_previous: bool = False) -> list[Confirmation]:
    """Re-run each trial ``repeats`` times and return (and write) the verdicts.

    ``keep_previous``: the verdict also counts the trial's re-runs already recorded in
    ``confirm/`` (repeats spent on separating ties add to them, tuner.engine.tie_runs).

    Returns early, with the verdicts finished so far, when the study run is interrupted
    (first Ctrl-C: running re-runs are stopped gracefully). The trials must be completed run
    trials of ``study``; ``host`` is what the re-runs need of the study run.

    Raises:
        StudyError: a trial is not a completed run, or no GPU group is left.
    """

    spec, paths, executor = host.spec, host.paths, host.executor
    by_number = {r.number: r for r in read_records(study)}
    pending = _plan(host, by_number, trials, repeats)
    previous = paths.confirmations() if keep_previous else {}
    queue = list(pending.jobs)
    running: dict[int, _Job] = {}
    verdicts: list[Confirmation] = []
    stop_grace = spec.server.stop_timeout
    deadline = spec.budget.trial_timeout + stop_grace + 15

    def finish(job: _Job, result: RunResult) -> None:
        runs = pending.runs[job.trial]
        runs.append(result)
        if len(runs) < repeats:
            return
        earlier = [RunResult.model_validate(r)
                   for r in (previous.get(job.trial) or {}).get("runs") or []]
        verdicts.append(_verdict(host, by_number[job.trial], earlier + runs, tolerance=tolerance,
                                 records=list(by_number.values())))

    try:
        while queue or running:
            if host.interrupted():
                for item in executor.cancel_all(wait_s=stop_grace + 30):
                    running.pop(int(item.request["number"]), None)
                return verdicts
            while queue and executor.idle_groups():
                job = queue.pop(0)
                group = executor.idle_groups()[0]
                make_private_dir(job.folder)
                chosen = by_number[job.trial]
                values = chosen.ran_values if chosen.ran_values is not None else chosen.params
                request = host.request(job.number, values, group, job.folder)
                executor.submit(group, request.model_dump(mode="json"), deadline_s=deadline)
                running[job.number] = job
                host.progress(f"[confirm] trial {job.trial}: re-run {job.folder.name} on group {group}")
            for item in executor.poll(0.5, stop_grace_s=stop_grace):
                ended = running.pop(int(item.request["number"]), None)
                if ended is not None:
                    finish(ended, _run_result(spec, ended, item))
    except NoWorkersLeft as exc:
        raise StudyError(str(exc)) from exc
    except KeyboardInterrupt:
        # Second Ctrl-C: the re-runs' servers go now, not after their grace.
        host.kill_now()
        raise
    return verdicts


def _plan(host: JobHost, by_number: dict[int, TrialRecord], trials: list[int], repeats: int) -> _Pending:
    """One job per re-run of each trial, in new ``confirm/NNNN-K`` folders.

    Raises:
        StudyError: a trial is not a completed run.
    """

    pending = _Pending()
    counter = CONFIRM_JOB_BASE
    for trial in trials:
        record = by_number.get(trial)
        if not confirmable(record):
            raise StudyError(f"trial {trial} is not a completed trial of study {host.name}; "
                             "only measured trials can be confirmed")
        first = _next_rerun(host.paths, trial)
        for k in range(first, first + repeats):
            pending.jobs.append(_Job(counter, trial, host.paths.confirm_dir(trial, k)))
            counter -= 1
        pending.runs[trial] = []
    return pending


def _verdict(host: JobHost, record: TrialRecord, every: list[RunResult], *, tolerance: float | None,
             records: list[TrialRecord]) -> Confirmation:
    """The verdict on ``record`` from all its re-runs, written to confirm/NNNN.json and told.
    ``tolerance`` None: each objective's from the trial's interval and the study's noise
    (``study_noise.confirmation_tolerances``)."""

    spec, trial = host.spec, record.number
    labels = [o.label for o in spec.objectives]
    directions = [o.direction for o in spec.objectives]
    limits: float | list[float]
    if tolerance is None:
        limits = confirmation_tolerances(record, records, host.paths.confirmations(), labels,
                                         override=spec.load.noise_floor, reruns=len(every),
                                         min_change=spec.confirm.min_change)
    else:
        limits = tolerance
    verdict = judge(trial, labels, directions, [record.values[l] for l in labels],
                    sorted(every, key=lambda r: r.folder), tolerance=limits,
                    repeats=len(every), finished_unix=time.time())
    try:
        atomic_write_json(host.paths.confirmation_json(trial), verdict.model_dump(mode="json"))
    except ArtifactWriteError as err:
        host.progress(f"[confirm] trial {trial}: verdict not written ({err.reason}): {err}")
    host.progress(f"[confirm] trial {trial}: {summary_text(verdict)}")
    return verdict


def _run_result(spec: StudySpec, job: _Job, item: Finished) -> RunResult:
    """A finished re-run, told by the study's own rule (``policy.rerun_result``)."""

    if item.result is None:
        return RunResult(folder=job.folder.name, outcome=f"failed:{item.error}", message=item.message)
    return rerun_result(spec, job.folder.name, TrialOutcome.model_validate(item.result))


def rejudge(paths: StudyPaths, spec: StudySpec, records: list[TrialRecord], trials: list[int], *,
            tolerance: float | None, progress: Callable[[str], None]) -> list[Confirmation]:
    """Judge the re-runs already in ``confirm/`` again under the current rule (a tolerance set
    since, or the study's noise as it now stands), without starting anything: each verdict is
    rewritten with ``rejudged_unix``; its re-runs and their figures are as they were measured.
    ``trials``: the trials to judge (empty: every one with a verdict)."""

    stored = paths.confirmations()
    by_number = {r.number: r for r in records}
    labels = [o.label for o in spec.objectives]
    directions = [o.direction for o in spec.objectives]
    out = []
    for trial in trials or sorted(stored):
        if trial not in stored or trial not in by_number:
            raise StudyError(f"--trial: trial {trial} has no confirmation to judge again; trials with one: "
                             f"{', '.join(map(str, sorted(stored))) or 'none'}")
        old = Confirmation.model_validate(stored[trial])
        record = by_number[trial]
        limits: float | list[float] = tolerance if tolerance is not None else confirmation_tolerances(
            record, records, stored, labels, override=spec.load.noise_floor, reruns=len(old.runs),
            min_change=spec.confirm.min_change)
        verdict = judge(trial, labels, directions, [record.values[l] for l in labels], old.runs,
                        tolerance=limits, repeats=old.repeats, finished_unix=old.finished_unix)
        before = {"verdict": old.verdict, "reason": old.reason, "tolerance": old.tolerance,
                  "tolerances": old.tolerances, "rejudged_unix": old.rejudged_unix}
        verdict = verdict.model_copy(update={"rejudged_unix": time.time(), "previous": old.previous or before})
        atomic_write_json(paths.confirmation_json(trial), verdict.model_dump(mode="json"))
        progress(f"[confirm] trial {trial}: was {old.verdict}, judged again: {summary_text(verdict)}")
        out.append(verdict)
    return out
