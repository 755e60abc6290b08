"""Fatal-line detection on the real H200 logs, hand-written excerpts and single lines.

Fixture provenance: tests/fixtures/vllm_logs/README.md. Single lines below not copied
from a fixture are marked with where their text comes from.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.log_replay import digest_written_in_chunks
from tuner.vllm.effective_config import strip_ansi, text_lines
from tuner.vllm.failure_signatures import (
    GENERIC_REASONS,
    REASONS,
    FatalLineScanner,
    FatalSignature,
    match_fatal_line,
)
from tuner.vllm.log_digest import read_log

LOGS = Path(__file__).parent / "fixtures" / "vllm_logs"
SUCCESSFUL = [
    "h200-0.26.0/eager.log",
    "h200-0.26.0/cudagraph-full.log",
    "h200-0.26.0/cudagraph-full_and_piecewise.log",
    "h200-0.26.0/cudagraph-full_decode_only.log",
    "h200-0.26.0/cudagraph-piecewise.log",
    "h200-0.26.0/spec-ngram-k4.log",
    *(f"h200-0.26.0-study/study/{trial}/server.log" for trial in (
        "0000-eager", "0001-full_and_piecewise", "0002-full_decode_only", "0003-piecewise", "0004-full",
        "0005-none", "0006-eager-ngram-k4")),
    "h200-0.26.0-study/scenarios/d1-compile-cache/server.log",
    "h200-0.26.0-study/scenarios/d2-compile-cache/server.log",
    "handwritten/tp4-pcie-nccl-debug.log",
    "handwritten/tp2-nvlink-allreduce.log",
    "handwritten/cpu-0.32-compiled.log",
    "handwritten/compile-mode-override.log",
]
FAILED = [
    ("h200-0.26.0/fail-bad-cudagraph-mode.log", "invalid_config", "KeyError: 'BOGUS'"),
    ("h200-0.26.0/fail-gpu-memory-utilization.log", "gpu_memory_insufficient",
     "ValueError: Free memory on device cuda:0 (139.29/139.8 GiB) on startup is less than desired"),
    ("h200-0.26.0/fail-spec-mtp-unsupported.log", "unsupported_speculative_method",
     "NotImplementedError: Unsupported speculative method: 'mtp'"),
    ("h200-0.26.0-study/scenarios/b-kv-cache-too-small/server.log", "max_model_len_too_large",
     "ValueError: To serve at least one request with the model's max seq len (4096)"),
    ("h200-0.26.0-study/scenarios/c-spec-mtp/server.log", "unsupported_speculative_method",
     "NotImplementedError: Unsupported speculative method: 'mtp'"),
    ("handwritten/fail-worker-cuda-oom.log", "cuda_oom", "torch.OutOfMemoryError: CUDA out of memory."),
]


def read(name: str) -> str:
    return (LOGS / name).read_text(encoding="utf-8")


def feed(scanner: FatalLineScanner, text: str) -> FatalSignature | None:
    """Every line of ``text`` into ``scanner``; its answer after the last one."""
    found = None
    for line in text_lines(text):
        found = scanner.feed_line(line)
    return found


def test_reason_ids() -> None:
    assert set(REASONS) >= {
        "engine_core_failed", "worker_failed", "engine_dead", "gpu_memory_insufficient",
        "no_kv_cache_memory", "max_model_len_too_large", "cuda_oom", "invalid_config",
        "unsupported_cudagraph_mode", "unsupported_speculative_method", "missing_dependency",
        "nccl_error", "unsupported_kv_cache_dtype",
    }
    assert len(set(REASONS)) == len(REASONS)
    assert set(REASONS) >= GENERIC_REASONS


@pytest.mark.parametrize("name", SUCCESSFUL)
def test_no_line_of_a_successful_log_is_fatal(name: str) -> None:
    lines = read(name).split("\n")
    # Up to the first [shutdown] line every line is judged on its own; after it the
    # server is being stopped on purpose and only the scanner's shutdown rule applies.
    end = next((i for i, line in enumerate(lines) if "] [shutdown] " in line), len(lines))
    assert [(i, lines[i]) for i in range(end) if match_fatal_line(lines[i])] == []
    scanner = FatalLineScanner()
    assert feed(scanner, read(name)) is None
    assert scanner.finish() is None
    assert scanner.ready_seen is True


def test_teardown_noise_after_shutdown_is_ignored() -> None:
    # cudagraph-piecewise.log: after SIGTERM the API server logs EngineDeadError. That line
    # is a real engine_dead signature, so only the scanner's shutdown rule keeps it out.
    text = read("h200-0.26.0/cudagraph-piecewise.log")
    dead = next(line for line in text.split("\n") if "EngineDeadError" in line)
    found = match_fatal_line(dead)
    assert found is not None
    assert found.reason == "engine_dead"
    scanner = FatalLineScanner()
    assert feed(scanner, text) is None
    assert scanner.finish() is None
    assert scanner.shutdown_seen is True


@pytest.mark.parametrize(("name", "reason", "line"), FAILED)
def test_failed_logs_report_the_root_cause(name: str, reason: str, line: str) -> None:
    found = read_log(read(name)).fatal.signature
    assert found is not None
    assert (found.reason, line in found.line) == (reason, True)


@pytest.mark.parametrize(("name", "reason", "line"), FAILED)
@pytest.mark.parametrize("chunk", [1, 7, 113, 4096])
def test_a_log_read_as_it_is_written_gives_the_same_answer(tmp_path: Path, name: str, reason: str,
                                                            line: str, chunk: int) -> None:
    """The launcher's reader over the log written a few bytes at a time (lines and UTF-8
    characters split anywhere) gives the whole log's answer."""
    found = digest_written_in_chunks(tmp_path / "server.log", (LOGS / name).read_bytes(), chunk).fatal.signature
    assert found == read_log(read(name)).fatal.signature
    assert found is not None
    assert found.reason == reason
    assert line in found.line


