"""Stop a trial as soon as what it measured proves it cannot reach the Pareto front.

A trial starts a server (minutes: weights, compile, graph capture), verifies the applied
configuration, runs the correctness probe, then measures concurrency levels (e.g. 1, 4, 16,
64; the top level costs more than the others together). This module decides, after each of
those steps, whether the rest can be skipped. Four rules, each safe on its own:

1. **Infeasible anyway** (``infeasible_reason``): a knob not applied (as soon as the log shows
   it: the custom all-reduce and attention-backend downgrades are printed at communicator /
   attention init, before the weights load), a failed correctness probe, or a limit missed at
   a level already measured. Such a trial is never on the front whatever else it measures,
   and samplers rank infeasible trials by constraint violation only (TPE's split, NSGA-II's
   constrained domination), so unmeasured values teach them nothing.

2. **Objective levels first** (``level_order``): measure the levels an objective or a limit
   reads before the others (1, 64, then 4, 16). Then every objective value is *measured*, and
   a trial dominated by the current front (``decide`` -> ``dominated_exact``) skips only the
   informational levels. No bound, no risk: it is recorded as a normal completed trial.

3. **Dominated for sure on a bound** (``decide`` -> ``dominated``), for objectives whose level
   is not measured yet. Each objective gets the *optimistic* value it can still reach:

   * aggregate throughput (``output_tok_s``, ``total_tok_s``, ``request_per_s``) at level C
     from the highest measured level c < C, only when C / c <= ``max_gap`` (4):
     ``v(c) * min(C / c, R * (1 + margin))``. ``C / c`` is the physical bound: a stream does
     not get faster by sharing each engine step with more streams, so per-stream throughput
     does not rise with concurrency. ``R`` is the largest v(C) / v(c) among this study's
     trials that measured both levels (used from ``min_history`` such trials on). Batching
     raises total throughput, but across a 4x step never beyond what the most
     batch-friendly configuration seen so far achieved, plus ``margin`` (25 %). Across wider
     gaps (1 -> 64) batching gains differ threefold between configurations (eager mode vs
     MTP on the field-notes box), a learned ratio says too little, and no bound is used;
   * latencies (``ttft_ms``, ``tpot_ms``, ``itl_ms``, ``e2el_ms``, any statistic) and per-user
     speed (``output_tok_s_per_user``) at a higher level: the value at the highest measured
     level below it (latency does not fall, per-user speed does not rise with load);
   * anything else, or a level below every measured one: unbounded (never stops).

   The trial stops when one feasible point of the current front is at least as good as
   these optimistic values in every objective and strictly better in one: the finished
   trial would be dominated by it too, so it could never enter the front (a front point only
   leaves the front for a point that dominates it, which then dominates this trial as well).
   It is told infeasible (constraint ``dominated`` = 1) with the bounds as its values.

What "safe" rests on, and how it is checked: rule 1 and 2 are exact. Rule 3 assumes the
bound holds; ``benchmarks/search_efficiency.py --early-stop`` replays whole studies against
the simulator's ground truth (with measurement noise) and counts stopped trials whose full
measurement would have entered the front, and true front points stopped before their
objectives were measured. Both must be 0; tests/test_early_stop.py runs a small version.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Target", "Decision", "optimistic_values", "dominated", "infeasible_reason", "decide",
           "level_order", "AGGREGATE_METRICS", "DEFAULT_MARGIN", "DEFAULT_MIN_HISTORY"]

AGGREGATE_METRICS = frozenset({"output_tok_s", "total_tok_s", "request_per_s"})
_LATENCY_PREFIXES = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")
DEFAULT_MARGIN = 0.25
DEFAULT_MIN_HISTORY = 3
DEFAULT_MAX_GAP = 4.0

Levels = Mapping[int, Mapping[str, float]]


@dataclass(frozen=True)
class Target:
    """One objective (or limit) read at one concurrency level."""

    metric: str
    level: int
    direction: str          # "maximize" | "minimize"


@dataclass(frozen=True)
class Decision:
    stop: bool
    reason: str | None = None           # "dominated" (on a bound) or "dominated_exact"
    bounds: tuple[float, ...] = ()      # optimistic objective values at decision time
    dominated_by: int | None = None     # index into the front that dominates


def level_order(levels: Sequence[int], needed: Sequence[int]) -> list[int]:
    """The order to measure a sweep in: levels an objective or limit reads first (ascending),
    then the others (ascending). Once the needed levels are measured the trial's objective
    values are exact, so a dominated trial skips the informational levels at no risk."""

    first = sorted({c for c in levels if c in set(needed)})
    return first + sorted(c for c in levels if c not in set(needed))


def _below(measured: Levels, level: int) -> int | None:
    done = [c for c in measured if c < level]
    return max(done) if done else None


def learned_ratio(history: Sequence[Levels], metric: str, low: int, high: int) -> tuple[float, int]:
    """(largest v(high) / v(low) over trials that measured both, how many did)."""

    ratios = []
    for levels in history:
        a = levels.get(low, {}).get(metric)
        b = levels.get(high, {}).get(metric)
        if a and b is not None and a > 0 and math.isfinite(a) and math.isfinite(b):
            ratios.append(b / a)
    return (max(ratios) if ratios else math.inf), len(ratios)


def optimistic(target: Target, measured: Levels, history: Sequence[Levels], *,
               margin: float = DEFAULT_MARGIN, min_history: int = DEFAULT_MIN_HISTORY,
               max_gap: float = DEFAULT_MAX_GAP) -> float:
    """The best value ``target`` can still take, given the levels measured so far."""

    unbounded = math.inf if target.direction == "maximize" else -math.inf
    if target.level in measured:
        value = measured[target.level].get(target.metric)
        return unbounded if value is None or not math.isfinite(value) else float(value)
    low = _below(measured, target.level)
    if low is None:
        return unbounded
    value = measured[low].get(target.metric)
    if value is None or not math.isfinite(value):
        return unbounded
    base = target.metric.split(".")[0]
    if base in AGGREGATE_METRICS and target.direction == "maximize":
        if target.level / low > max_gap:
            return unbounded
        ratio = target.level / low
        learned, n = learned_ratio(history, target.metric, low, target.level)
        if n >= min_history:
            ratio = min(ratio, learned * (1 + margin))
        return value * ratio
    if base.startswith(_LATENCY_PREFIXES) and target.direction == "minimize":
        return value
    if base == "output_tok_s_per_user" and target.direction == "maximize":
        return value
    return unbounded


def optimistic_values(targets: Sequence[Target], measured: Levels, history: Sequence[Levels], *,
                      margin: float = DEFAULT_MARGIN, min_history: int = DEFAULT_MIN_HISTORY,
                      max_gap: float = DEFAULT_MAX_GAP) -> tuple[float, ...]:
    return tuple(optimistic(t, measured, history, margin=margin, min_history=min_history,
                            max_gap=max_gap) for t in targets)


def dominated(bounds: Sequence[float], front: Sequence[Sequence[float]],
              directions: Sequence[str]) -> int | None:
    """Index of a front point that dominates the optimistic ``bounds``, or None."""

    def signed(vals: Sequence[float]) -> list[float]:
        return [-v if d == "maximize" else v for v, d in zip(vals, directions, strict=True)]

    b = signed(bounds)
    for i, point in enumerate(front):
        p = signed(point)
        if all(x <= y for x, y in zip(p, b)) and any(x < y for x, y in zip(p, b)):
            return i
    return None


def infeasible_reason(*, applied: bool | None, probe_passed: bool | None,
                      limit_violations: Mapping[str, float] | None = None,
                      require_applied: bool = True) -> str | None:
    """Why the trial is infeasible whatever its remaining levels measure, or None."""

    if applied is False and require_applied:
        return "not_applied"
    if probe_passed is False:
        return "probe_failed"
    for label, violation in (limit_violations or {}).items():
        if violation > 0:
            return f"limit:{label}"
    return None


def decide(targets: Sequence[Target], measured: Levels, remaining: Sequence[int],
           front: Sequence[Sequence[float]], history: Sequence[Levels], *,
           margin: float = DEFAULT_MARGIN, min_history: int = DEFAULT_MIN_HISTORY,
           max_gap: float = DEFAULT_MAX_GAP) -> Decision:
    """After a level: stop the sweep if the trial is dominated for sure (rule 2).

    ``remaining``: levels not measured yet (nothing to save when empty). ``front``: the
    objective values of the study's current feasible front. ``history``: level metrics of
    the study's trials that measured their whole sweep.
    """

    if not remaining:
        return Decision(False)
    bounds = optimistic_values(targets, measured, history, margin=margin, min_history=min_history,
                               max_gap=max_gap)
    index = dominated(bounds, front, [t.direction for t in targets])
    if index is None:
        return Decision(False, bounds=bounds)
    exact = all(t.level in measured for t in targets)
    return Decision(True, "dominated_exact" if exact else "dominated", bounds, index)
