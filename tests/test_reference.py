"""Reference agreement, pure part: parsing vLLM bodies, check_logprobs_close semantics,
teacher-forced agreement, the pass rule, trusting a reference, and the combined verdict."""

from __future__ import annotations

import json
import math

import pytest
from pydantic import ValidationError

from tuner.probe.compare import compare_forced, compare_generation
from tuner.probe.items import ProbeItem
from tuner.probe.known_score import ProbeAnswer, score
from tuner.probe.prompts_file import ReferencePromptsError, parse_prompts_jsonl, parse_reference_prompts_jsonl
from tuner.probe.record import (
    ForcedStep,
    Generation,
    Reference,
    ReferencePrompt,
    ReferenceSource,
    truncate_generation,
)
from tuner.probe.reference_score import ReferenceAnswer, score_reference
from tuner.probe.selection import (
    forced_prompt_ids,
    reference_sources,
    shared_prompts,
)
from tuner.probe.spec import OPEN_PROMPTS, ProbeSpec, ReferenceSpec
from tuner.probe.verdict import combine, validate_reference, with_reference_accuracy
from tuner.probe.wire import (
    forced_request,
    generation_request,
    parse_forced,
    parse_generation,
    tokenize_request,
)

# ----------------------------------------------------------------------- helpers

# A study's own known-answer questions (probe.prompts_file), each asked through every API of
# the spec: the first is a long lookup (too long to teacher-force), the rest short.
_TABLE = "\n".join(f"key {100 + n} = {word}" for n, word in enumerate(
    ["orange", "lemon", "purple", "tiger", "river", "candle", "pencil", "garden"] * 8))
QUESTIONS = [
    (f"{_TABLE}\nWhat is the value of key 117? Answer with one word.", "lemon", "sentence"),
    ("What is 37 + 48? Answer with the number only.", "85", "number"),
    ("Repeat the following line exactly, with nothing else:\nthe quiet otter paints three harbors",
     "the quiet otter paints three harbors", "line"),
    ("Write this number in digits, with nothing else: four hundred and twelve", "412", "number"),
    ("What is the capital of France? Answer with one word.", "Paris", "sentence"),
    ("What is 6 * 7? Answer with the number only.", "42", "number"),
]


def user_items(spec: ProbeSpec, questions: list[tuple[str, str, str]] = QUESTIONS) -> list[ProbeItem]:
    """``questions`` as a prompts_file gives them to ``spec`` (ids line<N>-<api>)."""
    lines = [json.dumps({"prompt": q, "expected": e, "check": c}) for q, e, c in questions]
    return parse_prompts_jsonl("\n".join(lines), spec.apis)


def gen(tokens: list[int], *, alts: dict[int, list[int]] | None = None, lp: float = -0.1,
        finish: str = "length") -> Generation:
    """A generation whose chosen token is top-1 at every position; ``alts[i]`` lists the
    next candidates at position i (default: 100+i, 200+i, ...)."""
    alts = alts or {}
    top = []
    for i, tok in enumerate(tokens):
        others = alts.get(i, [100 + i, 200 + i, 300 + i, 400 + i])
        entry = {tok: lp}
        entry.update({o: lp - 1.0 - r for r, o in enumerate(others)})
        top.append(entry)
    return Generation(tokens=tokens, logprobs=[lp] * len(tokens), top=top, finish_reason=finish,
                      text=" ".join(map(str, tokens)))


def steps(tokens: list[int], top1: list[int] | None = None, lp: float = -0.5) -> list[ForcedStep]:
    top1 = top1 or tokens
    return [ForcedStep(token=t, logprob=lp, top={p: -0.1, 999: -2.0}) for t, p in zip(tokens, top1)]


def make_reference(n_prompts: int = 4, length: int = 8, forced: bool = True) -> Reference:
    prompts = []
    for i in range(n_prompts):
        toks = [10 * i + j for j in range(1, length + 1)]
        prompts.append(ReferencePrompt(
            id=f"p{i}", source="open", fingerprint="f", preview="x", prompt_ids=[1, 2, 3],
            generation=gen(toks), forced=steps(toks) if forced else None))
    return Reference(model="m", max_tokens=length, top_k=5, teacher_forced=forced,
                     forced_max_prompt_tokens=512, prompts=prompts)


