"""The quality gate on a running server (I/O): the reference job's answers to the study's
quality items, and a lossy trial's paired, sequential test against them.

Both ask the same items (tuner.probe.quality_items) the same way - each through its own chat
request, greedy, at most the probe's top decode batch size in flight - and judge each answer
by the bank's check rule. A request that fails counts as a wrong answer: a server that cannot
answer serves nobody right.

The trial asks in looks (tuner.probe.quality_stats.look_sizes): the first ``items`` items,
then twice as many ... up to ``max_items``; after each look the paired drop's interval
decides pass, fail or more (``judge``). Most configurations are decided at the first look;
one whose true drop sits near the budget costs the most items.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from time import perf_counter

from tuner.probe.checks import check_answer
from tuner.probe.client import ask_item
from tuner.probe.http import make_client
from tuner.probe.items import ProbeItem
from tuner.probe.known_score import ProbeAnswer
from tuner.probe.quality_items import QualityAnswer, QualityReference, prompt_hash, quality_items
from tuner.probe.quality_stats import (
    PairedCounts,
    QualityRecord,
    drop_interval,
    judge,
    look_confidence,
    look_sizes,
    paired_counts,
)
from tuner.probe.spec import ProbeSpec
from tuner.study.quality_plan import QualityPlan

__all__ = ["answer_items", "gate_record", "quality_gate", "record_quality_reference"]


def _width(probe: ProbeSpec) -> int:
    """Requests in flight: the probe's top decode batch size (the load's top concurrency)."""

    return max(*probe.concurrency, probe.bank.top_concurrency or 1)


def _judged(item: ProbeItem, answer: ProbeAnswer) -> QualityAnswer:
    text = None if answer.error else answer.text
    right = check_answer(item.check, item.expected, text, item.distractors)
    return QualityAnswer(id=item.id, prompt_hash=prompt_hash(item), right=right, error=answer.error)


async def answer_items(base_url: str, model: str, probe: ProbeSpec, items: Sequence[ProbeItem], *,
                       deadline: float | None, headers: Mapping[str, str] | None) -> list[QualityAnswer]:
    """Each of ``items`` asked and judged, in order. ``deadline``: perf_counter seconds after
    which nothing more is sent (those items are answered with an error)."""

    if not items:
        return []
    width = _width(probe)
    gate = asyncio.Semaphore(width)
    async with make_client(base_url, headers, probe, width) as client, asyncio.TaskGroup() as group:
        tasks = [group.create_task(ask_item(client, item, width, model, probe, gate, deadline))
                 for item in items]
    return [_judged(item, task.result()) for item, task in zip(items, tasks, strict=True)]


def _deadline(deadline_s: float | None) -> float | None:
    return None if deadline_s is None else perf_counter() + deadline_s


async def record_quality_reference(base_url: str, model: str, probe: ProbeSpec, plan: QualityPlan, *,
                                   deadline_s: float | None,
                                   headers: Mapping[str, str] | None) -> QualityReference:
    """The reference server's answers to every quality item of the study (``max_items``)."""

    began = perf_counter()
    items = quality_items(probe, plan.spec.max_items)
    answers = await answer_items(base_url, model, probe, items, deadline=_deadline(deadline_s), headers=headers)
    return QualityReference(seed=probe.seed, answers=answers, seconds=perf_counter() - began)


async def quality_gate(base_url: str, model: str, probe: ProbeSpec, plan: QualityPlan, *,
                       deadline_s: float | None, headers: Mapping[str, str] | None) -> QualityRecord:
    """A lossy trial's quality verdict: its answers paired with the reference's, look by look,
    until ``judge`` decides (at the last look undecided is a fail)."""

    if plan.reference is None:
        raise ValueError("a trial's quality plan carries the reference's answers; this one has none")
    began = perf_counter()
    deadline = _deadline(deadline_s)
    reference = {a.id: a.right for a in plan.reference.answers}
    items = quality_items(probe, len(reference))
    quality = plan.spec
    sizes = look_sizes(min(quality.items, len(items)), len(items))
    trial: dict[str, bool] = {}
    for look, size in enumerate(sizes):
        asked = await answer_items(base_url, model, probe, items[len(trial):size], deadline=deadline,
                                   headers=headers)
        trial.update((a.id, a.right) for a in asked)
        counts = paired_counts(reference, trial)
        verdict = judge(counts, quality.max_accuracy_drop, quality.confidence, look, len(sizes))
        if verdict != "more":
            break
    return gate_record(counts, plan, looks=look + 1, planned=len(sizes), probe_s=perf_counter() - began)


def gate_record(counts: PairedCounts, plan: QualityPlan, *, looks: int, planned: int,
                probe_s: float) -> QualityRecord:
    """The stored verdict of the look that decided (``looks`` of ``planned``)."""

    quality = plan.spec
    drop, low, high = drop_interval(counts, look_confidence(quality.confidence, planned))
    passed = high <= quality.max_accuracy_drop
    return QualityRecord(
        items=counts.n, reference_accuracy=counts.reference_accuracy, trial_accuracy=counts.trial_accuracy,
        drop=drop, drop_low=low, drop_high=high, confidence=quality.confidence,
        budget=quality.max_accuracy_drop, verdict="pass" if passed else "fail",
        decided_at_cap=not passed and low <= quality.max_accuracy_drop, looks=looks, probe_s=probe_s,
        lossy=dict(plan.lossy), pairs=counts)
