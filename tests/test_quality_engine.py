"""The quality gate's engine side without servers: which trials get a plan and a loosened
corruption rule (tuner.study.quality_plan), the stored verdict (tuner.engine.quality_run.
gate_record), how a verdict is told (constraint ``quality``, outcome ``quality_failed``, the
metric ``accuracy_drop``), and the reference's quality answers kept, reused and checked
(tuner.engine.referencing)."""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from tuner.adapters.artifacts import StudyPaths
from tuner.engine import referencing
from tuner.engine.quality_run import gate_record
from tuner.errors import StudyError
from tuner.probe.numerics import judge
from tuner.probe.quality_items import QualityAnswer, QualityReference, prompt_hash, quality_items
from tuner.probe.quality_stats import LossyValue, PairedCounts, QualityRecord, drop_interval, look_confidence
from tuner.probe.spec import ProbeSpec
from tuner.study import scoring, trials
from tuner.study.outcome import TrialOutcome, TrialRequest
from tuner.study.outcome_summary import OutcomeSummary
from tuner.study.quality import QualitySpec
from tuner.study.quality_plan import QualityPlan, loosened_probe, quality_plan, reference_plan
from tuner.study.spec import StudySpec
from tuner.study.study_file import parse_study

STUDY: dict[str, Any] = {
    "name": "q",
    "server": {"command": ["{python}", "-m", "tuner.sim"], "model": "m", "gpus_per_trial": 1},
    "parameters": [
        {"name": "kv", "flag": "kv_cache_dtype", "kind": "categorical", "values": ["auto", "fp8"],
         "default": "auto"},
        {"name": "quant", "flag": "quantization", "kind": "categorical", "values": [None, "fp8"]},
        {"name": "seqs", "flag": "max_num_seqs", "kind": "categorical", "values": [64, 128], "default": 64,
         "lossy": True},
    ],
    "load": {"concurrency": [1, 4]},
    "objectives": [{"metric": "output_tok_s", "direction": "maximize"},
                   {"metric": "accuracy_drop", "direction": "minimize"}],
    "quality": {"max_accuracy_drop": 0.05, "items": 20, "max_items": 40},
}
LOSSLESS = {"kv": "auto", "quant": None, "seqs": 64}
PLAIN = {"quality": None, "objectives": STUDY["objectives"][:1],
         "parameters": [{"name": "seqs", "flag": "max_num_seqs", "kind": "categorical", "values": [64, 128],
                         "default": 64}]}


def parse(**changes: Any) -> StudySpec:
    data = copy.deepcopy(STUDY)
    data.update(changes)
    return parse_study(yaml.safe_dump(data, sort_keys=False), "study.yaml")


def _reference(n: int = 40, right: int = 30) -> QualityReference:
    items = quality_items(ProbeSpec(), n)
    return QualityReference(seed=0, answers=[QualityAnswer(id=i.id, prompt_hash=prompt_hash(i), right=k < right)
                                             for k, i in enumerate(items)])


# -- which trials are gated, and how their corruption rule is loosened --------------------------


def test_only_a_lossy_trial_of_a_quality_study_gets_a_plan() -> None:
    spec, reference = parse(), _reference()
    assert quality_plan(spec, LOSSLESS, reference) is None
    plan = quality_plan(spec, {**LOSSLESS, "kv": "fp8", "seqs": 128}, reference)
    assert plan is not None and plan.reference == reference and plan.spec == spec.quality
    assert set(plan.lossy) == {"kv", "seqs"}
    assert plan.lossy["kv"].value == "fp8" and "8 bits" in plan.lossy["kv"].reason
    assert "lossy: true" in plan.lossy["seqs"].reason
    assert reference_plan(spec) == QualityPlan(spec=spec.quality)
    plain = parse(**PLAIN)
    assert quality_plan(plain, {"seqs": 128}, reference) is None and reference_plan(plain) is None


def test_the_plan_travels_in_the_trial_request_and_back() -> None:
    spec = parse()
    plan = quality_plan(spec, {**LOSSLESS, "quant": "fp8"}, _reference())
    request = TrialRequest(study="q", number=1, values={}, asked={}, argv=["x"], env={}, host="h", port=1,
                           served_model_name="m", trial_dir="/t", startup_timeout_s=1, stop_timeout_s=1,
                           deadline_s=1, load=spec.load, probe=spec.probe, ignore_eos=False, quality=plan)
    again = TrialRequest.model_validate(request.model_dump(mode="json"))
    assert again.quality == plan


