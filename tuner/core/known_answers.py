"""Known-answer correctness probe, pure part: the prompt set, answer checking and scoring.

A throughput number means nothing if the server answers nonsense (field notes, trap 1).
This module generates questions with exactly one right answer that a small instruct
model gets right under a correct server, checks the answers, and turns them into a
pass/fail verdict with a reason. The HTTP side lives in ``tuner.adapters.probe_client``.

Families and their checking rules (all comparisons ignore case, surrounding whitespace
and trailing punctuation):

========== ========================================================== =========
family     prompt                                                     check
========== ========================================================== =========
arithmetic ``What is 37 + 48? Answer with the number only.``           number
number_words ``Write this number in digits, with nothing else: four    number
           hundred and twelve``
copy       ``Repeat the following line exactly, with nothing else:\n   line
           <line>``
capital    ``What is the capital of France? Answer with one word.``    sentence
lookup     ``key <k> = <value>`` lines (~300/600/1000 tokens), then     sentence
           ``What is the value of key 17? Answer with one word.``
========== ========================================================== =========

Checks (see :func:`check_answer`):

* ``number``: the first number in the answer equals the expected one ("85." and
  "The answer is 85" pass; "8 5" fails because its first number is 8; "85.5" fails).
* ``word``: the answer's first word(s) equal the expected word(s).
* ``line``: the first non-empty line equals the expected line (surrounding quotes
  allowed); a lead-in line ending in ":" ("Here it is:") may precede it.
* ``sentence``: the expected word appears as a whole word in the first sentence, and that
  sentence contains neither a negation nor a distractor (another capital, another value
  of the lookup table). Instruct models answer "The capital of France is Paris." — which
  must pass — and the guards stop "Paris or Berlin" or "Berlin is not the capital" from
  passing. Lookups use it too: "The value of key 17 is orange." is a right answer.
* ``contains``: the expected text appears anywhere (only for user-supplied prompts).

Each question is asked through the chat template (the question is the user message) and
as a raw completion framed as ``Question: ...\\nAnswer:``; an item is one (question, API)
pair and carries the exact text sent.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections import defaultdict
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from statistics import NormalDist
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError, computed_field

from tuner.core.probe_spec import ALL_FAMILIES, Api, Family, ProbeSpec
from tuner.errors import SpecError

__all__ = [
    "Check",
    "ItemRecord",
    "LevelResult",
    "ProbeAnswer",
    "ProbeFlag",
    "ProbeItem",
    "ProbeResult",
    "PromptsFileError",
    "Tally",
    "accuracy_tolerance",
    "build_items",
    "check_answer",
    "completion_prompt",
    "jsonl_lines",
    "number_to_words",
    "parse_prompts_jsonl",
    "score",
]

Check = Literal["number", "word", "line", "contains", "sentence"]
_CHECKS: tuple[Check, ...] = ("number", "word", "line", "contains", "sentence")

# vLLM reports these for a normally finished request; anything else (abort, None, a
# server-specific value) hints at a server-side problem and is flagged.
_NORMAL_FINISH = frozenset({"stop", "length"})


# --------------------------------------------------------------------------- models


class ProbeItem(BaseModel):
    """One request of the probe: a question asked through one API."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    family: Family | Literal["custom"]
    api: Api
    prompt: str = Field(description="Exact text sent: chat user message or completion prompt.")
    expected: str
    check: Check
    distractors: tuple[str, ...] = ()


