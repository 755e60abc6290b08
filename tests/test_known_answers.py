"""Pure tests of the known-answer probe: answer checks, tolerance rule, the spec (and its
retired template keys), prompts-file validation and scoring."""

from __future__ import annotations

import json
import re

import pytest
from pydantic import ValidationError

from tuner.probe.checks import check_answer
from tuner.probe.client import load_probe_items
from tuner.probe.items import ProbeItem
from tuner.probe.known_score import ProbeAnswer, ProbeResult, accuracy_tolerance, score
from tuner.probe.prompts_file import PromptsFileError, parse_prompts_jsonl
from tuner.probe.sample import known_sample
from tuner.probe.spec import ProbeSpec

# ------------------------------------------------------------------ answer checkers


@pytest.mark.parametrize(
    ("answer", "ok"),
    [
        ("85", True),
        ("85.", True),
        ("  85\n", True),
        ("The answer is 85.", True),
        ("85.0", True),
        ("**85**", True),
        ("8 5", False),  # first integer is 8
        ("85.5", False),
        ("858", False),
        ("86", False),
        ("eighty-five", False),
        ("37 + 48 = 85", False),  # the first number must be the answer
        ("", False),
        ("   ", False),
        (None, False),
    ],
)
def test_number_check(answer: str | None, ok: bool) -> None:
    assert check_answer("number", "85", answer) is ok


def test_number_check_thousands_and_sign() -> None:
    assert check_answer("number", "1000", "1,000")
    assert check_answer("number", "-3", "It is -3.")
    assert not check_answer("number", "3", "-3")
    assert check_answer("number", "412", "412\n\nThe number four hundred and twelve")


@pytest.mark.parametrize(
    ("answer", "ok"),
    [
        ("orange", True),
        ("Orange.", True),
        ("ORANGE!", True),
        ("orange juice", True),  # first word-like token decides
        ('"orange"', True),
        ("oranges", False),
        ("The value is orange", False),
        ("", False),
    ],
)
def test_word_check(answer: str, ok: bool) -> None:
    assert check_answer("word", "orange", answer) is ok


def test_word_check_multiword_expected() -> None:
    assert check_answer("word", "New York", "new york city")
    assert not check_answer("word", "New York", "New Jersey")


LINE = "the quiet lantern repairs ten busy lanterns"


@pytest.mark.parametrize(
    ("answer", "ok"),
    [
        (LINE, True),
        (LINE.upper() + ".", True),
        (f'"{LINE}"', True),
        (f"  {LINE}  \n", True),
        (LINE.replace(" ", "   "), True),
        (f"Here is the line:\n{LINE}", True),
        (f"\n\n{LINE}\nanything after the line", True),
        (f"{LINE} and more", False),
        ("the quiet lantern repairs ten lanterns", False),
        (f"Sure, I can do that.\n{LINE}", False),  # lead-in must end with ':'
        ("", False),
    ],
)
def test_line_check(answer: str, ok: bool) -> None:
    assert check_answer("line", LINE, answer) is ok


CAPITALS = ("Paris", "Berlin", "Rome", "Tokyo", "Madrid")


@pytest.mark.parametrize(
    ("expected", "answer", "ok"),
    [
        ("Paris", "The capital of France is Paris.", True),
        ("Paris", "Paris", True),
        ("Paris", "paris.", True),
        ("Paris", "Paris. It is also the largest city in France.", True),
        ("Paris", "Paris is not the capital", False),  # negation
        ("Berlin", "Paris is not the capital", False),  # wrong city for a Germany item
        ("Berlin", "Berlin is not the capital of Germany.", False),
        ("Berlin", "Berlin isn't it.", False),
        ("Berlin", "It is Paris or Berlin.", False),  # hedging with a distractor
        ("Berlin", "I am not sure. Berlin.", False),  # answer only in the 2nd sentence
        ("Berlin", "Berliner", False),  # whole words only
        ("Berlin", "", False),
    ],
)
def test_sentence_check(expected: str, answer: str, ok: bool) -> None:
    others = [c for c in CAPITALS if c != expected]
    assert check_answer("sentence", expected, answer, others) is ok


def test_contains_check() -> None:
    assert check_answer("contains", "Hello  World", "I say: hello world!")
    assert not check_answer("contains", "hello world", "hello, world")