def test_generic_wrapper_waits_for_its_root_cause() -> None:
    lines = read("h200-0.26.0/fail-gpu-memory-utilization.log").split("\n")
    wrapper = next(i for i, line in enumerate(lines) if "EngineCore failed to start." in line)
    scanner = FatalLineScanner()
    assert feed(scanner, "\n".join(lines[:wrapper + 1]) + "\n") is None
    assert scanner.pending is not None
    assert scanner.pending.reason == "engine_core_failed"
    assert scanner.signature == scanner.pending
    assert not scanner.settled()
    found = feed(scanner, "\n".join(lines[wrapper + 1:]))
    assert found is not None
    assert found.reason == "gpu_memory_insufficient"
    assert scanner.pending is None
    assert scanner.settled()
    assert scanner.signature == found
    excerpt = scanner.excerpt().split("\n")
    assert len(excerpt) <= 40
    assert any("EngineCore failed to start." in line for line in excerpt)
    assert "is less than desired GPU memory utilization" in excerpt[-1]
    # The excerpt stays on the failure however much is fed afterwards.
    feed(scanner, "(APIServer pid=1) INFO 01-01 00:00:00 [x.py:1] later\n" * 100)
    assert scanner.excerpt().split("\n") == excerpt


def test_generic_reason_stands_when_no_root_cause_follows() -> None:
    scanner = FatalLineScanner(grace_lines=5)
    feed(scanner, "(EngineCore pid=1) ERROR 01-01 00:00:00 [core.py:1510] EngineCore failed to start.\n")
    for _ in range(4):
        assert feed(scanner, "(EngineCore pid=1)   File \"x.py\", line 1, in f\n") is None
    found = feed(scanner, "(EngineCore pid=1)     f()\n")
    assert found is not None
    assert found.reason == "engine_core_failed"


def test_finish_settles_a_pending_failure() -> None:
    scanner = FatalLineScanner()
    feed(scanner, "(Worker_TP0 pid=2) ERROR 01-01 00:00:00 [multiproc_executor.py:316] WorkerProc failed to start.\n")
    assert not scanner.settled()
    found = scanner.finish()
    assert found is not None
    assert found.reason == "worker_failed"
    assert scanner.settled()


