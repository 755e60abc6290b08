"""Reference agreement, I/O part: record the study's reference from a conservative server,
check a trial's server against it, and run both probe layers as one correctness probe.

The pure rules (request bodies, parsing, comparison, verdicts) are in
``tuner.core.reference``. As in ``probe_client``, misbehaviour of a *trial* server (HTTP
errors, timeouts, malformed bodies) is recorded per request and judged as disagreement,
never raised: a broken server is what the probe is for. Misbehaviour of the *reference*
server while recording raises :class:`ReferenceRecordError`, because nothing can be
judged against a reference that could not be recorded.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from time import perf_counter
from typing import Any

import httpx

from tuner.adapters.probe_client import (
    answer_of,
    apply_stop,
    ask_item,
    load_probe_items,
    parse_response,
    run_probe,
)
from tuner.core.known_answers import ProbeAnswer, ProbeItem, ProbeResult, score
from tuner.core.probe_spec import ProbeSpec
from tuner.core.reference import (
    CorrectnessResult,
    ForcedStep,
    Reference,
    ReferenceAnswer,
    ReferencePrompt,
    ReferencePromptsError,
    ReferenceResult,
    ReferenceSource,
    SingleStreamPlan,
    combine,
    forced_prompt_ids,
    forced_request,
    generation_request,
    parse_forced,
    parse_generation,
    parse_reference_prompts_jsonl,
    reference_sources,
    score_reference,
    shared_prompts,
    single_stream_plan,
    tokenize_request,
    truncate_generation,
)
from tuner.errors import StudyError

__all__ = [
    "ReferenceRecordError",
    "check_reference",
    "load_reference_sources",
    "record_reference",
    "run_correctness",
]


class ReferenceRecordError(StudyError):
    """The reference server could not be tokenized against or recorded; stops the study."""


def load_reference_sources(
    spec: ProbeSpec,
    *,
    items: Sequence[ProbeItem] | None = None,
    base_dir: Path | None = None,
) -> list[ReferenceSource]:
    """The reference prompt set of ``spec`` (known-answer questions, open prompts, and the
    optional ``reference.prompts_file`` resolved against ``base_dir``).

    Call it when the study is loaded, like ``load_probe_items``, so a bad file stops the
    study before any server starts.

    Raises:
        ReferencePromptsError: the prompts file cannot be read or has invalid lines.
        PromptsFileError: ``items`` is None and the known-answer prompts file is bad.
    """
    if items is None:
        items = load_probe_items(spec, base_dir=base_dir)
    custom: list[ReferenceSource] = []
    if spec.reference.prompts_file is not None:
        path = Path(spec.reference.prompts_file)
        if base_dir is not None and not path.is_absolute():
            path = base_dir / path
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ReferencePromptsError(str(path), [(0, f"cannot read: {exc}")]) from exc
        custom = parse_reference_prompts_jsonl(text, source=str(path))
    return reference_sources(spec, items, custom)


def _client(
    base_url: str, headers: Mapping[str, str] | None, spec: ProbeSpec, width: int
) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=base_url.rstrip("/"),
        headers=dict(headers or {}),
        timeout=spec.request_timeout_s,
        limits=httpx.Limits(max_connections=width, max_keepalive_connections=width),
        # The server is one the tuner started: no proxy from the environment in between.
        trust_env=False,
    )


async def _post(client: httpx.AsyncClient, path: str, body: dict[str, Any], timeout: float) -> Any:
    """POST and return the JSON body; raises ValueError with a readable reason otherwise."""
    try:
        response = await client.post(path, json=body, timeout=timeout)
    except httpx.TimeoutException as exc:
        raise ValueError(f"timeout after {timeout:.1f} s") from exc
    except httpx.HTTPError as exc:
        raise ValueError(f"{type(exc).__name__}: {exc}") from exc
    if response.status_code != 200:
        raise ValueError(f"HTTP {response.status_code}: {response.text[:200]}")
    try:
        return response.json()
    except ValueError as exc:
        raise ValueError(f"bad response body: {exc}") from exc


def _timeout(spec: ProbeSpec, deadline: float | None) -> float | None:
    """The per-request timeout, capped by the time left; None when the time is up."""
    if deadline is None:
        return spec.request_timeout_s
    remaining = deadline - perf_counter()
    return min(spec.request_timeout_s, remaining) if remaining > 0 else None


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
        timeout = _timeout(spec, deadline)
        if timeout is None:
            raise ReferenceRecordError(f"recording the reference ran out of time at {what}")
        try:
            return await _post(client, path, body, timeout)
        except ValueError as exc:
            raise ReferenceRecordError(f"recording the reference failed at {what}: {exc}") from exc

    async with _client(base_url, headers, spec, 1) as client:
        for source in sources:
            tok = await call("/tokenize", tokenize_request(source, model), f"{source.id} /tokenize")
            ids = tok.get("tokens") if isinstance(tok, dict) else None
            if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
                raise ReferenceRecordError(f"/tokenize returned no token ids for {source.id}")
            body = await call(
                "/v1/completions", generation_request(model, ids, ref), f"{source.id} generate"
            )
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
                    raise ReferenceRecordError(
                        f"reference prompt logprobs for {source.id}: {exc}"
                    ) from exc
            prompts.append(
                ReferencePrompt(
                    id=source.id,
                    source=source.source,
                    form="chat" if source.messages is not None else "text",
                    fingerprint=source.fingerprint(),
                    preview=source.preview(),
                    prompt_ids=ids,
                    generation=generation,
                    forced=forced,
                )
            )
    return Reference(
        model=model,
        label=label,
        max_tokens=ref.max_tokens,
        top_k=ref.top_k,
        teacher_forced=ref.teacher_forced,
        forced_max_prompt_tokens=ref.forced_max_prompt_tokens,
        prompts=prompts,
        known_answers_accuracy=None if known_answers is None else known_answers.accuracy,
        recorded_unix=time.time(),
        record_seconds=perf_counter() - start,
    )


async def _ask(
    client: httpx.AsyncClient,
    prompt: ReferencePrompt,
    level: int,
    kind: str,
    model: str,
    spec: ProbeSpec,
    gate: asyncio.Semaphore,
    deadline: float | None,
) -> ReferenceAnswer:
    ref = spec.reference
    async with gate:
        timeout = _timeout(spec, deadline)
        if timeout is None:
            return ReferenceAnswer(
                prompt_id=prompt.id,
                concurrency=level,
                kind=kind,  # type: ignore[arg-type]
                error="not sent: probe deadline reached",
            )
        began = perf_counter()
        try:
            if kind == "generate":
                body = generation_request(model, prompt.prompt_ids, ref)
                payload = await _post(client, "/v1/completions", body, timeout)
                return ReferenceAnswer(
                    prompt_id=prompt.id,
                    concurrency=level,
                    kind="generate",
                    generation=parse_generation(payload),
                    latency_s=perf_counter() - began,
                )
            body = forced_request(model, prompt.prompt_ids, prompt.generation.tokens, ref)
            payload = await _post(client, "/v1/completions", body, timeout)
            steps = parse_forced(
                payload, len(prompt.prompt_ids), prompt.generation.tokens, ref.top_k
            )
            return ReferenceAnswer(
                prompt_id=prompt.id,
                concurrency=level,
                kind="forced",
                forced=steps,
                latency_s=perf_counter() - began,
            )
        except ValueError as exc:
            return ReferenceAnswer(
                prompt_id=prompt.id,
                concurrency=level,
                kind=kind,  # type: ignore[arg-type]
                error=str(exc),
                latency_s=perf_counter() - began,
            )


async def check_reference(
    base_url: str,
    model: str,
    spec: ProbeSpec,
    reference: Reference,
    *,
    deadline_s: float | None = None,
    headers: Mapping[str, str] | None = None,
) -> ReferenceResult:
    """Send the reference's requests to ``base_url`` and score them against ``reference``.

    The same requests, levels and order as the reference layer of :func:`run_correctness`
    (without known answers), except that every level sends the whole prompt set (no
    single-stream subset: this is the reference's self-check, run once per study): the
    greedy requests once per level of ``spec.reference.concurrency``, the teacher-forced
    ones (:func:`forced_prompt_ids`) with the highest level, at most ``level`` in flight.

    Raises:
        asyncio.CancelledError: when cancelled; in-flight requests are cancelled too.
    """
    ref = spec.reference
    deadline = None if deadline_s is None else perf_counter() + deadline_s
    async with _client(base_url, headers, spec, max(ref.concurrency)) as client:
        _, answers, _ = await _run_levels(
            client, model, spec, reference, [], {}, deadline, plan=None
        )
    return score_reference(reference, answers, ref)


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
    if item.api == "chat":
        body: dict[str, Any] = {
            "model": model,
            "messages": [{"role": "user", "content": item.prompt}],
            "add_generation_prompt": True,
        }
    else:
        body = {"model": model, "prompt": item.prompt, "add_special_tokens": True}
    async with gate:
        timeout = _timeout(spec, deadline)
        if timeout is None:
            return False
        try:
            got = await _post(client, "/tokenize", body, timeout)
        except ValueError:
            return False
    return isinstance(got, dict) and got.get("tokens") == prompt.prompt_ids


async def _ask_shared(
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
    async with gate:
        timeout = _timeout(spec, deadline)
        if timeout is None:
            why = "not sent: probe deadline reached"
            return (
                ProbeAnswer(item_id=item.id, concurrency=level, error=why),
                ReferenceAnswer(prompt_id=prompt.id, concurrency=level, kind="generate", error=why),
            )
        body = generation_request(model, prompt.prompt_ids, ref)
        body["max_tokens"] = max(spec.max_tokens, reference.max_tokens)
        began = perf_counter()
        try:
            payload = await _post(client, "/v1/completions", body, timeout)
        except ValueError as exc:
            latency = perf_counter() - began
            return (
                ProbeAnswer(item_id=item.id, concurrency=level, latency_s=latency, error=str(exc)),
                ReferenceAnswer(
                    prompt_id=prompt.id,
                    concurrency=level,
                    kind="generate",
                    error=str(exc),
                    latency_s=latency,
                ),
            )
        latency = perf_counter() - began
    # Each layer reads the body with its own parser, so a server that breaks only the
    # logprobs (or only the text) is reported by the layer it breaks, as with two requests.
    try:
        text, finish, prompt_tokens, completion_tokens = parse_response(
            item.model_copy(update={"api": "completions"}), payload
        )
        text, finish = apply_stop(item, text, finish)
        known = answer_of(item, level, (text, finish, prompt_tokens, completion_tokens), latency)
    except ValueError as exc:
        known = ProbeAnswer(
            item_id=item.id, concurrency=level, latency_s=latency, error=f"bad response body: {exc}"
        )
    try:
        generation = truncate_generation(parse_generation(payload), reference.max_tokens)
        agreement = ReferenceAnswer(
            prompt_id=prompt.id,
            concurrency=level,
            kind="generate",
            generation=generation,
            latency_s=latency,
        )
    except ValueError as exc:
        agreement = ReferenceAnswer(
            prompt_id=prompt.id,
            concurrency=level,
            kind="generate",
            error=str(exc),
            latency_s=latency,
        )
    return known, agreement


async def _run_levels(
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
        with_known = level in known_levels
        with_ref = level in ref_levels
        send_items = level_items.get(level)
        send_prompts = level_prompts.get(level)
        shared = {
            item_id: prompt
            for item_id, prompt in (pairs.items() if with_known and with_ref else ())
            if send_prompts is None or prompt.id in send_prompts
        }
        level_start = perf_counter()
        sent_items = [
            item
            for item in (items if with_known else ())
            if send_items is None or item.id in send_items
        ]
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
            if with_ref and level == forced_level and p.id in forced_ids and p.forced is not None
        ]
        async with asyncio.TaskGroup() as group:
            # Longest work first, so the level's tail runs as full a batch as it can: the
            # reference's own prompts (the open ones decode reference.max_tokens tokens),
            # the teacher-forced prefills, then the known answers (a few tokens each).
            # Tasks take the gate in the order they are created.
            ref_tasks = [
                group.create_task(_ask(client, p, level, "generate", model, spec, gate, deadline))
                for p in own_prompts
            ]
            ref_tasks.extend(
                group.create_task(_ask(client, p, level, "forced", model, spec, gate, deadline))
                for p in forced_prompts
            )
            shared_tasks = []
            known_tasks = []
            for item in sent_items:
                if item.id in shared:
                    task = _ask_shared(
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
                known_s += perf_counter() - level_start
        for shared_task in shared_tasks:
            answer, agreement = shared_task.result()
            known_answers.append(answer)
            ref_answers.append(agreement)
        known_answers.extend(t.result() for t in known_tasks)
        ref_answers.extend(t.result() for t in ref_tasks)
    return known_answers, ref_answers, known_s


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
    both layers run at (:func:`_ask_shared`), provided the trial's ``/tokenize`` gives the
    recorded ids; everything else as :func:`_run_levels` describes. Concurrency 1 sends
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
    if items is None:
        items = load_probe_items(spec)
    plan = single_stream_plan(spec, items, reference)
    start = perf_counter()
    deadline = None if deadline_s is None else start + deadline_s
    widest = max(*spec.concurrency, *spec.reference.concurrency)
    async with _client(base_url, headers, spec, widest) as client:
        pairs = shared_prompts(spec, items, reference)
        if not set(spec.concurrency) & set(spec.reference.concurrency):
            pairs = {}
        if pairs:
            wide = asyncio.Semaphore(widest)
            async with asyncio.TaskGroup() as group:
                checks = {
                    item.id: group.create_task(
                        _tokenize_matches(client, item, pairs[item.id], model, spec, wide, deadline)
                    )
                    for item in items
                    if item.id in pairs
                }
            pairs = {i: p for i, p in pairs.items() if checks[i].result()}
        known_answers, ref_answers, known_s = await _run_levels(
            client, model, spec, reference, items, pairs, deadline, plan=plan
        )
    known = score(
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
    total = perf_counter() - start
    return combine(
        known,
        result,
        probe_seconds=total,
        known_answers_seconds=known_s,
        reference_seconds=total - known_s,
    )
