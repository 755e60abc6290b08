"""The bank probe against real simulator processes (issue 14): a reference recorded as a
study records it, then prompt-dependent faults - one length bucket, one decode batch size,
one wording of a fact, the second turn of a chat - each caught with evidence, and a correct
server passing. ``benchmarks/probe_faults_sim.py`` runs the same 20 times per fault (its
results of the retired template probe missed every one of them)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.test_probe_sim import MODEL, SimProc
from tuner.probe.client import load_probe_items
from tuner.probe.record import Reference
from tuner.probe.recording import load_reference_sources, record_reference
from tuner.probe.spec import ProbeSpec, fit_to_study
from tuner.probe.trial import reference_known_answers, run_trial_probe
from tuner.probe.verdict import CorrectnessResult, validate_reference

# A study whose load tops out at 16 concurrent requests, on a 4096-token context.
SPEC = fit_to_study(ProbeSpec(), top_concurrency=16, max_model_len=4096)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    logs = tmp_path_factory.mktemp("bank-sims")
    items = load_probe_items(SPEC)
    sim = SimProc(logs, argv=("--enforce-eager",))
    try:
        ref = asyncio.run(record_reference(sim.url, MODEL, SPEC,
                                           sources=load_reference_sources(SPEC, items=items)))
        known = reference_known_answers(SPEC, items, ref)
        ref = ref.model_copy(update={"known_answers_accuracy": known.accuracy})
        check = asyncio.run(run_trial_probe(sim.url, MODEL, SPEC, reference=ref, items=items))
    finally:
        sim.stop()
    assert validate_reference(known, reference=ref, self_check=check) is None
    assert check.coverage is not None and check.coverage.batch_sizes == [1, 2, 4, 8, 16]
    return ref


def _probe(tmp_path: Path, ref: Reference, fault: dict | None, seed: int) -> CorrectnessResult:
    # A tenth of real time: the level's requests overlap in the engine as on a real server.
    sim = SimProc(tmp_path, faults=[fault] if fault else None, time_scale=0.1)
    try:
        return asyncio.run(run_trial_probe(sim.url, MODEL, SPEC, reference=ref, sample_seed=seed))
    finally:
        sim.stop()


def test_correct_server_passes_and_records_what_it_covered(tmp_path: Path, reference) -> None:
    result = _probe(tmp_path, reference, None, seed=7)
    assert result.passed, result.reason
    cov = result.coverage
    assert cov is not None and cov.batch_sizes == [1, 2, 4, 8, 16]
    assert cov.strata >= 20 and cov.buckets_covered == len(cov.buckets)
    assert max(cov.prompt_tokens) > 1024 and cov.compared_positions > 200
    assert result.sample_seed == 7


@pytest.mark.parametrize(
    ("fault", "where"),
    [
        ({"fault": "garbage_when_prompt_in", "low": 512, "high": 1024}, "retrieval"),
        ({"fault": "garbage_when_batch_eq", "batch": 16}, "batch 16"),
        ({"fault": "garbage_for_wording", "pattern": "^which city"}, "ka-b-fact-w1"),
        ({"fault": "garbage_on_turn", "turn": 2}, "multi_turn"),
    ],
    ids=["length-bucket", "batch-size", "wording", "second-turn"],
)
def test_prompt_dependent_corruption_is_caught_with_evidence(
    tmp_path: Path, reference, fault: dict, where: str
) -> None:
    for seed in (1, 2):
        result = _probe(tmp_path, reference, fault, seed)
        assert not result.passed, (fault, seed)
        assert result.reference is not None and result.reference.corrupt
        assert "confident token replaced" in result.reason
        assert any(where in line for line in result.reference.corrupt), result.reference.corrupt
