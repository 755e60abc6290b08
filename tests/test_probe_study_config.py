"""How a study gets its reference configuration and its probe files (pure, no processes):
the reference is the baseline made conservative, and prompts files are resolved and
checked before anything starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tuner.engine.referencing import resolve_probe_files
from tuner.errors import SpecError
from tuner.probe.prompts_file import PromptsFileError, ReferencePromptsError
from tuner.study.command import reference_configuration
from tuner.study.space import trial_command
from tuner.study.study_file import parse_study

ROOT = Path(__file__).resolve().parents[1]


def study(**changes) -> object:
    data = yaml.safe_load((ROOT / "search_spaces" / "demo.yaml").read_text())
    data["server"]["flags"]["compilation_config"] = {"mode": 3}  # a fixed compiler setting
    data["baseline"] = {"enforce_eager": False, "cudagraph_mode": "FULL", "nccl_proto": "LL",
                        "spec_method": "ngram", "spec_k": 3}
    for dotted, value in changes.items():
        node = data
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return parse_study(yaml.safe_dump(data), "demo-test.yaml")


def _config_arg(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_reference_is_the_baseline_made_conservative() -> None:
    spec = study()
    baseline_argv = trial_command(spec, {"enforce_eager": False, "cudagraph_mode": "FULL",
                                            "nccl_proto": "LL", "spec_method": "ngram", "spec_k": 3}).argv
    assert _config_arg(baseline_argv, "--speculative-config") is not None
    assert json.loads(_config_arg(baseline_argv, "--compilation-config")) == {
        "mode": 3, "cudagraph_mode": "FULL"}

    ref = reference_configuration(spec, port=19000, python="python")
    # Eager, and neither the fixed compiler setting nor the baseline's graphs or drafter.
    assert "--enforce-eager" in ref.argv and "--no-enforce-eager" not in ref.argv
    assert "--compilation-config" not in ref.argv and "--speculative-config" not in ref.argv
    assert ref.asked["enforce_eager"] is True
    assert not any(t.startswith(("compilation_config", "speculative_config")) for t in ref.asked)
    # Everything else is the baseline's: the NCCL protocol, the fixed flags and env, the port.
    assert ref.env["NCCL_PROTO"] == "LL" and ref.env["TUNER_SIM_PROFILE"] == "glm5-8xpcie"
    assert _config_arg(ref.argv, "--tensor-parallel-size") == "8"
    assert _config_arg(ref.argv, "--port") == "19000"
    assert ref.values["nccl_proto"] == "LL"
    assert "eager" in ref.label and "no speculation" in ref.label


def test_reference_values_override_the_baseline_and_are_checked() -> None:
    ref = reference_configuration(study(**{"probe.reference.values": {"nccl_proto": None}}))
    assert "NCCL_PROTO" not in ref.env and ref.values["nccl_proto"] is None
    assert "nccl_proto=unset" in ref.label
    with pytest.raises(SpecError, match=r"unknown parameter\(s\) \['nccl_protocol'\]"):
        reference_configuration(study(**{"probe.reference.values": {"nccl_protocol": "LL"}}))


def test_non_conservative_reference_keeps_the_baseline_as_is() -> None:
    ref = reference_configuration(study(**{"probe.reference.conservative": False}))
    assert "--no-enforce-eager" in ref.argv
    assert json.loads(_config_arg(ref.argv, "--compilation-config"))["mode"] == 3
    assert ref.label == "baseline"


def test_prompt_files_resolve_against_the_study_folder(tmp_path: Path) -> None:
    (tmp_path / "known.jsonl").write_text(json.dumps(
        {"prompt": "What is 2 + 2? Answer with the number only.", "expected": 4, "check": "number"}) + "\n")
    (tmp_path / "ref.jsonl").write_text(json.dumps({"id": "mine", "prompt": "Once there was"}) + "\n")
    spec = study(**{"probe.prompts_file": "known.jsonl", "probe.reference.prompts_file": "ref.jsonl"})
    probe = resolve_probe_files(spec.probe, tmp_path)
    assert probe.prompts_file == str(tmp_path / "known.jsonl")
    assert probe.reference.prompts_file == str(tmp_path / "ref.jsonl")
    # Absolute paths stay as they are (a resumed study's saved spec already has them).
    assert resolve_probe_files(probe, Path("/elsewhere")) == probe


def test_bad_prompt_files_stop_before_anything_starts(tmp_path: Path) -> None:
    (tmp_path / "ref.jsonl").write_text('{"prompt": "fine"}\n{"prompt": 3}\nnot json\n')
    spec = study(**{"probe.reference.prompts_file": "ref.jsonl"})
    with pytest.raises(ReferencePromptsError) as info:
        resolve_probe_files(spec.probe, tmp_path)
    assert "line 2" in str(info.value) and "line 3: not valid JSON" in str(info.value)
    missing = study(**{"probe.prompts_file": "nope.jsonl"})
    with pytest.raises(PromptsFileError, match="cannot read"):
        resolve_probe_files(missing.probe, tmp_path)
    # With the reference layer off its file is not read at all.
    off = study(**{"probe.reference.prompts_file": "ref.jsonl", "probe.reference.enabled": False})
    assert resolve_probe_files(off.probe, tmp_path).reference.enabled is False


def test_probe_cost_settings_are_checked_with_field_value_and_allowed() -> None:
    data = yaml.safe_load((ROOT / "search_spaces" / "smollm2-cpu.yaml").read_text())
    spec = parse_study(yaml.safe_dump(data), "smollm2-cpu.yaml")
    assert spec.probe.concurrency == (1, 8)
    assert spec.probe.reference.forced_prompts == "open"
    data["probe"]["reference"] = {"forced_prompts": "known"}
    with pytest.raises(SpecError) as err:
        parse_study(yaml.safe_dump(data), "smollm2-cpu.yaml")
    assert "probe.reference.forced_prompts: Input should be 'open' or 'all' (got 'known')" in str(err.value)
    # The template probe's single-stream subset went with it (issue 37): one line says so.
    data["probe"] = {"single_stream": "some"}
    with pytest.raises(SpecError) as err:
        parse_study(yaml.safe_dump(data), "smollm2-cpu.yaml")
    assert "single_stream: 'some': a key of the retired template probe (issue 37); remove it" in str(err.value)


@pytest.mark.parametrize("name", ["smollm2-h200.yaml", "smollm2-cpu.yaml"])
def test_unset_probe_rules_stay_unset_through_the_saved_spec(name: str) -> None:
    """A run and a resume judge trials with the spec loaded back from spec.yaml, where every
    field is written out. The bank's "no exact-answer rule" and "force every prompt the
    reference forced" must survive that: on the H200 the exact rule, switched on by the
    round trip, rejected full CUDA graphs whose every divergence was a near tie."""
    from tuner.secrets import public_spec

    spec = parse_study((ROOT / "search_spaces" / name).read_text(), name)
    saved = yaml.safe_dump(public_spec(spec).model_dump(mode="json"), sort_keys=False)
    again = parse_study(saved, "spec.yaml").probe.reference
    assert again.min_exact_fraction is None and again.forced_prompts == "open"
    assert again == spec.probe.reference