def answers(ref: Reference, levels=(1, 8), *, override=None, forced_override=None):
    """Answers equal to the reference, except those in override[(id, level)]."""
    override = override or {}
    forced_override = forced_override or {}
    out = []
    for level in levels:
        for p in ref.prompts:
            g = override.get((p.id, level), p.generation)
            if isinstance(g, str):
                out.append(ReferenceAnswer(prompt_id=p.id, concurrency=level, kind="generate",
                                           error=g))
            else:
                out.append(ReferenceAnswer(prompt_id=p.id, concurrency=level, kind="generate",
                                           generation=g))
            if level == levels[-1] and p.forced is not None:
                out.append(ReferenceAnswer(prompt_id=p.id, concurrency=level, kind="forced",
                                           forced=forced_override.get(p.id, p.forced)))
    return out


def ref_spec(**kw) -> ReferenceSpec:
    return ReferenceSpec(**kw)


# ------------------------------------------------------------------- spec


def test_reference_spec_defaults_and_validation():
    spec = ProbeSpec()
    ref = spec.reference
    assert ref.enabled and ref.max_tokens == 16 and ref.top_k == 5
    assert ref.conservative and ref.values == {}
    assert ref.min_close_fraction == 1.0 and ref.min_exact_fraction is None
    assert ref.min_prompt_top1 == 0.98 and ref.concurrency == (1, 8)
    assert ReferenceSpec(concurrency=(8, 1)).concurrency == (1, 8)
    # The template probe's open-prompt count did nothing with the bank (issue 37): refused in a
    # study file, dropped from a saved spec.
    with pytest.raises(ValidationError, match=r"open_prompts: 0: a key of the retired template probe \(issue 37\)"):
        ReferenceSpec(open_prompts=0)
    saved = ProbeSpec.model_validate({"reference": {"open_prompts": 4}}, context={"saved": True})
    assert saved == ProbeSpec() and "open_prompts" not in saved.model_dump()["reference"]
    with pytest.raises(ValidationError):
        ReferenceSpec(concurrency=(1, 1))
    with pytest.raises(ValidationError):
        ReferenceSpec(top_k=21)  # above vLLM's default --max-logprobs
    with pytest.raises(ValidationError):
        ProbeSpec.model_validate({"reference": {"bogus": 1}})


def test_reference_levels_follow_the_probe_unless_set():
    # Same levels by default, so a known-answer request can serve both layers.
    assert ProbeSpec(concurrency=[4, 1]).reference.concurrency == (1, 4)
    assert ProbeSpec.model_validate({"concurrency": [1, 4], "reference": {"max_tokens": 8}}
                                    ).reference.concurrency == (1, 4)
    assert ProbeSpec(concurrency=[1, 4], reference=ReferenceSpec(max_tokens=8)
                     ).reference.concurrency == (1, 4)
    explicit = ProbeSpec(concurrency=[1, 4], reference={"concurrency": [1, 8]})
    assert explicit.reference.concurrency == (1, 8)
    # What the orchestrator sends to a worker comes back the same.
    spec = ProbeSpec(concurrency=[1, 4])
    assert ProbeSpec.model_validate(spec.model_dump(mode="json")) == spec


# -------------------------------------------------------------- prompt sources


def test_reference_sources_use_each_question_once_in_chat_form():
    spec = ProbeSpec()
    items = user_items(spec)
    sources = reference_sources(spec, items)
    known = [s for s in sources if s.source == "known_answer"]
    assert len(known) == 6 and all(s.messages is not None for s in known)
    assert known[0].id == "ka-line1"
    chat_item = next(i for i in items if i.id == "line1-chat")
    assert known[0].messages[0].content == chat_item.prompt
    # Every built-in open prompt is recorded; a trial draws bank.open_prompts of them.
    opens = [s for s in sources if s.source == "open"]
    assert len(opens) == len(OPEN_PROMPTS) and [s.id for s in opens][:2] == ["open0-chat", "open1-text"]
    assert opens[1].prompt == OPEN_PROMPTS[1][1]

    only_completions = ProbeSpec(api="completions", reference={"known_answer_prompts": 3})
    srcs = reference_sources(only_completions, user_items(only_completions))
    assert [s.id for s in srcs if s.source == "known_answer"] == ["ka-line1", "ka-line2", "ka-line3"]
    assert srcs[1].prompt == QUESTIONS[1][0] and srcs[1].messages is None