def test_unknown_check_raises() -> None:
    with pytest.raises(ValueError, match="unknown check"):
        check_answer("regex", "x", "x")  # type: ignore[arg-type]


# ------------------------------------------------------------------- item bank


def _items(n: int) -> list[ProbeItem]:
    """``n`` known-answer items as a trial draws them from the bank (one per stratum)."""
    items = known_sample(load_probe_items(ProbeSpec()), 0)
    assert len(items) >= n
    return items[:n]


def test_garbage_answers_fail_checks() -> None:
    """Fluent but wrong output (trap 1) and answers to other questions must not pass."""
    items = load_probe_items(ProbeSpec(seed=5))
    fluent = "The answer to this question depends on several important factors."
    assert not any(check_answer(i.check, i.expected, fluent, i.distractors) for i in items)
    shifted = [
        check_answer(i.check, i.expected, items[(n + 7) % len(items)].expected, i.distractors)
        for n, i in enumerate(items)
    ]
    assert sum(shifted) <= 2

# ------------------------------------------------------------------ tolerance rule


def test_tolerance_values() -> None:
    assert accuracy_tolerance(24, 1.0) == pytest.approx(0.104, abs=0.002)
    assert accuracy_tolerance(12, 1.0) == pytest.approx(0.194, abs=0.002)
    assert accuracy_tolerance(200, 0.9) == pytest.approx(0.050, abs=0.002)
    assert accuracy_tolerance(24, 1.0, confidence=0.99) > accuracy_tolerance(24, 1.0)


def test_tolerance_shrinks_with_sample_size() -> None:
    sizes = [6, 12, 24, 48, 96, 200, 1000]
    tols = [accuracy_tolerance(n, 0.9) for n in sizes]
    assert tols == sorted(tols, reverse=True)
    assert tols[-1] < 0.025


@pytest.mark.parametrize(
    ("n", "reference", "correct", "passes"),
    [
        (24, 1.0, 22, True),
        (24, 1.0, 21, False),
        (12, 1.0, 10, True),
        (12, 1.0, 9, False),
        (200, 0.9, 170, True),  # 0.85 >= 0.9 - 0.05
        (200, 0.9, 168, False),
        (48, 0.5, 16, True),  # 0.333 >= 0.5 - 0.168
        (48, 0.5, 15, False),
    ],
)
def test_tolerance_decisions(n: int, reference: float, correct: int, passes: bool) -> None:
    assert (correct / n >= reference - accuracy_tolerance(n, reference)) is passes


def test_tolerance_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="n must be"):
        accuracy_tolerance(0, 1.0)
    with pytest.raises(ValueError, match="reference"):
        accuracy_tolerance(10, 1.5)


# ------------------------------------------------------------------------ spec


def test_spec_defaults_and_normalisation() -> None:
    spec = ProbeSpec()
    assert spec.enabled and spec.concurrency == (1, 8)
    assert spec.apis == ("chat", "completions")
    assert ProbeSpec(concurrency=[8, 1, 4]).concurrency == (1, 4, 8)
    assert ProbeSpec(api="completions").apis == ("completions",)


@pytest.mark.parametrize(
    "bad",
    [
        {"concurrency": [0, 1]},
        {"concurrency": [1, 1]},
        {"concurrency": []},
        {"bank": {"families": ["fact", "fact"]}},
        {"bank": {"families": ["poetry"]}},
        {"bank": {"families": []}},
        {"api": "grpc"},
        {"min_accuracy": 1.2},
        {"reference_accuracy": -0.1},
        {"prompts_file": "  "},
        {"temperature": 0.7},  # extra fields are rejected
    ],
)
def test_spec_rejects(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        ProbeSpec.model_validate(bad)


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("items", 24, "items: 24: a key of the retired template questions (issue 37); remove it"),
        ("families", ["capital"], "families: ['capital']: a key of the retired template questions"),
        ("lookup_prompt_tokens", [300], "lookup_prompt_tokens: [300]: a key of the retired template"),
    ],
)
def test_retired_template_keys_refused_in_a_study_file_read_in_a_saved_spec(
    key: str, value: object, says: str
) -> None:
    with pytest.raises(ValidationError, match=re.escape(says)):
        ProbeSpec.model_validate({key: value})
    # A spec.yaml saved before the template probe was retired holds every field it had.
    saved = ProbeSpec.model_validate({key: value, "bank": {"enabled": True}}, context={"saved": True})
    assert saved == ProbeSpec()
    assert key not in saved.model_dump() and "enabled" not in saved.bank.model_dump()


