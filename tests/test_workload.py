"""Synthetic prompts: determinism, stream separation, class mix, lengths, token fitting."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable

import pytest

from tests.request_plans import build_plan
from tuner.load.load_spec import WorkloadClass, WorkloadSpec
from tuner.load.workload import (
    TOKENS_PER_WORD,
    PromptDraft,
    TokenFitter,
    allocate_classes,
    draft_requests,
    fit_draft,
    level_stream,
)

MIX = WorkloadSpec(
    classes=[
        WorkloadClass(name="chat", kind="open_ended", weight=3, prompt_tokens=200),
        WorkloadClass(name="edit", kind="copy_heavy", weight=1, prompt_tokens=400,
                      output_tokens=64),
    ]
)


def _plan(stream: str, n: int = 16, seed: int = 0) -> list[str]:
    return [p.prompt for p in build_plan(MIX, n, seed=seed, stream=stream, ignore_eos=True)]


def test_same_inputs_same_prompts() -> None:
    assert _plan("measure-c4") == _plan("measure-c4")


def test_warmup_and_other_levels_and_seeds_never_share_a_prompt() -> None:
    measured = set(_plan(level_stream("measure", 4)))
    assert len(measured) == 16
    for other in (
        _plan(level_stream("warmup", 4)),
        _plan(level_stream("measure", 8)),
        _plan(level_stream("measure", 4), seed=1),
    ):
        assert measured.isdisjoint(other)


def test_prompts_do_not_share_long_prefixes() -> None:
    # Shared prefixes would turn into prefix-cache hits and flatter the config under test.
    prompts = _plan("measure-c16", n=40)
    for i, a in enumerate(prompts):
        for b in prompts[i + 1:]:
            common = 0
            for x, y in zip(a, b, strict=False):
                if x != y:
                    break
                common += 1
            assert common < 120, (a[:150], b[:150])


def test_request_i_does_not_depend_on_plan_size() -> None:
    small = draft_requests(WorkloadSpec(), 4, seed=3, stream="s")
    large = draft_requests(WorkloadSpec(), 9, seed=3, stream="s")
    assert [d.draft for d in small] == [d.draft for d in large[:4]]


def test_class_mix_is_exactly_proportional() -> None:
    plans = build_plan(MIX, 8, seed=0, stream="x", ignore_eos=False)
    assert Counter(p.class_name for p in plans) == {"chat": 6, "edit": 2}
    assert [p.index for p in plans] == list(range(8))


def test_allocate_largest_remainder() -> None:
    classes = [WorkloadClass(name=n, kind="open_ended", weight=1) for n in "abc"]
    got = Counter(c.name for c in allocate_classes(classes, 10, random.Random(0)))
    assert sorted(got.values()) == [3, 3, 4]
    assert sum(got.values()) == 10


def test_plan_fields_follow_the_class() -> None:
    plans = build_plan(MIX, 8, seed=0, stream="x", ignore_eos=False)
    for p in plans:
        cls = next(c for c in MIX.classes if c.name == p.class_name)
        assert p.kind == cls.kind
        assert p.max_tokens == cls.output_tokens
        assert p.ignore_eos is False
        lo, hi = cls.prompt_tokens * 0.9, cls.prompt_tokens * 1.1
        assert lo - 1 <= p.target_prompt_tokens <= hi + 1


def test_estimated_length_is_close_to_target() -> None:
    for p in build_plan(MIX, 24, seed=5, stream="x", ignore_eos=True):
        estimate = len(p.prompt.split()) * TOKENS_PER_WORD
        assert p.target_prompt_tokens - 2 * TOKENS_PER_WORD <= estimate <= p.target_prompt_tokens


def test_content_classes_look_like_their_kind() -> None:
    plans = build_plan(MIX, 40, seed=0, stream="x", ignore_eos=True)
    for p in plans:
        if p.kind == "copy_heavy":
            assert p.prompt.startswith(("Repeat the following Python code", "Copy the inventory"))
        else:
            assert "Background notes:" in p.prompt
    # Both copy-heavy flavours and several open-ended instructions appear.
    starts = Counter(p.prompt.split()[0] for p in plans)
    assert {"Repeat", "Copy"} <= set(starts)
    assert len(starts) >= 5


def _draft() -> PromptDraft:
    return draft_requests(MIX, 2, seed=1, stream="fit")[0].draft


def _brute_force_best(draft: PromptDraft, target: int, count: Callable[[str], int]) -> int:
    fitting = [n for n in range(len(draft.units) + 1) if count(draft.render(n)) <= target]
    return max(fitting) if fitting else 0


@pytest.mark.parametrize("ratio", [1.0, 1.3, 1.7, 2.6])
@pytest.mark.parametrize("target", [20, 90, 150, 210])
def test_token_fitter_finds_the_longest_prompt_that_fits(ratio: float, target: int) -> None:
    draft = _draft()

    def count(text: str) -> int:
        return int(len(text.split()) * ratio) + 1  # +1: a BOS token

    fitter = TokenFitter(draft, target)
    while (n := fitter.next_probe()) is not None:
        fitter.observe(n, count(draft.render(n)))
    assert fitter.probes <= 12
    assert fitter.result() == _brute_force_best(draft, target, count)


def test_fit_draft_keeps_head_and_tail() -> None:
    draft = _draft()
    text = fit_draft(draft, 60, lambda t: len(t))  # one "token" per character: heavy trim
    assert text.startswith(draft.head) and text.endswith(draft.tail)


def test_fitter_when_even_the_whole_draft_is_short() -> None:
    draft = _draft()
    text = fit_draft(draft, 10_000, lambda t: len(t.split()))
    assert text == draft.render(len(draft.units))


def test_fitter_when_head_and_tail_alone_exceed_target() -> None:
    draft = _draft()
    assert fit_draft(draft, 2, lambda t: len(t.split())) == draft.render(0)


def test_build_plan_with_counter_hits_targets() -> None:
    def count(text: str) -> int:
        return len(text.split())

    for p in build_plan(MIX, 8, seed=2, stream="x", ignore_eos=True, count_tokens=count):
        assert p.target_prompt_tokens - 1 <= count(p.prompt) <= p.target_prompt_tokens


def test_fitter_rejects_bad_target() -> None:
    with pytest.raises(ValueError, match="target_tokens must be >= 1"):
        TokenFitter(_draft(), 0)
