"""The sampler a study uses, chosen on evidence (issue 8), and how parameters are suggested.

The orchestrator takes ``make_sampler``, ``suggest`` and ``grid_points`` from here (one
module: the benchmark and the tuner cannot drift apart). ``benchmarks/search_efficiency.py``
replays whole studies against the simulator's ground truth (``tuner.sim.truth``, every
point of the space) through the orchestrator's ask / tell logic, with 3 % measurement noise,
and counts the trials needed to reach 95 % of the true Pareto front's hypervolume. On
``search_spaces/glm5-8xpcie.yaml``, 10 seeds (median, 25-75 %): ``make_sampler``'s default
36.5 (32-55, worst 78, all seeds); univariate TPE 56.5; the earlier default (multivariate
TPE, group, constant_liar, 10 random start-up trials) 60.5 (50 - >100, 3 seeds never got
there); NSGA-II >100; random search 341.5. benchmarks/results/search_efficiency.json has
every figure.

* ``make_sampler`` - for 'tpe': ``ParetoLocalSampler`` around a univariate TPE
  (constant_liar: parallel GPU groups are not handed the same proposal). After the start-up
  trials, half of the trials measure an unmeasured one-knob neighbour of a point on the
  current front; the other half are TPE's. Why it wins here: a knob's effect barely depends
  on the others (NCCL LL lowers TPOT with or without speculation), so the front's points
  are one step apart (LL + MTP k=2 next to LL + MTP k=3), while TPE, having found one of
  them, keeps proposing points it has already measured: 76 % of the earlier multivariate TPE's
  proposals on glm5 were repeats (told the earlier result, which sharpens the repeat further; after 25
  in a row the orchestrator runs a random point), against 19 % here. NSGA-II, random and
  grid are unchanged.
* ``initial_design`` - the baseline with one knob changed at a time (an alternative start
  that the benchmark also measures: with multivariate TPE it reached 95 % in 42 trials).

Optuna sampler objects (stateful); the pure helpers they use are in ``tuner.study.sampling``.
"""


from __future__ import annotations

import copy
import math
import random
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.study import Study
from optuna.trial import FrozenTrial, Trial, TrialState

from tuner.study import planner, space
from tuner.study.pareto import Point, pareto_front
from tuner.study.sampling import neighbours
from tuner.study.spec import StudySpec

__all__ = ["make_sampler", "suggest", "ParetoLocalSampler", "PlannedSampler",
           "observations", "STARTUP_TRIALS", "HISTORY_LIMIT"]

