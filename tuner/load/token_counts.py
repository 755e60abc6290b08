"""Whether a server's token counts can be believed, judged against what the client received.

Every throughput figure counts tokens by the server's ``usage`` (measurement.md §1): the
client has no tokenizer. That makes the server's word the number on the front, so it is
checked, once per finished request, against bounds no honest server can cross:

* a count is a whole number (a JSON integer), never negative;
* ``completion_tokens`` is at most the request's ``max_tokens`` (vLLM never generates more);
* it is at most what the text received can hold: every token decodes to at least one byte
  (at most 4 per character) unless it decodes to nothing, such as a skipped special token
  or the bytes of a character cut off at the end, and those are allowed up to
  :data:`EMPTY_TOKENS_PER_CHUNK` per chunk (a speculative step's chunk carries several
  tokens) plus :data:`SLACK_TOKENS`;
* it is at least the number of chunks that carried text (each carries a token of its own),
  less :data:`SLACK_TOKENS`;
* ``prompt_tokens`` is at most what the prompt's text can hold plus
  :data:`TEMPLATE_TOKENS` for a chat template;
* the per-chunk cumulative counts (``continuous_usage_stats``) never go backwards nor past
  ``max_tokens``.

A request whose counts cross a bound keeps its timings, but its tokens are the client's own
count, one per chunk that carried text (:meth:`RequestRecord.n_output_tokens`), and the
record says why (``usage_rejected``); its level counts it in ``token_mismatch`` and the
trial is infeasible (``token_count_mismatch``). A server that inflated its counts 1000x
put 1,487,000 tok/s on the front before this check; the text it sent was worth ~1,450.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["EMPTY_TOKENS_PER_CHUNK", "SLACK_TOKENS", "TEMPLATE_TOKENS", "CheckedUsage",
           "check_usage"]

EMPTY_TOKENS_PER_CHUNK = 16
"""Tokens without text one chunk may carry: more than a speculative step's k + 1 (k is at
most 8 or so in practice), every one of them a skipped special token in the worst case."""

SLACK_TOKENS = 4
"""Tokenization slack per request: the up to 3 byte tokens of a character cut off by
max_tokens that never decode, and a final chunk that flushes held-back text."""

TEMPLATE_TOKENS = 4096
"""Prompt tokens a chat template may add around the user's message (system prompt, role
markers); the longest built-in templates add a few hundred."""


@dataclass(frozen=True, slots=True)
class CheckedUsage:
    """The counts to record: the server's where believed, else None (the client counts)."""

    prompt_tokens: int | None
    output_tokens: int | None
    cumulative: list[int] | None
    problem: str | None


def _count(value: Any) -> bool:
    # JSON integers only: bool is an int subclass, and 12.0, "12", NaN or 1e300 are no counts.
    return type(value) is int and value >= 0


def _output_problem(claimed: int, max_tokens: int, chars: Sequence[int]) -> str | None:
    text_chunks = sum(1 for c in chars if c > 0)
    most = 4 * sum(chars) + EMPTY_TOKENS_PER_CHUNK * len(chars) + SLACK_TOKENS
    if claimed > max_tokens:
        return (f"usage.completion_tokens {claimed:,} is more than the request's "
                f"max_tokens {max_tokens:,}")
    if claimed > most:
        return (f"usage.completion_tokens {claimed:,} is more than the "
                f"{sum(chars):,} characters in {len(chars):,} chunks received can hold")
    if claimed + SLACK_TOKENS < text_chunks:
        return (f"usage.completion_tokens {claimed:,} is fewer than the {text_chunks:,} "
                "chunks of text received")
    return None


def check_usage(
    *, prompt_tokens: Any, output_tokens: Any, cumulative: Sequence[int], bad_cumulative: Any,
    chars: Sequence[int], max_tokens: int, prompt_chars: int,
) -> CheckedUsage:
    """The counts of one finished request (module docstring for the bounds).

    ``output_tokens`` / ``prompt_tokens``: what the final usage said (None: no usage, which
    is no lie: the client's estimate is used and flagged as one, as before); ``cumulative``:
    the per-chunk cumulative counts that were integers, ``bad_cumulative`` the first that
    was not (None: none); ``chars``: characters of text per content chunk.
    """
    problem: str | None = None
    if bad_cumulative is not None:
        problem = f"per-chunk usage.completion_tokens {bad_cumulative!r} is not a count"
    elif any(b < a for a, b in zip([0, *cumulative], cumulative, strict=False)):
        problem = "per-chunk usage.completion_tokens goes backwards"
    elif cumulative and cumulative[-1] > max_tokens:
        problem = (f"per-chunk usage.completion_tokens {cumulative[-1]:,} is more than the "
                   f"request's max_tokens {max_tokens:,}")
    if problem is None and output_tokens is not None:
        if not _count(output_tokens):
            problem = f"usage.completion_tokens {output_tokens!r} is not a count"
        else:
            problem = _output_problem(output_tokens, max_tokens, chars)
    if problem is None and prompt_tokens is not None:
        if not _count(prompt_tokens):
            problem = f"usage.prompt_tokens {prompt_tokens!r} is not a count"
        elif prompt_tokens > 4 * prompt_chars + TEMPLATE_TOKENS:
            problem = (f"usage.prompt_tokens {prompt_tokens:,} is more than a prompt of "
                       f"{prompt_chars:,} characters can hold")
    if problem is not None:
        return CheckedUsage(None, None, None, problem)
    return CheckedUsage(prompt_tokens, output_tokens, list(cumulative), None)
