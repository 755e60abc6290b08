"""Reference agreement of one trial's planned probe (pure): every request of a
:class:`~tuner.probe.sample.TrialPlan` against the recorded reference, judged by the
numerics rule (:mod:`tuner.probe.numerics`).

Pass rule (``ReferenceSpec``), over the whole trial:

* no request error, empty reply or NaN logprob;
* at most ``max_corrupt`` corrupt positions: a prompt whose first divergence replaced a
  token the reference was confident about (gap > ``near_tie_nats``), or a teacher-forced
  position where the trial's top-1 did; near-tie divergences (numerics) are counted, not
  failed;
* at every level, the mean top-k overlap over compared positions at least
  ``min_top_k_overlap``;
* ``min_exact_fraction`` of the top level's prompts identical, only when the study sets
  it (off by default: how many near ties flip depends on dtype and batch, not on
  correctness).

Each corrupt position is listed as evidence (prompt, batch size, where, the gap, the
trial's text next to the reference's).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from statistics import median
from typing import Any

from tuner.probe.known_score import index_answers
from tuner.probe.record import Reference
from tuner.probe.reference_score import (
    ForcedTotals,
    PromptScore,
    ReferenceAnswer,
    ReferenceLevel,
    ReferenceResult,
    level_figures,
    score_forced_row,
    score_generation_row,
)
from tuner.probe.sample import TrialPlan
from tuner.probe.spec import ReferenceSpec

__all__ = ["score_plan"]

_EPS = 1e-9


def _evidence(row: PromptScore) -> str:
    where = (
        f"{row.id} at batch {row.concurrency}: {row.detail}"
        if row.verdict == "far"
        else f"{row.id} at batch {row.concurrency}: teacher-forced positions "
        f"{row.forced_corrupt[:5]} replaced (worst gap {row.forced_worst_gap or 0:.2f} nats)"
    )
    if row.trial_text is not None:
        where += f"; trial {row.trial_text!r} vs reference {row.reference_text!r}"
    return where


def _level(
    reference: Reference,
    got: Mapping[tuple[str, int, Any, int], ReferenceAnswer],
    level: int,
    ids: Sequence[str],
    forced: Sequence[str],
    spec: ReferenceSpec,
    k: int,
) -> tuple[ReferenceLevel, list[PromptScore], list[float]]:
    by_id = {p.id: p for p in reference.prompts}
    rows: list[PromptScore] = []
    decode_gaps: list[float] = []
    seen: dict[str, int] = {}
    for pid in ids:
        repeat = seen.get(pid, 0)
        seen[pid] = repeat + 1
        row, gaps = score_generation_row(
            by_id[pid], level, got.get((pid, level, "generate", repeat)), k, spec.near_tie_nats,
            spec.outside_top_k_by_bound
        )
        decode_gaps.extend(gaps)
        rows.append(row)
    totals = ForcedTotals()
    for pid in forced:
        row = PromptScore(
            id=pid,
            source=by_id[pid].source,
            concurrency=level,
            verdict="exact",
            reference_tokens=len(by_id[pid].generation.tokens),
            prompt_tokens=len(by_id[pid].prompt_ids),
            detail="teacher-forced",
        )
        pos, hits, _, fgaps, err = score_forced_row(
            by_id[pid], got.get((pid, level, "forced", 0)), row, k, spec.near_tie_nats,
            spec.outside_top_k_by_bound
        )
        if err is not None:
            row.verdict, row.error, row.detail = "error", err, err
        totals.positions += pos
        totals.hits += hits
        totals.gaps.extend(fgaps)
        rows.append(row)
    # A forced row is counted with the prompts only when it failed (as a request error).
    decode_rows = [r for r in rows if r.detail != "teacher-forced" or r.verdict == "error"]
    overlaps = [r.overlap for r in rows if r.overlap is not None]
    kls = [r.kl_median for r in rows if r.kl_median is not None]
    result = level_figures(level, decode_rows, decode_gaps, totals, True, True).model_copy(update={
        "forced_close": None,   # the plan's rule gates corrupt positions, not near-tie agreement
        "corrupt": sum(r.verdict == "far" for r in rows) + sum(len(r.forced_corrupt) for r in rows),
        "near_ties": sum(r.verdict == "close" for r in decode_rows),
        "top_k_overlap": sum(overlaps) / len(overlaps) if overlaps else None,
        "kl_median": float(median(kls)) if kls else None,
        "compared_positions": sum(r.matched + (r.diverged_at is not None) for r in decode_rows) + totals.positions,
    })
    return result, rows, decode_gaps


def _level_failures(
    result: ReferenceLevel,
    rows: Sequence[PromptScore],
    level: int,
    spec: ReferenceSpec,
    k: int,
    *,
    exact_bar: float | None,
) -> list[str]:
    """Why one scored level fails (empty: it passes). ``exact_bar``: the share of prompts
    that must be identical, judged at the plan's top level only (None elsewhere)."""
    level_failures: list[str] = []
    errors = [r for r in rows if r.verdict == "error"]
    if errors:
        level_failures.append(
            f"{len(errors)} request(s) failed at batch {level}, e.g. "
            f"{errors[0].id}: {errors[0].detail}"
        )
    if (
        result.top_k_overlap is not None
        and result.top_k_overlap < spec.min_top_k_overlap - _EPS
    ):
        level_failures.append(
            f"top-{k} overlap {result.top_k_overlap:.2f} < {spec.min_top_k_overlap:.2f} at "
            f"batch {level} (the trial's distributions are not the reference's)"
        )
    if (
        spec.max_kl_median is not None
        and result.kl_median is not None
        and result.kl_median > spec.max_kl_median
    ):
        level_failures.append(
            f"median top-{k} KL {result.kl_median:.4f} > {spec.max_kl_median:g} nats at "
            f"batch {level} (the distributions moved further than the reference's own "
            "batch-to-batch variation)"
        )
    if exact_bar is not None and result.exact_fraction < exact_bar - _EPS:
        level_failures.append(
            f"only {result.exact}/{result.prompts} prompts identical at batch {level}"
        )
    return level_failures


