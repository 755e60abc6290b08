"""Dataset files as a workload source (issue 33): every format the study file may name, its
detection, and bad input as one clear error naming the line, the field and what is wrong."""

from __future__ import annotations

import json

import pytest

from tuner.load.dataset import (
    FORMATS,
    DatasetError,
    Message,
    dataset_digest,
    detect_format,
    parse_dataset,
)


def jsonl(*entries: object) -> str:
    return "".join(json.dumps(e) + "\n" for e in entries)


PROMPTS = jsonl({"prompt": "  Say hi.\n", "output_tokens": 12}, {"prompt": "Count to 3."})
SHAREGPT = [
    {"id": "a", "conversations": [
        {"from": "system", "value": "Be brief."},
        {"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello!"},
        {"from": "human", "value": "And again?"}, {"from": "gpt", "value": "Hello again."}]},
    {"id": "b", "conversations": [{"from": "human", "value": "One turn"}]},
]
CHAT = jsonl({"messages": [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"},
                           {"role": "user", "content": "Q2"}]},
             {"messages": [{"role": "user", "content": "only"}], "output_tokens": 7})
MOONCAKE = jsonl(
    {"timestamp": 0, "input_length": 6755, "output_length": 500, "hash_ids": list(range(14))},
    {"timestamp": 0, "input_length": 7319, "output_length": 490, "hash_ids": [0, *range(14, 28)]},
    {"timestamp": 3052, "input_length": 2287, "output_length": 316, "hash_ids": [0, 42, 43, 44, 45]},
)


def test_the_format_names_are_the_contract() -> None:
    assert FORMATS == ("prompts", "sharegpt", "openai-chat", "mooncake", "auto")


def test_prompts_keep_their_text_verbatim_and_output_tokens_when_given() -> None:
    data = parse_dataset(PROMPTS, "prompts", source="p.jsonl")
    assert data.format == "prompts" and not data.detected and not data.timed
    assert [c.prompt for c in data.conversations] == ["  Say hi.\n", "Count to 3."]
    assert [c.output_tokens for c in data.conversations] == [12, None]
    assert [c.user_turns for c in data.conversations] == [1, 1]


@pytest.mark.parametrize("layout", ["array", "jsonl"])
def test_sharegpt_as_a_json_array_or_jsonl_maps_speakers_to_roles(layout: str) -> None:
    text = json.dumps(SHAREGPT, indent=2) if layout == "array" else jsonl(*SHAREGPT)
    data = parse_dataset(text, "sharegpt", source="s.json")
    first = data.conversations[0]
    assert first.messages[:3] == (Message("system", "Be brief."), Message("user", "Hi"),
                                  Message("assistant", "Hello!"))
    assert [c.user_turns for c in data.conversations] == [2, 1]


def test_openai_chat_is_multi_turn_when_it_holds_several_user_turns() -> None:
    data = parse_dataset(CHAT, "openai-chat", source="c.jsonl")
    assert [c.user_turns for c in data.conversations] == [2, 1]
    assert [c.output_tokens for c in data.conversations] == [None, 7]


def test_mooncake_reads_timestamps_lengths_and_shared_prefix_blocks() -> None:
    data = parse_dataset(MOONCAKE, "mooncake", source="m.jsonl")
    assert data.timed and len(data) == 3
    assert [r.timestamp_ms for r in data.trace] == [0, 0, 3052]
    assert data.trace[1].hash_ids[0] == data.trace[0].hash_ids[0] == 0
    # a block size of its own: 2287 tokens are 9 blocks of 256
    small = jsonl({"timestamp": 1, "input_length": 2287, "output_length": 3, "hash_ids": list(range(9))})
    assert parse_dataset(small, "mooncake", source="m", block_tokens=256).trace[0].input_length == 2287


@pytest.mark.parametrize(("text", "fmt"), [
    (PROMPTS, "prompts"), (json.dumps(SHAREGPT), "sharegpt"), (jsonl(*SHAREGPT), "sharegpt"),
    (CHAT, "openai-chat"), (MOONCAKE, "mooncake")])
