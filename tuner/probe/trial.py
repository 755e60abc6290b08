"""One trial's bank probe (I/O): the seeded plan of :mod:`tuner.probe.sample` sent to the
server, batch size by batch size, top first, stopping early on a clear failure; both
layers scored from the same requests.

Every request is a recorded reference prompt sent as its token ids, greedy, with top-k
logprobs: its text is judged as a known answer (when it is one) and its tokens are
compared with the reference's by the numerics rule. A known-answer item whose ids the
trial's own ``/tokenize`` does not reproduce (another chat template) is asked through its
own endpoint instead, so the user's path stays tested; it is then judged as a known
answer only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from time import perf_counter
from typing import Any

import httpx

from tuner.probe.client import answer_in, ask_item, load_probe_items
from tuner.probe.correctness import ask_reference, matching_pairs, run_correctness, timed_verdict
from tuner.probe.http import make_client, post_json, request_timeout
from tuner.probe.items import ProbeItem
from tuner.probe.known_score import ProbeAnswer, ProbeResult, score
from tuner.probe.plan_score import score_plan
from tuner.probe.record import Reference, ReferencePrompt
from tuner.probe.reference_score import ReferenceAnswer
from tuner.probe.sample import TrialPlan, plan_trial
from tuner.probe.selection import bank_tokens, prompt_strata, reference_correct, shared_prompts
from tuner.probe.spec import ProbeSpec
from tuner.probe.verdict import CorrectnessResult
from tuner.probe.wire import generation_request, parse_generation

__all__ = ["reference_known_answers", "run_plan", "run_trial_probe", "score_known"]


async def _ask_wave(
    client: httpx.AsyncClient,
    model: str,
    spec: ProbeSpec,
    wave: Sequence[tuple[ReferencePrompt, int, ProbeItem | None]],
    level: int,
    deadline: float | None,
) -> tuple[list[ProbeAnswer], list[ReferenceAnswer]]:
    """One request carrying a wave of prompts (``prompt`` as a list of token-id lists): the
    server schedules them together, so their decode runs at batch size ``len(wave)`` -
    whatever the client's timing - and shrinks through every smaller size as answers end.
    Each choice answers both layers: its text the known answer (when the prompt is one;
    ``repeat`` 0), its tokens the reference comparison."""
    known: list[ProbeAnswer] = []
    agreement: list[ReferenceAnswer] = []
    timeout = request_timeout(spec, deadline)
    body = generation_request(model, wave[0][0].prompt_ids, spec.reference)
    body["prompt"] = [list(p.prompt_ids) for p, _, _ in wave]
    body["max_tokens"] = bank_tokens(spec)
    began = perf_counter()
    payload: Any = None
    error = "not sent: probe deadline reached" if timeout is None else None
    if timeout is not None:
        try:
            payload = await post_json(client, "/v1/completions", body, timeout)
        except ValueError as exc:
            error = str(exc)
    latency = perf_counter() - began
    choices = {}
    if isinstance(payload, dict) and isinstance(payload.get("choices"), list):
        choices = {c.get("index", i): c for i, c in enumerate(payload["choices"])}
    for i, (prompt, repeat, item) in enumerate(wave):
        one = {"choices": [choices[i]]} if i in choices else None
        why = error or (None if one else f"no choice {i} in the reply")
        answer = ReferenceAnswer(
            prompt_id=prompt.id,
            concurrency=level,
            kind="generate",
            latency_s=latency,
            repeat=repeat,
            error=why,
        )
        generation = None
        if why is None:
            try:
                generation = parse_generation(one)
                answer = answer.model_copy(update={"generation": generation})
            except ValueError as exc:
                answer = answer.model_copy(update={"error": str(exc)})
        agreement.append(answer)
        if item is None or repeat:
            continue
        if why is not None:
            known.append(ProbeAnswer(item_id=item.id, concurrency=level, latency_s=latency, error=why))
        else:
            counts = (len(prompt.prompt_ids), None if generation is None else len(generation.tokens))
            known.append(answer_in(item, level, one, latency, as_ids=True, counts=counts))
    return known, agreement


async def _level(
    client: httpx.AsyncClient,
    model: str,
    spec: ProbeSpec,
    reference: Reference,
    plan: TrialPlan,
    level: int,
    shared: Mapping[str, tuple[ProbeItem, ReferencePrompt | None]],
    deadline: float | None,
) -> tuple[list[ProbeAnswer], list[ReferenceAnswer]]:
    """Every request of one batch size: the planned prompts in waves of ``level`` (one
    request each, so the decode batch is exactly that size), then - at the top size - the
    teacher-forced prompts, at most ``level`` in flight. A known-answer item whose ids the
    trial's /tokenize did not reproduce is asked through its own endpoint instead."""
    by_id = {p.id: p for p in reference.prompts}
    gate = asyncio.Semaphore(level)
    seen: dict[str, int] = {}
    entries: list[tuple[ReferencePrompt, int, ProbeItem | None]] = []
    own: list[ProbeItem] = []
    for pid in plan.prompts[level]:
        repeat = seen.get(pid, 0)
        seen[pid] = repeat + 1
        item, paired = shared.get(pid, (None, None))
        if item is not None and paired is None and repeat == 0:
            if not spec.reference_only:  # a known answer only: not judged there
                own.append(item)
            item = None
        entries.append((by_id[pid], repeat, item))
    known: list[ProbeAnswer] = []
    agreement: list[ReferenceAnswer] = []
    for start in range(0, len(entries), level):
        k_answers, r_answers = await _ask_wave(
            client, model, spec, entries[start : start + level], level, deadline
        )
        known += k_answers
        agreement += r_answers
    async with asyncio.TaskGroup() as group:
        known_tasks = [
            group.create_task(ask_item(client, item, level, model, spec, gate, deadline))
            for item in own
        ]
        forced_tasks = [
            group.create_task(
                ask_reference(client, by_id[pid], level, "forced", model, spec, gate, deadline)
            )
            for pid in (plan.forced if level == plan.top else ())
        ]
    known += [t.result() for t in known_tasks]
    agreement += [t.result() for t in forced_tasks]
    return known, agreement


