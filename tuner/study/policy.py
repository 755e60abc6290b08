"""The study's ask/tell policy: what runs next and what each trial is told, as free functions
over plain trial records (``tuner.study.trials.TrialRecord``) - Optuna's own style:
algorithms over plain data. No Optuna, no storage, no processes, no clocks.

The loop (``tuner.engine.orchestrator.StudyLoop``) asks Optuna for a point and then does what these
functions decide; the benchmarks and the fast tests drive the same loop through the
simulator's in-process executor, so there is one policy, not a copy per caller.

What runs, in this order: the baseline, then the study's starting points (``first_points``;
grouped by predicted torch.compile cache key, the baseline's first),
then the sampler's proposals; on a grid study the next unseen grid point, and after
``MAX_REJECTED_IN_A_ROW`` proposals in a row that could not run, a random unseen point
(``fill_in``). A proposal that must not run is told without starting a server
(``screen``): a forbidden point, or one already run, running or failed (a duplicate).

What each trial is told (``told_for`` and ``screen``):

=================================  ===================================================
outcome                            told
=================================  ===================================================
completed, probe passed, applied,  its objective values (``measured``)
limits met, no failed requests
probe failed / not applied /       the same values plus violated constraints ``probe``,
limit missed / failed requests     ``applied``, ``limit:<label>``, ``load_errors``
stopped early by its worker        measured values, optimistic bounds or the worst
                                   values seen, and a violated ``early_stopped``
                                   (``stopped``); rule 4a (``dominated_exact``)
                                   measured its objectives: told as ``measured``
completed without an objective     FAIL ``no_measurement``; FAIL ``load_errors`` when the
                                   objective's level measured failed requests
failed (start, crash, timeout,     FAIL with the worker's typed reason (``failed``);
worker lost, interrupted)          an interrupted one is re-run (``retry``)
forbidden point                    the worst values seen and a violated ``forbidden``
                                   (FAIL before anything was measured)
duplicate of a completed trial     that trial's values and constraints again
duplicate of a failed/running one  the worst values seen and a violated ``failed_before``
=================================  ===================================================

Why worst values instead of FAIL for points that must not run: TPE and NSGA-II learn
nothing from FAIL trials and would keep proposing them; a COMPLETE trial with the worst
values and a violated constraint teaches them to move away. Such trials are marked (kind
is not ``run``, ``placeholder_values``) and never reach the front, the budget or the reports'
measurements.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tuner.load.level_names import is_open_level
from tuner.study import early_stop, space, sweep_guard
from tuner.study.confirmation import RunResult
from tuner.study.objectives import MAX_RATE, open_level
from tuner.study.outcome import TrialOutcome
from tuner.study.outcome_summary import Failure
from tuner.study.pareto import Point, pareto_front
from tuner.study.sampling import grid_points
from tuner.study.scoring import TRIAL_METRICS, constraints, level_of, metric_value, stop_text, stopped_told
from tuner.study.spec import StudySpec
from tuner.study.trials import EARLY_STOPPED, KIND_DUPLICATE, KIND_FORBIDDEN, KIND_RUN, TrialRecord, outcome_word
from tuner.vllm.compile_order import compile_order

__all__ = ["Enqueue", "Told", "Resume", "MAX_REJECTED_IN_A_ROW", "EXHAUSTED_AFTER", "HISTORY_LIMIT",
           "first_points", "grid_order", "fill_in", "retry", "resume", "known_points", "finished_runs",
           "worst_values", "screen", "told_for", "early_stop_plan", "full_trial_seconds"]

MAX_REJECTED_IN_A_ROW = 25  # then a random unseen point is enqueued instead
EXHAUSTED_AFTER = 4 * MAX_REJECTED_IN_A_ROW  # rejected in a row: every allowed point is known
# Bounded history: the learned ratio is a maximum over trials, and the newest few hundred
# trials are the ones near the front; shipping the whole study to every worker would cost
# more than it adds.
HISTORY_LIMIT = 300
_RANDOM_TRIES = 200


@dataclass(frozen=True)
class Enqueue:
    """A point to put in the study's queue, with the user attributes its trial starts with."""

    values: dict[str, Any]
    attrs: dict[str, Any]