def test_a_lossy_trial_gets_the_loosened_corruption_rule_never_a_stricter_one() -> None:
    spec = parse()
    plan = quality_plan(spec, {**LOSSLESS, "kv": "fp8"}, _reference())
    probe = ProbeSpec()
    loose = loosened_probe(probe, plan)
    assert loose.reference.near_tie_nats == 4.0 and loose.reference.min_prompt_top1 == 0.8
    assert loose.reference.outside_top_k_by_bound and not probe.reference.outside_top_k_by_bound
    assert loose.bank == probe.bank and loose.reference.max_corrupt == probe.reference.max_corrupt
    assert loosened_probe(probe, None) is probe
    lenient = ProbeSpec(reference={"near_tie_nats": 6.0, "min_prompt_top1": 0.5})
    kept = loosened_probe(lenient, plan).reference
    assert kept.near_tie_nats == 6.0 and kept.min_prompt_top1 == 0.5
    tuned = parse(quality={**STUDY["quality"], "lossy_near_tie_nats": 2.5, "lossy_min_prompt_top1": 0.9})
    own = loosened_probe(probe, quality_plan(tuned, {**LOSSLESS, "kv": "fp8"}, _reference())).reference
    assert own.near_tie_nats == 2.5 and own.min_prompt_top1 == 0.9


# -- the stored verdict ---------------------------------------------------------------------------


def _plan() -> QualityPlan:
    return QualityPlan(spec=QualitySpec(max_accuracy_drop=0.05, items=20, max_items=80),
                       lossy={"kv": LossyValue(value="fp8", reason="fp8")}, reference=_reference())


def test_gate_record_pass_fail_and_undecided_at_the_cap() -> None:
    plan = _plan()
    passed = gate_record(PairedCounts(both_right=600, ref_only=0, trial_only=0, both_wrong=200), plan,
                         looks=1, planned=3, probe_s=2.0)
    assert passed.verdict == "pass" and passed.drop == 0.0 and passed.drop_high <= 0.05
    assert passed.items == 800 and passed.looks == 1 and passed.probe_s == 2.0 and not passed.decided_at_cap
    assert passed.lossy == plan.lossy and passed.budget == 0.05 and passed.confidence == 0.95
    failed = gate_record(PairedCounts(both_right=40, ref_only=20, trial_only=0, both_wrong=20), plan,
                         looks=1, planned=3, probe_s=1.0)
    assert failed.verdict == "fail" and failed.drop_low > 0.05 and not failed.decided_at_cap
    capped = gate_record(PairedCounts(both_right=50, ref_only=3, trial_only=1, both_wrong=26), plan,
                         looks=3, planned=3, probe_s=1.0)
    assert capped.verdict == "fail" and capped.decided_at_cap
    assert capped.drop_low <= 0.05 < capped.drop_high


def test_the_record_keeps_its_paired_table_and_the_interval_rederives_from_it() -> None:
    counts = PairedCounts(both_right=50, ref_only=3, trial_only=1, both_wrong=26)
    stored = gate_record(counts, _plan(), looks=3, planned=3, probe_s=1.0).model_dump(mode="json")
    read = QualityRecord.model_validate(stored)
    assert read.pairs == counts
    assert drop_interval(read.pairs, look_confidence(read.confidence, 3)) == (read.drop, read.drop_low,
                                                                               read.drop_high)
    # A table that does not add up to the record's items is refused, not stored.
    with pytest.raises(ValueError, match="pairs: 81 paired items, but items is 80"):
        QualityRecord.model_validate({**stored, "pairs": {**stored["pairs"], "both_wrong": 27}})
    # Records written before the table was kept still read.
    assert QualityRecord.model_validate({k: v for k, v in stored.items() if k != "pairs"}).pairs is None


# -- how a verdict is told -------------------------------------------------------------------------


def _outcome(verdict: str | None, drop: float = 0.01) -> TrialOutcome:
    outcome = TrialOutcome(number=1, status="completed", probe_passed=True, applied=True,
                           levels={"4": {"output_tok_s": 100.0}})
    if verdict is not None:
        outcome.quality = gate_record(
            PairedCounts(both_right=600, ref_only=0, trial_only=0, both_wrong=200) if verdict == "pass"
            else PairedCounts(both_right=40, ref_only=20, trial_only=0, both_wrong=20),
            _plan(), looks=1, planned=3, probe_s=1.0)
    return outcome