async def run_plan(
    client: httpx.AsyncClient,
    model: str,
    spec: ProbeSpec,
    reference: Reference,
    items: Sequence[ProbeItem],
    pairs: Mapping[str, ReferencePrompt],
    plan: TrialPlan,
    deadline: float | None,
) -> tuple[list[ProbeAnswer], list[ReferenceAnswer], list[int], float]:
    """Run ``plan`` level by level (top first); after the top level, stop when it already
    shows ``reference.early_exit`` corrupt prompts (a clear failure: the rest would only
    cost time). Returns both layers' answers, the levels that ran, and the seconds until
    the known-answer side of each level was back (summed)."""
    # Reference prompt id -> (its known-answer item, the shared prompt when /tokenize matched).
    item_of_prompt: dict[str, tuple[ProbeItem, ReferencePrompt | None]] = {}
    strata_items = {i.id: i for i in items}
    for item_id, prompt in shared_prompts(spec, items, reference).items():
        item_of_prompt[prompt.id] = (strata_items[item_id], pairs.get(item_id))
    known: list[ProbeAnswer] = []
    agreement: list[ReferenceAnswer] = []
    ran: list[int] = []
    known_s = 0.0
    for level in plan.levels:
        began = perf_counter()
        k_answers, r_answers = await _level(
            client, model, spec, reference, plan, level, item_of_prompt, deadline
        )
        known_s += perf_counter() - began
        known += k_answers
        agreement += r_answers
        ran.append(level)
        if level == plan.top and len(plan.levels) > 1:
            so_far = score_plan(reference, agreement, spec.reference, plan, ran=ran)
            corrupt_prompts = {
                r.id for r in so_far.scores if r.verdict == "far" or r.forced_corrupt
            }
            if len(corrupt_prompts) >= spec.reference.early_exit:
                break
    return known, agreement, ran, known_s


def score_known(
    spec: ProbeSpec,
    items: Sequence[ProbeItem],
    reference: Reference,
    answers: Sequence[ProbeAnswer],
    ran: Sequence[int],
    *,
    probe_seconds: float | None = None,
) -> ProbeResult:
    """The known-answer layer of a bank probe: the items asked at each level, judged, with
    accuracy held to the reference's own accuracy on exactly those items (one-sided
    tolerance). Answers changed between batch sizes are not judged here - the reference
    layer judges every answer's tokens by the numerics rule, which tells a near-tie flip
    from corruption; comparing texts would fail correct bf16 servers."""
    asked: dict[int, set[str]] = {}
    for ans in answers:
        asked.setdefault(ans.concurrency, set()).add(ans.item_id)
    if not asked:
        return ProbeResult.disabled().model_copy(update={"reason": "no known-answer items sent"})
    top = max(asked)
    sent = [i for i in items if any(i.id in ids for ids in asked.values())]
    truth = reference_correct(spec, sent, reference)
    on_top = [truth[i] for i in asked[top] if i in truth]
    ref_accuracy = sum(on_top) / len(on_top) if on_top else spec.reference_accuracy
    levels = tuple(sorted(asked))
    judged = spec.model_copy(
        update={
            "concurrency": levels,
            "min_consistency": 0.0,
            "reference_accuracy": ref_accuracy,
        }
    )
    # The top level asked every sent item: it is the one gated; the others are subsets.
    subsets = {lvl: ids for lvl, ids in asked.items() if lvl != top}
    return score(
        sent,
        answers,
        judged,
        probe_seconds=probe_seconds,
        asked=subsets,
    )


