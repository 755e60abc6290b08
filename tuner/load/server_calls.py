"""The auxiliary (non-streamed) server calls of a sweep, through httpx: ``/tokenize`` to
fit prompts to exact token counts, ``/metrics`` scraped around each measured level (the
client and the capped read are tuner.adapters.http_client's)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import httpx

from tuner.adapters.http_client import ReplyTooLarge, capped_request
from tuner.load.dataset import TraceRequest
from tuner.load.load_spec import Api, WorkloadSpec
from tuner.load.prometheus import MetricsSnapshot, parse_prometheus_text
from tuner.load.protocol import server_root
from tuner.load.request import AUX_TIMEOUT_S
from tuner.load.trace_prompts import CANDIDATE_WORDS, TraceText, one_token_words
from tuner.load.workload import (
    LengthModel,
    RequestDraft,
    RequestPlan,
    TokenFitter,
    draft_requests,
)

__all__ = ["calibrate_lengths", "calibrate_trace_text", "fetch_token_count", "fit_plan", "scrape_metrics"]

# /tokenize calls in flight at once while the words of a trace are calibrated.
_TOKENIZE_PARALLEL = 16

logger = logging.getLogger(__name__)

async def fetch_token_count(
    client: httpx.AsyncClient, base_url: str, model: str, text: str, *, chat: bool = False
) -> int | None:
    """Token count of ``text`` by the server's ``/tokenize``; None if unavailable.

    With ``chat`` the text is sent as one user message with the generation prompt, so the
    chat template's tokens are counted as the chat endpoint will see them.
    """
    body: dict[str, Any] = {"model": model}
    if chat:
        body["messages"] = [{"role": "user", "content": text}]
        body["add_generation_prompt"] = True
    else:
        body["prompt"] = text
    try:
        resp = await capped_request(client, "POST", server_root(base_url) + "/tokenize",
                                    json=body, timeout=AUX_TIMEOUT_S)
        if resp.status_code != 200:
            return None
        data = resp.json()
    except (httpx.HTTPError, ValueError) as exc:
        logger.debug("/tokenize failed: %s", exc)
        return None
    if not isinstance(data, dict):
        return None
    count = data.get("count")
    if isinstance(count, int):
        return count
    tokens = data.get("tokens")
    return len(tokens) if isinstance(tokens, list) else None


async def calibrate_trace_text(
    client: httpx.AsyncClient, base_url: str, model: str, *, api: Api, block_tokens: int, seed: int,
) -> tuple[TraceText, str | None]:
    """The words a trace's prompts are made of, as this server's tokenizer counts them
    (tuner.load.trace_prompts), and a note when the lengths cannot be exact."""

    chat = api == "chat"
    overhead = await fetch_token_count(client, base_url, model, "", chat=chat)
    if overhead is None:
        return (TraceText(CANDIDATE_WORDS, block_tokens=block_tokens, overhead=0, seed=seed),
                "/tokenize unavailable: trace prompt lengths are estimates (one token a word)")
    gate = asyncio.Semaphore(_TOKENIZE_PARALLEL)

    async def count(word: str) -> int | None:
        async with gate:
            return await fetch_token_count(client, base_url, model, " " + word, chat=chat)

    counts = await asyncio.gather(*(count(w) for w in CANDIDATE_WORDS))
    words = one_token_words(counts, overhead)
    if len(words) < TraceText.MIN_WORDS:
        return (TraceText(CANDIDATE_WORDS, block_tokens=block_tokens, overhead=overhead, seed=seed),
                f"only {len(words)} of {len(CANDIDATE_WORDS)} words are one token for this tokenizer: "
                "trace prompt lengths are estimates")
    text = TraceText(words, block_tokens=block_tokens, overhead=overhead, seed=seed)
    # Additive over words is what makes the lengths exact: checked on a few prompts.
    worst = 0
    for n, length in enumerate((block_tokens + 3, 2 * block_tokens + 1, 3 * block_tokens - 5)):
        ids = tuple(range(n * 3, n * 3 + -(-length // block_tokens)))
        sample = TraceRequest(0.0, length, 1, ids)
        got = await fetch_token_count(client, base_url, model, text.prompt(sample), chat=chat)
        if got is not None:
            worst = max(worst, abs(got - length))
    note = None if worst == 0 else (
        f"trace prompt lengths may differ from the trace's by up to {worst} tokens (this tokenizer "
        "merges some words)")
    return text, note


async def fit_plan(
    client: httpx.AsyncClient,
    base_url: str,
    model: str,
    drafts: Sequence[RequestDraft],
    *,
    ignore_eos: bool,
    api: Api = "completions",
    parallel: int = 8,
) -> list[RequestPlan] | None:
    """Trim every draft to its exact target length with ``/tokenize``.

    Returns None as soon as the endpoint fails, so the caller can fall back to estimates
    for the whole level rather than mixing exact and estimated prompts.
    """
    sem = asyncio.Semaphore(parallel)
    chat = api == "chat"

    async def fit_one(d: RequestDraft) -> RequestPlan | None:
        fitter = TokenFitter(d.draft, d.target_prompt_tokens)
        while (n := fitter.next_probe()) is not None:
            async with sem:
                text = d.draft.render(n)
                count = await fetch_token_count(client, base_url, model, text, chat=chat)
            if count is None:
                return None
            fitter.observe(n, count)
        return d.to_plan(ignore_eos=ignore_eos, prompt=d.draft.render(fitter.result()))

    plans = await asyncio.gather(*(fit_one(d) for d in drafts))
    if any(p is None for p in plans):
        return None
    return [p for p in plans if p is not None]


async def scrape_metrics(client: httpx.AsyncClient, base_url: str) -> MetricsSnapshot | None:
    """Parsed ``/metrics``, or None when the server has no usable metrics endpoint."""
    try:
        resp = await capped_request(client, "GET", server_root(base_url) + "/metrics",
                                    timeout=AUX_TIMEOUT_S)
    except (httpx.HTTPError, ReplyTooLarge) as exc:
        logger.warning("/metrics unreachable: %s", exc)
        return None
    if resp.status_code != 200:
        return None
    try:
        return parse_prometheus_text(resp.text)
    except ValueError as exc:
        logger.warning("/metrics unparsable: %s", exc)
        return None


# Drafts per workload class measured to calibrate prompt lengths, each at two lengths: 16
# /tokenize calls a class, once per sweep.
CALIBRATION_DRAFTS = 8


async def calibrate_lengths(
    client: httpx.AsyncClient, base_url: str, model: str, workload: WorkloadSpec, *,
    seed: int, api: Api = "completions",
) -> LengthModel | None:
    """Prompt tokens as this server counts them, per workload class (:class:`LengthModel`);
    None as soon as ``/tokenize`` fails. The drafts come from their own seed stream, so the
    calibration is the same for every trial of a study served with the same tokenizer."""
    chat = api == "chat"
    by_class: dict[str, tuple[float, float]] = {}
    for wc in workload.classes:
        one = workload.model_copy(update={"classes": (wc,)})
        points: list[tuple[float, int]] = []
        for d in draft_requests(one, CALIBRATION_DRAFTS, seed=seed, stream=f"calibrate-{wc.name}"):
            full = d.draft.units_for_estimate(d.target_prompt_tokens)
            for n in sorted({full, full // 2}):
                count = await fetch_token_count(
                    client, base_url, model, d.draft.render(n), chat=chat)
                if count is None:
                    return None
                points.append((d.draft.estimate_tokens(n), count))
        by_class[wc.name] = LengthModel.fit(points)
    return LengthModel(by_class)
