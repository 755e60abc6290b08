"""One trial answer against the reference, position by position (pure).

* **Decode path** (after vLLM's ``tests/models/utils.py::check_logprobs_close``): greedy
  continuations of token-ID prompts must be equal up to their first divergence; there the
  numerics rule (:mod:`tuner.probe.numerics`) judges the trial's token by the reference's
  own confidence: a near tie is numerics (*close*), a confident token replaced is
  corruption (*far*); comparison of that prompt stops there.
* **Prefill path**: the reference continuation is teacher-forced (``prompt_logprobs`` on
  prompt + continuation) and at every continuation position the trial's top-1 is judged
  the same way against the reference's distribution there.

Both record the top-k overlap and a top-k KL at every compared position.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, Field

from tuner.probe.numerics import flat, judge, top_k_kl, top_k_overlap
from tuner.probe.record import ForcedStep, Generation, finite, top_k_ids

__all__ = ["DecodeComparison", "ForcedComparison", "compare_forced", "compare_generation"]

Verdict = Literal["exact", "close", "far", "error"]


class DecodeComparison(BaseModel):
    """One prompt's greedy continuation against the reference's."""

    verdict: Verdict = Field(
        description="exact; close (diverged at a near tie: numerics); far (diverged where the "
        "reference was confident: corruption, or a different length); error"
    )
    matched: int = Field(description="Positions equal before the divergence (or in total).")
    diverged_at: int | None = None
    reference_token: int | None = None
    trial_token: int | None = None
    reference_in_trial_top_k: bool | None = None
    trial_in_reference_top_k: bool | None = None
    gap: float | None = Field(
        default=None,
        description="At the divergence: reference logprob of its token minus that of the "
        "trial's (nats); None when the trial's token is outside the reference's top-k.",
    )
    gap_at_least: float | None = None
    trial_rank: int | None = Field(
        default=None, description="The trial token's rank in the reference's top-k there."
    )
    gaps: list[float] = Field(
        default_factory=list, description="|delta logprob| of the chosen token, matched positions."
    )
    overlaps: list[float] = Field(
        default_factory=list, description="Top-k overlap at every compared position."
    )
    kls: list[float] = Field(
        default_factory=list, description="Top-k KL(reference || trial) at compared positions."
    )
    detail: str = ""


def _distances(
    ref_top: dict[int, float],
    got_top: dict[int, float],
    k: int,
    overlaps: list[float],
    kls: list[float],
) -> None:
    if flat(ref_top, k):
        return  # a tie among more than k tokens: which k are listed is numerics
    overlaps.append(top_k_overlap(ref_top, got_top, k))
    kls.append(top_k_kl(ref_top, got_top, k))


def compare_generation(
    reference: Generation, trial: Generation, k: int, near_tie: float = 1.0,
    outside_by_bound: bool = False,
) -> DecodeComparison:
    """One prompt, token by token, judged by the numerics rule (:mod:`tuner.probe.numerics`).

    Tokens are compared position by position (with the top-k overlap and KL there); at the
    first mismatch the reference's own confidence decides: the trial's token within
    ``near_tie`` nats of the reference's is a near tie (*close*: numerics), anything else
    is *far* (corruption). Later positions are not compared - after a near-tie flip the two
    texts legitimately go separate ways. A trial that stops earlier or later without a
    divergent token, and NaN logprobs, are failures: a server must not produce them.
    """
    if not finite(trial.logprobs) or not all(finite(t.values()) for t in trial.top):
        return DecodeComparison(verdict="error", matched=0, detail="trial logprobs contain NaN")
    gaps: list[float] = []
    overlaps: list[float] = []
    kls: list[float] = []
    for idx, (ref_tok, got_tok) in enumerate(zip(reference.tokens, trial.tokens, strict=False)):
        _distances(reference.top[idx], trial.top[idx], k, overlaps, kls)
        if ref_tok == got_tok:
            gaps.append(abs(reference.logprobs[idx] - trial.logprobs[idx]))
            continue
        j = judge(reference.top[idx], ref_tok, reference.logprobs[idx], got_tok, k, near_tie, outside_by_bound)
        ref_in = ref_tok in top_k_ids(trial.top[idx], k)
        got_in = got_tok in top_k_ids(reference.top[idx], k)
        gap_text = f"{j.gap:.3f}" if j.gap is not None else f">= {j.gap_at_least:.3f}"
        return DecodeComparison(
            verdict="close" if j.kind == "near_tie" else "far",
            matched=idx,
            diverged_at=idx,
            reference_token=ref_tok,
            trial_token=got_tok,
            reference_in_trial_top_k=ref_in,
            trial_in_reference_top_k=got_in,
            gap=j.gap,
            gap_at_least=j.gap_at_least,
            trial_rank=j.rank,
            gaps=gaps,
            overlaps=overlaps,
            kls=kls,
            detail=(
                f"diverged at token {idx}: trial {got_tok} "
                f"{'rank ' + str(j.rank) if j.rank else 'outside the top-' + str(k)} of the "
                f"reference, {gap_text} nats below its token {ref_tok} "
                f"({'near tie' if j.kind == 'near_tie' else 'confident token replaced'})"
            ),
        )
    n = min(len(reference.tokens), len(trial.tokens))
    if len(reference.tokens) != len(trial.tokens):
        return DecodeComparison(
            verdict="far",
            matched=n,
            diverged_at=n,
            gaps=gaps,
            overlaps=overlaps,
            kls=kls,
            detail=(
                f"same first {n} tokens, then the trial ended after {len(trial.tokens)} "
                f"tokens and the reference after {len(reference.tokens)}"
            ),
        )
    return DecodeComparison(verdict="exact", matched=n, gaps=gaps, overlaps=overlaps, kls=kls)


class ForcedComparison(BaseModel):
    positions: int
    top1_matches: int
    close_matches: int = Field(
        default=0,
        description="Positions whose top-1s agree or differ by a near tie (numerics rule).",
    )
    corrupt: list[int] = Field(
        default_factory=list,
        description="Positions where the trial's top-1 replaced a token the reference was "
        "confident about.",
    )
    worst_gap: float | None = Field(
        default=None, description="Largest reference-side gap of a differing top-1 (nats)."
    )
    gaps: list[float]
    overlaps: list[float] = Field(default_factory=list)
    kls: list[float] = Field(default_factory=list)
    first_mismatch: int | None = None


def compare_forced(
    reference: Sequence[ForcedStep],
    trial: Sequence[ForcedStep],
    k: int = 5,
    near_tie: float = 1.0,
    outside_by_bound: bool = False,
) -> ForcedComparison:
    """Every teacher-forced position judged by the numerics rule: where the trial's top-1
    differs from the reference's, the reference's logprob gap between the two decides
    (near tie or corruption); the continuation is forced, so one flip does not carry into
    the next. Also top-1 agreement, top-k overlap and KL, and reference-token |delta|.

    Raises:
        ValueError: the two were not forced on the same continuation (a caller bug).
    """
    if [s.token for s in reference] != [s.token for s in trial]:
        raise ValueError("teacher-forced steps are for different continuations")
    matches = close = 0
    first: int | None = None
    worst: float | None = None
    corrupt: list[int] = []
    gaps: list[float] = []
    overlaps: list[float] = []
    kls: list[float] = []
    for j, (ref, got) in enumerate(zip(reference, trial, strict=True)):
        broken = math.isnan(got.logprob) or not finite(got.top.values())
        same = not broken and ref.top1 is not None and ref.top1 == got.top1
        matches += same
        if same:
            close += 1
        elif not broken and ref.top1 is not None and got.top1 is not None:
            ref_lp = ref.top[ref.top1]
            verdict = judge(ref.top, ref.top1, ref_lp, got.top1, k, near_tie, outside_by_bound)
            bound = verdict.gap if verdict.gap is not None else verdict.gap_at_least
            worst = bound if worst is None else max(worst, bound)
            if verdict.kind == "near_tie":
                close += 1
            else:
                corrupt.append(j)
        else:
            corrupt.append(j)
        if not same and first is None:
            first = j
        if not broken:
            _distances(ref.top, got.top, k, overlaps, kls)
        # NaN compares as an infinite gap: it must show up in max |delta|, not vanish.
        gaps.append(math.inf if math.isnan(got.logprob) else abs(ref.logprob - got.logprob))
    return ForcedComparison(
        positions=len(reference),
        top1_matches=matches,
        close_matches=close,
        corrupt=corrupt,
        worst_gap=worst,
        gaps=gaps,
        overlaps=overlaps,
        kls=kls,
        first_mismatch=first,
    )
