"""The whole correctness probe (known answers + reference agreement) against real simulator
processes: a reference recorded once from a conservative configuration, then trials that
are correct, obviously broken, or broken only in ways the known answers miss."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.sim_process import wait_ready
from tuner.probe.client import load_probe_items
from tuner.probe.record import Reference
from tuner.probe.recording import ReferenceRecordError, load_reference_sources, record_reference
from tuner.probe.spec import OPEN_PROMPTS, ProbeSpec
from tuner.probe.trial import reference_known_answers, run_trial_probe
from tuner.probe.verdict import CorrectnessResult, validate_reference, with_reference_accuracy

ROOT = Path(__file__).resolve().parents[1]
MODEL = "smollm2"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SimProc:
    """One ``python -m tuner.sim`` in its own process group; ``stop`` kills the group."""

    def __init__(self, log_dir: Path, *, profile: str = "tiny-cpu", faults=None,
                 argv: tuple[str, ...] = (), env: dict[str, str] | None = None,
                 time_scale: float = 0.01) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"sim-{self.port}.log"
        full_env = {**os.environ, "PYTHONPATH": str(ROOT), "TUNER_SIM_PROFILE": profile,
                    "TUNER_SIM_TIME_SCALE": str(time_scale), "TUNER_SIM_STARTUP_SCALE": "0.0005",
                    **(env or {})}
        full_env.pop("TUNER_SIM_FAULTS", None)
        if faults:
            full_env["TUNER_SIM_FAULTS"] = json.dumps(faults)
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tuner.sim", "serve", "--port", str(self.port),
                 "--model", MODEL, "--max-model-len", "4096", *argv],
                stdout=out, stderr=subprocess.STDOUT, env=full_env, cwd=ROOT,
                start_new_session=True)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout: float = 30.0) -> None:
        wait_ready(self.proc, self.url, self.log_path, timeout)

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)


@dataclass
class Recorded:
    spec: ProbeSpec          # with reference_accuracy filled in, as the orchestrator does
    reference: Reference
    known_accuracy: float


def record(log_dir: Path, **server) -> Recorded:
    """The orchestrator's once-per-study step, against a reference-configuration server, as
    the worker takes it: the bank's pool recorded, the reference's own known answers judged
    from that record, then a trial's probe against the reference itself (its self-check)."""
    spec = ProbeSpec()
    items = load_probe_items(spec)
    sim = SimProc(log_dir, **server)
    try:
        reference = asyncio.run(record_reference(sim.url, MODEL, spec, label="eager",
                                                 sources=load_reference_sources(spec, items=items)))
        known = reference_known_answers(spec, items, reference)
        reference = reference.model_copy(update={"known_answers_accuracy": known.accuracy})
        self_check = asyncio.run(run_trial_probe(sim.url, MODEL, spec, reference=reference, items=items))
    finally:
        sim.stop()
    assert validate_reference(known, reference=reference, self_check=self_check) is None
    return Recorded(with_reference_accuracy(spec, known), reference, known.accuracy)


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sims")


@pytest.fixture(scope="module")
def tiny_ref(log_dir: Path) -> Recorded:
    return record(log_dir, argv=("--enforce-eager",))


@pytest.fixture
def sim(log_dir: Path) -> Iterator[callable]:
    started: list[SimProc] = []

    def start(**kw) -> SimProc:
        proc = SimProc(log_dir, **kw)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


def probe(server: SimProc, rec: Recorded, **kw) -> CorrectnessResult:
    return asyncio.run(run_trial_probe(server.url, MODEL, rec.spec, reference=rec.reference, **kw))


# --------------------------------------------------------------------------- tests


def test_sim_serves_token_id_prompts_with_token_id_logprobs(sim) -> None:
    server = sim()
    ids = httpx.post(server.url + "/tokenize", json={"model": MODEL, "prompt": "What is 2 + 3?"},
                     timeout=10, trust_env=False).json()["tokens"]
    body = httpx.post(server.url + "/v1/completions", timeout=10, trust_env=False, json={
        "model": MODEL, "prompt": ids, "max_tokens": 4, "temperature": 0, "logprobs": 2,
        "return_tokens_as_token_ids": True}).json()
    lp = body["choices"][0]["logprobs"]
    assert body["choices"][0]["text"].strip() == "5"
    assert all(t.startswith("token_id:") for t in lp["tokens"])
    assert all(k.startswith("token_id:") for k in lp["top_logprobs"][0])


