"""Known-answer scoring (pure): judge every answer and apply :class:`ProbeSpec`'s pass rule
(accuracy against the reference's, answers unchanged across concurrency levels).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from statistics import NormalDist
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, computed_field

from tuner.probe.checks import check_answer
from tuner.probe.items import ProbeItem
from tuner.probe.spec import Api, ProbeSpec

__all__ = [
    "ItemRecord",
    "LevelResult",
    "ProbeAnswer",
    "ProbeFlag",
    "ProbeResult",
    "Tally",
    "accuracy_tolerance",
    "index_answers",
    "score",
]

# vLLM reports these for a normally finished request; anything else (abort, None, a
# server-specific value) hints at a server-side problem and is flagged.
_NORMAL_FINISH = frozenset({"stop", "length"})


class ProbeAnswer(BaseModel):
    """What the server returned for one item at one concurrency level (raw, unjudged)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    item_id: str
    concurrency: int
    text: str | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    latency_s: float | None = None
    error: str | None = Field(default=None, description="Set when no usable answer came back.")


class ItemRecord(BaseModel):
    """A judged answer, as stored with the trial."""

    id: str
    family: str
    api: Api
    concurrency: int
    prompt: str = Field(description="Truncated for storage; the full text is reproducible.")
    expected: str
    answer: str | None
    correct: bool
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    latency_s: float | None
    error: str | None


class Tally(BaseModel):
    correct: int
    total: int

    @computed_field  # type: ignore[prop-decorator]
    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else 0.0


class ProbeFlag(BaseModel):
    """Something suspicious about one answer (empty text, odd finish reason, error)."""

    item_id: str
    concurrency: int
    detail: str


class LevelResult(BaseModel):
    """Verdict for one concurrency level (one full run of the item set)."""

    concurrency: int
    correct: int
    total: int
    accuracy: float
    threshold: float | None = Field(
        description="The accuracy bar; None at a single-stream subset level (not gated there)."
    )
    by_api: dict[str, Tally]
    consistency: float | None = Field(
        description=(
            "Fraction of the items asked at both levels answered identically to the lowest "
            "level; None there."
        )
    )
    passed: bool
    subset: bool = Field(
        default=False, description="Only some items were asked here (a lower batch size of the plan)."
    )


NOT_JUDGED = "known answers not judged (reference-only probe)"


class ProbeResult(BaseModel):
    """Outcome of one probe run; JSON-serialisable with ``model_dump(mode="json")``."""

    passed: bool
    reason: str
    accuracy: float
    correct: int
    total: int
    by_family: dict[str, Tally]
    by_api: dict[str, Tally]
    by_concurrency: dict[int, Tally]
    levels: list[LevelResult]
    consistency: float | None = Field(
        description="Pooled fraction of identical answers, higher levels vs the lowest one."
    )
    empty_outputs: list[ProbeFlag]
    unexpected_finish_reasons: list[ProbeFlag]
    errors: list[ProbeFlag]
    records: list[ItemRecord]
    probe_seconds: float | None = None
    skipped: bool = False

    @classmethod
    def disabled(cls) -> ProbeResult:
        """The result recorded when the study turns the probe off."""
        return cls(
            passed=True,
            reason="probe disabled",
            accuracy=0.0,
            correct=0,
            total=0,
            by_family={},
            by_api={},
            by_concurrency={},
            levels=[],
            consistency=None,
            empty_outputs=[],
            unexpected_finish_reasons=[],
            errors=[],
            records=[],
            skipped=True,
        )

    @classmethod
    def not_judged(cls) -> ProbeResult:
        """The result of a reference-only probe (``ProbeSpec.mode``): no known answer asked
        or judged - dummy weights answer none right - so nothing to fail."""
        return cls.disabled().model_copy(update={"reason": NOT_JUDGED})


