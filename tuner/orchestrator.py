"""The ask -> run -> tell loop over an Optuna study, with resume and a live Pareto file.

Trial outcomes reach the optimizer like this:
- completed, probe passed, configuration applied, limits met: objective values;
- completed but the probe failed / a knob was not applied / a limit was missed: the same
  values plus violated constraints, so the sampler learns the region is infeasible and the
  point never reaches the front;
- the server failed (start, crash, timeout): FAIL with a typed reason;
- a point that a forbidden rule rejects, or one already measured, never starts a server:
  forbidden -> FAIL, duplicate -> the earlier result is told again. Neither counts
  toward the budget.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, Trial, TrialState

from tuner.adapters import proctree
from tuner.adapters.artifacts import atomic_write_json, is_secret_name
from tuner.core import space
from tuner.core.outcome import TrialOutcome, TrialRequest
from tuner.core.pareto import pareto_front
from tuner.core.render import RenderedCommand, asked_settings, render_command, shell_line
from tuner.core.spec import ObjectiveSpec, StudySpec
from tuner.executor import Finished, RayExecutor
from tuner.records import KIND_DUPLICATE, KIND_FORBIDDEN, KIND_RUN, read_records, record_points
from tuner.study_store import StudyHandle, make_storage

__all__ = ["Orchestrator", "RunSummary", "make_sampler", "trial_command", "level_of"]

logger = logging.getLogger(__name__)

MAX_REJECTED_IN_A_ROW = 25  # then a random unseen point is enqueued instead


def make_sampler(spec: StudySpec) -> optuna.samplers.BaseSampler:
    s = spec.sampler
    if s.name == "tpe":
        kwargs: dict[str, Any] = {"seed": s.seed, "multivariate": True, "group": True,
                                  "constant_liar": True}
        if s.n_startup_trials is not None:
            kwargs["n_startup_trials"] = s.n_startup_trials
        return optuna.samplers.TPESampler(**kwargs)
    if s.name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=s.seed, population_size=max(4, min(20, spec.budget.n_trials // 3)))
    # "random" and "grid": grid points are enqueued by the orchestrator in shuffled order.
    return optuna.samplers.RandomSampler(seed=s.seed)


def level_of(spec: StudySpec, item: ObjectiveSpec | Any) -> int:
    levels = spec.load.concurrency
    if item.concurrency == "max":
        return max(levels)
    if item.concurrency == "min":
        return min(levels)
    return int(item.concurrency)


def metric_value(spec: StudySpec, outcome: TrialOutcome, item: Any) -> float | None:
    if item.metric in ("startup_s", "probe_s", "trial_s"):
        return getattr(outcome, item.metric)
    level = outcome.levels.get(str(level_of(spec, item)), {})
    value = level.get(item.metric)
    return None if value is None else float(value)


def trial_command(spec: StudySpec, values: dict[str, Any], *, port: int | None = None,
                  python: str | None = None) -> tuple[list[str], dict[str, str]]:
    rendered = render_command(spec.server, space.settings_for(spec, values),
                              python=python or sys.executable, port=port)
    argv = list(rendered.argv)
    if python is None and "/" in argv[0] and not os.path.isabs(argv[0]):
        # A relative interpreter path (e.g. .venv-vllm/bin/python) means "relative to where
        # the tuner was started"; workers may run elsewhere, so pin it now.
        argv[0] = os.path.abspath(argv[0])
    env = dict(rendered.env)
    if spec.verify.nccl_debug == "on" or (
        spec.verify.nccl_debug == "auto"
        and any(p.target.startswith("env:NCCL_") for p in spec.parameters)
    ):
        # Needed to read back the protocol/algorithm NCCL actually chose.
        env.setdefault("NCCL_DEBUG", "INFO")
        env.setdefault("NCCL_DEBUG_SUBSYS", "INIT,ENV")
    return argv, env


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
        """Close trials a killed run left RUNNING, retry them, and stop leftover servers."""

        self._stop_leftover_servers()
        for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            attempt = int(trial.user_attrs.get("attempt", 1))
            study._storage.set_trial_user_attr(trial._trial_id, "failure", {
                "reason": "interrupted", "message": "the tuner stopped during this trial", "phase": "unknown",
            })
            study.tell(trial.number, state=TrialState.FAIL)
            self.progress(f"[resume] trial {trial.number} was interrupted: marked failed")
            if trial.user_attrs.get("kind", KIND_RUN) == KIND_RUN:
                self._retry(study, trial, attempt)

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
        self.progress(f"[resume] trial {trial.number} will be re-run (attempt {attempt + 1})")

    def _stop_leftover_servers(self) -> None:
        host = socket.gethostname()
        for pid_file in self.handle.paths.pid_files():
            try:
                record = json.loads(pid_file.read_text())
            except (OSError, ValueError):
                continue
            if record.get("host") != host:
                self.progress(f"[resume] {pid_file} names a server on {record.get('host')}: stop it there")
                continue
            pgid = int(record["pgid"])
            members = proctree.group_members(pgid)
            # The group leader's command line must still be ours: pids are reused.
            leader = proctree.cmdline(pgid)
            if members and leader[: len(record["argv"])] == record["argv"][: len(leader)] and leader:
                proctree.signal_group(pgid, signal.SIGTERM)
                deadline = time.monotonic() + self.spec.server.stop_timeout
                while proctree.group_members(pgid) and time.monotonic() < deadline:
                    time.sleep(0.1)
                proctree.signal_group(pgid, signal.SIGKILL)
                self.progress(f"[resume] stopped a server left running by an earlier run (pgid {pgid})")
            pid_file.unlink(missing_ok=True)

    def ensure_baseline(self, study: optuna.Study) -> None:
        if any(t.user_attrs.get("baseline") for t in study.get_trials(deepcopy=False)):
            return
        study.enqueue_trial(space.baseline_values(self.spec), user_attrs={"baseline": True, "attempt": 1})

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
        study = self.open_study()
        self.reconcile(study)
        self.ensure_baseline(study)
        began = time.monotonic()
        prior_elapsed = float(study.user_attrs.get("elapsed_s", 0.0))
        previous_handler = signal.getsignal(signal.SIGINT)
        signal.signal(signal.SIGINT, self._on_sigint)
        try:
            self._loop(study, began, prior_elapsed)
        finally:
            signal.signal(signal.SIGINT, previous_handler)
            study.set_user_attr("elapsed_s", prior_elapsed + time.monotonic() - began)
            self.write_pareto(study)
        return RunSummary(self._finished_runs(study), self.n_trials, self._stop_reason or "budget",
                          prior_elapsed + time.monotonic() - began)

    def _on_sigint(self, signum: int, frame: Any) -> None:
        self._interrupts += 1
        if self._interrupts == 1:
            self.progress("[interrupt] stopping: aborting running trials and stopping servers "
                          "(Ctrl-C again to stop at once)")
            self._stop_reason = "interrupted"
        else:
            raise KeyboardInterrupt

    def _loop(self, study: optuna.Study, began: float, prior_elapsed: float) -> None:
        rejected_in_a_row = 0
        try:
            while True:
                if self._stop_reason == "interrupted":
                    for item in self.executor.cancel_all(wait_s=self.spec.server.stop_timeout + 30):
                        self._tell(study, item)
                    return
                elapsed = prior_elapsed + time.monotonic() - began
                done_runs = self._finished_runs(study)
                in_flight = len(self.executor.running())
                out_of_time = self.timeout_s is not None and elapsed >= self.timeout_s
                if out_of_time and self._stop_reason is None:
                    self._stop_reason = "timeout"
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
                    if self._stop_reason is None:
                        self._stop_reason = "budget"
                    return
                for item in self.executor.poll(0.5, stop_grace_s=self.spec.server.stop_timeout):
                    self._tell(study, item)
        except KeyboardInterrupt:
            self._stop_reason = "interrupted"
            for item in self.executor.cancel_all(wait_s=5):
                self._tell(study, item)
            raise

    def _next_values(self, study: optuna.Study, trial: Trial) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for param in space.ordered_parameters(self.spec):
            if not space.is_active(param, values):
                continue
            values[param.name] = _suggest(trial, param)
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
            self._grid = _grid_points(self.spec)
            random.Random(self.spec.sampler.seed).shuffle(self._grid)
        known = self._known_points(study)
        waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        if waiting:
            return
        for values in self._grid:
            if space.params_key(values) not in known:
                study.enqueue_trial(values, user_attrs={"attempt": 1})
                return

    def _dispatch(self, study: optuna.Study, trial: Trial, values: dict[str, Any], attempt: int) -> None:
        group = self.executor.idle_groups()[0]
        port = self.spec.server.port + group
        argv, env = trial_command(self.spec, values, port=port)
        settings = space.settings_for(self.spec, values)
        asked = asked_settings(self.spec.server, settings)
        trial_dir = self.handle.paths.trial_dir(trial.number)
        served = self.spec.server.served_model_name or self.spec.server.model
        ignore_eos = self.spec.load.workload.ignore_eos
        if ignore_eos == "auto":
            ignore_eos = asked.get("speculative_config.method") is None
        request = TrialRequest(
            study=self.handle.name, number=trial.number, values=values, asked=asked, argv=argv,
            env=env, secret_env=list(self.spec.server.secret_env), host=self.spec.server.host,
            port=port, served_model_name=served, trial_dir=str(trial_dir.resolve()),
            startup_timeout_s=self.spec.server.startup_timeout,
            stop_timeout_s=self.spec.server.stop_timeout,
            deadline_s=self.spec.budget.trial_timeout,
            load=self.spec.load.model_dump(mode="json"),
            probe=self.spec.probe.model_dump(mode="json"),
            ignore_eos=bool(ignore_eos),
        )
        trial.set_user_attr("kind", KIND_RUN)
        trial.set_user_attr("attempt", attempt)
        redact = tuple(n for n in env if is_secret_name(n))
        trial.set_user_attr("command", shell_line(RenderedCommand(argv, env), redact=redact))
        self._in_flight[trial.number] = trial
        self.executor.submit(group, request.model_dump(mode="json"),
                             deadline_s=self.spec.budget.trial_timeout + self.spec.server.stop_timeout + 15)
        label = "baseline" if trial.user_attrs.get("baseline") else _values_text(values)
        self.progress(f"[trial {trial.number}] start on group {group}: {label}")

    # -- results -----------------------------------------------------------------

    def _tell(self, study: optuna.Study, item: Finished) -> None:
        number = int(item.request["number"])
        trial = self._in_flight.pop(number, None)
        if trial is None:
            return
        if item.result is None:
            outcome = TrialOutcome(number=number, status="failed", reason=item.error, message=item.message)
        else:
            outcome = TrialOutcome.model_validate(item.result)
        trial.set_user_attr("outcome", _outcome_attrs(outcome))
        if outcome.status == "failed":
            trial.set_user_attr("failure", {
                "reason": outcome.reason, "message": outcome.message, "phase": outcome.phase,
                "log_excerpt": (outcome.log_excerpt or "")[-2000:],
            })
            study.tell(number, state=TrialState.FAIL)
            self.progress(f"[trial {number}] FAILED ({outcome.reason}) {outcome.message or ''}".rstrip())
            if outcome.reason == "interrupted":
                frozen = study._storage.get_trial(trial._trial_id)
                self._retry(study, frozen, int(frozen.user_attrs.get("attempt", 1)))
            self.write_pareto(study)
            return
        values = [metric_value(self.spec, outcome, o) for o in self.spec.objectives]
        missing = [o.label for o, v in zip(self.spec.objectives, values) if v is None]
        if missing:
            trial.set_user_attr("failure", {
                "reason": "no_measurement", "message": f"no value for {', '.join(missing)}", "phase": "load"})
            study.tell(number, state=TrialState.FAIL)
            self.progress(f"[trial {number}] FAILED (no_measurement) for {', '.join(missing)}")
            self.write_pareto(study)
            return
        for key, value in self._constraints(outcome).items():
            trial.set_constraint(key, value)
        study.tell(number, values)
        self.write_pareto(study)
        self.progress(f"[trial {number}] done in {outcome.trial_s or 0:.1f}s: " + _result_text(
            self.labels, values, outcome) + f" | front: {len(self._front(study))}")

    def _constraints(self, outcome: TrialOutcome) -> dict[str, float]:
        constraints = {
            "probe": 0.0 if outcome.probe_passed in (True, None) else 1.0,
            "applied": 0.0 if (outcome.applied is not False or not self.spec.verify.require_applied)
            else float(max(1, len(outcome.mismatches))),
        }
        for limit in self.spec.limits:
            value = metric_value(self.spec, outcome, limit)
            if value is None:
                violation = 1.0
            elif limit.max is not None:
                violation = value - limit.max
            else:
                violation = limit.min - value  # type: ignore[operator]
            constraints[f"limit:{limit.label}"] = float(violation)
        return constraints

    def _front(self, study: optuna.Study) -> list[Any]:
        records = read_records(study)
        return pareto_front(record_points(records, self.labels), self.directions)

    def write_pareto(self, study: optuna.Study) -> None:
        records = read_records(study)
        by_number = {r.number: r for r in records}
        front = pareto_front(record_points(records, self.labels), self.directions)
        baseline = next((r for r in records if r.is_baseline and r.state == "COMPLETE" and r.kind == KIND_RUN), None)
        entries = []
        for point in front:
            record = by_number[point.number]
            entry = {
                "trial": point.number,
                "values": dict(zip(self.labels, point.values)),
                "params": record.params,
                "command": record.attrs.get("command"),
                "baseline": record.is_baseline,
            }
            if baseline is not None:
                entry["vs_baseline"] = {
                    label: (v / baseline.values[label] if baseline.values.get(label) else None)
                    for label, v in zip(self.labels, point.values)
                }
            entries.append(entry)
        atomic_write_json(self.handle.paths.pareto_json, {
            "study": self.handle.name,
            "objectives": [{"label": l, "direction": d} for l, d in zip(self.labels, self.directions)],
            "updated_unix": time.time(),
            "trials_finished": sum(1 for r in records if r.kind == KIND_RUN and r.state in ("COMPLETE", "FAIL")),
            "baseline": None if baseline is None else {"trial": baseline.number, "values": baseline.values},
            "front": entries,
        })


def _suggest(trial: Trial, param: Any) -> Any:
    if param.kind == "categorical":
        return trial.suggest_categorical(param.name, param.values)
    if param.kind == "bool":
        return trial.suggest_categorical(param.name, [False, True])
    if param.kind == "int":
        return trial.suggest_int(param.name, param.low, param.high, step=param.step, log=param.log)
    return trial.suggest_float(param.name, param.low, param.high, step=param.step, log=param.log)


def _grid_points(spec: StudySpec) -> list[dict[str, Any]]:
    ordered = space.ordered_parameters(spec)
    if any(p.domain() is None for p in ordered):
        raise ValueError("sampler 'grid' needs every parameter to be discrete (give floats a step)")
    points: list[dict[str, Any]] = []

    def walk(i: int, values: dict[str, Any]) -> None:
        if i == len(ordered):
            if space.forbidden_reason(spec, values) is None:
                points.append(dict(values))
            return
        param = ordered[i]
        if not space.is_active(param, values):
            walk(i + 1, values)
            return
        for value in param.domain() or []:
            values[param.name] = value
            walk(i + 1, values)
            del values[param.name]

    walk(0, {})
    return points


def _values_text(values: dict[str, Any]) -> str:
    return " ".join(f"{k}={'unset' if v is None else v}" for k, v in values.items()) or "(no parameters)"


def _result_text(labels: list[str], values: list[float | None], outcome: TrialOutcome) -> str:
    parts = [f"{label}={value:.4g}" for label, value in zip(labels, values) if value is not None]
    probe = {True: "pass", False: "FAIL", None: "off"}[outcome.probe_passed]
    applied = {True: "yes", False: "NO", None: "?"}[outcome.applied]
    return " ".join(parts) + f" probe={probe} applied={applied}"


def _outcome_attrs(outcome: TrialOutcome) -> dict[str, Any]:
    """The part of an outcome worth keeping in the storage (full details are on disk)."""

    return {
        "status": outcome.status,
        "host": outcome.host,
        "startup_s": outcome.startup_s,
        "probe_s": outcome.probe_s,
        "load_s": outcome.load_s,
        "trial_s": outcome.trial_s,
        "applied": outcome.applied,
        "mismatches": outcome.mismatches,
        "probe_passed": outcome.probe_passed,
        "probe_reason": outcome.probe_reason,
        "levels": outcome.levels,
        "server_side": outcome.server_side,
        "started_unix": outcome.started_unix,
        "finished_unix": outcome.finished_unix,
        "warnings": outcome.warnings,
        "stop": outcome.stop,
    }
