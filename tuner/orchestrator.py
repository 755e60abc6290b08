"""The ask -> run -> tell loop over an Optuna study, with resume and a live Pareto file.

Trial outcomes reach the optimizer like this:
- completed, probe passed, configuration applied, limits met: objective values;
- completed but the probe failed / a knob was not applied / a limit was missed / measured
  requests failed: the same values plus violated constraints, so the sampler learns the
  region is infeasible and the point never reaches the front;
- the server failed (start, crash, timeout) or its worker was lost: FAIL with a typed reason;
- a point that a forbidden rule rejects, or one already measured, never starts a server:
  forbidden -> FAIL, duplicate -> the earlier result is told again. Neither counts
  toward the budget.

Stopping: the first Ctrl-C cancels the running trials (their servers are stopped), marks
them interrupted (re-run on resume) and returns; a second one kills the local servers and
the workers at once. A storage that keeps failing (see tuner.study.store) stops the study the
same way, resumably; a full disk fails the trial that could not write its files, and a
pareto.json that cannot be rewritten keeps its previous, complete content.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, Trial, TrialState

from tuner import recovery
from tuner.adapters.artifacts import atomic_write_json, is_secret_name
from tuner.probe.client import load_probe_items
from tuner.probe.recording import load_reference_sources
from tuner.probe.spec import ProbeSpec
from tuner.probe.record import Reference
from tuner.probe.verdict import with_reference_accuracy
from tuner.study import space
from tuner.study.confirmation import choose_candidates, confirmation_brief, reserve_seconds
from tuner.study.outcome import TrialOutcome, TrialRequest
from tuner.study.pareto import pareto_front
from tuner.vllm.knobs import RenderedCommand, shell_line
from tuner.study.command import ReferenceConfiguration, reference_configuration
from tuner.study.space import trial_command
from tuner.errors import ArtifactWriteError, StorageUnavailable, StudyError
from tuner.executor import Finished, NoWorkersLeft, RayExecutor
from tuner.confirming import confirm_trials
from tuner.study.records import KIND_DUPLICATE, KIND_FORBIDDEN, KIND_RUN, read_records, record_points
from tuner.study.sampling import grid_points
from tuner.study.samplers import make_sampler, suggest
from tuner.study.scoring import (early_stop_plan, outcome_attrs, pareto_payload, result_text,
                           stop_text, told_for, values_text)
from tuner.study.store import StudyHandle, make_storage

__all__ = ["Orchestrator", "RunSummary", "resolve_probe_files", "pinned"]

logger = logging.getLogger(__name__)

MAX_REJECTED_IN_A_ROW = 25  # then a random unseen point is enqueued instead
WORKER_WAIT_S = 600.0  # no GPU group available for this long: stop (resumably)
REFERENCE_JOB = -1  # request number of the reference job (trial numbers start at 0)
def pinned(argv: list[str]) -> list[str]:
    """``argv`` with a relative interpreter path (e.g. .venv-vllm/bin/python, meaning
    "relative to where the tuner was started") made absolute: workers may run elsewhere."""

    if "/" in argv[0] and not os.path.isabs(argv[0]):
        return [os.path.abspath(argv[0]), *argv[1:]]
    return argv


def resolve_probe_files(probe: ProbeSpec, base_dir: Path) -> ProbeSpec:
    """``probe`` with its prompts files (known answers, reference) made absolute against
    ``base_dir`` (the study file's folder) and both read and checked now, so a bad file
    stops the study before any server starts and workers elsewhere find the same file.

    Raises:
        PromptsFileError, ReferencePromptsError: a file is missing or has bad lines.
    """

    update: dict[str, Any] = {}
    if probe.prompts_file:
        update["prompts_file"] = str((base_dir / probe.prompts_file).resolve())
    if probe.reference.prompts_file:
        update["reference"] = probe.reference.model_copy(
            update={"prompts_file": str((base_dir / probe.reference.prompts_file).resolve())})
    resolved = probe.model_copy(update=update)
    if resolved.enabled:
        items = load_probe_items(resolved)
        if resolved.reference.enabled:
            load_reference_sources(resolved, items=items)
    return resolved


@dataclass
class RunSummary:
    finished_runs: int
    target: int
    stopped_because: str
    elapsed_s: float


class Orchestrator:
    def __init__(
        self,
        handle: StudyHandle,
        executor: RayExecutor,
        *,
        n_trials: int | None = None,
        timeout_s: float | None = None,
        progress: Callable[[str], None] = lambda line: None,
    ) -> None:
        self.handle = handle
        self.spec = handle.spec
        self.executor = executor
        self.n_trials = n_trials or self.spec.budget.n_trials
        self.timeout_s = timeout_s if timeout_s is not None else self.spec.budget.timeout
        self.progress = progress
        self.labels = [o.label for o in self.spec.objectives]
        self.directions = [o.direction for o in self.spec.objectives]
        self._interrupts = 0
        self._stop_reason: str | None = None
        self._grid: list[dict[str, Any]] | None = None
        self._in_flight: dict[int, Trial] = {}
        # With budget.timeout and confirm.candidates, new trials stop early enough to leave
        # time for the confirmation re-runs (study.confirmation.reserve_seconds), estimated
        # from the trials that ran their whole sweep.
        self._full_trial_s: list[float] = []
        self._confirm_reserve_s = 0.0
        # What every trial's probe is judged with: the study's probe section, with the
        # reference's known-answer accuracy once there is a reference, and the reference.
        self._probe_spec: ProbeSpec = self.spec.probe
        self._reference: dict[str, Any] | None = None

    # -- setup -------------------------------------------------------------------

    def open_study(self) -> optuna.Study:
        study = optuna.create_study(
            study_name=self.handle.name,
            storage=make_storage(self.handle.storage_url),
            directions=self.directions,
            sampler=make_sampler(self.spec),
            load_if_exists=True,
        )
        if not study.metric_names:
            study.set_metric_names(self.labels)
        return study

    def reconcile(self, study: optuna.Study) -> None:
        """Close the trials a killed run left RUNNING and stop the servers it left.

        A trial whose worker wrote a final outcome before the run died is recorded from
        that file (nothing measured is lost); one without, or one the tuner itself
        interrupted, is marked failed (``interrupted``) and re-enqueued once.
        """

        self._stop_leftover_servers()
        for frozen in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            kind = frozen.user_attrs.get("kind", KIND_RUN)
            outcome = recovery.read_outcome(self.handle.paths, frozen.number) if kind == KIND_RUN else None
            if outcome is not None and outcome.reason != "interrupted":
                trial = Trial(study, frozen._trial_id)
                trial.set_user_attr("recovered", True)
                self.progress(f"[resume] trial {frozen.number} had finished before the stop: "
                              "recording its outcome")
                self._record(study, trial, outcome, retry_if_interrupted=False)
                continue
            attempt = int(frozen.user_attrs.get("attempt", 1))
            study._storage.set_trial_user_attr(frozen._trial_id, "failure", {
                "reason": "interrupted", "message": "the tuner stopped during this trial", "phase": "unknown",
            })
            study.tell(frozen.number, state=TrialState.FAIL)
            self.progress(f"[resume] trial {frozen.number} was interrupted: marked failed")
            if kind == KIND_RUN:
                self._retry(study, frozen, attempt)

    def _retry(self, study: optuna.Study, trial: FrozenTrial, attempt: int) -> None:
        values = trial.user_attrs.get("values")
        if values is None or attempt > self.spec.budget.max_retries:
            return
        study.enqueue_trial(
            {k: v for k, v in values.items()},
            user_attrs={"retry_of": trial.number, "attempt": attempt + 1,
                        "baseline": bool(trial.user_attrs.get("baseline"))},
            skip_if_exists=False,
        )
        self.progress(f"[retry] trial {trial.number} will be re-run (attempt {attempt + 1})")

    def _stop_leftover_servers(self) -> None:
        # Trials', confirmation re-runs' and the reference job's (StudyPaths.pid_files).
        recovery.stop_leftover_servers(self.handle.paths, self.spec.server.stop_timeout, self.progress)

    def ensure_baseline(self, study: optuna.Study) -> None:
        """Queue the baseline, then the study's starting points, once per study (a resumed
        study finds them already queued or run)."""
        trials = study.get_trials(deepcopy=False)
        if not any(t.user_attrs.get("baseline") for t in trials):
            study.enqueue_trial(space.baseline_values(self.spec), user_attrs={"baseline": True, "attempt": 1})
        queued = {t.user_attrs.get("starting_point") for t in trials}
        for i, values in enumerate(space.starting_point_values(self.spec)):
            if i not in queued:
                study.enqueue_trial(values, user_attrs={"starting_point": i, "attempt": 1})

    # -- counting ---------------------------------------------------------------

    def _finished_runs(self, study: optuna.Study) -> int:
        count = 0
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)):
            if t.user_attrs.get("kind", KIND_RUN) != KIND_RUN:
                continue
            if t.user_attrs.get("failure", {}).get("reason") == "interrupted":
                continue
            count += 1
        return count

    def _known_points(self, study: optuna.Study) -> dict[str, FrozenTrial]:
        known: dict[str, FrozenTrial] = {}
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL, TrialState.RUNNING)):
            if t.user_attrs.get("kind", KIND_RUN) != KIND_RUN or "values" not in t.user_attrs:
                continue
            if t.user_attrs.get("failure", {}).get("reason") == "interrupted":
                continue
            known.setdefault(space.params_key(t.user_attrs["values"]), t)
        return known

    # -- the loop ----------------------------------------------------------------

    def run(self) -> RunSummary:
        try:
            study = self.open_study()
            self.reconcile(study)
            self.ensure_baseline(study)
        except StorageUnavailable as exc:
            raise self._storage_stop(exc) from exc
        began = time.monotonic()
        prior_elapsed = float(study.user_attrs.get("elapsed_s", 0.0))
        previous_handler = signal.getsignal(signal.SIGINT)
        signal.signal(signal.SIGINT, self.on_sigint)
        storage_ok = True
        try:
            if self.prepare_reference():
                self._note_full_trials(study)
                self._loop(study, began, prior_elapsed)
                elapsed = prior_elapsed + time.monotonic() - began
                if self._stop_reason in ("budget", "exhausted") or (
                        self._stop_reason == "timeout" and self.timeout_s is not None and elapsed < self.timeout_s):
                    self.confirm_front(study)
                elif self._stop_reason == "timeout" and self.spec.confirm.candidates > 0:
                    self.progress(f"[confirm] skipped: the wall-clock limit is reached; run "
                                  f"`tuner confirm {self.handle.name}` to re-run the front")
        except StorageUnavailable as exc:
            storage_ok = False
            self._stop_reason = "storage"
            # Nothing more can be recorded: stop the servers and leave the running trials
            # RUNNING in the storage; resume reconciles them from their outcome files.
            self.executor.cancel_all(wait_s=self.spec.server.stop_timeout + 30)
            raise self._storage_stop(exc) from exc
        finally:
            signal.signal(signal.SIGINT, previous_handler)
            if storage_ok:
                try:
                    study.set_user_attr("elapsed_s", prior_elapsed + time.monotonic() - began)
                    self.write_pareto(study)
                except StorageUnavailable:
                    logger.warning("could not record the elapsed time and front", exc_info=True)
        return RunSummary(self._finished_runs(study), self.n_trials, self._stop_reason or "budget",
                          prior_elapsed + time.monotonic() - began)

    def _storage_stop(self, exc: StorageUnavailable) -> StorageUnavailable:
        return StorageUnavailable(
            f"{exc}.\nThe study stopped: finished trials are safe in the storage, running trials "
            f"were stopped. When the storage is back, continue with `tuner resume {self.handle.name}`."
        )

    def on_sigint(self, signum: int, frame: Any) -> None:
        self._interrupts += 1
        if self._interrupts == 1:
            self.progress("[interrupt] stopping: aborting running trials and stopping servers "
                          "(Ctrl-C again to stop at once)")
            self._stop_reason = "interrupted"
        else:
            raise KeyboardInterrupt

    def _loop(self, study: optuna.Study, began: float, prior_elapsed: float) -> None:
        rejected_in_a_row = 0
        waiting_since: float | None = None
        try:
            while True:
                if self._stop_reason == "interrupted":
                    for item in self.executor.cancel_all(wait_s=self.spec.server.stop_timeout + 30):
                        self._tell(study, item)
                    return
                elapsed = prior_elapsed + time.monotonic() - began
                done_runs = self._finished_runs(study)
                in_flight = len(self.executor.running())
                out_of_time = self.timeout_s is not None and elapsed >= self.timeout_s - self._confirm_reserve_s
                if out_of_time and self._stop_reason is None:
                    self._stop_reason = "timeout"
                    if self._confirm_reserve_s and elapsed < self.timeout_s:
                        self.progress(f"[budget] no new trials after {elapsed:.0f}s: the last "
                                      f"{self._confirm_reserve_s:.0f}s of the wall-clock limit are kept for "
                                      "the confirmation re-runs; finishing running trials")
                    else:
                        self.progress(f"[budget] wall-clock limit reached after {elapsed:.0f}s; finishing running trials")
                can_start = self._stop_reason is None and done_runs + in_flight < self.n_trials
                while can_start and self.executor.idle_groups():
                    started = self._start_next(study, rejected_in_a_row)
                    if started is None:
                        rejected_in_a_row += 1
                        if rejected_in_a_row > 4 * MAX_REJECTED_IN_A_ROW:
                            self._stop_reason = "exhausted"
                            self.progress("[budget] every allowed point of the space has been measured")
                            break
                        continue
                    rejected_in_a_row = 0
                    in_flight += 1
                    can_start = done_runs + in_flight < self.n_trials
                if not self.executor.running():
                    if not (can_start and self.executor.pending_groups()):
                        if self._stop_reason is None:
                            self._stop_reason = "budget"
                        return
                    # Every group's worker is starting or waiting for Ray to place it.
                    waiting_since = waiting_since or time.monotonic()
                    if time.monotonic() - waiting_since > WORKER_WAIT_S:
                        raise StudyError(
                            f"no GPU group has been available for {WORKER_WAIT_S:.0f}s (the Ray cluster "
                            f"lost nodes?); continue with `tuner resume {self.handle.name}` when it is back")
                else:
                    waiting_since = None
                for item in self.executor.poll(0.5, stop_grace_s=self.spec.server.stop_timeout):
                    self._tell(study, item)
        except NoWorkersLeft as exc:
            self._stop_reason = "no_workers"
            for item in self.executor.cancel_all(wait_s=self.spec.server.stop_timeout + 30):
                self._tell(study, item)
            raise StudyError(str(exc)) from exc
        except KeyboardInterrupt:
            self._stop_now(study)
            raise

    def _stop_now(self, study: optuna.Study) -> None:
        """Second Ctrl-C: kill the local servers and the workers, without waiting."""

        self._stop_reason = "interrupted"
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # this must not be cut short
        try:
            for item in self.kill_running_now():
                try:
                    self._tell(study, item)
                except StorageUnavailable:
                    # Left RUNNING: resume marks it interrupted and re-runs it.
                    logger.warning("could not record trial %s", item.request.get("number"))
        finally:
            signal.signal(signal.SIGINT, previous)

    def kill_running_now(self) -> list[Finished]:
        """Second Ctrl-C: SIGKILL the servers of every running job (trial, reference or
        confirmation re-run: each request names its folder, where its pid file is) and
        abandon the workers, without waiting; the abandoned jobs, failed ``interrupted``.
        SIGINT is ignored meanwhile: this must not be cut short."""

        self._stop_reason = "interrupted"
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            killed = recovery.kill_servers_now(
                [Path(r["trial_dir"]) / "server.pid" for r in self.executor.running()])
            items = self.executor.abandon_all("interrupted", "stopped at once by a second Ctrl-C")
        finally:
            signal.signal(signal.SIGINT, previous)
        self.progress(f"[interrupt] stopped now: killed {len(killed)} server(s)")
        return items

    def _next_values(self, study: optuna.Study, trial: Trial) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for param in space.ordered_parameters(self.spec):
            if not space.is_active(param, values):
                continue
            values[param.name] = suggest(trial, param)
        return values

    def _start_next(self, study: optuna.Study, rejected_in_a_row: int) -> int | None:
        if self.spec.sampler.name == "grid":
            self._enqueue_grid_point(study)
        elif rejected_in_a_row >= MAX_REJECTED_IN_A_ROW:
            self._enqueue_unseen_random(study)
        trial = study.ask()
        values = self._next_values(study, trial)
        trial.set_user_attr("values", values)
        attempt = int(trial.user_attrs.get("attempt", 1))
        reason = space.forbidden_reason(self.spec, values)
        if reason is not None:
            trial.set_user_attr("kind", KIND_FORBIDDEN)
            trial.set_user_attr("failure", {"reason": "forbidden", "message": reason})
            self._tell_infeasible(study, trial, "forbidden")
            return None
        known = self._known_points(study)
        earlier = known.get(space.params_key(values))
        if earlier is not None and earlier.number != trial.number:
            self._tell_duplicate(study, trial, earlier)
            return None
        self._dispatch(study, trial, values, attempt)
        return trial.number

    def _tell_duplicate(self, study: optuna.Study, trial: Trial, earlier: FrozenTrial) -> None:
        trial.set_user_attr("kind", KIND_DUPLICATE)
        trial.set_user_attr("duplicate_of", earlier.number)
        if earlier.state == TrialState.COMPLETE and earlier.values is not None:
            for key, value in earlier.constraints.items():
                trial.set_constraint(key, value)
            study.tell(trial, earlier.values)
        else:
            # Still running or failed: nothing new to learn by running it again.
            trial.set_user_attr("failure", {
                "reason": "duplicate", "message": f"same parameters as trial {earlier.number}"})
            self._tell_infeasible(study, trial, "failed_before")

    def _tell_infeasible(self, study: optuna.Study, trial: Trial, constraint: str) -> None:
        """Tell a point that must not run as infeasible, so the sampler stops proposing it.

        TPE and NSGA-II learn nothing from FAIL trials and would keep proposing a forbidden
        or crashing point; a COMPLETE trial with the worst values seen so far and a
        violated constraint teaches them. Such trials are marked (kind != run) and never
        reach the front, the budget or the reports' measurements.
        """

        worst = self._worst_values(study)
        if worst is None:
            study.tell(trial, state=TrialState.FAIL)
            return
        trial.set_constraint(constraint, 1.0)
        trial.set_user_attr("placeholder_values", True)
        study.tell(trial, worst)

    def _worst_values(self, study: optuna.Study) -> list[float] | None:
        rows = [
            t.values for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if t.user_attrs.get("kind", KIND_RUN) == KIND_RUN and t.values is not None
        ]
        if not rows:
            return None
        return [
            min(col) if direction == "maximize" else max(col)
            for col, direction in zip(zip(*rows), self.directions)
        ]

    def _enqueue_unseen_random(self, study: optuna.Study) -> None:
        rng = random.Random(self.spec.sampler.seed * 7919 + len(study.trials))
        known = self._known_points(study)
        for _ in range(200):
            values = space.random_values(self.spec, rng)
            if space.params_key(values) not in known:
                study.enqueue_trial(values, user_attrs={"attempt": 1, "filled_in": True})
                return

    def _enqueue_grid_point(self, study: optuna.Study) -> None:
        if self._grid is None:
            self._grid = grid_points(self.spec)
            random.Random(self.spec.sampler.seed).shuffle(self._grid)
        known = self._known_points(study)
        waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        if waiting:
            return
        for values in self._grid:
            if space.params_key(values) not in known:
                study.enqueue_trial(values, user_attrs={"attempt": 1})
                return

    def trial_request(self, number: int, values: dict[str, Any], *, group: int, trial_dir: Path,
                      early_stop: dict[str, Any] | None) -> TrialRequest:
        """What a worker needs to run ``values`` on GPU group ``group`` (a trial, or a
        confirmation re-run of one), with the study's probe and reference."""

        port = self.spec.server.port + group
        # The study's shared torch.compile cache (execution.compile_cache_dir, expanded by
        # the CLI) is measurement environment: the server gets it, an export does not.
        command = trial_command(self.spec, values, port=port,
                                compile_cache_dir=self.spec.execution.compile_cache_dir)
        command = dataclasses.replace(command, argv=pinned(command.argv))
        ignore_eos = self.spec.load.workload.ignore_eos
        if ignore_eos == "auto":
            ignore_eos = command.asked.get("speculative_config.method") is None
        return TrialRequest(
            study=self.handle.name, number=number, values=values, asked=command.asked,
            argv=command.argv, env=command.launch_env, secret_env=list(self.spec.server.secret_env),
            host=self.spec.server.host,
            port=port, served_model_name=self.spec.server.served_model_name or self.spec.server.model,
            trial_dir=str(trial_dir.resolve()),
            startup_timeout_s=self.spec.server.startup_timeout,
            stop_timeout_s=self.spec.server.stop_timeout,
            deadline_s=self.spec.budget.trial_timeout,
            load=self.spec.load.model_dump(mode="json"),
            probe=self._probe_spec.model_dump(mode="json"),
            ignore_eos=bool(ignore_eos),
            reference=self._reference,
            early_stop=early_stop,
        )

    @property
    def interrupted(self) -> bool:
        return self._stop_reason == "interrupted"

    def _dispatch(self, study: optuna.Study, trial: Trial, values: dict[str, Any], attempt: int) -> None:
        group = self.executor.idle_groups()[0]
        request = self.trial_request(
            trial.number, values, group=group, trial_dir=self.handle.paths.trial_dir(trial.number),
            # execution.early_stop: false sends no plan, and a worker without one never stops.
            early_stop=(early_stop_plan(self.spec, study.get_trials(deepcopy=False))
                        if self.spec.execution.early_stop else None),
        )
        argv, env = request.argv, request.env
        trial.set_user_attr("kind", KIND_RUN)
        trial.set_user_attr("attempt", attempt)
        redact = tuple(n for n in env if is_secret_name(n))
        trial.set_user_attr("command", shell_line(RenderedCommand(argv, env), redact=redact))
        self._in_flight[trial.number] = trial
        self.executor.submit(group, request.model_dump(mode="json"),
                             deadline_s=self.spec.budget.trial_timeout + self.spec.server.stop_timeout + 15)
        label = "baseline" if trial.user_attrs.get("baseline") else values_text(values)
        self.progress(f"[trial {trial.number}] start on group {group}: {label}")

    # -- the reference ----------------------------------------------------------

    @property
    def reference_dir(self) -> Path:
        """The reference job's own files (command, server log, outcome)."""

        return self.handle.paths.reference_dir

    @property
    def reference_json(self) -> Path:
        return self.handle.paths.root / "reference.json"

    @property
    def reference_probe_json(self) -> Path:
        return self.handle.paths.root / "reference_probe.json"

    def prepare_reference(self) -> bool:
        """Have the study's reference before the first trial: the stored one when it still
        fits the study, else one recorded now. False when interrupted meanwhile.

        Every trial's probe is then compared with it, and its known-answer accuracy
        replaces the absolute ``min_accuracy`` bar for the trials (within a sample-size
        tolerance). Nothing to do when the probe or its reference layer is off.

        Raises:
            SpecError: a prompts file or ``probe.reference.values`` is invalid.
            StudyError: the reference could not be recorded or cannot be trusted.
        """

        if not self.spec.probe.enabled:
            return True
        # `tuner run` already made the files absolute against the study file; a relative
        # path left (a study created in code) means the current folder. Checked now either
        # way: a bad prompts file must stop the study before any server starts.
        probe = self._probe_spec = resolve_probe_files(self.spec.probe, Path.cwd())
        if not probe.reference.enabled:
            return True
        served = self.spec.server.served_model_name or self.spec.server.model
        sources = load_reference_sources(probe)
        reference = self._stored_reference(probe, sources, served)
        if reference is None:
            reference = self._record_reference()
            if reference is None:
                return False
        self._reference = reference.model_dump(mode="json")
        self._probe_spec = with_reference_accuracy(probe, reference)
        return True

    def _stored_reference(self, probe: ProbeSpec, sources: list[Any], served: str) -> Reference | None:
        """reference.json when it exists and can judge this study's trials (resume)."""

        try:
            stored = Reference.model_validate_json(self.reference_json.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            self.progress(f"[reference] {self.reference_json} is unreadable ({type(exc).__name__}); "
                          "recording a new reference")
            return None
        why = stored.mismatch(probe, sources, served)
        if why is not None:
            self.progress(f"[reference] the stored reference cannot be used ({why}); recording a new one")
            return None
        accuracy = stored.known_answers_accuracy
        self.progress(f"[reference] reusing {self.reference_json} ({len(stored.prompts)} prompts"
                      + (f", known-answer accuracy {accuracy:.2f}" if accuracy is not None else "") + ")")
        return stored

    def _record_reference(self) -> Reference | None:
        """Run the reference job on a GPU group and keep its result; None when interrupted."""

        stop_grace = self.spec.server.stop_timeout
        waiting_since = time.monotonic()
        try:
            while not self.executor.idle_groups():
                if self._stop_reason == "interrupted":
                    return None
                if time.monotonic() - waiting_since > WORKER_WAIT_S:
                    raise StudyError(
                        f"no GPU group became available in {WORKER_WAIT_S:.0f}s to record the reference; "
                        f"continue with `tuner resume {self.handle.name}` when the cluster is back")
                self.executor.poll(0.5, stop_grace_s=stop_grace)
            group = self.executor.idle_groups()[0]
            port = self.spec.server.port + group
            config = reference_configuration(
                self.spec, port=port, compile_cache_dir=self.spec.execution.compile_cache_dir)
            config = dataclasses.replace(config, argv=pinned(config.argv))
            served = self.spec.server.served_model_name or self.spec.server.model
            # The reference server is judged by the absolute bar (min_accuracy): a
            # reference accuracy, even one set in the study file, is what it establishes.
            probe = self._probe_spec.model_copy(update={"reference_accuracy": None})
            request = TrialRequest(
                study=self.handle.name, number=REFERENCE_JOB, kind="reference", values=config.values,
                asked=config.asked, argv=config.argv, env=config.env,
                secret_env=list(self.spec.server.secret_env), host=self.spec.server.host, port=port,
                served_model_name=served, trial_dir=str(self.reference_dir.resolve()),
                startup_timeout_s=self.spec.server.startup_timeout, stop_timeout_s=stop_grace,
                deadline_s=self.spec.budget.trial_timeout, load=self.spec.load.model_dump(mode="json"),
                probe=probe.model_dump(mode="json"), ignore_eos=True,
            )
            self.progress(f"[reference] recording the study's reference on group {group}: {config.label}")
            self.executor.submit(group, request.model_dump(mode="json"), method="run_reference",
                                 deadline_s=self.spec.budget.trial_timeout + stop_grace + 15)
            while True:
                if self._stop_reason == "interrupted":
                    self.executor.cancel_all(wait_s=stop_grace + 30)
                    return None
                for item in self.executor.poll(0.5, stop_grace_s=stop_grace):
                    return self._keep_reference(item, config)
        except NoWorkersLeft as exc:
            raise StudyError(str(exc)) from exc
        except KeyboardInterrupt:
            # Second Ctrl-C: the reference server goes now, not after its grace.
            self.kill_running_now()
            raise

    def _keep_reference(self, item: Finished, config: ReferenceConfiguration) -> Reference | None:
        """Save what the reference job returned; the reference when it can be trusted.

        reference_probe.json is written whatever the verdict (it is the evidence);
        reference.json only for a trusted reference, so resume never reuses a bad one.
        """

        log = self.reference_dir / "server.log"
        if item.result is None:
            if item.error == "interrupted":
                return None
            raise StudyError(f"recording the reference failed ({item.error}): {item.message}. "
                             f"`tuner resume {self.handle.name}` records it again")
        outcome = TrialOutcome.model_validate(item.result["outcome"])
        if outcome.status == "failed":
            if outcome.reason == "interrupted":
                return None
            raise StudyError(
                f"the reference configuration ({config.label}) failed in phase {outcome.phase} "
                f"({outcome.reason}): {outcome.message}. Its server log is {log}; "
                f"`tuner resume {self.handle.name}` records it again")
        problem = item.result.get("problem")
        raw = item.result.get("reference")
        reference = None if raw is None else Reference.model_validate(raw).model_copy(
            update={"label": config.label})
        self._write_reference_file(self.reference_probe_json, {
            "trusted": problem is None,
            "problem": problem,
            "label": config.label,
            "values": config.values,
            "command": shell_line(RenderedCommand(config.argv, config.env),
                                  redact=tuple(n for n in config.env if is_secret_name(n))),
            "startup_s": outcome.startup_s,
            "probe_s": outcome.probe_s,
            "record_seconds": None if reference is None else reference.record_seconds,
            "known_answers": item.result.get("known_answers"),
            "self_check": item.result.get("self_check"),
            "reference": None if problem is None else raw,  # kept only when refused
        })
        if problem is not None or reference is None:
            raise StudyError(
                f"{problem or 'the reference job returned no reference'}.\nComparing trials with a "
                f"broken reference proves nothing, so the study stops. Details: {self.reference_probe_json}, "
                f"server log {log}")
        self._write_reference_file(self.reference_json, reference.model_dump(mode="json"))
        accuracy = reference.known_answers_accuracy
        self.progress(
            f"[reference] recorded {len(reference.prompts)} prompts in {outcome.trial_s or 0:.1f}s "
            f"(known-answer accuracy {accuracy if accuracy is None else round(accuracy, 2)}, "
            f"agrees with itself); every trial is compared with it")
        return reference

    def _write_reference_file(self, path: Path, data: Any) -> None:
        try:
            atomic_write_json(path, data)
        except ArtifactWriteError as err:
            # Without its files the reference could not be reused or inspected: stop here,
            # resumably, rather than judge trials by a record that exists nowhere.
            raise StudyError(f"could not write {path} ({err.reason}): {err}; free space, then "
                             f"`tuner resume {self.handle.name}` records the reference again") from err

    # -- results -----------------------------------------------------------------

    def _tell(self, study: optuna.Study, item: Finished) -> None:
        number = int(item.request["number"])
        trial = self._in_flight.pop(number, None)
        if trial is None:
            return
        if item.result is None:
            # A cancelled trial may have finished measuring just before the cancel reached
            # it (during the server stop): its outcome file then holds a real result.
            written = recovery.read_outcome(self.handle.paths, number)
            if written is not None and written.status == "completed":
                outcome = written
            else:
                outcome = TrialOutcome(number=number, status="failed", reason=item.error, message=item.message,
                                       detected_unix=time.time(), finished_unix=time.time())
                recovery.write_driver_outcome(self.handle.paths, outcome)
        else:
            outcome = TrialOutcome.model_validate(item.result)
        self._record(study, trial, outcome, retry_if_interrupted=True)

    def _note_full_trials(self, study: optuna.Study, outcome: TrialOutcome | None = None) -> None:
        """Keep the durations of trials that ran their whole sweep (all of the study's on
        the first call, then one outcome at a time) and the confirmation reserve from them."""

        if not (self.timeout_s and self.spec.confirm.candidates):
            return
        if outcome is None:
            for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
                attrs = t.user_attrs.get("outcome") or {}
                if t.user_attrs.get("kind") == KIND_RUN and attrs.get("trial_s") and not attrs.get("early_stop"):
                    self._full_trial_s.append(float(attrs["trial_s"]))
        elif outcome.status == "completed" and outcome.trial_s and not outcome.early_stop:
            self._full_trial_s.append(outcome.trial_s)
        self._confirm_reserve_s = reserve_seconds(
            self._full_trial_s, candidates=self.spec.confirm.candidates,
            repeats=self.spec.confirm.repeats, groups=self.executor.n_groups)

    def _record(self, study: optuna.Study, trial: Trial, outcome: TrialOutcome, *,
                retry_if_interrupted: bool) -> None:
        number = trial.number
        self._note_full_trials(study, outcome)
        trial.set_user_attr("outcome", outcome_attrs(outcome))
        # What to tell is scoring.told_for's (shared with tuner.study.folder, which rebuilds a
        # study from its trial files); what to say and do next is the orchestrator's.
        told = told_for(self.spec, outcome, lambda: self._worst_values(study))
        for key, value in told.attrs.items():
            trial.set_user_attr(key, value)
        for key, value in told.constraints.items():
            trial.set_constraint(key, value)
        if told.values is None:
            study.tell(number, state=TrialState.FAIL)
        else:
            study.tell(number, told.values)
        if told.how == "failed":
            self.progress(f"[trial {number}] FAILED ({outcome.reason}) {outcome.message or ''}".rstrip())
            if outcome.reason == "interrupted" and retry_if_interrupted:
                frozen = study._storage.get_trial(trial._trial_id)
                self._retry(study, frozen, int(frozen.user_attrs.get("attempt", 1)))
            self.write_pareto(study)
        elif told.how == "stopped":
            # Stopped early by its worker (study.early_stop): infeasible, never on the front.
            self.write_pareto(study)
            self.progress(f"[trial {number}] {stop_text(outcome)} after {outcome.trial_s or 0:.1f}s")
        elif told.how == "no_measurement":
            self.progress(f"[trial {number}] FAILED (no_measurement) for {', '.join(told.missing)}")
            self.write_pareto(study)
        else:
            self.write_pareto(study)
            self.progress(f"[trial {number}] done in {outcome.trial_s or 0:.1f}s: " + result_text(
                self.labels, told.values, outcome, told.constraints) + f" | front: {len(self._front(study))}")

    # -- confirmation re-runs ----------------------------------------------------

    def confirm_front(self, study: optuna.Study) -> None:
        """Re-run the front's ``confirm.candidates`` most likely picks once the budget is
        spent (``tuner.confirming``). A point confirmed earlier (a resumed study) is not
        re-run; a wall-clock stop (``budget.timeout``) skips this, as does an interrupt."""

        cfg = self.spec.confirm
        if cfg.candidates <= 0:
            return
        points = record_points(read_records(study), self.labels)
        chosen = choose_candidates(points, self.directions, cfg.candidates)
        done = self.handle.paths.confirmations()
        todo = [n for n in chosen if n not in done]
        if not todo:
            return
        self.progress(f"[confirm] re-running {len(todo)} front point(s) {todo} "
                      f"{cfg.repeats}x each on a fresh server (tolerance {cfg.tolerance:.0%})")
        confirm_trials(self, study, todo, repeats=cfg.repeats, tolerance=cfg.tolerance)

    def _front(self, study: optuna.Study) -> list[Any]:
        records = read_records(study)
        return pareto_front(record_points(records, self.labels), self.directions)

    def write_pareto(self, study: optuna.Study) -> None:
        """Rewrite pareto.json atomically; on a full disk the previous version stays."""

        payload = pareto_payload(self.handle.name, read_records(study), self.labels, self.directions)
        confirmations = self.handle.paths.confirmations()
        for entry in payload["front"]:
            found = confirmations.get(entry["trial"])
            if found is not None:
                entry["confirmation"] = confirmation_brief(found)
        try:
            atomic_write_json(self.handle.paths.pareto_json, payload)
        except ArtifactWriteError as err:
            self.progress(f"[warning] pareto.json not updated ({err.reason}): {err}; "
                          "the previous version is intact and is rewritten after the next trial")
