"""Upper bounds on the sizes a study file can ask for, and how a study raises one.

Every number below scales memory or time the tuner itself spends (requests held per
level, clients, levels, trials, waits) or resources it asks Ray for. A typo such as
``concurrency: [1, 1000000]`` or ``stop_timeout: 100000h`` should stop the study with a
message, not grow a worker to 4 GB or wait for eleven years. The limits leave one to two
orders of magnitude above any deployment the tuner was built for (8-GPU boxes, a few
hundred concurrent streams, studies of tens to hundreds of trials); a study that really
needs more names the bound and its new value in ``safety.bounds``::

    safety:
      bounds: {load.concurrency: 20000}

Pure: reads a validated spec's attributes, returns messages.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Bound", "BOUNDS", "bound_errors", "unknown_bound_names"]

_DAY = 86400.0


@dataclass(frozen=True)
class Bound:
    name: str                                                  # key in safety.bounds
    limit: float                                               # the built-in upper bound
    what: str                                                  # what is bounded, for messages
    values: Callable[[Any], Iterable[tuple[str, float | None]]]  # (field path, value) pairs


def _one(path: str, getter: Callable[[Any], Any]) -> Callable[[Any], list[tuple[str, Any]]]:
    return lambda spec: [(path, getter(spec))]


def _each(path: str, getter: Callable[[Any], Iterable[Any]]) -> Callable[[Any], list[tuple[str, Any]]]:
    return lambda spec: [(f"{path}[{i}]", v) for i, v in enumerate(getter(spec))]


def _count(path: str, getter: Callable[[Any], Any]) -> Callable[[Any], list[tuple[str, Any]]]:
    return lambda spec: [(f"{path} (number of entries)", len(getter(spec)))]


def _level_requests(spec: Any) -> list[tuple[str, Any]]:
    load = spec.load
    out = [(f"load: requests at concurrency {c}", load.requests_for(c)) for c in load.concurrency]
    out += [(f"load: requests at rate {r}/s", load.requests_for_rate(r)) for r in load.request_rates]
    return out


def _warmups(spec: Any) -> list[tuple[str, Any]]:
    return [(f"load: warm-up requests at concurrency {c}", spec.load.warmup_for(c)) for c in spec.load.concurrency]


def _domain_sizes(spec: Any) -> list[tuple[str, Any]]:
    out = []
    for p in spec.parameters:
        size = p.domain_size() if hasattr(p, "domain_size") else None
        if size is not None:
            out.append((f"parameter {p.name!r} (number of values)", size))
    return out


def _workload(attr: str) -> Callable[[Any], list[tuple[str, Any]]]:
    return lambda spec: [(f"load.workload.classes[{i}].{attr}", getattr(c, attr))
                         for i, c in enumerate(spec.load.workload.classes)]


BOUNDS: tuple[Bound, ...] = (
    Bound("budget.n_trials", 10_000, "trials", _one("budget.n_trials", lambda s: s.budget.n_trials)),
    Bound("budget.timeout", 90 * _DAY, "seconds", _one("budget.timeout", lambda s: s.budget.timeout)),
    Bound("budget.trial_timeout", 2 * _DAY, "seconds",
          _one("budget.trial_timeout", lambda s: s.budget.trial_timeout)),
    Bound("budget.max_retries", 20, "re-runs", _one("budget.max_retries", lambda s: s.budget.max_retries)),
    Bound("server.gpus_per_trial", 512, "GPUs", _one("server.gpus_per_trial", lambda s: s.server.gpus_per_trial)),
    Bound("server.cpus_per_trial", 1024, "CPUs", _one("server.cpus_per_trial", lambda s: s.server.cpus_per_trial)),
    Bound("server.startup_timeout", 2 * _DAY, "seconds",
          _one("server.startup_timeout", lambda s: s.server.startup_timeout)),
    Bound("server.stop_timeout", 3600.0, "seconds", _one("server.stop_timeout", lambda s: s.server.stop_timeout)),
    Bound("execution.parallel_trials", 1024, "GPU groups",
          _one("execution.parallel_trials", lambda s: s.execution.parallel_trials)),
    Bound("parameters", 256, "parameters", _count("parameters", lambda s: s.parameters)),
    Bound("parameter_values", 1_000_000, "values of one parameter", _domain_sizes),
    Bound("starting_points", 1000, "starting points", _count("starting_points", lambda s: s.starting_points)),
    Bound("forbidden", 1000, "forbidden rules", _count("forbidden", lambda s: s.forbidden)),
    Bound("objectives", 16, "objectives", _count("objectives", lambda s: s.objectives)),
    Bound("limits", 256, "limits", _count("limits", lambda s: s.limits)),
    Bound("load.concurrency", 4096, "concurrent streams", _each("load.concurrency", lambda s: s.load.concurrency)),
    Bound("load.levels", 64, "load levels", lambda s: [
        ("load.concurrency (number of levels)", len(s.load.concurrency)),
        ("load.request_rates (number of levels)", len(s.load.request_rates))]),
    Bound("load.requests_per_stream", 1000, "requests per stream",
          _one("load.requests_per_stream", lambda s: s.load.requests_per_stream)),
    Bound("load.requests", 100_000, "requests in one level", _level_requests),
    Bound("load.warmup_requests", 100_000, "warm-up requests in one level", _warmups),
    Bound("load.repeats", 20, "repeats", _one("load.repeats", lambda s: s.load.repeats)),
    Bound("load.request_rates", 100_000, "requests per second",
          _each("load.request_rates", lambda s: s.load.request_rates)),
    Bound("load.max_in_flight", 65_536, "requests in flight",
          _one("load.max_in_flight", lambda s: s.load.max_in_flight)),
    Bound("load.seconds", _DAY, "seconds", lambda s: [
        ("load.max_level_seconds", s.load.max_level_seconds),
        ("load.request_timeout_s", s.load.request_timeout_s),
        ("load.rate_duration_s", s.load.rate_duration_s)]),
    Bound("load.workload.classes", 64, "workload classes",
          _count("load.workload.classes", lambda s: s.load.workload.classes)),
    Bound("load.workload.prompt_tokens", 1_000_000, "tokens", _workload("prompt_tokens")),
    Bound("load.workload.output_tokens", 1_000_000, "tokens", _workload("output_tokens")),
    Bound("probe.concurrency", 4096, "concurrent requests", lambda s: [
        *((f"probe.concurrency[{i}]", c) for i, c in enumerate(s.probe.concurrency)),
        *((f"probe.reference.concurrency[{i}]", c) for i, c in enumerate(s.probe.reference.concurrency or ()))]),
    Bound("probe.request_timeout_s", _DAY, "seconds",
          _one("probe.request_timeout_s", lambda s: s.probe.request_timeout_s)),
    Bound("quality.max_items", 100_000, "known-answer items",
          _one("quality.max_items", lambda s: None if s.quality is None else s.quality.max_items)),
)

_BY_NAME = {b.name: b for b in BOUNDS}


def unknown_bound_names(raised: Mapping[str, Any]) -> list[str]:
    return sorted(set(raised) - set(_BY_NAME))


def bound_errors(spec: Any, raised: Mapping[str, float]) -> list[str]:
    """One message per value above its bound (the built-in one, or the study's raise)."""

    errors = []
    for bound in BOUNDS:
        limit = raised.get(bound.name, bound.limit)
        for where, value in bound.values(spec):
            if value is None or value <= limit:
                continue
            shown = f"{value:,}" if isinstance(value, int) else f"{value:g}"
            hint = ("raise it with safety.bounds: {" + f"{bound.name}: N" + "}"
                    if bound.name not in raised else f"safety.bounds.{bound.name} is {limit:g}")
            errors.append(f"{where}: {shown} is above the upper bound of {limit:,g} {bound.what}; "
                          f"{hint} if you really need more (docs/study-file.md, Limits)")
    return errors