def test_auto_detects_each_format_and_says_it_detected(text: str, fmt: str) -> None:
    assert detect_format(text) == fmt
    detected, named = parse_dataset(text, "auto", source="x"), parse_dataset(text, fmt, source="x")
    assert detected.format == fmt and detected.detected and not named.detected
    assert (detected.conversations, detected.trace) == (named.conversations, named.trace)


def _error(text: str, fmt: str, **kw: int) -> str:
    with pytest.raises(DatasetError) as info:
        parse_dataset(text, fmt, source="d.jsonl", **kw)
    message = str(info.value)
    assert "Traceback" not in message
    return message


@pytest.mark.parametrize(("text", "fmt", "want"), [
    ("", "prompts", "d.jsonl: no entries: the dataset is empty (format prompts)"),
    ("\n\n", "openai-chat", "no entries"),
    ('{"prompt": "a"}\n{"prompt": "b",\n', "prompts", "d.jsonl: line 2: not JSON ("),
    ('{"prompt": ""}\n', "prompts", "line 1: prompt: empty"),
    ('{"prompt": 3}\n', "prompts", "line 1: prompt: int, not a string"),
    ('{"text": "x"}\n', "prompts", "line 1: prompt: missing"),
    ('{"prompt": "a", "output_tokens": 0}\n', "prompts", "line 1: output_tokens: 0 is not a positive integer"),
    ('{"prompt": "a", "output_tokens": true}\n', "prompts", "output_tokens: True is not a positive integer"),
    ('["a"]\n', "prompts", "line 1: expected a JSON object, got list"),
    ('{"conversations": [{"from": "bot", "value": "x"}]}\n', "sharegpt",
     "line 1: conversations[0].from: 'bot' is not one of human, gpt, system"),
    ('{"conversations": [{"from": "gpt", "value": "x"}]}\n', "sharegpt",
     "first turn after any system message must be the user's"),
    ('{"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}\n', "openai-chat",
     "two user turns in a row"),
    ('{"messages": [{"role": "user", "content": [{"type": "text"}]}]}\n', "openai-chat",
     "messages[0].content: list, not a string (text content only)"),
    ('{"messages": [{"role": "tool", "content": "x"}]}\n', "openai-chat",
     "messages[0].role: 'tool' is not one of system, user, assistant"),
    ('{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1]}\n', "mooncake",
     "line 1: hash_ids: 1 block(s) for input_length 600 at 512 tokens a block (expected 2;"),
    ('{"timestamp": -1, "input_length": 6, "output_length": 5, "hash_ids": [1]}\n', "mooncake",
     "timestamp: -1 is not a time in milliseconds"),
    ('{"timestamp": 0, "output_length": 5, "hash_ids": [1]}\n', "mooncake",
     "line 1: input_length: missing (a positive integer)"),
    ('{"timestamp": 9, "input_length": 6, "output_length": 5, "hash_ids": [1]}\n'
     '{"timestamp": 8, "input_length": 6, "output_length": 5, "hash_ids": [1]}\n', "mooncake",
     "line 2: timestamp: 8 is earlier than the line before (9); a trace is in time order"),
    ('{"q": 1}\n', "auto", "auto could not tell the format"),
    ('{"prompt": "a"}\n', "csv", "format: 'csv' is not one of prompts, sharegpt, openai-chat, mooncake, auto"),
    ('[{"conversations": []}', "sharegpt", "not JSON"),
    ('{"conversations": 1}', "sharegpt", "line 1: conversations: missing or not a non-empty list"),
])
def test_bad_input_is_one_line_naming_where_and_what(text: str, fmt: str, want: str) -> None:
    message = _error(text, fmt)
    assert want in message
    assert "\n" not in message


def test_every_bad_line_is_listed_at_once_up_to_a_cap() -> None:
    message = _error("".join('{"prompt": ""}\n' for _ in range(25)), "prompts")
    assert message.startswith("d.jsonl: 25 problems\n  line 1: prompt: empty")
    assert "line 20: prompt: empty" in message and "line 21:" not in message
    assert message.endswith("... and 5 more")


def test_the_digest_changes_with_any_byte() -> None:
    assert dataset_digest(b"a") == dataset_digest(b"a") != dataset_digest(b"a ")
    assert dataset_digest(b"").startswith("sha256:")