def test_tokenize_and_request_bodies():
    chat = ReferenceSource(id="a", source="open", messages=({"role": "user", "content": "hi"},))
    text = ReferenceSource(id="b", source="open", prompt="Once")
    assert tokenize_request(chat, "m") == {"model": "m", "messages": [{"role": "user",
                                           "content": "hi"}], "add_generation_prompt": True}
    assert tokenize_request(text, "m")["prompt"] == "Once"
    spec = ReferenceSpec(max_tokens=7, top_k=3)
    body = generation_request("m", [5, 6], spec)
    assert body["prompt"] == [5, 6] and body["temperature"] == 0 and body["logprobs"] == 3
    assert body["return_tokens_as_token_ids"] is True and body["max_tokens"] == 7
    forced = forced_request("m", [5, 6], [7, 8], spec)
    assert forced["prompt"] == [5, 6, 7, 8] and forced["prompt_logprobs"] == 3
    assert forced["max_tokens"] == 1 and "logprobs" not in forced
    with pytest.raises(ValidationError):
        ReferenceSource(id="c", source="open")
    assert chat.fingerprint() != text.fingerprint()


def test_reference_prompts_file_parsing():
    good = "\n".join([
        json.dumps({"prompt": "def main():"}),
        "",
        json.dumps({"id": "story", "messages": [{"role": "system", "content": "Be brief."},
                                                {"role": "user", "content": "A story."}]}),
    ])
    srcs = parse_reference_prompts_jsonl(good)
    assert [s.id for s in srcs] == ["ref-line1", "story"]
    assert srcs[1].messages[0].role == "system" and srcs[0].source == "custom"
    bad = "\n".join([
        "not json",
        json.dumps({"prompt": "x", "messages": [{"role": "user", "content": "y"}]}),
        json.dumps({"prompt": "x", "expected": "y"}),
        json.dumps({"id": "d", "prompt": "x"}),
        json.dumps({"id": "d", "prompt": "z"}),
        json.dumps({"messages": [{"role": "robot", "content": "y"}]}),
    ])
    with pytest.raises(ReferencePromptsError) as info:
        parse_reference_prompts_jsonl(bad, source="mine.jsonl")
    lines = {line for line, _ in info.value.problems}
    assert lines == {1, 2, 3, 5, 6}
    assert "mine.jsonl" in str(info.value) and "duplicates line 4" in str(info.value)
    with pytest.raises(ReferencePromptsError, match="no prompts"):
        parse_reference_prompts_jsonl("\n\n")
    spec = ProbeSpec()
    with pytest.raises(ValueError, match="unique"):
        reference_sources(spec, user_items(spec), [ReferenceSource(id="open0-chat",
                                                                    source="custom", prompt="x")])


# ----------------------------------------------------------------------- parsing


def vllm_completion(tokens, logprobs, tops, text="t", finish="length"):
    """The shape vLLM 0.32 returns with logprobs + return_tokens_as_token_ids."""
    return {"choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": {
        "text_offset": list(range(len(tokens))),
        "tokens": [f"token_id:{t}" for t in tokens],
        "token_logprobs": logprobs,
        "top_logprobs": [{f"token_id:{k}": v for k, v in top.items()} for top in tops]}}]}


def test_parse_generation_reads_ids_and_top_k():
    body = vllm_completion([74, 1950], [-1.58, -0.005],
                           [{74: -1.58, 504: -2.25, 49: -2.64}, {1950: -0.005, 62: -6.79}])
    g = parse_generation(body)
    assert g.tokens == [74, 1950] and g.logprobs == [-1.58, -0.005]
    assert g.top[0] == {74: -1.58, 504: -2.25, 49: -2.64} and g.finish_reason == "length"
    strings = json.loads(json.dumps(body).replace("token_id:", ""))
    with pytest.raises(ValueError, match="return_tokens_as_token_ids"):
        parse_generation(strings)
    with pytest.raises(ValueError, match="no logprobs"):
        parse_generation({"choices": [{"text": "x", "logprobs": None}]})
    with pytest.raises(ValueError, match="malformed"):
        parse_generation({"choices": []})
    nan = json.loads(json.dumps(vllm_completion([1], [float("nan")], [{1: float("nan")}])))
    assert math.isnan(parse_generation(nan).logprobs[0])  # kept, judged by the scorer


def test_parse_forced_keeps_only_ranked_top_k():
    # Prompt of 3 ids, continuation [7, 8]; vLLM lists top-k plus the actual token.
    plp = [None,
           {"2": {"logprob": -9.0, "rank": 900}, "5": {"logprob": -0.1, "rank": 1}},
           {"3": {"logprob": -1.0, "rank": 2}, "6": {"logprob": -0.5, "rank": 1}},
           {"7": {"logprob": -0.2, "rank": 1}, "4": {"logprob": -2.0, "rank": 2}},
           {"8": {"logprob": -7.5, "rank": 4000}, "9": {"logprob": -0.3, "rank": 1},
            "1": {"logprob": -1.2, "rank": 2}}]
    out = parse_forced({"choices": [{"prompt_logprobs": plp}]}, 3, [7, 8], k=2)
    assert [s.token for s in out] == [7, 8]
    assert out[0].top1 == 7 and out[0].logprob == -0.2
    assert out[1].top1 == 9 and out[1].logprob == -7.5 and 8 not in out[1].top
    with pytest.raises(ValueError, match="positions"):
        parse_forced({"choices": [{"prompt_logprobs": plp[:-1]}]}, 3, [7, 8], k=2)
    broken = [*plp[:4], {"9": {"logprob": -0.3, "rank": 1}}]
    with pytest.raises(ValueError, match="missing"):
        parse_forced({"choices": [{"prompt_logprobs": broken}]}, 3, [7, 8], k=2)


