"""The probe's mode (issue 34): on dummy weights (load_format: dummy) known answers cannot be
judged, so ``probe.mode: auto`` turns reference-only there; what each mode judges, and the
one-line errors for settings that leave nothing to judge (pure, no processes)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tuner.engine.referencing import study_probe
from tuner.errors import SpecError
from tuner.probe.known_score import NOT_JUDGED, ProbeResult
from tuner.probe.numerics import flat, judge
from tuner.probe.record import Generation, Reference, ReferencePrompt
from tuner.probe.recording import load_reference_sources
from tuner.probe.spec import DUMMY_TEXT, ProbeSpec, mode_text, resolve_mode
from tuner.probe.verdict import combine, validate_reference
from tuner.study.study_file import parse_study
from tuner.study.weights import dummy_weights

ROOT = Path(__file__).resolve().parents[1]


def study(flags: dict | None = None, probe: dict | None = None, params: list | None = None,
          command: list | None = None) -> object:
    data = yaml.safe_load((ROOT / "search_spaces" / "demo.yaml").read_text())
    data["server"]["flags"].update(flags or {})
    data["probe"].update(probe or {})
    data["parameters"] += params or []
    if command is not None:
        data["server"]["command"] = command
    return parse_study(yaml.safe_dump(data), "mode-test.yaml")


def test_auto_resolves_by_the_weights_and_defaults_to_full() -> None:
    assert ProbeSpec().mode == "auto" and not ProbeSpec().reference_only
    assert resolve_mode(ProbeSpec(), dummy_weights=True).mode == "reference_only"
    assert resolve_mode(ProbeSpec(), dummy_weights=False).mode == "full"
    # An explicit choice is kept where it makes sense; a disabled probe is left alone.
    assert resolve_mode(ProbeSpec(mode="reference_only"), dummy_weights=False).reference_only
    off = ProbeSpec(enabled=False, mode="full")
    assert resolve_mode(off, dummy_weights=True) is off


def test_settings_that_cannot_judge_dummy_weights_are_one_line_errors() -> None:
    with pytest.raises(ValueError, match=r"^probe\.mode: full judges known answers, which dummy weights"):
        resolve_mode(ProbeSpec(mode="full"), dummy_weights=True)
    with pytest.raises(ValueError, match=r"probe\.reference\.enabled is false"):
        resolve_mode(ProbeSpec(reference={"enabled": False}), dummy_weights=True)
    with pytest.raises(ValueError, match="mode reference_only needs the reference comparison"):
        ProbeSpec(mode="reference_only", reference={"enabled": False})
    # Without dummy weights, no reference is fine: known answers alone.
    assert resolve_mode(ProbeSpec(reference={"enabled": False}), dummy_weights=False).mode == "full"


def test_a_study_file_says_what_is_wrong_in_one_line() -> None:
    cases = [
        ({"flags": {"load_format": "dummy"}, "probe": {"mode": "full"}},
         "mode-test.yaml: probe.mode: full judges known answers, which dummy weights (load_format: dummy) "
         "cannot answer; use auto or reference_only"),
        ({"flags": {"load_format": "dummy"}, "probe": {"reference": {"enabled": False}}},
         "probe.reference.enabled is false; turn the reference on, or the probe off (probe.enabled: false)"),
        ({"probe": {"mode": "sometimes"}},
         "probe.mode: Input should be 'auto', 'full' or 'reference_only' (got 'sometimes')"),
        ({"params": [{"name": "weights", "flag": "load_format", "kind": "categorical",
                      "values": [None, "dummy"]}]},
         "parameters: 'weights' searches load_format over dummy and null (the server's default)"),
    ]
    for changes, said in cases:
        with pytest.raises(SpecError) as err:
            study(**changes)
        assert said in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_dummy_weights_are_read_from_flags_parameters_and_the_command() -> None:
    assert not dummy_weights(study())
    assert dummy_weights(study(flags={"load_format": "dummy"}))
    assert not dummy_weights(study(flags={"load_format": "safetensors"}))
    only_dummy = [{"name": "weights", "flag": "load_format", "kind": "categorical", "values": ["dummy"],
                   "default": "dummy"}]
    assert dummy_weights(study(params=only_dummy))
    real_formats = [{"name": "weights", "flag": "load_format", "kind": "categorical",
                     "values": ["safetensors", "fastsafetensors"], "default": "safetensors"}]
    assert not dummy_weights(study(params=real_formats))
    for command in (["{python}", "-m", "tuner.sim", "--load-format", "dummy"],
                    ["{python}", "-m", "tuner.sim", "--load-format=dummy"]):
        assert dummy_weights(study(command=command))


def test_the_study_probe_is_resolved_for_its_weights() -> None:
    spec = study(flags={"load_format": "dummy"})
    assert spec.probe.mode == "auto"
    probe = study_probe(spec, spec.probe)
    assert probe.reference_only and probe.bank.top_concurrency == max(spec.load.concurrency)
    assert mode_text(probe, dummy_weights=True) == DUMMY_TEXT
    assert mode_text(study_probe(study(), study().probe), dummy_weights=False) is None


def test_reference_only_verdict_neither_judges_nor_fails_known_answers() -> None:
    known = ProbeResult.not_judged()
    assert known.passed and known.skipped and known.reason == NOT_JUDGED
    verdict = combine(known, None, reference_only=True)
    assert verdict.passed and verdict.mode == "reference_only"
    assert verdict.reason == "ok (reference-only: known answers not judged)"
    assert verdict.summary()["known_accuracy"] is None
    # A full probe with the known-answer layer off still says so, as before.
    assert combine(ProbeResult.disabled(), None).reason == "probe disabled"
    assert combine(ProbeResult.disabled(), None).mode == "full"


def _reference(mode: str, spec: ProbeSpec) -> Reference:
    prompts = [
        ReferencePrompt(id=s.id, source=s.source, form="chat" if s.messages else "text",
                        fingerprint=s.fingerprint(), preview="",
                        prompt_ids=[1, 2, 3],
                        generation=Generation(tokens=[5], logprobs=[-0.1], top=[{5: -0.1}], finish_reason="length"))
        for s in load_reference_sources(spec)
    ]
    return Reference(model="m", max_tokens=spec.generated_tokens(), top_k=5, teacher_forced=True,
                     forced_max_prompt_tokens=256, prompts=prompts, mode=mode)


def test_a_reference_is_trusted_without_known_answers_only_in_reference_only_mode() -> None:
    spec = ProbeSpec()
    ref = _reference("reference_only", spec)
    known = ProbeResult.not_judged()
    assert validate_reference(known, reference=ref, reference_only=True) is None
    refused = validate_reference(known, reference=ref)
    assert refused is not None and "known-answer probe is disabled" in refused
    # Everything else is still checked: a reference that produced nothing is refused.
    empty = ref.model_copy(update={"prompts": [ref.prompts[0].model_copy(update={
        "generation": Generation(tokens=[], logprobs=[], top=[], finish_reason="length")})]})
    assert "produced no tokens" in (validate_reference(known, reference=empty, reference_only=True) or "")


def test_a_stored_reference_of_the_other_mode_is_recorded_again() -> None:
    spec = ProbeSpec()
    sources = load_reference_sources(spec)
    dummy = resolve_mode(spec, dummy_weights=True)
    real = resolve_mode(spec, dummy_weights=False)
    assert _reference("reference_only", spec).mismatch(dummy, sources, "m") is None
    assert _reference("full", spec).mismatch(real, sources, "m") is None
    why = _reference("reference_only", spec).mismatch(real, sources, "m")
    assert why == "stored reference was recorded for probe mode reference_only, the study now runs full"
    assert _reference("full", spec).mismatch(dummy, sources, "m") is not None


def test_flat_reference_top_k_is_not_compared_but_a_replaced_token_still_is() -> None:
    # Measured on SmolLM2-135M with dummy weights (benchmarks/dummy_weights.py): five tokens
    # within one float32 step of -10.8027, the uniform logprob over 49,152 tokens.
    dummy_top = {3107: -10.802672386169434, 23094: -10.80267333984375, 13156: -10.80267333984375,
                 20165: -10.80267333984375, 10119: -10.80267333984375}
    assert flat(dummy_top, 5)
    # Real weights: the narrowest top-5 measured spanned 0.52 nats.
    assert not flat({1: -0.1, 2: -0.3, 3: -0.4, 4: -0.5, 5: -0.62}, 5)
    # On the flat top-k a token outside it is still corruption; one inside, a tie.
    assert judge(dummy_top, 3107, -10.802672386169434, 999, 5, 1.0).kind == "corrupt"
    assert judge(dummy_top, 3107, -10.802672386169434, 20165, 5, 1.0).kind == "near_tie"
