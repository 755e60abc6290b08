"""The ask -> run -> tell loop over an Optuna study, with resume and a live Pareto file.

``StudyLoop`` is the loop: ask Optuna for a point, let the policy (``tuner.study.policy``)
screen it, hand a ``TrialRequest`` to an ``Executor``, and tell what comes back as the
policy says. It writes no files and installs no signal handlers, so the simulator's
in-process executor (``tuner.sim.executor``) drives exactly this loop in the benchmarks and
the fast tests. ``Orchestrator`` is a study run on a real executor: the Optuna storage,
reconciliation after a kill, the reference, Ctrl-C, pareto.json after every trial, the
confirmation re-runs at the end, and a storage that stops answering.

Stopping: the first Ctrl-C or SIGTERM cancels the running trials (their servers are
stopped), marks them interrupted (re-run on resume) and returns; a second one kills the
local servers and the workers at once. A storage that keeps failing (see
tuner.store.handle) stops the study the same way, resumably; a full disk fails the trial
that could not write its files, and a pareto.json that cannot be rewritten keeps its
previous, complete content.
"""

from __future__ import annotations

import logging
import os
import signal
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import Trial, TrialState

from tuner.engine import recovery
from tuner.engine.confirming import confirm_trials
from tuner.engine.execution import Executor, Finished, JobHost, NoWorkersLeft
from tuner.engine.pareto_file import write_pareto_file
from tuner.engine.referencing import WORKER_WAIT_S, pinned, prepare_reference, study_probe
from tuner.engine.samplers import make_sampler, suggest
from tuner.engine.tie_runs import separate_ties
from tuner.errors import StorageUnavailable, StudyError, Terminated
from tuner.probe.quality_items import QualityReference
from tuner.probe.record import Reference
from tuner.secrets import Redactor, api_key_ref, known_values
from tuner.store.handle import StudyHandle, check_storage_covers_folder, make_storage
from tuner.store.records import RecordReader, to_record
from tuner.study import policy, space, stopping
from tuner.study.between_starts import StudyNoise
from tuner.study.confirmation import choose_candidates, reserve_seconds
from tuner.study.outcome import TrialOutcome, TrialRequest
from tuner.study.pareto import pareto_front
from tuner.study.quality_plan import quality_plan
from tuner.study.scoring import outcome_summary, result_text, stop_text, values_text
from tuner.study.space import trial_command, trial_ignore_eos
from tuner.study.spec import StudySpec
from tuner.study.study_noise import noise_of_study
from tuner.study.sweep_guard import SweepPlan
from tuner.study.trials import KIND_RUN, TrialRecord, record_points
from tuner.vllm.compile_cache import study_cache_root
from tuner.vllm.knobs import RenderedCommand, shell_line

__all__ = ["StudyLoop", "Orchestrator", "RunSummary", "restore_signals"]

