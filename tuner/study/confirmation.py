"""Confirmation re-runs of Pareto candidates: which points to re-run, and the verdict.

A study's front is made of single measurements. A point that got there on a lucky
window (a quiet neighbour, a warm page cache, a fluke in n-gram acceptance) is the one
most likely to be exported, because selection favours whatever was over-measured. Before a
point is handed out as *the* command to run, the study can start it again on a fresh
server, run the probe and the full sweep again (no early stop), and compare.

Pure logic: the orchestrator runs the jobs (``tuner.engine.confirming``) and hands the objective
values of each re-run to ``judge``; the record it returns is what status, report, export
and ``pareto.json`` show.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from tuner.study.confirmation_text import blocks_export, confirmation_brief, summary_text
from tuner.study.confirmation_text import pct as _pct
from tuner.study.pareto import Point, knee_point, pareto_front
from tuner.study.trials import TrialRecord

__all__ = ["RunResult", "ObjectiveCheck", "Confirmation", "choose_candidates", "judge", "Verdict",
           "reserve_seconds",
           "blocks_export", "summary_text", "confirmation_brief"]

Verdict = Literal["reproduced", "not_reproducible", "failed"]


def confirmable(record: TrialRecord | None) -> bool:
    """Whether a trial can be re-run to confirm it: a completed run whose every objective
    was measured (not told a bound or the worst values seen)."""

    return record is not None and bool(record.values) and record.measured_values() == record.values


class RunResult(BaseModel):
    """One fresh-server re-run, as the study would have told it."""

    model_config = ConfigDict(extra="forbid")

    folder: str
    values: list[float] | None = None   # objective values; None: failed or no measurement
    feasible: bool = False
    outcome: str = "failed"             # feasible, probe_failed, not_applied, limit_missed, failed:<reason>
    message: str | None = None
    trial_s: float | None = None


class ObjectiveCheck(BaseModel):
    model_config = ConfigDict(extra="forbid")

    label: str
    direction: str
    trial: float
    reruns: list[float]
    median: float | None
    change: float | None        # (median - trial) / |trial|; signed, not direction-adjusted
    worse_by: float | None      # the change in the objective's worse direction (>= 0), else 0
    spread: float | None        # (max - min) / |median| over the re-runs (None with one re-run)


class Confirmation(BaseModel):
    model_config = ConfigDict(extra="forbid")

    trial: int
    verdict: Verdict
    reason: str
    tolerance: float
    repeats: int
    objectives: list[ObjectiveCheck]
    # Per objective, when the tolerance came from the study's measured noise (confirm.tolerance
    # unset): the 95 % interval of a re-run's difference from the trial (between_starts).
    tolerances: list[float] | None = None
    # When the stored re-runs were judged again under the current rule (`tuner confirm --rejudge`),
    # and what the verdict had said before (verdict, reason, tolerances).
    rejudged_unix: float | None = None
    previous: dict[str, Any] | None = None
    runs: list[RunResult]
    finished_unix: float | None = None


def choose_candidates(points: Sequence[Point], directions: Sequence[str], n: int) -> list[int]:
    """Up to ``n`` front trial numbers, in the order they are worth confirming.

    First the best point of each objective (what ``--pick best:<objective>`` exports), then
    the knee (the default export), then the rest of the front from the middle outwards:
    the points a user is most likely to take come first when ``n`` is smaller than the front.
    """

    front = pareto_front(points, directions)
    if n <= 0 or not front:
        return []
    order: list[int] = []

    def add(number: int) -> None:
        if number not in order:
            order.append(number)

    for i, direction in enumerate(directions):
        sign = -1.0 if direction == "maximize" else 1.0
        add(min(front, key=lambda p: (sign * p.values[i], p.number)).number)
    knee = knee_point(front, directions)
    if knee is not None:
        add(knee.number)
    # pareto_front orders by the first objective; from the knee's position outwards.
    rest = [p.number for p in front]
    centre = rest.index(knee.number) if knee is not None else len(rest) // 2
    for number in sorted(rest, key=lambda x: (abs(rest.index(x) - centre), x)):
        add(number)
    return order[:n]


def judge(trial: int, labels: Sequence[str], directions: Sequence[str], trial_values: Sequence[float],
          runs: Sequence[RunResult], *, tolerance: float | Sequence[float], repeats: int,
          finished_unix: float | None = None) -> Confirmation:
    """The verdict on one candidate from its re-runs.

    ``failed``: a re-run was infeasible or measured nothing (the probe failed, a knob was not
    applied, a limit was missed, the server did not start) - the point does not reproduce at
    all. ``not_reproducible``: the re-runs' median moved away from the trial by more than
    ``tolerance`` in some objective, *in either direction*: a re-run 24 % faster says the
    measurement is not to be trusted as much as one 24 % slower does (on an H200 a winner
    re-ran +23.8 %, and "a better result confirms" had called that confirmed). Both numbers
    are in the reason. ``reproduced`` only when every objective is within ``tolerance``.
    """

    fixed = isinstance(tolerance, (int, float))
    per_label = [float(tolerance)] * len(labels) if isinstance(tolerance, (int, float)) else [
        float(t) for t in tolerance]
    checks: list[ObjectiveCheck] = []
    good = [r for r in runs if r.feasible and r.values is not None]
    for i, (label, direction) in enumerate(zip(labels, directions)):
        base = float(trial_values[i])
        values = [float(r.values[i]) for r in good]  # type: ignore[index]
        median = statistics.median(values) if values else None
        change = worse = spread = None
        if median is not None and base != 0:
            change = (median - base) / abs(base)
            worse = max(0.0, -change if direction == "maximize" else change)
        if median and len(values) > 1:
            spread = (max(values) - min(values)) / abs(median)
        checks.append(ObjectiveCheck(label=label, direction=direction, trial=base, reruns=values,
                                     median=median, change=change, worse_by=worse, spread=spread))
    bad = [r for r in runs if not (r.feasible and r.values is not None)]
    verdict: Verdict
    if not runs:
        verdict, reason = "failed", "no re-run finished"
    elif bad:
        verdict = "failed"
        reason = "; ".join(f"re-run {r.folder}: {r.outcome}" + (f" ({r.message})" if r.message else "")
                           for r in bad)
    else:
        over = [(c, t) for c, t in zip(checks, per_label) if c.change is not None and abs(c.change) > t]
        if over:
            verdict = "not_reproducible"
            reason = ", ".join(
                f"{c.label} {c.trial:.4g} -> {c.median:.4g} ({_pct(c.change)}, "
                f"{'worse' if (c.worse_by or 0) > 0 else 'better'} by more than "
                f"{format(t, '.0%' if fixed else '.1%')})" for c, t in over)
        elif len(set(per_label)) == 1:
            verdict = "reproduced"
            reason = f"every objective within {per_label[0]:.0%} of the trial, either way"
        else:
            verdict = "reproduced"
            reason = "every objective within its noise of the trial, either way (" + ", ".join(
                f"{c.label} ±{t:.1%}" for c, t in zip(checks, per_label)) + ")"
    return Confirmation(trial=trial, verdict=verdict, reason=reason, tolerance=max(per_label, default=0.0),
                        repeats=repeats, objectives=checks, runs=list(runs), finished_unix=finished_unix,
                        tolerances=None if fixed else per_label)


def reserve_seconds(full_trial_seconds: Sequence[float], *, candidates: int, repeats: int,
                    groups: int) -> float:
    """Wall-clock time to keep free at the end of a study with ``budget.timeout`` for its
    confirmation re-runs: one trial's time for the trials still running when new ones stop,
    then rounds of ``groups`` parallel re-runs, each as long as the median trial that ran
    its whole sweep (a re-run never stops early). 0 before any such trial, and when nothing
    is to be confirmed."""

    runs = candidates * repeats
    if runs <= 0 or not full_trial_seconds:
        return 0.0
    return (1 + math.ceil(runs / max(1, groups))) * statistics.median(full_trial_seconds)
