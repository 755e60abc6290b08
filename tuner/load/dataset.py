"""A user's own traffic as a dataset file: the formats a study file may name and their parsing.

The format names are a contract (issue 33): scripts outside the project write study files with
them, so they are spelled as the tools users already have spell them.

- ``prompts``: JSONL ``{"prompt": str, "output_tokens": int}`` (``output_tokens`` optional),
  the shape ``vllm bench serve --dataset-name custom`` reads;
- ``sharegpt``: a JSON array or JSONL of ``{"conversations": [{"from": ..., "value": ...}]}``;
- ``openai-chat``: JSONL ``{"messages": [{"role": ..., "content": ...}]}``;
- ``mooncake``: JSONL ``{"timestamp": ms, "input_length": n, "output_length": n,
  "hash_ids": [...]}``, the published Mooncake trace, one hash id per block of the prompt;
- ``auto``: told apart by the keys of the first entry.

Pure: the caller reads the file and passes its text. Text is kept verbatim (never stripped or
rewritten): what the user serves is what the server is sent. Every problem is collected with its
line (or array position) and field, and raised at once as a :class:`DatasetError`, so a
malformed file stops the study at ``tuner validate``, before any server starts.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from tuner.errors import SpecError

__all__ = [
    "FORMATS",
    "MOONCAKE_BLOCK_TOKENS",
    "Conversation",
    "Dataset",
    "DatasetError",
    "DatasetFormat",
    "Message",
    "TraceRequest",
    "dataset_digest",
    "detect_format",
    "parse_dataset",
]

DatasetFormat = Literal["prompts", "sharegpt", "openai-chat", "mooncake", "auto"]
FORMATS: tuple[str, ...] = get_args(DatasetFormat)
# Mooncake's published traces hash the prompt in blocks of 512 tokens.
MOONCAKE_BLOCK_TOKENS = 512
# A file with more problems than this is not worth listing line by line.
_SHOWN_PROBLEMS = 20

Role = Literal["system", "user", "assistant"]
_SHAREGPT_ROLES: dict[str, Role] = {"human": "user", "gpt": "assistant", "system": "system"}
_CHAT_ROLES: tuple[Role, ...] = ("system", "user", "assistant")


class DatasetError(SpecError):
    """A dataset file that cannot be measured; ``problems`` lists (where, field, message).

    ``where`` is ``line N`` for JSONL and ``entry N`` for a JSON array (both 1-based).
    """

    def __init__(self, source: str, problems: list[tuple[str, str, str]]) -> None:
        self.source = source
        self.problems = problems
        if len(problems) == 1:
            where, field, msg = problems[0]
            text = f"{source}: {_place(where, field)}{msg}"
        else:
            shown = "\n".join(f"  {_place(w, f)}{m}" for w, f, m in problems[:_SHOWN_PROBLEMS])
            more = (f"\n  ... and {len(problems) - _SHOWN_PROBLEMS} more"
                    if len(problems) > _SHOWN_PROBLEMS else "")
            text = f"{source}: {len(problems)} problems\n{shown}{more}"
        super().__init__(text)


def _place(where: str, field: str) -> str:
    return "".join(f"{part}: " for part in (where, field) if part)


@dataclass(frozen=True, slots=True)
class Message:
    role: Role
    content: str


@dataclass(frozen=True, slots=True)
class Conversation:
    """One request (``prompt`` set, completions-style) or one chat of one or more user turns.

    ``output_tokens`` is the reply length the dataset asks for, None for the workload's
    default. For chats, the dataset's own assistant turns stay in ``messages``: whether a
    later turn carries them or the server's reply is the load generator's choice.
    """

    prompt: str | None
    messages: tuple[Message, ...]
    output_tokens: int | None

    @property
    def user_turns(self) -> int:
        if self.prompt is not None:
            return 1
        return sum(1 for m in self.messages if m.role == "user")


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a timed trace known only by lengths and prefix-block hashes."""

    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Dataset:
    format: str              # the format the entries were read as (never "auto")
    detected: bool           # the format was detected, not named: the output says so
    conversations: tuple[Conversation, ...]
    trace: tuple[TraceRequest, ...]

    def __len__(self) -> int:
        return len(self.conversations) + len(self.trace)

    @property
    def timed(self) -> bool:
        return bool(self.trace)


def dataset_digest(data: bytes) -> str:
    """The digest pinned with the study: a resume over a changed file is refused."""

    return "sha256:" + hashlib.sha256(data).hexdigest()


def detect_format(text: str) -> str | None:
    """The format the first entry's keys say, or None when they say none of them."""

    if text.lstrip().startswith("["):
        try:
            values = json.loads(text)
        except json.JSONDecodeError:
            return None
        return _format_of(values[0]) if isinstance(values, list) and values else None
    for _, entry in _entries(text, limit=1):
        return _format_of(entry)
    return None


