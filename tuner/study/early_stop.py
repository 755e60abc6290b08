"""Stop a trial as soon as what it measured proves it cannot reach the Pareto front.

A trial starts a server (minutes: weights, compile, graph capture), verifies the applied
configuration, runs the correctness probe, then measures concurrency levels (e.g. 1, 4, 16,
64; the top level costs more than the others together). This module decides, while the
server starts, after each later step and during a level, whether the rest can be skipped.
Five rules, each safe on its own:

1. **Infeasible anyway**: a knob not applied, a failed correctness probe, or a limit missed
   at a level already measured (``infeasible_reason``). Such a trial is never on the front
   whatever else it measures, and samplers rank infeasible trials by constraint violation
   only (TPE's split, NSGA-II's constrained domination), so unmeasured values teach them
   nothing. Two downgrades are stopped on *while the server starts*
   (``tuner.vllm.verify.startup_mismatches``): the custom all-reduce outcome at communicator init and the
   attention backend's CUDA-graph downgrade, both printed once, before the weights load, and
   never taken back; every other verdict waits for the full log.

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
   * trial-level metrics (``startup_s``, ``probe_s``: a third objective on startup time;
     ``accuracy_drop``, from the quality gate that runs with the probe) are exact once known
     (``TRIAL_LEVEL``); ``trial_s`` is unbounded;
   * goodput (``goodput_req_s``, ``goodput_tok_s``) at level C: the bound of the throughput
     it is a part of (``request_per_s``, ``output_tok_s``) measured at a level below, as
     above (good requests are a subset of the completed ones); ``slo_attained``: 1;
   * open-loop levels (``metric@r<rate>``, level named ``r2.0``; ``metric@trace``, the trace
     replay): exact once measured (they run after every concurrency level), unbounded before;
   * anything else, or a level below every measured one: unbounded (never stops).

   The trial stops when one feasible point of the current front is at least as good as
   these optimistic values in every objective and strictly better in one: the finished
   trial would be dominated by it too, so it could never enter the front (a front point only
   leaves the front for a point that dominates it, which then dominates this trial as well).
   The same argument makes a front *snapshot* taken when the trial starts safe to use.

How it runs: ``tuner.study.sweep_guard`` (the plan a trial carries, and the guard the
worker consults).

4. **Inside a level** (``inside_bound``, ``SweepGuard.inside_level``), for an objective on the
   level's aggregate output tok/s (the only metric bounded this way; any other objective at
   the level keeps it from stopping). The load generator judges the level's steady-state
   window (``tuner.load.window``: from when the first C requests have all finished, or 15 %
   into the issuing span, to the last dispatch) while the level runs, counting the tokens of
   finished and in-flight requests by their own timestamps (in-flight ones only with exact
   per-chunk usage):

   a. *At the last dispatch* (exact): the window is complete and every token in it has
      arrived; an in-flight request can only take its tokens out by failing. The window's
      rate is the level's output tok/s (an upper bound, should an in-flight request still
      fail; should the drain make the window degenerate, the whole-run fallback is bounded
      too, see ``tuner.load.live_window.InsideWindow.view``). A trial dominated with it is stopped as
      ``dominated_exact`` - told like any completed trial, with that value recorded at the
      level (``record["measured"]``) - unless a limit reads the level (then
      ``dominated_inside``). This skips the drain - the last round of requests, a third of
      a level with 3 requests per stream - and leaves the verdict unchanged. Told as a
      stopped trial instead, these trials cost the default sampler more trials to reach
      95 % of the front (median 48.5 instead of 36.5 on glm5): they are the front's
      one-knob neighbours, and TPE then counts them with the infeasible ones.
   b. *Before* (statistical): once the window has lasted ``INSIDE_MIN_SHARE`` (half) of the
      time the first wave took, and is steady itself (``INSIDE_SUBWINDOWS`` sub-windows,
      max/min within ``tuner.load.window.STABILITY_MAX_RATIO``), its rate times
      ``1 + INSIDE_MARGIN`` (25 %, 2.5 times the drift a steady level is allowed) is the
      optimistic output tok/s. The benchmark models this partial estimate's noise as the
      level's noise scaled by the square root of the window it misses, drawn independently
      of the final value, and counts wrong stops (must be 0).

   Also in the last level (unlike rules 2 and 3, which have nothing left to skip there):
   the real landscapes measure their throughput objective last (levels 1, 4), and a
   dominated trial's drain is all rule 4 can save them. Not used with ``repeats`` > 1 or
   sharded clients (``client_processes`` > 1).

5. **During the max_rate@slo search** (``SweepGuard.during_search``): every other objective
   is measured by then; ``max_rate@slo`` can at best be the lowest rate that missed the SLO
   so far (or ``load.rate_search.high`` before any missed): the answer is the highest rate
   met *below* it (``RateSearch.optimistic``: the lowest miss outside noise when the
   lowest is within noise, as a boundary fit may pass it); the worker widens that bound
   by the search's precision, since a miss near the boundary may be noise. A trial dominated
   with it stops its search (rule 3's argument), and a limit ``max_rate@slo >= x`` with the
   bound below x makes it infeasible (rule 1).

What "safe" rests on, and how it is checked: rules 1, 2 and 4a are exact. Rules 3 and 4b
assume their bounds hold; ``benchmarks/search_efficiency.py --early-stop`` replays whole studies against
the simulator's ground truth (with measurement noise), ``benchmarks/anytime.py --early-stop``
also against the real landscapes (``benchmarks/landscapes``), and both count stopped trials whose full
measurement would have entered the front, and true front points stopped before their
objectives were measured. Both must be 0; tests/test_early_stop.py runs a small version and
tests/test_search_truth.py checks the startup rule against the simulator's logs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Target", "Decision", "optimistic_values", "dominated", "infeasible_reason", "decide",
           "level_order", "inside_bound",
           "INSIDE_MARGIN", "AGGREGATE_METRICS", "DEFAULT_MARGIN", "DEFAULT_MIN_HISTORY"]

AGGREGATE_METRICS = frozenset({"output_tok_s", "total_tok_s", "request_per_s"})
# Goodput is the part of a throughput that met the SLO: bounded by that throughput's bound.
GOODPUT_OF = {"goodput_req_s": "request_per_s", "goodput_tok_s": "output_tok_s"}
_LATENCY_PREFIXES = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")
DEFAULT_MARGIN = 0.25
DEFAULT_MIN_HISTORY = 3
DEFAULT_MAX_GAP = 4.0
# Rule 4 (inside a level): the margin over the window's rate so far, how long the window
# must have run (as a share of the first wave's duration) and in how many sub-windows its
# own steadiness is checked.
INSIDE_MARGIN = 0.25
INSIDE_MIN_SHARE = 0.5
INSIDE_SUBWINDOWS = 3
# The pseudo-level of trial-level metrics (tuner.study.trial_metrics) in a plan's targets.
TRIAL_LEVEL = 0

Levels = Mapping[int | str, Mapping[str, float]]


@dataclass(frozen=True)
class Target:
    """One objective (or limit) read at one concurrency level (an int), an open-loop level
    (its name, ``r2.0``) or the trial (``TRIAL_LEVEL``)."""

    metric: str
    level: int | str
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
    values are exact, so a dominated trial skips the informational levels at no risk.

    Measured alternative (benchmarks/search_efficiency.py, glm5, 6 seeds): putting a
    "bridge" level before each needed one (1, 16, 64, 4: a throughput bound at 64 from 16)
    saved less study time (21 % vs 26 %): the bound from 16 stopped few trials, and every
    trial that would have stopped after 64 had paid for 16 too.
    """

    first = sorted({c for c in levels if c in set(needed)})
    return first + sorted(c for c in levels if c not in set(needed))


