"""The quality gate's items and the reference's record of them (tuner.probe.quality_items),
and the status line of a quality verdict (tuner.probe.quality_text)."""

from __future__ import annotations

from collections import Counter

import pytest

from tuner.probe.bank import build_pool
from tuner.probe.quality_items import QualityAnswer, QualityReference, prompt_hash, quality_items
from tuner.probe.quality_text import quality_line
from tuner.probe.spec import BankSpec, ProbeSpec


def test_items_are_deterministic_and_a_shorter_list_is_a_prefix() -> None:
    probe = ProbeSpec()
    full = quality_items(probe, 800)
    assert len(full) == 800
    assert [i.id for i in quality_items(probe, 800)] == [i.id for i in full]
    # A trial's first look is the first `items` of the reference's list, whatever max_items is.
    assert [i.id for i in quality_items(probe, 200)] == [i.id for i in full[:200]]


def test_items_are_distinct_questions_other_than_the_probe_pool() -> None:
    probe = ProbeSpec()
    items = quality_items(probe, 800)
    assert len({prompt_hash(i) for i in items}) == len(items)
    assert all(i.id.startswith("q-") for i in items)
    pool = build_pool(probe.seed, probe.bank.families, probe.bank.per_stratum,
                      max_prompt_tokens=probe.bank.max_prompt_tokens)
    # Drawn with a seed of their own: mostly other questions than every trial's probe samples.
    shared = {prompt_hash(i) for i in items} & {prompt_hash(i) for i in pool}
    assert len(shared) < len(pool) / 2


def test_every_look_is_spread_over_every_family() -> None:
    probe = ProbeSpec()
    first = quality_items(probe, 70)
    counts = Counter(i.family for i in first)
    assert set(counts) == set(probe.bank.families)
    # One of each family in turn: no family takes more than its even share (plus one).
    assert max(counts.values()) <= 70 // len(counts) + 1
    fact = [i.stratum for i in quality_items(probe, 700) if i.family == "fact"][:6]
    assert len(set(fact)) == 6, fact   # each wording of a family in turn too


def test_another_seed_or_bank_gives_other_items() -> None:
    base = [prompt_hash(i) for i in quality_items(ProbeSpec(), 50)]
    assert [prompt_hash(i) for i in quality_items(ProbeSpec(seed=1), 50)] != base
    only = quality_items(ProbeSpec(bank=BankSpec(families=("fact", "arithmetic"))), 40)
    assert {i.family for i in only} == {"fact", "arithmetic"}


def test_the_list_is_capped_by_the_distinct_questions_and_a_bad_count_refused() -> None:
    probe = ProbeSpec(bank=BankSpec(families=("code",)))
    assert len(quality_items(probe, 10_000)) < 200
    with pytest.raises(ValueError, match="count must be >= 1"):
        quality_items(probe, 0)


def _record(items: list, right: list[bool]) -> QualityReference:
    answers = [QualityAnswer(id=i.id, prompt_hash=prompt_hash(i), right=r) for i, r in zip(items, right)]
    return QualityReference(seed=0, answers=answers)


def test_a_stored_record_pairs_only_with_the_same_items() -> None:
    items = quality_items(ProbeSpec(), 30)
    record = _record(items, [n % 3 != 0 for n in range(30)])
    assert record.accuracy == pytest.approx(20 / 30)
    assert record.mismatch(items) is None
    assert "holds 30 items, the study asks 40" in (record.mismatch(quality_items(ProbeSpec(), 40)) or "")
    other = quality_items(ProbeSpec(seed=5), 30)
    assert "differs from the recorded" in (record.mismatch(other) or "")
    assert QualityReference(seed=0, answers=[]).accuracy == 0.0


def test_quality_line_says_verdict_drop_bound_budget_and_items() -> None:
    raw = {"items": 400, "reference_accuracy": 0.62, "trial_accuracy": 0.605, "drop": 0.015,
           "drop_low": -0.004, "drop_high": 0.031, "confidence": 0.95, "budget": 0.05, "verdict": "pass",
           "decided_at_cap": False, "looks": 2, "probe_s": 12.0,
           "lossy": {"kv_cache_dtype": {"value": "fp8", "reason": "an fp8 KV cache ..."}}}
    line = quality_line(raw)
    assert line.startswith("quality PASS: drop 1.5 pts [-0.4, 3.1] (95%), budget 5.0 pts, 400 items (2 looks)")
    assert "accuracy 0.605 vs reference 0.620" in line and "lossy: kv_cache_dtype=fp8" in line
    assert "disagreed" not in line          # a record from before the paired table was kept
    paired = quality_line({**raw, "pairs": {"both_right": 230, "ref_only": 18, "trial_only": 12,
                                            "both_wrong": 140}})
    assert ("accuracy 0.605 vs reference 0.620 (disagreed on 30: 18 only the reference right, "
            "12 only the trial)") in paired
    capped = quality_line({**raw, "verdict": "fail", "decided_at_cap": True, "looks": 1})
    assert capped.startswith("quality FAIL:") and "(1 look)" in capped and "undecided at max_items" in capped