# ------------------------------------------------------------------- comparison


def test_identical_generations_are_exact():
    g = gen([1, 2, 3, 4])
    cmp = compare_generation(g, g, 5)
    assert cmp.verdict == "exact" and cmp.matched == 4 and cmp.gaps == [0.0] * 4


def test_near_tie_flip_is_close_and_stops_comparing():
    ref = gen([1, 2, 3, 4], alts={2: [30, 31, 32, 33]})
    # The trial picked 30 at position 2 (the reference's runner-up) and the reference token
    # 3 is the trial's runner-up there; afterwards the texts go separate ways freely.
    trial = gen([1, 2, 30, 77, 78, 79], alts={2: [3, 40, 41, 42]})
    cmp = compare_generation(ref, trial, 5)
    assert cmp.verdict == "close" and cmp.diverged_at == 2 and cmp.matched == 2
    assert cmp.reference_in_trial_top_k and cmp.trial_in_reference_top_k


def test_divergence_outside_top_k_is_far():
    ref = gen([1, 2, 3, 4])
    garbage = gen([1, 2, 555, 556])
    cmp = compare_generation(ref, garbage, 5)
    assert cmp.verdict == "far" and cmp.diverged_at == 2
    assert not cmp.reference_in_trial_top_k and not cmp.trial_in_reference_top_k
    assert "outside the top-5" in cmp.detail and "confident token replaced" in cmp.detail
    # The reference's confidence decides, not membership: its runner-up 1 nat below is a
    # near tie even where the trial's own top-k lacks the reference token...
    one_sided = gen([1, 2, 102, 9], alts={2: [50, 51, 52, 53]})
    ref2 = gen([1, 2, 3, 4], alts={2: [102, 60, 61, 62]})
    cmp = compare_generation(ref2, one_sided, 5)
    assert cmp.verdict == "close" and cmp.gap == pytest.approx(1.0) and cmp.trial_rank == 2
    assert not cmp.reference_in_trial_top_k
    # ...and a token inside the reference's top-5 but 2 nats below its choice is corruption.
    ranked_third = gen([1, 2, 60, 9])
    cmp = compare_generation(ref2, ranked_third, 5)
    assert cmp.verdict == "far" and cmp.trial_in_reference_top_k and cmp.gap == pytest.approx(2.0)


def test_top_k_is_the_k_most_likely_not_every_listed_entry():
    # vLLM lists the sampled token plus the top-k: with k=2 the third entry is not top-k.
    ref = gen([1, 2], alts={1: [20, 21, 22, 23]})
    trial = gen([1, 21], alts={1: [2, 40, 41, 42]})
    assert compare_generation(ref, trial, 3, near_tie=2.5).verdict == "close"
    assert compare_generation(ref, trial, 2, near_tie=2.5).verdict == "far"


def test_early_stop_without_divergent_token_and_nan_are_failures():
    ref = gen([1, 2, 3, 4])
    short = gen([1, 2])
    cmp = compare_generation(ref, short, 5)
    assert cmp.verdict == "far" and "ended after 2" in cmp.detail
    nan = Generation(tokens=[1, 2, 3, 4], logprobs=[-0.1, float("nan"), -0.1, -0.1],
                     top=ref.top)
    assert compare_generation(ref, nan, 5).verdict == "error"


def test_decode_gaps_cover_matched_positions_only():
    ref = gen([1, 2, 3], lp=-0.5)
    trial = gen([1, 2, 99], lp=-0.7)
    cmp = compare_generation(ref, trial, 5)
    assert cmp.gaps == pytest.approx([0.2, 0.2])