def _below(measured: Levels, level: int) -> int | None:
    done = [c for c in measured if isinstance(c, int) and c < level]
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
    """The best value ``target`` can still take, given the levels measured so far.

    A measured value is moved by its own 95 % half-width (``<metric>.ci95`` of its level,
    tuner.load.uncertainty) towards better before it is used: the trial is never stopped on
    a bound its measurement noise could cross."""

    unbounded = math.inf if target.direction == "maximize" else -math.inf
    if target.level in measured:
        value = _noisy_best(measured[target.level], target)
        return unbounded if value is None else value
    if isinstance(target.level, str):
        return unbounded          # an open-loop level not measured yet
    if target.metric in GOODPUT_OF and target.direction == "maximize":
        return optimistic(Target(GOODPUT_OF[target.metric], target.level, "maximize"), measured,
                          history, margin=margin, min_history=min_history, max_gap=max_gap)
    if target.metric == "slo_attained" and target.direction == "maximize":
        return 1.0
    low = _below(measured, target.level)
    if low is None:
        return unbounded
    value = _noisy_best(measured[low], target)
    if value is None:
        return unbounded
    # Carried to a level not measured yet, the value stands for the configuration's pace,
    # but an unsteady level (other work on the host, a drifting server) may have measured
    # it held down: its fastest sub-window ran up to ``stability_ratio`` times its mean,
    # and the bound starts from that pace instead (``unsteady``).
    spread = unsteady(measured[low])
    if math.isinf(spread):
        return unbounded
    base = target.metric.split(".")[0]
    if base in AGGREGATE_METRICS and target.direction == "maximize":
        if target.level / low > max_gap:
            return unbounded
        ratio = target.level / low
        learned, n = learned_ratio(history, target.metric, low, target.level)
        if n >= min_history:
            ratio = min(ratio, learned * (1 + margin))
        return value * spread * ratio
    if base.startswith(_LATENCY_PREFIXES) and target.direction == "minimize":
        return value / spread
    if base == "output_tok_s_per_user" and target.direction == "maximize":
        return value * spread
    return unbounded