class ProbeAnswer(BaseModel):
    """What the server returned for one item at one concurrency level (raw, unjudged)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    item_id: str
    concurrency: int
    text: str | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    latency_s: float | None = None
    error: str | None = Field(default=None, description="Set when no usable answer came back.")


class ItemRecord(BaseModel):
    """A judged answer, as stored with the trial."""

    id: str
    family: str
    api: Api
    concurrency: int
    prompt: str = Field(description="Truncated for storage; the full text is reproducible.")
    expected: str
    answer: str | None
    correct: bool
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    latency_s: float | None
    error: str | None


class Tally(BaseModel):
    correct: int
    total: int

    @computed_field  # type: ignore[prop-decorator]
    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else 0.0


class ProbeFlag(BaseModel):
    """Something suspicious about one answer (empty text, odd finish reason, error)."""

    item_id: str
    concurrency: int
    detail: str


class LevelResult(BaseModel):
    """Verdict for one concurrency level (one full run of the item set)."""

    concurrency: int
    correct: int
    total: int
    accuracy: float
    threshold: float | None = Field(
        description="The accuracy bar; None at a single-stream subset level (not gated there)."
    )
    by_api: dict[str, Tally]
    consistency: float | None = Field(
        description=(
            "Fraction of the items asked at both levels answered identically to the lowest "
            "level; None there."
        )
    )
    passed: bool
    subset: bool = Field(
        default=False, description="Only some items were asked here (ProbeSpec.single_stream)."
    )


class ProbeResult(BaseModel):
    """Outcome of one probe run; JSON-serialisable with ``model_dump(mode="json")``."""

    passed: bool
    reason: str
    accuracy: float
    correct: int
    total: int
    by_family: dict[str, Tally]
    by_api: dict[str, Tally]
    by_concurrency: dict[int, Tally]
    levels: list[LevelResult]
    consistency: float | None = Field(
        description="Pooled fraction of identical answers, higher levels vs the lowest one."
    )
    empty_outputs: list[ProbeFlag]
    unexpected_finish_reasons: list[ProbeFlag]
    errors: list[ProbeFlag]
    records: list[ItemRecord]
    probe_seconds: float | None = None
    skipped: bool = False

    @classmethod
    def disabled(cls) -> ProbeResult:
        """The result recorded when the study turns the probe off."""
        return cls(
            passed=True,
            reason="probe disabled",
            accuracy=0.0,
            correct=0,
            total=0,
            by_family={},
            by_api={},
            by_concurrency={},
            levels=[],
            consistency=None,
            empty_outputs=[],
            unexpected_finish_reasons=[],
            errors=[],
            records=[],
            skipped=True,
        )


# ------------------------------------------------------------------ prompt generation


class _Question(NamedTuple):
    text: str
    expected: str
    check: Check
    distractors: tuple[str, ...] = ()


_CAPITALS: dict[str, str] = {
    "France": "Paris",
    "Germany": "Berlin",
    "Italy": "Rome",
    "Japan": "Tokyo",
    "Spain": "Madrid",
    "China": "Beijing",
    "Russia": "Moscow",
    "Egypt": "Cairo",
    "Canada": "Ottawa",
    "United Kingdom": "London",
    "Greece": "Athens",
    "Portugal": "Lisbon",
}

_COPY_ADJECTIVES = ("silver", "quiet", "purple", "gentle", "frozen", "golden", "narrow", "busy")
_COPY_NOUNS = ("otter", "lantern", "violin", "harbor", "meadow", "rocket", "teapot", "castle")
_COPY_VERBS = ("paints", "carries", "follows", "borrows", "counts", "repairs", "hides", "finds")

# Common single words, so the model only has to copy one short token sequence back.
_LOOKUP_VALUES = (
    "orange", "lemon", "purple", "tiger", "river", "candle", "pencil", "garden",
    "silver", "rocket", "violin", "marble", "cactus", "falcon", "pepper", "harbor",
    "meadow", "copper", "jacket", "walnut", "banana", "castle", "dragon", "forest",
    "island", "jungle", "ladder", "mirror", "needle", "planet",
)  # fmt: skip

_ONES = (
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
    "eighteen", "nineteen",
)  # fmt: skip
_TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")


def number_to_words(n: int, *, use_and: bool = True) -> str:
    """English words for 0 <= n < 1,000,000: 412 -> "four hundred and twelve", 42 -> "forty-two".

    ``use_and`` selects British ("hundred and twelve") or American ("hundred twelve") style;
    the probe uses both so neither phrasing is a blind spot.
    """
    if not 0 <= n < 1_000_000:
        raise ValueError(f"number_to_words supports 0..999999, got {n}")
    if n < 20:
        return _ONES[n]
    if n < 100:
        tens, ones = divmod(n, 10)
        return _TENS[tens] + (f"-{_ONES[ones]}" if ones else "")
    if n < 1000:
        hundreds, rest = divmod(n, 100)
        head = f"{_ONES[hundreds]} hundred"
        if not rest:
            return head
        return f"{head}{' and' if use_and else ''} {number_to_words(rest, use_and=use_and)}"
    thousands, rest = divmod(n, 1000)
    head = f"{number_to_words(thousands, use_and=use_and)} thousand"
    if not rest:
        return head
    joiner = " and " if use_and and rest < 100 else " "
    return f"{head}{joiner}{number_to_words(rest, use_and=use_and)}"


def _arithmetic(rng: random.Random, k: int, spec: ProbeSpec) -> _Question:
    # Cycle the operator so even three arithmetic questions cover +, - and *; numbers stay
    # small because the probe tests the server, not the model's arithmetic.
    op = "+-*"[k % 3]
    if op == "+":
        a, b = rng.randint(10, 49), rng.randint(10, 49)
        value = a + b
    elif op == "-":
        a = rng.randint(20, 99)
        b = rng.randint(2, a - 1)
        value = a - b
    else:
        a, b = rng.randint(2, 9), rng.randint(2, 9)
        value = a * b
    return _Question(f"What is {a} {op} {b}? Answer with the number only.", str(value), "number")


def _number_words(rng: random.Random, k: int, spec: ProbeSpec) -> _Question:
    n = rng.randint(21, 999)
    words = number_to_words(n, use_and=k % 2 == 0)
    return _Question(
        f"Write this number in digits, with nothing else: {words}", str(n), "number"
    )


def _copy(rng: random.Random, k: int, spec: ProbeSpec) -> _Question:
    line = (
        f"the {rng.choice(_COPY_ADJECTIVES)} {rng.choice(_COPY_NOUNS)} "
        f"{rng.choice(_COPY_VERBS)} {number_to_words(rng.randint(2, 12))} "
        f"{rng.choice(_COPY_ADJECTIVES)} {rng.choice(_COPY_NOUNS)}s"
    )
    return _Question(f"Repeat the following line exactly, with nothing else:\n{line}", line, "line")


def _capital(rng: random.Random, k: int, spec: ProbeSpec) -> _Question:
    countries = sorted(_CAPITALS)
    # Walk a seeded permutation so questions do not repeat until every country is used.
    order = random.Random(spec.seed).sample(countries, len(countries))
    country = order[k % len(order)]
    city = _CAPITALS[country]
    others = tuple(c for c in _CAPITALS.values() if c != city)
    return _Question(
        f"What is the capital of {country}? Answer with one word.", city, "sentence", others
    )


# Rough tokens of one "key 123 = orange" line: BPE tokenizers of small models split the
# digits and keep the short words whole. Only a target; the server's usage.prompt_tokens
# records the real length.
_TOKENS_PER_LOOKUP_LINE = 7


def _lookup(rng: random.Random, k: int, spec: ProbeSpec) -> _Question:
    target = spec.lookup_prompt_tokens[k % len(spec.lookup_prompt_tokens)]
    n_lines = max(3, round(target / _TOKENS_PER_LOOKUP_LINE))
    # Fixed-width keys keep every line the same shape (and token count).
    digits = 3 if n_lines <= 900 else 5
    keys = rng.sample(range(10 ** (digits - 1), 10**digits), n_lines)
    values = [rng.choice(_LOOKUP_VALUES) for _ in keys]
    # Never the first or last line: the answer must come from inside the context.
    pick = rng.randrange(1, n_lines - 1)
    expected = values[pick]
    table = "\n".join(f"key {key} = {value}" for key, value in zip(keys, values, strict=True))
    distractors = tuple(sorted(set(values) - {expected}))
    text = f"{table}\nWhat is the value of key {keys[pick]}? Answer with one word."
    return _Question(text, expected, "sentence", distractors)


_GENERATORS = {
    "arithmetic": _arithmetic,
    "number_words": _number_words,
    "copy": _copy,
    "capital": _capital,
    "lookup": _lookup,
}


def completion_prompt(question: str) -> str:
    """Frame a question for ``/v1/completions``, where no chat template tells the model
    that a question has been asked."""
    return f"Question: {question}\nAnswer:"


def build_items(spec: ProbeSpec) -> list[ProbeItem]:
    """The shipped item set for ``spec``: deterministic in (seed, families, items, apis).

    Question slots are dealt round-robin over the chosen families in ``ALL_FAMILIES``
    order; each question becomes one item per API (ids ``q03-capital-chat``...).
    """
    apis = spec.apis
    families = [f for f in ALL_FAMILIES if f in spec.families]
    n_questions = math.ceil(spec.items / len(apis))
    rng = random.Random(spec.seed)
    per_family: dict[str, int] = defaultdict(int)
    items: list[ProbeItem] = []
    for q in range(n_questions):
        family = families[q % len(families)]
        question = _GENERATORS[family](rng, per_family[family], spec)
        per_family[family] += 1
        for api in apis:
            items.append(
                ProbeItem(
                    id=f"q{q:02d}-{family}-{api}",
                    family=family,
                    api=api,
                    prompt=question.text if api == "chat" else completion_prompt(question.text),
                    expected=question.expected,
                    check=question.check,
                    distractors=question.distractors,
                )
            )
    return items


# ------------------------------------------------------------------- answer checking

_NUMBER_RE = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_WORD_RE = re.compile(r"[^\W_]+(?:['’-][^\W_]+)*")
_SENTENCE_END_RE = re.compile(r"(?<=[.!?])\s+|\n")
_NEGATIONS = frozenset({"not", "no", "never", "neither", "nor"})
_STRIP_CHARS = " \t\r\n.,;:!?\"'`“”‘’()[]{}*"


def _words(text: str) -> list[str]:
    return _WORD_RE.findall(text.casefold())


def _contains_run(haystack: list[str], needle: list[str]) -> bool:
    n = len(needle)
    return n > 0 and any(haystack[i : i + n] == needle for i in range(len(haystack) - n + 1))


def _norm(text: str) -> str:
    return " ".join(text.casefold().split()).strip(_STRIP_CHARS)


def _parse_number(text: str) -> Decimal | None:
    try:
        return Decimal(text.replace(",", ""))
    except InvalidOperation:
        return None


def _check_number(expected: str, answer: str) -> bool:
    match = _NUMBER_RE.search(answer)
    want = _parse_number(expected.strip())
    return match is not None and want is not None and _parse_number(match.group()) == want


def _check_line(expected: str, answer: str) -> bool:
    lines = [line for line in answer.splitlines() if line.strip()]
    want = _norm(expected)
    if not lines or not want:
        return False
    candidates = [lines[0]]
    # "Here is the line:" then the line is still an exact copy.
    if len(lines) > 1 and lines[0].rstrip().endswith(":"):
        candidates.append(lines[1])
    return any(_norm(line) == want for line in candidates)


def _check_sentence(expected: str, answer: str, distractors: Iterable[str]) -> bool:
    first = next((s for s in _SENTENCE_END_RE.split(answer.strip()) if s.strip()), "")
    words = _words(first)
    if not _contains_run(words, _words(expected)):
        return False
    if any(w in _NEGATIONS or w.endswith(("n't", "n’t")) for w in words):
        return False
    return not any(_contains_run(words, _words(d)) for d in distractors)


def check_answer(
    check: Check, expected: str, answer: str | None, distractors: Iterable[str] = ()
) -> bool:
    """Judge one answer by the rule named in ``check`` (module docstring has the rules).

    An empty or missing answer is always wrong.
    """
    if answer is None or not answer.strip():
        return False
    if check == "number":
        return _check_number(expected, answer)
    if check == "word":
        want = _words(expected)
        return bool(want) and _words(answer)[: len(want)] == want
    if check == "line":
        return _check_line(expected, answer)
    if check == "sentence":
        return _check_sentence(expected, answer, distractors)
    if check == "contains":
        return bool(_norm(expected)) and _norm(expected) in _norm(answer)
    raise ValueError(f"unknown check {check!r}")


# -------------------------------------------------------------- user-supplied prompts


class PromptsFileError(SpecError):
    """A prompts file has bad lines; ``problems`` lists (line number, field, message).

    A ``SpecError`` because the file is part of the study's input: it must stop the study
    before any server starts, not fail trials one by one.
    """

    def __init__(self, source: str, problems: list[tuple[int, str, str]]) -> None:
        self.source = source
        self.problems = problems
        shown = "\n".join(f"  line {line}: {field}: {msg}" for line, field, msg in problems[:50])
        more = f"\n  ... and {len(problems) - 50} more" if len(problems) > 50 else ""
        super().__init__(f"{source}: {len(problems)} invalid line(s)\n{shown}{more}")


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
    if entry.check == "number" and _parse_number(expected.strip()) is None:
        return [("expected", f"must be a number for check 'number', got {expected!r}")]
    if entry.check in ("word", "sentence") and not _words(expected):
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


# ------------------------------------------------------------------------- scoring


def accuracy_tolerance(n: int, reference: float, confidence: float = 0.95) -> float:
    """How far below the reference accuracy a correct server may score on ``n`` items.

    Rule: one-sided ``confidence`` bound on the difference of two proportions measured on
    ``n`` items each (the reference configuration and the trial run the same probe),

        tolerance = z * sqrt(2 * p * (1 - p) / n),   z = Phi^-1(confidence),

    with the reference proportion Agresti-Coull adjusted, p = (reference*n + z^2/2) /
    (n + z^2), so a perfect reference still leaves room for a near-tie flip: at 95 %,
    n=24 and reference 1.0 the tolerance is about 0.10 (22/24 passes, 21/24 fails); at
    n=200 and reference 0.9 it is about 0.05, close to measurement.md's "baseline - 0.03"
    to vLLM's "expected - 0.08" range.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 0.0 <= reference <= 1.0:
        raise ValueError(f"reference must be in [0, 1], got {reference}")
    if not 0.5 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0.5, 1), got {confidence}")
    z = NormalDist().inv_cdf(confidence)
    p = (reference * n + z * z / 2) / (n + z * z)
    return z * math.sqrt(2 * p * (1 - p) / n)


