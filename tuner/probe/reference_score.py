"""Reference-agreement scoring (pure): a trial's answers against the recorded reference, and
:class:`ReferenceSpec`'s pass rule per concurrency level.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tuner.probe.compare import Verdict, compare_forced, compare_generation
from tuner.probe.known_score import index_answers
from tuner.probe.record import ForcedStep, Generation, Reference, ReferencePrompt
from tuner.probe.selection import forced_prompt_ids
from tuner.probe.spec import ReferenceSpec

__all__ = [
    "ForcedTotals",
    "PromptScore",
    "ReferenceAnswer",
    "ReferenceLevel",
    "ReferenceResult",
    "gap_stats",
    "level_figures",
    "score_forced_row",
    "score_generation_row",
    "score_reference",
]

Source = Literal["known_answer", "open", "custom"]

# Comparisons of ratios of small integers (e.g. 11/16 >= 0.66) must not fail on rounding.
_EPS = 1e-9


class ReferenceAnswer(BaseModel):
    """What a trial server returned for one reference prompt at one concurrency level."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prompt_id: str
    concurrency: int
    kind: Literal["generate", "forced"]
    generation: Generation | None = None
    forced: list[ForcedStep] | None = None
    latency_s: float | None = None
    error: str | None = None
    repeat: int = Field(
        default=0, description="Which copy of the prompt at this level (a batch filled by repeats)."
    )


