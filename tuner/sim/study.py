"""Simulated studies: the orchestrator's ask -> suggest -> tell loop, answered from ground truth.

No server, no Ray, no files: an in-memory Optuna study is driven exactly as
``tuner.orchestrator.Orchestrator`` drives it (baseline enqueued first, parameters
suggested in ``space.ordered_parameters`` order with inactive children skipped, forbidden
points told infeasible with the worst values seen, duplicates told the earlier result or,
if it failed, infeasible, failed trials told FAIL, constraints set with
``Trial.set_constraint``, an unseen random point enqueued after
``MAX_REJECTED_IN_A_ROW`` rejections, grid points enqueued in shuffled order), while each
trial's outcome is looked up in a ``tuner.sim.truth.GroundTruth`` table with optional
measurement noise.

Time is simulated: a trial takes startup + probe + its load levels + stop seconds (from the
ground truth's time model), ``workers`` trials run at once and the one that finishes first
is told first - so constant-liar TPE sees the same pending trials as on a real cluster.

An optional early-stop policy (``tuner.study.early_stop``) is consulted while the server
starts, after verification, after the probe, inside a level (rule 4, see ``_Driver._inside``
for its time and noise model) and after every load level, with the study's state at that
moment; a stopped trial is shorter and is told as the orchestrator tells it (infeasible, or
completed for ``dominated_exact``).

With ``compile_cache`` the servers share vLLM's torch.compile cache, as on a real node: a
trial whose compile key (``PointTruth.compile_key``, the simulator's hash of the
compile-relevant effective settings) was compiled by a trial whose compile finished before
this one started loads instead of compiling, and starts ``PointTruth.hit_saving_s`` sooner.
"""

from __future__ import annotations

import heapq
import math
import random
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, Trial, TrialState

from tuner.study import early_stop, samplers, space
from tuner.study.spec import StudySpec
from tuner.sim.truth import GroundTruth, Measured, PointTruth, level_of, measure

__all__ = ["TrialLog", "StudyRun", "EarlyStopPolicy", "run_study", "MAX_REJECTED_IN_A_ROW"]

# Same value as tuner.orchestrator.MAX_REJECTED_IN_A_ROW (not imported: that module pulls in
# Ray; tests/test_study_sim.py checks they agree).
MAX_REJECTED_IN_A_ROW = 25

KIND_RUN, KIND_DUPLICATE, KIND_FORBIDDEN = "run", "duplicate", "forbidden"

SamplerFactory = Callable[[StudySpec, int], optuna.samplers.BaseSampler]


@dataclass(frozen=True)
class EarlyStopPolicy:
    infeasible: bool = True        # rule 1: not applied / probe failed / limit missed
    dominated: bool = True         # rule 2: dominated for sure after a level
    margin: float = early_stop.DEFAULT_MARGIN
    min_history: int = early_stop.DEFAULT_MIN_HISTORY
    max_gap: float = early_stop.DEFAULT_MAX_GAP
    reorder: bool = True           # rule 3: objective/limit levels first
    streaming_verify: bool = False  # not applied known from the log while starting (see verdict)
    inside: bool = False           # rule 4: stop inside a level on its window so far
    inside_margin: float = early_stop.INSIDE_MARGIN


@dataclass
class TrialLog:
    """One trial that ran a (simulated) server, in the order the tuner heard back from it."""

    number: int
    run_index: int                  # 1-based count of finished runs (the budget counter)
    values: dict[str, Any]
    key: str
    failed: bool
    feasible: bool                  # as told (measured constraints, early stop included)
    truly_feasible: bool            # ground truth: applied, probe ok, limits met
    measured: tuple[float, ...] | None
    true_values: tuple[float, ...] | None
    started_s: float
    finished_s: float
    stopped: str | None = None      # early-stop reason
    stopped_after: str | None = None  # phase after which it stopped ("verify", "probe", "c4", ...)
    would_enter_front: bool = False  # stopped, yet its full measurement would be on the front then
    true_front: bool = False        # stopped before its objectives were measured, yet a true front point
    compile: str | None = None      # torch.compile cache: "hit", "miss", None (nothing compiled)
    compile_saved_s: float = 0.0    # startup seconds the hit saved

    @property
    def seconds(self) -> float:
        return self.finished_s - self.started_s