def test_compare_forced_top1_and_gaps():
    ref = steps([1, 2, 3, 4], lp=-0.5)
    same = steps([1, 2, 3, 4], lp=-0.6)
    fc = compare_forced(ref, same)
    assert fc.top1_matches == 4 and fc.first_mismatch is None
    assert fc.gaps == pytest.approx([0.1] * 4)
    flipped = steps([1, 2, 3, 4], top1=[1, 9, 3, 4])
    fc = compare_forced(ref, flipped)
    assert fc.top1_matches == 3 and fc.first_mismatch == 1
    nan = [ForcedStep(token=1, logprob=float("nan"), top={1: -0.1})]
    fc = compare_forced(steps([1]), nan)
    assert fc.top1_matches == 0 and fc.gaps == [math.inf]
    with pytest.raises(ValueError, match="different continuations"):
        compare_forced(steps([1, 2]), steps([1, 3]))


# ------------------------------------------------------------------------ scoring


def test_agreeing_trial_passes_with_every_prompt_scored():
    ref = make_reference()
    res = score_reference(ref, answers(ref), ref_spec())
    assert res.passed and res.reason == "ok"
    assert [lvl.concurrency for lvl in res.levels] == [1, 8]
    assert len(res.scores) == 8 and all(s.verdict == "exact" for s in res.scores)
    high = res.levels[-1]
    assert high.forced_top1 == 1.0 and high.forced_positions == 32
    assert res.levels[0].forced_top1 is None  # teacher forcing runs at the highest level
    assert res.thresholds["min_close_fraction"] == 1.0


def test_one_far_prompt_fails_at_its_level_only():
    ref = make_reference()
    broken = gen([1, 2, 777, 778, 5, 6, 7, 8])
    res = score_reference(ref, answers(ref, override={("p0", 8): broken}), ref_spec())
    assert not res.passed
    assert res.levels[0].passed and not res.levels[1].passed
    assert "1/4 prompts not close at concurrency 8" in res.reason
    assert "p0: diverged at token 2" in res.reason
    row = next(s for s in res.scores if s.id == "p0" and s.concurrency == 8)
    assert row.verdict == "far" and row.trial_text is not None


def test_exact_fraction_applies_at_lowest_level_only():
    ref = make_reference(n_prompts=3)
    flips = {}
    for level in (1, 8):
        for pid in ("p0", "p1"):
            p = next(x for x in ref.prompts if x.id == pid)
            toks = list(p.generation.tokens)
            # A legitimate near-tie flip at the last position: close, not exact.
            alt = 100 + len(toks) - 1  # the reference's runner-up, 1 nat below: a near tie
            flips[(pid, level)] = gen(toks[:-1] + [alt], alts={len(toks) - 1: [toks[-1], 1, 2, 3]})
    # Unset, there is no exact rule: near-tie flips are numerics.
    assert score_reference(ref, answers(ref, override=flips), ref_spec()).passed
    res = score_reference(ref, answers(ref, override=flips), ref_spec(min_exact_fraction=0.66))
    assert res.levels[0].close == 2 and res.levels[0].exact == 1
    assert not res.levels[0].passed and res.levels[1].passed
    assert "only 1/3 prompts identical at concurrency 1 (0.33 < 0.66)" in res.reason
    # 2 of 3 exact = 0.67 passes the 0.66 rule.
    only_one = {k: v for k, v in flips.items() if k[0] == "p0"}
    assert score_reference(ref, answers(ref, override=only_one), ref_spec(min_exact_fraction=0.66)).passed


def test_errors_and_missing_answers_count_as_not_close():
    ref = make_reference(n_prompts=2)
    res = score_reference(ref, answers(ref, override={("p1", 1): "HTTP 500: boom"}), ref_spec())
    assert not res.passed and res.levels[0].errors == 1 and "HTTP 500" in res.reason
    partial = [a for a in answers(ref)
               if not (a.prompt_id == "p0" and a.concurrency == 8 and a.kind == "generate")]
    res = score_reference(ref, partial, ref_spec())
    assert not res.passed and "no answer recorded" in res.reason
    # A lenient spec may accept some far prompts.
    res = score_reference(ref, partial, ref_spec(min_close_fraction=0.5))
    assert res.passed