async def run_trial_probe(
    base_url: str,
    model: str,
    spec: ProbeSpec,
    *,
    reference: Reference | None,
    items: Sequence[ProbeItem] | None = None,
    sample_seed: int = 0,
    capture_sizes: Sequence[int] = (),
    boundaries: Sequence[int] = (),
    deadline_s: float | None = None,
    headers: Mapping[str, str] | None = None,
) -> CorrectnessResult:
    """A trial's whole correctness probe. With a recorded reference: the seeded plan
    (:func:`tuner.probe.sample.plan_trial`) for this trial (``sample_seed``, e.g. the trial
    number), covering the shapes the server reports (``capture_sizes``, ``boundaries`` from
    its log); without one (none recorded, or the reference layer off) the known answers alone
    (:func:`tuner.probe.correctness.run_correctness`).

    Returns:
        The combined verdict; ``coverage`` says which prompt lengths, batch sizes and
        strata were covered, ``probe_seconds`` what it cost.
    """
    if not (spec.enabled and spec.reference.enabled and reference):
        return await run_correctness(
            base_url,
            model,
            spec,
            reference=reference,
            items=items,
            deadline_s=deadline_s,
            headers=headers,
        )
    if items is None:
        items = load_probe_items(spec)
    strata = prompt_strata(spec, items)
    plan = plan_trial(reference, spec, strata, sample_seed, capture_sizes=capture_sizes, boundaries=boundaries)
    start = perf_counter()
    deadline = None if deadline_s is None else start + deadline_s
    async with make_client(base_url, headers, spec, plan.top) as client:
        sent = {pid for ids in plan.prompts.values() for pid in ids}
        wanted = [
            i
            for i in items
            if any(p.id in sent for p in shared_prompts(spec, [i], reference).values())
        ]
        pairs = await matching_pairs(client, model, spec, wanted, reference, deadline)
        known_answers, ref_answers, ran, known_s = await run_plan(
            client, model, spec, reference, items, pairs, plan, deadline
        )
    total = perf_counter() - start
    if spec.reference_only:
        known = ProbeResult.not_judged()
    else:
        known = score_known(spec, items, reference, known_answers, ran, probe_seconds=known_s)
    result = score_plan(reference, ref_answers, spec.reference, plan, ran=ran)
    coverage = plan.coverage.model_copy(
        update={
            "batch_sizes": sorted(ran),
            "compared_positions": sum(lvl.compared_positions for lvl in result.levels),
            "forced_positions": sum(lvl.forced_positions or 0 for lvl in result.levels),
            "strata": len({strata[p] for p in sent if p in strata}),
        }
    )
    combined = timed_verdict(known, result, spec, total, known_s)
    return combined.model_copy(update={"coverage": coverage, "sample_seed": sample_seed})


def reference_known_answers(
    spec: ProbeSpec, items: Sequence[ProbeItem], reference: Reference
) -> ProbeResult:
    """The reference server's known-answer result, judged from its own recorded answers
    (no extra requests): every item the reference recorded, held to the absolute
    ``min_accuracy`` - the check that the reference configuration itself is sound."""
    pairs = shared_prompts(spec, items, reference)
    level = max(spec.concurrency)
    answers = [
        ProbeAnswer(
            item_id=item_id,
            concurrency=level,
            text=prompt.generation.text,
            finish_reason=prompt.generation.finish_reason,
            completion_tokens=len(prompt.generation.tokens),
        )
        for item_id, prompt in pairs.items()
    ]
    recorded = [i for i in items if i.id in pairs]
    if not recorded:
        return ProbeResult.disabled().model_copy(update={"reason": "no known answers recorded"})
    judged = spec.model_copy(
        update={"concurrency": (level,), "min_consistency": 0.0, "reference_accuracy": None}
    )
    return score(recorded, answers, judged)
