"""The probe's request helpers (I/O) that :mod:`tuner.probe.trial` builds a trial's probe
from - one reference prompt, the known-answer items that may share a request with their
reference prompt, the verdict with its timings - and the probe without a reference layer.

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

from tuner.probe.client import run_probe
from tuner.probe.http import post_json, request_timeout
from tuner.probe.items import ProbeItem
from tuner.probe.known_score import ProbeResult
from tuner.probe.record import Reference, ReferencePrompt
from tuner.probe.reference_score import ReferenceAnswer, ReferenceResult
from tuner.probe.selection import item_source, shared_prompts
from tuner.probe.spec import ProbeSpec
from tuner.probe.verdict import CorrectnessResult, combine
from tuner.probe.wire import forced_request, generation_request, parse_forced, parse_generation, tokenize_request

__all__ = ["ask_reference", "matching_pairs", "run_correctness", "timed_verdict"]


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
    """A trial's probe without its reference layer: known answers alone, with a note saying
    why (the layer is off, or ``reference`` is None: none recorded for this study). A trial
    with a recorded reference runs :func:`tuner.probe.trial.run_trial_probe`'s seeded plan.

    Returns:
        The verdict with ``probe_seconds``, all of it counted as the known answers'.
    """
    if not spec.enabled:
        return combine(ProbeResult.disabled(), None, reference_note="probe disabled")
    if not spec.reference.enabled:
        note = "reference agreement disabled"
    elif reference is None:
        note = "no reference recorded for this study"
    else:
        raise ValueError("run_correctness asks known answers alone; with a reference use run_trial_probe")
    return await _known_answers_only(
        base_url, model, spec, note, deadline_s=deadline_s, headers=headers, items=items
    )


def timed_verdict(
    known: ProbeResult, result: ReferenceResult, spec: ProbeSpec, total: float, known_s: float
) -> CorrectnessResult:
    """Both layers' verdict with what the probe cost: ``total`` seconds, of which ``known_s``
    until the known answers were back and the rest the reference's."""
    return combine(known, result, probe_seconds=total, known_answers_seconds=known_s,
                   reference_seconds=total - known_s, reference_only=spec.reference_only)