def test_teacher_forced_threshold_and_gap_gates():
    ref = make_reference(n_prompts=2, length=25)  # 50 forced positions
    p0 = ref.prompts[0]
    one_flip = steps(p0.generation.tokens, top1=[999] + p0.generation.tokens[1:])
    res = score_reference(ref, answers(ref, forced_override={"p0": one_flip}), ref_spec())
    assert res.passed and res.levels[-1].forced_top1 == pytest.approx(49 / 50)
    two = steps(p0.generation.tokens, top1=[999, 999] + p0.generation.tokens[2:])
    res = score_reference(ref, answers(ref, forced_override={"p0": two}), ref_spec())
    assert not res.passed and "teacher-forced agreement 0.960 < 0.980" in res.reason
    # Flips where the reference itself had a near tie count as agreement; flips of a
    # token it was confident about (1.9 nats above 999, as above) do not.
    tied = [ForcedStep(token=t, logprob=-0.5, top={t: -0.1, 999: -0.3})
            for t in p0.generation.tokens[:5]] + p0.forced[5:]
    ref = ref.model_copy(update={"prompts": [p0.model_copy(update={"forced": tied}),
                                             *ref.prompts[1:]]})
    near = [ForcedStep(token=t, logprob=-0.5, top={999: -0.1, t: -0.2})
            for t in p0.generation.tokens[:5]] + p0.forced[5:]
    res = score_reference(ref, answers(ref, forced_override={"p0": near}), ref_spec())
    assert res.passed, res.reason
    high = res.levels[-1]
    assert high.forced_top1 == pytest.approx(45 / 50) and high.forced_close == 1.0
    shifted = steps(p0.generation.tokens, lp=-0.9)  # reference has -0.5: gap 0.4
    res = score_reference(ref, answers(ref, forced_override={"p0": shifted}), ref_spec())
    assert res.passed and res.levels[-1].forced_gap_max == pytest.approx(0.4)
    res = score_reference(ref, answers(ref, forced_override={"p0": shifted}),
                          ref_spec(max_gap=0.3))
    assert not res.passed and "max reference-token |delta logprob| 0.4000 > 0.3" in res.reason
    missing = [a for a in answers(ref) if a.kind != "forced" or a.prompt_id != "p1"]
    res = score_reference(ref, missing, ref_spec())
    assert not res.passed and "p1: no answer recorded" in res.reason


def test_score_rejects_caller_bugs():
    ref = make_reference(n_prompts=1)
    with pytest.raises(ValueError, match="unknown"):
        score_reference(ref, [ReferenceAnswer(prompt_id="zz", concurrency=1, kind="generate",
                                              error="x")], ref_spec())
    with pytest.raises(ValueError, match="unexpected concurrency"):
        score_reference(ref, answers(ref, levels=(1, 4)), ref_spec())
    dup = answers(ref)
    with pytest.raises(ValueError, match="two generate"):
        score_reference(ref, dup + dup[:1], ref_spec())


# -------------------------------------------------------------- storing a reference


def test_reference_json_round_trip_and_mismatch():
    spec = ProbeSpec()
    sources = reference_sources(spec, user_items(spec))
    prompts = [ReferencePrompt(id=s.id, source=s.source, fingerprint=s.fingerprint(),
                               preview=s.preview(), prompt_ids=[1, 2], generation=gen([5, 6]),
                               forced=steps([5, 6])) for s in sources]
    ref = Reference(model="m", max_tokens=32, top_k=5, teacher_forced=True,
                    forced_max_prompt_tokens=256, prompts=prompts)
    text = json.dumps(ref.model_dump(mode="json"))
    back = Reference.model_validate_json(text)
    assert back == ref and back.prompts[0].generation.top[0][5] == -0.1  # int keys again
    spec = ProbeSpec(reference={"max_tokens": 32})
    assert back.mismatch(spec, sources, "m") is None
    assert "model" in back.mismatch(spec, sources, "other")
    fewer = ProbeSpec(max_tokens=16, reference={"max_tokens": 16})
    assert "reference.max_tokens changed (32 recorded, 16 now)" == back.mismatch(fewer, sources,
                                                                                   "m")
    assert "prompt set changed" in back.mismatch(spec, reference_sources(
        spec, user_items(spec, QUESTIONS[1:])), "m")


# ----------------------------------------------------------- trusting the reference


def known_result(correct_fraction: float, *, error: bool = False):
    spec = ProbeSpec()
    items = user_items(spec)
    n_right = round(correct_fraction * len(items))
    out = []
    for level in spec.concurrency:
        for i, item in enumerate(items):
            if error and i == 0:
                out.append(ProbeAnswer(item_id=item.id, concurrency=level, error="HTTP 500"))
                continue
            text = item.expected if i < n_right else "no idea"
            out.append(ProbeAnswer(item_id=item.id, concurrency=level, text=text,
                                   finish_reason="stop"))
    return score(items, out, spec)


