"""The next point to measure in an enumerable space: an initial design that fits the space,
then the unmeasured point with the largest expected improvement of the front.

Why not a fixed number of random start-up trials: real studies are small (a night on a GPU
box affords 30-60 trials, the allowed space often holds a few dozen points), and ten random
proposals in a 16-point space are most of the study. Here:

1. The baseline and the study's starting points run first (the orchestrator enqueues them).
2. *Design*: one-knob-at-a-time moves from the best points known so far (the current
   feasible front), each bringing a knob value no trial has had yet, until every value of
   every knob that can be reached this way has been seen once (children of a branch at
   their default or middle value): as many trials as the condition tree has values beyond
   the baseline's, at most ``DESIGN_SHARE`` of the budget. Among the moves available, the
   one with the largest expected improvement goes first. Every other proposal of this phase
   is the model's own pick (3.): where the front lies several knobs away from the baseline,
   one-knob moves alone would walk there one step at a time.
3. *Model*: every allowed point not yet known, ranked by the expected improvement the
   additive model (``tuner.study.surrogate``) predicts for it times the probability that it
   runs feasibly. A value never measured keeps its prior spread, so the ranking explores
   what it has not seen (space filling) and exploits what it has.

No wasted proposals: a point already run, running, failed, stopped or forbidden is never
proposed while an allowed point remains unknown; when few remain they come in the order of
their expected improvement. ``plan`` returns None only when every allowed point is known.

Pure: plain values in, plain values out (``Observation`` records); the Optuna sampler that
uses it is ``tuner.engine.samplers.PlannedSampler``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tuner.study import space, surrogate
from tuner.study.sampling import grid_points, neighbours
from tuner.study.spec import StudySpec

__all__ = ["Observation", "Planner", "enumerable", "DESIGN_SHARE", "MAX_POINTS", "DRAWS",
           "FEASIBLE", "INFEASIBLE", "STOPPED", "FAILED", "RUNNING"]

# The design never takes more than this share of the budget (a wide space with many values
# per knob would otherwise spend the night on it).
DESIGN_SHARE = 0.4
# Spaces up to this many allowed points are enumerated and ranked point by point (the
# largest shipped space, glm5-8xpcie-large, has 5,096); larger or continuous ones keep
# the TPE-based sampler.
MAX_POINTS = 20_000
# Posterior draws per ranking: enough for a stable expectation at a few milliseconds.
DRAWS = 32
# Only points whose optimistic value (posterior mean + OPTIMISM standard deviations) would
# join the front are drawn for; the others cannot expect an improvement worth the draws.
OPTIMISM = 3.0
# Below this probability of being feasible a point ranks after every likelier one (its
# score is scaled by DOUBTFUL).
P_FEASIBLE_MIN = 0.25
DOUBTFUL = 1e-6

# Observation statuses: measured and feasible; measured but infeasible (probe failed, a knob
# not applied, a limit missed, failed requests); stopped early on a bound (feasible as far as
# known, its told values optimistic); failed to run (server error, timeout); still running.
FEASIBLE, INFEASIBLE, STOPPED, FAILED, RUNNING = "feasible", "infeasible", "stopped", "failed", "running"


@dataclass(frozen=True)
class Observation:
    """One trial as the planner sees it: its point, what became of it, and the objective
    values it was told (measured trials, feasible or not, and stopped ones)."""

    values: dict[str, Any]
    status: str
    objectives: tuple[float, ...] | None = None
    key: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not self.key:
            # Computed once: a study of 1,000 trials asks for every key at every proposal.
            object.__setattr__(self, "key", space.params_key(self.values))


def enumerable(spec: StudySpec) -> bool:
    """Whether the allowed space is small and discrete enough to rank point by point."""

    count, continuous, exact = space.discrete_size(spec, cap=MAX_POINTS + 1)
    return continuous == 0 and exact and 0 < count <= MAX_POINTS


class Planner:
    """The allowed points of one study, encoded once; ``plan`` picks the next one.

    A space that is not enumerable (a continuous knob, or more than ``MAX_POINTS`` points)
    gets the design only: ``plan`` returns None after it, and the caller's own sampler
    (TPE) takes over.
    """

    def __init__(self, spec: StudySpec, *, budget: int | None = None, design_share: float = DESIGN_SHARE) -> None:
        self.spec = spec
        self.directions = [o.direction for o in spec.objectives]
        self.enumerable = enumerable(spec)
        self.points = grid_points(spec) if self.enumerable else []
        self.keys = [space.params_key(p) for p in self.points]
        self._row = {k: i for i, k in enumerate(self.keys)}
        self.encoder = surrogate.Encoder(spec)
        self.x = self.encoder.encode(self.points)
        self.budget = budget if budget is not None else spec.budget.n_trials
        self.design_limit = int(self.budget * design_share)
        self._feasible_w: np.ndarray | None = None     # the last feasibility fit (warm start)

    # -- the decision --------------------------------------------------------------------
    def plan(self, observations: Sequence[Observation], *, seed: int) -> dict[str, Any] | None:
        """The next point to run; None when every allowed point is known (or, in a space
        that is not enumerable, once the design is done)."""

        known = {o.key for o in observations}
        rng = np.random.default_rng(seed)
        finished = sum(1 for o in observations if o.status != RUNNING)
        design = self._design_moves(observations, known) if finished < self.design_limit else []
        if not self.enumerable:
            return dict(design[int(rng.integers(len(design)))]) if design else None
        if len(observations) % 2 == 0:
            # Every other proposal is the model's: where the front lies several knobs away from
            # the baseline (compiled + bfloat16 + n-gram on the CPU build), one-knob moves
            # alone would walk there one step at a time.
            design = []
        pool = [self._row[space.params_key(p)] for p in design]
        if not pool:
            pool = [i for i, k in enumerate(self.keys) if k not in known]
        if not pool:
            return None
        scores = self._scores(observations, pool, rng)
        return dict(self.points[pool[_argmax(scores, rng)]])

    # -- design ----------------------------------------------------------------------------
    def _design_moves(self, observations: Sequence[Observation], known: set[str]) -> list[dict[str, Any]]:
        """The unknown one-knob moves from the current front (or, before anything is
        measured feasibly, from every point tried) that bring a value no trial has had."""

        seen = {(name, repr(value)) for o in observations for name, value in o.values.items()}
        anchors = self._front_points(observations) or [o.values for o in observations]
        moves: dict[str, dict[str, Any]] = {}
        for anchor in anchors:
            for point in neighbours(self.spec, anchor):
                key = space.params_key(point)
                if key in known or key in moves:
                    continue
                if any((name, repr(value)) not in seen for name, value in point.items()):
                    moves[key] = point
        return list(moves.values())

    def _front_points(self, observations: Sequence[Observation]) -> list[dict[str, Any]]:
        rows = [(o.values, o.objectives) for o in observations if o.status == FEASIBLE and o.objectives]
        if not rows:
            return []
        y, _ = surrogate.to_model_units(np.array([r[1] for r in rows], dtype=float), self.directions)
        return [rows[i][0] for i in _front_rows(y)]

    # -- model -------------------------------------------------------------------------------
    def _encode(self, observations: Sequence[Observation]) -> np.ndarray:
        """Feature rows of the observed points: the precomputed row of an allowed point."""

        rows = [self._row.get(o.key) for o in observations]
        known = [r for r in rows if r is not None]
        if len(known) == len(rows):
            return self.x[known] if known else np.zeros((0, self.x.shape[1]))
        return self.encoder.encode([o.values for o in observations])

    def _scores(self, observations: Sequence[Observation], pool: list[int],
                rng: np.random.Generator) -> np.ndarray:
        """Per row of ``pool``: (expected improvement x P(feasible), closeness x
        P(feasible)); the second ranks rows when the model expects no improvement anywhere
        (closeness: exp of the predicted margin, 1 for a row predicted to join the front)."""

        if not pool:
            return np.zeros((0, 2))
        cand = self.x[pool]
        tried = [o for o in observations if o.status != RUNNING]
        self._feasible_w = surrogate.feasibility_weights(
            self._encode(tried), np.array([o.status in (FEASIBLE, STOPPED) for o in tried]), self._feasible_w)
        p_ok = surrogate.probability(cand, self._feasible_w)
        # Every measurement informs the performance model, infeasible ones too: a knob the
        # platform silently ignores measured what the server really ran (so the model stops
        # expecting a change from it), and a failed probe does not make the speed unreal.
        # Feasibility is the other model's business.
        told = [o for o in tried if o.objectives]
        if not told:
            # Nothing measured yet: every point is as good as any other; prefer the feasible.
            return np.stack([p_ok, p_ok], axis=1)
        y, _ = surrogate.to_model_units(np.array([o.objectives for o in told], dtype=float), self.directions)
        noise = np.array([surrogate.STOPPED_NOISE if o.status == STOPPED else surrogate.NOISE for o in told])
        model = surrogate.fit(self._encode(told), y, noise, self.encoder.prior_scale)
        front = y[_front_rows(y, [o.status == FEASIBLE for o in told])]
        running = [o for o in observations if o.status == RUNNING]
        if running:
            # Pending trials count as if they had measured what the model expects
            # (kriging believer): a parallel group is not sent next to a running one.
            front = np.vstack([front, model.predict(self._encode(running))])
            front = front[_front_rows(front)]
        mean = model.predict(cand)
        hopeful = np.flatnonzero(surrogate.margin(mean + OPTIMISM * model.std(cand)[:, None], front) > 0)
        gain = np.zeros(len(pool))
        if len(hopeful):
            gain[hopeful] = surrogate.expected_gain(model.sample(cand[hopeful], DRAWS, rng), front)
        close = np.exp(np.minimum(surrogate.margin(mean, front), 0.0))
        # A point that is probably infeasible comes after every other, whatever its expected
        # gain: its values are often ones that never measured anything (a knob the platform
        # does not apply stops at startup), so the performance model knows nothing of them
        # and expects much.
        doubtful = np.where(p_ok < P_FEASIBLE_MIN, DOUBTFUL, 1.0)
        return np.stack([gain * p_ok * doubtful, close * p_ok * doubtful], axis=1)


def _front_rows(y: np.ndarray, eligible: Sequence[bool] | None = None) -> list[int]:
    """Indices of the non-dominated rows of ``y`` (larger is better) among the eligible, in
    row order; identical rows are all kept. With two objectives a sort and a running maximum
    leave only the candidates (a row below the best second objective of the rows ahead of it
    in the first is dominated); those are then compared pairwise."""

    idx = np.arange(len(y)) if eligible is None else np.flatnonzero(np.asarray(eligible, dtype=bool))
    if len(idx) == 0:
        return []
    z = y[idx]
    if z.shape[1] == 2:
        order = np.lexsort((-z[:, 1], -z[:, 0]))
        ahead = np.maximum.accumulate(np.concatenate([[-np.inf], z[order[:-1], 1]]))
        cand = order[z[order, 1] >= ahead]
    else:
        cand = np.arange(len(z))
    c = z[cand]
    dominated = np.any(np.all(c[None, :, :] >= c[:, None, :], axis=2) & np.any(c[None, :, :] > c[:, None, :], axis=2),
                       axis=1)
    return sorted(int(i) for i in idx[cand[~dominated]])


def _argmax(scores: np.ndarray, rng: np.random.Generator) -> int:
    """The best row by (score, fallback), ties broken at random."""

    best = float(np.max(scores[:, 0]))
    if best > 0 and math.isfinite(best):
        top = np.flatnonzero(scores[:, 0] >= best * (1 - 1e-9))
    else:
        second = float(np.max(scores[:, 1]))
        top = np.flatnonzero(scores[:, 1] >= second * (1 - 1e-9))
    return int(rng.choice(top))