def test_after_startup_only_engine_killing_reasons_count() -> None:
    ready = "(APIServer pid=1) INFO:     Application startup complete.\n"
    # A request-level error after startup (wording as vLLM's context-length check).
    request_error = ("(APIServer pid=1) ERROR 01-01 00:00:05 [serving_chat.py:200] ValueError: This model's "
                     "maximum context length is 4096 tokens. However, you requested 5000 tokens.\n")
    scanner = FatalLineScanner()
    assert feed(scanner, ready + request_error) is None
    assert scanner.ready_seen
    found = feed(scanner, "(EngineCore pid=2) ERROR 01-01 00:00:09 [core.py:900] torch.OutOfMemoryError: "
                         "CUDA out of memory. Tried to allocate 1.00 GiB.\n")
    assert found is not None
    assert found.reason == "cuda_oom"


# Single fatal lines. Unless noted, the text is from vllm-knobs.md section 5 or the vLLM
# source it cites (with example numbers filled into the format strings).
FATAL_LINES = [
    ("(EngineCore pid=1) ERROR 01-01 00:00:00 [core.py:1510] EngineCore failed to start.", "engine_core_failed"),
    ("(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above. "
     "Failed core proc(s): {}", "engine_core_failed"),
    ("(Worker_TP1 pid=7) ERROR 01-01 00:00:00 [multiproc_executor.py:316] WorkerProc failed to start.",
     "worker_failed"),
    ("(EngineCore pid=1) ERROR 01-01 00:00:00 [multiproc_executor.py:953] Worker proc VllmWorker-1 died "
     "unexpectedly, shutting down executor.", "worker_failed"),
    ("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) "
     "for the root cause.", "engine_dead"),
    ("(EngineCore pid=1) ValueError: Free memory on device cuda:0 (10.2/79.2 GiB) on startup is less than "
     "desired GPU memory utilization (0.9, 71.3 GiB). Decrease GPU memory utilization or reduce GPU memory "
     "used by other processes.", "gpu_memory_insufficient"),
    ("(EngineCore pid=1) ValueError: No available memory for the cache blocks. Try increasing "
     "`gpu_memory_utilization` when initializing the engine.", "no_kv_cache_memory"),
    ("(EngineCore pid=1) ValueError: To serve at least one request with the models's max seq len (131072), "
     "(16.00 GiB KV cache is needed, which is larger than the available KV cache memory (9.50 GiB). Based on "
     "the available memory, the estimated maximum model length is 77824. Try increasing "
     "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.",
     "max_model_len_too_large"),
    ("(Worker_TP0 pid=3) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.", "cuda_oom"),
    ("RuntimeError: CUDA error: out of memory", "cuda_oom"),
    # CUDA runtime message text (torch), not from vllm-knobs.md
    ("RuntimeError: CUDA error: an illegal memory access was encountered", "cuda_error"),
    # torch.distributed wording of an NCCL failure, not from vllm-knobs.md
    ("torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:268, "
     "invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.27.3", "nccl_error"),
    ("ncclInvalidUsage: This usually reflects invalid usage of NCCL library.", "nccl_error"),
    ("(Worker_TP0 pid=3) RuntimeError: NCCL error: invalid usage (run with NCCL_DEBUG=WARN for details)", "nccl_error"),
    ("KeyError: 'BOGUS'", "invalid_config"),
    ("pydantic_core._pydantic_core.ValidationError: 1 validation error for CompilationConfig", "invalid_config"),
    ("  Value error, Invalid compilation mode: bogus. Valid modes are: NONE, STOCK_TORCH_COMPILE, "
     "DYNAMO_TRACE_ONCE, VLLM_COMPILE [type=value_error, input_value='bogus', input_type=str]", "invalid_config"),
    ("ValueError: customized max_cudagraph_capture_size(=256) should be consistent with the max value of "
     "cudagraph_capture_sizes(=512)", "invalid_config"),
    ("ValueError: num_speculative_tokens was provided but without speculative model.", "invalid_config"),
    # argparse's standard wording, not from vllm-knobs.md
    ("api_server.py: error: unrecognized arguments: --bogus-flag", "invalid_config"),
    ("(EngineCore pid=1) ValueError: CUDAGraphMode.FULL is not supported with TreeAttentionBackend backend "
     "(support: AttentionCGSupport.NEVER); please try cudagraph_mode=PIECEWISE, and make sure compilation "
     "mode is VLLM_COMPILE", "unsupported_cudagraph_mode"),
    ("NotImplementedError: Unsupported speculative method: 'mtp'", "unsupported_speculative_method"),
    # vLLM 0.32 CPU build (cpu_attn.py, _get_attn_isa) on an AVX2-only host, and for a head size
    # not divisible by 32
    ("(EngineCore pid=1) NotImplementedError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX.",
     "unsupported_kv_cache_dtype"),
    ("NotImplementedError: FP8 KV cache requires head_size divisible by 32 on CPU.", "unsupported_kv_cache_dtype"),
    ("ImportError: Arctic Inference is required for suffix decoding. Install via "
     "`pip install arctic-inference==0.1.1`.", "missing_dependency"),
    ("ModuleNotFoundError: No module named 'flashinfer'", "missing_dependency"),
    ("\x1b[1;36m(EngineCore pid=1)\x1b[0;0m \x1b[31mERROR\x1b[0m 01-01 00:00:00 [core.py:1510] "
     "EngineCore failed to start.", "engine_core_failed"),
]


