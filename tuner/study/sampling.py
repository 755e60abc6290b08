"""Pure helpers of the search: the grid's points, the one-knob-at-a-time design and a
point's one-knob neighbours. No Optuna: plain values over the study's space.

The Optuna sampler that uses them (``ParetoLocalSampler``) and the
sampler a study runs (``make_sampler``) are in ``tuner.engine.samplers``.
"""

from __future__ import annotations

from typing import Any

from tuner.study import space
from tuner.study.parameters import FloatParam, IntParam
from tuner.study.spec import StudySpec

__all__ = ["grid_points", "initial_design", "neighbours", "MAX_DESIGN_FRACTION"]

# The design never takes more than this share of the budget: on a wide space with many
# values per knob, one-at-a-time would otherwise spend the whole night on the start.
MAX_DESIGN_FRACTION = 0.4


def grid_points(spec: StudySpec) -> list[dict[str, Any]]:
    """Every allowed point of a discrete space (active parameters only, forbidden rules
    applied), in file order: the 'grid' sampler's points and the ground truth's."""

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


def _representative(param: Any, current: Any) -> list[Any]:
    """Values of ``param`` to try one at a time (all of a discrete domain except ``current``;
    low/middle/high of a continuous one)."""

    domain = param.domain()
    if domain is None:
        mid = (param.low + param.high) / 2
        domain = [param.low, mid, param.high]
    return [v for v in domain if not (v == current and type(v) is type(current))]


def initial_design(spec: StudySpec, *, budget: int | None = None, children: bool = False) -> list[dict[str, Any]]:
    """Baseline with one parameter changed at a time (children of a newly activated branch at
    their default or middle value); with ``children`` also each child parameter varied once
    under its first activating branch. Forbidden points and duplicates dropped; at most
    ``MAX_DESIGN_FRACTION`` of the budget. The baseline itself is not included."""

    base = space.baseline_values(spec)
    limit = int((budget if budget is not None else spec.budget.n_trials) * MAX_DESIGN_FRACTION)
    seen = {space.params_key(base)}
    points: list[dict[str, Any]] = []
    for param in space.ordered_parameters(spec):
        if param.name not in base:
            continue   # inactive at the baseline: reached through its parent's values below
        points += _one_knob_variants(spec, base, param, seen)
    # Children that only exist off the baseline (spec_k under spec_method): vary them at
    # their parent's first activating value too, so each child value is seen once.
    for param in space.ordered_parameters(spec) if children else []:
        if param.name in base or not param.when:
            continue
        anchor = next((p for p in points if param.name in p), None)
        if anchor is None:
            continue
        points += _one_knob_variants(spec, anchor, param, seen)
    return points[:max(0, limit)]


def _complete(spec: StudySpec, values: dict[str, Any], *, changed: str) -> dict[str, Any]:
    """Active parameters only; a parameter that just became active takes its default (or
    the middle of its domain), so the point differs from its anchor in as little as possible."""

    out: dict[str, Any] = {}
    for param in space.ordered_parameters(spec):
        if not space.is_active(param, out):
            continue
        if param.name in values:
            out[param.name] = values[param.name]
            continue
        domain = param.domain()
        if param.default is not None:
            out[param.name] = param.default
        elif domain:
            out[param.name] = domain[len(domain) // 2]
        elif isinstance(param, (IntParam, FloatParam)):   # a float without a step
            out[param.name] = (param.low + param.high) / 2
    return out


def neighbours(spec: StudySpec, values: dict[str, Any]) -> list[dict[str, Any]]:
    """Allowed points that differ from ``values`` in one parameter (children that become
    active take their default or middle value, children that become inactive are dropped)."""

    out = []
    seen = {space.params_key(values)}
    for param in space.ordered_parameters(spec):
        if param.name not in values:
            continue
        out += _one_knob_variants(spec, values, param, seen)
    return out


def _one_knob_variants(spec: StudySpec, values: dict[str, Any], param: Any,
                       seen: set[str]) -> list[dict[str, Any]]:
    """``values`` with ``param`` moved to each of its representative values (children
    completed), skipping forbidden points and those in ``seen``, which it extends."""

    out = []
    for value in _representative(param, values[param.name]):
        point = _complete(spec, {**values, param.name: value}, changed=param.name)
        key = space.params_key(point)
        if key in seen or space.forbidden_reason(spec, point) is not None:
            continue
        seen.add(key)
        out.append(point)
    return out
