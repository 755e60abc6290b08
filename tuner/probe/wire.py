"""The probe's requests and replies on the wire (pure): request bodies for known answers,
``/tokenize``, greedy continuations with logprobs and teacher forcing, and the parsers of
the OpenAI-compatible replies vLLM sends back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from tuner.probe.items import ProbeItem
from tuner.probe.record import ForcedStep, Generation, ReferenceSource
from tuner.probe.spec import ReferenceSpec

__all__ = [
    "apply_stop",
    "forced_request",
    "generation_request",
    "parse_forced",
    "parse_generation",
    "parse_response",
    "request_for",
    "tokenize_request",
]

# The raw-completion framing ("Question: ...\nAnswer:") invites the model to go on with a
# next question; stopping there saves decode time on a slow CPU server without touching
# the answer line itself.
_COMPLETION_STOP = ["\nQuestion:"]


def request_for(item: ProbeItem, model: str, max_tokens: int) -> tuple[str, dict[str, Any]]:
    """Path and JSON body for one item.

    ``temperature: 0`` is sent explicitly: vLLM's default ``--generation-config auto``
    fills any omitted sampling field from the model's generation_config.json, which
    would make the probe non-greedy and its answers unrepeatable (vllm-knobs.md §6).
    """
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": 0,
        "stream": False,
    }
    if item.api == "chat":
        body["messages"] = item.messages()
        return "/v1/chat/completions", body
    body["prompt"] = item.prompt
    body["stop"] = _COMPLETION_STOP
    return "/v1/completions", body


def apply_stop(item: ProbeItem, text: str, finish: str | None) -> tuple[str, str | None]:
    """(text, finish_reason) as the server would have returned them had ``item``'s own
    request (with its stop strings) been sent, for an answer generated without them.

    The shared known-answer/reference request cannot carry the completion stop strings,
    because the reference was recorded without them; cutting the text here gives the
    known-answer check exactly the text the item's own request would have produced.
    """
    if item.api != "completions":
        return text, finish
    cuts = [i for i in (text.find(stop) for stop in _COMPLETION_STOP) if i >= 0]
    if not cuts:
        return text, finish
    return text[: min(cuts)], "stop"


def parse_response(item: ProbeItem, payload: Any) -> tuple[str, str | None, int | None, int | None]:
    """(text, finish_reason, prompt_tokens, completion_tokens) from an OpenAI-style body.

    Raises:
        ValueError: the body does not have the OpenAI shape.
    """
    try:
        choice = payload["choices"][0]
        if item.api == "chat":
            # content may be null (e.g. a refusal or tool call): that is an empty answer.
            text = choice["message"].get("content") or ""
        else:
            text = choice["text"]
        if not isinstance(text, str):
            raise TypeError(f"text is {type(text).__name__}")
        finish = choice.get("finish_reason")
        usage = payload.get("usage") or {}
        prompt_tokens = usage.get("prompt_tokens")
        completion_tokens = usage.get("completion_tokens")
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        raise ValueError(f"malformed response ({type(exc).__name__}: {exc})") from exc
    return (
        text,
        finish if isinstance(finish, str) else None,
        prompt_tokens if isinstance(prompt_tokens, int) else None,
        completion_tokens if isinstance(completion_tokens, int) else None,
    )


def tokenize_request(source: ReferenceSource, model: str) -> dict[str, Any]:
    """Body for vLLM's ``/tokenize``: the chat template for messages, plain text otherwise
    (special tokens added exactly as ``/v1/completions`` would add them to that text)."""
    if source.messages is not None:
        return {
            "model": model,
            "messages": [m.model_dump() for m in source.messages],
            "add_generation_prompt": True,
        }
    return {"model": model, "prompt": source.prompt, "add_special_tokens": True}


def generation_request(model: str, prompt_ids: Sequence[int], ref: ReferenceSpec) -> dict[str, Any]:
    """Greedy continuation with top-k logprobs of a token-ID prompt.

    ``temperature: 0`` explicitly (``--generation-config auto`` would otherwise fill it from
    the model's generation_config.json, vllm-knobs.md §6); ``return_tokens_as_token_ids``
    so tokens and top-k keys are ids ("token_id:123"), not strings that several ids can
    decode to.
    """
    return {
        "model": model,
        "prompt": list(prompt_ids),
        "max_tokens": ref.max_tokens,
        "temperature": 0,
        "seed": 0,
        "logprobs": ref.top_k,
        "return_tokens_as_token_ids": True,
        "stream": False,
    }


def forced_request(
    model: str, prompt_ids: Sequence[int], continuation: Sequence[int], ref: ReferenceSpec
) -> dict[str, Any]:
    """Teacher-forcing: the prompt plus the reference continuation, scored by prefill only
    (``prompt_logprobs``; one throw-away generated token because vLLM needs max_tokens>=1)."""
    return {
        "model": model,
        "prompt": [*prompt_ids, *continuation],
        "max_tokens": 1,
        "temperature": 0,
        "seed": 0,
        "prompt_logprobs": ref.top_k,
        "stream": False,
    }


def _token_id(value: Any) -> int:
    if isinstance(value, str) and value.startswith("token_id:"):
        return int(value.removeprefix("token_id:"))
    raise ValueError(
        f"expected a token id like 'token_id:123', got {value!r} "
        "(server ignores return_tokens_as_token_ids?)"
    )


def _as_float(value: Any) -> float:
    # None is what vLLM sends for a position without logprobs; NaN stays NaN so the scorer
    # can report it as the server fault it is.
    if value is None:
        raise ValueError("missing logprob")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"logprob is {type(value).__name__}, not a number")
    return float(value)


def parse_generation(payload: Any) -> Generation:
    """A :class:`Generation` from a non-streaming ``/v1/completions`` body requested with
    ``logprobs`` and ``return_tokens_as_token_ids``.

    Raises:
        ValueError: the body lacks the OpenAI completion-logprobs shape or token ids.
    """
    try:
        choice = payload["choices"][0]
        lp = choice["logprobs"]
        if lp is None:
            raise ValueError("response has no logprobs")
        tokens = [_token_id(t) for t in lp["tokens"]]
        logprobs = [_as_float(v) for v in lp["token_logprobs"]]
        top_raw = lp["top_logprobs"]
        if top_raw is None or any(entry is None for entry in top_raw):
            raise ValueError("response has no top_logprobs for some position")
        top = [{_token_id(k): _as_float(v) for k, v in entry.items()} for entry in top_raw]
        text = choice.get("text") or ""
        finish = choice.get("finish_reason")
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        raise ValueError(f"malformed completion body ({type(exc).__name__}: {exc})") from exc
    try:
        return Generation(
            tokens=tokens,
            logprobs=logprobs,
            top=top,
            finish_reason=finish if isinstance(finish, str) else None,
            text=text if isinstance(text, str) else "",
        )
    except ValidationError as exc:
        raise ValueError(f"inconsistent logprobs: {exc.errors()[0]['msg']}") from exc


def parse_forced(
    payload: Any, prompt_len: int, continuation: Sequence[int], k: int
) -> list[ForcedStep]:
    """Teacher-forced steps for the ``continuation`` positions of a ``prompt_logprobs=k``
    response whose prompt was ``prompt_len`` ids of prompt followed by ``continuation``.

    vLLM returns one entry per prompt position (the first is null): ``{"<id>": {"logprob",
    "rank", "decoded_token"}}`` holding the top-k (ranks 1..k) and always the actual
    prompt token, whatever its rank. ``top`` keeps the ranks 1..k only, so an actual token
    far down the list is not mistaken for a top candidate.

    Raises:
        ValueError: wrong shape, or the actual token missing from a position.
    """
    try:
        plp = payload["choices"][0]["prompt_logprobs"]
        if not isinstance(plp, list):
            raise ValueError("response has no prompt_logprobs list")
        if len(plp) != prompt_len + len(continuation):
            raise ValueError(
                f"prompt_logprobs has {len(plp)} positions, expected "
                f"{prompt_len + len(continuation)}"
            )
        steps: list[ForcedStep] = []
        for j, token in enumerate(continuation):
            entry = plp[prompt_len + j]
            if not isinstance(entry, dict):
                raise ValueError(f"no prompt logprobs at continuation position {j}")
            actual: float | None = None
            top: dict[int, float] = {}
            for key, info in entry.items():
                tid = int(key)
                value = _as_float(info["logprob"])
                if tid == token:
                    actual = value
                rank = info.get("rank")
                if isinstance(rank, int) and 1 <= rank <= k:
                    top[tid] = value
            if actual is None:
                raise ValueError(f"actual token {token} missing at continuation position {j}")
            if not top:
                raise ValueError(f"no ranked top-{k} entries at continuation position {j}")
            steps.append(ForcedStep(token=token, logprob=actual, top=top))
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        raise ValueError(f"malformed prompt_logprobs body ({type(exc).__name__}: {exc})") from exc
    return steps