def _truncate(prompt: str, limit: int = 240) -> str:
    if len(prompt) <= limit:
        return prompt
    # Keep the end too: for lookups the question is the last line.
    return f"{prompt[:150]} …[{len(prompt)} chars]… {prompt[-70:]}"


def _tally(records: Iterable[ItemRecord], key: str) -> dict[str, Tally]:
    counts: dict[str, list[int]] = {}
    for rec in records:
        slot = counts.setdefault(str(getattr(rec, key)), [0, 0])
        slot[0] += rec.correct
        slot[1] += 1
    return {k: Tally(correct=c, total=t) for k, (c, t) in counts.items()}


def _judge(item: ProbeItem, level: int, answer: ProbeAnswer | None) -> ItemRecord:
    if answer is None:
        answer = ProbeAnswer(item_id=item.id, concurrency=level, error="no answer recorded")
    text = None if answer.error else answer.text
    return ItemRecord(
        id=item.id,
        family=item.family,
        api=item.api,
        concurrency=level,
        prompt=_truncate(item.prompt),
        expected=item.expected,
        answer=answer.text,
        correct=check_answer(item.check, item.expected, text, item.distractors),
        finish_reason=answer.finish_reason,
        prompt_tokens=answer.prompt_tokens,
        completion_tokens=answer.completion_tokens,
        latency_s=answer.latency_s,
        error=answer.error,
    )