def test_bank_disabled_is_refused_even_in_a_saved_spec() -> None:
    # Resuming such a study with the bank would silently change what its trials are held to.
    for context in (None, {"saved": True}):
        with pytest.raises(ValidationError, match=re.escape(
            "bank.enabled: false: the fixed template questions were retired (issue 37) and the item bank "
            "is the probe's only generated source; remove the key, give your own questions in "
            "probe.prompts_file, or turn the probe off (probe.enabled: false)"
        )):
            ProbeSpec.model_validate({"bank": {"enabled": False}}, context=context)
    assert ProbeSpec.model_validate({"bank": {"enabled": True}}) == ProbeSpec()


# ------------------------------------------------------------------ prompts file


def test_prompts_file_valid() -> None:
    text = "\n".join(
        [
            json.dumps({"prompt": "2+2?", "expected": 4, "check": "number"}),
            "",
            json.dumps({"prompt": "Say hi", "expected": "hi", "check": "word", "api": "chat"}),
            json.dumps({"prompt": "x", "expected": "y", "check": "contains", "id": "mine"}),
        ]
    )
    items = parse_prompts_jsonl(text, ("chat", "completions"))
    assert [i.id for i in items] == [
        "line1-chat", "line1-completions", "line3-chat", "mine-chat", "mine-completions",
    ]  # fmt: skip
    assert items[0].expected == "4" and items[0].family == "custom"
    assert items[1].prompt == "2+2?"  # user prompts are sent verbatim, no framing


def test_prompts_file_reports_every_bad_line() -> None:
    lines = [
        json.dumps({"prompt": "ok", "expected": "1", "check": "number"}),  # 1 fine
        '{"prompt": "broken", ',  # 2 bad JSON
        json.dumps({"prompt": "p", "check": "number"}),  # 3 missing expected
        json.dumps({"prompt": "p", "expected": "a", "check": "regex"}),  # 4 bad check
        json.dumps({"prompt": "p", "expected": "many", "check": "number"}),  # 5 not a number
        json.dumps({"prompt": "p", "expected": "a", "check": "word", "colour": 1}),  # 6
        "[1, 2]",  # 7 not an object
        json.dumps({"prompt": "", "expected": "a", "check": "word"}),  # 8 empty prompt
        json.dumps({"prompt": "p", "expected": "a", "check": "word", "api": "grpc"}),  # 9
        json.dumps({"prompt": "q", "expected": "2", "check": "number", "id": "line1"}),  # 10
    ]
    with pytest.raises(PromptsFileError) as info:
        parse_prompts_jsonl("\n".join(lines), ("chat",), source="mine.jsonl")
    problems = {(line, field) for line, field, _ in info.value.problems}
    assert problems == {
        (2, "-"), (3, "expected"), (4, "check"), (5, "expected"), (6, "colour"),
        (7, "-"), (8, "prompt"), (9, "api"), (10, "id"),
    }  # fmt: skip
    message = str(info.value)
    assert message.startswith("mine.jsonl: 9 invalid line(s)")
    assert "line 5: expected: must be a number" in message
    assert "line 10: id: duplicate of line 1" in message


def test_prompts_file_empty() -> None:
    with pytest.raises(PromptsFileError, match="no prompts"):
        parse_prompts_jsonl("\n  \n", ("chat",))


# ------------------------------------------------------------------------ scoring


def _answers(
    items: list[ProbeItem], level: int, wrong: frozenset[int] | set[int] = frozenset()
) -> list[ProbeAnswer]:
    return [
        ProbeAnswer(
            item_id=item.id,
            concurrency=level,
            text="I do not know." if n in wrong else item.expected,
            finish_reason="stop",
            prompt_tokens=10,
            completion_tokens=3,
            latency_s=0.01,
        )
        for n, item in enumerate(items)
    ]


