"""The study's own probe prompts: the JSONL files named by ``probe.prompts_file`` (known
answers) and ``probe.reference.prompts_file`` (extra reference prompts). Pure parsing of
the text; reading the files is done by the clients at study load.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tuner.errors import SpecError
from tuner.probe.checks import answer_words, parse_number
from tuner.probe.items import Check, ProbeItem
from tuner.probe.record import ChatMessage, ReferenceSource
from tuner.probe.spec import Api

__all__ = [
    "PromptsFileError",
    "ReferencePromptsError",
    "jsonl_lines",
    "parse_prompts_jsonl",
    "parse_reference_prompts_jsonl",
]


class _BadLines(SpecError):
    """A file of the study's prompts has bad lines: ``problems`` lists them, each a line
    number and what is wrong there.

    A ``SpecError`` because the file is part of the study's input: it must stop the study
    before any server starts, not fail trials one by one.
    """

    def __init__(self, source: str, problems: Sequence[tuple[Any, ...]]) -> None:
        self.source = source
        self.problems = list(problems)
        shown = "\n".join(f"  line {p[0]}: " + ": ".join(map(str, p[1:])) for p in problems[:50])
        more = f"\n  ... and {len(problems) - 50} more" if len(problems) > 50 else ""
        super().__init__(f"{source}: {len(problems)} invalid line(s)\n{shown}{more}")


class PromptsFileError(_BadLines):
    """A prompts file has bad lines; ``problems`` lists (line number, field, message)."""


class _PromptLine(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    prompt: str = Field(min_length=1)
    expected: str | int | float
    check: Check
    api: Literal["chat", "completions", "both"] | None = None
    id: str | None = Field(default=None, min_length=1)
    distractors: tuple[str, ...] = ()


def _line_problems(entry: _PromptLine) -> list[tuple[str, str]]:
    expected = str(entry.expected)
    if not expected.strip():
        return [("expected", "must not be empty")]
    if entry.check == "number" and parse_number(expected.strip()) is None:
        return [("expected", f"must be a number for check 'number', got {expected!r}")]
    if entry.check in ("word", "sentence") and not answer_words(expected):
        return [("expected", f"must contain a word for check {entry.check!r}")]
    return []


def jsonl_lines(text: str) -> Iterator[tuple[int, Any, str | None]]:
    """(line number, value, problem) for each non-blank line of a JSONL text.

    ``problem`` is None for a line that parsed, else why it is not JSON (``value`` is then
    None). Shared by both prompts-file parsers, so both report bad lines alike.
    """
    for lineno, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            yield lineno, json.loads(raw), None
        except json.JSONDecodeError as exc:
            yield lineno, None, f"not valid JSON: {exc.msg} at column {exc.colno}"


def parse_prompts_jsonl(
    text: str, apis: Sequence[Api], *, source: str = "prompts file"
) -> list[ProbeItem]:
    """Parse a user prompts file: one JSON object a line, blank lines ignored.

    Fields: ``prompt`` (sent verbatim), ``expected``, ``check`` (number|word|line|contains|
    sentence), optional ``api`` (chat|completions|both; default: the spec's ``apis``),
    optional ``id`` (default ``line<N>``), optional ``distractors`` (for ``sentence``).

    Raises:
        PromptsFileError: listing every bad line by number and field, so one edit fixes all.
    """
    problems: list[tuple[int, str, str]] = []
    items: list[ProbeItem] = []
    seen_ids: dict[str, int] = {}
    for lineno, data, bad_json in jsonl_lines(text):
        if bad_json is not None:
            problems.append((lineno, "-", bad_json))
            continue
        if not isinstance(data, dict):
            problems.append((lineno, "-", "must be a JSON object"))
            continue
        try:
            entry = _PromptLine.model_validate(data)
        except ValidationError as exc:
            for err in exc.errors():
                field = ".".join(str(part) for part in err["loc"][:1]) or "-"
                problems.append((lineno, field, err["msg"]))
            continue
        line_problems = _line_problems(entry)
        problems.extend((lineno, field, msg) for field, msg in line_problems)
        base_id = entry.id or f"line{lineno}"
        if base_id in seen_ids:
            problems.append((lineno, "id", f"duplicate of line {seen_ids[base_id]}"))
            continue
        seen_ids[base_id] = lineno
        if line_problems:
            continue
        line_apis: Sequence[Api]
        if entry.api is None:
            line_apis = apis
        elif entry.api == "both":
            line_apis = ("chat", "completions")
        else:
            line_apis = (entry.api,)
        for api in line_apis:
            items.append(
                ProbeItem(
                    id=f"{base_id}-{api}",
                    family="custom",
                    api=api,
                    prompt=entry.prompt,
                    expected=str(entry.expected),
                    check=entry.check,
                    distractors=entry.distractors,
                )
            )
    if not problems and not items:
        problems.append((0, "-", "no prompts in file"))
    if problems:
        raise PromptsFileError(source, problems)
    return items


class ReferencePromptsError(_BadLines):
    """A reference prompts file has bad lines; ``problems`` lists (line, message)."""


class _RefLine(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    id: str | None = Field(default=None, min_length=1)
    prompt: str | None = Field(default=None, min_length=1)
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)


def parse_reference_prompts_jsonl(
    text: str, *, source: str = "reference prompts file"
) -> list[ReferenceSource]:
    """Parse ``reference.prompts_file``: one JSON object a line, blank lines ignored.

    Each line is ``{"prompt": "raw completion text"}`` or ``{"messages": [{"role": "user",
    "content": "..."}]}`` (the server's chat template is applied when the reference is
    tokenized), with an optional unique ``"id"`` (default ``ref-line<N>``). No expected
    answer: the reference configuration's own output is the expectation.

    Raises:
        ReferencePromptsError: listing every bad line, so one edit fixes all.
    """
    problems: list[tuple[int, str]] = []
    out: list[ReferenceSource] = []
    seen: dict[str, int] = {}
    for lineno, data, bad_json in jsonl_lines(text):
        if bad_json is not None:
            problems.append((lineno, bad_json))
            continue
        try:
            line = _RefLine.model_validate(data)
        except ValidationError as exc:
            problems.extend(
                (lineno, f"{'.'.join(str(p) for p in err['loc']) or '-'}: {err['msg']}")
                for err in exc.errors()
            )
            continue
        if (line.prompt is None) == (line.messages is None):
            problems.append((lineno, "needs exactly one of 'prompt' or 'messages'"))
            continue
        ident = line.id or f"ref-line{lineno}"
        if ident in seen:
            problems.append((lineno, f"id {ident!r} duplicates line {seen[ident]}"))
            continue
        seen[ident] = lineno
        out.append(
            ReferenceSource(
                id=ident,
                source="custom",
                prompt=line.prompt,
                messages=None if line.messages is None else tuple(line.messages),
            )
        )
    if not problems and not out:
        problems.append((0, "no prompts in file"))
    if problems:
        raise ReferencePromptsError(source, problems)
    return out