@pytest.mark.parametrize(("line", "reason"), FATAL_LINES, ids=[r + f"-{i}" for i, (_, r) in enumerate(FATAL_LINES)])
def test_fatal_lines(line: str, reason: str) -> None:
    found = match_fatal_line(line)
    assert found is not None
    assert found.reason == reason
    assert found.summary
    assert found.line == strip_ansi(line)


NOT_FATAL = [
    # from the H200 fixtures
    "(APIServer pid=707) WARNING 11-29 09:57:36 [system_utils.py:299] Found ulimit of 20000 and failed to "
    "automatically increase with error current limit exceeds maximum limit. This can cause fd limit errors "
    "like `OSError: [Errno 24] Too many open files`. Consider increasing with ulimit -n",
    "(EngineCore pid=940) INFO 11-29 09:58:18 [gpu_worker.py:857] Free memory on device (139.29/139.8 GiB) on "
    "startup. Desired GPU memory utilization is (0.5, 69.9 GiB). Actual usage is 0.26 GiB for weight",
    "(EngineCore pid=6044)     raise ValueError(",
    "(APIServer pid=5820)     raise NotImplementedError(",
    "[rank0]:[W1129 10:10:16.019636140 ProcessGroupNCCL.cpp:1575] Warning: WARNING: destroy_process_group() "
    "was not called before program exit, which can leak resources.",
    "(EngineCore pid=3894) WARNING 11-29 10:05:47 [jit_monitor.py:135] Triton kernel JIT compilation during "
    "inference: rejection_greedy_sample_kernel.",
    # downgrade and memory WARNINGs (vllm-knobs.md sections 1 and 2): not fatal
    "(Worker_TP0 pid=2) WARNING 01-01 00:00:01 [compilation.py:1411] CUDAGraphMode.FULL is not supported "
    "with FlashInferBackend backend (support: AttentionCGSupport.UNIFORM_BATCH); setting cudagraph_mode="
    "FULL_AND_PIECEWISE",
    "(Worker_TP0 pid=2) WARNING 01-01 00:00:01 [custom_all_reduce.py:154] Custom allreduce is disabled "
    "because it's not supported on more than two PCIe-only GPUs.",
    "(EngineCore pid=1) WARNING 01-01 00:00:01 [gpu_worker.py:300] CUDA out of memory risk: reduce "
    "max_num_seqs",  # hand-written: a WARNING that merely mentions memory
    "(APIServer pid=1) INFO:     127.0.0.1:5000 - \"POST /v1/completions HTTP/1.1\" 400 Bad Request",
    "(APIServer pid=1) ERROR 01-01 00:00:00 [async_llm.py:704] AsyncLLM output_handler failed.",
    "(Worker_TP0 pid=3) h:3:3 [0] NCCL INFO NCCL_PROTO set by environment to LL",
]


@pytest.mark.parametrize("line", NOT_FATAL)
def test_not_fatal_lines(line: str) -> None:
    assert match_fatal_line(line) is None
