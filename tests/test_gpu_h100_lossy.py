"""The committed lossy-knob study on a real H100 (``results/examples/smollm2-h100-lossy``,
2026-12-07 19:46 UTC, vLLM 0.26.0, SmolLM2-135M-Instruct in bf16): the bf16 baseline, an fp8
KV cache and online fp8 weights under a 5-point accuracy budget. What issue 36 asked of the
GPU: each fp8 knob judged by the quality gate against the bf16 reference, with its speed,
its drop and bound, its verdict and what the gate cost. Everything is read back from the
trial files and re-derived with the tuner's own code where it can be."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.gpu_records import reparsed_startup
from tuner.probe.quality_stats import PairedCounts, QualityRecord, drop_interval, look_confidence, look_sizes
from tuner.store.handle import open_existing
from tuner.store.records import read_records

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "results" / "examples"
NAME = "smollm2-h100-lossy"
STUDY = EXAMPLES / NAME
LOSSY = {"0001": ("kv_cache_dtype", "fp8"), "0002": ("quantization", "fp8")}


def _json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _outcome(trial: str) -> dict[str, Any]:
    return _json(STUDY / "trials" / trial / "outcome.json")


def test_it_ran_on_an_h100_and_every_lossy_knob_was_applied() -> None:
    assert "NVIDIA H100 80GB HBM3" in (STUDY / "study.json").read_text(encoding="utf-8")
    for trial, (target, value) in LOSSY.items():
        checks = {c["target"]: c for c in _json(STUDY / "trials" / trial / "verification.json")["checks"]}
        assert checks[target]["got"] == value and checks[target]["status"] == "applied"
    # The fp8 KV cache holds twice the tokens in the same memory, read again from vLLM's log.
    tokens = {t: reparsed_startup(STUDY / "trials" / t)["kv_cache_tokens"] for t in ("0000", "0001", "0002")}
    assert tokens["0001"] / tokens["0000"] == pytest.approx(2.0, rel=0.01)
    assert tokens["0002"] / tokens["0000"] == pytest.approx(1.0, rel=0.01)


def test_both_fp8_knobs_passed_the_loosened_corruption_rule_then_the_gate() -> None:
    budget = 0.05
    for trial in LOSSY:
        outcome = _outcome(trial)
        assert outcome["status"] == "completed" and outcome["probe_passed"]
        probe = _json(STUDY / "trials" / trial / "probe.json")
        levels = probe["reference"]["levels"]
        assert sum(level["corrupt"] for level in levels) == 0
        record = QualityRecord.model_validate(outcome["quality"])
        assert record.verdict == "pass" and record.drop_high < budget == record.budget
        assert record.items == 200 and record.looks == 1 and not record.decided_at_cap
        assert record.reference_accuracy == pytest.approx(0.40)
        assert record.drop == pytest.approx(record.reference_accuracy - record.trial_accuracy)
        # The gate's asking took seconds of the trial's probe time on the GPU.
        assert 0 < record.probe_s < outcome["probe_s"] < 5


def _tables(record: QualityRecord) -> list[PairedCounts]:
    """Every paired table of ``record.items`` items with its two accuracies whose interval, at
    the first look's share of the error, is the one stored: the record was written before the
    table itself was kept, so the test finds the tables it can have come from."""

    n = record.items
    ref_right, trial_right = round(record.reference_accuracy * n), round(record.trial_accuracy * n)
    max_items = yaml.safe_load((STUDY / "spec.yaml").read_text(encoding="utf-8"))["quality"]["max_items"]
    planned = len(look_sizes(n, max_items))
    found = []
    for ref_only in range(0, ref_right + 1):
        both_right = ref_right - ref_only
        trial_only = trial_right - both_right
        both_wrong = n - both_right - ref_only - trial_only
        if trial_only < 0 or both_wrong < 0:
            continue
        counts = PairedCounts(both_right=both_right, ref_only=ref_only, trial_only=trial_only, both_wrong=both_wrong)
        _, low, high = drop_interval(counts, look_confidence(record.confidence, planned))
        if abs(low - record.drop_low) < 1e-12 and abs(high - record.drop_high) < 1e-12:
            found.append(counts)
    return found


@pytest.mark.parametrize("trial", sorted(LOSSY))
def test_each_stored_interval_is_newcombes_for_exactly_one_paired_table(trial: str) -> None:
    record = QualityRecord.model_validate(_outcome(trial)["quality"])
    tables = _tables(record)
    assert len(tables) == 1, tables
    # What it says about the two sides: the drop moved only on the items they disagreed on.
    (table,) = tables
    assert table.ref_only + table.trial_only > 0


def test_the_front_holds_both_fp8_trials_with_speed_beside_the_drop() -> None:
    handle = open_existing(EXAMPLES, NAME)
    records = read_records(handle.load())
    by_number = {r.number: r for r in records if r.kind == "run"}
    speed = {n: r.measured_values()["output_tok_s@cmax"] for n, r in by_number.items()}
    # A 135M model on an H100 is host-bound: the fp8 knobs move c=32 throughput by a few per
    # cent, inside the study's 12 % between-start noise (gpu-8b.md has them on an 8B model).
    assert 6000 < speed[0] < 9000
    for n in (1, 2):
        assert abs(speed[n] / speed[0] - 1) < 0.12
    pareto = _json(STUDY / "pareto.json")
    front = {entry["trial"]: entry for entry in pareto["front"]}
    assert {1, 2} <= front.keys()
    # The drop's noise on the front is the gate's own interval, not the between-start noise.
    for n in (1, 2):
        record = by_number[n].summary.quality
        assert record is not None
        assert front[n]["noise"]["accuracy_drop"] == pytest.approx(
            max(record.drop - record.drop_low, record.drop_high - record.drop))


def test_energy_was_read_from_nvml_at_every_level() -> None:
    # The study names no energy objective, so no idle draw; every level still has joules per
    # token from the GPU's own energy counter (issue 40's source, on a real GPU).
    for trial in ("0000", "0001", "0002"):
        outcome = _outcome(trial)
        assert outcome["energy"]["source"] == "NVML: GPU 0 energy counter"
        for level in outcome["levels"].values():
            assert 0.005 < level["joules_per_token"] < 1.0 and 50 < level["watts"] < 700
        # Thirty-two requests in flight spread the GPU's draw over far more tokens.
        assert outcome["levels"]["32"]["joules_per_token"] < outcome["levels"]["1"]["joules_per_token"] / 10