def test_validate_reference():
    good = known_result(1.0)
    ref = make_reference()
    assert validate_reference(good) is None
    assert validate_reference(good, reference=ref,
                              self_check=score_reference(ref, answers(ref), ref_spec())) is None
    weak = validate_reference(known_result(0.25))
    assert weak is not None and "cannot be trusted" in weak and "lower probe.min_accuracy" in weak
    erred = validate_reference(known_result(0.96, error=True))
    assert erred is not None and "HTTP 500" in erred
    empty = ref.model_copy(update={"prompts": [ref.prompts[0].model_copy(
        update={"generation": Generation(tokens=[], logprobs=[], top=[])})]})
    assert "no tokens" in validate_reference(good, reference=empty)
    nan_ref = ref.model_copy(update={"prompts": [ref.prompts[0].model_copy(
        update={"forced": [ForcedStep(token=1, logprob=float("nan"), top={1: -0.1})]})]})
    assert "NaN" in validate_reference(good, reference=nan_ref)
    unstable = score_reference(ref, answers(ref, override={("p0", 1): gen([9, 9])}), ref_spec())
    msg = validate_reference(good, reference=ref, self_check=unstable)
    assert msg is not None and "does not agree with itself" in msg
    from tuner.probe.known_score import ProbeResult
    assert "disabled" in validate_reference(ProbeResult.disabled())


def test_with_reference_accuracy():
    spec = ProbeSpec()
    result = known_result(0.5)
    updated = with_reference_accuracy(spec, result)
    assert updated.reference_accuracy == pytest.approx(0.5) and spec.reference_accuracy is None
    explicit = ProbeSpec(reference_accuracy=0.9)
    assert with_reference_accuracy(explicit, result).reference_accuracy == 0.9
    # On resume the stored reference carries the same number.
    stored = make_reference().model_copy(update={"known_answers_accuracy": 0.25})
    assert with_reference_accuracy(spec, stored).reference_accuracy == 0.25
    assert with_reference_accuracy(spec, make_reference()).reference_accuracy is None


def test_combine_needs_both_layers():
    ka_ok, ka_bad = known_result(1.0), known_result(0.25)
    ref = make_reference(n_prompts=1)
    ref_ok = score_reference(ref, answers(ref), ref_spec())
    ref_bad = score_reference(ref, answers(ref, override={("p0", 1): gen([9])}), ref_spec())
    both = combine(ka_ok, ref_ok, probe_seconds=3.5)
    assert both.passed and both.reason == "ok" and both.probe_seconds == 3.5
    assert both.summary() == {"probe_s": 3.5, "known_accuracy": 1.0, "reference_close": 1.0,
                              "reference_exact_c1": 1.0, "reference_forced_top1": 1.0,
                              "reference_forced_gap_max": 0.0}
    r = combine(ka_ok, ref_bad)
    assert not r.passed and r.reason.startswith("reference: ")
    r = combine(ka_bad, ref_bad)
    assert not r.passed and r.reason.startswith("known answers: ") and "; reference: " in r.reason
    r = combine(ka_ok, None, reference_note="no reference recorded for this study")
    assert r.passed and r.reason == "ok (no reference recorded for this study)"
    dumped = json.loads(json.dumps(both.model_dump(mode="json")))
    assert dumped["reference"]["levels"][0]["concurrency"] == 1


# ------------------------------------------------------- one request for both layers


def _recorded(spec: ProbeSpec, sources) -> Reference:
    prompts = [ReferencePrompt(id=src.id, source=src.source, fingerprint=src.fingerprint(),
                               preview=src.preview(), prompt_ids=[1, 2, n],
                               generation=gen([5, 6, n])) for n, src in enumerate(sources)]
    return Reference(model="m", max_tokens=16, top_k=5, teacher_forced=False,
                     forced_max_prompt_tokens=256, prompts=prompts)


def test_shared_prompts_pair_each_question_with_its_recorded_chat_form():
    spec = ProbeSpec()
    items = user_items(spec)
    ref = _recorded(spec, reference_sources(spec, items))
    pairs = shared_prompts(spec, items, ref)
    assert sorted(pairs) == sorted(i.id for i in items if i.api == "chat")
    assert pairs["line1-chat"].id == "ka-line1"
    # A recorded prompt whose text is not the item's (another question) lends it nothing.
    other = user_items(spec, [QUESTIONS[0], ("What is 2 + 2?", "4", "number"), *QUESTIONS[2:]])
    assert shared_prompts(spec, other, ref) == {
        i.id: pairs[i.id] for i in other if i.id in pairs and i.prompt in
        {j.prompt for j in items}}
    assert shared_prompts(spec, other, ref) != pairs