@dataclass
class Told:
    """What a trial is told to Optuna as.

    ``values`` None: told FAIL. ``attrs``: user attributes to set before telling (``kind``,
    ``placeholder_values``, ``duplicate_of``); ``failure``: why it failed or was not run,
    stored beside them (``user_attrs``). ``how``: ``measured``,
    ``stopped`` (stopped early by its worker), ``failed`` (the worker reported a failure),
    ``no_measurement`` (completed without a value for an objective), ``load_errors`` (no
    value because the level's measured requests failed), ``forbidden`` or ``duplicate``
    (never ran); ``missing``: the objectives without a value.
    """

    how: str
    values: list[float] | None
    constraints: dict[str, float] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    failure: Failure | None = None

    def user_attrs(self) -> dict[str, Any]:
        """The user attributes to set: ``attrs`` and the failure as stored."""

        return self.attrs if self.failure is None else {**self.attrs, "failure": self.failure.as_attr()}

    @property
    def verdict(self) -> str:
        """The trial's verdict in one word (``trials.outcome_word``), decided here once and
        stored with the trial (user attribute ``verdict``) for status, report and export."""

        return outcome_word("FAIL" if self.values is None else "COMPLETE", str(self.attrs.get("kind", KIND_RUN)),
                            self.constraints, None if self.failure is None else self.failure.reason)


# -- what runs next ----------------------------------------------------------------------


def first_points(spec: StudySpec, trials: Sequence[TrialRecord], *, parallel: int = 1) -> list[Enqueue]:
    """The baseline, then the study's starting points, each once per study (a resumed study
    finds them already queued or run). ``parallel``: GPU groups running trials at once."""

    out = []
    if not any(t.is_baseline for t in trials):
        out.append(Enqueue(space.baseline_values(spec), {"baseline": True, "attempt": 1}))
    # The baseline's further fresh starts, from which the study measures its noise between
    # starts (tuner.study.between_starts), right after it: on a shared torch.compile cache key.
    if spec.load.noise_floor is None:
        started = {t.attrs.get("noise_start") for t in trials}
        out.extend(Enqueue(space.baseline_values(spec), {"noise_start": k, "attempt": 1})
                   for k in range(2, spec.load.noise_starts + 1) if k not in started)
    queued = {t.attrs.get("starting_point") for t in trials}
    points = space.starting_point_values(spec)
    # Starting points that share a torch.compile cache key run back to back, the baseline's
    # own key first (vllm/compile_order.py): the second of a pair loads what the first
    # compiled into the study's cache.
    order = compile_order([space.point_compile_key(spec, v) for v in points],
                          after=space.point_compile_key(spec, space.baseline_values(spec)), parallel=parallel)
    for i in order:
        if i not in queued:
            out.append(Enqueue(points[i], {"starting_point": i, "attempt": 1}))
    return out


def grid_order(spec: StudySpec) -> list[dict[str, Any]]:
    """Every allowed point, shuffled by the study's seed: the order a grid study runs them."""

    points = grid_points(spec)
    random.Random(spec.sampler.seed).shuffle(points)
    return points


def fill_in(spec: StudySpec, trials: Sequence[TrialRecord], *, rejected_in_a_row: int,
            grid: Sequence[dict[str, Any]] | None = None) -> Enqueue | None:
    """What to enqueue before the next ask, if anything.

    ``grid`` (a grid study, ``grid_order``): its first point not yet known, unless a point
    is already waiting. Otherwise, after ``MAX_REJECTED_IN_A_ROW`` proposals in a row that
    could not run, a random point not yet known (seeded by the study's seed and size, so a
    resumed study continues the same sequence).
    """

    if grid is not None:
        if any(t.state == "WAITING" for t in trials):
            return None
        known = known_points(trials)
        for values in grid:
            if space.params_key(values) not in known:
                return Enqueue(values, {"attempt": 1})
        return None
    if rejected_in_a_row < MAX_REJECTED_IN_A_ROW:
        return None
    rng = random.Random(spec.sampler.seed * 7919 + len(trials))
    known = known_points(trials)
    for _ in range(_RANDOM_TRIES):
        values = space.random_values(spec, rng)
        if space.params_key(values) not in known:
            return Enqueue(values, {"attempt": 1, "filled_in": True})
    return None