def test_score_all_correct() -> None:
    spec = ProbeSpec()
    items = _items(24)
    result = score(items, _answers(items, 1) + _answers(items, 8), spec, probe_seconds=1.5)
    assert result.passed and result.reason == "ok"
    assert result.accuracy == 1.0 and result.total == 48 and result.consistency == 1.0
    assert result.by_concurrency[8].total == 24
    assert result.by_api["chat"].accuracy == 1.0
    assert set(result.by_family) == {"arithmetic", "code", "copy", "fact", "multi_turn", "retrieval"}
    assert [lv.consistency for lv in result.levels] == [None, 1.0]
    assert not result.errors and not result.empty_outputs and not result.unexpected_finish_reasons
    assert result.probe_seconds == 1.5
    # Long retrieval prompts are truncated for storage but keep their question.
    retrieval = next(r for r in result.records if r.family == "retrieval" and "password" in r.prompt)
    assert len(retrieval.prompt) < 300 and "Answer with one word" in retrieval.prompt


def test_score_garbage_fails_with_reason() -> None:
    spec = ProbeSpec()
    items = _items(24)
    every = set(range(len(items)))
    result = score(items, _answers(items, 1, every) + _answers(items, 8, every), spec)
    assert not result.passed
    assert "accuracy 0.00 < 0.80 at concurrency 1 (chat 0.00)" in result.reason
    assert "at concurrency 8" in result.reason
    # Identical garbage at both levels is consistent: the accuracy gate catches it.
    assert result.consistency == 1.0


def test_score_batch_dependent_bug_fails_consistency() -> None:
    spec = ProbeSpec(min_accuracy=0.0)  # isolate the consistency rule
    items = _items(24)
    # Wrong at both levels, but differently wrong at concurrency 8 for half the items.
    wrong = set(range(len(items)))
    level8 = [
        a.model_copy(update={"text": f"{a.text} maybe"}) if n % 2 else a
        for n, a in enumerate(_answers(items, 8, wrong))
    ]
    result = score(items, _answers(items, 1, wrong) + level8, spec)
    assert result.consistency == 0.5
    assert not result.passed
    assert "consistency 0.50 < 0.90 at concurrency 8 vs 1" in result.reason
    assert [lv.passed for lv in result.levels] == [True, False]


def test_score_errors_count_wrong_and_are_listed() -> None:
    spec = ProbeSpec(concurrency=[1])
    items = _items(24)
    answers = _answers(items, 1)
    answers[0] = ProbeAnswer(item_id=items[0].id, concurrency=1, error="HTTP 500: boom")
    answers[1] = ProbeAnswer(item_id=items[1].id, concurrency=1, text="", finish_reason="stop")
    answers[2] = answers[2].model_copy(update={"finish_reason": "abort"})
    result = score(items, answers, spec)
    assert result.correct == 23 - 1  # error and empty are wrong; abort'ed answer is right
    assert [(f.item_id, f.detail) for f in result.errors] == [(items[0].id, "HTTP 500: boom")]
    assert [f.item_id for f in result.empty_outputs] == [items[1].id]
    assert [f.detail for f in result.unexpected_finish_reasons] == ["finish_reason='abort'"]
    assert result.passed  # 22/24 >= 0.8
    assert result.consistency is None  # one level: nothing to compare


def test_score_missing_answers_are_errors() -> None:
    spec = ProbeSpec()
    items = _items(24)
    result = score(items, _answers(items, 1), spec)  # level 8 never ran
    assert not result.passed
    assert result.by_concurrency[8].correct == 0
    assert {f.detail for f in result.errors} == {"no answer recorded"}
    assert "24 request error(s)" in result.reason


def test_score_reference_rule() -> None:
    spec = ProbeSpec(concurrency=[1], reference_accuracy=1.0, min_accuracy=0.99)
    items = _items(24)
    ok = score(items, _answers(items, 1, {0, 1}), spec)  # 22/24, floor 0.99 not applied
    assert ok.passed and ok.levels[0].threshold == pytest.approx(1 - accuracy_tolerance(24, 1.0))
    bad = score(items, _answers(items, 1, {0, 1, 2}), spec)  # 21/24
    assert not bad.passed
    assert "accuracy 0.88 < 0.90 (reference 1.00 - tolerance 0.10, n=24)" in bad.reason


