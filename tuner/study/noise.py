"""Decisions that respect measurement noise: which objective differences are ties.

Every objective value read at a load level carries its 95 % half-width (``<metric>.ci95``
in the level's flat metrics, tuner.load.uncertainty). Two values are *within noise* when
their difference is inside the 95 % interval of the difference, sqrt(ci_a² + ci_b²).

* A point **dominates another beyond noise** when it is better beyond noise in at least one
  objective and worse beyond noise in none. The **noisy front** is every point no other
  point dominates beyond noise: the Pareto front plus the points that only noise keeps off
  it. Those are recorded as ties with the front points that dominate them, and front points
  within noise of each other in every objective are ties too ("trials 4 and 7 are within
  noise at output_tok_s@c32").

Pure: plain numbers in, plain data out (status, report, export and pareto.json read it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tuner.load.level_names import is_open_level

__all__ = ["NoisyPoint", "Tie", "better_beyond", "label_noise", "level_client_bound",
           "level_unstable", "unstable_text", "max_rate_noise",
           "noisy_front", "plus_minus", "resolve_level", "tie_text", "unmeasured_level",
           "within"]


@dataclass(frozen=True)
class NoisyPoint:
    number: int
    values: tuple[float, ...]
    noise: tuple[float | None, ...]      # 95 % half-width per objective; None: unknown


@dataclass(frozen=True)
class Tie:
    trials: tuple[int, int]
    labels: tuple[str, ...]              # the objectives they are within noise at

    def as_dict(self) -> dict[str, object]:
        return {"trials": list(self.trials), "labels": list(self.labels),
                "text": tie_text(self)}


def plus_minus(value: float, noise: float | None, sep: str = "±") -> str:
    """``8648±210``: the value to 4 significant digits, its noise to the same last digit
    when it has one (never more digits than the noise justifies)."""
    text = f"{value:.4g}"
    if noise is None or (isinstance(noise, float) and math.isnan(noise)):
        return text
    if noise >= 10:
        shown = f"{noise:.0f}"
    elif noise >= 1:
        shown = f"{noise:.1f}"
    else:
        shown = f"{noise:.2g}"
    return f"{text}{sep}{shown}"


def tie_text(tie: Tie) -> str:
    a, b = tie.trials
    return f"trials {a} and {b} are within noise at {', '.join(tie.labels)}"


def _u(x: float | None) -> float:
    return 0.0 if x is None or math.isnan(x) else float(x)


def within(a: float, ua: float | None, b: float, ub: float | None) -> bool:
    """|a - b| inside the 95 % interval of the difference (no interval: equal only)."""
    return abs(a - b) <= math.sqrt(_u(ua) ** 2 + _u(ub) ** 2)


def better_beyond(a: float, ua: float | None, b: float, ub: float | None, direction: str) -> bool:
    """``a`` better than ``b`` in ``direction`` by more than the noise of the difference."""
    if within(a, ua, b, ub):
        return False
    return a > b if direction == "maximize" else a < b


def _dominates_beyond(p: NoisyPoint, q: NoisyPoint, directions: Sequence[str]) -> bool:
    some = False
    for i, d in enumerate(directions):
        if better_beyond(q.values[i], q.noise[i], p.values[i], p.noise[i], d):
            return False
        some = some or better_beyond(p.values[i], p.noise[i], q.values[i], q.noise[i], d)
    return some


def _dominates(p: NoisyPoint, q: NoisyPoint, directions: Sequence[str]) -> bool:
    ge = all((p.values[i] >= q.values[i]) if d == "maximize" else (p.values[i] <= q.values[i])
             for i, d in enumerate(directions))
    return ge and p.values != q.values


def _by_strength(points: Sequence[NoisyPoint], directions: Sequence[str]) -> list[NoisyPoint]:
    """The points, best summed rank over the objectives first."""
    rank_sum = [0] * len(points)
    for k, d in enumerate(directions):
        order = sorted(range(len(points)), key=lambda i: points[i].values[k], reverse=d == "maximize")
        for rank, i in enumerate(order):
            rank_sum[i] += rank
    return [points[i] for i in sorted(range(len(points)), key=rank_sum.__getitem__)]


def noisy_front(points: Sequence[NoisyPoint], directions: Sequence[str], labels: Sequence[str]
                ) -> tuple[list[int], list[Tie]]:
    """(the noisy front's trial numbers, the ties it holds) - see the module docstring."""
    # Likely dominators first: ``any`` stops at the first one, and the same answer comes
    # from any order. At 1,000 trials: 6,904 checks instead of 29,610, 62 ms instead of
    # 223 ms of `tuner status` (benchmarks/overhead.py's study, profiled).
    strongest = _by_strength(points, directions)
    front = [p for p in points if not any(_dominates_beyond(q, p, directions)
                                         for q in strongest if q is not p)]
    strict = {p.number for p in front if not any(_dominates(q, p, directions)
                                                  for q in strongest if q is not p)}
    ties: list[Tie] = []
    for i, p in enumerate(front):
        for q in front[i + 1:]:
            if p.number not in strict and q.number not in strict:
                continue
            if p.number in strict and q.number in strict:
                close = all(within(p.values[k], p.noise[k], q.values[k], q.noise[k])
                            for k in range(len(directions)))
                if not close:
                    continue
            else:
                inside, outside = (p, q) if p.number in strict else (q, p)
                if not _dominates(inside, outside, directions):
                    continue
            at = tuple(labels[k] for k in range(len(directions))
                       if within(p.values[k], p.noise[k], q.values[k], q.noise[k]))
            ties.append(Tie(tuple(sorted((p.number, q.number))), at))  # type: ignore[arg-type]
    return [p.number for p in front], ties


def label_noise(levels: Mapping[str, Mapping[str, float | None]], label: str) -> float | None:
    """The 95 % half-width of an objective labelled ``metric@cN`` in a trial's flat level
    metrics; None for trial-level metrics (startup_s: one exact reading) or when unknown."""
    metric, sep, level = label.rpartition("@c")
    if not sep:
        metric, sep, level = label.rpartition("@")
        if not (sep and is_open_level(level)):
            return None       # not at a level; an open-loop level is named r2.0 or trace
    value = (levels.get(resolve_level(levels, level)) or {}).get(f"{metric}.ci95")
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def max_rate_noise(record: Mapping[str, Any] | None) -> float | None:
    """How far max_rate@slo could be off: its search's bracket (lowest rate that missed −
    the answer); None when the bracket is open (a lower bound, or not searched)."""
    if not record:
        return None
    lo, hi = (list(record.get("bracket") or []) + [None, None])[:2]
    return None if lo is None or hi is None else float(hi) - float(lo)


def unmeasured_level(label: str, levels: Mapping[str, object], skipped: Sequence[int]) -> int | None:
    """The concurrency level an objective labelled ``metric@cN`` (``@cmax``, ``@cmin``) reads,
    when a trial stopped early never measured it (``skipped``: the early stop's skipped levels);
    None when it was measured or the label reads no concurrency level. Such a value is the
    bound the trial was stopped on, not a measurement."""
    _, sep, level = label.rpartition("@c")
    if not sep:
        return None
    measured = {int(k) for k in levels if str(k).isdigit()}
    planned = measured | {int(c) for c in skipped}
    if level in ("max", "min"):
        if not planned:
            return None
        want = max(planned) if level == "max" else min(planned)
    elif level.isdigit():
        want = int(level)
    else:
        return None
    return None if want in measured else want


def resolve_level(levels: Mapping[str, object], level: str) -> str:
    """A label's level as a key of ``levels``: ``max``/``min`` (objectives read at the highest
    or lowest level) resolve to the highest or lowest level measured."""
    if level in ("max", "min"):
        numbers = [int(k) for k in levels if str(k).isdigit()]
        if numbers:
            return str(max(numbers) if level == "max" else min(numbers))
    return level


def level_unstable(levels: Mapping[str, Mapping[str, float | None]]) -> list[int]:
    """The load levels whose throughput never met the stability rule, or that were
    client-bound (tuner.load.metrics): either way their numbers are not the server's."""
    return sorted(int(c) for c, lv in levels.items() if (lv or {}).get("unstable") == 1.0)


def level_client_bound(levels: Mapping[str, Mapping[str, float | None]]) -> list[int]:
    """The load levels where the load generator's event loop ran late (client-bound)."""
    return sorted(int(c) for c, lv in levels.items() if (lv or {}).get("client_bound") == 1.0)


def unstable_text(unstable: Sequence[int], client_bound: Sequence[int]) -> str:
    """Why each unstable level is one: ``c=32 never settled, c=1 client-bound (...)``."""
    bound = set(client_bound)
    return ", ".join(
        f"c={c} client-bound (the load generator's loop ran late)" if c in bound
        else f"c={c} never settled" for c in unstable)