@dataclass
class StudyRun:
    trials: list[TrialLog] = field(default_factory=list)
    proposals: int = 0              # asks, including forbidden and duplicate ones
    forbidden: int = 0
    duplicates: int = 0
    exhausted: bool = False

    def hv_curve(self, truth: GroundTruth, *, strict: bool = False) -> list[float]:
        """True hypervolume of the truly feasible points fully measured after each finished run."""

        out, rows = [], []
        for t in self.trials:
            if t.truly_feasible and t.true_values is not None and t.measured is not None:
                rows.append(t.true_values)
            out.append(truth.hv_of(rows, strict=strict))
        return out

    def reported_front_hv(self, truth: GroundTruth, directions: Sequence[str]) -> float:
        """True hypervolume of what the study would report: its front by measured values."""

        rows = [(t.measured, t.true_values) for t in self.trials
                if t.feasible and t.measured is not None and t.true_values is not None]
        front = []
        for m, tv in rows:
            if early_stop.dominated(m, [r[0] for r in rows if r[0] is not m], directions) is None:
                front.append(tv)
        return truth.hv_of(front)

    @property
    def total_seconds(self) -> float:
        return sum(t.seconds for t in self.trials)

    @property
    def compile_saved_seconds(self) -> float:
        """Startup seconds the torch.compile cache saved (run with ``compile_cache``)."""

        return sum(t.compile_saved_s for t in self.trials)

    @property
    def compile_hits(self) -> int:
        return sum(t.compile == "hit" for t in self.trials)

    @property
    def makespan(self) -> float:
        return max((t.finished_s for t in self.trials), default=0.0)


# ------------------------------------------------------------------------------------------


@dataclass
class _Outcome:
    finished_s: float
    measured: Measured
    stopped: str | None = None
    after: str | None = None
    levels: dict[int, dict[str, float]] | None = None
    bounds: tuple[float, ...] = ()
    wrong: bool = False
    compile: str | None = None
    compile_saved_s: float = 0.0


@dataclass
class _Running:
    trial: Trial
    values: dict[str, Any]
    truth: PointTruth
    started_s: float
    number: int


