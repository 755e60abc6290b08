"""Samplers and how a study's parameters are suggested to Optuna."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import Trial

from tuner.core import space
from tuner.core.spec import StudySpec

__all__ = ["make_sampler", "suggest", "grid_points"]


def make_sampler(spec: StudySpec) -> optuna.samplers.BaseSampler:
    s = spec.sampler
    if s.name == "tpe":
        # constant_liar: trials still running count as bad points, so parallel groups are
        # not handed the same proposal.
        kwargs: dict[str, Any] = {"seed": s.seed, "multivariate": True, "group": True,
                                  "constant_liar": True}
        if s.n_startup_trials is not None:
            kwargs["n_startup_trials"] = s.n_startup_trials
        return optuna.samplers.TPESampler(**kwargs)
    if s.name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=s.seed, population_size=max(4, min(20, spec.budget.n_trials // 3)))
    # "random" and "grid": grid points are enqueued by the orchestrator in shuffled order.
    return optuna.samplers.RandomSampler(seed=s.seed)


def suggest(trial: Trial, param: Any) -> Any:
    if param.kind == "categorical":
        return trial.suggest_categorical(param.name, param.values)
    if param.kind == "bool":
        return trial.suggest_categorical(param.name, [False, True])
    if param.kind == "int":
        return trial.suggest_int(param.name, param.low, param.high, step=param.step, log=param.log)
    return trial.suggest_float(param.name, param.low, param.high, step=param.step, log=param.log)


def grid_points(spec: StudySpec) -> list[dict[str, Any]]:
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
