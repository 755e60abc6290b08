"""One trial answer against the reference, position by position (pure).

* **Decode path** (vLLM's ``tests/models/utils.py::check_logprobs_close``): greedy
  continuations of token-ID prompts must be equal up to their first divergence, and there
  each side's token must be in the other side's top-k logprobs (a near-tie flipped by
  different kernels, which is legitimate); comparison of that prompt stops there. Such a
  prompt is *close*; one whose divergent token is outside the other side's top-k is *far*.
* **Prefill path**: the reference continuation is teacher-forced (``prompt_logprobs`` on
  prompt + continuation) and at each continuation position the trial's top-1 token must
  agree with the reference's top-1, or the two be a near tie (each in the other's top-k).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, Field

from tuner.probe.record import ForcedStep, Generation, finite, top_k_ids

__all__ = ["DecodeComparison", "ForcedComparison", "compare_forced", "compare_generation"]

Verdict = Literal["exact", "close", "far", "error"]


class DecodeComparison(BaseModel):
    """check_logprobs_close for one prompt."""

    verdict: Verdict
    matched: int = Field(description="Positions equal before the divergence (or in total).")
    diverged_at: int | None = None
    reference_token: int | None = None
    trial_token: int | None = None
    reference_in_trial_top_k: bool | None = None
    trial_in_reference_top_k: bool | None = None
    gaps: list[float] = Field(
        default_factory=list, description="|delta logprob| of the chosen token, matched positions."
    )
    detail: str = ""


def compare_generation(reference: Generation, trial: Generation, k: int) -> DecodeComparison:
    """vLLM's ``check_logprobs_close`` for one prompt.

    Tokens are compared position by position; at the first mismatch the prompt is *close*
    when the reference token is in the trial's top-``k`` and the trial token in the
    reference's top-``k``, else *far*; later positions are not compared (the two texts
    legitimately go separate ways after a near-tie flip). Differences vLLM only warns about
    are failures here, because a server must not produce them: a trial that stops earlier
    or later without a divergent token (the shorter one ended without EOS), and NaN
    logprobs.
    """
    if not finite(trial.logprobs) or not all(finite(t.values()) for t in trial.top):
        return DecodeComparison(verdict="error", matched=0, detail="trial logprobs contain NaN")
    gaps: list[float] = []
    for idx, (ref_tok, got_tok) in enumerate(zip(reference.tokens, trial.tokens, strict=False)):
        if ref_tok == got_tok:
            gaps.append(abs(reference.logprobs[idx] - trial.logprobs[idx]))
            continue
        ref_in = ref_tok in top_k_ids(trial.top[idx], k)
        got_in = got_tok in top_k_ids(reference.top[idx], k)
        close = ref_in and got_in
        return DecodeComparison(
            verdict="close" if close else "far",
            matched=idx,
            diverged_at=idx,
            reference_token=ref_tok,
            trial_token=got_tok,
            reference_in_trial_top_k=ref_in,
            trial_in_reference_top_k=got_in,
            gaps=gaps,
            detail=(
                f"diverged at token {idx}: reference {ref_tok} "
                f"{'in' if ref_in else 'NOT in'} trial top-{k}, trial {got_tok} "
                f"{'in' if got_in else 'NOT in'} reference top-{k}"
            ),
        )
    n = min(len(reference.tokens), len(trial.tokens))
    if len(reference.tokens) != len(trial.tokens):
        return DecodeComparison(
            verdict="far",
            matched=n,
            diverged_at=n,
            gaps=gaps,
            detail=(
                f"same first {n} tokens, then the trial ended after {len(trial.tokens)} "
                f"tokens and the reference after {len(reference.tokens)}"
            ),
        )
    return DecodeComparison(verdict="exact", matched=n, gaps=gaps)


class ForcedComparison(BaseModel):
    positions: int
    top1_matches: int
    close_matches: int = Field(
        default=0,
        description="Positions whose top-1s agree or are a near tie (each in the other's top-k).",
    )
    gaps: list[float]
    first_mismatch: int | None = None


def compare_forced(
    reference: Sequence[ForcedStep], trial: Sequence[ForcedStep], k: int = 5
) -> ForcedComparison:
    """Top-1 agreement, near-tie closeness and reference-token |delta logprob| over
    teacher-forced positions.

    A position whose top-1 tokens differ is still *close* when the reference's top-1 is in
    the trial's top-``k`` and the trial's in the reference's: the near-tie flip vLLM's
    ``check_logprobs_close`` accepts at a decode divergence, judged here at every forced
    position (the continuation is forced, so one flip does not carry into the next).

    Raises:
        ValueError: the two were not forced on the same continuation (a caller bug).
    """
    if [s.token for s in reference] != [s.token for s in trial]:
        raise ValueError("teacher-forced steps are for different continuations")
    matches = close = 0
    first: int | None = None
    gaps: list[float] = []
    for j, (ref, got) in enumerate(zip(reference, trial, strict=True)):
        same = ref.top1 is not None and ref.top1 == got.top1 and not math.isnan(got.logprob)
        matches += same
        if same:
            close += 1
        elif (
            ref.top1 is not None
            and got.top1 is not None
            and not math.isnan(got.logprob)
            and finite(got.top.values())
            and ref.top1 in top_k_ids(got.top, k)
            and got.top1 in top_k_ids(ref.top, k)
        ):
            close += 1
        if not same and first is None:
            first = j
        # NaN compares as an infinite gap: it must show up in max |delta|, not vanish.
        gaps.append(math.inf if math.isnan(got.logprob) else abs(ref.logprob - got.logprob))
    return ForcedComparison(
        positions=len(reference),
        top1_matches=matches,
        close_matches=close,
        gaps=gaps,
        first_mismatch=first,
    )
