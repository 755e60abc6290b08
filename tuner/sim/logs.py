"""vLLM-format log lines (pure builders) and a small line writer.

Formats are copied from real vLLM server logs (shared/fixtures/vllm-0.26.0-h200-logs) with
the version bumped to 0.32.0, so the tuner's log parsers can be tested against the simulator.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TextIO

from tuner.sim.comm import AR_POTENTIAL
from tuner.sim.effective import Effective, Failure, compilation_mode_name

VERSION = "0.32.0"
CG_VALUES = {"NONE": "0", "PIECEWISE": "1", "FULL": "2", "FULL_DECODE_ONLY": "(2, 0)",
             "FULL_AND_PIECEWISE": "(2, 1)"}
SPLITTING_OPS = ["vllm::unified_attention_with_output", "vllm::unified_mla_attention_with_output",
                 "vllm::mamba_mixer2", "vllm::mamba_mixer", "vllm::short_conv",
                 "vllm::linear_attention", "vllm::sparse_attn_indexer",
                 "vllm::unified_kv_cache_update", "vllm::unified_mla_kv_cache_update"]
ROUTES = [("/openapi.json", "GET, HEAD"), ("/docs", "GET, HEAD"), ("/redoc", "GET, HEAD"),
          ("/load", "GET"), ("/version", "GET"), ("/health", "GET"), ("/metrics", "GET"),
          ("/tokenize", "POST"), ("/detokenize", "POST"), ("/v1/models", "GET"), ("/ping", "GET"),
          ("/ping", "POST"), ("/v1/chat/completions", "POST"), ("/v1/completions", "POST")]


class _Raw(str):
    """A string whose repr is itself, to print enum values like Python's repr would."""

    def __repr__(self) -> str:
        return str(self)


def cg_repr(mode: str) -> _Raw:
    return _Raw(f"<CUDAGraphMode.{mode}: {CG_VALUES[mode]}>")


def mode_repr(mode: int) -> _Raw:
    return _Raw(f"<CompilationMode.{compilation_mode_name(mode)}: {mode}>")


def format_line(proc: str, pid: int, level: str, when: float, src: str, msg: str) -> str:
    stamp = time.strftime("%m-%d %H:%M:%S", time.localtime(when))
    return f"({proc} pid={pid}) {level} {stamp} [{src}] {msg}"


def banner(model: str) -> list[str]:
    return ["",
            "       \u2588     \u2588     \u2588\u2584   \u2584\u2588",
            f" \u2584\u2584 \u2584\u2588 \u2588     \u2588     \u2588 \u2580\u2584\u2580 \u2588  version {VERSION}",
            f"  \u2588\u2584\u2588\u2580 \u2588     \u2588     \u2588     \u2588  model   {model}",
            "   \u2580\u2580  \u2580\u2580\u2580\u2580\u2580 \u2580\u2580\u2580\u2580\u2580 \u2580     \u2580",
            ""]


def sim_notice(eff: Effective, time_scale: float) -> str:
    p = eff.profile
    return (f"This is the tuner's vLLM simulator (tuner.sim), not a real vLLM server: profile "
            f"{p.name!r} ({p.description}), time scale {time_scale:g}.")


def non_default_line(nd: Mapping[str, Any]) -> str:
    shown = dict(nd)
    if "compilation_config" in shown:
        cc = shown["compilation_config"]
        full: dict[str, Any] = {
            "mode": mode_repr(cc["mode"]) if cc.get("mode") is not None else None,
            "debug_dump_path": None, "cache_dir": "", "compile_cache_save_format": "binary",
            "backend": cc.get("backend", "inductor"), "custom_ops": cc.get("custom_ops", []),
            "splitting_ops": cc.get("splitting_ops"), "compile_sizes": cc.get("compile_sizes"),
            "inductor_compile_config": {"enable_auto_functionalized_v2": False,
                                        "combo_kernels": True, "benchmark_combo_kernel": True},
            "inductor_passes": {},
            "cudagraph_mode": cg_repr(cc["cudagraph_mode"]) if cc.get("cudagraph_mode") else None,
            "cudagraph_num_of_warmups": 0,
            "cudagraph_capture_sizes": cc.get("cudagraph_capture_sizes"),
            "cudagraph_copy_inputs": False, "cudagraph_specialize_lora": True,
            "use_inductor_graph_partition": None, "pass_config": cc.get("pass_config", {}),
            "max_cudagraph_capture_size": cc.get("max_cudagraph_capture_size"),
            "local_cache_dir": None, "fast_moe_cold_start": None, "static_all_moe_layers": [],
        }
        shown["compilation_config"] = full
    return f"non-default args: {shown!r}"