def test_truncate_generation_is_the_shorter_request():
    long = gen([1, 2, 3, 4, 5], finish="stop")
    cut = truncate_generation(long, 3)
    assert cut.tokens == [1, 2, 3] and cut.top == long.top[:3] and cut.finish_reason == "length"
    assert truncate_generation(long, 5) is long and truncate_generation(long, 9) is long
    recorded = gen([1, 2, 3])
    assert compare_generation(recorded, cut, 5).verdict == "exact"
    # An answer that stopped before the recorded length is still compared as it is.
    assert compare_generation(recorded, truncate_generation(gen([1, 2], finish="stop"), 3),
                              5).verdict == "far"


# --------------------------------------------------- single-stream subset, forced set


def recorded_like(spec: ProbeSpec) -> tuple[list, Reference]:
    """A reference shaped like a real recording of ``spec``: known-answer questions in
    chat form (short continuations), the open prompts (16 tokens), with forms and forcing."""
    items = user_items(spec)
    prompts = []
    for n, source in enumerate(reference_sources(spec, items)):
        text = source.prompt if source.messages is None else source.messages[-1].content
        ids = list(range(1, 2 + len(text) // 4))
        length = 16 if source.source == "open" else 6
        toks = [1000 + 20 * n + j for j in range(length)]
        prompts.append(ReferencePrompt(
            id=source.id, source=source.source,
            form="chat" if source.messages is not None else "text",
            fingerprint=source.fingerprint(), preview=source.preview(), prompt_ids=ids,
            generation=gen(toks), forced=steps(toks) if len(ids) <= 256 else None))
    return items, Reference(model="m", max_tokens=16, top_k=5, teacher_forced=True,
                            forced_max_prompt_tokens=256, prompts=prompts)


def test_retired_single_stream_is_refused_and_dropped_from_a_saved_spec():
    with pytest.raises(ValidationError, match=r"single_stream: 'subset': a key of the retired template probe"):
        ProbeSpec(single_stream="subset")
    saved = ProbeSpec.model_validate({"single_stream": "full"}, context={"saved": True})
    assert saved == ProbeSpec() and "single_stream" not in saved.model_dump()
    assert ReferenceSpec().forced_prompts == "open"
    with pytest.raises(ValidationError, match="'open' or 'all'"):
        ReferenceSpec(forced_prompts="known")


def test_forced_prompts_open_all_and_fallback():
    spec = ProbeSpec()
    _, ref = recorded_like(spec)
    assert forced_prompt_ids(ref, spec.reference) == {f"open{n}-{f}" for n, (f, _) in enumerate(OPEN_PROMPTS)}
    every = {p.id for p in ref.prompts if p.forced is not None}
    assert "ka-line1" not in every  # too long to force
    assert forced_prompt_ids(ref, ReferenceSpec(forced_prompts="all")) == every
    no_open = ref.model_copy(update={"prompts": [p for p in ref.prompts
                                                 if p.source == "known_answer"]})
    assert forced_prompt_ids(no_open, spec.reference) == {
        p.id for p in no_open.prompts if p.forced is not None}
    assert forced_prompt_ids(ref, ReferenceSpec(teacher_forced=False)) == set()


def test_subset_level_scores_its_prompts_and_the_exact_rule_moves_up():
    ref = make_reference(n_prompts=4)
    flips = {}
    for level in (1, 8):
        p = ref.prompts[0]
        toks = list(p.generation.tokens)
        flips[("p0", level)] = gen(toks[:-1] + [107], alts={7: [toks[-1], 1, 2, 3]})
    subset = {1: {"p0", "p1"}}
    sent = [a for a in answers(ref, override=flips)
            if a.concurrency != 1 or a.prompt_id in subset[1]]
    res = score_reference(ref, sent, ref_spec(min_exact_fraction=0.66), asked=subset)
    # 1 of 2 exact at concurrency 1 would fail the 66 % rule there; it is held at 8 (3/4).
    assert res.passed, res.reason
    single, batched = res.levels
    assert single.subset and single.prompts == 2 and single.close == 1
    assert not batched.subset and batched.prompts == 4 and batched.exact == 3
    assert {s.id for s in res.scores if s.concurrency == 1} == {"p0", "p1"}
    # Every subset prompt must still be close: a far one fails its level.
    broken = dict(flips)
    broken[("p1", 1)] = gen([99] * 8)
    sent = [a for a in answers(ref, override=broken)
            if a.concurrency != 1 or a.prompt_id in subset[1]]
    res = score_reference(ref, sent, ref_spec(), asked=subset)
    assert not res.passed and "1/2 prompts not close at concurrency 1" in res.reason
    with pytest.raises(ValueError, match="not asked at 1"):
        score_reference(ref, answers(ref), ref_spec(), asked=subset)
