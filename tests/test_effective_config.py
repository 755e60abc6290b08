"""parse_effective_config against the real H200 logs and the hand-written excerpts.

Fixture provenance: tests/fixtures/vllm_logs/README.md. Inline lines below that are not
copied from a fixture are marked with where their text comes from.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from tuner.vllm.effective_config import (
    EVIDENCE_WIDTH,
    EffectiveConfig,
    excerpt,
    excerpt_around_key,
    parse_effective_config,
    split_log_line,
)

LOGS = Path(__file__).parent / "fixtures" / "vllm_logs"
# Every recorded log, the trial folders of h200-0.26.0-study/ included.
ALL_LOGS = sorted(LOGS.rglob("*.log"))
ALL_IDS = [str(p.relative_to(LOGS)) for p in ALL_LOGS]


def read(name: str) -> str:
    return (LOGS / name).read_text(encoding="utf-8")


def parse(name: str) -> EffectiveConfig:
    return parse_effective_config(read(name))


H200_SIZES = [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)]

# (fixture, expected field values, {field: text its evidence must contain})
CASES: list[tuple[str, dict[str, Any], dict[str, str]]] = [
    ("h200-0.26.0/eager.log",
     {"vllm_version": "0.26.0", "model": "/models/smollm2-135m-instruct", "platform": "cuda",
      "dtype": "bfloat16", "tensor_parallel_size": 1, "enforce_eager": True,
      "disable_custom_all_reduce": False, "compilation_mode": "NONE",
      "cudagraph_mode_configured": "NONE", "cudagraph_mode": "NONE", "cudagraph_capture_sizes": [],
      "max_cudagraph_capture_size": 0, "graphs_captured": None, "graph_capture_seconds": None,
      "speculative_method": None, "num_speculative_tokens": None, "async_scheduling": True,
      "attention_backend": "FLASH_ATTN", "model_runner": "V2", "kv_cache_tokens": 3228912,
      "kv_cache_device": "GPU", "world_size": 1, "distributed_backend": "nccl",
      "custom_all_reduce_active": None, "allreduce_backends": None, "nccl_env": None,
      "startup_seconds": {"model_loading": 1.343379, "init_engine": 16.49}, "ready": True},
     {"enforce_eager": "enforce_eager=True", "cudagraph_mode": "'cudagraph_mode': <CUDAGraphMode.NONE: 0>",
      "speculative_method": "speculative_config=None", "kv_cache_tokens": "GPU KV cache size: 3,228,912 tokens",
      "ready": "Application startup complete.", "model_runner": "Using V2 Model Runner",
      "startup_seconds": "init engine (profile, create kv cache, warmup model) took 16.49 s"}),
    ("h200-0.26.0/cudagraph-full_and_piecewise.log",
     {"enforce_eager": False, "compilation_mode": "VLLM_COMPILE",
      "cudagraph_mode_configured": "FULL_AND_PIECEWISE", "cudagraph_mode": "FULL_AND_PIECEWISE",
      "cudagraph_capture_sizes": H200_SIZES, "max_cudagraph_capture_size": 512,
      "graphs_captured": ["FULL", "PIECEWISE"], "graph_capture_seconds": 3.0, "graph_capture_gib": 0.39,
      "graph_capture_skipped": None, "cudagraph_downgrades": None,
      "startup_seconds": {"model_loading": 1.460361, "torch_compile": 14.32, "graph_capture": 3.0,
                          "init_engine": 31.93, "compilation": 14.32}, "ready": True},
     {"cudagraph_mode": "<CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>",
      "graphs_captured": "Capturing CUDA graphs (PIECEWISE)",
      "graph_capture_seconds": "Graph capturing finished in 3 secs, took 0.39 GiB",
      "compilation_mode": "'mode': <CompilationMode.VLLM_COMPILE: 3>"}),
    ("h200-0.26.0/cudagraph-piecewise.log",
     {"cudagraph_mode": "PIECEWISE", "graphs_captured": ["PIECEWISE"], "graph_capture_seconds": 2.0},
     {"cudagraph_mode": "<CUDAGraphMode.PIECEWISE: 1>"}),
    ("h200-0.26.0/cudagraph-full_decode_only.log",
     {"cudagraph_mode": "FULL_DECODE_ONLY", "graphs_captured": ["FULL"]},
     {"cudagraph_mode": "<CUDAGraphMode.FULL_DECODE_ONLY: (2, 0)>"}),
    ("h200-0.26.0/cudagraph-full.log",
     {"cudagraph_mode": "FULL", "cudagraph_mode_configured": "FULL", "graphs_captured": ["FULL"],
      "graph_capture_gib": 0.17},
     {"cudagraph_mode": "<CUDAGraphMode.FULL: 2>", "graphs_captured": "Capturing CUDA graphs (FULL)"}),
    ("h200-0.26.0/spec-ngram-k4.log",
     {"speculative_method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2,
      "prompt_lookup_max": 4, "async_scheduling": False, "model_runner": "V1",
      "graphs_captured": ["decode, FULL", "mixed prefill-decode, PIECEWISE"],
      "kv_cache_tokens": 3152720, "cudagraph_mode": "FULL_AND_PIECEWISE", "ready": True},
     {"speculative_method": "SpeculativeConfig(method='ngram', model=None, num_spec_tokens=4)",
      "prompt_lookup_min": "'prompt_lookup_min': 2", "prompt_lookup_max": "'prompt_lookup_max': 4",
      "async_scheduling": "Asynchronous scheduling is disabled.",
      "model_runner": "using the V1 model runner instead"}),
    ("h200-0.26.0/fail-gpu-memory-utilization.log",
     {"cudagraph_mode": "FULL_AND_PIECEWISE", "graphs_captured": None, "kv_cache_tokens": None,
      "ready": False},
     {"non_default_args": "'gpu_memory_utilization': 0.999"}),
    ("h200-0.26.0/fail-spec-mtp-unsupported.log",
     {"vllm_version": "0.26.0", "speculative_method": None, "cudagraph_mode": None, "ready": False},
     {"vllm_version": "version 0.26.0"}),
    ("h200-0.26.0/fail-bad-cudagraph-mode.log",
     {"vllm_version": None, "non_default_args": None, "cudagraph_mode": None, "ready": False}, {}),
    ("handwritten/tp4-pcie-nccl-debug.log",
     {"vllm_version": "0.32.0", "tensor_parallel_size": 4, "world_size": 4,
      "cudagraph_mode_configured": "FULL", "cudagraph_mode": "FULL_AND_PIECEWISE",
      "graphs_captured": ["FULL", "PIECEWISE"], "custom_all_reduce_active": False,
      "custom_all_reduce_reason": "pcie_more_than_two_gpus", "allreduce_backends": ["PYNCCL"],
      "attention_backend": "FLASHINFER", "nccl_version": "2.27.3", "nccl_debug_seen": True,
      "nccl_env": {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_BUFFSIZE": "8388608"},
      "nccl_tuning": ["AllReduce: 1048576 Bytes -> Algo RING proto LL",
                      "AllReduce: 33554432 Bytes -> Algo RING proto LL"],
      "nccl_transport": ["P2P/CUMEM", "SHM"], "kv_cache_tokens": 1234560, "ready": True},
     {"cudagraph_mode": "setting cudagraph_mode=FULL_AND_PIECEWISE",
      "cudagraph_mode_configured": "<CUDAGraphMode.FULL: 2>",
      "custom_all_reduce_active":
          "Custom allreduce is disabled because it's not supported on more than two PCIe-only GPUs",
      "allreduce_backends": "Using ['PYNCCL'] all-reduce backends",
      "nccl_env.NCCL_PROTO": "NCCL_PROTO set by environment to LL",
      "nccl_env.NCCL_ALGO": "NCCL_ALGO set by environment to Ring",
      "nccl_tuning": "AllReduce: 1048576 Bytes -> Algo RING proto LL",
      "nccl_transport": "via P2P/CUMEM", "nccl_version": "vLLM is using nccl==2.27.3"}),
    ("handwritten/tp2-nvlink-allreduce.log",
     {"tensor_parallel_size": 2, "custom_all_reduce_active": True, "custom_all_reduce_reason": None,
      "allreduce_backends": ["FLASHINFER", "CUSTOM", "SYMM_MEM", "PYNCCL"], "nccl_debug_seen": None,
      "nccl_env": None, "graphs_captured": ["FULL", "PIECEWISE"], "ready": True},
     {"allreduce_backends": "for group 'tp:0'", "custom_all_reduce_active": "'CUSTOM'"}),
    ("handwritten/cpu-0.32-compiled.log",
     {"platform": "cpu", "dtype": "float32", "compilation_mode": "DYNAMO_TRACE_ONCE",
      "cudagraph_mode_configured": "NONE", "cudagraph_mode": "NONE", "cudagraph_capture_sizes": [],
      "disable_custom_all_reduce": True, "custom_all_reduce_active": False,
      "custom_all_reduce_reason": "disable_custom_all_reduce=True", "distributed_backend": "gloo",
      "model_runner": "V1", "kv_cache_tokens": 87296, "kv_cache_device": "CPU",
      "async_scheduling": False, "graphs_captured": None, "ready": True},
     {"cudagraph_mode": "<CUDAGraphMode.NONE: 0>",
      "compilation_mode": "<CompilationMode.DYNAMO_TRACE_ONCE: 2>",
      "kv_cache_tokens": "CPU KV cache size: 87,296 tokens", "platform": "device_config=cpu"}),
    ("handwritten/compile-mode-override.log",
     {"compilation_mode": "STOCK_TORCH_COMPILE", "cudagraph_mode_configured": "NONE",
      "cudagraph_mode": "NONE", "graph_capture_skipped": True},
     {"cudagraph_mode": "Cudagraph mode PIECEWISE is not compatible with compilation mode "
                        "STOCK_TORCH_COMPILE. Overriding to NONE.",
      "graph_capture_skipped": "Skipping CUDA graph capture"}),
]


@pytest.mark.parametrize(("name", "fields", "evidence"), CASES, ids=[c[0] for c in CASES])
def test_fixture_fields_and_evidence(name: str, fields: dict[str, Any], evidence: dict[str, str]) -> None:
    eff = parse(name)
    got = {key: getattr(eff, key) for key in fields}
    assert got == fields
    for key, text in evidence.items():
        assert text in eff.evidence[key], (key, eff.evidence.get(key))


@pytest.mark.parametrize("path", ALL_LOGS, ids=ALL_IDS)
def test_every_evidence_is_a_short_line_excerpt(path: Path) -> None:
    eff = parse_effective_config(path.read_text(encoding="utf-8"))
    for key, line in eff.evidence.items():
        assert 0 < len(line) <= EVIDENCE_WIDTH, key
        assert "\n" not in line
        assert "\r" not in line
        assert "\x1b" not in line
    for key in eff.model_fields_set - {"evidence", "warnings", "non_default_args_line"}:
        # Every field the log established points at the line that established it.
        assert key in eff.evidence or key in ("cudagraph_downgrades", "custom_all_reduce_reason"), key
    assert eff.warnings == []


@pytest.mark.parametrize("path", ALL_LOGS, ids=ALL_IDS)
def test_json_round_trip(path: Path) -> None:
    eff = parse_effective_config(path.read_text(encoding="utf-8"))
    dumped = eff.model_dump(mode="json")
    assert EffectiveConfig.model_validate(json.loads(json.dumps(dumped))) == eff


def test_model_is_frozen() -> None:
    eff = parse("h200-0.26.0/eager.log")
    with pytest.raises(ValidationError):
        eff.enforce_eager = False  # type: ignore[misc]


def test_non_default_args_enum_reprs_become_names() -> None:
    nda = parse("h200-0.26.0/cudagraph-full_and_piecewise.log").non_default_args
    assert nda is not None
    assert nda["compilation_config"]["cudagraph_mode"] == "FULL_AND_PIECEWISE"
    assert nda["compilation_config"]["dynamic_shapes_config"]["type"] == "BACKED"
    assert nda["served_model_name"] == ["smol"]
    assert parse("h200-0.26.0/spec-ngram-k4.log").non_default_args["speculative_config"] == {  # type: ignore[index]
        "method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}


def test_unparseable_non_default_args_is_a_warning_not_an_error() -> None:
    # A repr literal_eval cannot read (a function object); must never be eval'ed.
    line = ("(APIServer pid=1) INFO 01-01 00:00:00 [api_utils.py:286] non-default args: "
            "{'model': 'm', 'hook': <function f at 0x7f00>, 'x': __import__('os')}")
    eff = parse_effective_config(line + "\n")
    assert eff.non_default_args is None
    assert len(eff.warnings) == 1
    assert "non-default args not parsed" in eff.warnings[0]


def test_ansi_colours_are_stripped() -> None:
    text = read("handwritten/tp2-nvlink-allreduce.log")
    assert "\x1b[" in text
    eff = parse_effective_config(text)
    assert eff.tensor_parallel_size == 2
    assert eff.ready is True
    assert not any("\x1b" in line for line in eff.evidence.values())


# Minimal engine line (hand-written, same shape as the H200 one) followed by one line whose
# text is from vllm-knobs.md section 1 / the vLLM source it cites.
ENGINE_FULL = (
    "(EngineCore pid=1) INFO 01-01 00:00:00 [core.py:133] Initializing a V1 LLM engine (v0.32.0) "
    "with config: model='m', speculative_config=None, dtype=torch.float16, tensor_parallel_size=1, "
    "enforce_eager=False, device_config=cuda, compilation_config={'mode': <CompilationMode.VLLM_COMPILE: 3>, "
    "'cudagraph_mode': <CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>, 'cudagraph_capture_sizes': [1, 2, 4], "
    "'max_cudagraph_capture_size': 4}"
)
W = "(Worker_TP0 pid=2) WARNING 01-01 00:00:01 [compilation.py:1411] "
INFO_LINE = "(EngineCore pid=1) INFO 01-01 00:00:01 [vllm.py:1480] "


@pytest.mark.parametrize(("line", "final"), [
    # config time; the 0.32 source concatenates without a space after the period
    (INFO_LINE + "Cudagraph mode FULL_AND_PIECEWISE is not compatible with compilation mode 2."
     "Overriding to NONE.", "NONE"),
    (INFO_LINE + "Cudagraph mode FULL_AND_PIECEWISE is not compatible with compilation mode DYNAMO_TRACE_ONCE. "
         "Overriding to FULL_DECODE_ONLY.", "FULL_DECODE_ONLY"),
    (W + "CUDAGraphMode.FULL_AND_PIECEWISE is not supported with FlashInferBackend backend "
         "(support: AttentionCGSupport.UNIFORM_BATCH); setting cudagraph_mode=FULL_DECODE_ONLY", "FULL_DECODE_ONLY"),
    (W + "CUDAGraphMode.FULL_AND_PIECEWISE is not supported with TreeAttentionBackend backend "
         "(support: AttentionCGSupport.NEVER); setting cudagraph_mode=PIECEWISE because attention is "
         "compiled piecewise", "PIECEWISE"),
    (W + "CUDAGraphMode.FULL_AND_PIECEWISE is not supported with spec-decode for attention backend "
         "FlashInferBackend (support: AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE); setting "
         "cudagraph_mode=NONE", "NONE"),
    (W + "Pooling models do not support full cudagraphs. Overriding cudagraph_mode to PIECEWISE.", "PIECEWISE"),
    # the hint at the end names FULL, but the change is to NONE
    (W + "Compilation with empty splitting_ops does not contain piecewise cudagraph. Setting "
         "cudagraph_mode to NONE. Hint: If you are using attention backends that support cudagraph, "
         "consider manually setting cudagraph_mode to FULL or FULL_DECODE_ONLY to enable full cudagraphs.",
     "NONE"),
    # not downgrades
    ("ValueError: CUDAGraphMode.FULL is not supported with TreeAttentionBackend backend (support: "
     "AttentionCGSupport.NEVER); please try cudagraph_mode=PIECEWISE, and make sure compilation "
     "mode is VLLM_COMPILE", "FULL_AND_PIECEWISE"),
    (INFO_LINE + "Cudagraph is disabled under eager mode", "FULL_AND_PIECEWISE"),
])
def test_downgrade_lines_set_the_final_mode(line: str, final: str) -> None:
    eff = parse_effective_config(ENGINE_FULL + "\n" + line + "\n")
    assert eff.cudagraph_mode_configured == "FULL_AND_PIECEWISE"
    assert eff.cudagraph_mode == final
    if final != "FULL_AND_PIECEWISE":
        assert eff.evidence["cudagraph_mode"].strip("…") in line
        assert eff.cudagraph_downgrades is not None
        assert eff.cudagraph_downgrades[-1].to_mode == final


def test_repeated_worker_warnings_make_one_downgrade() -> None:
    eff = parse("handwritten/tp4-pcie-nccl-debug.log")
    assert eff.cudagraph_downgrades is not None
    assert [(d.from_mode, d.to_mode) for d in eff.cudagraph_downgrades] == [("FULL", "FULL_AND_PIECEWISE")]
    assert "(Worker_TP0 pid=301)" in eff.cudagraph_downgrades[0].line


@pytest.mark.parametrize(("warning", "reason"), [
    # vllm-knobs.md section 2, custom_all_reduce.py
    ("Custom allreduce is disabled due to an unsupported world size: 3. Supported world sizes: "
     "[2, 4, 6, 8, 16]. To silence this warning, specify disable_custom_all_reduce=True explicitly.",
     "unsupported_world_size"),
    ("Custom allreduce is disabled because your platform lacks GPU P2P capability or P2P test "
     "failed. To silence this warning, specify disable_custom_all_reduce=True explicitly.", "no_p2p"),
    ("Custom allreduce is disabled because it's not supported on more than two PCIe-only GPUs. "
     "To silence this warning, specify disable_custom_all_reduce=True explicitly.", "pcie_more_than_two_gpus"),
])
def test_custom_allreduce_warnings(warning: str, reason: str) -> None:
    # The warning outranks a backends line that would otherwise say the same thing.
    backends = ("(Worker_TP0 pid=2) INFO 01-01 00:00:01 [cuda_communicator.py:353] Using ['PYNCCL'] "
                "all-reduce backends (in dispatch order) for group 'tp:0' out of potential backends: []")
    eff = parse_effective_config(
        f"(Worker_TP0 pid=2) WARNING 01-01 00:00:01 [custom_all_reduce.py:214] {warning}\n{backends}\n")
    assert eff.custom_all_reduce_active is False
    assert eff.custom_all_reduce_reason == reason
    assert warning[:60] in eff.evidence["custom_all_reduce_active"]


def test_nccl_tuning_lines_are_deduplicated_and_capped() -> None:
    line = ("(Worker_TP0 pid=3) h:3:3 [0] NCCL INFO AllReduce: {n} Bytes -> Algo RING proto SIMPLE "
            "channel{{Lo..Hi}}={{0..1}}")
    text = "\n".join(line.format(n=n % 1000) for n in range(5000))
    eff = parse_effective_config(text)
    assert eff.nccl_tuning is not None
    assert len(eff.nccl_tuning) == 256
    assert eff.nccl_tuning[0] == "AllReduce: 0 Bytes -> Algo RING proto SIMPLE"


def test_ray_deduplicated_nccl_lines_keep_only_the_value() -> None:
    # Under Ray, identical worker lines are folded into one with a `[repeated Nx across
    # cluster]` suffix (the form seen in public vLLM-on-Ray reports).
    text = "\n".join([
        "(RayWorkerWrapper pid=539) node:539:539 [6] NCCL INFO NCCL_P2P_LEVEL set by environment to NVL "
        "[repeated 15x across cluster]",
        "(RayWorkerWrapper pid=539) node:539:539 [6] NCCL INFO NCCL_CUMEM_ENABLE set by environment to 0. "
        "[repeated 15x across cluster]",
        "(RayWorkerWrapper pid=540) node:540:540 [1] NCCL INFO NCCL_PROTO set by environment to LL",
    ])
    eff = parse_effective_config(text)
    assert eff.nccl_env == {"NCCL_P2P_LEVEL": "NVL", "NCCL_CUMEM_ENABLE": "0", "NCCL_PROTO": "LL"}


@pytest.mark.parametrize(("raw", "expected"), [
    ("(APIServer pid=707) INFO 11-29 09:57:36 [api_utils.py:273] non-default args: {}",
     ("APIServer", "INFO", "non-default args: {}")),
    ("(EngineCore pid=3894) (APIServer pid=3787) INFO 11-29 10:06:02 [core.py:1313] [shutdown] EngineCore: x",
     ("APIServer", "INFO", "[shutdown] EngineCore: x")),
    ("(EngineCore pid=6044)     raise ValueError(", ("EngineCore", None, "    raise ValueError(")),
    ("(APIServer pid=1361) INFO:     Application startup complete.",
     ("APIServer", "INFO", "Application startup complete.")),
    ("KeyError: 'BOGUS'", (None, None, "KeyError: 'BOGUS'")),
    ("\x1b[1;36m(Worker_TP0 pid=5)\x1b[0;0m \x1b[33mWARNING\x1b[0m 01-10 12:00:00 [x.py:1] hi\r",
     ("Worker_TP0", "WARNING", "hi")),
    ("WARNING 11-29 10:09:59 [argparse_utils.py:422] Found duplicate keys",
     (None, "WARNING", "Found duplicate keys")),
])
def test_split_log_line(raw: str, expected: tuple[str | None, str | None, str]) -> None:
    assert tuple(split_log_line(raw)) == expected


def test_excerpt_keeps_the_match_and_the_width() -> None:
    line = "a" * 1000 + "NEEDLE" + "b" * 1000
    cut = excerpt(line, 1000, 1006)
    assert "NEEDLE" in cut
    assert len(cut) == EVIDENCE_WIDTH
    assert cut.startswith("…")
    assert cut.endswith("…")
    assert excerpt("short\r\n") == "short"
    assert excerpt("x\ry") == "x⏎y"
    assert excerpt_around_key("{'a': {'b': 1}, 'b': 2}", "a.b") == "{'a': {'b': 1}, 'b': 2}"
    assert excerpt_around_key("{'a': 1}", "a.c") is None


def test_a_50_mb_log_parses_in_seconds() -> None:
    head = read("h200-0.26.0/spec-ngram-k4.log")
    # The bulk of a long benchmark log: stats, access lines, tqdm redraws, NCCL tuning.
    bulk = (
        "(APIServer pid=3787) INFO 11-29 10:05:55 [loggers.py:310] Engine 000: Avg prompt throughput: "
        "332.2 tokens/s, Avg generation throughput: 2342.5 tokens/s, Running: 127 reqs, Waiting: 0 reqs, "
        "GPU KV cache usage: 0.3%, Prefix cache hit rate: 0.0%\n" * 20
        + '(APIServer pid=3787) INFO:     127.0.0.1:51234 - "POST /v1/chat/completions HTTP/1.1" 200 OK\n' * 50
        + "(EngineCore pid=3894) " + "".join(
            f"\rCapturing CUDA graphs (decode, FULL): {i}%|█| {i}/48" for i in range(100)) + "\n"
        + "(Worker_TP0 pid=11) h:11:22 [0] NCCL INFO AllReduce: 1048576 Bytes -> Algo RING proto "
          "SIMPLE channel{Lo..Hi}={0..1}\n" * 20
    )
    text = head + bulk * (50_000_000 // len(bulk) + 1)
    assert len(text) >= 50_000_000
    start = time.perf_counter()
    eff = parse_effective_config(text)
    elapsed = time.perf_counter() - start
    assert eff.speculative_method == "ngram"
    assert eff.ready is True
    assert elapsed < 10.0, f"{elapsed:.1f} s"