def score(
    items: Sequence[ProbeItem],
    answers: Iterable[ProbeAnswer],
    spec: ProbeSpec,
    *,
    probe_seconds: float | None = None,
    asked: Mapping[int, Collection[str]] | None = None,
) -> ProbeResult:
    """Judge every (item, concurrency level) pair and apply the pass rule of ``ProbeSpec``.

    A missing answer or an error counts as wrong. Levels are ``spec.concurrency``; the
    lowest one is the consistency baseline.

    ``asked`` maps a level to the ids of the only items asked there (a single-stream
    subset, :func:`tuner.core.reference.single_stream_plan`); a level not in it asked every
    item. A subset level's accuracy is recorded, not gated (see :class:`ProbeSpec`), and
    consistency is judged over the items asked at both levels.

    Raises:
        ValueError: on duplicate or unknown answers, or an empty item set (caller bugs).
    """
    if not items:
        raise ValueError("no probe items to score")
    by_id = {item.id: item for item in items}
    if len(by_id) != len(items):
        raise ValueError("probe item ids must be unique")
    subsets = {level: set(ids) for level, ids in (asked or {}).items()}
    for level, ids in subsets.items():
        if level not in spec.concurrency or not ids or not ids <= by_id.keys():
            raise ValueError(f"bad item subset at concurrency {level}: {sorted(ids)[:5]}")
    got: dict[tuple[str, int], ProbeAnswer] = {}
    for ans in answers:
        if ans.item_id not in by_id:
            raise ValueError(f"answer for unknown item {ans.item_id!r}")
        if ans.concurrency not in spec.concurrency:
            raise ValueError(f"answer at unexpected concurrency {ans.concurrency}")
        if ans.concurrency in subsets and ans.item_id not in subsets[ans.concurrency]:
            raise ValueError(f"answer for {ans.item_id!r}, not asked at {ans.concurrency}")
        if (ans.item_id, ans.concurrency) in got:
            raise ValueError(f"two answers for {ans.item_id!r} at concurrency {ans.concurrency}")
        got[(ans.item_id, ans.concurrency)] = ans

    records = [
        _judge(item, level, got.get((item.id, level)))
        for level in spec.concurrency
        for item in items
        if level not in subsets or item.id in subsets[level]
    ]
    baseline = spec.concurrency[0]
    base_text = {
        r.id: r.answer for r in records if r.concurrency == baseline and r.error is None
    }
    base_ids = {r.id for r in records if r.concurrency == baseline}
    failures: list[str] = []
    levels: list[LevelResult] = []
    same_total = pairs_total = 0
    for level in spec.concurrency:
        recs = [r for r in records if r.concurrency == level]
        correct = sum(r.correct for r in recs)
        accuracy = correct / len(recs)
        subset = level in subsets and len(subsets[level]) < len(items)
        threshold: float | None
        if subset:
            threshold = None
            rule = ""
        elif spec.reference_accuracy is None:
            threshold = spec.min_accuracy
            rule = ""
        else:
            tol = accuracy_tolerance(len(recs), spec.reference_accuracy, spec.confidence)
            threshold = max(0.0, spec.reference_accuracy - tol)
            rule = (
                f" (reference {spec.reference_accuracy:.2f} - tolerance {tol:.2f},"
                f" n={len(recs)})"
            )
        by_api = _tally(recs, "api")
        # Small epsilon: accuracy and threshold are both ratios of small integers.
        ok = threshold is None or accuracy >= threshold - 1e-9
        if not ok:
            apis = ", ".join(f"{api} {t.accuracy:.2f}" for api, t in by_api.items())
            failures.append(
                f"accuracy {accuracy:.2f} < {threshold:.2f}{rule} at concurrency {level} ({apis})"
            )
        consistency = None
        if level != baseline:
            pairs = [r for r in recs if r.id in base_ids]
            same = sum(
                r.error is None and r.id in base_text and base_text[r.id] == r.answer
                for r in pairs
            )
            changed = len(pairs) - same
            consistency = same / len(pairs) if pairs else None
            same_total += same
            pairs_total += len(pairs)
            # As many changed answers as min_consistency tolerates over this level's items
            # (same/n >= c <=> changed <= (1-c)n); with a single-stream subset as baseline
            # the pairs are fewer, so never all of them either.
            tolerated = math.floor((1.0 - spec.min_consistency) * len(recs) + 1e-9)
            if len(pairs) < len(recs):
                tolerated = min(tolerated, len(pairs) - 1)
            if pairs and spec.min_consistency > 0 and changed > tolerated:
                ok = False
                if len(pairs) == len(recs):
                    failures.append(
                        f"consistency {same / len(pairs):.2f} < {spec.min_consistency:.2f} at "
                        f"concurrency {level} vs {baseline} (greedy answers changed with "
                        "batch size)"
                    )
                else:
                    failures.append(
                        f"{changed} of the {len(pairs)} single-stream items answered "
                        f"differently at concurrency {level} than at {baseline} (at most "
                        f"{tolerated} tolerated; greedy answers changed with batch size)"
                    )
        levels.append(
            LevelResult(
                concurrency=level,
                correct=correct,
                total=len(recs),
                accuracy=accuracy,
                threshold=threshold,
                by_api=by_api,
                consistency=consistency,
                passed=ok,
                subset=subset,
            )
        )

    errors = [
        ProbeFlag(item_id=r.id, concurrency=r.concurrency, detail=r.error)
        for r in records
        if r.error is not None
    ]
    empty = [
        ProbeFlag(item_id=r.id, concurrency=r.concurrency, detail="empty output")
        for r in records
        if r.error is None and not (r.answer or "").strip()
    ]
    odd_finish = [
        ProbeFlag(
            item_id=r.id, concurrency=r.concurrency, detail=f"finish_reason={r.finish_reason!r}"
        )
        for r in records
        if r.error is None and r.finish_reason not in _NORMAL_FINISH
    ]
    if failures and errors:
        failures.append(f"{len(errors)} request error(s), e.g. {errors[0].detail}")
    if failures and empty:
        failures.append(f"{len(empty)} empty output(s)")

    correct_all = sum(r.correct for r in records)
    return ProbeResult(
        passed=not failures,
        reason="; ".join(failures) if failures else "ok",
        accuracy=correct_all / len(records),
        correct=correct_all,
        total=len(records),
        by_family=_tally(records, "family"),
        by_api=_tally(records, "api"),
        by_concurrency={int(k): v for k, v in _tally(records, "concurrency").items()},
        levels=levels,
        consistency=same_total / pairs_total if pairs_total else None,
        empty_outputs=empty,
        unexpected_finish_reasons=odd_finish,
        errors=errors,
        records=records,
        probe_seconds=probe_seconds,
    )
