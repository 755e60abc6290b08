"""Numerics or corruption? The probe's judgement of one position where a trial and the
reference disagree (pure).

Greedy decoding amplifies tiny arithmetic differences: a different batch size, dtype,
attention kernel or compiled graph changes low-order bits, and where the model's top two
tokens are nearly tied the greedy choice flips - after which the two texts legitimately go
separate ways (measurement.md §5: about 30 % of prompts diverge within 48 tokens between
correct fp32 and bf16 servers; 28 % between compiled and eager vLLM on an H200). Such a
flip is *numerics*. A configuration that corrupts output replaces a token the reference
was confident about with one the reference ranks low. The rule therefore asks the
reference, not the trial, how sure it was:

* ``gap`` = reference logprob of its own token - reference logprob of the trial's token
  (nats). When the trial's token is outside the reference's top-k, only a lower bound is
  known: the gap to the k-th token.
* gap <= ``near_tie`` nats: a near tie, numerics. Above it, or a trial token outside the
  reference's top-k altogether: corruption. For a lossy trial (fp8 KV cache or weights, judged
  by its accuracy under a budget: docs/probe.md) ``outside_by_bound`` judges a token outside the
  top-k by the lower bound on its gap instead: on an H100, fp8 picked tokens outside the bf16
  reference's top-5 where that top-5 spanned 0.125-0.5 nats (a flat position, not a confident
  one); garbage replaces confident tokens, whose k-th alternative lies nats below.

Calibration (measurement.md §5 and ``benchmarks/probe_calibration.py``): numerics flips
between correct servers - fp32 vs bf16, batch 1 vs batch N, compiled vs eager - were all at
gaps <= 0.375 nats (bf16 logits come in steps of 1/32 to 1/8 nats, most flips are exact
ties); real corruption diverged at gaps of 0.75 to 11 nats (median 2.25 on the broken H200
configuration, ranks up to ~37,000). The default ``near_tie`` of 1.0 nats sits between.

The same rule judges every compared position: each prompt's first decode divergence,
every teacher-forced position (where the trial's top-1 is judged against the reference's
distribution at that position), and the reference's self-check against itself. Two
distribution distances are recorded over the compared positions - the top-k overlap (how
many of the reference's top-k the trial also ranks in its top-k) and a top-k KL estimate -
because corruption that keeps the top-1 still scrambles the rest of the distribution.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Literal, NamedTuple

__all__ = ["FLAT_TOP_K_NATS", "Judgement", "flat", "judge", "top_k_kl", "top_k_overlap"]

# A reference top-k whose k logprobs all lie within this many nats is a tie among more than
# k tokens, so which k the server lists is numerics and comparing two such lists says nothing.
# Dummy weights (load_format: dummy) are flat everywhere: SmolLM2-135M's top-5 spans 1-2e-6
# nats (one float32 step at -10.8, the uniform logprob over its 49,152 tokens), and a correct
# bfloat16 server shared 49 % of the float32 server's top-5 on average, 20 % at worst, with
# every top-1 equal. Real weights never come near: the smallest top-5 span over 704 positions
# was 0.52 nats (benchmarks/dummy_weights.py; docs/probe.md, dummy weights).
FLAT_TOP_K_NATS = 0.01

Kind = Literal["match", "near_tie", "corrupt"]


class Judgement(NamedTuple):
    """One position: the trial's token against the reference's distribution there."""

    kind: Kind
    gap: float | None
    """Reference logprob of its token minus that of the trial's token; None when the trial's
    token is outside the reference's top-k (then ``gap_at_least`` bounds it)."""
    gap_at_least: float
    rank: int | None
    """The trial token's rank in the reference's top-k (1 = the reference's own choice)."""


def _ranked(top: Mapping[int, float]) -> list[tuple[int, float]]:
    # NaN sorts last, ties by id, so ranks are deterministic.
    return sorted(
        top.items(), key=lambda kv: (-kv[1] if not math.isnan(kv[1]) else math.inf, kv[0])
    )


def judge(
    reference_top: Mapping[int, float],
    reference_token: int,
    reference_logprob: float,
    trial_token: int,
    k: int,
    near_tie: float,
    outside_by_bound: bool = False,
) -> Judgement:
    """Judge the trial's token at a position where the reference chose ``reference_token``
    (with ``reference_logprob``) and listed ``reference_top`` (id -> logprob).

    Only the reference's k most likely tokens are used (an entry may hold k + 1, the
    chosen token added), so a trial token outside them gets a lower-bound gap.
    """
    if trial_token == reference_token:
        return Judgement("match", 0.0, 0.0, 1)
    ranked = _ranked(reference_top)[:k]
    ids = [tid for tid, _ in ranked]
    if trial_token in ids:
        gap = reference_logprob - reference_top[trial_token]
        kind: Kind = "near_tie" if gap <= near_tie + 1e-9 else "corrupt"
        return Judgement(kind, gap, gap, ids.index(trial_token) + 1)
    floor = min((lp for _, lp in ranked if not math.isnan(lp)), default=-math.inf)
    bound = reference_logprob - floor
    if outside_by_bound and bound <= near_tie + 1e-9:
        return Judgement("near_tie", None, bound, None)
    # Outside the reference's top-k is corruption, as in vLLM's own check_logprobs_close:
    # every measured numerics flip chose a token inside the reference's top-5
    # (measurement.md §5), so this costs no false alarm even where the top-k is flat.
    return Judgement("corrupt", None, bound, None)


def flat(reference: Mapping[int, float], k: int) -> bool:
    """The reference's k most likely tokens are tied within ``FLAT_TOP_K_NATS``: top-k
    overlap and KL are not measured there."""
    values = [lp for _, lp in _ranked(reference)[:k] if not math.isnan(lp)]
    return len(values) >= 2 and values[0] - values[-1] <= FLAT_TOP_K_NATS


def top_k_overlap(reference: Mapping[int, float], trial: Mapping[int, float], k: int) -> float:
    """Shared tokens of the two top-k lists, over k (1.0: the same k tokens)."""
    a = {tid for tid, _ in _ranked(reference)[:k]}
    b = {tid for tid, _ in _ranked(trial)[:k]}
    return len(a & b) / max(1, min(k, len(a)))


def top_k_kl(reference: Mapping[int, float], trial: Mapping[int, float], k: int) -> float:
    """KL(reference || trial) restricted to the reference's top-k tokens (nats).

    The trial's logprob of a token outside its own top-k is unknown; its smallest listed
    logprob bounds it from above, so the estimate is a lower bound of the true term. Zero
    when the two agree; large when the trial puts little mass on what the reference
    expected."""
    ranked = _ranked(reference)[:k]
    trial_top = _ranked(trial)[:k]
    if not ranked or not trial_top:
        return 0.0
    floor = min(lp for _, lp in trial_top)
    total = 0.0
    for tid, lp in ranked:
        q = trial.get(tid, floor)
        if math.isnan(lp) or math.isnan(q):
            return math.inf
        total += math.exp(lp) * (lp - q)
    return max(0.0, total)