def unsteady(level: Mapping[str, float]) -> float:
    """How far a level's pace moved while it was measured: its ``stability_ratio`` (max/min
    of the window's sub-window output rates, tuner.load.window), 1 when steady or not
    reported, inf when flagged ``unstable`` without a ratio (a sub-window without tokens,
    or no window at all: the whole-run fallback), which carries no bound.

    Real levels measured on busy hosts reach 1.1-2.5 (the smollm2 landscapes, two shared
    cores); there a level-1 rate of 5.9 tok/s (ratio 1.83) became 30.4 at level 4, 5.2x
    across a 4x step: per-stream speed does not rise with load, so the level-1 run was
    held down by something else, most likely other work on the cores."""

    ratio = level.get("stability_ratio")
    if ratio is None or not math.isfinite(ratio):
        return math.inf if level.get("unstable") == 1.0 else 1.0
    return max(1.0, float(ratio))


def _noisy_best(level: Mapping[str, float], target: Target) -> float | None:
    """The level's value of the target's metric, plus its noise in the better direction."""

    value = level.get(target.metric)
    if value is None or not math.isfinite(value):
        return None
    noise = level.get(f"{target.metric}.ci95")
    noise = float(noise) if noise is not None and math.isfinite(noise) else 0.0
    return float(value) + (noise if target.direction == "maximize" else -noise)


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


def inside_bound(rate: float | None, *, window_s: float, first_wave_s: float, stable: bool,
                 exact: bool = False, margin: float = INSIDE_MARGIN,
                 min_share: float = INSIDE_MIN_SHARE) -> float:
    """Rule 4: the optimistic output tok/s of a level still running, from its window so far.

    ``rate``: output tokens per second in the steady-state window so far (``window_s`` long,
    opened when the first wave - the first C requests, which took ``first_wave_s`` - had all
    finished); ``stable``: the window's own sub-windows agree within the stability ratio.
    ``exact``: the window is complete (last dispatch) and ``rate`` already an upper bound
    (rule 4a). Otherwise returns inf (no bound) until the window has run ``min_share`` of
    the first wave's time, or when it is not steady (rule 4b)."""

    if rate is None or not math.isfinite(rate) or rate < 0:
        return math.inf
    if exact:
        return rate
    if not stable:
        return math.inf
    if first_wave_s <= 0 or window_s < min_share * first_wave_s:
        return math.inf
    return rate * (1 + margin)
