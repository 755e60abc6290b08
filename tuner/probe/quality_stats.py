"""The quality budget's statistics (pure): how much accuracy a lossy configuration loses against
the reference, judged on the SAME known-answer items (paired outcomes), and when the evidence is
enough to say "inside the budget" or "outside it".

The drop is ``reference accuracy - trial accuracy`` = ``(ref_only - trial_only) / n``; only the
discordant items move it, so pairing removes the item-difficulty noise two independent samples
would carry. Its interval is Newcombe's (1998, method 10) hybrid score interval for a difference
of paired proportions: the Wilson score limits of each marginal accuracy, combined with the
correlation between the two (phi). The items are looked at sequentially (``look_sizes``), each
look at a Bonferroni share of the error (``look_confidence``), and ``judge`` stops as soon as
the interval lies on one side of the budget; undecided at the cap is a fail.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from statistics import NormalDist
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "Judgement",
    "LossyValue",
    "PairedCounts",
    "QualityRecord",
    "Verdict",
    "drop_interval",
    "items_needed",
    "judge",
    "look_confidence",
    "look_sizes",
    "paired_counts",
]

Judgement = Literal["pass", "fail", "more"]
Verdict = Literal["pass", "fail"]


def _check_level(name: str, value: float) -> None:
    if not 0.0 < value < 1.0:
        raise ValueError(f"{name} must lie strictly between 0 and 1, got {value!r}")


class PairedCounts(BaseModel):
    """The paired 2x2 table of known-answer outcomes: reference right/wrong x trial right/wrong."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    both_right: int = Field(ge=0)
    ref_only: int = Field(ge=0, description="Reference right, trial wrong.")
    trial_only: int = Field(ge=0, description="Trial right, reference wrong.")
    both_wrong: int = Field(ge=0)

    @property
    def n(self) -> int:
        return self.both_right + self.ref_only + self.trial_only + self.both_wrong

    def _need_items(self) -> int:
        if self.n == 0:
            raise ValueError("paired counts: n is 0 (no item answered by both sides); nothing to compare")
        return self.n

    @property
    def reference_accuracy(self) -> float:
        return (self.both_right + self.ref_only) / self._need_items()

    @property
    def trial_accuracy(self) -> float:
        return (self.both_right + self.trial_only) / self._need_items()

    @property
    def drop(self) -> float:
        """Reference accuracy minus trial accuracy (positive: the trial is worse)."""
        return (self.ref_only - self.trial_only) / self._need_items()

    @property
    def discordance(self) -> float:
        """The fraction of items the two sides disagree on, (ref_only + trial_only) / n."""
        return (self.ref_only + self.trial_only) / self._need_items()


def paired_counts(reference: Mapping[str, bool], trial: Mapping[str, bool]) -> PairedCounts:
    """Tally item id -> answered correctly for the reference and the trial over the item ids
    BOTH have. An item only one side answered is left out (not counted as wrong for the
    other): the drop is a paired comparison, and an unpaired item carries no paired evidence.
    """
    shared = reference.keys() & trial.keys()
    tally = {(True, True): 0, (True, False): 0, (False, True): 0, (False, False): 0}
    for item_id in shared:
        tally[(bool(reference[item_id]), bool(trial[item_id]))] += 1
    return PairedCounts(
        both_right=tally[(True, True)], ref_only=tally[(True, False)],
        trial_only=tally[(False, True)], both_wrong=tally[(False, False)],
    )


def _z(confidence: float) -> float:
    return NormalDist().inv_cdf(1.0 - (1.0 - confidence) / 2.0)


def _wilson(successes: int, n: int, z: float) -> tuple[float, float]:
    """The Wilson score interval for one proportion (never degenerate: width > 0 at 0 and n)."""
    z2 = z * z
    centre = (successes + z2 / 2.0) / (n + z2)
    half = z / (n + z2) * math.sqrt(successes * (n - successes) / n + z2 / 4.0)
    return max(0.0, centre - half), min(1.0, centre + half)