def gap_stats(values: Sequence[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return float(median(values)), float(max(values))


class PromptScore(BaseModel):
    """The measured agreement of one prompt at one level (stored with the trial)."""

    id: str
    source: str
    concurrency: int
    verdict: Verdict
    reference_tokens: int
    trial_tokens: int | None = None
    matched: int = 0
    diverged_at: int | None = None
    reference_in_trial_top_k: bool | None = None
    trial_in_reference_top_k: bool | None = None
    decode_gap_median: float | None = None
    decode_gap_max: float | None = None
    forced_positions: int | None = None
    forced_top1: float | None = None
    forced_close: float | None = None
    forced_gap_median: float | None = None
    forced_gap_max: float | None = None
    gap: float | None = Field(
        default=None, description="Reference-side logprob gap at the divergence (nats)."
    )
    trial_rank: int | None = None
    overlap: float | None = Field(
        default=None, description="Mean top-k overlap, compared positions."
    )
    kl_median: float | None = None
    forced_corrupt: list[int] = Field(
        default_factory=list, description="Teacher-forced positions judged corruption."
    )
    forced_worst_gap: float | None = None
    prompt_tokens: int | None = None
    repeat: int = 0
    trial_text: str | None = Field(default=None, description="Truncated, for reading failures.")
    reference_text: str | None = Field(
        default=None, description="The reference's text, truncated, next to a failing trial text."
    )
    detail: str = ""
    error: str | None = None
    latency_s: float | None = None


class ReferenceLevel(BaseModel):
    concurrency: int
    prompts: int
    exact: int
    close: int
    far: int
    errors: int
    exact_fraction: float
    close_fraction: float = Field(description="(exact + close) / prompts")
    decode_gap_median: float | None = None
    decode_gap_max: float | None = None
    forced_positions: int | None = None
    forced_top1: float | None = None
    forced_close: float | None = Field(
        default=None, description="Forced positions agreeing or a near tie (the gated figure)."
    )
    forced_gap_median: float | None = None
    forced_gap_max: float | None = None
    corrupt: int = Field(default=0, description="Positions judged corruption (numerics rule).")
    near_ties: int = Field(default=0, description="Divergences judged numerics (near ties).")
    top_k_overlap: float | None = Field(default=None, description="Mean over compared positions.")
    kl_median: float | None = None
    compared_positions: int = 0
    passed: bool
    subset: bool = Field(
        default=False, description="Only some prompts were asked here."
    )


class ReferenceResult(BaseModel):
    """Outcome of the reference-agreement check; JSON-serialisable."""

    passed: bool
    reason: str
    levels: list[ReferenceLevel]
    scores: list[PromptScore]
    thresholds: dict[str, float | None]
    corrupt: list[str] = Field(
        default_factory=list, description="Evidence: each position judged corruption."
    )
    early_exit: bool = Field(
        default=False, description="Levels were skipped after a clear failure."
    )


def _preview(text: str | None, limit: int = 120) -> str | None:
    if text is None:
        return None
    return text if len(text) <= limit else text[:limit] + "…"


def score_generation_row(
    prompt: ReferencePrompt,
    level: int,
    ans: ReferenceAnswer | None,
    k: int,
    near_tie: float = 1.0,
    outside_by_bound: bool = False,
) -> tuple[PromptScore, list[float]]:
    """One prompt's decode comparison as a stored row, plus its matched-position gaps."""
    row = PromptScore(
        id=prompt.id,
        source=prompt.source,
        concurrency=level,
        verdict="error",
        reference_tokens=len(prompt.generation.tokens),
        latency_s=None if ans is None else ans.latency_s,
        prompt_tokens=len(prompt.prompt_ids),
        repeat=0 if ans is None else ans.repeat,
    )
    if ans is None or ans.error is not None or ans.generation is None:
        row.error = row.detail = (
            "no answer recorded" if ans is None else (ans.error or "no generation")
        )
        return row, []
    cmp = compare_generation(prompt.generation, ans.generation, k, near_tie, outside_by_bound)
    row.verdict = cmp.verdict
    row.gap = cmp.gap if cmp.gap is not None else cmp.gap_at_least
    row.trial_rank = cmp.trial_rank
    row.overlap = sum(cmp.overlaps) / len(cmp.overlaps) if cmp.overlaps else None
    row.kl_median = float(median(cmp.kls)) if cmp.kls else None
    row.trial_tokens = len(ans.generation.tokens)
    row.matched = cmp.matched
    row.diverged_at = cmp.diverged_at
    row.reference_in_trial_top_k = cmp.reference_in_trial_top_k
    row.trial_in_reference_top_k = cmp.trial_in_reference_top_k
    row.decode_gap_median, row.decode_gap_max = gap_stats(cmp.gaps)
    row.detail = cmp.detail
    if cmp.verdict != "exact":
        row.trial_text = _preview(ans.generation.text)
        row.reference_text = _preview(prompt.generation.text)
    if cmp.verdict == "error":
        row.error = cmp.detail
    return row, cmp.gaps


def score_forced_row(
    prompt: ReferencePrompt,
    ans: ReferenceAnswer | None,
    row: PromptScore,
    k: int,
    near_tie: float = 1.0,
    outside_by_bound: bool = False,
) -> tuple[int, int, int, list[float], str | None]:
    """(positions, top-1 matches, close positions, gaps, error) of one teacher-forced
    prompt; fills ``row``.

    A missing or failed answer counts every position as a mismatch: a server that cannot
    answer the teacher-forced request must not pass on the positions it skipped.
    """
    assert prompt.forced is not None
    positions = len(prompt.forced)
    row.forced_positions = positions
    if ans is None or ans.error is not None or ans.forced is None:
        row.forced_top1 = row.forced_close = 0.0
        why = "no answer recorded" if ans is None else (ans.error or "no steps")
        return positions, 0, 0, [], f"{prompt.id}: {why}"
    fc = compare_forced(prompt.forced, ans.forced, k, near_tie, outside_by_bound)
    row.forced_corrupt = fc.corrupt
    row.forced_worst_gap = fc.worst_gap
    row.overlap = (
        sum(fc.overlaps) / len(fc.overlaps) if fc.overlaps and row.overlap is None else row.overlap
    )
    if fc.kls and row.kl_median is None:
        row.kl_median = float(median(fc.kls))
    row.forced_top1 = fc.top1_matches / positions if positions else None
    row.forced_close = fc.close_matches / positions if positions else None
    row.forced_gap_median, row.forced_gap_max = gap_stats(fc.gaps)
    return positions, fc.top1_matches, fc.close_matches, fc.gaps, None


@dataclass
class ForcedTotals:
    """Teacher-forced totals of one level."""

    positions: int = 0
    hits: int = 0
    close: int = 0
    gaps: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _level_rows(
    reference: Reference,
    got: Mapping[tuple[str, int, Any], ReferenceAnswer],
    level: int,
    sent: set[str] | None,
    forced_ids: set[str],
    k: int,
    near_tie: float,
    outside_by_bound: bool = False,
) -> tuple[list[PromptScore], list[float], ForcedTotals]:
    """The scored rows of one level, its decode gaps and (when ``forced_ids``) its
    teacher-forced totals."""
    rows: list[PromptScore] = []
    decode_gaps: list[float] = []
    forced = ForcedTotals()
    for prompt in reference.prompts:
        if sent is not None and prompt.id not in sent:
            continue
        row, gaps = score_generation_row(
            prompt, level, got.get((prompt.id, level, "generate")), k, near_tie, outside_by_bound
        )
        decode_gaps.extend(gaps)
        if prompt.id in forced_ids:
            fans = got.get((prompt.id, level, "forced"))
            pos, hits, close_hits, fgaps, err = score_forced_row(prompt, fans, row, k, near_tie,
                                                                 outside_by_bound)
            forced.positions += pos
            forced.hits += hits
            forced.close += close_hits
            forced.gaps.extend(fgaps)
            if err is not None:
                forced.errors.append(err)
        rows.append(row)
    return rows, decode_gaps, forced


def _level_failures(
    level: ReferenceLevel,
    rows: Sequence[PromptScore],
    forced: ForcedTotals,
    spec: ReferenceSpec,
    exact_level: bool,
) -> list[str]:
    """Why one level fails :class:`ReferenceSpec`'s rule (empty: it passes)."""
    out: list[str] = []
    n = level.prompts
    if level.close_fraction < spec.min_close_fraction - _EPS:
        bad = [r for r in rows if r.verdict in ("far", "error")]
        shown = "; ".join(f"{r.id}: {r.detail}" for r in bad[:3])
        out.append(
            f"{level.far + level.errors}/{n} prompts not close at concurrency "
            f"{level.concurrency} (close {level.close_fraction:.2f} < "
            f"{spec.min_close_fraction:.2f}): {shown}"
        )
    # Exact equality is demanded at one level only, the lowest that sent every prompt: a
    # different batch legitimately changes low-order bits and so near-tie choices
    # (vllm-knobs.md §6), and on a few chosen prompts the fraction means nothing.
    exact_bar = spec.min_exact_fraction
    if exact_level and exact_bar is not None and level.exact_fraction < exact_bar - _EPS:
        out.append(
            f"only {level.exact}/{n} prompts identical at concurrency {level.concurrency} "
            f"({level.exact_fraction:.2f} < {exact_bar:.2f})"
        )
    if level.forced_close is not None and level.forced_close < spec.min_prompt_top1 - _EPS:
        extra = f"; errors: {'; '.join(forced.errors[:3])}" if forced.errors else ""
        out.append(
            f"teacher-forced agreement {level.forced_close:.3f} < {spec.min_prompt_top1:.3f} "
            f"over {forced.positions} positions (top-1 equal or a near tie; top-1 equal "
            f"{level.forced_top1:.3f}){extra}"
        )
    fmed, fmax = level.forced_gap_median, level.forced_gap_max
    if level.forced_top1 is not None and fmed is not None:
        if spec.max_gap_median is not None and fmed > spec.max_gap_median:
            out.append(f"median reference-token |delta logprob| {fmed:.4f} > {spec.max_gap_median}")
        if spec.max_gap is not None and fmax is not None and fmax > spec.max_gap:
            out.append(f"max reference-token |delta logprob| {fmax:.4f} > {spec.max_gap}")
    return out


def level_figures(
    concurrency: int,
    rows: Sequence[PromptScore],
    decode_gaps: Sequence[float],
    forced: ForcedTotals,
    forced_here: bool,
    subset: bool,
) -> ReferenceLevel:
    """The measured figures of one level (``passed`` is set by the caller)."""
    n = len(rows)
    exact = sum(r.verdict == "exact" for r in rows)
    close = sum(r.verdict == "close" for r in rows)
    fmed, fmax = gap_stats(forced.gaps)
    dmed, dmax = gap_stats(decode_gaps)
    has_forced = forced_here and forced.positions > 0
    return ReferenceLevel(
        concurrency=concurrency,
        prompts=n,
        exact=exact,
        close=close,
        far=sum(r.verdict == "far" for r in rows),
        errors=sum(r.verdict == "error" for r in rows),
        exact_fraction=exact / n if n else 1.0,
        close_fraction=(exact + close) / n if n else 1.0,
        decode_gap_median=dmed,
        decode_gap_max=dmax,
        forced_positions=forced.positions if has_forced else None,
        forced_top1=forced.hits / forced.positions if has_forced else None,
        forced_close=forced.close / forced.positions if has_forced else None,
        forced_gap_median=fmed,
        forced_gap_max=fmax,
        passed=True,
        subset=subset,
    )


def score_reference(
    reference: Reference,
    answers: Iterable[ReferenceAnswer],
    spec: ReferenceSpec,
    *,
    asked: Mapping[int, Collection[str]] | None = None,
) -> ReferenceResult:
    """Compare a trial's answers with the reference and apply :class:`ReferenceSpec`'s rule.

    A missing answer or a request error counts as not close. Teacher-forced answers are
    expected at the highest level only, for :func:`forced_prompt_ids`.

    ``asked`` maps a level to the ids of the only prompts sent there; a level not in it
    sent every prompt. The exact rule (``min_exact_fraction``, when set) is held at the
    lowest level that sent every prompt.

    Raises:
        ValueError: answers for unknown prompts, unexpected levels or duplicates (caller bugs).
    """
    all_ids = {p.id for p in reference.prompts}
    levels = spec.concurrency
    subsets = {level: set(ids) for level, ids in (asked or {}).items()}
    got = index_answers(answers, all_ids, levels, subsets,
                        lambda a: (a.prompt_id, a.concurrency, a.kind), "prompt")
    forced_ids = forced_prompt_ids(reference, spec)
    full_levels = [lvl for lvl in levels if lvl not in subsets or subsets[lvl] >= all_ids]
    exact_level = full_levels[0] if full_levels else levels[0]
    # A reference recorded with fewer logprobs than asked cannot show a deeper top-k.
    k = min(spec.top_k, reference.top_k)
    scores: list[PromptScore] = []
    results: list[ReferenceLevel] = []
    failures: list[str] = []
    for level in levels:
        forced_here = level == levels[-1]
        rows, decode_gaps, forced = _level_rows(
            reference,
            got,
            level,
            subsets.get(level),
            forced_ids if forced_here else set(),
            k,
            spec.near_tie_nats,
            spec.outside_top_k_by_bound,
        )
        result = level_figures(
            level, rows, decode_gaps, forced, forced_here, level not in full_levels
        )
        level_failures = _level_failures(result, rows, forced, spec, level == exact_level)
        results.append(result.model_copy(update={"passed": not level_failures}))
        failures.extend(level_failures)
        scores.extend(rows)
    return ReferenceResult(
        passed=not failures,
        reason="; ".join(failures) if failures else "ok",
        levels=results,
        scores=scores,
        thresholds={
            "min_close_fraction": spec.min_close_fraction,
            "min_exact_fraction": spec.min_exact_fraction,
            "min_prompt_top1": spec.min_prompt_top1 if spec.teacher_forced else None,
            "max_gap_median": spec.max_gap_median,
            "max_gap": spec.max_gap,
            "top_k": float(k),
        },
    )