def retry(trial: TrialRecord, max_retries: int) -> Enqueue | None:
    """An interrupted trial's re-run, while its attempts last (``budget.max_retries``)."""

    values = trial.ran_values
    attempt = trial.attempt
    if values is None or attempt > max_retries:
        return None
    attrs = {"retry_of": trial.number, "attempt": attempt + 1, "baseline": trial.is_baseline}
    if trial.attrs.get("noise_start"):
        attrs["noise_start"] = trial.attrs["noise_start"]
    return Enqueue(values, attrs)


@dataclass(frozen=True)
class Resume:
    """What to do with a trial a stopped run left RUNNING (``resume``).

    ``record``: tell the outcome its worker wrote before the stop (nothing measured is
    lost). Otherwise tell it FAIL with ``failure`` and enqueue ``retry`` if any.
    """

    record: bool
    failure: Failure | None = None
    retry: Enqueue | None = None


INTERRUPTED_FAILURE = Failure("interrupted", "the tuner stopped during this trial", "unknown")


def resume(trial: TrialRecord, written: TrialOutcome | None, max_retries: int) -> Resume:
    """A RUNNING trial found on resume: recorded from its outcome file when its worker wrote
    one (and not because the tuner interrupted it); else failed ``interrupted`` and, for a
    run trial, re-run once more while its attempts last."""

    if trial.kind == KIND_RUN and written is not None and written.reason != "interrupted":
        return Resume(record=True)
    return Resume(record=False, failure=INTERRUPTED_FAILURE,
                  retry=retry(trial, max_retries) if trial.kind == KIND_RUN else None)


# -- what the study knows ----------------------------------------------------------------


def known_points(trials: Sequence[TrialRecord]) -> dict[str, TrialRecord]:
    """Point key -> the first run trial of that point that ran, runs or failed (an
    interrupted one does not count: it is re-run)."""

    known: dict[str, TrialRecord] = {}
    for t in trials:
        if t.state not in ("COMPLETE", "FAIL", "RUNNING") or t.kind != KIND_RUN:
            continue
        if t.point is None or t.interrupted:
            continue
        known.setdefault(t.point, t)
    return known


def finished_runs(trials: Sequence[TrialRecord]) -> int:
    """Trials that count toward the budget: finished runs, interrupted ones excepted."""

    return sum(1 for t in trials if t.state in ("COMPLETE", "FAIL") and t.kind == KIND_RUN
               and not t.interrupted)


def worst_values(trials: Sequence[TrialRecord], labels: Sequence[str],
                 directions: Sequence[str]) -> list[float] | None:
    """The worst value of each objective told to a run trial so far (None before any)."""

    rows = [v for t in trials if t.state == "COMPLETE" and t.kind == KIND_RUN
            for v in [t.ordered_values(labels)] if v is not None]
    if not rows:
        return None
    return [min(col) if d == "maximize" else max(col) for col, d in zip(zip(*rows), directions)]


def full_trial_seconds(trials: Sequence[TrialRecord]) -> list[float]:
    """Durations of the completed trials that ran their whole sweep (the confirmation
    reserve is estimated from them)."""

    out = []
    for t in trials:
        trial_s = t.summary.trial_s
        if t.state == "COMPLETE" and t.kind == KIND_RUN and trial_s and not t.summary.early_stop:
            out.append(float(trial_s))
    return out


# -- what to tell --------------------------------------------------------------------------


