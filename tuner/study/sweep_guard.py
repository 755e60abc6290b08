"""Early stop inside a trial: the plan a trial carries and the guard its worker consults.

The rules and why each is safe: ``tuner.study.early_stop``.

How it runs: the orchestrator puts ``sweep_plan`` (targets, limits, level order, the feasible
front and the learned-ratio history) into each ``TrialRequest`` (none with
``execution.early_stop: false``); the worker consults a ``SweepGuard`` while the server
starts, after verification, after the probe, during each level's measured run and after
each load level (``tuner.load.sweep.run_sweep(levels=..., after_level=..., inside_level=...)``) and
writes the guard's ``record`` into the outcome. A trial stopped by rule 1, 3, 4b or 5 is told
with the ``early_stopped`` constraint violated (its measured objectives, else its bounds,
else the worst values seen): never on the front, never exported without ``--force``. A
``dominated_exact`` stop (rules 2 and 4a) is a normal completed trial without its
informational levels (4a: its halted level carries only the output tok/s it was judged on,
``record["measured"]``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from tuner.load.level_names import is_open_level
from tuner.load.uncertainty import with_noise_floor
from tuner.study.early_stop import (
    DEFAULT_MARGIN,
    DEFAULT_MAX_GAP,
    DEFAULT_MIN_HISTORY,
    INSIDE_MARGIN,
    TRIAL_LEVEL,
    Levels,
    Target,
    decide,
    dominated,
    infeasible_reason,
    inside_bound,
    level_order,
    optimistic_values,
)
from tuner.study.objectives import MAX_RATE
from tuner.vllm.effective_config import EffectiveConfig
from tuner.vllm.verify import startup_mismatches

__all__ = ["PlanTarget", "PlanLimit", "SweepPlan", "sweep_plan", "SweepGuard", "MAX_RATE"]


def _level_key(level: Any) -> int | str:
    """A plan's level back from JSON: concurrency levels are ints, open-loop ones names."""
    return level if isinstance(level, str) and is_open_level(level) else int(level)