def _phi(counts: PairedCounts) -> float:
    """Newcombe's estimate of the correlation between the two marginal accuracies.

    Zero when a margin is empty (the correlation is undefined there; Newcombe sets it to 0).
    The ``ad - bc`` numerator carries the paper's correction: reduced by n/2 when positive
    and clamped at 0 when it is positive but below n/2; a negative one is used as it is.
    """
    a, b, c, d, n = counts.both_right, counts.ref_only, counts.trial_only, counts.both_wrong, counts.n
    margins = (a + b) * (c + d) * (a + c) * (b + d)
    if margins == 0:
        return 0.0
    cross = a * d - b * c
    if cross > n / 2.0:
        numerator = cross - n / 2.0
    elif cross >= 0:
        numerator = 0.0
    else:
        numerator = float(cross)
    return numerator / math.sqrt(margins)


def drop_interval(counts: PairedCounts, confidence: float) -> tuple[float, float, float]:
    """(estimate, low, high) of the accuracy drop, at two-sided ``confidence``.

    Newcombe 1998, method 10: with p1, p2 the reference's and the trial's accuracies and
    (l1, u1), (l2, u2) their Wilson score limits,
    low = drop - sqrt((p1-l1)^2 - 2 phi (p1-l1)(u2-p2) + (u2-p2)^2),
    high = drop + sqrt((u1-p1)^2 - 2 phi (u1-p1)(p2-l2) + (p2-l2)^2), clipped to [-1, 1].
    All-concordant outcomes give an interval around 0 that still has width (the Wilson limits
    do), so a few agreeing items never prove a zero drop.
    """
    _check_level("confidence", confidence)
    n = counts.n
    if n == 0:
        raise ValueError("drop_interval: n is 0 (no item answered by both sides); an interval needs items")
    z = _z(confidence)
    right_ref = counts.both_right + counts.ref_only
    right_trial = counts.both_right + counts.trial_only
    p1, p2 = right_ref / n, right_trial / n
    l1, u1 = _wilson(right_ref, n, z)
    l2, u2 = _wilson(right_trial, n, z)
    phi = _phi(counts)
    estimate = p1 - p2
    # max(0, .): with phi near 1 rounding can push the sum a hair below zero.
    below = math.sqrt(max(0.0, (p1 - l1) ** 2 - 2.0 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    above = math.sqrt(max(0.0, (u1 - p1) ** 2 - 2.0 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    return estimate, max(-1.0, estimate - below), min(1.0, estimate + above)


def look_sizes(items: int, max_items: int) -> list[int]:
    """The item counts of the planned looks: items, 2*items, 4*items, ..., the last exactly
    ``max_items`` (doubling keeps the number of looks, hence the Bonferroni cost, logarithmic)."""
    if items < 1:
        raise ValueError(f"items must be at least 1, got {items!r}")
    if max_items < items:
        raise ValueError(f"max_items must be at least items ({items}), got {max_items!r}")
    sizes = []
    size = items
    while size < max_items:
        sizes.append(size)
        size *= 2
    sizes.append(max_items)
    return sizes


def look_confidence(confidence: float, looks: int) -> float:
    """The confidence each look's interval uses so that all the planned looks together keep
    ``confidence`` (Bonferroni: the error rate split evenly over the looks)."""
    _check_level("confidence", confidence)
    if looks < 1:
        raise ValueError(f"looks must be at least 1, got {looks!r}")
    return 1.0 - (1.0 - confidence) / looks


def judge(counts: PairedCounts, budget: float, confidence: float, look_index: int, looks: int) -> Judgement:
    """The verdict at look ``look_index`` (0-based) of ``looks``, ``confidence`` being the
    study's overall level (the look's share is applied here).

    "pass" when the interval's upper bound is within the budget (the drop is shown to be at
    most ``budget``); "fail" when its lower bound exceeds it; otherwise "more" items, except at
    the last look, where undecided is "fail": the configuration was not shown to be inside
    the budget, and the budget is a promise about what the tuner recommends.
    """
    _check_level("budget", budget)
    if not 0 <= look_index < looks:
        raise ValueError(f"look_index must lie in 0..{looks - 1} (looks={looks}), got {look_index!r}")
    _, low, high = drop_interval(counts, look_confidence(confidence, looks))
    if high <= budget:
        return "pass"
    if low > budget:
        return "fail"
    return "fail" if look_index == looks - 1 else "more"


def items_needed(discordance: float, drop: float, budget: float, confidence: float) -> int:
    """Roughly how many paired items one look needs for its interval's half-width to be below
    ``|budget - drop|`` at this discordance rate (ref_only + trial_only) / n, so that the look
    can decide; the normal approximation Var(drop estimate) = (discordance - drop^2) / n.
    ``confidence`` is the look's own level (``look_confidence`` of the study's).

    For the docs and the "budget too tight" warning, not for decisions (``judge`` decides).
    """
    _check_level("confidence", confidence)
    if not 0.0 <= discordance <= 1.0:
        raise ValueError(f"discordance must lie in [0, 1], got {discordance!r}")
    if abs(drop) > discordance:
        raise ValueError(
            f"drop must lie within +-discordance ({discordance}): only discordant items move it, got {drop!r}")
    gap = abs(budget - drop)
    if gap == 0.0:
        raise ValueError(f"drop equals the budget ({budget!r}): no number of items can decide it")
    variance = discordance - drop * drop
    return max(1, math.ceil(_z(confidence) ** 2 * variance / gap**2))


class LossyValue(BaseModel):
    """A lossy parameter's value in a trial and why it counts as lossy."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    value: str | int | float | bool | None
    reason: str


class QualityRecord(BaseModel):
    """The quality gate's outcome for one lossy trial, as stored with it.

    ``confidence`` is the study's overall level; ``drop_low``/``drop_high`` are the final look's
    interval, computed at that look's Bonferroni share (``look_confidence``), so that all the
    planned looks together hold at ``confidence``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    items: int = Field(ge=1, description="Paired items at the deciding look.")
    reference_accuracy: float = Field(ge=0.0, le=1.0)
    trial_accuracy: float = Field(ge=0.0, le=1.0)
    drop: float = Field(ge=-1.0, le=1.0)
    drop_low: float = Field(ge=-1.0, le=1.0)
    drop_high: float = Field(ge=-1.0, le=1.0)
    confidence: float = Field(gt=0.0, lt=1.0)
    budget: float = Field(gt=0.0, lt=1.0)
    verdict: Verdict
    decided_at_cap: bool = Field(description="Undecided at the last look (max_items): failed as not shown inside.")
    looks: int = Field(ge=1, description="Looks taken (not planned).")
    probe_s: float = Field(ge=0.0)
    lossy: dict[str, LossyValue]
    # The paired table the interval came from, so anyone can re-derive it (and see how often
    # the two sides disagreed, which sets its width). None in records written before it was kept.
    pairs: PairedCounts | None = None

    @model_validator(mode="after")
    def _ordered(self) -> QualityRecord:
        if not self.drop_low <= self.drop <= self.drop_high:
            raise ValueError(
                f"drop_low <= drop <= drop_high must hold, got {self.drop_low}, {self.drop}, {self.drop_high}")
        if self.pairs is not None and self.pairs.n != self.items:
            raise ValueError(f"pairs: {self.pairs.n} paired items, but items is {self.items}")
        return self

    def summary(self) -> str:
        """One line, e.g. ``drop 1.2 pts [-0.8, 3.1] (95%), budget 2.0: pass at 400 items``."""
        line = (f"drop {100 * self.drop:.1f} pts [{100 * self.drop_low:.1f}, {100 * self.drop_high:.1f}] "
                f"({100 * self.confidence:g}%), budget {100 * self.budget:.1f}: {self.verdict} at {self.items} items")
        return line + (" (undecided at the cap)" if self.decided_at_cap else "")
