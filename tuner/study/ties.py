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

from tuner.load.uncertainty import mean_ci
from tuner.study.noise import NoisyPoint, Tie, noisy_front

__all__ = ["Pooled", "next_runs", "pooled", "remaining_ties"]


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
