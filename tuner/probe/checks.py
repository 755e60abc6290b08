"""Answer checking for known-answer items (pure).

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
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from decimal import Decimal, InvalidOperation

from tuner.probe.items import Check

__all__ = ["answer_words", "check_answer", "parse_number"]

_NUMBER_RE = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_WORD_RE = re.compile(r"[^\W_]+(?:['’-][^\W_]+)*")
_SENTENCE_END_RE = re.compile(r"(?<=[.!?])\s+|\n")
_NEGATIONS = frozenset({"not", "no", "never", "neither", "nor"})
_STRIP_CHARS = " \t\r\n.,;:!?\"'`“”‘’()[]{}*"


def answer_words(text: str) -> list[str]:
    return _WORD_RE.findall(text.casefold())


def _contains_run(haystack: list[str], needle: list[str]) -> bool:
    n = len(needle)
    return n > 0 and any(haystack[i : i + n] == needle for i in range(len(haystack) - n + 1))


def _norm(text: str) -> str:
    return " ".join(text.casefold().split()).strip(_STRIP_CHARS)


def parse_number(text: str) -> Decimal | None:
    try:
        return Decimal(text.replace(",", ""))
    except InvalidOperation:
        return None


def _check_number(expected: str, answer: str) -> bool:
    match = _NUMBER_RE.search(answer)
    want = parse_number(expected.strip())
    return match is not None and want is not None and parse_number(match.group()) == want


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
    words = answer_words(first)
    if not _contains_run(words, answer_words(expected)):
        return False
    if any(w in _NEGATIONS or w.endswith(("n't", "n’t")) for w in words):
        return False
    return not any(_contains_run(words, answer_words(d)) for d in distractors)


def _check_mentions(expected: str, answer: str, distractors: Iterable[str]) -> bool:
    """The expected word(s) appear as whole words, and no distractor comes before them.

    Chatty answers put the fact anywhere ("That sounds exciting! The capital of Peru is
    Lima."), so the first sentence is not enough; a distractor named first ("Bogota, no,
    Lima") is a wrong answer, and a negation right before it ("not Lima") too."""
    words = answer_words(answer)
    want = answer_words(expected)
    n = len(want)
    at = next((i for i in range(len(words) - n + 1) if words[i : i + n] == want), None)
    if not n or at is None:
        return False
    if any(w in _NEGATIONS or w.endswith(("n't", "n’t")) for w in words[max(0, at - 2) : at]):
        return False
    before = words[:at]
    return not any(_contains_run(before, answer_words(d)) for d in distractors)


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
        want = answer_words(expected)
        return bool(want) and answer_words(answer)[: len(want)] == want
    if check == "line":
        return _check_line(expected, answer)
    if check == "sentence":
        return _check_sentence(expected, answer, distractors)
    if check == "mentions":
        return _check_mentions(expected, answer, distractors)
    if check == "contains":
        return bool(_norm(expected)) and _norm(expected) in _norm(answer)
    raise ValueError(f"unknown check {check!r}")
