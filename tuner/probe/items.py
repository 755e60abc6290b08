"""The known-answer item set: questions with exactly one right answer, and the item model.

A throughput number means nothing if the server answers nonsense (field notes, trap 1).
This module generates questions that a small instruct model gets right under a correct
server; :mod:`tuner.probe.checks` judges the answers and :mod:`tuner.probe.known_score`
turns them into a verdict. Pure: no I/O.

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

Each question is asked through the chat template (the question is the user message) and
as a raw completion framed as ``Question: ...\nAnswer:``; an item is one (question, API)
pair and carries the exact text sent.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from tuner.probe.spec import ALL_FAMILIES, Api, ProbeSpec

__all__ = ["Check", "ProbeItem", "build_items", "completion_prompt", "number_to_words"]

Check = Literal["number", "word", "line", "contains", "sentence", "mentions"]


class ProbeItem(BaseModel):
    """One request of the probe: a question asked through one API."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    family: str = Field(description="A template family, a bank family, or 'custom'.")
    api: Api
    prompt: str = Field(description="Exact text sent: chat user message or completion prompt.")
    expected: str
    check: Check
    distractors: tuple[str, ...] = ()
    history: tuple[tuple[str, str], ...] = Field(
        default=(),
        description="Earlier (role, content) chat turns before ``prompt`` (multi-turn items).",
    )
    stratum: str | None = Field(
        default=None,
        description="The bank stratum (family/wording or retrieval/length) the trial sampler "
        "draws one item of per trial; None for template and custom items.",
    )

    def messages(self) -> list[dict[str, str]]:
        """The chat messages of a chat item: the earlier turns, then the question."""
        turns = [{"role": role, "content": text} for role, text in self.history]
        return [*turns, {"role": "user", "content": self.prompt}]


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
    return _Question(f"Write this number in digits, with nothing else: {words}", str(n), "number")


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