def test_reference_covers_the_bank_pool_open_prompts_and_long_prompts(tiny_ref: Recorded) -> None:
    ref, spec = tiny_ref.reference, tiny_ref.spec
    sources = load_reference_sources(spec)
    assert ref.mismatch(spec, sources, MODEL) is None
    # The bank's whole pool and every built-in open prompt; each trial draws from them.
    assert sum(p.source == "known_answer" for p in ref.prompts) == len(load_probe_items(spec))
    assert sum(p.source == "open" for p in ref.prompts) == len(OPEN_PROMPTS)
    assert tiny_ref.known_accuracy > 0.8 and spec.reference_accuracy == tiny_ref.known_accuracy
    longest = max(ref.prompts, key=lambda p: len(p.prompt_ids))
    assert longest.id.startswith("ka-b-retrieval-") and len(longest.prompt_ids) > 1000
    assert longest.forced is None  # over forced_max_prompt_tokens
    opens = [p for p in ref.prompts if p.source == "open"]
    assert all(len(p.generation.tokens) == spec.generated_tokens() for p in opens)


def test_correct_server_with_other_numerics_passes(sim, tiny_ref: Recorded) -> None:
    # Not the reference's configuration (compiled instead of eager): different kernels,
    # slightly different logprobs, same greedy tokens.
    result = probe(sim(), tiny_ref, sample_seed=5)
    assert result.passed, result.reason
    assert result.reason == "ok" and result.probe_seconds and result.probe_seconds > 0
    assert result.coverage is not None and result.coverage.batch_sizes == [1, 2, 4, 8]
    levels = result.reference.levels
    assert [lvl.concurrency for lvl in levels] == [8, 4, 2, 1]  # the top level first
    assert all(lvl.close_fraction == 1.0 for lvl in levels)
    # Forced once, batched at the top level, where batch-dependent prefill numerics show.
    assert levels[0].forced_top1 == 1.0 and levels[0].forced_gap_max > 0.0
    assert all(lvl.forced_top1 is None for lvl in levels[1:])
    assert all(lvl.decode_gap_max is not None and lvl.decode_gap_max < 0.01 for lvl in levels)
    ka = result.known_answers
    assert ka.passed and set(ka.by_concurrency) == {1, 2, 4, 8}


def test_garbage_fails_both_layers(sim, tiny_ref: Recorded) -> None:
    result = probe(sim(faults=[{"fault": "garbage"}]), tiny_ref)
    assert not result.passed
    assert not result.known_answers.passed and not result.reference.passed
    assert all(lvl.far == lvl.prompts for lvl in result.reference.levels)
    assert result.reference.levels[0].forced_top1 < 0.5
    assert result.reason.startswith("known answers: ") and "; reference: " in result.reason


def test_divergence_after_8_tokens_passes_known_answers_but_fails_reference(
        sim, tiny_ref: Recorded) -> None:
    result = probe(sim(faults=[{"fault": "diverge_after_tokens", "tokens": 8}]), tiny_ref)
    assert result.known_answers.passed, result.known_answers.reason  # short answers survive
    assert not result.passed and not result.reference.passed
    far = [s for s in result.reference.scores if s.verdict == "far"]
    # The sim garbles words and numbers from token 8 on and leaves punctuation alone.
    assert far and all(8 <= s.diverged_at <= 10 for s in far)
    # Every open prompt the trial sent continues past token 8: each one diverged.
    opens = {s.id for s in result.reference.scores if s.source == "open"}
    assert opens and {s.id for s in far} >= opens
    assert "diverged at token 8" in result.reason