def _format_of(entry: Any) -> str | None:
    if isinstance(entry, Mapping):
            if "conversations" in entry:
                return "sharegpt"
            if "messages" in entry:
                return "openai-chat"
            if "hash_ids" in entry or "input_length" in entry:
                return "mooncake"
            if "prompt" in entry:
                return "prompts"
    return None


def parse_dataset(text: str, fmt: str, *, source: str,
                  block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> Dataset:
    """Every entry of ``text`` read as ``fmt``; a :class:`DatasetError` lists every problem."""

    if fmt not in FORMATS:
        raise DatasetError(source, [("", "format", f"{fmt!r} is not one of {', '.join(FORMATS)}")])
    detected = fmt == "auto"
    # A JSON array (sharegpt's published layout) is decoded once, for detection and entries.
    array = _json_array(text, source) if fmt in ("auto", "sharegpt") and text.lstrip().startswith("[") else None
    if detected:
        found = detect_format(text) if array is None else _format_of(array[0]) if array else None
        if found is None and not text.strip():
            raise DatasetError(source, [("", "", "no entries: the dataset is empty")])
        if found is None:
            raise DatasetError(source, [(
                "", "format",
                "auto could not tell the format from the first entry's keys (prompts: 'prompt'; "
                "sharegpt: 'conversations'; openai-chat: 'messages'; mooncake: 'hash_ids'); "
                "name it in load.workload.dataset.format")])
        fmt = found
    if fmt == "sharegpt" and array is not None:
        entries: Iterator[tuple[str, Any]] = ((f"entry {i}", value) for i, value in enumerate(array, start=1))
    else:
        entries = _entries(text)
    problems: list[tuple[str, str, str]] = []
    conversations: list[Conversation] = []
    trace: list[TraceRequest] = []
    previous_ms: float | None = None
    for where, entry in entries:
        if isinstance(entry, _BadJson):
            problems.append((where, "", f"not JSON ({entry.message})"))
            continue
        if not isinstance(entry, Mapping):
            problems.append((where, "", f"expected a JSON object, got {type(entry).__name__}"))
            continue
        if fmt == "mooncake":
            request = _mooncake(entry, where, block_tokens, problems)
            if request is not None:
                if previous_ms is not None and request.timestamp_ms < previous_ms:
                    problems.append((where, "timestamp", f"{_num(request.timestamp_ms)} is earlier than "
                                     f"the line before ({_num(previous_ms)}); a trace is in time order"))
                previous_ms = request.timestamp_ms
                trace.append(request)
            continue
        reader = {"prompts": _prompt, "sharegpt": _sharegpt, "openai-chat": _openai_chat}[fmt]
        conversation = reader(entry, where, problems)
        if conversation is not None:
            conversations.append(conversation)
    if not problems and not conversations and not trace:
        problems.append(("", "", f"no entries: the dataset is empty (format {fmt})"))
    if problems:
        raise DatasetError(source, problems)
    return Dataset(format=fmt, detected=detected, conversations=tuple(conversations), trace=tuple(trace))


# --- entries -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _BadJson:
    message: str


def _entries(text: str, limit: int | None = None) -> Iterator[tuple[str, Any]]:
    """(``line N``, decoded value) for every non-blank JSONL line."""

    seen = 0
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value: Any = json.loads(line)
        except json.JSONDecodeError as exc:
            value = _BadJson(exc.msg + f" at column {exc.colno}")
        yield f"line {number}", value
        seen += 1
        if limit is not None and seen >= limit:
            return


def _json_array(text: str, source: str) -> list[Any]:
    try:
        values = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DatasetError(source, [(f"line {exc.lineno}", "", f"not JSON ({exc.msg})")]) from None
    if not isinstance(values, list):
        raise DatasetError(source, [("", "", "a JSON file must hold an array of conversations")])
    return values


# --- formats -------------------------------------------------------------------------------


def _output_tokens(entry: Mapping[str, Any], field: str, where: str,
                   problems: list[tuple[str, str, str]], *, required: bool) -> int | None:
    if field not in entry or (entry[field] is None and not required):
        if required:
            problems.append((where, field, "missing (a positive integer)"))
        return None
    value = entry[field]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        problems.append((where, field, f"{value!r} is not a positive integer"))
        return None
    return value


def _text(entry: Mapping[str, Any], field: str, where: str, problems: list[tuple[str, str, str]]) -> str | None:
    value = entry.get(field)
    if not isinstance(value, str):
        got = "missing" if field not in entry else f"{type(value).__name__}, not a string"
        problems.append((where, field, got))
        return None
    if not value.strip():
        problems.append((where, field, "empty"))
        return None
    return value


def _prompt(entry: Mapping[str, Any], where: str, problems: list[tuple[str, str, str]]) -> Conversation | None:
    before = len(problems)
    prompt = _text(entry, "prompt", where, problems)
    tokens = _output_tokens(entry, "output_tokens", where, problems, required=False)
    if len(problems) > before or prompt is None:
        return None
    return Conversation(prompt=prompt, messages=(), output_tokens=tokens)


def _messages(entry: Mapping[str, Any], where: str, problems: list[tuple[str, str, str]], *, key: str,
              speaker: str, text: str, roles: Mapping[str, Role], hint: str = "") -> list[Message] | None:
    """The turns under ``key``, each an object naming its ``speaker`` (one of ``roles``) and
    its ``text``; None after the first problem, which is recorded."""

    turns = entry.get(key)
    if not isinstance(turns, list) or not turns:
        problems.append((where, key, "missing or not a non-empty list"))
        return None
    messages: list[Message] = []
    for index, turn in enumerate(turns):
        field = f"{key}[{index}]"
        if not isinstance(turn, Mapping):
            problems.append((where, field, f"not an object with '{speaker}' and '{text}'"))
            return None
        who = turn.get(speaker)
        if not isinstance(who, str) or who not in roles:
            problems.append((where, f"{field}.{speaker}", f"{who!r} is not one of {', '.join(roles)}"))
            return None
        content = _text(turn, text, where, problems)
        if content is None:
            problems[-1] = (where, f"{field}.{text}", problems[-1][2] + hint)
            return None
        messages.append(Message(roles[who], content))
    return messages


def _sharegpt(entry: Mapping[str, Any], where: str, problems: list[tuple[str, str, str]]) -> Conversation | None:
    messages = _messages(entry, where, problems, key="conversations", speaker="from", text="value",
                         roles=_SHAREGPT_ROLES)
    return None if messages is None else _chat(messages, where, "conversations", problems)


def _openai_chat(entry: Mapping[str, Any], where: str,
                 problems: list[tuple[str, str, str]]) -> Conversation | None:
    messages = _messages(entry, where, problems, key="messages", speaker="role", text="content",
                         roles={r: r for r in _CHAT_ROLES}, hint=" (text content only)")
    if messages is None:
        return None
    tokens = _output_tokens(entry, "output_tokens", where, problems, required=False)
    chat = _chat(messages, where, "messages", problems)
    return None if chat is None else Conversation(prompt=None, messages=chat.messages, output_tokens=tokens)


def _chat(messages: list[Message], where: str, field: str,
          problems: list[tuple[str, str, str]]) -> Conversation | None:
    """A conversation the server can be sent turn by turn: system messages only first, then
    user and assistant turns alternating from a user turn."""

    body = [m for m in messages if m.role != "system"]
    leading_system = len(messages) - len(body)
    if any(m.role == "system" for m in messages[leading_system:]):
        problems.append((where, field, "a system message after the first user turn"))
        return None
    if not body or body[0].role != "user":
        problems.append((where, field, "the first turn after any system message must be the user's"))
        return None
    for index in range(1, len(body)):
        if body[index].role == body[index - 1].role:
            problems.append((where, field, f"two {body[index].role} turns in a row "
                             f"(turns {index} and {index + 1} after the system messages)"))
            return None
    return Conversation(prompt=None, messages=tuple(messages), output_tokens=None)


def _mooncake(entry: Mapping[str, Any], where: str, block_tokens: int,
              problems: list[tuple[str, str, str]]) -> TraceRequest | None:
    before = len(problems)
    stamp = entry.get("timestamp")
    if isinstance(stamp, bool) or not isinstance(stamp, (int, float)) or not math.isfinite(stamp) or stamp < 0:
        problems.append((where, "timestamp", f"{stamp!r} is not a time in milliseconds (a number >= 0)"))
    input_length = _output_tokens(entry, "input_length", where, problems, required=True)
    output_length = _output_tokens(entry, "output_length", where, problems, required=True)
    hashes = entry.get("hash_ids")
    if not isinstance(hashes, list) or not hashes or not all(
            isinstance(h, int) and not isinstance(h, bool) for h in hashes):
        problems.append((where, "hash_ids", "missing or not a non-empty list of integers"))
    elif input_length is not None and math.ceil(input_length / block_tokens) != len(hashes):
        problems.append((where, "hash_ids", (
            f"{len(hashes)} block(s) for input_length {input_length} at {block_tokens} tokens a block "
            f"(expected {math.ceil(input_length / block_tokens)}; load.workload.dataset.block_tokens "
            "sets the block size)")))
    if len(problems) > before or input_length is None or output_length is None:
        return None
    assert isinstance(hashes, list) and isinstance(stamp, (int, float))
    return TraceRequest(float(stamp), input_length, output_length, tuple(hashes))


def _num(value: float) -> str:
    return f"{value:g}"