def engine_config_line(eff: Effective) -> str:
    p = eff.profile
    graphs = eff.cudagraph_mode_config != "NONE"
    compiled = eff.compile_mode == 3
    cc: dict[str, Any] = {
        "mode": mode_repr(eff.compile_mode), "debug_dump_path": None, "cache_dir": "",
        "compile_cache_save_format": "binary", "backend": "inductor",
        "custom_ops": ["none"] if eff.compile_mode else ["all"],
        "ir_enable_torch_wrap": bool(eff.compile_mode),
        "splitting_ops": SPLITTING_OPS if compiled else [], "compile_mm_encoder": False,
        "cudagraph_mm_encoder": False, "compile_sizes": [],
        "compile_ranges_endpoints": [eff.max_num_batched_tokens],
        "inductor_compile_config": {"enable_auto_functionalized_v2": False, "size_asserts": False,
                                    "alignment_asserts": False, "scalar_asserts": False,
                                    "combo_kernels": True, "benchmark_combo_kernel": True},
        "inductor_passes": {}, "cudagraph_mode": cg_repr(eff.cudagraph_mode_config),
        "cudagraph_num_of_warmups": 1 if graphs else 0,
        "cudagraph_capture_sizes": list(eff.capture_sizes_config),
        "cudagraph_copy_inputs": False, "cudagraph_specialize_lora": True,
        "use_inductor_graph_partition": False,
        "pass_config": {"fuse_norm_quant": not compiled, "fuse_act_quant": not compiled,
                        "fuse_attn_quant": False, "enable_sp": False, "fuse_gemm_comms": False,
                        "fuse_allreduce_rms": "FLASHINFER" in eff.allreduce_backends,
                        "enable_qk_norm_rope_fusion": False, "fuse_rope_kvcache_cat_mla": False,
                        "fuse_act_padding": False, "fuse_qk_norm_rope_kvcache": False},
        "max_cudagraph_capture_size": eff.max_capture_size,
        "dynamic_shapes_config": {"type": _Raw("<DynamicShapesType.BACKED: 'backed'>"),
                                  "evaluate_guards": False, "assume_32_bit_indexing": False},
        "local_cache_dir": None, "fast_moe_cold_start": False, "static_all_moe_layers": [],
    }
    spec = eff.spec.render() if eff.spec else "None"
    quant = eff.quantization or "None"
    device = "cuda" if p.hardware.platform == "cuda" else "cpu"
    return (
        f"Initializing a V1 LLM engine (v{VERSION}) with config: model={eff.model!r}, "
        f"speculative_config={spec}, tokenizer={eff.model!r}, skip_tokenizer_init=False, "
        "tokenizer_mode=auto, revision=None, tokenizer_revision=None, trust_remote_code=False, "
        f"dtype=torch.{eff.dtype}, max_seq_len={eff.max_model_len}, download_dir=None, "
        f"load_format={eff.load_format}, tensor_parallel_size={eff.tp}, pipeline_parallel_size={eff.pp}, "
        "data_parallel_size=1, decode_context_parallel_size=1, dcp_comm_backend=ag_rs, "
        f"disable_custom_all_reduce={eff.disable_custom_all_reduce}, quantization={quant}, "
        f"quantization_config=None, enforce_eager={eff.enforce_eager}, "
        f"enable_return_routed_experts=False, kv_cache_dtype={eff.kv_cache_dtype}, "
        f"device_config={device}, structured_outputs_config=StructuredOutputsConfig(backend='auto',"
        " disable_any_whitespace=False, disable_additional_properties=False, reasoning_parser='', "
        "reasoning_parser_plugin='', enable_in_reasoning=False), observability_config="
        "ObservabilityConfig(show_hidden_metrics_for_version=None, otlp_traces_endpoint=None, "
        "collect_detailed_traces=None, kv_cache_metrics=False, kv_cache_metrics_sample=0.01, "
        "cudagraph_metrics=False, enable_layerwise_nvtx_tracing=False, enable_mfu_metrics=False, "
        "enable_mm_processor_stats=False, enable_logging_iteration_details=False, "
        f"jit_monitor_mode='warn', jit_monitor_verbose=False), seed={eff.seed}, "
        f"served_model_name={eff.served_model_names[0]}, "
        f"enable_prefix_caching={eff.enable_prefix_caching}, enable_chunked_prefill=True, "
        f"pooler_config=None, compilation_config={cc!r}, kernel_config=KernelConfig("
        "ir_op_priority=IrOpPriorityConfig(rms_norm=['native'], fused_add_rms_norm=['native']), "
        "enable_flashinfer_autotune=True, enable_cutedsl_warmup=True, "
        "enable_bf16x3_router_gemm=False, moe_backend='auto', linear_backend='auto')"
    )


