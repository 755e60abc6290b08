"""The correctness probe against the real vLLM CPU server (SmolLM2-135M, float32):
record the reference from an eager server, check it against itself, then check an n-gram
speculative configuration (k=4, eager), which exercises the drafter and the rejection
sampler, against it. Prints every prompt's scores and the margins to the thresholds
(run with -s to see them)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tuner.probe.client import load_probe_items
from tuner.probe.record import Reference
from tuner.probe.recording import load_reference_sources, record_reference
from tuner.probe.spec import ProbeSpec, fit_to_study
from tuner.probe.trial import reference_known_answers, run_trial_probe
from tuner.probe.verdict import CorrectnessResult, validate_reference

ROOT = Path(__file__).resolve().parents[1]
VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"
MODEL_DIR = ROOT / ".models" / "smollm2-135m-instruct"
SERVED = "smollm2"

pytestmark = [
    pytest.mark.realvllm,
    pytest.mark.slow,
    pytest.mark.skipif(not (VLLM_PY.exists() and (MODEL_DIR / "config.json").exists()),
                       reason="needs .venv-vllm and .models/smollm2-135m-instruct"),
]

# SmolLM2-135M is a weak model; a CPU study says so with min_accuracy, which then only
# applies to the reference (trials are judged against the reference's own answers). The
# reference layer's numerics rule is what has teeth on a model this weak. The bank is
# fitted as `tuner run` fits smollm2-cpu.yaml's: load top concurrency 4, context 2048.
SPEC = fit_to_study(ProbeSpec(min_accuracy=0.15, request_timeout_s=300, max_tokens=24),
                    top_concurrency=4, max_model_len=2048)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Vllm:
    """A vLLM CPU server in its own process group (the EngineCore child dies with it)."""

    def __init__(self, log_path: Path, *extra: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        argv = [str(VLLM_PY), "-m", "vllm.entrypoints.openai.api_server",
                "--model", str(MODEL_DIR), "--served-model-name", SERVED,
                "--host", "127.0.0.1", "--port", str(self.port),
                "--enforce-eager", "--dtype", "float32", "--max-model-len", "2048", *extra]
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "2"}
        with open(log_path, "wb") as out:
            self.proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         cwd=ROOT, start_new_session=True)
        try:
            self._wait_ready(900)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"vLLM exited {self.proc.returncode}:\n"
                                     f"{self.log_path.read_text(errors='replace')[-3000:]}")
            try:
                r = httpx.get(self.url + "/v1/models", timeout=2, trust_env=False)
                if r.status_code == 200 and SERVED in r.text:
                    return
            except httpx.TransportError:
                pass
            time.sleep(1.0)
        raise AssertionError(f"vLLM not ready after {timeout}s; log {self.log_path}")

    def stop(self) -> None:
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        try:  # the EngineCore child may outlive the API server
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


def report(name: str, result: CorrectnessResult) -> None:
    """Per level: the near ties (numerics) and their largest gap, corrupt positions, top-5
    overlap and KL, next to the thresholds; then the evidence of any corrupt position."""
    ref = result.reference
    assert ref is not None
    th = ref.thresholds
    print(f"\n== {name}: {'PASS' if result.passed else 'FAIL'} ({result.reason}); "
          f"{result.coverage.short() if result.coverage else ''}; {result.probe_seconds:.1f} s")
    for lvl in ref.levels:
        gaps = [s.gap for s in ref.scores
                if s.concurrency == lvl.concurrency and s.verdict == "close" and s.gap is not None]
        print(f"  batch {lvl.concurrency}: {lvl.prompts} prompts, exact {lvl.exact}, near ties "
              f"{lvl.near_ties} (largest gap {max(gaps, default=0):.3f} of {th['near_tie_nats']}),"
              f" corrupt {lvl.corrupt}, top-5 overlap {lvl.top_k_overlap}, KL median "
              f"{lvl.kl_median}, forced top-1 {lvl.forced_top1}")
    for line in ref.corrupt[:5]:
        print("   ", line)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ProbeSpec, Reference]]:
    logs = tmp_path_factory.mktemp("vllm")
    server = Vllm(logs / "eager.log")
    items = load_probe_items(SPEC)
    try:
        # As the worker records a study's reference: the pool batched, the reference's own
        # known answers from its record, then a trial's probe against itself (batch 1 vs N).
        reference = asyncio.run(record_reference(
            server.url, SERVED, SPEC, sources=load_reference_sources(SPEC, items=items),
            label="eager"))
        known = reference_known_answers(SPEC, items, reference)
        reference = reference.model_copy(update={"known_answers_accuracy": known.accuracy})
        self_check = asyncio.run(run_trial_probe(server.url, SERVED, SPEC, reference=reference,
                                                 items=items))
    finally:
        server.stop()
    report("eager vs its own reference", self_check)
    print(f"known answers on the reference: {known.accuracy:.3f} ({known.reason}); "
          f"recording took {reference.record_seconds:.1f} s")
    assert self_check.passed, self_check.reason
    assert validate_reference(known, reference=reference, self_check=self_check) is None
    yield SPEC, reference


@pytest.mark.timeout(1800)
def test_reference_records_token_ids_and_agrees_with_itself(recorded) -> None:
    spec, reference = recorded
    assert len(reference.prompts) == len(load_reference_sources(spec))
    # Token-ID prompts: the chat template's ids are in the prompt (<|im_start|> = 1).
    chat = next(p for p in reference.prompts if p.id == "open0-chat")
    assert chat.prompt_ids[0] == 1 and chat.generation.tokens
    assert all(p.generation.finish_reason in ("stop", "length") for p in reference.prompts)
    assert max(len(p.prompt_ids) for p in reference.prompts) > 1000  # the long buckets


@pytest.mark.timeout(1800)
def test_ngram_speculation_agrees_with_eager_reference(recorded, tmp_path: Path) -> None:
    spec, reference = recorded
    server = Vllm(tmp_path / "ngram.log", "--speculative-config",
                  '{"method": "ngram", "num_speculative_tokens": 4, '
                  '"prompt_lookup_min": 2, "prompt_lookup_max": 4}')
    try:
        result: CorrectnessResult = asyncio.run(
            run_trial_probe(server.url, SERVED, spec, reference=reference, sample_seed=1))
    finally:
        server.stop()
    assert result.reference is not None
    report("ngram k=4 vs eager reference", result)
    assert "SpecDecoding metrics" in (tmp_path / "ngram.log").read_text(errors="replace")
    assert result.passed, result.reason
    assert all(s.verdict in ("exact", "close") for s in result.reference.scores)
