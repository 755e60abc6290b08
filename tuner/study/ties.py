"""Separating near-ties with repeats (``confirm.tie_runs``): which front candidates to start
again, and what their repeats say.

A trial's interval comes from one server start. Two candidates whose intervals overlap may
differ, or not: another fresh start of each is the only way to know. Each candidate's
*pooled* estimate is the mean of its trial and its re-runs (confirmation re-runs count: the
same configuration on a fresh server); with two or more runs its interval is Student's t
over the runs - the between-start noise, which one run's sub-windows cannot show - and with
one, the trial's own interval. Ties are judged on the pooled estimates with the noisy-front
rule (tuner.study.noise); the next round re-runs the members of every remaining tie, those
with the fewest runs first, until no tie is left or the budget of runs is spent.

Pure: the orchestrator runs the re-runs (tuner.engine.tie_runs) and hands the values back.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tuner.load.uncertainty import mean_ci
from tuner.study.noise import NoisyPoint, Tie, noisy_front
from tuner.study.trials import TrialRecord, noisy_points

__all__ = ["Pooled", "candidates", "next_runs", "pooled", "remaining_ties", "ties_record"]


@dataclass(frozen=True)
class Pooled:
    number: int
    runs: int
    values: tuple[float, ...]
    noise: tuple[float | None, ...]

    def point(self) -> NoisyPoint:
        return NoisyPoint(self.number, self.values, self.noise)


def pooled(number: int, samples: Sequence[Sequence[float]],
           trial_noise: Sequence[float | None]) -> Pooled:
    """The pooled estimate of one candidate from its runs' objective values (trial first)."""
    n = len(samples)
    if n == 0:
        raise ValueError(f"trial {number} has no measured run")
    values, noise = [], []
    for i in range(len(samples[0])):
        xs = [float(s[i]) for s in samples]
        values.append(statistics.fmean(xs))
        noise.append(mean_ci(xs) if n >= 2 else trial_noise[i])
    return Pooled(number, n, tuple(values), tuple(noise))


def remaining_ties(candidates: Sequence[Pooled], directions: Sequence[str],
                   labels: Sequence[str]) -> list[Tie]:
    """The ties among the candidates' pooled estimates."""
    if len(candidates) < 2:
        return []
    return noisy_front([c.point() for c in candidates], directions, labels)[1]


def next_runs(ties: Sequence[Tie], runs: Mapping[int, int], budget: int) -> list[int]:
    """Trials to re-run next (at most ``budget``): the members of every tie, fewest runs first
    (then lowest number), each once."""
    members = sorted({n for t in ties for n in t.trials}, key=lambda n: (runs.get(n, 1), n))
    return members[:max(0, budget)]


def candidates(records: Sequence[TrialRecord], confirmations: Mapping[int, Mapping[str, Any]],
               directions: Sequence[str], labels: Sequence[str]) -> list[Pooled]:
    """The noisy front's points, each pooled with its feasible re-runs so far
    (``confirmations``: the verdicts in ``confirm/``, by trial)."""

    by_number = {r.number: r for r in records}
    near, _ = noisy_front(noisy_points(list(records), list(labels)), directions, labels)
    out = []
    for number in near:
        record = by_number[number]
        samples = [[record.values[label] for label in labels]]
        for run in (confirmations.get(number) or {}).get("runs") or []:
            if run.get("feasible") and run.get("values") is not None:
                samples.append([float(v) for v in run["values"]])
        out.append(pooled(number, samples, list(record.noise(list(labels)).values())))
    return out


def ties_record(*, budget: int, spent: int, spent_s: float, rounds: Sequence[Mapping[str, Any]],
                first: Sequence[Tie], pooled_now: Sequence[Pooled], directions: Sequence[str],
                labels: Sequence[str]) -> dict[str, Any]:
    """What ``confirm/ties.json`` says: the runs spent, the ties at the start, those the
    re-runs separated and those left, and every candidate's pooled estimate."""

    left = remaining_ties(pooled_now, directions, labels)
    left_pairs = {t.trials for t in left}
    return {
        "budget_runs": budget,
        "spent_runs": spent,
        "spent_s": spent_s,
        "rounds": list(rounds),
        "ties_at_start": [t.as_dict() for t in first],
        "separated": [t.as_dict() for t in first if t.trials not in left_pairs],
        "remaining_ties": [t.as_dict() for t in left],
        "pooled": {str(c.number): {"runs": c.runs, "values": dict(zip(labels, c.values, strict=True)),
                                   "noise": dict(zip(labels, c.noise, strict=True))} for c in pooled_now},
    }
