"""When a server's token counts are believed (tuner.load.token_counts), pure: honest streams of
every shape pass, and each kind of lie is named."""

from __future__ import annotations

from typing import Any

import pytest

from tuner.load.token_counts import EMPTY_TOKENS_PER_CHUNK, SLACK_TOKENS, check_usage


def checked(output: Any, chars: list[int], *, max_tokens: int = 64, prompt: Any = 20,
            cumulative: list[int] | None = None, bad: Any = None, prompt_chars: int = 80):
    return check_usage(prompt_tokens=prompt, output_tokens=output, cumulative=cumulative or [],
                       bad_cumulative=bad, chars=chars, max_tokens=max_tokens,
                       prompt_chars=prompt_chars)


@pytest.mark.parametrize("output, chars, max_tokens", [
    (12, [4] * 12, 12),                       # one token a chunk, ignore_eos at max_tokens
    (9, [0, 5, 11, 4, 6], 64),                # chat role chunk, then speculative chunks
    (6, [4, 0, 0, 4], 6),                     # tokens that decode to nothing (special, cut bytes)
    (3, [0, 0, 0], 3),                        # nothing but special tokens
    (0, [], 8),                               # nothing generated
    (None, [4, 4], 8),                        # no usage at all: estimated, not a lie
])
def test_honest_counts_are_believed(output: Any, chars: list[int], max_tokens: int) -> None:
    got = checked(output, chars, max_tokens=max_tokens)
    assert got.problem is None and got.output_tokens == output and got.prompt_tokens == 20


def test_a_speculative_step_of_empty_tokens_in_every_chunk_is_still_believed() -> None:
    # The most a chunk without text may carry: a k=15 step of skipped special tokens.
    chars = [0] * 4
    most = EMPTY_TOKENS_PER_CHUNK * len(chars) + SLACK_TOKENS
    assert checked(most, chars, max_tokens=1000).problem is None
    assert "characters in 4 chunks" in checked(most + 1, chars, max_tokens=1000).problem


@pytest.mark.parametrize("output, words", [
    (12_000, "more than the request's max_tokens 12"),      # 1000x inflated
    (-3, "-3 is not a count"),
    ("12", "'12' is not a count"),
    (float("nan"), "nan is not a count"),
    (1e300, "1e+300 is not a count"),
    (True, "True is not a count"),
    (12.0, "12.0 is not a count"),
    (2, "fewer than the 12 chunks of text"),
])
def test_each_lie_is_named_and_no_server_count_is_kept(output: Any, words: str) -> None:
    got = checked(output, [4] * 12, max_tokens=12)
    assert got.problem is not None and words in got.problem
    assert got.output_tokens is None and got.prompt_tokens is None and got.cumulative is None


def test_more_tokens_than_the_text_received_can_hold() -> None:
    # 40 characters in 10 chunks hold at most 4 * 40 + 16 * 10 + 4 = 324 tokens.
    assert checked(324, [4] * 10, max_tokens=4096).problem is None
    problem = checked(325, [4] * 10, max_tokens=4096).problem
    assert problem == ("usage.completion_tokens 325 is more than the 40 characters in 10 "
                       "chunks received can hold")


@pytest.mark.parametrize("prompt, words", [
    (-1, "usage.prompt_tokens -1 is not a count"),
    ("20", "usage.prompt_tokens '20' is not a count"),
    (10_000_000, "more than a prompt of 80 characters can hold"),
])
def test_prompt_counts_are_checked_too(prompt: Any, words: str) -> None:
    got = checked(12, [4] * 12, max_tokens=12, prompt=prompt)
    assert got.problem is not None and words in got.problem and got.output_tokens is None


def test_per_chunk_counts_must_be_counts_that_never_go_back_nor_past_max_tokens() -> None:
    ok = checked(3, [4] * 3, cumulative=[1, 2, 3], max_tokens=3)
    assert ok.problem is None and ok.cumulative == [1, 2, 3]
    assert "'2' is not a count" in checked(3, [4] * 3, cumulative=[1], bad="2").problem
    assert "goes backwards" in checked(3, [4] * 3, cumulative=[1, 3, 2]).problem
    assert "3,000 is more than the request's max_tokens 3" in checked(
        None, [4] * 3, cumulative=[1000, 2000, 3000], max_tokens=3).problem
