"""The fake tokenizer and language model: determinism, probe families, n-gram drafting."""

import pytest

from tuner.sim.model import (
    TOKENIZER,
    NgramIndex,
    chat_prompt,
    count_accepted,
    plan_output,
    prompt_logprobs,
    top_candidates,
    words_to_int,
)
from tuner.sim.tokenizer import EOS_ID


def answer(question, **kw):
    prompt = chat_prompt([{"role": "user", "content": question}])
    plan = plan_output(prompt, TOKENIZER.encode(prompt), max_tokens=kw.pop("max_tokens", 64),
                       ignore_eos=kw.pop("ignore_eos", False), **kw)
    return "".join(plan.pieces), plan


def test_tokenizer_round_trip_and_stable_ids():
    text = "Hello,  world!\n\tWhat is 37 + 48? naïve café_x 1234567"
    ids = TOKENIZER.encode(text)
    assert TOKENIZER.decode(ids) == text
    assert TOKENIZER.encode("What is 37 + 48?") == TOKENIZER.encode("What is 37 + 48?")
    assert TOKENIZER.pieces(" the cat") == [" the", " cat"]
    assert all(0 <= i < 49152 for i in ids)
    # arbitrary ids (vLLM's random dataset) decode to text of about the same token count
    # (pieces without a leading space glue onto the previous word, as with real BPE)
    assert abs(len(TOKENIZER.encode(TOKENIZER.decode(list(range(40000, 40050))))) - 50) <= 5


@pytest.mark.parametrize("question,expected", [
    ("What is 37 + 48? Answer with the number only.", "85"),
    ("Quick one: what is 90 - 123?", "-33"),
    ("What is 12 * 12?", "144"),
    ("Repeat the following line exactly:\nZebras quietly juggle 42 neon umbrellas.",
     "Zebras quietly juggle 42 neon umbrellas."),
    ("Write this number in digits: four hundred and twelve", "412"),
    ("Write this number in digits: seven million, forty-two thousand and nine", "7042009"),
    ("What is the capital of France?", "Paris"),
    ("Tell me: what is the capital of Japan? One word please.", "Tokyo"),
])
def test_probe_families_answered_then_eos(question, expected):
    text, plan = answer(question, temperature=0.0)
    assert text.strip().lower() == expected.lower()
    assert plan.ids[-1] == EOS_ID and plan.finish_reason == "stop"


def test_long_context_lookup_and_ignore_eos_filler():
    lines = "\n".join(f"key k{i} = v{i * 13 % 997}" for i in range(300))
    text, _ = answer(f"{lines}\nWhat is the value of key k217?")
    assert text.strip() == f"v{217 * 13 % 997}"
    text, plan = answer("What is 2 + 2?", ignore_eos=True, max_tokens=40)
    assert text.strip().startswith("4") and len(plan.ids) == 40 and EOS_ID not in plan.ids
    assert plan.finish_reason == "length"


def test_words_to_int():
    assert words_to_int("twenty-one") == 21
    assert words_to_int("a hundred and one") == 101
    assert words_to_int("one million two hundred thousand") == 1_200_000
    assert words_to_int("banana") is None


def test_open_prompts_have_natural_deterministic_length():
    t1, p1 = answer("Tell me something about rivers.")
    t2, _ = answer("Tell me something about rivers.")
    assert t1 == t2 and 20 <= len(p1.ids) - 1 <= 200
    t3, _ = answer("Tell me something about mountains.")
    assert t3 != t1


def test_sampling_is_seeded_and_garble_changes_content_not_shape():
    q = "Describe a quiet morning in a small town."
    g, _ = answer(q, temperature=0.0)
    s1, _ = answer(q, temperature=1.0, seed=7)
    s2, _ = answer(q, temperature=1.0, seed=7)
    assert s1 == s2 and s1 != g
    text, plan = answer("What is 37 + 48?")
    plan.garble(0, salt=123)
    bad = "".join(plan.pieces).strip()
    assert bad != "85" and bad.isdigit() and plan.ids[-1] == EOS_ID


def test_copy_heavy_prompts_copy_spans_so_ngram_drafts_hit():
    passage = ("The committee met on Tuesday to review the budget for the new library and "
               "agreed that the reading room should stay open until nine in the evening while "
               "the archive moves to the second floor of the old town hall next spring.")
    prompt = chat_prompt([{"role": "user", "content": "Rewrite this passage, fixing typos:\n"
                           + passage}])
    ids = TOKENIZER.encode(prompt)
    plan = plan_output(prompt, ids, max_tokens=200, ignore_eos=False)
    assert plan.family == "copy"
    idx = NgramIndex(ids, 2, 4)
    accepted = drafted = 0
    pos = 0
    while pos < len(plan.ids):
        draft = idx.propose(4)
        acc = count_accepted(draft, plan.ids[pos:pos + 4])
        drafted += len(draft)
        accepted += acc
        idx.extend(plan.ids[pos:pos + acc + 1])
        pos += acc + 1
    assert drafted and accepted / drafted > 0.5


def test_logprob_distributions_are_stable_and_ranked():
    a = top_candidates(99, 3, 1234, 5, salt=1)
    b = top_candidates(99, 3, 1234, 5, salt=1)
    c = top_candidates(99, 3, 1234, 5, salt=2)
    assert a == b and a[0][0] == 1234
    assert [x[0] for x in a] == [x[0] for x in c]          # other configs: same ranking
    assert max(abs(x[1] - y[1]) for x, y in zip(a, c)) < 2e-3   # tiny numeric differences
    assert all(a[i][1] > a[i + 1][1] for i in range(4))
    plp = prompt_logprobs(TOKENIZER.encode("one two three four"), 2, 0, corrupt=False)
    assert plp[0] is None and len(plp) == 4 and all(len(e) >= 2 for e in plp[1:])