class _Driver:
    def __init__(self, spec: StudySpec, truth: GroundTruth, sampler: optuna.samplers.BaseSampler, *,
                 n_trials: int, seed: int, noise: float, workers: int,
                 policy: EarlyStopPolicy | None, initial: Sequence[dict[str, Any]] = (),
                 stop_at_full: bool = False, duplicates: str = "retell",
                 verdict: Callable[[dict[str, Any]], float | None] | None = None,
                 compile_cache: bool = False) -> None:
        self.verdict = verdict
        # The torch.compile cache: compile key -> when (study seconds) its entry was written.
        self.compile_cache = compile_cache
        self._compiled: dict[str, float] = {}
        self.stop_at_full = stop_at_full
        self.duplicates = duplicates
        self._true_rows: list[tuple[float, ...]] = []
        self.spec = spec
        self.truth = truth
        self.n_trials = n_trials
        self.seed = seed
        self.noise = noise
        self.workers = workers
        self.policy = policy
        self.directions = [o.direction for o in spec.objectives]
        self.targets = [early_stop.Target(o.metric, level_of(spec, o.concurrency), o.direction)
                        for o in spec.objectives]
        self.study = optuna.create_study(directions=self.directions, sampler=sampler)
        with warnings.catch_warnings():   # "experimental" since Optuna 3.2; the orchestrator uses it too
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            self.study.set_metric_names([o.label for o in spec.objectives])
        self.run = StudyRun()
        self._grid: list[dict[str, Any]] | None = None
        self._history: list[dict[int, dict[str, float]]] = []
        self._front_rows: list[tuple[float, ...]] = []   # measured values, feasible told trials
        self._true_front = truth.front_keys()
        self.study.enqueue_trial(space.baseline_values(spec), user_attrs={"baseline": True, "attempt": 1})
        for values in initial:
            self.study.enqueue_trial(values, user_attrs={"attempt": 1, "initial_design": True})

    # -- the orchestrator's bookkeeping ------------------------------------------------
    def _known_points(self) -> dict[str, FrozenTrial]:
        known: dict[str, FrozenTrial] = {}
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL,
                                                                TrialState.RUNNING)):
            if t.user_attrs.get("kind", KIND_RUN) != KIND_RUN or "values" not in t.user_attrs:
                continue
            known.setdefault(space.params_key(t.user_attrs["values"]), t)
        return known

    def _worst_values(self) -> list[float] | None:
        rows = [t.values for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                if t.user_attrs.get("kind", KIND_RUN) == KIND_RUN and t.values is not None
                and not t.user_attrs.get("placeholder_values")]
        if not rows:
            return None
        return [min(col) if d == "maximize" else max(col) for col, d in zip(zip(*rows), self.directions)]

    def _tell_infeasible(self, trial: Trial, constraint: str) -> None:
        worst = self._worst_values()
        if worst is None:
            self.study.tell(trial, state=TrialState.FAIL)
            return
        trial.set_constraint(constraint, 1.0)
        trial.set_user_attr("placeholder_values", True)
        self.study.tell(trial, worst)

    def _tell_duplicate(self, trial: Trial, earlier: FrozenTrial) -> None:
        trial.set_user_attr("kind", KIND_DUPLICATE)
        trial.set_user_attr("duplicate_of", earlier.number)
        if self.duplicates == "infeasible" and earlier.state == TrialState.COMPLETE and earlier.values is not None:
            # Proposed orchestrator change: the repeat carries the earlier values but a
            # violated "duplicate" constraint, so TPE counts it among the bad trials and
            # moves off a point it already knows instead of re-proposing it.
            for key, value in earlier.constraints.items():
                trial.set_constraint(key, value)
            trial.set_constraint("duplicate", 1.0)
            self.study.tell(trial, earlier.values)
        elif earlier.state == TrialState.COMPLETE and earlier.values is not None:
            for key, value in earlier.constraints.items():
                trial.set_constraint(key, value)
            self.study.tell(trial, earlier.values)
        else:
            self._tell_infeasible(trial, "failed_before")

    def _enqueue_unseen_random(self) -> None:
        rng = random.Random(self.seed * 7919 + len(self.study.trials))
        known = self._known_points()
        for _ in range(200):
            values = space.random_values(self.spec, rng)
            if space.params_key(values) not in known:
                self.study.enqueue_trial(values, user_attrs={"attempt": 1, "filled_in": True})
                return

    def _enqueue_grid_point(self) -> None:
        if self._grid is None:
            from tuner.sim.truth import enumerate_points

            self._grid = enumerate_points(self.spec)
            random.Random(self.seed).shuffle(self._grid)
        if self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            return
        known = self._known_points()
        for values in self._grid:
            if space.params_key(values) not in known:
                self.study.enqueue_trial(values, user_attrs={"attempt": 1})
                return

    def _start_next(self, grid: bool, rejected_in_a_row: int, now: float) -> _Running | None:
        if grid:
            self._enqueue_grid_point()
        elif rejected_in_a_row >= MAX_REJECTED_IN_A_ROW:
            self._enqueue_unseen_random()
        trial = self.study.ask()
        self.run.proposals += 1
        values: dict[str, Any] = {}
        for param in space.ordered_parameters(self.spec):
            if space.is_active(param, values):
                values[param.name] = samplers.suggest(trial, param)
        trial.set_user_attr("values", values)
        if space.forbidden_reason(self.spec, values) is not None:
            trial.set_user_attr("kind", KIND_FORBIDDEN)
            self.run.forbidden += 1
            self._tell_infeasible(trial, "forbidden")
            return None
        earlier = self._known_points().get(space.params_key(values))
        if earlier is not None and earlier.number != trial.number:
            self.run.duplicates += 1
            self._tell_duplicate(trial, earlier)
            return None
        trial.set_user_attr("kind", KIND_RUN)
        return _Running(trial, values, self.truth.get(values), now, trial.number)

    # -- one trial's timeline ------------------------------------------------------------
    def _execute(self, job: _Running) -> _Outcome:
        """One trial's timeline (``_play``) with the torch.compile cache applied: a trial
        whose compile key was written by a trial before it started loads instead of
        compiling (``PointTruth.hit_saving_s`` off its start); one that gets past its
        compile writes the entry at ``compile_at_s`` into its run."""

        truth = job.truth
        key = truth.compile_key if self.compile_cache else None
        written = self._compiled.get(key) if key else None
        hit = written is not None and written <= job.started_s
        saving = truth.hit_saving_s if hit else 0.0
        out = self._play(job, saving)
        if key is not None:
            compiled_at = job.started_s + truth.compile_at_s
            past_compile = (out.finished_s - truth.stop_s) >= compiled_at - saving - 1e-9
            if past_compile and not hit:
                self._compiled[key] = min(self._compiled.get(key, math.inf), compiled_at)
            if past_compile or hit:
                out.compile, out.compile_saved_s = ("hit", saving) if hit else ("miss", 0.0)
        return out

    def _play(self, job: _Running, saving: float = 0.0) -> _Outcome:
        """Play one trial against the ground truth, consulting the early-stop policy with the
        study's state as it is now (at the trial's start: later completions could only
        tighten the front, so this is the conservative choice for parallel workers)."""

        truth = job.truth
        rng = random.Random(f"{self.seed}|{job.number}|noise")
        m = measure(self.spec, truth, noise=self.noise, rng=rng)
        t = job.started_s + truth.startup_s - saving
        if truth.failed:
            return _Outcome(t + truth.stop_s, m)
        policy = self.policy
        if policy and policy.infeasible:
            reason = early_stop.infeasible_reason(applied=truth.applied, probe_passed=None,
                                                  require_applied=self.spec.verify.require_applied)
            if reason and policy.streaming_verify and self.verdict is not None:
                seen = self.verdict(job.values)
                if seen is not None:
                    if saving and seen >= truth.compile_at_s:
                        seen -= saving        # a verdict from the end of the start comes sooner
                    return _Outcome(job.started_s + seen + truth.stop_s, m, reason, "startup")
            if reason:
                return _Outcome(t + truth.stop_s, m, reason, "verify")
        t += truth.probe_s
        if policy and policy.infeasible and not truth.probe_passed:
            return _Outcome(t + truth.stop_s, m, "probe_failed", "probe")
        levels = sorted(truth.levels)
        if policy and policy.reorder:
            needed = [t.level for t in self.targets] + [level_of(self.spec, lim.concurrency)
                                                        for lim in self.spec.limits]
            levels = early_stop.level_order(levels, needed)
        limits = {k: v for k, v in m.constraints.items() if k.startswith("limit:")}
        for i, c in enumerate(levels):
            if policy and policy.inside and i + 1 < len(levels):
                inside = self._inside(job, c, {lc: m.levels[lc] for lc in levels[:i]}, m.levels[c])
                if inside is not None:
                    seconds, bounds, where = inside
                    before = {lc: m.levels[lc] for lc in levels[:i]}
                    if where.endswith("at last dispatch") and not any(
                            level_of(self.spec, lim.concurrency) == c for lim in self.spec.limits):
                        # Rule 4a: the level's output tok/s is measured; told like rule 2.
                        return _Outcome(t + seconds + truth.stop_s, m, "dominated_exact", where,
                                        {**before, c: {"output_tok_s": m.levels[c]["output_tok_s"]}}, bounds)
                    wrong = bool(m.feasible and m.objectives is not None and early_stop.dominated(
                        m.objectives, self._front_rows, self.directions) is None)
                    return _Outcome(t + seconds + truth.stop_s, m, "dominated_inside", where, before,
                                    bounds, wrong)
            t += truth.levels[c].load_s
            if not policy or i + 1 == len(levels):
                continue
            measured = {lc: m.levels[lc] for lc in levels[:i + 1]}
            if policy.infeasible:
                missed = {k: v for k, v in limits.items() if self._limit_level(k) in measured}
                if early_stop.infeasible_reason(applied=True, probe_passed=True, limit_violations=missed):
                    return _Outcome(t + truth.stop_s, m, "limit", f"c{c}", measured)
            if policy.dominated:
                d = early_stop.decide(self.targets, measured, levels[i + 1:], self._front_rows,
                                      self._history, margin=policy.margin, min_history=policy.min_history,
                                      max_gap=policy.max_gap)
                if d.stop and d.reason == "dominated_exact":
                    # Objective values are measured: only informational levels are skipped.
                    return _Outcome(t + truth.stop_s, m, d.reason, f"c{c}", measured, d.bounds)
                if d.stop:
                    # Would the full measurement have entered the front as it is now?
                    wrong = bool(m.feasible and m.objectives is not None and early_stop.dominated(
                        m.objectives, self._front_rows, self.directions) is None)
                    return _Outcome(t + truth.stop_s, m, "dominated", f"c{c}", measured, d.bounds, wrong)
        return _Outcome(t + truth.stop_s, m)

    def _inside(self, job: _Running, c: int, measured: dict[int, dict[str, float]],
                final: dict[str, float]) -> tuple[float, tuple[float, ...], str] | None:
        """Rule 4 in the simulated trial: (seconds into level ``c`` when it stops, bounds,
        where) or None.

        Time model (the ground truth's: a level's time is proportional to its requests): the
        measured run of n requests on C streams is n / C rounds of equal length d, after the
        warm-up; the window opens when the first wave is done (d), rule 4b may judge from
        d * (1 + INSIDE_MIN_SHARE), and the window closes at the last dispatch, one round
        before the end, where rule 4a judges the level's own (noisy) output tok/s - at that
        moment already fixed. Rule 4b's rate so far is the level's true output tok/s with
        lognormal noise of sigma ``noise * sqrt(full window / window so far)``, drawn
        independently of the level's own measurement noise (independence makes a wrong stop
        likelier than the real, overlapping windows would)."""

        policy = self.policy
        assert policy is not None
        load = self.spec.load
        mine = [tg for tg in self.targets if tg.level == c]
        if (not mine or any(tg.metric != "output_tok_s" or tg.direction != "maximize" for tg in mine)
                or load.repeats != 1 or load.client_processes != 1):
            return None
        lv = job.truth.levels[c]
        n, w = load.requests_for(c), load.warmup_for(c)
        run_s = lv.load_s / (1 + w / max(1, n))
        d = run_s * min(c, n) / n
        full = run_s - 2 * d                      # [first wave done, last dispatch)
        if full <= 0:
            return None
        warm = run_s * w / max(1, n)
        judged = d * early_stop.INSIDE_MIN_SHARE
        checks = [(final["output_tok_s"], True, full, f"c{c} at last dispatch")]
        if judged < full:
            rng = random.Random(f"{self.seed}|{job.number}|inside|{c}")
            sigma = self.noise * math.sqrt(full / judged)
            rate = lv.metrics["output_tok_s"] * (math.exp(rng.gauss(0.0, sigma)) if sigma > 0 else 1.0)
            checks.insert(0, (rate, False, judged, f"inside c{c}"))
        for rate, exact, window_s, where in checks:
            bound = early_stop.inside_bound(rate, window_s=window_s, first_wave_s=d, stable=True,
                                            exact=exact, margin=policy.inside_margin)
            if not math.isfinite(bound):
                continue
            partial = {**measured, c: {"output_tok_s": bound}}
            bounds = early_stop.optimistic_values(self.targets, partial, self._history, margin=policy.margin,
                                                  min_history=policy.min_history, max_gap=policy.max_gap)
            if early_stop.dominated(bounds, self._front_rows, self.directions) is not None:
                return warm + d + window_s, bounds, where
        return None

    def _limit_level(self, key: str) -> int | None:
        for limit in self.spec.limits:
            if f"limit:{limit.label}" == key:
                return level_of(self.spec, limit.concurrency)
        return None

    def _finish(self, job: _Running, out: _Outcome) -> None:
        trial = job.trial
        truth = job.truth
        m = out.measured
        true_m = measure(self.spec, truth)
        exact = out.stopped == "dominated_exact"
        if truth.failed:
            self.study.tell(trial, state=TrialState.FAIL)
        elif out.stopped is not None and not exact:
            # The proposed integration: the trial is infeasible; its values are the worst
            # seen when nothing was measured (like a forbidden point), else what it can at
            # best reach (measured objectives exact, the others at their optimistic bound).
            for key, value in m.constraints.items():
                trial.set_constraint(key, value)
            if out.stopped in ("dominated", "dominated_inside"):
                trial.set_constraint("dominated", 1.0)
            worst = self._worst_values()
            if out.bounds and worst is not None:
                values = [b if math.isfinite(b) else w for b, w in zip(out.bounds, worst)]
                self.study.tell(trial, values)
            elif worst is not None:
                trial.set_user_attr("placeholder_values", True)
                self.study.tell(trial, worst)
            else:
                self.study.tell(trial, state=TrialState.FAIL)
        else:
            for key, value in m.constraints.items():
                trial.set_constraint(key, value)
            assert m.objectives is not None
            self.study.tell(trial, list(m.objectives))
            self._history.append(out.levels if exact and out.levels else m.levels)
            if m.feasible:
                self._front_rows = _front(self._front_rows + [m.objectives], self.directions)
        full = (out.stopped is None or exact) and not truth.failed
        known = full
        if known and true_m.feasible and true_m.objectives is not None:
            self._true_rows.append(true_m.objectives)
        self.run.trials.append(TrialLog(
            number=job.number, run_index=len(self.run.trials) + 1, values=job.values, key=truth.key,
            failed=truth.failed, feasible=full and m.feasible, truly_feasible=true_m.feasible,
            measured=m.objectives if known else None, true_values=true_m.objectives,
            started_s=job.started_s, finished_s=out.finished_s, stopped=out.stopped,
            stopped_after=out.after, would_enter_front=out.wrong,
            true_front=truth.key in self._true_front and not known,
            compile=out.compile, compile_saved_s=out.compile_saved_s))

    def _found_all(self) -> bool:
        # Benchmarks of search speed need nothing after the whole true front is found.
        return self.stop_at_full and self.truth.hv_of(self._true_rows) >= self.truth.hypervolume * (1 - 1e-9)

    # -- the loop --------------------------------------------------------------------------
    def drive(self, grid: bool) -> StudyRun:
        running: list[tuple[float, int, _Running, _Outcome]] = []
        now = 0.0
        rejected = 0
        finished = 0
        while True:
            while (not self.run.exhausted and not self._found_all()
                   and finished + len(running) < self.n_trials and len(running) < self.workers):
                job = self._start_next(grid, rejected, now)
                if job is None:
                    rejected += 1
                    if rejected > 4 * MAX_REJECTED_IN_A_ROW:
                        self.run.exhausted = True
                    continue
                rejected = 0
                out = self._execute(job)
                heapq.heappush(running, (out.finished_s, job.number, job, out))
            if not running:
                return self.run
            end, _, job, out = heapq.heappop(running)
            now = end
            self._finish(job, out)
            finished += 1


