"""The reference-only probe against simulator processes serving ``--load-format dummy``
(issue 34): random weights answer no known-answer question, so a full probe would fail a
correct server, while the reference comparison still passes a clean one and rejects
garbage - with the simulator's flat dummy logprobs, where no token is "confident" and only
a token outside the reference's top-k can show corruption (docs/probe.md, dummy weights)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.test_probe_sim import MODEL, SimProc
from tuner.probe.client import load_probe_items
from tuner.probe.known_score import ProbeResult
from tuner.probe.record import Reference
from tuner.probe.recording import load_reference_sources, record_reference
from tuner.probe.spec import ProbeSpec, fit_to_study, resolve_mode
from tuner.probe.trial import reference_known_answers, run_trial_probe
from tuner.probe.verdict import CorrectnessResult, validate_reference

FULL = fit_to_study(ProbeSpec(), top_concurrency=8, max_model_len=4096)
SPEC = resolve_mode(FULL, dummy_weights=True)
DUMMY = ("--enforce-eager", "--load-format", "dummy")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    logs = tmp_path_factory.mktemp("dummy-sims")
    items = load_probe_items(SPEC)
    sim = SimProc(logs, argv=DUMMY)
    try:
        ref = asyncio.run(record_reference(sim.url, MODEL, SPEC, sources=load_reference_sources(SPEC, items=items)))
        check = asyncio.run(run_trial_probe(sim.url, MODEL, SPEC, reference=ref, items=items))
    finally:
        sim.stop()
    assert "load_format=dummy" in sim.log_path.read_text()
    assert ref.mode == "reference_only" and ref.known_answers_accuracy is None
    # Dummy weights answer nonsense: held to min_accuracy the reference would be refused...
    known = reference_known_answers(FULL, items, ref)
    assert known.accuracy < 0.2 and not known.passed
    assert validate_reference(known, reference=ref, self_check=check) is not None
    # ...while the reference-only check trusts it: it agrees with itself at every batch size.
    assert check.passed and check.mode == "reference_only", check.reason
    assert validate_reference(ProbeResult.not_judged(), reference=ref, self_check=check,
                              reference_only=True) is None
    return ref


def _probe(tmp_path: Path, ref: Reference, fault: dict | None, *, spec: ProbeSpec = SPEC,
           argv: tuple[str, ...] = DUMMY) -> CorrectnessResult:
    sim = SimProc(tmp_path, faults=[fault] if fault else None, argv=argv, time_scale=0.1)
    try:
        return asyncio.run(run_trial_probe(sim.url, MODEL, spec, reference=ref, sample_seed=3))
    finally:
        sim.stop()


def test_clean_dummy_server_passes_reference_only(tmp_path: Path, reference: Reference) -> None:
    result = _probe(tmp_path, reference, None, argv=("--load-format", "dummy"))
    assert result.passed, result.reason
    assert result.mode == "reference_only"
    assert result.reason == "ok (reference-only: known answers not judged)"
    assert result.known_answers.skipped and result.summary()["known_accuracy"] is None
    assert result.coverage is not None and result.coverage.batch_sizes == [1, 2, 4, 8]
    # Every position compared; the flat top-k is not held to an overlap.
    assert result.reference is not None
    assert all(level.top_k_overlap is None for level in result.reference.levels)
    assert result.coverage.compared_positions > 100


@pytest.mark.parametrize("fault", [{"fault": "garbage"}, {"fault": "garbage_when_batch_eq", "batch": 8}])
def test_garbage_on_dummy_weights_is_rejected(tmp_path: Path, reference: Reference, fault: dict) -> None:
    result = _probe(tmp_path, reference, fault)
    assert not result.passed
    assert result.reason.startswith("reference: ") and "known answers" not in result.reason, result.reason
    assert "outside the top-" in result.reason and "corrupt" in result.reason


def test_real_weights_do_not_pass_against_a_dummy_reference(tmp_path: Path, reference: Reference) -> None:
    # What a trial that loaded other weights than the reference's looks like: every answer differs.
    result = _probe(tmp_path, reference, None, argv=("--enforce-eager",))
    assert not result.passed and result.reason.startswith("reference: "), result.reason