STARTUP_TRIALS = 10
LOCAL_SHARE = 0.5
# Finished trials the wrapped sampler (TPE) sees besides the current feasible front, once
# the study has more: the newest ones, at least HISTORY_SHARE of them. TPE re-splits every
# trial it is shown for every parameter it suggests (non-domination ranks, every trial's
# constraints decoded): about 70 ms of CPU per TPE proposal at 1,000 trials. Shown fewer old
# trials it forgets bad regions it measured long ago, so the bound is loose and late. The
# benchmark's studies are too short to test it as set (100 trials); scaled into them
# (glm5, 30 seeds, median trials to 95 % HV): unbounded 41 (30/30 seeds), the newest 50 from
# trial 51 on 41 (29/30), the newest 30 from trial 31 on 42.5 (30/30, p75 63 instead of 57),
# the newest half from the start 52.5 - trimming early hurts, hence the 300-trial floor.
HISTORY_LIMIT = 300
HISTORY_SHARE = 0.5     # ... and never fewer than this share of the finished trials
def make_sampler(spec: StudySpec, *, design_size: int = 0, budget: int | None = None) -> optuna.samplers.BaseSampler:
    """The study's sampler.

    'auto' (the default): ``PlannedSampler`` - an initial design sized from the space and the
    budget (``tuner.study.planner``), then in an enumerable space the unmeasured point with
    the largest expected improvement; in a space that cannot be enumerated, after the design,
    the 'tpe' sampler below with no random start-up of its own.

    'tpe': ``ParetoLocalSampler`` (half of the trials after the first ``STARTUP_TRIALS``: an
    unmeasured one-knob change of a current front point) around a univariate TPE with
    constant_liar (parallel groups are not handed the same proposal). ``design_size``:
    points enqueued before the sampler's own proposals (baseline + any initial design); TPE
    then needs that many fewer random start-up trials.

    ``budget``: the study's trial budget when it differs from the file's (``--n-trials``);
    the design's share is taken of it.
    """

    s = spec.sampler
    if s.name == "auto":
        tpe = optuna.samplers.TPESampler(seed=s.seed, constant_liar=True,
                                         n_startup_trials=s.n_startup_trials or 0)
        local = ParetoLocalSampler(tpe, spec, local=LOCAL_SHARE, min_trials=0, seed=s.seed)
        return PlannedSampler(spec, budget=budget, seed=s.seed, fallback=local)
    if s.name == "tpe":
        startup = s.n_startup_trials if s.n_startup_trials is not None else max(0, STARTUP_TRIALS - design_size)
        tpe = optuna.samplers.TPESampler(seed=s.seed, constant_liar=True, n_startup_trials=startup)
        return ParetoLocalSampler(tpe, spec, local=LOCAL_SHARE, min_trials=max(startup, design_size),
                                  seed=s.seed)
    if s.name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=s.seed,
                                             population_size=max(4, min(20, spec.budget.n_trials // 3)))
    # "random" and "grid": grid points are enqueued by the orchestrator in shuffled order.
    return optuna.samplers.RandomSampler(seed=s.seed)


def suggest(trial: Trial, param: Any) -> Any:
    """Ask Optuna for one parameter's value (the orchestrator suggests in
    ``space.ordered_parameters`` order and skips inactive ones)."""

    if param.kind == "categorical":
        return trial.suggest_categorical(param.name, param.values)
    if param.kind == "bool":
        return trial.suggest_categorical(param.name, [False, True])
    if param.kind == "int":
        return trial.suggest_int(param.name, param.low, param.high, step=param.step, log=param.log)
    return trial.suggest_float(param.name, param.low, param.high, step=param.step, log=param.log)


class _PlanFirst(BaseSampler):
    """A sampler that hands some trials a whole planned point (``_plans``, by trial number)
    and leaves every other suggestion to ``_inner``, shown the study ``_study_for`` gives."""

    _inner: BaseSampler
    _plans: dict[int, dict[str, Any]]

    def _study_for(self, study: Study, trial: FrozenTrial) -> Study:
        return study

    def infer_relative_search_space(self, study: Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        if trial.number in self._plans:
            return {}
        return self._inner.infer_relative_search_space(self._study_for(study, trial), trial)

    def sample_relative(self, study: Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if trial.number in self._plans:
            return {}
        return self._inner.sample_relative(self._study_for(study, trial), trial, search_space)

    def sample_independent(self, study: Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        plan = self._plans.get(trial.number)
        if plan is not None and param_name in plan:
            return plan[param_name]
        return self._inner.sample_independent(self._study_for(study, trial), trial, param_name, param_distribution)

    def after_trial(self, study: Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        self._plans.pop(trial.number, None)
        self._inner.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self._inner.reseed_rng()


class ParetoLocalSampler(_PlanFirst):
    """Wraps a sampler; once ``min_trials`` trials are done, a share ``local`` of the trials
    measures an unmeasured neighbour (one parameter changed) of a point on the current
    feasible front, the others are left to the wrapped sampler.

    Why: on the tuner's discrete spaces a knob's effect is mostly independent of the others
    (NCCL LL lowers TPOT whatever the speculation), so the front's best points sit next to
    each other - LL + MTP k=2 next to LL + MTP k=3 - and a model-based sampler that has
    found one of them spends many trials before it tries the one-step change. Pareto local
    search tries exactly those; the wrapped sampler keeps exploring globally.
    """

    def __init__(self, base: BaseSampler, spec: StudySpec, *, local: float = 0.5, min_trials: int = 10,
                 seed: int | None = None, history: int | None = None) -> None:
        self._inner = base
        self._spec = spec
        self._local = local
        self._min_trials = min_trials
        self._rng = random.Random(seed)
        self._history = HISTORY_LIMIT if history is None else history
        self._plans: dict[int, dict[str, Any]] = {}
        self._started = False
        self._finished: dict[int, tuple[str | None, tuple[tuple[float, ...], dict[str, Any]] | None]] = {}
        self._view: tuple[int, int, _StudyView] | None = None

    def _entries(self, trials: Sequence[FrozenTrial]) -> tuple[list[tuple[int, tuple[float, ...], dict[str, Any]]],
                                                                 set[str]]:
        """(number, values, params) of the feasible measured trials, and the keys of all points."""

        done = []
        seen = set()
        for t in trials:
            entry = self._finished.get(t.number)
            if entry is None:
                values = t.user_attrs.get("values", t.params)
                key = space.params_key(values) if values else None
                feasible = (t.state == TrialState.COMPLETE and t.values is not None
                            and t.user_attrs.get("kind", "run") == "run"
                            and all(v <= 0 for v in t.constraints.values()) and bool(values))
                entry = (key, (tuple(t.values), values) if feasible else None)
                if t.state.is_finished():
                    self._finished[t.number] = entry    # a finished trial no longer changes
            if entry[0] is not None:
                seen.add(entry[0])
            if entry[1] is not None:
                done.append((t.number, *entry[1]))
        return done, seen

    @staticmethod
    def _front_of(study: Study, done: list[tuple[int, tuple[float, ...], dict[str, Any]]]) -> list[int]:
        """Indices into ``done`` of its Pareto front, in trial order."""

        directions = ["maximize" if d == optuna.study.StudyDirection.MAXIMIZE else "minimize"
                      for d in study.directions]
        points = [Point(i, tuple(vals)) for i, (_, vals, _) in enumerate(done)]
        return sorted(p.number for p in pareto_front(points, directions))

    def _front(self, study: Study) -> tuple[list[dict[str, Any]], set[str]]:
        # The trial list Optuna caches for this ask (TPE reads the same one): no second
        # storage read per proposal.
        done, seen = self._entries(study._get_trials(deepcopy=False, use_cache=True))
        # In trial order: the shuffle below must see the same list for the same study.
        return [done[i][2] for i in self._front_of(study, done)], seen

    def _study_for(self, study: Study, trial: FrozenTrial) -> Study:
        """The study as the wrapped sampler sees it while it suggests ``trial``'s parameters.

        The trial list read once for the proposal instead of once per parameter (constant_liar
        TPE reads the storage afresh every time; within one proposal only the trial's own
        parameters change, which TPE leaves out), and once more than ``history`` trials
        have finished: the current feasible front plus the newest finished trials (at least
        ``history`` and HISTORY_SHARE of them), plus those still running (see
        HISTORY_LIMIT). Below that size TPE sees exactly what it would read itself, so its
        proposals are the same.
        """

        if self._view is not None and self._view[:2] == (id(study), trial.number):
            return self._view[2]    # type: ignore[return-value]
        # The list Optuna read for this ask (before_trial and _front use it too); in the
        # orchestrator nothing is told between a trial's ask and its suggestions.
        trials = study._get_trials(deepcopy=False, use_cache=True)
        finished = [t for t in trials if t.state.is_finished()]
        newest = max(self._history, math.ceil(HISTORY_SHARE * len(finished)))
        if len(finished) > newest:
            done, _ = self._entries(finished)
            keep = {t.number for t in finished[-newest:]}
            keep.update(done[i][0] for i in self._front_of(study, done))
            trials = [t for t in trials if not t.state.is_finished() or t.number in keep]
        view = _StudyView(study, trials)
        self._view = (id(study), trial.number, view)
        return view    # type: ignore[return-value]

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        self._inner.before_trial(study, trial)
        if not self._started:
            # Finished trials never un-finish: once enough, stop counting (1,000 trials cost
            # milliseconds per ask otherwise). Same decisions, same random draws.
            self._started = sum(1 for _ in study.get_trials(
                deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL))) >= self._min_trials
        if (trial.params or trial.system_attrs.get("fixed_params") or not self._started
                or self._rng.random() >= self._local):
            return     # enqueued (fixed) trials, the start, and the global share
        front, seen = self._front(study)
        self._rng.shuffle(front)
        for point in front:
            fresh = [n for n in neighbours(self._spec, point) if space.params_key(n) not in seen]
            if fresh:
                self._plans[trial.number] = self._rng.choice(fresh)
                return

    def after_trial(self, study: Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        if self._view is not None and self._view[1] == trial.number:
            self._view = None
        super().after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        super().reseed_rng()
        self._rng = random.Random()


class _StudyView:
    """A study whose trial list is fixed (``ParetoLocalSampler._study_for``); everything
    else - directions, storage, metric names - is the study's own."""

    def __init__(self, study: Study, trials: list[FrozenTrial]) -> None:
        self._study = study
        self._view_trials = trials

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    def _get_trials(self, deepcopy: bool = True, states: Any = None, use_cache: bool = False) -> list[FrozenTrial]:
        trials = self._view_trials if states is None else [t for t in self._view_trials if t.state in states]
        return copy.deepcopy(trials) if deepcopy else trials

    def get_trials(self, deepcopy: bool = True, states: Any = None) -> list[FrozenTrial]:
        return self._get_trials(deepcopy, states)

    @property
    def trials(self) -> list[FrozenTrial]:
        return self._get_trials()


# Constraints that say a trial was stopped early on a bound (the orchestrator's
# ``early_stopped``; the simulated study's ``dominated``): not infeasibility.
_STOP_CONSTRAINTS = frozenset({"early_stopped", "dominated"})


def observation_of(t: FrozenTrial) -> planner.Observation | None:
    """A trial as the planner sees it (None: not a run of the point, e.g. a told repeat or
    a forbidden proposal, or a trial still waiting in the queue)."""

    values = t.user_attrs.get("values", t.params)
    if t.user_attrs.get("kind", "run") != "run" or not values or t.state == TrialState.WAITING:
        return None
    if t.state == TrialState.RUNNING:
        return planner.Observation(values, planner.RUNNING)
    if t.state != TrialState.COMPLETE or t.values is None or t.user_attrs.get("placeholder_values"):
        return planner.Observation(values, planner.FAILED)
    violated = {k for k, v in t.constraints.items() if v > 0}
    if violated - _STOP_CONSTRAINTS:
        return planner.Observation(values, planner.INFEASIBLE, tuple(t.values))
    status = planner.STOPPED if violated else planner.FEASIBLE
    return planner.Observation(values, status, tuple(t.values))


def observations(trials: Sequence[FrozenTrial]) -> list[planner.Observation]:
    return [o for o in map(observation_of, trials) if o is not None]


class PlannedSampler(_PlanFirst):
    """Proposes whole points chosen by ``tuner.study.planner`` (initial design, then the
    unmeasured point with the largest expected improvement); enqueued trials (baseline,
    starting points, grid) keep their values. Once every allowed point is known it hands
    the proposal to ``fallback`` (the orchestrator tells such a repeat the earlier result
    and stops when nothing new comes)."""

    def __init__(self, spec: StudySpec, *, budget: int | None = None, seed: int | None = None,
                 fallback: BaseSampler | None = None, design_share: float = planner.DESIGN_SHARE) -> None:
        self._spec = spec
        self._design_share = design_share
        self._budget = budget
        self._seed = seed or 0
        self._planner: planner.Planner | None = None
        self._inner = fallback or optuna.samplers.RandomSampler(seed=seed)
        self._plans: dict[int, dict[str, Any]] = {}
        self._finished: dict[int, planner.Observation | None] = {}

    def _observations(self, study: Study) -> list[planner.Observation]:
        out = []
        for t in study._get_trials(deepcopy=False, use_cache=True):
            if t.number in self._finished:
                o = self._finished[t.number]
            else:
                o = observation_of(t)
                if t.state.is_finished():
                    self._finished[t.number] = o    # a finished trial no longer changes
            if o is not None:
                out.append(o)
        return out

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        if not (trial.params or trial.system_attrs.get("fixed_params")):
            if self._planner is None:
                self._planner = planner.Planner(self._spec, budget=self._budget, design_share=self._design_share)
            # Seeded by the study's seed and size: a resumed study makes the same choice.
            plan = self._planner.plan(self._observations(study), seed=self._seed * 1_000_003 + trial.number)
            if plan is not None:
                self._plans[trial.number] = plan
                return
        self._inner.before_trial(study, trial)