def test_a_failed_gate_is_infeasible_as_quality_failed_with_its_speed_kept() -> None:
    spec = parse()
    bad = scoring.constraints(spec, _outcome("fail"))
    assert bad["quality"] == 1.0 and bad["probe"] == 0.0
    assert trials.outcome_word("COMPLETE", trials.KIND_RUN, bad, None) == "quality_failed"
    assert scoring.constraints(spec, _outcome("pass"))["quality"] == 0.0
    assert scoring.constraints(spec, _outcome(None))["quality"] == 0.0   # lossless: no gate
    assert "quality" not in scoring.constraints(parse(**PLAIN), _outcome(None))
    text = scoring.result_text(["output_tok_s@c4"], [100.0], _outcome("fail"), bad)
    assert "output_tok_s@c4=100" in text and "quality=drop 25.0 pts" in text and ": fail at 80 items" in text


def test_accuracy_drop_is_the_gates_drop_and_zero_for_a_lossless_trial() -> None:
    spec = parse()
    objective = spec.objectives[1]
    assert scoring.metric_value(spec, _outcome("fail"), objective) == pytest.approx(0.25)
    assert scoring.metric_value(spec, _outcome(None), objective) == 0.0
    summary = scoring.outcome_summary(_outcome("fail"))
    assert summary.quality is not None and summary.quality.verdict == "fail"
    stored = OutcomeSummary.from_attr(summary.as_attr())
    assert stored.quality == summary.quality
    assert "quality" not in scoring.outcome_summary(_outcome(None)).as_attr()


# -- the reference's answers: kept, reused, checked --------------------------------------------------


def _host(tmp_path: Path, spec: StudySpec) -> tuple[Any, list[str]]:
    said: list[str] = []
    paths = StudyPaths(tmp_path)
    return SimpleNamespace(spec=spec, name="q", paths=paths, progress=said.append), said


def test_a_reference_below_min_reference_accuracy_stops_the_study(tmp_path: Path) -> None:
    host, said = _host(tmp_path, parse(quality={**STUDY["quality"], "min_reference_accuracy": 0.8}))
    with pytest.raises(StudyError) as info:
        referencing._check_quality(host, _reference(40, right=20))
    text = str(info.value)
    assert "answered 0.50 of the 40 quality items right" in text
    assert "quality.min_reference_accuracy 0.8" in text and "quality_reference.json" in text
    referencing._check_quality(host, _reference(40, right=36))
    assert said and "0.90 of 40 answered right" in said[-1]


def test_the_stored_answers_are_reused_only_for_the_same_items(tmp_path: Path) -> None:
    spec = parse()
    host, said = _host(tmp_path, spec)
    probe = referencing.study_probe(spec, spec.probe)
    assert referencing._stored_quality(host, probe) is None   # none yet
    recorded = _reference(40)
    host.paths.quality_reference_json.write_text(recorded.model_dump_json())
    assert referencing._stored_quality(host, probe) == recorded
    host.spec = parse(quality={**STUDY["quality"], "max_items": 60})
    assert referencing._stored_quality(host, probe) is None
    assert "cannot be used (it holds 40 items, the study asks 60)" in said[-1]
    host.paths.quality_reference_json.write_text("{not json")
    assert referencing._stored_quality(host, probe) is None and "unreadable" in said[-1]


def test_a_quality_study_needs_the_reference_job() -> None:
    from tuner.errors import SpecError

    with pytest.raises(SpecError, match=r"quality: needs the probe's reference \(probe.reference.enabled is false\)"):
        parse(probe={"reference": {"enabled": False}})


# -- a token outside the reference's top-k -----------------------------------------------------------


def test_outside_the_top_k_is_judged_by_its_bound_only_for_a_lossy_trial() -> None:
    """The H100 case (2026-12-07, fp8 KV cache): the trial chose a token outside the bf16
    reference's top-5, whose five spanned 0.125 nats - a flat position, not a confident token
    replaced. A lossless trial still calls any token outside the top-k corruption; a lossy one
    only when the bound on its gap is past the loosened near tie (garbage: nats below)."""

    flat_top = {18: -1.000, 7: -1.025, 9: -1.05, 11: -1.1, 13: -1.125}
    confident_top = {18: -0.01, 7: -6.0, 9: -6.5, 11: -7.0, 13: -7.5}
    strict = judge(flat_top, 18, -1.0, 1933, 5, 1.0)
    assert strict.kind == "corrupt" and strict.gap_at_least == pytest.approx(0.125)
    loose = judge(flat_top, 18, -1.0, 1933, 5, 4.0, outside_by_bound=True)
    assert (loose.kind, loose.gap, loose.rank) == ("near_tie", None, None)
    assert loose.gap_at_least == pytest.approx(0.125)
    garbage = judge(confident_top, 18, -0.01, 1933, 5, 4.0, outside_by_bound=True)
    assert garbage.kind == "corrupt" and garbage.gap_at_least == pytest.approx(7.49)
