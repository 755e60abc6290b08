"""The search space: conditions, forbidden combinations, baseline, size and its tree, and
a point's server command (``trial_command``: its settings by target through the one
renderer, ``tuner.vllm.knobs.render_command``; trials, confirmation re-runs, ``tuner
export`` and the simulator's ground truth all call it, so a study exports what it measured).

Pure functions over a ``StudySpec`` (no Optuna); ``tuner.engine.samplers`` turns a parameter
into an Optuna distribution and suggests parameters in ``ordered_parameters()`` order, so a
parameter is only suggested once every parameter its condition names has a value.
"""

from __future__ import annotations

import math
import posixpath
import random
import sys
from collections.abc import Mapping
from typing import Any

from tuner.study.parameters import BoolParam, CategoricalParam, FloatParam, IntParam
from tuner.study.server_spec import ServerSpec
from tuner.study.spec import StudySpec
from tuner.study.trials import point_key
from tuner.vllm.compile_cache import compile_key
from tuner.vllm.knobs import RenderedCommand, render_command

__all__ = [
    "ordered_parameters",
    "is_active",
    "forbidden_reason",
    "baseline_values",
    "random_values",
    "settings_for",
    "trial_command",
    "trial_ignore_eos",
    "server_command",
    "params_key",
    "discrete_size",
    "condition_tree",
]

AnyParam = CategoricalParam | IntParam | FloatParam | BoolParam


def ordered_parameters(spec: StudySpec) -> list[AnyParam]:
    """Parameters with every condition's parents first (stable w.r.t. file order)."""

    done: list[AnyParam] = []
    names: set[str] = set()
    pending = list(spec.parameters)
    while pending:
        for p in pending:
            if all(parent in names for parent in p.when):
                done.append(p)
                names.add(p.name)
                pending.remove(p)
                break
        else:  # the spec validator rejects cycles, so this cannot loop forever
            raise ValueError("parameter conditions form a cycle")
    return done


def _matches(value: Any, expected: Any) -> bool:
    options = expected if isinstance(expected, list) else [expected]
    return any(value == o and type(value) is type(o) for o in options) or any(
        isinstance(value, (int, float)) and not isinstance(value, bool)
        and isinstance(o, (int, float)) and not isinstance(o, bool) and value == o
        for o in options
    )


def is_active(param: AnyParam, values: Mapping[str, Any]) -> bool:
    """A parameter is active when each parent is active (has a value) and matches."""

    return all(name in values and _matches(values[name], exp) for name, exp in param.when.items())


def forbidden_reason(spec: StudySpec, values: Mapping[str, Any]) -> str | None:
    """The reason of the first forbidden rule the values match, or None."""

    for rule in spec.forbidden:
        if all(name in values and _matches(values[name], exp) for name, exp in rule.when.items()):
            return rule.reason
    return None


def _default_of(param: AnyParam) -> Any:
    if param.default is not None:
        return param.default
    if isinstance(param, BoolParam):
        return False
    if isinstance(param, CategoricalParam) and None in param.values:
        return None
    raise ValueError(
        f"parameter {param.name!r} has no baseline value: add it to 'baseline:' or give the "
        "parameter a 'default' (the server's value when the knob is not set)"
    )


def baseline_values(spec: StudySpec) -> dict[str, Any]:
    """Values of the baseline trial: the study's ``baseline`` or each knob's default."""

    values: dict[str, Any] = {}
    for param in ordered_parameters(spec):
        if not is_active(param, values):
            continue
        values[param.name] = spec.baseline[param.name] if param.name in spec.baseline else _default_of(param)
    return values


def starting_point_values(spec: StudySpec) -> list[dict[str, Any]]:
    """The study's ``starting_points``, each completed the way the baseline is: a listed
    value wins, else the baseline's value, else the knob's default; inactive knobs dropped.

    Raises ValueError naming the point when it is forbidden or sets an inactive knob, so
    `tuner validate` and `tuner run` refuse it before any server starts."""

    base = baseline_values(spec) if spec.starting_points else {}
    points: list[dict[str, Any]] = []
    for i, point in enumerate(spec.starting_points):
        values: dict[str, Any] = {}
        for param in ordered_parameters(spec):
            if not is_active(param, values):
                if param.name in point:
                    cond = ", ".join(f"{k}={v!r}" for k, v in param.when.items())
                    raise ValueError(
                        f"starting_points[{i}].{param.name}: set, but the parameter is inactive "
                        f"in this point (it applies only when {cond})"
                    )
                continue
            if param.name in point:
                values[param.name] = point[param.name]
            elif param.name in base:
                values[param.name] = base[param.name]
            else:
                values[param.name] = _default_of(param)
        if (reason := forbidden_reason(spec, values)) is not None:
            raise ValueError(f"starting_points[{i}]: the point is forbidden ({reason})")
        points.append(values)
    return points


def random_values(spec: StudySpec, rng: random.Random, *, max_tries: int = 1000) -> dict[str, Any]:
    """A uniformly drawn point that no forbidden rule rejects."""

    for _ in range(max_tries):
        values: dict[str, Any] = {}
        for param in ordered_parameters(spec):
            if not is_active(param, values):
                continue
            domain = param.domain()
            if domain is not None:
                values[param.name] = rng.choice(domain)
            elif isinstance(param, FloatParam) and param.log:
                values[param.name] = math.exp(rng.uniform(math.log(param.low), math.log(param.high)))
            elif isinstance(param, (IntParam, FloatParam)):   # a float without a step
                values[param.name] = rng.uniform(param.low, param.high)
        if forbidden_reason(spec, values) is None:
            return values
    raise ValueError("no allowed point found: the forbidden rules may exclude the whole space")


