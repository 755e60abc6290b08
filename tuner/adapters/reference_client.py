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

from tuner.adapters.probe_client import load_probe_items, run_probe
from tuner.core.known_answers import ProbeItem, ProbeResult
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
    combine,
    forced_request,
    generation_request,
    parse_forced,
    parse_generation,
    parse_reference_prompts_jsonl,
    reference_sources,
    score_reference,
    tokenize_request,
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

    Greedy requests run once per level of ``spec.reference.concurrency`` (at most ``level``
    in flight); the teacher-forced requests of the prompts the reference forced run once,
    one at a time, with the lowest level (the conditions they were recorded under).

    Raises:
        asyncio.CancelledError: when cancelled; in-flight requests are cancelled too.
    """
    ref = spec.reference
    start = perf_counter()
    deadline = None if deadline_s is None else start + deadline_s
    answers: list[ReferenceAnswer] = []
    async with _client(base_url, headers, spec, max(ref.concurrency)) as client:
        for n, level in enumerate(ref.concurrency):
            gate = asyncio.Semaphore(level)
            async with asyncio.TaskGroup() as group:
                tasks = [
                    group.create_task(
                        _ask(client, p, level, "generate", model, spec, gate, deadline)
                    )
                    for p in reference.prompts
                ]
            answers.extend(t.result() for t in tasks)
            if n == 0 and ref.teacher_forced:
                one = asyncio.Semaphore(1)
                for p in reference.prompts:
                    if p.forced is not None:
                        answers.append(
                            await _ask(client, p, level, "forced", model, spec, one, deadline)
                        )
    return score_reference(reference, answers, ref)


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
    """The whole correctness probe of one trial: known answers, then reference agreement.

    ``reference`` is the study's recorded reference (None: that layer is skipped with a
    note, e.g. before the orchestrator records one). Both layers always run - a trial that
    already failed known answers still gets its agreement scores, because the two
    together say *how* it is broken - and share ``deadline_s``.

    Returns:
        The combined verdict with ``probe_seconds`` (the probe's cost) and both layers.
    """
    if not spec.enabled:
        return combine(ProbeResult.disabled(), None, reference_note="probe disabled")
    start = perf_counter()
    known = await run_probe(
        base_url, model, spec, deadline_s=deadline_s, headers=headers, items=items
    )
    known_s = perf_counter() - start
    result: ReferenceResult | None = None
    note: str | None = None
    ref_s: float | None = None
    if not spec.reference.enabled:
        note = "reference agreement disabled"
    elif reference is None:
        note = "no reference recorded for this study"
    else:
        remaining = None if deadline_s is None else max(0.0, deadline_s - known_s)
        began = perf_counter()
        result = await check_reference(
            base_url, model, spec, reference, deadline_s=remaining, headers=headers
        )
        ref_s = perf_counter() - began
    return combine(
        known,
        result,
        reference_note=note,
        probe_seconds=perf_counter() - start,
        known_answers_seconds=known_s,
        reference_seconds=ref_s,
    )