def nccl_debug_lines(eff: Effective, pid: int) -> list[str]:
    """NCCL's own INFO lines (printed without vLLM's level prefix) under NCCL_DEBUG=INFO."""
    if (eff.nccl.debug or "").upper() not in ("INFO", "TRACE") or "PYNCCL" not in eff.allreduce_backends:
        return []
    pre = f"simhost:{pid}:{pid} [0] NCCL INFO "
    lines = []
    if eff.nccl.proto_env:
        lines.append(pre + f"NCCL_PROTO set by environment to {eff.nccl.proto_env}")
    if eff.nccl.algo_env:
        lines.append(pre + f"NCCL_ALGO set by environment to {eff.nccl.algo_env}")
    if eff.nccl.p2p_disabled:
        lines.append(pre + "NCCL_P2P_DISABLE set by environment to 1")
    transport = "SHM/direct/direct" if eff.nccl.p2p_disabled else (
        "P2P/CUMEM" if eff.profile.hardware.interconnect == "nvlink" else "P2P/CUMEM/read")
    if eff.nccl.p2p_disabled and eff.profile.hardware.interconnect == "nvlink":
        transport = "SHM/direct/direct"
    nch = eff.nccl.max_channels or eff.profile.nccl.default_channels
    for c in range(nch):
        lines.append(pre + f"Channel {c:02d}/{nch:02d} : 0[0] -> 1[1] via {transport}")
    lines.append(pre + f"{nch} coll channels, {nch} collnet channels, 0 nvls channels, "
                 f"{nch} p2p channels, {max(1, nch // 2)} p2p channels per peer")
    protos = eff.nccl.protos or tuple(eff.profile.nccl.default_enabled_protos)
    lines.append(pre + "Enabled NCCL Func/Proto/Algo Matrix: AllReduce protos "
                 f"{','.join(protos)} algo {eff.nccl.algo}")
    return lines


def backends_line(eff: Effective) -> str:
    return (f"Using {list(eff.allreduce_backends)!r} all-reduce backends (in dispatch order) for "
            f"group 'tp:0' out of potential backends: {list(AR_POTENTIAL)!r}.")


def capture_bars(eff: Effective, secs: float) -> list[str]:
    """tqdm-style final states of the capture bars (V1 runner wording unless profile says v2)."""
    n = len(eff.capture_sizes)
    if not n:
        return []
    v1 = eff.profile.model_runner == "v1"
    names = {"PIECEWISE": ["mixed prefill-decode, PIECEWISE" if v1 else "PIECEWISE"],
             "FULL": ["mixed prefill-decode, FULL" if v1 else "FULL"],
             "FULL_DECODE_ONLY": ["decode, FULL" if v1 else "FULL"],
             "FULL_AND_PIECEWISE": ["mixed prefill-decode, PIECEWISE" if v1 else "PIECEWISE",
                                    "decode, FULL" if v1 else "FULL"]}[eff.cudagraph_mode]
    rate = n / max(secs / len(names), 1e-3)
    mm, ss = divmod(int(secs / len(names)), 60)
    return [f"Capturing CUDA graphs ({name}): 100%|\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588"
            f"\u2588\u2588| {n}/{n} [{mm:02d}:{ss:02d}<00:00, {rate:.2f}it/s]" for name in names]