def settings_for(spec: StudySpec, values: Mapping[str, Any]) -> dict[str, Any]:
    """Map parameter values to targets, dropping inactive parameters.

    A null value is kept: it means "leave this knob at the server's default", which the
    renderer omits and the verifier does not check.
    """

    out: dict[str, Any] = {}
    for param in ordered_parameters(spec):
        if param.name in values and is_active(param, values):
            out[param.target] = values[param.name]
    return out


def trial_command(spec: StudySpec, values: Mapping[str, Any], *, port: int | None = None,
                  python: str | None = None, compile_cache_dir: str | None = None,
                  running: bool = False) -> RenderedCommand:
    """The server for ``values`` (``python`` None: this interpreter): argv, the
    configuration's env, the measurement-only env and the asked settings.
    ``compile_cache_dir``: the study's expanded ``execution.compile_cache_dir`` for a server
    that runs; an export leaves it out. ``running``: a server the tuner starts, which gets the
    startup levers' environment too (execution.startup)."""

    return server_command(spec, spec.server, settings_for(spec, values), port=port,
                          python=python, compile_cache_dir=compile_cache_dir, running=running)


def trial_ignore_eos(spec: StudySpec, asked: Mapping[str, Any]) -> bool:
    """The ``ignore_eos`` a trial's load sends: the study's ``load.workload.ignore_eos``,
    with ``auto`` resolved by whether the trial's asked settings name a speculative
    method (``trial_command(...).asked``)."""

    return spec.load.workload.resolve_ignore_eos(
        speculative=asked.get("speculative_config.method") is not None)


def point_compile_key(spec: StudySpec, values: Mapping[str, Any]) -> str | None:
    """The torch.compile cache key the point ``values`` predicts (vllm.compile_cache.
    compile_key over its asked settings); None when it compiles nothing."""

    return compile_key(trial_command(spec, values).asked)


def server_command(spec: StudySpec, server: ServerSpec, settings: Mapping[str, Any], *,
                   port: int | None = None, python: str | None = None,
                   compile_cache_dir: str | None = None, running: bool = False) -> RenderedCommand:
    """``settings`` on ``server`` (the study's, or the reference's conservative copy), with
    the measurement environment the study's searched knobs need, and for a server the tuner
    starts (``running``) the Triton cache under the study's cache root (execution.startup)."""

    command = render_command(server, settings, python=python or sys.executable, port=port,
                             nccl_debug=spec.verify.nccl_debug,
                             searched=[p.target for p in spec.parameters],
                             compile_cache_dir=compile_cache_dir)
    if running and spec.execution.startup.triton_cache and compile_cache_dir is not None \
            and "TRITON_CACHE_DIR" not in command.env:
        command.measurement_env["TRITON_CACHE_DIR"] = posixpath.join(compile_cache_dir, "triton")
    return command


def params_key(values: Mapping[str, Any]) -> str:
    """A canonical text of a parameter set, to spot duplicates."""

    return point_key(values)


def discrete_size(spec: StudySpec, *, cap: int = 2_000_000) -> tuple[int, int, bool]:
    """(allowed points, continuous parameters, exact) of the discrete part of the space.

    Counts distinct *active* assignments (an inactive child does not multiply the count)
    and subtracts forbidden combinations. Stops enumerating at ``cap`` points and then
    returns an upper bound with ``exact=False``.
    """

    ordered = ordered_parameters(spec)
    continuous = sum(1 for p in ordered if p.domain() is None)
    count = 0
    visited = 0   # complete assignments looked at, forbidden ones too: a forbidden region
    exact = True  # of a wide parameter must not make the walk endless

    def walk(i: int, values: dict[str, Any]) -> None:
        nonlocal count, exact, visited
        if count >= cap or visited >= 2 * cap:
            exact = False
            return
        if i == len(ordered):
            visited += 1
            if forbidden_reason(spec, values) is None:
                count += 1
            return
        param = ordered[i]
        domain = param.domain()
        if domain is None or not is_active(param, values):
            walk(i + 1, values)
            return
        for value in domain:
            if not exact:
                break   # stopped below: the rest of a wide domain is not walked either
            values[param.name] = value
            walk(i + 1, values)
            del values[param.name]

    walk(0, {})
    return count, continuous, exact


def _domain_text(param: AnyParam) -> str:
    if isinstance(param, BoolParam):
        return "bool"
    if isinstance(param, CategoricalParam):
        return "{" + ", ".join("unset" if v is None else str(v) for v in param.values) + "}"
    scale = ", log" if param.log else ""
    step = f", step {param.step}" if param.step not in (None, 1) else ""
    return f"{param.kind} [{param.low}, {param.high}{step}{scale}]"


def condition_tree(spec: StudySpec) -> str:
    """An indented tree: each parameter under the parameter(s) its condition names."""

    children: dict[str | None, list[AnyParam]] = {}
    for param in ordered_parameters(spec):
        parents = list(param.when)
        key = parents[-1] if parents else None
        children.setdefault(key, []).append(param)
    lines: list[str] = []

    def show(parent: str | None, depth: int) -> None:
        for param in children.get(parent, []):
            cond = ""
            if param.when:
                cond = "  when " + ", ".join(
                    f"{k} in {v}" if isinstance(v, list) else f"{k} = {v}"
                    for k, v in param.when.items()
                )
            lines.append(f"{'    ' * depth}- {param.name} -> {param.target}: {_domain_text(param)}{cond}")
            show(param.name, depth + 1)

    show(None, 0)
    return "\n".join(lines) if lines else "(no parameters: only the baseline runs)"
