"""One trial's whole correctness probe (I/O): known answers and reference agreement sent as
one set of requests per concurrency level, then scored by the pure layers.

As in :mod:`tuner.probe.client`, misbehaviour of a *trial* server (HTTP errors, timeouts,
malformed bodies) is recorded per request and judged as disagreement, never raised: a
broken server is what the probe is for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from time import perf_counter
from typing import Any

import httpx

from tuner.probe.client import answer_in, ask_item, load_probe_items, run_probe
from tuner.probe.http import make_client, post_json, request_timeout
from tuner.probe.items import ProbeItem
from tuner.probe.known_score import ProbeAnswer, ProbeResult, score
from tuner.probe.record import Reference, ReferencePrompt, truncate_generation
from tuner.probe.reference_score import ReferenceAnswer, ReferenceResult, score_reference
from tuner.probe.selection import (
    SingleStreamPlan,
    forced_prompt_ids,
    item_source,
    shared_prompts,
    single_stream_plan,
)
from tuner.probe.spec import ProbeSpec
from tuner.probe.verdict import CorrectnessResult, combine
from tuner.probe.wire import (
    forced_request,
    generation_request,
    parse_forced,
    parse_generation,
    tokenize_request,
)

__all__ = ["ask_reference", "ask_shared", "matching_pairs", "run_correctness", "run_levels", "timed_verdict"]


async def ask_reference(
    client: httpx.AsyncClient,
    prompt: ReferencePrompt,
    level: int,
    kind: str,
    model: str,
    spec: ProbeSpec,
    gate: asyncio.Semaphore,
    deadline: float | None,
) -> ReferenceAnswer:
    """One reference prompt at one level: its greedy continuation with top-k logprobs
    (``kind`` "generate") or its teacher-forced continuation ("forced"). Failures are
    recorded in the answer, never raised."""
    ref = spec.reference
    fields: dict[str, Any] = {"prompt_id": prompt.id, "concurrency": level, "kind": kind}
    async with gate:
        timeout = request_timeout(spec, deadline)
        if timeout is None:
            return ReferenceAnswer(**fields, error="not sent: probe deadline reached")
        began = perf_counter()
        try:
            if kind == "generate":
                body = generation_request(model, prompt.prompt_ids, ref)
                payload = await post_json(client, "/v1/completions", body, timeout)
                generation = parse_generation(payload)
                return ReferenceAnswer(**fields, generation=generation, latency_s=perf_counter() - began)
            body = forced_request(model, prompt.prompt_ids, prompt.generation.tokens, ref)
            payload = await post_json(client, "/v1/completions", body, timeout)
            steps = parse_forced(payload, len(prompt.prompt_ids), prompt.generation.tokens, ref.top_k)
            return ReferenceAnswer(**fields, forced=steps, latency_s=perf_counter() - began)
        except ValueError as exc:
            return ReferenceAnswer(**fields, error=str(exc), latency_s=perf_counter() - began)


async def _tokenize_matches(
    client: httpx.AsyncClient,
    item: ProbeItem,
    prompt: ReferencePrompt,
    model: str,
    spec: ProbeSpec,
    gate: asyncio.Semaphore,
    deadline: float | None,
) -> bool:
    """Whether the trial server turns ``item`` into the very ids the reference recorded.

    Only then may the item be sent as those ids: a trial whose template or tokenizer
    differs must be asked through its own endpoint, as before, so the known-answer layer
    keeps testing the path a user's request takes. Costs no generation.
    """
    body = tokenize_request(item_source(item, item.id), model)
    async with gate:
        timeout = request_timeout(spec, deadline)
        if timeout is None:
            return False
        try:
            got = await post_json(client, "/tokenize", body, timeout)
        except ValueError:
            return False
    return isinstance(got, dict) and got.get("tokens") == prompt.prompt_ids


async def ask_shared(
    client: httpx.AsyncClient,
    item: ProbeItem,
    prompt: ReferencePrompt,
    level: int,
    model: str,
    spec: ProbeSpec,
    reference: Reference,
    gate: asyncio.Semaphore,
    deadline: float | None,
) -> tuple[ProbeAnswer, ReferenceAnswer]:
    """One request answering both layers for ``item`` at ``level``: the reference's ids,
    greedy, with top-k logprobs, and as many tokens as the known-answer layer asks for
    (the reference comparison looks at the first ``reference.max_tokens`` of them)."""
    ref = spec.reference

    def failed(why: str, latency: float | None = None) -> tuple[ProbeAnswer, ReferenceAnswer]:
        return (ProbeAnswer(item_id=item.id, concurrency=level, latency_s=latency, error=why),
                ReferenceAnswer(prompt_id=prompt.id, concurrency=level, kind="generate", error=why, latency_s=latency))

    async with gate:
        timeout = request_timeout(spec, deadline)
        if timeout is None:
            return failed("not sent: probe deadline reached")
        body = generation_request(model, prompt.prompt_ids, ref)
        body["max_tokens"] = max(spec.max_tokens, reference.max_tokens)
        began = perf_counter()
        try:
            payload = await post_json(client, "/v1/completions", body, timeout)
        except ValueError as exc:
            return failed(str(exc), perf_counter() - began)
        latency = perf_counter() - began
    # Each layer reads the body with its own parser, so a server that breaks only the
    # logprobs (or only the text) is reported by the layer it breaks, as with two requests.
    known = answer_in(item, level, payload, latency, as_ids=True)
    agreement = ReferenceAnswer(prompt_id=prompt.id, concurrency=level, kind="generate", latency_s=latency)
    try:
        generation = truncate_generation(parse_generation(payload), reference.max_tokens)
        agreement = agreement.model_copy(update={"generation": generation})
    except ValueError as exc:
        agreement = agreement.model_copy(update={"error": str(exc)})
    return known, agreement


def _level_requests(
    level: int,
    reference: Reference,
    items: Sequence[ProbeItem],
    pairs: Mapping[str, ReferencePrompt],
    *,
    with_ref: bool,
    forced: bool,
    forced_ids: set[str],
    send_items: frozenset[str] | None,
    send_prompts: frozenset[str] | None,
) -> tuple[
    list[ProbeItem], dict[str, ReferencePrompt], list[ReferencePrompt], list[ReferencePrompt]
]:
    """What one level sends: (known-answer items, those of them sent as a shared request
    with their reference prompt, the reference prompts no shared request covers, the
    teacher-forced prompts). ``items`` is empty at a level without known answers;
    ``send_*`` (a single-stream plan) limit what is sent, None = everything."""
    shared = {
        item_id: prompt
        for item_id, prompt in (pairs.items() if with_ref else ())
        if send_prompts is None or prompt.id in send_prompts
    }
    sent_items = [item for item in items if send_items is None or item.id in send_items]
    sent_ids = {item.id for item in sent_items}
    covered = {p.id for item_id, p in shared.items() if item_id in sent_ids}
    own_prompts = [
        p
        for p in reference.prompts
        if with_ref and p.id not in covered and (send_prompts is None or p.id in send_prompts)
    ]
    forced_prompts = [
        p
        for p in reference.prompts
        if with_ref and forced and p.id in forced_ids and p.forced is not None
    ]
    return sent_items, shared, own_prompts, forced_prompts


async def run_levels(
    client: httpx.AsyncClient,
    model: str,
    spec: ProbeSpec,
    reference: Reference,
    items: Sequence[ProbeItem],
    pairs: Mapping[str, ReferencePrompt],
    deadline: float | None,
    *,
    plan: SingleStreamPlan | None,
) -> tuple[list[ProbeAnswer], list[ReferenceAnswer], float]:
    """Both layers' requests, level by level, lowest first.

    At each level at most ``level`` requests are in flight in all: the known-answer items
    (those in ``pairs`` as one shared request), the reference prompts no shared request
    covers, and - at the highest reference level - the teacher-forced requests
    (:func:`forced_prompt_ids`). Forcing is prefill only, so there it costs little next to
    the decodes it is batched with, and it runs where batch-dependent prefill numerics
    show. ``plan`` (:func:`single_stream_plan`) limits what concurrency 1 sends.

    Returns:
        (known-answer answers, reference answers, seconds until each level's known-answer
        requests were all back, summed over levels).
    """
    ref = spec.reference
    known_levels = set(spec.concurrency) if items else set()
    ref_levels = set(ref.concurrency)
    forced_level = max(ref_levels)
    forced_ids = forced_prompt_ids(reference, ref)
    level_items = {} if plan is None else plan.asked_items()
    level_prompts = {} if plan is None else plan.asked_prompts()
    known_answers: list[ProbeAnswer] = []
    ref_answers: list[ReferenceAnswer] = []
    known_s = 0.0
    for level in sorted(known_levels | ref_levels):
        gate = asyncio.Semaphore(level)
        level_start = perf_counter()
        requests = _level_requests(
            level,
            reference,
            items if level in known_levels else (),
            pairs if level in known_levels else {},
            with_ref=level in ref_levels,
            forced=level == forced_level,
            forced_ids=forced_ids,
            send_items=level_items.get(level),
            send_prompts=level_prompts.get(level),
        )
        level_known, level_ref, level_known_s = await _ask_level(
            client, model, spec, reference, level, requests, deadline,
            gate=gate, level_start=level_start,
        )
        known_answers.extend(level_known)
        ref_answers.extend(level_ref)
        known_s += level_known_s
    return known_answers, ref_answers, known_s


async def _ask_level(
    client: httpx.AsyncClient,
    model: str,
    spec: ProbeSpec,
    reference: Reference,
    level: int,
    requests: tuple[
        list[ProbeItem], dict[str, ReferencePrompt], list[ReferencePrompt], list[ReferencePrompt]
    ],
    deadline: float | None,
    *,
    gate: asyncio.Semaphore,
    level_start: float,
) -> tuple[list[ProbeAnswer], list[ReferenceAnswer], float]:
    """One level of :func:`run_levels`: ``requests`` (from :func:`_level_requests`) sent
    through ``gate``.

    Returns:
        (known-answer answers, reference answers, seconds from ``level_start`` until the
        level's known-answer requests were all back; 0.0 when it has none).
    """
    sent_items, shared, own_prompts, forced_prompts = requests
    known_s = 0.0
    async with asyncio.TaskGroup() as group:
        # Longest work first, so the level's tail runs as full a batch as it can: the
        # reference's own prompts (the open ones decode reference.max_tokens tokens),
        # the teacher-forced prefills, then the known answers (a few tokens each).
        # Tasks take the gate in the order they are created.
        ref_tasks = [
            group.create_task(
                ask_reference(client, p, level, "generate", model, spec, gate, deadline)
            )
            for p in own_prompts
        ]
        ref_tasks.extend(
            group.create_task(
                ask_reference(client, p, level, "forced", model, spec, gate, deadline)
            )
            for p in forced_prompts
        )
        shared_tasks = []
        known_tasks = []
        for item in sent_items:
            if item.id in shared:
                task = ask_shared(
                    client, item, shared[item.id], level, model, spec, reference, gate, deadline
                )
                shared_tasks.append(group.create_task(task))
            else:
                known_tasks.append(
                    group.create_task(
                        ask_item(client, item, level, model, spec, gate, deadline)
                    )
                )
        known_side = [*shared_tasks, *known_tasks]
        if known_side:
            await asyncio.wait(known_side)
            known_s = perf_counter() - level_start
    known_answers: list[ProbeAnswer] = []
    ref_answers: list[ReferenceAnswer] = []
    for shared_task in shared_tasks:
        answer, agreement = shared_task.result()
        known_answers.append(answer)
        ref_answers.append(agreement)
    known_answers.extend(t.result() for t in known_tasks)
    ref_answers.extend(t.result() for t in ref_tasks)
    return known_answers, ref_answers, known_s


async def matching_pairs(
    client: httpx.AsyncClient,
    model: str,
    spec: ProbeSpec,
    items: Sequence[ProbeItem],
    reference: Reference,
    deadline: float | None,
) -> dict[str, ReferencePrompt]:
    """The known-answer items that can share one request with their reference prompt: both
    layers run at a common level and the trial's ``/tokenize`` gives the recorded ids."""
    pairs = shared_prompts(spec, items, reference)
    if not pairs or not set(spec.concurrency) & set(spec.reference.concurrency):
        return {}
    wide = asyncio.Semaphore(max(*spec.concurrency, *spec.reference.concurrency))
    async with asyncio.TaskGroup() as group:
        checks = {
            item.id: group.create_task(
                _tokenize_matches(client, item, pairs[item.id], model, spec, wide, deadline)
            )
            for item in items
            if item.id in pairs
        }
    return {i: p for i, p in pairs.items() if checks[i].result()}


async def _known_answers_only(
    base_url: str,
    model: str,
    spec: ProbeSpec,
    note: str | None,
    *,
    deadline_s: float | None,
    headers: Mapping[str, str] | None,
    items: Sequence[ProbeItem] | None,
) -> CorrectnessResult:
    """The probe without its reference layer (``note`` says why): known answers alone,
    all of its time counted as theirs; nothing at all in reference-only mode."""
    if spec.reference_only:
        return combine(ProbeResult.not_judged(), None, reference_note=note, reference_only=True)
    start = perf_counter()
    known = await run_probe(
        base_url, model, spec, deadline_s=deadline_s, headers=headers, items=items
    )
    elapsed = perf_counter() - start
    return combine(
        known,
        None,
        reference_note=note,
        probe_seconds=elapsed,
        known_answers_seconds=elapsed,
    )


async def run_correctness(
    base_url: str,
    model: str,
    spec: ProbeSpec,
    *,
    reference: Reference | None,
    items: Sequence[ProbeItem] | None = None,
    deadline_s: float | None = None,
    headers: Mapping[str, str] | None = None,
) -> CorrectnessResult:
    """The whole correctness probe of one trial: known answers and reference agreement.

    ``reference`` is the study's recorded reference (None: that layer is skipped with a
    note, e.g. before the orchestrator records one). Both layers always run - a trial that
    already failed known answers still gets its agreement scores, because the two
    together say *how* it is broken - and share ``deadline_s``.

    A known-answer question that is also a reference prompt is asked once per level that
    both layers run at (:func:`ask_shared`), provided the trial's ``/tokenize`` gives the
    recorded ids; everything else as :func:`run_levels` describes. Concurrency 1 sends
    only the single-stream subset (:func:`single_stream_plan`) when ``spec.single_stream``
    is ``subset`` and a higher level runs the whole set; both layers are scored with it.

    Returns:
        The combined verdict with ``probe_seconds`` (the probe's cost) and both layers;
        ``known_answers_seconds`` is the time until each level's known-answer requests were
        all back (summed over levels; shared requests count there), ``reference_seconds``
        the rest.
    """
    if not spec.enabled:
        return combine(ProbeResult.disabled(), None, reference_note="probe disabled")
    note: str | None = None
    if not spec.reference.enabled:
        note = "reference agreement disabled"
    elif reference is None:
        note = "no reference recorded for this study"
    if note is not None or reference is None:
        return await _known_answers_only(
            base_url, model, spec, note, deadline_s=deadline_s, headers=headers, items=items
        )
    if spec.reference_only:
        items = ()  # not asked: the known-answer prompts are still sent as reference prompts
    elif items is None:
        items = load_probe_items(spec)
    plan = single_stream_plan(spec, items, reference)
    start = perf_counter()
    deadline = None if deadline_s is None else start + deadline_s
    widest = max(*spec.concurrency, *spec.reference.concurrency)
    async with make_client(base_url, headers, spec, widest) as client:
        pairs = await matching_pairs(client, model, spec, items, reference, deadline)
        known_answers, ref_answers, known_s = await run_levels(
            client, model, spec, reference, items, pairs, deadline, plan=plan
        )
    known = ProbeResult.not_judged() if spec.reference_only else score(
        items,
        known_answers,
        spec,
        probe_seconds=known_s,
        asked=None if plan is None else plan.asked_items(),
    )
    result = score_reference(
        reference,
        ref_answers,
        spec.reference,
        asked=None if plan is None else plan.asked_prompts(),
    )
    return timed_verdict(known, result, spec, perf_counter() - start, known_s)


def timed_verdict(
    known: ProbeResult, result: ReferenceResult, spec: ProbeSpec, total: float, known_s: float
) -> CorrectnessResult:
    """Both layers' verdict with what the probe cost: ``total`` seconds, of which ``known_s``
    until the known answers were back and the rest the reference's."""
    return combine(known, result, probe_seconds=total, known_answers_seconds=known_s,
                   reference_seconds=total - known_s, reference_only=spec.reference_only)
