"""Lossy knobs under a quality budget, at load (issue 36): the knob table, the ``quality:``
section, the refusals of ``tuner validate`` before any server starts, and the trial metric
``accuracy_drop``."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT, run_tuner
from tuner.errors import SpecError
from tuner.study import objectives, scoring, trials
from tuner.study.early_stop import TRIAL_LEVEL
from tuner.study.outcome_summary import OutcomeSummary
from tuner.study.policy import target_level
from tuner.study.quality import QualitySpec, lossy_settings
from tuner.study.spec import StudySpec
from tuner.study.study_file import parse_study
from tuner.study.trial_metrics import TRIAL_METRIC_DIRECTION, TRIAL_METRICS, trial_metric_value
from tuner.vllm.lossy import lossy_reason

KV = {"name": "kv_dtype", "flag": "kv_cache_dtype", "kind": "categorical", "values": ["auto", "fp8"],
      "default": "auto"}
BASE: dict[str, Any] = {
    "name": "q",
    "server": {"command": ["{python}", "-m", "tuner.sim"], "model": "m", "gpus_per_trial": 1},
    "parameters": [
        {"name": "eager", "flag": "enforce_eager", "kind": "bool"},
        KV,
    ],
    "load": {"concurrency": [1, 4]},
    "quality": {"max_accuracy_drop": 0.02},
}


def study(**changes: Any) -> dict[str, Any]:
    """BASE with top-level sections replaced (None: removed)."""
    data = copy.deepcopy(BASE)
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    return data


def parse(data: dict[str, Any]) -> StudySpec:
    return parse_study(yaml.safe_dump(data, sort_keys=False), "study.yaml")


def error_of(data: dict[str, Any]) -> str:
    with pytest.raises(SpecError) as info:
        parse(data)
    return str(info.value)


# ------------------------------------------------------------------------- the knob table


def test_knob_table() -> None:
    assert lossy_reason("kv_cache_dtype", "fp8") == "an fp8 KV cache stores keys and values in 8 bits"
    assert lossy_reason("kv_cache_dtype", "fp8_e5m2") == "an fp8 KV cache stores keys and values in 8 bits"
    assert "bfloat16" in (lossy_reason("kv_cache_dtype", "bfloat16") or "")
    assert lossy_reason("kv_cache_dtype", "auto") is None
    assert lossy_reason("kv_cache_dtype", None) is None
    assert "quantizes the weights" in (lossy_reason("quantization", "fp8") or "")
    assert "quantizes the weights" in (lossy_reason("quantization", "awq") or "")
    assert lossy_reason("quantization", None) is None
    assert lossy_reason("enforce_eager", True) is None
    assert lossy_reason("env:KV_CACHE_DTYPE", "fp8") is None


# ------------------------------------------------------------------------ quality: itself


def test_valid_spec_loads_with_defaults() -> None:
    spec = parse(study())
    assert spec.quality == QualitySpec(max_accuracy_drop=0.02)
    assert (spec.quality.confidence, spec.quality.items, spec.quality.max_items,
            spec.quality.min_reference_accuracy) == (0.95, 200, 800, 0.5)
    full = parse(study(quality={"max_accuracy_drop": 0.05, "confidence": 0.9, "items": 20, "max_items": 20,
                                "min_reference_accuracy": 0.0}))
    assert full.quality is not None and full.quality.items == full.quality.max_items == 20
    # Without lossy values a study needs no budget, and has none.
    assert parse(study(quality=None, parameters=[BASE["parameters"][0]])).quality is None


@pytest.mark.parametrize(("field", "value", "allowed"), [
    ("max_accuracy_drop", 0, "above 0 and below 1"),
    ("max_accuracy_drop", 1.5, "above 0 and below 1"),
    ("confidence", 0.5, "above 0.5 and below 1"),
    ("confidence", 1.0, "above 0.5 and below 1"),
    ("items", 19, "20 or more"),
    ("min_reference_accuracy", 1.2, "from 0 to 1"),
    ("min_reference_accuracy", -0.1, "from 0 to 1"),
])
def test_bad_field_names_field_value_and_allowed(field: str, value: Any, allowed: str) -> None:
    text = error_of(study(quality={"max_accuracy_drop": 0.02, field: value}))
    shown = repr(value if field == "items" else float(value))
    assert f"quality.{field}: {shown} is not allowed" in text and allowed in text
    assert len(text.splitlines()) == 1


def test_cap_below_first_look_and_missing_budget_and_unknown_key() -> None:
    text = error_of(study(quality={"max_accuracy_drop": 0.02, "items": 300, "max_items": 200}))
    assert "max_items: 200" in text and "at least items (300)" in text
    assert "quality.max_accuracy_drop" in error_of(study(quality={"items": 300}))
    text = error_of(study(quality={"max_accuracy_drop": 0.02, "budget": 3}))
    assert "unknown key 'budget'" in text and "max_accuracy_drop" in text and "min_reference_accuracy" in text
    text = error_of(study(quality={"max_accuracy_drop": 0.02, "max_items": 1_000_000}))
    assert "quality.max_items" in text and "safety.bounds" in text


# ------------------------------------------------------------------------ lossy values


def test_lossy_value_without_budget_is_refused_in_one_line() -> None:
    text = error_of(study(quality=None))
    assert text == ("study.yaml: parameters[1] (kv_dtype): 'fp8' is lossy (an fp8 KV cache stores keys and "
                    "values in 8 bits); add quality: {max_accuracy_drop: 0.02} to search it under an accuracy "
                    "budget, or drop the value")


def test_a_saved_spec_from_before_the_budget_still_opens() -> None:
    # A study's own spec.yaml, written when fp8 was searched without a budget (its fp8
    # trials failed the probe): status, report and export must still read it.
    text = yaml.safe_dump(study(quality=None, baseline={"kv_dtype": "fp8"}), sort_keys=False)
    assert parse_study(text, "spec.yaml", saved=True).quality is None
    with pytest.raises(SpecError, match="baseline: kv_dtype"):
        parse_study(text, "spec.yaml")
    dummy = study(server={**BASE["server"], "flags": {"load_format": "dummy"}})
    with pytest.raises(SpecError, match="dummy weights"):
        parse_study(yaml.safe_dump(dummy), "spec.yaml", saved=True)


def test_quantization_without_budget_is_refused() -> None:
    quant = {"name": "quant", "flag": "quantization", "kind": "categorical", "values": [None, "fp8"]}
    text = error_of(study(quality=None, parameters=[quant]))
    assert "parameters[0] (quant): 'fp8' is lossy" in text and "quantizes the weights" in text
    assert parse(study(parameters=[quant])).parameters[0].lossy is None


def test_validate_cli_refuses_lossy_value_without_budget(tmp_path: Path) -> None:
    path = tmp_path / "lossy.yaml"
    path.write_text(yaml.safe_dump(study(quality=None), sort_keys=False))
    out = run_tuner("validate", str(path), timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert str(path) in lines[0] and "parameters[1] (kv_dtype): 'fp8' is lossy" in lines[0]
    assert "add quality: {max_accuracy_drop: 0.02}" in lines[0]
    path.write_text(yaml.safe_dump(study(), sort_keys=False))
    ok = run_tuner("validate", str(path), timeout=120)
    assert ok.returncode == 0, ok.stderr


def test_baseline_must_be_lossless() -> None:
    text = error_of(study(baseline={"kv_dtype": "fp8"}))
    assert "baseline: kv_dtype = 'fp8' is lossy (an fp8 KV cache" in text
    assert "quality reference" in text and "set baseline.kv_dtype to 'auto'" in text
    # Without a budget too: the reference is refused first, whatever the rest.
    assert "baseline: kv_dtype" in error_of(study(baseline={"kv_dtype": "fp8"}, quality=None))
    # A default is the baseline's value when the baseline does not list the parameter.
    fp8_default = {**KV, "default": "fp8"}
    assert "baseline: kv_dtype = 'fp8' is lossy" in error_of(study(parameters=[fp8_default]))


def test_user_marking_overrides_the_table() -> None:
    # lossy: true on a knob the table does not know: every value but the baseline's.
    marked = {"name": "seqs", "flag": "max_num_seqs", "kind": "categorical", "values": [64, 128], "default": 64,
              "lossy": True}
    text = error_of(study(quality=None, parameters=[marked]))
    assert text.startswith("study.yaml: parameters[0] (seqs): 128 is lossy (the parameter is marked lossy: true")
    assert "add quality:" in text
    assert parse(study(parameters=[marked])).parameters[0].lossy is True
    # The baseline's own value is the reference, lossless by definition.
    only_baseline = {**marked, "values": [64]}
    assert parse(study(quality=None, parameters=[only_baseline])).quality is None
    ranged = {"name": "seqs", "flag": "max_num_seqs", "kind": "int", "low": 64, "high": 256, "default": 64,
              "lossy": True}
    assert "parameters[0] (seqs): 256 is lossy" in error_of(study(quality=None, parameters=[ranged]))
    # lossy: false: e.g. the quantization a checkpoint is stored in loses nothing.
    unmarked = {**KV, "lossy": False}
    spec = parse(study(quality=None, parameters=[unmarked], baseline={"kv_dtype": "fp8"}))
    assert spec.parameters[0].lossy is False
    assert "parameters[0] (kv_dtype).lossy" in error_of(study(parameters=[{**KV, "lossy": "maybe"}]))


def test_lossy_settings_of_a_configuration() -> None:
    marked = {"name": "seqs", "flag": "max_num_seqs", "kind": "int", "low": 64, "high": 256, "default": 64,
              "lossy": True}
    spec = parse(study(parameters=[BASE["parameters"][0], KV, marked]))
    assert lossy_settings(spec, {"eager": True, "kv_dtype": "auto", "seqs": 64}) == {}
    assert lossy_settings(spec, {"eager": False, "kv_dtype": "fp8", "seqs": 128}) == {
        "kv_dtype": ("fp8", "an fp8 KV cache stores keys and values in 8 bits"),
        "seqs": (128, "the parameter is marked lossy: true, and 128 is not the baseline's 64")}
    assert lossy_settings(spec, {"eager": False}) == {}


# ------------------------------------------------------------- where answers cannot be judged


def test_quality_with_dummy_weights_is_refused() -> None:
    server = {**BASE["server"], "flags": {"load_format": "dummy"}}
    text = error_of(study(server=server))
    assert "quality: the server loads dummy weights (load_format: dummy)" in text and "remove quality:" in text
    assert len(text.splitlines()) == 1


def test_quality_without_known_answers_is_refused() -> None:
    assert "probe.enabled is false" in error_of(study(probe={"enabled": False}))
    assert "probe.mode is reference_only" in error_of(study(probe={"mode": "reference_only"}))


# ------------------------------------------------------------------ the trial metric


def test_one_list_of_trial_metrics() -> None:
    assert TRIAL_METRICS == ("startup_s", "probe_s", "trial_s", "accuracy_drop")
    assert objectives.TRIAL_METRICS is scoring.TRIAL_METRICS is TRIAL_METRICS
    assert set(TRIAL_METRIC_DIRECTION.values()) == {"minimize"}


def test_accuracy_drop_objective_needs_quality() -> None:
    drop = [{"metric": "output_tok_s", "direction": "maximize"},
            {"metric": "accuracy_drop", "direction": "minimize"}]
    text = error_of(study(quality=None, parameters=[BASE["parameters"][0]], objectives=drop))
    assert "objectives: accuracy_drop needs a quality: section" in text and "max_accuracy_drop" in text
    text = error_of(study(quality=None, parameters=[BASE["parameters"][0]],
                          limits=[{"metric": "accuracy_drop", "max": 0.01}]))
    assert "limits: accuracy_drop needs a quality: section" in text
    spec = parse(study(objectives=drop, limits=[{"metric": "accuracy_drop", "max": 0.01}]))
    assert [o.label for o in spec.objectives] == ["output_tok_s@cmax", "accuracy_drop"]
    assert spec.limits[0].label == "accuracy_drop<=0.01"
    # Known after the probe, before the load levels: planned at the trial level, as startup_s.
    assert target_level(spec, spec.objectives[1]) == TRIAL_LEVEL == target_level(spec, spec.limits[0])


def test_accuracy_drop_objective_direction_and_level() -> None:
    up = [{"metric": "accuracy_drop", "direction": "maximize"}]
    assert "accuracy_drop can only be minimized" in error_of(study(objectives=up))
    at = [{"metric": "accuracy_drop", "direction": "minimize", "rate": 2.0}]
    assert "trial-level metric; remove rate" in error_of(study(objectives=at))


def test_accuracy_drop_read_from_the_quality_record() -> None:
    class Record:
        drop = 0.0125

    class Outcome:
        startup_s = 12.5
        quality = Record()

    assert trial_metric_value(Outcome(), "accuracy_drop") == 0.0125
    assert trial_metric_value(Outcome(), "startup_s") == 12.5
    assert trial_metric_value(Outcome(), "probe_s") is None
    assert trial_metric_value(type("Stored", (), {"quality": {"drop": 0.03}})(), "accuracy_drop") == 0.03
    # An outcome without a quality record (no lossy value, or written before the gate): a
    # lossless trial loses nothing against the reference by construction (docs/probe.md).
    summary = OutcomeSummary.from_attr({"startup_s": 30.0})
    assert trial_metric_value(summary, "accuracy_drop") == 0.0
    assert trials.label_measured("accuracy_drop", summary) and trials.label_measured("startup_s", summary)


@pytest.mark.parametrize("path", sorted((ROOT / "search_spaces").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_search_spaces_still_validate(path: Path) -> None:
    spec = parse_study(path.read_text(), str(path))
    # Issue 36's evidence, lossy values under a budget: on the GPU (fp8 KV cache and fp8
    # weights) and on the CPU build (fp8 KV cache, and bfloat16 marked lossy by the study).
    lossy_studies = {"smollm2-h100-lossy.yaml": {"kv_cache_dtype", "quantization"},
                     "smollm2-cpu-lossy.yaml": {"kv_cache_dtype", "dtype"}}
    if path.name in lossy_studies:
        assert spec.quality is not None and spec.quality.max_accuracy_drop == 0.05
        assert {p.name for p in spec.parameters} == lossy_studies[path.name]
        return
    assert spec.quality is None and all(p.lossy is None for p in spec.parameters)