class PlanTarget(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    metric: str
    level: int | str            # a concurrency level, an open-loop one's name (r2.0, trace), TRIAL_LEVEL
    direction: Literal["maximize", "minimize"]


class PlanLimit(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    label: str
    metric: str
    level: int | str
    max: float | None = None
    min: float | None = None


class SweepPlan(BaseModel):
    """What a worker needs to stop its own trial (``sweep_plan``): it travels in the
    ``TrialRequest`` and is read by ``SweepGuard``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    targets: list[PlanTarget]
    limits: list[PlanLimit] = []
    order: list[int] = []
    front: list[list[float]] = []
    history: list[dict[str, dict[str, float]]] = []    # level (as text) -> metric -> value
    require_applied: bool = True
    margin: float = DEFAULT_MARGIN
    min_history: int = DEFAULT_MIN_HISTORY
    max_gap: float = DEFAULT_MAX_GAP
    inside_margin: float | None = INSIDE_MARGIN


def sweep_plan(targets: Sequence[Target], limits: Sequence[Mapping[str, Any]], levels: Sequence[int],
               front: Sequence[Sequence[float]], history: Sequence[Levels], *,
               require_applied: bool = True, margin: float = DEFAULT_MARGIN,
               min_history: int = DEFAULT_MIN_HISTORY, max_gap: float = DEFAULT_MAX_GAP,
               inside_margin: float | None = INSIDE_MARGIN) -> SweepPlan:
    """What a worker needs to stop its own trial. ``front``: objective values of the
    study's feasible front when the trial starts - a front only ever moves towards better
    points, so a trial dominated by this snapshot is dominated by every later front too.
    ``limits``: {label, metric, level, max, min}. ``history``: level metrics of trials that
    measured all their objective levels. ``inside_margin``: rule 4's margin (None: never
    stop inside a level)."""

    needed = [lv for lv in [*(t.level for t in targets), *(lim["level"] for lim in limits)]
              if isinstance(lv, int)]
    return SweepPlan(
        targets=[PlanTarget(metric=t.metric, level=t.level, direction=t.direction)
                 for t in targets],
        limits=[PlanLimit.model_validate(dict(lim)) for lim in limits],
        order=level_order(levels, needed),
        front=[[float(v) for v in p] for p in front],
        history=[{str(c): dict(m) for c, m in h.items()} for h in history],
        require_applied=require_applied, margin=margin, min_history=min_history, max_gap=max_gap,
        inside_margin=inside_margin,
    )


class SweepGuard:
    """Consulted by the worker after verification, after the probe and after each load level.

    ``stop_after(...)`` returns True once the trial cannot reach the front, and from then on;
    ``record`` says why, after which step, with which optimistic bounds and which levels
    were left out. ``SweepGuard(None)`` never stops (a request without a plan).
    """

    def __init__(self, plan: SweepPlan | Mapping[str, Any] | None) -> None:
        self.enabled = plan is not None
        if plan is None:
            plan = SweepPlan(targets=[])
        elif not isinstance(plan, SweepPlan):
            plan = SweepPlan.model_validate(plan)      # a plan that travelled as JSON
        self.targets = [Target(t.metric, t.level, t.direction) for t in plan.targets]
        self.limits: list[dict[str, Any]] = [lim.model_dump() for lim in plan.limits]
        self.order = list(plan.order)
        self.front: list[tuple[float, ...]] = [tuple(p) for p in plan.front]
        self.history: list[dict[int | str, dict[str, float]]] = [
            {_level_key(c): dict(m) for c, m in h.items()} for h in plan.history]
        self.require_applied = plan.require_applied
        self.margin = plan.margin
        self.min_history = plan.min_history
        self.max_gap = plan.max_gap
        self.inside_margin = plan.inside_margin
        self._measured: dict[int | str, dict[str, float]] = {}
        self.record: dict[str, Any] | None = None
        # Trial-level metrics known before the sweep (startup_s, probe_s, accuracy_drop):
        # objectives on them are planned at level 0 (scoring.early_stop_plan) and exact from
        # the start.
        self.trial_metrics: dict[str, float | None] = {}

    @property
    def stopped(self) -> bool:
        return self.record is not None

    def levels(self, configured: Sequence[int]) -> list[int]:
        """The order to run ``configured`` in (the plan's order, unknown levels last)."""

        if not self.enabled:
            return list(configured)
        known = [c for c in self.order if c in configured]
        return known + [c for c in configured if c not in known]

    def stop_after(self, step: str, *, applied: bool | None = None, probe_passed: bool | None = None) -> bool:
        """After verification ("verify") or the probe ("probe"): rule 1."""

        if not self.enabled or self.stopped:
            return self.stopped
        reason = infeasible_reason(applied=applied, probe_passed=probe_passed,
                                   require_applied=self.require_applied)
        if reason is not None:
            self.record = {"reason": reason, "after": step, "bounds": None, "skipped_levels": list(self.order)}
        return self.stopped

    def stop_while_starting(self, asked: Mapping[str, Any], effective: EffectiveConfig) -> bool:
        """While the server starts: rule 1 for knobs whose downgrade the log read so far
        (``effective``) already shows for good (``tuner.vllm.verify.startup_mismatches``).
        True = stop the start; the trial is not applied."""

        if not self.enabled or self.stopped or not self.require_applied:
            return self.stopped
        sure = startup_mismatches(asked, effective)
        if sure:
            self.record = {"reason": "not_applied", "after": "startup", "bounds": None,
                           "mismatches": sure, "skipped_levels": list(self.order)}
        return self.stopped

    def _limit_violations(self, measured: Levels) -> dict[str, float]:
        out = {}
        for lim in self.limits:
            level = _level_key(lim["level"])
            if lim["metric"] == MAX_RATE:
                continue          # known only during its search (during_search)
            if level == TRIAL_LEVEL:
                value = self.trial_metrics.get(str(lim["metric"]))
                if value is None:
                    continue          # trial_s: not known before the trial ends
            elif level not in measured:
                continue
            else:
                value = measured[level].get(str(lim["metric"]))
            if value is None or not math.isfinite(value):
                out[str(lim["label"])] = 1.0      # as tuner.study.scoring: no value misses the limit
            elif lim.get("max") is not None:
                out[str(lim["label"])] = float(value) - float(lim["max"])
            else:
                out[str(lim["label"])] = float(lim["min"]) - float(value)
        return out

    def after_level(self, measured: Levels, remaining: Sequence[int]) -> bool:
        """After a load level: rule 1 for limits, then rules 2 and 3. True = stop the sweep."""

        if not self.enabled or self.stopped:
            return self.stopped
        if not remaining:
            return False
        done = list(measured)[-1] if measured else None     # the level just measured
        reason = infeasible_reason(applied=True, probe_passed=True,
                                   limit_violations=self._limit_violations(measured))
        if reason is not None:
            self.record = {"reason": reason, "after": f"c{done}", "bounds": None,
                           "skipped_levels": list(remaining)}
            return True
        if any(t.level == TRIAL_LEVEL for t in self.targets):
            measured = {TRIAL_LEVEL: {k: v for k, v in self.trial_metrics.items() if v is not None}, **measured}
        self._measured = {c: dict(m) for c, m in measured.items()}
        d = decide(self.targets, measured, remaining, self.front, self.history, margin=self.margin,
                   min_history=self.min_history, max_gap=self.max_gap)
        if d.stop:
            self.record = {"reason": d.reason, "after": f"c{done}",
                           "bounds": [b if math.isfinite(b) else None for b in d.bounds],
                           "dominated_by": list(self.front[d.dominated_by]) if d.dominated_by is not None else None,
                           "skipped_levels": list(remaining)}
        return d.stop


    def inside_level(self, level: int, partial: Mapping[str, Any], remaining: Sequence[int]) -> bool:
        """During level ``level``'s measured run: rule 4. ``partial``: the load generator's
        view of the window so far (``output_tok_s``, ``window_s``, ``first_wave_s``,
        ``stable``); ``remaining``: levels after this one. True = stop the level (and the
        sweep) now; the trial is told stopped, never on the front."""

        if not self.enabled or self.stopped or self.inside_margin is None:
            return self.stopped
        # Unlike after_level, the last level counts too: its drain (4a) or the rest of its
        # window (4b) is what is left to skip.
        mine = [t for t in self.targets if t.level == level]
        if not mine or any(not (t.metric == "output_tok_s" and t.direction == "maximize") for t in mine):
            return False      # nothing at this level to bound, or an objective rule 4 cannot bound
        bound = inside_bound(partial.get("output_tok_s"), window_s=float(partial.get("window_s") or 0.0),
                             first_wave_s=float(partial.get("first_wave_s") or 0.0),
                             stable=bool(partial.get("stable")), exact=bool(partial.get("exact")),
                             margin=self.inside_margin)
        # The window's own noise, where the load generator measured it (levels sized by time).
        bound += float(partial.get("output_tok_s_ci95") or 0.0)
        if not math.isfinite(bound):
            return False
        measured: dict[int | str, dict[str, float]] = {**self._measured, level: {"output_tok_s": bound}}
        if any(t.level == TRIAL_LEVEL for t in self.targets):
            measured[TRIAL_LEVEL] = {k: v for k, v in self.trial_metrics.items() if v is not None}
        bounds = optimistic_values(self.targets, measured, self.history, margin=self.margin,
                                   min_history=self.min_history, max_gap=self.max_gap)
        index = dominated(bounds, self.front, [t.direction for t in self.targets])
        if index is None:
            return False
        exact = bool(partial.get("exact")) and not any(_level_key(lim["level"]) == level
                                                        for lim in self.limits)
        if exact:
            # Rule 4a: the level's output tok/s is measured (its window is complete), so the
            # trial is told like any completed one (rule 2), with that value at this level:
            # samplers learn from its values, as from every other dominated trial.
            figures = {
                # The level's own figure, not the bound its noise widened.
                "output_tok_s": float(partial.get("output_tok_s") or bound),
                # The window's own noise (its sub-windows), 0 where the level was not sized by time.
                "output_tok_s.ci95": float(partial.get("output_tok_s_ci95") or 0.0),
                "window_s": float(partial.get("window_s") or 0.0),
                "completed": float(partial.get("completed") or 0),
                "planned": float(partial.get("planned") or 0)}
            self.record = {"reason": "dominated_exact", "after": f"c{level} at last dispatch",
                           "bounds": [b if math.isfinite(b) else None for b in bounds],
                           "dominated_by": list(self.front[index]),
                           "measured": {str(level): figures},
                           "skipped_levels": [level, *remaining]}
            return True
        self.record = {"reason": "dominated_inside", "after": f"inside c{level}",
                       "bounds": [b if math.isfinite(b) else None for b in bounds],
                       "dominated_by": list(self.front[index]),
                       "inside": {k: partial.get(k) for k in ("output_tok_s", "exact", "window_s",
                                                               "first_wave_s", "completed", "planned")},
                       "skipped_levels": [level, *remaining]}
        return True

    def measured_levels(self, noise_floor: float) -> dict[str, dict[str, float | None]]:
        """The level a rule-4a stop measured (``record["measured"]``), as the outcome records
        it: its output tok/s, with the interval that status, the front and picks read widened
        like every other level's by the between-start ``noise_floor`` (a value without one
        would look exact). Empty for every other stop."""

        out: dict[str, dict[str, float | None]] = {}
        for key, value in ((self.record or {}).get("measured") or {}).items():
            level_values: dict[str, float | None] = dict(value)
            ci = level_values.get("output_tok_s.ci95") or math.nan
            ci = with_noise_floor(ci, float(level_values.get("output_tok_s") or math.nan), noise_floor)
            if math.isfinite(ci) and ci > 0:
                level_values["output_tok_s.ci95"] = ci
            else:
                level_values.pop("output_tok_s.ci95", None)
            out[str(key)] = level_values
        return out

    def during_search(self, levels: Levels, bound: float) -> bool:
        """During the max_rate@slo search (rule 5): ``levels`` are the flat metrics of every
        level measured (concurrency levels by int, open-loop ones by name), ``bound`` the
        largest answer the search can still give. True = end the search; the trial is told
        stopped (its max_rate@slo as ``bound``), never on the front."""

        if not self.enabled or self.stopped:
            return self.stopped
        after = f"max_rate@slo search (answer below {bound:g} req/s)"
        violations = self._limit_violations(levels)
        for lim in self.limits:
            if lim["metric"] == MAX_RATE and lim.get("min") is not None:
                violations[str(lim["label"])] = float(lim["min"]) - bound
        reason = infeasible_reason(applied=True, probe_passed=True, limit_violations=violations)
        if reason is not None:
            self.record = {"reason": reason, "after": after, "bounds": None, "skipped_levels": [],
                           "max_rate_bound": bound}
            return True
        trial = {k: v for k, v in self.trial_metrics.items() if v is not None}
        measured: dict[int | str, Mapping[str, float]] = {
            **levels, TRIAL_LEVEL: {**trial, MAX_RATE: bound}}
        bounds = optimistic_values(self.targets, measured, self.history, margin=self.margin,
                                   min_history=self.min_history, max_gap=self.max_gap)
        index = dominated(bounds, self.front, [t.direction for t in self.targets])
        if index is None:
            return False
        self.record = {"reason": "dominated", "after": after,
                       "bounds": [b if math.isfinite(b) else None for b in bounds],
                       "dominated_by": list(self.front[index]), "skipped_levels": [],
                       "max_rate_bound": bound}
        return True