def test_score_rejects_caller_bugs() -> None:
    spec = ProbeSpec(concurrency=[1])
    items = _items(12)
    stray = ProbeAnswer(item_id="nope", concurrency=1, text="x")
    with pytest.raises(ValueError, match="unknown item"):
        score(items, [stray], spec)
    twice = _answers(items, 1)[:1] * 2
    with pytest.raises(ValueError, match="two answers"):
        score(items, twice, spec)
    with pytest.raises(ValueError, match="unexpected concurrency"):
        score(items, _answers(items, 4), spec)
    with pytest.raises(ValueError, match="no probe items"):
        score([], [], spec)


def test_result_round_trips_through_json() -> None:
    spec = ProbeSpec()
    items = _items(24)
    result = score(items, _answers(items, 1, {3}) + _answers(items, 8, {3, 4}), spec)
    again = ProbeResult.model_validate_json(result.model_dump_json())
    assert again == result
    dumped = json.loads(result.model_dump_json())
    assert dumped["by_concurrency"]["8"]["accuracy"] == pytest.approx(22 / 24)


def test_disabled_result() -> None:
    result = ProbeResult.disabled()
    assert result.passed and result.skipped and result.reason == "probe disabled"


# ------------------------------------------------------- single-stream subset levels


def _subset_case(changed: set[int], wrong_at_1: bool = False) -> ProbeResult:
    """12 items at concurrency 8, items 0-2 only at 1 (a single-stream subset); the items
    in ``changed`` answer differently at 8 than at 1."""
    spec = ProbeSpec(reference_accuracy=1.0)
    items = _items(12)
    subset = {items[n].id for n in range(3)}
    level1 = [a for a in _answers(items, 1, set(range(12)) if wrong_at_1 else set())
              if a.item_id in subset]
    level8 = [a.model_copy(update={"text": f"{a.text} or so"}) if n in changed else a
              for n, a in enumerate(_answers(items, 8))]
    return score(items, level1 + level8, spec, asked={1: subset})


def test_subset_level_is_recorded_not_gated_on_accuracy() -> None:
    result = _subset_case(set())
    assert result.passed, result.reason
    single, batched = result.levels
    assert single.subset and single.total == 3 and single.threshold is None
    assert not batched.subset and batched.total == 12 and batched.threshold is not None
    assert batched.consistency == 1.0 and result.total == 15
    # Wrong answers at 1 only: their accuracy is not gated there (a chosen, not random,
    # sample of 3), but the answers changed with the batch size: consistency fails.
    bad = _subset_case(set(), wrong_at_1=True)
    assert not bad.passed and bad.levels[0].passed and not bad.levels[1].passed
    assert "3 of the 3 single-stream items answered differently at concurrency 8 than at 1" \
        in bad.reason


def test_subset_consistency_tolerates_what_the_full_set_would_but_never_all() -> None:
    # 0.9 over 12 items tolerates one changed answer; the 3 compared pairs keep that.
    one = _subset_case({0})
    assert one.passed, one.reason
    assert one.levels[1].consistency == pytest.approx(2 / 3)
    two = _subset_case({0, 1})
    assert not two.passed and "at most 1 tolerated" in two.reason
    # Changes outside the subset cannot be compared and do not count.
    assert _subset_case({5, 6, 7}).passed
    # A subset of one pair: a changed answer there is all of them.
    spec = ProbeSpec(reference_accuracy=1.0)
    items = _items(12)
    level8 = _answers(items, 8)
    level8[0] = level8[0].model_copy(update={"text": "other"})
    result = score(items, _answers(items, 1)[:1] + level8, spec, asked={1: {items[0].id}})
    assert not result.passed and "1 of the 1 single-stream items" in result.reason


def test_subset_rejects_answers_not_asked() -> None:
    spec = ProbeSpec()
    items = _items(12)
    with pytest.raises(ValueError, match="not asked at 1"):
        score(items, _answers(items, 1) + _answers(items, 8), spec, asked={1: {items[0].id}})
    with pytest.raises(ValueError, match="bad item subset"):
        score(items, _answers(items, 8), spec, asked={1: {"nope"}})