def _infeasible(told: Told, constraint: str, worst: list[float] | None) -> Told:
    """``told`` as a point that must not run: the worst values seen with ``constraint``
    violated, or FAIL while nothing has been measured."""

    if worst is None:
        return told
    told.values = list(worst)
    told.constraints[constraint] = 1.0
    told.attrs["placeholder_values"] = True
    return told


def screen(spec: StudySpec, values: Mapping[str, Any], number: int, trials: Sequence[TrialRecord],
           labels: Sequence[str], directions: Sequence[str]) -> Told | None:
    """What to tell instead of running trial ``number`` with ``values``; None: run it.

    ``trials``: the study as it is (the trial itself may be among them)."""

    reason = space.forbidden_reason(spec, values)
    if reason is not None:
        told = Told("forbidden", None, attrs={"kind": KIND_FORBIDDEN}, failure=Failure("forbidden", reason))
        return _infeasible(told, "forbidden", worst_values(trials, labels, directions))
    earlier = known_points(trials).get(space.params_key(values))
    if earlier is None or earlier.number == number:
        return None
    if any(t.number == number and t.attrs.get("noise_start") for t in trials):
        return None     # a fresh start of a measured point on purpose: the study's noise
    attrs: dict[str, Any] = {"kind": KIND_DUPLICATE, "duplicate_of": earlier.number}
    told_before = earlier.ordered_values(labels) if earlier.state == "COMPLETE" else None
    if told_before is not None:
        # Nothing new to learn by running it again: the earlier result, told again.
        return Told("duplicate", list(told_before), dict(earlier.constraints), attrs)
    # Still running or failed: nothing new to learn either, and not a result to repeat.
    failure = Failure("duplicate", f"same parameters as trial {earlier.number}")
    return _infeasible(Told("duplicate", None, attrs=attrs, failure=failure), "failed_before",
                       worst_values(trials, labels, directions))


def told_for(spec: StudySpec, outcome: TrialOutcome, worst: Callable[[], list[float] | None]) -> Told:
    """What a finished trial's outcome is told as (the loop's record of a trial, and the study
    rebuilt from a folder's trial files, which must agree with it).

    ``worst``: the worst value per objective told so far, asked for only when a trial
    stopped early needs placeholders (reading it means reading every trial).
    """

    if outcome.status == "failed":
        return Told("failed", None, failure=Failure(str(outcome.reason or "unknown"), outcome.message,
                                                    outcome.phase, (outcome.log_excerpt or "")[-2000:]))
    if outcome.early_stop and outcome.early_stop.get("reason") != "dominated_exact":
        # dominated_exact measured its objectives: told like any completed trial.
        values, violated, placeholder = stopped_told(spec, outcome, worst())
        if values is None:
            return Told("stopped", None, failure=Failure(EARLY_STOPPED, stop_text(outcome), "load"))
        return Told("stopped", values, violated, {"placeholder_values": True} if placeholder else {})
    measured = [metric_value(spec, outcome, o) for o in spec.objectives]
    missing = [o.label for o, v in zip(spec.objectives, measured) if v is None]
    if missing:
        failed = _failed_levels(spec, outcome, [o for o, v in zip(spec.objectives, measured) if v is None])
        if failed:
            # Not a slow server with too few samples: one that answers with errors.
            return Told("load_errors", None, missing=missing, failure=Failure(
                "load_errors", f"no value for {', '.join(missing)}: {'; '.join(failed)}", "load"))
        return Told("no_measurement", None, missing=missing, failure=Failure(
            "no_measurement", f"no value for {', '.join(missing)}", "load"))
    return Told("measured", [float(v) for v in measured if v is not None], constraints(spec, outcome))


def rerun_result(spec: StudySpec, folder: str, outcome: TrialOutcome) -> RunResult:
    """A confirmation re-run (in ``confirm/<folder>``) as the study would have told it
    (``told_for``): its values, whether it is feasible, and why not."""

    told = told_for(spec, outcome, lambda: None)
    word = told.verdict
    failure = None if told.failure is None else told.failure.message
    message = outcome.message or failure or outcome.probe_reason if word != "feasible" else None
    return RunResult(folder=folder, values=told.values, feasible=word == "feasible",
                     outcome=word, message=message, trial_s=outcome.trial_s)


