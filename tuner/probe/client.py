"""Known-answer correctness probe, I/O part: send the items to a running server, collect
the answers, and hand them to the pure scorer in ``tuner.probe.known_score``.

Server misbehaviour (HTTP errors, timeouts, malformed JSON, refused connections) is
recorded per request and counted as a wrong answer: a broken server is exactly what the
probe is for, so it must never crash the trial. Only cancellation propagates.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path
from time import perf_counter
from typing import Any

import httpx

from tuner.probe.bank import build_pool
from tuner.probe.http import make_client, post_json, request_timeout
from tuner.probe.items import ProbeItem
from tuner.probe.known_score import ProbeAnswer, ProbeResult, score
from tuner.probe.prompts_file import PromptsFileError, parse_prompts_jsonl
from tuner.probe.sample import known_sample
from tuner.probe.spec import ProbeSpec
from tuner.probe.wire import apply_stop, parse_response, request_for

__all__ = ["answer_in", "ask_item", "load_probe_items", "run_probe"]


def load_probe_items(spec: ProbeSpec, *, base_dir: Path | None = None) -> list[ProbeItem]:
    """The items a probe run sends: the user's ``prompts_file``, else the item bank's pool.

    Call it when the study is loaded, so a bad prompts file stops the study before any
    server starts. A relative ``prompts_file`` is resolved against ``base_dir`` (the
    study file's folder) when given.

    Raises:
        PromptsFileError: the file cannot be read or has invalid lines (all listed).
    """
    if spec.prompts_file is None:
        return build_pool(
            spec.seed, spec.bank.families, spec.bank.per_stratum, max_prompt_tokens=spec.bank.max_prompt_tokens
        )
    path = Path(spec.prompts_file)
    if base_dir is not None and not path.is_absolute():
        path = base_dir / path
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PromptsFileError(str(path), [(0, "-", f"cannot read: {exc}")]) from exc
    return parse_prompts_jsonl(text, spec.apis, source=str(path))


async def ask_item(
    client: httpx.AsyncClient,
    item: ProbeItem,
    level: int,
    model: str,
    spec: ProbeSpec,
    gate: asyncio.Semaphore,
    deadline: float | None,
) -> ProbeAnswer:
    async with gate:
        timeout = request_timeout(spec, deadline)
        if timeout is None:
            return ProbeAnswer(item_id=item.id, concurrency=level, error="not sent: probe deadline reached")
        path, body = request_for(item, model, spec.max_tokens)
        start = perf_counter()
        try:
            payload = await post_json(client, path, body, timeout)
        except ValueError as exc:
            return ProbeAnswer(item_id=item.id, concurrency=level, latency_s=perf_counter() - start, error=str(exc))
        return answer_in(item, level, payload, perf_counter() - start)


def answer_in(
    item: ProbeItem,
    level: int,
    payload: Any,
    latency: float,
    *,
    as_ids: bool = False,
    counts: tuple[int | None, int | None] | None = None,
) -> ProbeAnswer:
    """The answer record of one item read from its reply ``payload``; a body it cannot read
    is the answer's error. ``as_ids``: the item was sent as its reference prompt's token ids
    (the reply is a completion; the item's stop strings are applied here); ``counts``:
    (prompt, completion) tokens known better than the reply's usage."""
    try:
        if as_ids:
            text, finish, prompt_tokens, completion_tokens = parse_response(
                item.model_copy(update={"api": "completions"}), payload
            )
            text, finish = apply_stop(item, text, finish)
        else:
            text, finish, prompt_tokens, completion_tokens = parse_response(item, payload)
    except ValueError as exc:
        return ProbeAnswer(
            item_id=item.id, concurrency=level, latency_s=latency, error=f"bad response body: {exc}"
        )
    if counts is not None:
        prompt_tokens, completion_tokens = counts
    return ProbeAnswer(
        item_id=item.id,
        concurrency=level,
        text=text,
        finish_reason=finish,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        latency_s=latency,
    )


async def run_probe(
    base_url: str,
    model: str,
    spec: ProbeSpec,
    *,
    deadline_s: float | None = None,
    headers: Mapping[str, str] | None = None,
    items: Sequence[ProbeItem] | None = None,
) -> ProbeResult:
    """Run the probe against ``base_url`` (the server root, without ``/v1``).

    The item set runs once per level in ``spec.concurrency`` (lowest first, so it is the
    consistency baseline), at most ``level`` requests in flight, non-streaming.

    Args:
        base_url: e.g. ``http://127.0.0.1:8000``.
        model: the served model name sent in each request.
        spec: the study's probe section.
        deadline_s: time budget for the whole probe, counted from this call. Each
            request's timeout is capped by what is left; items not started in time are
            recorded as errors ("not sent"), so the call returns about on time.
        headers: extra request headers (e.g. an API key).
        items: a pre-loaded item set (from :func:`load_probe_items`); default: load now.

    Returns:
        The scored result with ``probe_seconds`` set; ``ProbeResult.disabled()`` when
        ``spec.enabled`` is false.

    Raises:
        PromptsFileError: only when ``items`` is None and the prompts file is bad.
        asyncio.CancelledError: when cancelled; in-flight requests are cancelled too.
    """
    if not spec.enabled:
        return ProbeResult.disabled()
    if items is None:
        items = load_probe_items(spec)
    if spec.prompts_file is None:
        # Without a reference there is nothing to compare tokens with, so only the known
        # answers run: one item of every stratum, not the whole pool.
        items = known_sample(items, spec.seed)
    start = perf_counter()
    deadline = None if deadline_s is None else start + deadline_s
    widest = max(spec.concurrency)
    answers: list[ProbeAnswer] = []
    async with make_client(base_url, headers, spec, widest) as client:
        for level in spec.concurrency:
            gate = asyncio.Semaphore(level)
            async with asyncio.TaskGroup() as group:
                tasks = [
                    group.create_task(ask_item(client, item, level, model, spec, gate, deadline))
                    for item in items
                ]
            answers.extend(task.result() for task in tasks)
    return score(items, answers, spec, probe_seconds=perf_counter() - start)