def score_plan(
    reference: Reference,
    answers: Iterable[ReferenceAnswer],
    spec: ReferenceSpec,
    plan: TrialPlan,
    *,
    ran: Sequence[int] | None = None,
) -> ReferenceResult:
    """Judge the answers of the levels that ran (``ran``, default all of ``plan.levels``,
    in plan order) against ``reference``. Levels skipped after a clear failure are not
    scored (``early_exit``)."""
    got = index_answers(answers, {p.id for p in reference.prompts}, list(plan.prompts), {},
                        lambda a: (a.prompt_id, a.concurrency, a.kind, a.repeat), "prompt")
    k = min(spec.top_k, reference.top_k)
    # An exact rule applies only when the study sets it: how many
    # near ties flip depends on dtype, batch size and kernels, not on correctness.
    exact_bar = spec.min_exact_fraction if spec.min_exact_fraction is not None else 0.0
    levels = list(plan.levels if ran is None else ran)
    results: list[ReferenceLevel] = []
    scores: list[PromptScore] = []
    failures: list[str] = []
    evidence: list[str] = []
    for level in levels:
        forced = plan.forced if level == plan.top else ()
        result, rows, _ = _level(reference, got, level, plan.prompts[level], forced, spec, k)
        level_failures = _level_failures(
            result, rows, level, spec, k, exact_bar=exact_bar if level == plan.top else None)
        evidence += [_evidence(r) for r in rows if r.verdict == "far" or r.forced_corrupt]
        results.append(result.model_copy(update={"passed": not level_failures}))
        failures += level_failures
        scores += rows
    corrupt = sum(r.corrupt for r in results)
    if corrupt > spec.max_corrupt:
        shown = "; ".join(evidence[:3])
        failures.insert(
            0,
            f"{corrupt} corrupt position(s) (a token the reference was confident about "
            f"replaced; more than {spec.near_tie_nats:g} nats below it): {shown}",
        )
        results = [r.model_copy(update={"passed": r.passed and not r.corrupt}) for r in results]
    return ReferenceResult(
        passed=not failures,
        reason="; ".join(failures) if failures else "ok",
        levels=results,
        scores=scores,
        thresholds={
            "near_tie_nats": spec.near_tie_nats,
            "max_corrupt": float(spec.max_corrupt),
            "min_top_k_overlap": spec.min_top_k_overlap,
            "max_kl_median": spec.max_kl_median,
            "min_exact_fraction": exact_bar,
            "top_k": float(k),
        },
        corrupt=evidence,
        early_exit=len(levels) < len(plan.levels),
    )