def route_lines() -> list[str]:
    return [f"Route: {path}, Methods: {methods}" for path, methods in ROUTES]


def stats_line(prompt_tps: float, gen_tps: float, running: int, waiting: int, kv: float,
               prefix_rate: float) -> str:
    return (f"Engine 000: Avg prompt throughput: {prompt_tps:.1f} tokens/s, Avg generation "
            f"throughput: {gen_tps:.1f} tokens/s, Running: {running} reqs, Waiting: {waiting} "
            f"reqs, GPU KV cache usage: {kv * 100:.1f}%, Prefix cache hit rate: "
            f"{prefix_rate * 100:.1f}%")


def spec_line(drafts: int, draft_tokens: int, accepted: int, per_pos: Iterable[int],
              interval: float) -> str:
    mean_len = 1 + accepted / drafts if drafts else 1.0
    rates = ", ".join(f"{a / drafts:.3f}" if drafts else "0.000" for a in per_pos)
    avg = accepted / draft_tokens * 100 if draft_tokens else 0.0
    return (f"SpecDecoding metrics: Mean acceptance length: {mean_len:.2f}, Accepted throughput: "
            f"{accepted / interval:.2f} tokens/s, Drafted throughput: {draft_tokens / interval:.2f}"
            f" tokens/s, Accepted: {accepted} tokens, Drafted: {draft_tokens} tokens, "
            f"Per-position acceptance rate: {rates}, Avg Draft acceptance rate: {avg:.1f}%")


def traceback_lines(failure: Failure) -> list[str]:
    lines = ["Traceback (most recent call last):"]
    if failure.phase == "api":
        lines += ['  File "site-packages/vllm/entrypoints/cli/serve.py", line 64, in cmd',
                  "    uvloop.run(run_server(args))",
                  '  File "site-packages/vllm/engine/arg_utils.py", line 2159, in '
                  "create_engine_config",
                  "    vllm_config = engine_args.create_engine_config(usage_context=usage_context)"]
    else:
        lines += ['  File "site-packages/vllm/v1/engine/core.py", line 1299, in run_engine_core',
                  "    engine_core = EngineCoreProc(*args, engine_index=dp_rank, **kwargs)",
                  '  File "site-packages/vllm/v1/worker/gpu_worker.py", line 389, in init_device',
                  "    self.worker.init_device()  # type: ignore"]
    for frame in failure.frames:
        lines += frame.split("\n")
    lines += f"{failure.exc_type}: {failure.message}".split("\n")
    return lines


ENGINE_STARTUP_FAILED = [
    "Traceback (most recent call last):",
    '  File "site-packages/vllm/v1/engine/utils.py", line 1272, in wait_for_engine_startup',
    "    raise RuntimeError(",
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
]


class LogWriter:
    """Writes prefixed, flushed lines; the only I/O in this module. Thread-safe."""

    def __init__(self, stream: TextIO | None = None, clock: Callable[[], float] = time.time,
                 api_pid: int = 0) -> None:
        self.stream = stream or sys.stdout
        self.clock = clock
        self.api_pid = api_pid
        self.engine_pid = 0
        self._lock = threading.Lock()

    def _write(self, text: str) -> None:
        with self._lock:
            try:
                self.stream.write(text + "\n")
                self.stream.flush()
            except (BrokenPipeError, ValueError):
                pass   # stdout closed by the reader: logging must never kill the server

    def api(self, level: str, src: str, msg: str) -> None:
        self._write(format_line("APIServer", self.api_pid, level, self.clock(), src, msg))

    def engine(self, level: str, src: str, msg: str) -> None:
        self._write(format_line("EngineCore", self.engine_pid, level, self.clock(), src, msg))

    def raw(self, text: str, proc: str | None = None) -> None:
        if proc is None:
            self._write(text)
        else:
            pid = self.api_pid if proc == "APIServer" else self.engine_pid
            self._write(f"({proc} pid={pid}) {text}")