def _failed_levels(spec: StudySpec, outcome: TrialOutcome, objectives: Sequence[Any]) -> list[str]:
    """The failed requests of the levels ``objectives`` are read at, one line a level."""

    out = []
    for o in objectives:
        if o.metric in TRIAL_METRICS or o.metric == MAX_RATE:
            continue
        key = open_level(o) or str(level_of(spec, o))
        text = outcome.load_failures.get(key)
        if text is None:
            # An outcome written before load_failures was kept: its count alone.
            level = (outcome.rate_levels if is_open_level(key) else outcome.levels).get(key) or {}
            text = f"{level['failed']:.0f} measured requests failed" if level.get("failed") else None
        line = None if text is None else f"{key if is_open_level(key) else 'c=' + key}: {text}"
        if line is not None and line not in out:
            out.append(line)
    return out


# -- what a starting trial is told about the study ----------------------------------------


def target_level(spec: StudySpec, item: Any) -> int | str:
    """Where early stop reads an objective or limit: a concurrency level, an open-loop
    level's name (r2.0, trace), or the trial (early_stop.TRIAL_LEVEL: startup_s, max_rate@slo)."""

    if item.metric in TRIAL_METRICS or item.metric == MAX_RATE:
        return early_stop.TRIAL_LEVEL
    return open_level(item) or level_of(spec, item)


def early_stop_plan(spec: StudySpec, trials: Sequence[TrialRecord]) -> sweep_guard.SweepPlan:
    """The ``TrialRequest.early_stop`` of a trial starting now (``sweep_guard.sweep_plan``).

    Front: objective values of the feasible measured trials' front; history: the objective
    metrics, per level, of trials that measured every objective level (a trial stopped on
    a bound did not, and its values are bounds).
    """

    labels = [o.label for o in spec.objectives]
    targets = [early_stop.Target(o.metric, target_level(spec, o), o.direction)
               for o in spec.objectives]
    limits = [{"label": lim.label, "metric": lim.metric, "level": target_level(spec, lim),
               "max": lim.max, "min": lim.min} for lim in spec.limits]
    # Goodput is bounded through the throughput it is part of (early_stop.GOODPUT_OF): the
    # learned-ratio history needs those metrics too.
    metrics = {t.metric for t in targets} | {early_stop.GOODPUT_OF[t.metric] for t in targets
                                             if t.metric in early_stop.GOODPUT_OF}
    needed = {str(t.level) for t in targets
              if isinstance(t.level, int) and t.level != early_stop.TRIAL_LEVEL}
    directions = [t.direction for t in targets]
    rows: list[tuple[float, ...]] = []
    history: list[dict[int | str, dict[str, float]]] = []
    for t in trials:
        told = t.ordered_values(labels)
        if t.state != "COMPLETE" or told is None or t.kind != KIND_RUN:
            continue
        if EARLY_STOPPED in t.constraints or t.placeholder_values:
            continue
        levels = t.summary.levels
        if all(v <= 0 for v in t.constraints.values()):
            # Each front value moved by its noise towards worse: a trial is only stopped on
            # a front its measurement noise could not have put there (tuner.study.noise).
            noise = t.noise(labels)
            rows.append(tuple(v - (noise[o.label] or 0.0) if o.direction == "maximize"
                              else v + (noise[o.label] or 0.0)
                              for v, o in zip(told, spec.objectives)))
        if needed <= set(levels):
            history.append({int(c): {m: v for m, v in lv.items() if m in metrics and v is not None}
                            for c, lv in levels.items()})
    front = [p.values for p in pareto_front([Point(i, r) for i, r in enumerate(rows)], directions)]
    return sweep_guard.sweep_plan(targets, limits, spec.load.concurrency, front, history[-HISTORY_LIMIT:],
                                 require_applied=spec.verify.require_applied)
