"""What the measured trials say about the points not yet measured: an additive model of each
objective and of feasibility over the knobs' values.

Why additive: on the tuner's spaces a knob's effect barely depends on the others (NCCL LL
lowers TPOT with or without speculation, n-gram speculation helps concurrency 1 whether the
engine is compiled or eager), so a point's objectives are close to the baseline's plus one
effect per changed value. In log units the effects are relative ("+12 % throughput"), so one
prior scale fits throughput and latency alike. The model is Bayesian linear regression on a
one-hot encoding of the active values (plus a trend for ordered numeric knobs, so k=4 is
expected between k=3 and k=5): a value never measured keeps its prior uncertainty, which is
what sends the search to it, and a value measured once is known up to the noise.

Feasibility (probe passed, knob applied, limits met, the server started) is a logistic model
on the same features: a value that made every trial with it infeasible (a CUDA-graph mode
the platform silently downgrades) drags the probability of every point with it down.

Pure: numpy only, no Optuna, no I/O.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tuner.study import space
from tuner.study.spec import StudySpec

__all__ = ["Encoder", "Fit", "fit", "feasibility_weights", "probability", "margin", "expected_gain",
           "to_model_units", "PRIOR_SCALE", "NOISE", "STOPPED_NOISE"]

# Prior standard deviation of one value's effect, in log units: a knob value typically moves
# an objective by a few percent to a factor of two (log 2 = 0.69).
PRIOR_SCALE = 0.5
# Measurement noise of a told objective in log units (~5 %: the level noise the load
# generator reports on shared machines), and of an optimistic bound told by a trial stopped
# early (it can be well above what the trial would have measured).
NOISE = 0.05
STOPPED_NOISE = 0.25
# Logistic feasibility: prior scale of a value's log-odds, and the prior log-odds of any
# point (most points of a study file are expected to run).
FEASIBLE_PRIOR_SCALE = 4.0
FEASIBLE_PRIOR_LOGIT = 1.5
_NEWTON_STEPS = 12
# A conditional parameter's per-branch effects, relative to PRIOR_SCALE (see Encoder).
BRANCH_SCALE = 0.5


class Encoder:
    """Feature vectors of the points of a study's space: an intercept, one indicator per
    (parameter, value) and, for a parameter whose values are ordered numbers, its position
    between the lowest and the highest value (0..1) while it is active.

    A conditional parameter also gets indicators of its own for each value of the
    parameters its condition names, with a smaller prior (``BRANCH_SCALE``): k=4 under n-gram
    speculation and k=4 under MTP share what they have in common (longer drafts cost more
    verification) while the model can still learn where they differ (n-gram drafts are free
    and often rejected, MTP's are accepted more and cost a forward pass)."""

    def __init__(self, spec: StudySpec) -> None:
        self.params = space.ordered_parameters(spec)
        self._parents = {p.name: tuple(p.when) for p in self.params}
        self._index: dict[tuple[str, tuple[tuple[str, str], ...], str], int] = {}
        self._trend: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[int, float, float]] = {}
        scales = [1.0]
        for param in self.params:
            domain = param.domain() or []
            numbers = [v for v in domain if isinstance(v, (int, float)) and not isinstance(v, bool)]
            branches = [()] + (_branches(param) if param.when and BRANCH_SCALE > 0 else [])
            for branch in branches:
                scale = PRIOR_SCALE * (BRANCH_SCALE if branch else 1.0)
                for value in domain:
                    self._index[(param.name, branch, _text(value))] = len(scales)
                    scales.append(scale)
                if len(numbers) >= 3:
                    self._trend[(param.name, branch)] = (len(scales), float(min(numbers)), float(max(numbers)))
                    scales.append(scale)
        self.width = len(scales)
        # Prior standard deviation of each feature's effect (the intercept's is fit's).
        self.prior_scale = np.array(scales)

    def _branch(self, name: str, values: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
        return tuple((parent, _text(values.get(parent))) for parent in self._parents.get(name, ()))

    def feature_ids(self, values: Mapping[str, Any]) -> list[int]:
        """Indices of the indicator features a point switches on (intercept included)."""

        out = [0]
        for name, value in values.items():
            for branch in ((), self._branch(name, values)) if self._parents.get(name) else ((),):
                index = self._index.get((name, branch, _text(value)))
                if index is not None:
                    out.append(index)
        return out

    def encode(self, points: Sequence[Mapping[str, Any]]) -> np.ndarray:
        """One row per point."""

        x = np.zeros((len(points), self.width))
        for row, values in enumerate(points):
            x[row, self.feature_ids(values)] = 1.0
            for (name, branch), (col, low, high) in self._trend.items():
                value = values.get(name)
                if (isinstance(value, (int, float)) and not isinstance(value, bool) and high > low
                        and branch in ((), self._branch(name, values))):
                    x[row, col] = (float(value) - low) / (high - low)
        return x


def _branches(param: Any) -> list[tuple[tuple[str, str], ...]]:
    """Every combination of the values that the parameters in ``param``'s condition take
    when it is active (one empty branch for an unconditional parameter)."""

    options = [[(parent, _text(v)) for v in (want if isinstance(want, list) else [want])]
               for parent, want in param.when.items()]
    return [tuple(combo) for combo in itertools.product(*options)]


def _text(value: Any) -> str:
    return repr(value)


def to_model_units(rows: np.ndarray, directions: Sequence[str]) -> tuple[np.ndarray, list[bool]]:
    """Objective values turned into 'larger is better' model units: log of a positive
    objective (effects are relative), else the value over the spread seen. Returns the
    transformed rows and, per objective, whether the log was taken."""

    out = np.empty_like(rows, dtype=float)
    logs = []
    for j, direction in enumerate(directions):
        col = rows[:, j].astype(float)
        use_log = bool(len(col)) and bool(np.all(col > 0))
        if use_log:
            col = np.log(col)
        else:
            spread = float(np.max(col) - np.min(col)) if len(col) else 0.0
            col = col / (spread if spread > 0 else max(1.0, float(np.max(np.abs(col))) if len(col) else 1.0))
        out[:, j] = col if direction == "maximize" else -col
        logs.append(use_log)
    return out, logs


@dataclass
class Fit:
    """The posterior of every objective's effects: mean (width x objectives) and a square root
    of the covariance (``half @ half.T``), shared by the objectives (same features, same
    noise model)."""

    mean: np.ndarray
    half: np.ndarray

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Posterior mean of each objective at each row of ``x`` (rows x objectives)."""

        return np.asarray(x @ self.mean, dtype=float)

    def sample(self, x: np.ndarray, draws: int, rng: np.random.Generator) -> np.ndarray:
        """``draws`` joint posterior draws of every objective at the rows of ``x``:
        an array (rows x draws x objectives)."""

        width, n_obj = self.mean.shape
        dev = (self.half @ rng.standard_normal((width, draws * n_obj))).reshape(width, draws, n_obj)
        return np.asarray(np.einsum("rw,wdo->rdo", x, self.mean[:, None, :] + dev), dtype=float)

    def std(self, x: np.ndarray) -> np.ndarray:
        """Posterior standard deviation of the model at each row of ``x`` (same for every
        objective)."""

        return np.asarray(np.sqrt(np.sum(np.square(np.einsum("nf,fg->ng", x, self.half)), axis=1)), dtype=float)


def _gram(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x^T diag(w) x. einsum, not BLAS: OpenBLAS spreads a product this small over threads,
    which on a shared, busy machine costs 50 times the arithmetic in waiting."""

    return np.asarray(np.einsum("ni,n,nj->ij", x, w, x), dtype=float)


def fit(x: np.ndarray, y: np.ndarray, noise: np.ndarray, scale: np.ndarray | None = None) -> Fit:
    """Bayesian linear regression of every column of ``y`` (model units) on ``x``:
    effects ~ N(0, scale^2) (default PRIOR_SCALE; ``Encoder.prior_scale``), the intercept
    around the mean of what was seen, each row with its own noise standard deviation."""

    width = x.shape[1]
    center = y.mean(axis=0) if len(y) else np.zeros(y.shape[1])
    prior = 1.0 / np.square(scale) if scale is not None else np.full(width, 1.0 / PRIOR_SCALE ** 2)
    prior[0] = 1.0 / 4.0     # the intercept is free to move (2 log units)
    w = 1.0 / np.square(noise)
    precision = _gram(x, w) + np.diag(prior)
    half = np.linalg.inv(np.linalg.cholesky(precision)).T      # precision = L L^T, cov = L^-T L^-1
    rhs = np.einsum("ni,n,no->io", x, w, y - center)
    mean = half @ (half.T @ rhs)
    mean[0] += center
    return Fit(mean, half)


def feasibility_weights(x: np.ndarray, feasible: np.ndarray, start: np.ndarray | None = None) -> np.ndarray:
    """Log-odds weights of the logistic feasibility model fitted to the measured rows ``x``
    (``feasible``: 1 or 0), at the posterior mode (Newton steps from ``start``: the last
    fit, one trial ago, is a few steps from this one)."""

    width = x.shape[1]
    prior = np.full(width, 1.0 / FEASIBLE_PRIOR_SCALE ** 2)
    prior[0] = 1.0
    w = _prior_mean(width) if start is None or start.shape != (width,) else start.copy()
    if not len(x):
        return _prior_mean(width)
    target = feasible.astype(float)
    mu = _prior_mean(width)

    def log_post(v: np.ndarray) -> float:
        z = x @ v
        # log p = -log(1 + e^-z), log(1 - p) = -log(1 + e^z)
        return float(-np.sum(target * np.logaddexp(0.0, -z) + (1 - target) * np.logaddexp(0.0, z))
                     - 0.5 * np.sum(prior * (v - mu) ** 2))

    current = log_post(w)
    for _ in range(_NEWTON_STEPS):
        p = _sigmoid(x @ w)
        grad = x.T @ (target - p) - prior * (w - mu)
        hess = _gram(x, p * (1 - p)) + np.diag(prior)
        step = np.linalg.solve(hess, grad)
        # Newton overshoots where the sigmoid saturates (a value that was always infeasible):
        # halve the step until the posterior improves.
        for _ in range(20):
            trial = log_post(w + step)
            if trial >= current:
                break
            step = step / 2
        w, current = w + step, max(current, trial)
        if float(np.max(np.abs(step))) < 1e-4:     # log-odds: far below what matters
            break
    return w


def probability(candidates: np.ndarray, weights: np.ndarray) -> np.ndarray:
    return _sigmoid(candidates @ weights)


def _prior_mean(width: int) -> np.ndarray:
    mean = np.zeros(width)
    mean[0] = FEASIBLE_PRIOR_LOGIT
    return mean


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return np.asarray(1.0 / (1.0 + np.exp(-np.clip(z, -30.0, 30.0))), dtype=float)


def margin(values: np.ndarray, front: np.ndarray) -> np.ndarray:
    """Additive-epsilon margin of each value vector (last axis: objectives, larger is better)
    over the front (points x objectives): by how much, in model units, it beats every front
    point in its best objective - positive when it would join the front, negative when
    dominated (how far it falls short). No front: 1 everywhere."""

    if len(front) == 0:
        return np.ones(values.shape[:-1])
    out = np.full(values.shape[:-1], math.inf)
    for point in front:
        out = np.minimum(out, np.max(values - point, axis=-1))
    return out


def expected_gain(draws: np.ndarray, front: np.ndarray) -> np.ndarray:
    """Expected additive-epsilon improvement of each row of posterior draws (rows x draws x
    objectives) over the front: the mean of the margin floored at 0."""

    return np.asarray(np.mean(np.maximum(margin(draws, front), 0.0), axis=1), dtype=float)
