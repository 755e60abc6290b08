"""Recording the study's reference (I/O): the reference prompt set from the study files, the
reference server's greedy continuations and teacher-forced steps.

Misbehaviour of the *reference* server while recording raises
:class:`ReferenceRecordError`, because nothing can be judged against a reference that could
not be recorded.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from time import perf_counter
from typing import Any

from tuner.errors import StudyError
from tuner.probe.client import load_probe_items
from tuner.probe.http import make_client, post_json, request_timeout
from tuner.probe.items import ProbeItem
from tuner.probe.known_score import ProbeResult
from tuner.probe.prompts_file import ReferencePromptsError, parse_reference_prompts_jsonl
from tuner.probe.record import ForcedStep, Reference, ReferencePrompt, ReferenceSource
from tuner.probe.selection import reference_sources
from tuner.probe.spec import ProbeSpec
from tuner.probe.wire import (
    forced_request,
    generation_request,
    parse_forced,
    parse_generation,
    tokenize_request,
)

__all__ = ["ReferenceRecordError", "load_reference_sources", "record_reference"]


class ReferenceRecordError(StudyError):
    """The reference server could not be tokenized against or recorded; stops the study."""


def load_reference_sources(spec: ProbeSpec, *, items: Sequence[ProbeItem] | None = None) -> list[ReferenceSource]:
    """The reference prompt set of ``spec`` (known-answer questions, open prompts, and the
    optional ``reference.prompts_file``, made absolute at study load by
    ``tuner.engine.referencing.resolve_probe_files``).

    Call it when the study is loaded, like ``load_probe_items``, so a bad file stops the
    study before any server starts.

    Raises:
        ReferencePromptsError: the prompts file cannot be read or has invalid lines.
        PromptsFileError: ``items`` is None and the known-answer prompts file is bad.
    """
    if items is None:
        items = load_probe_items(spec)
    custom: list[ReferenceSource] = []
    if (path := spec.reference.prompts_file) is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ReferencePromptsError(path, [(0, f"cannot read: {exc}")]) from exc
        custom = parse_reference_prompts_jsonl(text, source=path)
    return reference_sources(spec, items, custom)


async def record_reference(
    base_url: str,
    model: str,
    spec: ProbeSpec,
    *,
    sources: Sequence[ReferenceSource] | None = None,
    label: str = "",
    known_answers: ProbeResult | None = None,
    deadline_s: float | None = None,
    headers: Mapping[str, str] | None = None,
) -> Reference:
    """Record the reference from a running server of the study's reference configuration.

    Every prompt is tokenized once through the server's ``/tokenize`` (so the trials send
    the very same ids), continued greedily with top-k logprobs one request at a time
    (concurrency 1: the most conservative batch), then teacher-forced when short enough.

    Args:
        sources: the prompt set (:func:`load_reference_sources`); default: built from spec.
        label: which configuration this is, stored for humans ("eager, no speculation").
        known_answers: the reference server's known-answer result, stored as
            ``known_answers_accuracy``.
        deadline_s: time budget for the whole recording.

    Raises:
        ReferenceRecordError: any request failed or returned an unusable body.
    """
    ref = spec.reference
    if sources is None:
        sources = load_reference_sources(spec)
    start = perf_counter()
    deadline = None if deadline_s is None else start + deadline_s
    prompts: list[ReferencePrompt] = []

    async def call(path: str, body: dict[str, Any], what: str) -> Any:
        timeout = request_timeout(spec, deadline)
        if timeout is None:
            raise ReferenceRecordError(f"recording the reference ran out of time at {what}")
        try:
            return await post_json(client, path, body, timeout)
        except ValueError as exc:
            raise ReferenceRecordError(f"recording the reference failed at {what}: {exc}") from exc

    # The bank's pool is large, so it is recorded batched at the probe's top level -
    # batch-size numerics are near ties, which the numerics rule tolerates, and the
    # self-check then compares batch 1 and N against this record.
    width = max(spec.concurrency)
    gate = asyncio.Semaphore(width)

    async def one(source: ReferenceSource) -> ReferencePrompt:
        async with gate:
            return await _record_one(call, source, model, spec)

    async with make_client(base_url, headers, spec, width) as client:
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(one(source)) for source in sources]
        except* ReferenceRecordError as failed:
            # The first failure is the reason; the group cancelled the rest.
            raise failed.exceptions[0] from None
        prompts = [t.result() for t in tasks]
    return Reference(
        model=model,
        label=label,
        max_tokens=spec.generated_tokens(),
        top_k=ref.top_k,
        teacher_forced=ref.teacher_forced,
        forced_max_prompt_tokens=ref.forced_max_prompt_tokens,
        prompts=prompts,
        known_answers_accuracy=None
        if known_answers is None or known_answers.skipped
        else known_answers.accuracy,
        mode="reference_only" if spec.reference_only else "full",
        recorded_unix=time.time(),
        record_seconds=perf_counter() - start,
    )


async def _record_one(
    call: Callable[[str, dict[str, Any], str], Awaitable[Any]],
    source: ReferenceSource,
    model: str,
    spec: ProbeSpec,
) -> ReferencePrompt:
    """One prompt of the reference: tokenized, continued greedily, then teacher-forced when
    short enough. ``call`` posts a body and raises ReferenceRecordError on failure."""
    ref = spec.reference
    tok = await call("/tokenize", tokenize_request(source, model), f"{source.id} /tokenize")
    ids = tok.get("tokens") if isinstance(tok, dict) else None
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
        raise ReferenceRecordError(f"/tokenize returned no token ids for {source.id}")
    request = generation_request(model, ids, ref)
    request["max_tokens"] = spec.generated_tokens()
    body = await call("/v1/completions", request, f"{source.id} generate")
    try:
        generation = parse_generation(body)
    except ValueError as exc:
        raise ReferenceRecordError(f"reference answer for {source.id}: {exc}") from exc
    forced: list[ForcedStep] | None = None
    if ref.teacher_forced and len(ids) <= ref.forced_max_prompt_tokens:
        fbody = await call(
            "/v1/completions",
            forced_request(model, ids, generation.tokens, ref),
            f"{source.id} teacher-forced",
        )
        try:
            forced = parse_forced(fbody, len(ids), generation.tokens, ref.top_k)
        except ValueError as exc:
            raise ReferenceRecordError(f"reference prompt logprobs for {source.id}: {exc}") from exc
    return ReferencePrompt(
        id=source.id,
        source=source.source,
        form="chat" if source.messages is not None else "text",
        fingerprint=source.fingerprint(),
        preview=source.preview(),
        prompt_ids=ids,
        generation=generation,
        forced=forced,
    )