def _front(rows: Sequence[tuple[float, ...]], directions: Sequence[str]) -> list[tuple[float, ...]]:
    return [r for r in rows if early_stop.dominated(r, [q for q in rows if q is not r], directions) is None]


def run_study(spec: StudySpec, truth: GroundTruth, sampler_factory: SamplerFactory, *, n_trials: int,
              seed: int, noise: float = 0.0, workers: int = 1, policy: EarlyStopPolicy | None = None,
              grid: bool = False, initial: Sequence[dict[str, Any]] = (),
              stop_at_full: bool = False, duplicates: str = "retell",
              verdict: Callable[[dict[str, Any]], float | None] | None = None,
              compile_cache: bool = False) -> StudyRun:
    """One simulated study. ``sampler_factory(spec, seed)`` builds the sampler;
    ``stop_at_full``: stop once the evaluated points cover the whole true front.
    ``duplicates``: "retell" (the orchestrator today: a repeated point is told the earlier
    result again) or "infeasible" (told with a violated ``duplicate`` constraint).
    ``verdict(values)``: seconds into a trial when its log shows a knob not applied
    (``Evaluator.verdict_s``), used by ``EarlyStopPolicy.streaming_verify``.
    ``compile_cache``: model vLLM's torch.compile cache shared by the study's servers (a
    point whose compile key an earlier trial compiled starts ``hit_saving_s`` sooner)."""

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = sampler_factory(spec, seed)
    driver = _Driver(spec, truth, sampler, n_trials=n_trials, seed=seed, noise=noise, workers=workers,
                     policy=policy, initial=initial, stop_at_full=stop_at_full, duplicates=duplicates,
                     verdict=verdict, compile_cache=compile_cache)
    return driver.drive(grid)