def test_deadline_cuts_the_probe_short_and_fails_it(sim, tiny_ref: Recorded) -> None:
    server = sim(time_scale=0.2)
    began = time.monotonic()
    result = probe(server, tiny_ref, deadline_s=1.0)
    assert time.monotonic() - began < 10
    assert not result.passed and "deadline" in json.dumps(result.model_dump(mode="json"))


def test_recording_from_a_dead_server_raises(log_dir: Path) -> None:
    spec = ProbeSpec(request_timeout_s=2)
    with pytest.raises(ReferenceRecordError, match="/tokenize"):
        asyncio.run(record_reference(f"http://127.0.0.1:{free_port()}", MODEL, spec))


def test_ll128_corruption_on_pcie_fails(log_dir: Path, sim) -> None:
    glm = ("--tensor-parallel-size", "8")
    rec = record(log_dir, profile="glm5-8xpcie", argv=glm, env={"NCCL_PROTO": "Simple"})
    fine = probe(sim(profile="glm5-8xpcie", argv=glm, env={"NCCL_PROTO": "LL"}), rec)
    assert fine.passed, fine.reason
    broken = probe(sim(profile="glm5-8xpcie", argv=glm, env={"NCCL_PROTO": "LL128"}), rec)
    assert not broken.passed and not broken.reference.passed
    assert broken.reference.levels[0].far == broken.reference.levels[0].prompts


@pytest.mark.slow
def test_no_false_alarm_in_20_runs(sim, tiny_ref: Recorded) -> None:
    # One server for all runs keeps this near 20 s of CPU (about 55 requests a run); the
    # wall time is not asserted because it is the host's load, not the probe's.
    server = sim(time_scale=0.002)
    results = [probe(server, tiny_ref) for _ in range(20)]
    alarms = [r.reason for r in results if not r.passed]
    assert not alarms, alarms
    # Every run really compared everything: no run passed by skipping a layer or a batch size.
    assert all(r.coverage is not None and r.coverage.batch_sizes == [1, 2, 4, 8] for r in results)
    assert all(r.reference is not None and r.reference.scores and r.known_answers.total for r in results)


# ------------------------------------------------------ one request serves both layers


def finished_requests(server: SimProc) -> int:
    """Generation requests the server completed, from its vLLM-style /metrics."""
    text = httpx.get(server.url + "/metrics", timeout=10, trust_env=False).text
    return sum(round(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
               if line.startswith("vllm:request_success_total{"))


def test_known_answers_share_the_reference_request_unless_the_trial_tokenizes_differently(
        sim, tiny_ref: Recorded) -> None:
    # A known-answer question whose ids this server gives as the reference recorded them is
    # asked once per batch size, for both layers. Where the reference says other ids (here:
    # every question's), it must not be sent as the recorded ids, but through the chat
    # endpoint as a user's request would be, and the reference prompt on its own.
    ref = tiny_ref.reference
    tampered = ref.model_copy(update={"prompts": [
        p.model_copy(update={"prompt_ids": [*p.prompt_ids[:-1], p.prompt_ids[-1] + 1]})
        if p.source == "known_answer" else p for p in ref.prompts]})
    spec = tiny_ref.spec.model_copy(update={"reference": tiny_ref.spec.reference.model_copy(
        update={"early_exit": 10_000})})  # the tampered ids diverge: let every batch size run
    server = sim()

    def run(reference: Reference) -> tuple[CorrectnessResult, int]:
        before = finished_requests(server)
        result = asyncio.run(run_trial_probe(server.url, MODEL, spec, reference=reference, sample_seed=2))
        return result, finished_requests(server) - before

    normal, shared = run(ref)
    apart, separate = run(tampered)
    assert normal.passed, normal.reason
    known = normal.known_answers.total
    assert known and apart.known_answers.total == known
    assert separate == shared + known  # one more request per known answer, none otherwise
    assert apart.known_answers.passed, apart.known_answers.reason
    assert {(r.id, r.concurrency) for r in apart.known_answers.records} == {
        (r.id, r.concurrency) for r in normal.known_answers.records}
    assert normal.known_answers_seconds and normal.reference_seconds is not None
    assert normal.probe_seconds >= normal.known_answers_seconds