def accuracy_tolerance(n: int, reference: float, confidence: float = 0.95) -> float:
    """How far below the reference accuracy a correct server may score on ``n`` items.

    Rule: one-sided ``confidence`` bound on the difference of two proportions measured on
    ``n`` items each (the reference configuration and the trial run the same probe),

        tolerance = z * sqrt(2 * p * (1 - p) / n),   z = Phi^-1(confidence),

    with the reference proportion Agresti-Coull adjusted, p = (reference*n + z^2/2) /
    (n + z^2), so a perfect reference still leaves room for a near-tie flip: at 95 %,
    n=24 and reference 1.0 the tolerance is about 0.10 (22/24 passes, 21/24 fails); at
    n=200 and reference 0.9 it is about 0.05, close to measurement.md's "baseline - 0.03"
    to vLLM's "expected - 0.08" range.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 0.0 <= reference <= 1.0:
        raise ValueError(f"reference must be in [0, 1], got {reference}")
    if not 0.5 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0.5, 1), got {confidence}")
    z = NormalDist().inv_cdf(confidence)
    p = (reference * n + z * z / 2) / (n + z * z)
    return z * math.sqrt(2 * p * (1 - p) / n)


def _truncate(prompt: str, limit: int = 240) -> str:
    if len(prompt) <= limit:
        return prompt
    # Keep the end too: for lookups the question is the last line.
    return f"{prompt[:150]} …[{len(prompt)} chars]… {prompt[-70:]}"


def _tally(records: Iterable[ItemRecord], key: str) -> dict[str, Tally]:
    counts: dict[str, list[int]] = {}
    for rec in records:
        slot = counts.setdefault(str(getattr(rec, key)), [0, 0])
        slot[0] += rec.correct
        slot[1] += 1
    return {k: Tally(correct=c, total=t) for k, (c, t) in counts.items()}


def _judge(item: ProbeItem, level: int, answer: ProbeAnswer | None) -> ItemRecord:
    if answer is None:
        answer = ProbeAnswer(item_id=item.id, concurrency=level, error="no answer recorded")
    text = None if answer.error else answer.text
    return ItemRecord(
        id=item.id,
        family=item.family,
        api=item.api,
        concurrency=level,
        prompt=_truncate(item.prompt),
        expected=item.expected,
        answer=answer.text,
        correct=check_answer(item.check, item.expected, text, item.distractors),
        finish_reason=answer.finish_reason,
        prompt_tokens=answer.prompt_tokens,
        completion_tokens=answer.completion_tokens,
        latency_s=answer.latency_s,
        error=answer.error,
    )


_A = TypeVar("_A")
_K = TypeVar("_K", bound=tuple[Any, ...])


def index_answers(
    answers: Iterable[_A],
    ids: set[str],
    levels: Sequence[int],
    subsets: Mapping[int, set[str]],
    key: Callable[[_A], _K],
    what: str,
) -> dict[_K, _A]:
    """The answers by ``key`` (the id of one of ``ids``, the level, then anything that tells
    two answers there apart); raises ValueError on a caller bug (unknown or duplicate
    answers, a subset naming unknown ``what``s)."""
    for level, sub in subsets.items():
        if level not in levels or not sub or not sub <= ids:
            raise ValueError(f"bad {what} subset at concurrency {level}: {sorted(sub)[:5]}")
    got: dict[_K, _A] = {}
    for ans in answers:
        k = key(ans)
        name, level = k[0], k[1]
        if name not in ids:
            raise ValueError(f"answer for unknown {what} {name!r}")
        if level not in levels:
            raise ValueError(f"answer at unexpected concurrency {level}")
        if level in subsets and name not in subsets[level]:
            raise ValueError(f"answer for {name!r}, not asked at {level}")
        if k in got:
            kind = "".join(f"{part} " for part in k[2:3])   # the reference layer's generate/forced
            raise ValueError(f"two {kind}answers for {name!r} at concurrency {level}")
        got[k] = ans
    return got


def _accuracy_rule(
    recs: Sequence[ItemRecord], spec: ProbeSpec, level: int, subset: bool
) -> tuple[float | None, str | None]:
    """(the accuracy bar of one level, why it failed or None). A single-stream subset level
    has no bar; without a reference accuracy the bar is ``min_accuracy``."""
    accuracy = sum(r.correct for r in recs) / len(recs)
    if subset:
        return None, None
    if spec.reference_accuracy is None:
        threshold, rule = spec.min_accuracy, ""
    else:
        tol = accuracy_tolerance(len(recs), spec.reference_accuracy, spec.confidence)
        threshold = max(0.0, spec.reference_accuracy - tol)
        rule = f" (reference {spec.reference_accuracy:.2f} - tolerance {tol:.2f}, n={len(recs)})"
    # Small epsilon: accuracy and threshold are both ratios of small integers.
    if accuracy >= threshold - 1e-9:
        return threshold, None
    apis = ", ".join(f"{api} {t.accuracy:.2f}" for api, t in _tally(recs, "api").items())
    return threshold, (
        f"accuracy {accuracy:.2f} < {threshold:.2f}{rule} at concurrency {level} ({apis})"
    )


def _consistency_rule(
    recs: Sequence[ItemRecord],
    base: Sequence[ItemRecord],
    spec: ProbeSpec,
    level: int,
) -> tuple[int, int, str | None]:
    """(answers unchanged, items asked at both levels, why it failed or None) of a higher
    level against the lowest one (``base``)."""
    base_text = {r.id: r.answer for r in base if r.error is None}
    base_ids = {r.id for r in base}
    baseline = base[0].concurrency if base else level
    pairs = [r for r in recs if r.id in base_ids]
    same = sum(r.error is None and r.id in base_text and base_text[r.id] == r.answer for r in pairs)
    changed = len(pairs) - same
    # As many changed answers as min_consistency tolerates over this level's items
    # (same/n >= c <=> changed <= (1-c)n); with a single-stream subset as baseline the
    # pairs are fewer, so never all of them either.
    tolerated = math.floor((1.0 - spec.min_consistency) * len(recs) + 1e-9)
    if len(pairs) < len(recs):
        tolerated = min(tolerated, len(pairs) - 1)
    if not pairs or spec.min_consistency <= 0 or changed <= tolerated:
        return same, len(pairs), None
    if len(pairs) == len(recs):
        return (
            same,
            len(pairs),
            (
                f"consistency {same / len(pairs):.2f} < {spec.min_consistency:.2f} at "
                f"concurrency {level} vs {baseline} (greedy answers changed with batch size)"
            ),
        )
    return (
        same,
        len(pairs),
        (
            f"{changed} of the {len(pairs)} single-stream items answered differently at "
            f"concurrency {level} than at {baseline} (at most {tolerated} tolerated; greedy "
            "answers changed with batch size)"
        ),
    )


def _flags(records: Sequence[ItemRecord]) -> tuple[list[ProbeFlag], ...]:
    """(request errors, empty outputs, unexpected finish reasons)."""
    errors = [
        ProbeFlag(item_id=r.id, concurrency=r.concurrency, detail=r.error)
        for r in records
        if r.error is not None
    ]
    empty = [
        ProbeFlag(item_id=r.id, concurrency=r.concurrency, detail="empty output")
        for r in records
        if r.error is None and not (r.answer or "").strip()
    ]
    odd_finish = [
        ProbeFlag(
            item_id=r.id, concurrency=r.concurrency, detail=f"finish_reason={r.finish_reason!r}"
        )
        for r in records
        if r.error is None and r.finish_reason not in _NORMAL_FINISH
    ]
    return errors, empty, odd_finish


def _judge_level(
    recs: Sequence[ItemRecord],
    base: Sequence[ItemRecord] | None,
    spec: ProbeSpec,
    level: int,
    subset: bool,
) -> tuple[LevelResult, list[str], int, int]:
    """One level's result and why it failed (empty: passed), with (answers unchanged, items
    asked at both levels) against the lowest level ``base`` (None: this is the baseline,
    judged on accuracy only; 0, 0)."""
    threshold, why = _accuracy_rule(recs, spec, level, subset)
    level_failures = [why] if why else []
    consistency = None
    same = pairs = 0
    if base is not None:
        same, pairs, why = _consistency_rule(recs, base, spec, level)
        consistency = same / pairs if pairs else None
        level_failures += [why] if why else []
    correct = sum(r.correct for r in recs)
    result = LevelResult(
        concurrency=level,
        correct=correct,
        total=len(recs),
        accuracy=correct / len(recs),
        threshold=threshold,
        by_api=_tally(recs, "api"),
        consistency=consistency,
        passed=not level_failures,
        subset=subset,
    )
    return result, level_failures, same, pairs


def score(
    items: Sequence[ProbeItem],
    answers: Iterable[ProbeAnswer],
    spec: ProbeSpec,
    *,
    probe_seconds: float | None = None,
    asked: Mapping[int, Collection[str]] | None = None,
) -> ProbeResult:
    """Judge every (item, concurrency level) pair and apply the pass rule of ``ProbeSpec``.

    A missing answer or an error counts as wrong. Levels are ``spec.concurrency``; the
    lowest one is the consistency baseline.

    ``asked`` maps a level to the ids of the only items asked there (the few a trial's
    bank plan asks at its lower batch sizes, :func:`tuner.probe.trial.score_known`); a
    level not in it asked every item. A subset level's accuracy is recorded, not gated (see :class:`ProbeSpec`),
    and consistency is judged over the items asked at both levels.

    Raises:
        ValueError: on duplicate or unknown answers, or an empty item set (caller bugs).
    """
    if not items:
        raise ValueError("no probe items to score")
    if len({item.id for item in items}) != len(items):
        raise ValueError("probe item ids must be unique")
    subsets = {level: set(ids) for level, ids in (asked or {}).items()}
    got = index_answers(answers, {i.id for i in items}, spec.concurrency, subsets,
                        lambda a: (a.item_id, a.concurrency), "item")
    records = [
        _judge(item, level, got.get((item.id, level)))
        for level in spec.concurrency
        for item in items
        if level not in subsets or item.id in subsets[level]
    ]
    baseline = spec.concurrency[0]
    base = [r for r in records if r.concurrency == baseline]
    failures: list[str] = []
    levels: list[LevelResult] = []
    same_total = pairs_total = 0
    for level in spec.concurrency:
        recs = [r for r in records if r.concurrency == level]
        subset = level in subsets and len(subsets[level]) < len(items)
        result, level_failures, same, pairs = _judge_level(
            recs, base if level != baseline else None, spec, level, subset)
        same_total += same
        pairs_total += pairs
        levels.append(result)
        failures += level_failures

    errors, empty, odd_finish = _flags(records)
    if failures and errors:
        failures.append(f"{len(errors)} request error(s), e.g. {errors[0].detail}")
    if failures and empty:
        failures.append(f"{len(empty)} empty output(s)")
    correct_all = sum(r.correct for r in records)
    return ProbeResult(
        passed=not failures,
        reason="; ".join(failures) if failures else "ok",
        accuracy=correct_all / len(records),
        correct=correct_all,
        total=len(records),
        by_family=_tally(records, "family"),
        by_api=_tally(records, "api"),
        by_concurrency={int(k): v for k, v in _tally(records, "concurrency").items()},
        levels=levels,
        consistency=same_total / pairs_total if pairs_total else None,
        empty_outputs=empty,
        unexpected_finish_reasons=odd_finish,
        errors=errors,
        records=records,
        probe_seconds=probe_seconds,
    )