logger = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def restore_signals(previous: dict[signal.Signals, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


@dataclass
class RunSummary:
    finished_runs: int
    target: int
    stopped_because: str
    elapsed_s: float


class StudyLoop:
    """Ask, screen, run, tell until the budget, the clock or the space runs out.

    ``trials_root``: where each trial's folder is (``<root>/NNNN``; the worker creates it).
    ``clock``: monotonic seconds (the simulated executor's own clock in simulations).
    """

    def __init__(self, spec: StudySpec, name: str, executor: Executor, *, trials_root: Path,
                 n_trials: int | None = None, timeout_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 progress: Callable[[str], None] = lambda line: None, run: str = "") -> None:
        self.spec = spec
        self.name = name
        self.run_id = run
        self.executor = executor
        self.trials_root = trials_root
        self.n_trials = n_trials or spec.budget.n_trials
        self.timeout_s = timeout_s if timeout_s is not None else spec.budget.timeout
        self.clock = clock
        self.progress = progress
        self.labels = [o.label for o in spec.objectives]
        self.directions = [o.direction for o in spec.objectives]
        self.stop_reason: str | None = None
        # The study as plain records, read before and after every trial (the policy's input).
        self.records = RecordReader()
        self._grid = policy.grid_order(spec) if spec.sampler.name == "grid" else None
        self._in_flight: dict[int, Trial] = {}
        # With budget.timeout and confirm.candidates, new trials stop early enough to leave
        # time for the confirmation re-runs (study.confirmation.reserve_seconds), estimated
        # from the trials that ran their whole sweep.
        self._full_trial_s: list[float] = []
        self.confirm_reserve_s = 0.0
        # What every trial's probe is judged with (tuner.engine.referencing.prepare_reference).
        self.probe = study_probe(spec, spec.probe)
        self.reference: Reference | None = None
        self.quality_reference: QualityReference | None = None   # its answers to the quality items

    @property
    def interrupted(self) -> bool:
        return self.stop_reason == "interrupted"

    def confirmations(self) -> dict[int, dict[str, Any]]:
        """The study's confirmation and tie re-runs (verdicts as JSON, by trial)."""
        return {}

    def study_noise(self, records: list[TrialRecord]) -> StudyNoise:
        """The study's between-start noise as it stands (tuner.study.between_starts)."""
        return noise_of_study(records, self.confirmations(), self.labels, override=self.spec.load.noise_floor)

    # -- what the study run adds (Orchestrator) --------------------------------------

    def recorded(self, study: optuna.Study, records: list[TrialRecord]) -> None:
        """After each told trial (``records``: the study as it is now)."""

    def missing_result(self, number: int, item: Finished) -> TrialOutcome:
        """The outcome of a trial its worker returned none for (cancelled, lost)."""
        now = time.time()
        return TrialOutcome(number=number, status="failed", reason=item.error, message=item.message,
                            detected_unix=now, finished_unix=now)

    # -- the loop ------------------------------------------------------------------------

    def enqueue_first_points(self, study: optuna.Study) -> None:
        parallel = max(1, self.executor.n_groups)
        for point in policy.first_points(self.spec, self.records(study), parallel=parallel):
            study.enqueue_trial(point.values, user_attrs=point.attrs)

    def run_loop(self, study: optuna.Study, *, elapsed_before: float = 0.0) -> str:
        """Run trials until a stop reason; the reason (``budget``, ``timeout``, ``exhausted``,
        ``interrupted``). Raises StudyError when no GPU group is left or comes back."""

        began = self.clock()
        rejected_in_a_row = 0
        waiting_since: float | None = None
        self.note_full_trials(self.records(study))
        try:
            while True:
                if self.interrupted:
                    self.cancel_running(study)
                    return "interrupted"
                elapsed = elapsed_before + self.clock() - began
                done_runs = policy.finished_runs(self.records(study))
                in_flight = len(self.executor.running())
                self._check_time(elapsed)
                can_start = stopping.may_start(self.stop_reason, done_runs, in_flight, self.n_trials)
                while can_start and self.executor.idle_groups():
                    if self.start_next(study, rejected_in_a_row) is None:
                        rejected_in_a_row += 1
                        if rejected_in_a_row > policy.EXHAUSTED_AFTER:
                            self.stop_reason = "exhausted"
                            self.progress("[budget] every allowed point of the space has been measured")
                            break
                        continue
                    rejected_in_a_row = 0
                    in_flight += 1
                    can_start = stopping.may_start(self.stop_reason, done_runs, in_flight, self.n_trials)
                if not self.executor.running():
                    if not (can_start and self.executor.pending_groups()):
                        self.stop_reason = self.stop_reason or "budget"
                        return self.stop_reason
                    # Every group's worker is starting or waiting for Ray to place it.
                    waiting_since = waiting_since or self.clock()
                    if self.clock() - waiting_since > WORKER_WAIT_S:
                        raise StudyError(
                            f"no GPU group has been available for {WORKER_WAIT_S:.0f}s (the Ray cluster "
                            f"lost nodes?); continue with `tuner resume {self.name}` when it is back")
                else:
                    waiting_since = None
                told = self.executor.poll(0.5, stop_grace_s=self.spec.server.stop_timeout)
                for item in told:
                    self.tell(study, item)
                if told:
                    # Kept current with every trial, so a run killed outright (kill -9, a
                    # machine taken back) leaves its time counted for status, report and the
                    # --timeout budget of a resume, not only a run that ends normally.
                    study.set_user_attr("elapsed_s", elapsed_before + self.clock() - began)
        except NoWorkersLeft as exc:
            self.stop_reason = "no_workers"
            self.cancel_running(study)
            raise StudyError(str(exc)) from exc

    def _check_time(self, elapsed: float) -> None:
        if self.stop_reason is None and stopping.out_of_time(elapsed, self.timeout_s, self.confirm_reserve_s):
            self.stop_reason = "timeout"
            self.progress(stopping.out_of_time_line(elapsed, self.timeout_s, self.confirm_reserve_s))

    def cancel_running(self, study: optuna.Study) -> None:
        for item in self.executor.cancel_all(wait_s=self.spec.server.stop_timeout + 30):
            self.tell(study, item)

    def start_next(self, study: optuna.Study, rejected_in_a_row: int) -> int | None:
        """Ask for the next point and start it on an idle group; None when the policy told
        it without running (forbidden, duplicate)."""

        if self._grid is not None or rejected_in_a_row >= policy.MAX_REJECTED_IN_A_ROW:
            extra = policy.fill_in(self.spec, self.records(study), rejected_in_a_row=rejected_in_a_row,
                                   grid=self._grid)
            if extra is not None:
                study.enqueue_trial(extra.values, user_attrs=extra.attrs)
        trial = study.ask()
        values: dict[str, Any] = {}
        for param in space.ordered_parameters(self.spec):
            if space.is_active(param, values):
                values[param.name] = suggest(trial, param)
        trial.set_user_attr("values", values)
        records = self.records(study)
        told = policy.screen(self.spec, values, trial.number, records, self.labels, self.directions)
        if told is not None:
            self._apply(study, trial, told)
            return None
        self._dispatch(trial, values, records)
        return trial.number

    def _dispatch(self, trial: Trial, values: dict[str, Any], records: list[TrialRecord]) -> None:
        if (self.trials_root / f"{trial.number:04d}" / "outcome.json").exists():
            # The last line of defence (Orchestrator.open_study checks the whole folder):
            # a finished trial's files are never written again.
            raise StudyError(f"trial {trial.number} already has finished files in {self.trials_root}; "
                             "the storage does not match the study folder, so the study stops here")
        group = self.executor.idle_groups()[0]
        # A fresh start of the baseline for the study's noise runs its whole sweep: its values
        # are what the noise is measured from.
        stops = self.spec.execution.early_stop and not trial.user_attrs.get("noise_start")
        request = self.trial_request(
            trial.number, values, group=group, trial_dir=self.trials_root / f"{trial.number:04d}",
            # execution.early_stop: false sends no plan, and a worker without one never stops.
            early_stop=policy.early_stop_plan(self.spec, records) if stops else None,
            noise_floor=self.study_noise(records).floor())
        trial.set_user_attr("kind", KIND_RUN)
        trial.set_user_attr("attempt", int(trial.user_attrs.get("attempt", 1)))
        # The request's argv and env hold the secrets' values (the server needs them); the
        # storage gets them as references.
        redactor = Redactor(request.secrets)
        trial.set_user_attr("command", shell_line(RenderedCommand(redactor.data(request.argv),
                                                                  redactor.data(request.env))))
        self._in_flight[trial.number] = trial
        self.executor.submit(group, request.model_dump(mode="json"),
                             deadline_s=self.spec.budget.trial_timeout + self.spec.server.stop_timeout + 15)
        label = ("baseline" if trial.user_attrs.get("baseline") else
                 f"baseline, fresh start {trial.user_attrs['noise_start']} for the study's noise"
                 if trial.user_attrs.get("noise_start") else values_text(values))
        self.progress(f"[trial {trial.number}] start on group {group}: {label}")

    def trial_request(self, number: int, values: dict[str, Any], *, group: int, trial_dir: Path,
                      early_stop: SweepPlan | None, noise_floor: float | None = None) -> TrialRequest:
        """What a worker needs to run ``values`` on GPU group ``group`` (a trial, or a
        confirmation re-run of one), with the study's probe and reference. ``noise_floor``:
        the between-start CV its intervals and early stops use (the study's, when it set one)."""

        spec = self.spec
        load = spec.load if spec.load.noise_floor is not None else spec.load.model_copy(
            update={"noise_floor": noise_floor})
        port = spec.server.port + group
        # The study's shared torch.compile cache (execution.compile_cache_dir, expanded by
        # the CLI) is measurement environment: the server gets it, an export does not.
        command = trial_command(spec, values, port=port, compile_cache_dir=spec.execution.compile_cache_dir,
                                running=True)
        secrets = known_values(spec.server)
        return TrialRequest(
            # asked is what verification compares with the server's log, which the worker
            # writes with secrets as references: so asked holds them as references too.
            study=self.name, run=self.run_id, number=number, values=values, asked=Redactor(secrets).data(command.asked),
            argv=pinned(command.argv), env=command.launch_env, secret_env=list(spec.server.secret_env),
            secrets=secrets, api_key_ref=api_key_ref(spec.server), host=spec.server.host,
            port=port, served_model_name=spec.server.served_model_name or spec.server.model,
            trial_dir=str(trial_dir.resolve()), startup_timeout_s=spec.server.startup_timeout,
            stop_timeout_s=spec.server.stop_timeout, gpu_free_timeout_s=spec.execution.gpu_free_timeout,
            deadline_s=spec.budget.trial_timeout,
            load=load, probe=self.probe, holding=spec.holding, idle_draw=spec.names_energy,
            ignore_eos=trial_ignore_eos(spec, command.asked), reference=self.reference, early_stop=early_stop,
            slo=spec.slo, search_max_rate=spec.searches_max_rate, prestart=spec.execution.startup.prestart,
            searched_env=spec.searched_env, quality=quality_plan(spec, values, self.quality_reference))

    # -- telling -------------------------------------------------------------------------

    def tell(self, study: optuna.Study, item: Finished) -> None:
        """Record a trial that ended (``Finished`` from the executor)."""
        number = int(item.request["number"])
        trial = self._in_flight.pop(number, None)
        if trial is None:
            return
        if item.result is None:
            outcome = self.missing_result(number, item)
        else:
            outcome = TrialOutcome.model_validate(item.result)
        self.record(study, trial, outcome, retry_if_interrupted=True)
        if trial.user_attrs.get("noise_start") and self.spec.load.noise_floor is None:
            for line in self.study_noise(self.records(study)).lines():
                self.progress(f"[noise] {line}")

    def _apply(self, study: optuna.Study, trial: Trial, told: policy.Told) -> None:
        for key, value in told.user_attrs().items():
            trial.set_user_attr(key, value)
        trial.set_user_attr("verdict", told.verdict)
        for key, value in told.constraints.items():
            trial.set_constraint(key, value)
        if told.values is None:
            study.tell(trial.number, state=TrialState.FAIL)
        else:
            study.tell(trial.number, told.values)

    def note_full_trials(self, records: list[TrialRecord], outcome: TrialOutcome | None = None) -> None:
        """Keep the durations of trials that ran their whole sweep (all of the study's on
        the first call, then one outcome at a time) and the confirmation reserve from them."""

        if not (self.timeout_s and self.spec.confirm.candidates):
            return
        if outcome is None:
            self._full_trial_s = policy.full_trial_seconds(records)
        elif outcome.status == "completed" and outcome.trial_s and not outcome.early_stop:
            self._full_trial_s.append(outcome.trial_s)
        self.confirm_reserve_s = reserve_seconds(
            self._full_trial_s, candidates=self.spec.confirm.candidates,
            repeats=self.spec.confirm.repeats, groups=self.executor.n_groups)

    def record(self, study: optuna.Study, trial: Trial, outcome: TrialOutcome, *,
               retry_if_interrupted: bool) -> None:
        """Tell ``outcome`` as the policy says (``policy.told_for``), then say what it was."""

        number = trial.number
        self.note_full_trials([], outcome)
        trial.set_user_attr("outcome", outcome_summary(outcome).as_attr())
        told = policy.told_for(self.spec, outcome,
                               lambda: policy.worst_values(self.records(study), self.labels, self.directions))
        self._apply(study, trial, told)
        records = self.records(study)
        if told.how == "failed":
            self.progress(f"[trial {number}] FAILED ({outcome.reason}) {outcome.message or ''}".rstrip())
            if outcome.reason == "interrupted" and retry_if_interrupted:
                self._retry(study, next(r for r in records if r.number == number))
        elif told.how == "stopped":
            # Stopped early by its worker (study.early_stop): infeasible, never on the front.
            self.progress(f"[trial {number}] {stop_text(outcome)} after {outcome.trial_s or 0:.1f}s")
        elif told.how == "no_measurement":
            self.progress(f"[trial {number}] FAILED (no_measurement) for {', '.join(told.missing)}")
        elif told.how == "load_errors":
            self.progress(f"[trial {number}] FAILED (load_errors) {told.failure.message if told.failure else ''}")
        else:
            front = pareto_front(record_points(records, self.labels), self.directions)
            self.progress(f"[trial {number}] done in {outcome.trial_s or 0:.1f}s: " + result_text(
                self.labels, list(told.values or []), outcome, told.constraints) + f" | front: {len(front)}")
        self.recorded(study, records)

    def _retry(self, study: optuna.Study, trial: TrialRecord) -> None:
        again = policy.retry(trial, self.spec.budget.max_retries)
        if again is None:
            return
        study.enqueue_trial(again.values, user_attrs=again.attrs, skip_if_exists=False)
        self.progress(f"[retry] trial {trial.number} will be re-run (attempt {again.attrs['attempt']})")


class Orchestrator(StudyLoop):
    """A study run: the loop on a real executor, with the study's storage and folder."""

    def __init__(self, handle: StudyHandle, executor: Executor, *, n_trials: int | None = None,
                 timeout_s: float | None = None, progress: Callable[[str], None] = lambda line: None) -> None:
        # The study's own torch.compile cache unless the study file or this environment chose
        # another (compile_cache.study_cache_root): resolved once, here, where the study's
        # folder is known; every trial, the reference and the confirmation re-runs use it.
        root = study_cache_root(handle.spec.execution.compile_cache_dir, str(handle.paths.root.resolve()),
                                os.environ)
        spec = handle.spec.model_copy(update={"execution": handle.spec.execution.model_copy(
            update={"compile_cache_dir": root})})
        # A new id for every run: what this run's servers are tagged with (worker.server_tag).
        super().__init__(spec, handle.name, executor, trials_root=handle.paths.root / "trials",
                         n_trials=n_trials, timeout_s=timeout_s, progress=progress,
                         run=uuid.uuid4().hex[:12])
        self.handle = handle
        self._interrupts = 0
        self.stopped_by: str | None = None   # "SIGINT" (Ctrl-C) or "SIGTERM", once one came

    # -- setup ---------------------------------------------------------------------------

    def open_study(self) -> optuna.Study:
        study = optuna.create_study(
            study_name=self.handle.name,
            storage=make_storage(self.handle.storage_url),
            directions=self.directions,
            sampler=make_sampler(self.spec, budget=self.n_trials),
            load_if_exists=True,
        )
        if not study.metric_names:
            study.set_metric_names(self.labels)
        # A storage behind the folder (lost, restored from a backup) would number the next
        # trials as finished ones and overwrite their files: refuse before anything starts.
        check_storage_covers_folder(study, self.handle.paths, self.handle.storage_url)
        return study

    def reconcile(self, study: optuna.Study) -> None:
        """Close the trials a killed run left RUNNING and stop the servers it left
        (``policy.resume`` decides each one)."""

        # Trials', confirmation re-runs' and the reference job's (StudyPaths.pid_files).
        recovery.stop_leftover_servers(self.handle.paths, self.spec.server.stop_timeout, self.progress)
        for frozen in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            record = to_record(frozen, self.labels)
            written = recovery.read_outcome(self.handle.paths, frozen.number) if record.kind == KIND_RUN else None
            decision = policy.resume(record, written, self.spec.budget.max_retries)
            trial = Trial(study, frozen._trial_id)
            if decision.record and written is not None:
                trial.set_user_attr("recovered", True)
                self.progress(f"[resume] trial {frozen.number} had finished before the stop: "
                              "recording its outcome")
                self.record(study, trial, written, retry_if_interrupted=False)
                continue
            trial.set_user_attr("failure", None if decision.failure is None else decision.failure.as_attr())
            study.tell(frozen.number, state=TrialState.FAIL)
            self.progress(f"[resume] trial {frozen.number} was interrupted: marked failed")
            if decision.retry is not None:
                study.enqueue_trial(decision.retry.values, user_attrs=decision.retry.attrs, skip_if_exists=False)
                self.progress(f"[retry] trial {frozen.number} will be re-run "
                              f"(attempt {decision.retry.attrs['attempt']})")

    def ensure_baseline(self, study: optuna.Study) -> None:
        self.enqueue_first_points(study)

    # -- the run -------------------------------------------------------------------------

    def run(self) -> RunSummary:
        try:
            study = self.open_study()
            self.reconcile(study)
            self.ensure_baseline(study)
        except StorageUnavailable as exc:
            raise self._storage_stop(exc) from exc
        began = time.monotonic()
        prior_elapsed = float(study.user_attrs.get("elapsed_s", 0.0))
        previous_handlers = self.catch_stop_signals()
        storage_ok = True
        try:
            if self.prepare_reference():
                self._loop_until_stopped(study, prior_elapsed)
                after = stopping.after_trials(self.stop_reason, prior_elapsed + time.monotonic() - began,
                                              self.timeout_s, self.spec.confirm.candidates)
                if after == "confirm":
                    self.confirm_front(study)
                    separate_ties(self.job_host(), study)
                elif after == "skip":
                    self.progress(f"[confirm] skipped: the wall-clock limit is reached; run "
                                  f"`tuner confirm {self.handle.name}` to re-run the front")
        except StorageUnavailable as exc:
            storage_ok = False
            self.stop_reason = "storage"
            # Nothing more can be recorded: stop the servers and leave the running trials
            # RUNNING in the storage; resume reconciles them from their outcome files.
            self.executor.cancel_all(wait_s=self.spec.server.stop_timeout + 30)
            raise self._storage_stop(exc) from exc
        finally:
            restore_signals(previous_handlers)
            if storage_ok:
                try:
                    study.set_user_attr("elapsed_s", prior_elapsed + time.monotonic() - began)
                    self.write_pareto(study)
                except StorageUnavailable:
                    logger.warning("could not record the elapsed time and front", exc_info=True)
        return RunSummary(policy.finished_runs(self.records(study)), self.n_trials, self.stop_reason or "budget",
                          prior_elapsed + time.monotonic() - began)

    def _loop_until_stopped(self, study: optuna.Study, prior_elapsed: float) -> None:
        try:
            self.run_loop(study, elapsed_before=prior_elapsed)
        except KeyboardInterrupt:
            self._stop_now(study)
            raise

    def _storage_stop(self, exc: StorageUnavailable) -> StorageUnavailable:
        return StorageUnavailable(
            f"{exc}.\nThe study stopped: finished trials are safe in the storage, running trials "
            f"were stopped. When the storage is back, continue with `tuner resume {self.handle.name}`."
        )

    def catch_stop_signals(self) -> dict[signal.Signals, Any]:
        """Ctrl-C and SIGTERM (`timeout`, systemd, Kubernetes) stop this run (``on_sigint``)
        from now on; the handlers they replace, for ``restore_signals``."""

        previous: dict[signal.Signals, Any] = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
        for sig in STOP_SIGNALS:
            signal.signal(sig, self.on_sigint)
        return previous

    def on_sigint(self, signum: int, frame: Any) -> None:
        self._interrupts += 1
        self.stopped_by = self.stopped_by or signal.Signals(signum).name
        if self._interrupts == 1:
            how = "SIGTERM" if signum == signal.SIGTERM else "Ctrl-C"
            self.progress(f"[interrupt] {how}: stopping: aborting running trials and stopping servers "
                          f"({how} again to stop at once)")
            self.stop_reason = "interrupted"
        else:
            raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt

    def _stop_now(self, study: optuna.Study) -> None:
        """Second Ctrl-C: kill the local servers and the workers, without waiting."""
        for item in self.kill_running_now():
            try:
                self.tell(study, item)
            except StorageUnavailable:
                # Left RUNNING: resume marks it interrupted and re-runs it.
                logger.warning("could not record trial %s", item.request.get("number"))

    def kill_running_now(self) -> list[Finished]:
        """Second Ctrl-C: SIGKILL the servers of every running job (trial, reference or
        confirmation re-run) and abandon the workers, without waiting; the abandoned jobs,
        failed ``interrupted``. Stop signals are ignored meanwhile: this must not be cut short."""

        self.stop_reason = "interrupted"
        previous: dict[signal.Signals, Any] = {sig: signal.signal(sig, signal.SIG_IGN) for sig in STOP_SIGNALS}
        try:
            how = "SIGTERM" if self.stopped_by == "SIGTERM" else "Ctrl-C"
            items = self.executor.kill_now("interrupted", f"stopped at once by a second {how}")
        finally:
            restore_signals(previous)
        self.progress(f"[interrupt] stopped now: abandoned {len(items)} job(s), their servers killed")
        return items

    def missing_result(self, number: int, item: Finished) -> TrialOutcome:
        # A cancelled trial may have finished measuring just before the cancel reached it
        # (during the server stop): its outcome file then holds a real result.
        written = recovery.read_outcome(self.handle.paths, number)
        if written is not None and written.status == "completed":
            return written
        outcome = super().missing_result(number, item)
        recovery.write_driver_outcome(self.handle.paths, outcome)
        return outcome

    # -- the reference and the confirmation re-runs ----------------------------------------

    def job_host(self) -> JobHost:
        """What the reference job and the confirmation re-runs need of this run."""
        def request(number: int, values: dict[str, Any], group: int, folder: Path) -> TrialRequest:
            return self.trial_request(number, values, group=group, trial_dir=folder, early_stop=None)

        return JobHost(self.spec, self.handle.name, self.handle.paths, self.executor, self.progress,
                       lambda: self.interrupted, self.kill_running_now, request, self.run_id)

    def prepare_reference(self) -> bool:
        """Have the study's reference before the first trial (``tuner.engine.referencing``); False
        when interrupted meanwhile."""

        prepared = prepare_reference(self.job_host(), time.monotonic)
        if prepared is None:
            return False
        self.probe, self.reference, self.quality_reference = prepared.probe, prepared.reference, prepared.quality
        return True

    def confirm_front(self, study: optuna.Study) -> None:
        """Re-run the front's ``confirm.candidates`` most likely picks once the budget is
        spent (``tuner.engine.confirming``). A point confirmed earlier (a resumed study) is not
        re-run; a wall-clock stop (``budget.timeout``) skips this, as does an interrupt."""

        cfg = self.spec.confirm
        if cfg.candidates <= 0:
            return
        chosen = choose_candidates(record_points(self.records(study), self.labels), self.directions,
                                   cfg.candidates)
        done = self.handle.paths.confirmations()
        todo = [n for n in chosen if n not in done]
        if not todo:
            return
        self.progress(f"[confirm] re-running {len(todo)} front point(s) {todo} "
                      f"{cfg.repeats}x each on a fresh server (tolerance "
                      f"{'from the study noise' if cfg.tolerance is None else format(cfg.tolerance, '.0%')})")
        confirm_trials(self.job_host(), study, todo, repeats=cfg.repeats, tolerance=cfg.tolerance)

    def confirmations(self) -> dict[int, dict[str, Any]]:
        return self.handle.paths.confirmations()

    # -- pareto.json ---------------------------------------------------------------------

    def recorded(self, study: optuna.Study, records: list[TrialRecord]) -> None:
        self._write_pareto(records)

    def write_pareto(self, study: optuna.Study) -> None:
        self._write_pareto(self.records(study))

    def _write_pareto(self, records: list[TrialRecord]) -> None:
        write_pareto_file(self.handle.paths, self.handle.name, records, self.labels, self.directions,
                          self.study_noise(records), self.progress)
