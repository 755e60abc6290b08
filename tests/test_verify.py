"""verify(asked, effective) on the real H200 logs and the hand-written excerpts.

Fixture provenance: tests/fixtures/vllm_logs/README.md.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from tuner.vllm.effective_config import EffectiveConfig, parse_effective_config
from tuner.vllm.verify import KnobCheck, VerificationResult, verify

LOGS = Path(__file__).parent / "fixtures" / "vllm_logs"

EAGER = "h200-0.26.0/eager.log"
FAP = "h200-0.26.0/cudagraph-full_and_piecewise.log"
PIECEWISE = "h200-0.26.0/cudagraph-piecewise.log"
FULL = "h200-0.26.0/cudagraph-full.log"
FDO = "h200-0.26.0/cudagraph-full_decode_only.log"
NGRAM = "h200-0.26.0/spec-ngram-k4.log"
MTP_FAIL = "h200-0.26.0/fail-spec-mtp-unsupported.log"
TP4 = "handwritten/tp4-pcie-nccl-debug.log"
TP2 = "handwritten/tp2-nvlink-allreduce.log"
CPU = "handwritten/cpu-0.32-compiled.log"
OVERRIDE = "handwritten/compile-mode-override.log"


@cache
def eff(name: str) -> EffectiveConfig:
    return parse_effective_config((LOGS / name).read_text(encoding="utf-8"))


def one(name: str, target: str, asked: Any) -> KnobCheck:
    result = verify({target: asked}, eff(name))
    assert len(result.checks) == 1
    return result.checks[0]


# (fixture, target, asked, status, got, text the evidence must contain or None, text the note must contain or None)
CASES: list[tuple[str, str, Any, str, Any, str | None, str | None]] = [
    # cudagraph mode: asked == got, by name (any case) or int
    (FAP, "compilation_config.cudagraph_mode", "FULL_AND_PIECEWISE", "applied", "FULL_AND_PIECEWISE",
     "<CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>", None),
    (FULL, "compilation_config.cudagraph_mode", "full", "applied", "FULL", "<CUDAGraphMode.FULL: 2>", None),
    (FULL, "compilation_config.cudagraph_mode", 2, "applied", "FULL", None, None),
    (PIECEWISE, "compilation_config.cudagraph_mode", 1, "applied", "PIECEWISE", None, None),
    (FDO, "compilation_config.cudagraph_mode", "Full_Decode_Only", "applied", "FULL_DECODE_ONLY", None, None),
    (EAGER, "compilation_config.cudagraph_mode", 0, "applied", "NONE", None, None),
    (FULL, "compilation_config.cudagraph_mode", "PIECEWISE", "not_applied", "FULL", "<CUDAGraphMode.FULL: 2>", None),
    # per-backend downgrade: asked FULL, vLLM ran FULL_AND_PIECEWISE and said so in a WARNING
    (TP4, "compilation_config.cudagraph_mode", "FULL", "not_applied", "FULL_AND_PIECEWISE",
     "setting cudagraph_mode=FULL_AND_PIECEWISE", "FULL→FULL_AND_PIECEWISE"),
    # config-time override to NONE
    (OVERRIDE, "compilation_config.cudagraph_mode", "PIECEWISE", "not_applied", "NONE",
     "Overriding to NONE", "PIECEWISE→NONE"),
    # CPU build: silently NONE; the evidence is the config-line excerpt
    (CPU, "compilation_config.cudagraph_mode", "FULL_AND_PIECEWISE", "not_applied", "NONE",
     "<CUDAGraphMode.NONE: 0>", "CPU build"),
    (CPU, "compilation_config.cudagraph_capture_sizes", [1, 2, 4], "not_applied", [],
     "'cudagraph_capture_sizes': []", None),
    (FAP, "compilation_config.max_cudagraph_capture_size", 512, "applied", 512,
     "'max_cudagraph_capture_size': 512", None),
    (FAP, "compilation_config.max_cudagraph_capture_size", "256", "not_applied", 512, None, None),
    # compilation mode
    (FAP, "compilation_config.mode", 3, "applied", "VLLM_COMPILE", "<CompilationMode.VLLM_COMPILE: 3>", None),
    (EAGER, "compilation_config.mode", "vllm_compile", "not_applied", "NONE", "<CompilationMode.NONE: 0>", None),
    (CPU, "compilation_config.mode", "VLLM_COMPILE", "applied", "DYNAMO_TRACE_ONCE",
     "<CompilationMode.DYNAMO_TRACE_ONCE: 2>", "substitutes DYNAMO_TRACE_ONCE"),
    (CPU, "compilation_config.mode", 0, "not_applied", "DYNAMO_TRACE_ONCE", None, None),
    (OVERRIDE, "compilation_config.mode", 1, "applied", "STOCK_TORCH_COMPILE", None, None),
    # enforce_eager: field-notes trap 2 (believed eager, config said otherwise)
    (EAGER, "enforce_eager", True, "applied", True, "enforce_eager=True", None),
    (EAGER, "enforce_eager", "1", "applied", True, None, None),
    (EAGER, "enforce_eager", False, "not_applied", True, "enforce_eager=True", None),
    (FAP, "enforce_eager", True, "not_applied", False, "enforce_eager=False", None),
    (FAP, "enforce_eager", "false", "applied", False, None, None),
    # speculation
    (NGRAM, "speculative_config.method", "ngram", "applied", "ngram", "SpeculativeConfig(method='ngram'", None),
    (NGRAM, "speculative_config.method", "NGRAM", "applied", "ngram", None, None),
    (NGRAM, "speculative_config.num_speculative_tokens", 4, "applied", 4, "num_spec_tokens=4", None),
    (NGRAM, "speculative_config.num_speculative_tokens", "5", "not_applied", 4, None, None),
    (NGRAM, "speculative_config.prompt_lookup_min", 2, "applied", 2, "'prompt_lookup_min': 2", None),
    (NGRAM, "speculative_config.prompt_lookup_max", 4, "applied", 4, "'prompt_lookup_max': 4", None),
    (EAGER, "speculative_config.method", "ngram", "not_applied", None, "speculative_config=None", None),
    (EAGER, "speculative_config.num_speculative_tokens", 4, "not_applied", None, "speculative_config=None", None),
    (EAGER, "speculative_config.prompt_lookup_min", 2, "not_applied", None, "speculative_config=None", None),
    # asked explicitly for no speculation: a leftover ngram setting is caught (trap 2)
    (NGRAM, "speculative_config.method", None, "not_applied", "ngram", "SpeculativeConfig(method='ngram'", "leftover"),
    (NGRAM, "speculative_config.method", "none", "not_applied", "ngram", None, "leftover"),
    (EAGER, "speculative_config.method", None, "applied", None, "speculative_config=None", None),
    (EAGER, "speculative_config.method", "none", "applied", None, None, None),
    # the server died before its engine line: the log cannot say
    (MTP_FAIL, "speculative_config.method", "mtp", "unverifiable", None, None, "no engine config line"),
    # custom all-reduce: the silent downgrade on >2 PCIe GPUs
    (TP4, "disable_custom_all_reduce", False, "not_applied", True,
     "Custom allreduce is disabled because it's not supported on more than two PCIe-only GPUs",
     "pcie_more_than_two_gpus"),
    (TP4, "disable_custom_all_reduce", True, "applied", True, "Custom allreduce is disabled", None),
    (TP2, "disable_custom_all_reduce", False, "applied", False, "Using ['FLASHINFER', 'CUSTOM'", None),
    (TP2, "disable_custom_all_reduce", "true", "not_applied", False, "'CUSTOM'", "CUSTOM is still"),
    # CPU build: no custom all-reduce exists, whichever way it is asked (issue 41)
    (CPU, "disable_custom_all_reduce", False, "not_applicable", True, "disable_custom_all_reduce=True",
     "not applicable here: the CPU build"),
    (CPU, "disable_custom_all_reduce", True, "not_applicable", True, "disable_custom_all_reduce=True",
     "forces disable_custom_all_reduce=True"),
    (EAGER, "disable_custom_all_reduce", False, "applied", False, "disable_custom_all_reduce=False",
     "tensor_parallel_size=1"),
    # NCCL environment
    (TP4, "env:NCCL_PROTO", "LL", "applied", "LL", "NCCL_PROTO set by environment to LL", None),
    (TP4, "env:NCCL_PROTO", "ll", "applied", "LL", None, None),
    (TP4, "env:NCCL_PROTO", "Simple", "not_applied", "LL", "NCCL_PROTO set by environment to LL", None),
    (TP4, "env:NCCL_ALGO", "Ring", "applied", "Ring", "NCCL_ALGO set by environment to Ring", None),
    (TP4, "env:NCCL_BUFFSIZE", 8388608, "applied", "8388608", None, None),
    (TP4, "env:NCCL_MAX_NCHANNELS", 8, "not_applied", None, "set by environment", "did not reach"),
    (TP4, "env:NCCL_IB_HCA", "mlx5", "unverifiable", None, None, "does not always report"),
    (TP2, "env:NCCL_PROTO", "LL", "unverifiable", None, None, "enable NCCL_DEBUG=INFO to verify"),
    (EAGER, "env:NCCL_PROTO", "LL", "unverifiable", None, None, "world size 1"),
    (CPU, "env:NCCL_PROTO", "LL", "not_applicable", None, "backend=gloo", "NCCL is not used on the CPU build"),
    (CPU, "env:NCCL_ALGO", "Ring", "not_applicable", None, "backend=gloo", "not applicable here"),
    (CPU, "env:VLLM_ALLREDUCE_USE_SYMM_MEM", "0", "not_applicable", None, "backend=gloo",
     "SYMM_MEM is a GPU all-reduce"),
    # vLLM all-reduce switches, read off the TP group's backends line
    (TP2, "env:VLLM_ALLREDUCE_USE_FLASHINFER", "0", "not_applied",
     ["FLASHINFER", "CUSTOM", "SYMM_MEM", "PYNCCL"], "all-reduce backends", "FLASHINFER is still used"),
    (TP2, "env:VLLM_ALLREDUCE_USE_FLASHINFER", 1, "applied", ["FLASHINFER", "CUSTOM", "SYMM_MEM", "PYNCCL"],
     None, None),
    (TP4, "env:VLLM_ALLREDUCE_USE_SYMM_MEM", False, "applied", ["PYNCCL"], "Using ['PYNCCL']", None),
    (EAGER, "env:VLLM_ALLREDUCE_USE_SYMM_MEM", "0", "unverifiable", None, None, "no all-reduce backends line"),
    (TP2, "env:VLLM_FLASHINFER_ALLREDUCE_BACKEND", "trtllm", "unverifiable", None, None, "does not log"),
    # dtype
    (EAGER, "dtype", "bfloat16", "applied", "bfloat16", "dtype=torch.bfloat16", None),
    (EAGER, "dtype", "half", "not_applied", "bfloat16", None, None),
    (EAGER, "dtype", "auto", "unverifiable", "bfloat16", "dtype=torch.bfloat16", "dtype=auto"),
    (CPU, "dtype", "float", "applied", "float32", None, None),
    (TP4, "tensor_parallel_size", 4, "applied", 4, "tensor_parallel_size=4", None),
    (TP4, "tensor_parallel_size", "2", "not_applied", 4, None, None),
    (EAGER, "async_scheduling", True, "applied", True, "Asynchronous scheduling is enabled.", None),
    (NGRAM, "async_scheduling", True, "not_applied", False, "Asynchronous scheduling is disabled.", None),
    # any other target: the non-default args line
    (EAGER, "max_model_len", 4096, "applied", 4096, "'max_model_len': 4096", "non-default args"),
    (EAGER, "max_model_len", "4096", "applied", 4096, None, None),
    (EAGER, "max_model_len", 8192, "not_applied", 4096, "'max_model_len': 4096", None),
    (EAGER, "gpu_memory_utilization", 0.5, "applied", 0.5, "'gpu_memory_utilization': 0.5", None),
    (EAGER, "max_num_seqs", 256, "unverifiable", None, None, "vLLM used its default"),
    (CPU, "compilation_config.pass_config.fuse_allreduce_rms", False, "unverifiable", None, None, None),
    (FAP, "compilation_config.cudagraph_num_of_warmups", 0, "applied", 0,
     "'cudagraph_num_of_warmups': 0", None),
    (MTP_FAIL, "speculative_config.num_speculative_tokens", 1, "applied", 1,
     "'num_speculative_tokens': 1", "non-default args"),
    ("h200-0.26.0/fail-bad-cudagraph-mode.log", "max_model_len", 4096, "unverifiable", None, None,
     "no `non-default args:` line"),
]


@pytest.mark.parametrize(("name", "target", "asked", "status", "got", "evidence", "note"), CASES,
                         ids=[f"{c[0].split('/')[-1]}:{c[1]}={c[2]!r}" for c in CASES])
def test_verify_table(name: str, target: str, asked: Any, status: str, got: Any,
                      evidence: str | None, note: str | None) -> None:
    check = one(name, target, asked)
    assert (check.target, check.asked, check.status, check.got) == (target, asked, status, got), check
    if evidence is not None:
        assert evidence in (check.evidence or ""), check.evidence
    if status in ("not_applied", "not_applicable"):
        assert check.evidence, "a mismatch, or a knob that cannot act, must cite the log"
    if note is not None:
        assert note in (check.note or ""), check.note


def test_capture_lines_contradicting_the_mode_are_a_mismatch() -> None:
    # The engine line says FULL_AND_PIECEWISE, but suppose only FULL graphs were captured.
    tampered = eff(FAP).model_copy(update={"graphs_captured": ["FULL"]})
    check = verify({"compilation_config.cudagraph_mode": "FULL_AND_PIECEWISE"}, tampered).checks[0]
    assert check.status == "not_applied"
    assert check.note is not None
    assert "do not match" in check.note


def test_skipped_capture_with_a_graph_mode_is_a_mismatch() -> None:
    # Hand-written: an engine line asking FULL, then vLLM's skip warning (vllm-knobs.md section 1).
    text = (
        "(EngineCore pid=1) INFO 01-01 00:00:00 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with "
        "config: model='m', speculative_config=None, enforce_eager=False, device_config=cuda, "
        "compilation_config={'mode': <CompilationMode.VLLM_COMPILE: 3>, 'cudagraph_mode': <CUDAGraphMode.FULL: 2>}\n"
        "(EngineCore pid=1) WARNING 01-01 00:00:09 [gpu_model_runner.py:6483] Skipping CUDA graph capture. "
        "To turn on CUDA graph capture, ensure `cudagraph_mode` was not manually set to `NONE`\n"
    )
    check = verify({"compilation_config.cudagraph_mode": "FULL"}, parse_effective_config(text)).checks[0]
    assert check.status == "not_applied"
    assert check.evidence is not None
    assert "Skipping CUDA graph capture" in check.evidence


def test_eager_with_captured_graphs_is_not_eager() -> None:
    tampered = eff(EAGER).model_copy(update={"graphs_captured": ["FULL"]})
    check = verify({"enforce_eager": True}, tampered).checks[0]
    assert check.status == "not_applied"
    assert "captured" in (check.note or "")


def test_result_of_a_full_trial() -> None:
    asked = {
        "compilation_config.cudagraph_mode": "FULL",
        "disable_custom_all_reduce": False,
        "env:NCCL_PROTO": "LL",
        "env:NCCL_ALGO": "Ring",
        "tensor_parallel_size": 4,
        "max_num_seqs": 128,
    }
    result = verify(asked, eff(TP4))
    assert [c.target for c in result.checks] == list(asked)
    assert result.applied is False
    assert [c.target for c in result.mismatches()] == [
        "compilation_config.cudagraph_mode", "disable_custom_all_reduce"]
    assert [c.target for c in result.checks if c.status == "unverifiable"] == ["max_num_seqs"]
    dumped = json.loads(result.model_dump_json())
    assert VerificationResult.model_validate(dumped) == result


def test_all_applied_and_nothing_asked() -> None:
    assert verify({"enforce_eager": True, "dtype": "bfloat16"}, eff(EAGER)).applied is True
    empty = verify({}, eff(EAGER))
    assert empty.applied is True
    assert empty.checks == []


def test_a_knob_not_asked_is_not_checked() -> None:
    # spec-ngram-k4 runs ngram speculation; a trial that does not name it is not failed for it.
    result = verify({"compilation_config.cudagraph_mode": "FULL_AND_PIECEWISE"}, eff(NGRAM))
    assert result.applied is True
    assert len(result.checks) == 1


@pytest.mark.parametrize(("target", "asked"), [
    ("no_such_flag", 1),
    ("some_config.deeply.nested", {"a": [1, 2]}),
    ("", None),
    ("env:", "x"),
    ("compilation_config.cudagraph_mode", {"weird": True}),
    ("compilation_config.cudagraph_mode", 7),
    ("compilation_config.mode", [3]),
    ("tensor_parallel_size", "--4"),
    ("enforce_eager", "maybe"),
    ("speculative_config.method", 3),
    ("dtype", 16),
    ("env:VLLM_ALLREDUCE_USE_FLASHINFER", "perhaps"),
])
def test_odd_targets_and_values_never_raise(target: str, asked: Any) -> None:
    for name in (EAGER, TP4, CPU, MTP_FAIL):
        check = verify({target: asked}, eff(name)).checks[0]
        assert check.status in ("applied", "not_applied", "unverifiable")


def test_applied_flag_must_agree_with_the_checks() -> None:
    bad = KnobCheck(target="x", asked=1, got=2, status="not_applied")
    with pytest.raises(ValidationError):
        VerificationResult(checks=[bad], applied=True)
