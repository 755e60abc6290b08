"""vLLM's torch.compile cache, seen from the tuner: what a server log says about it, and
which of a study's knobs decide whether two trials can share it.

vLLM keeps compiled graphs under ``$VLLM_CACHE_ROOT/torch_compile_cache`` (default
``~/.cache/vllm``): one directory per hash of the compile-relevant configuration
(``<hash10>/rank_<r>_<dp>/<prefix>`` for Inductor's artifacts) and, with AOT compilation
(``VLLM_USE_AOT_COMPILE``, on by default with torch >= 2.10: the 0.26 and 0.32 fixture logs
both save an artifact), ``torch_aot_compile/<sha256>/rank_<r>_<dp>/model`` for the whole
compiled forward. A server whose key was compiled before loads instead of compiling. CUDA
graphs are *not* cached: every process captures them again (the capture is tied to the
process's CUDA context and memory pool; vLLM has no on-disk format for them).

**The log** (:func:`parse_compile_log`). Format strings, vLLM source:

* miss: ``backends.py`` "Using cache directory: %s for vLLM's torch.compile", "Dynamo
  bytecode transform time: %.2f s", "Cache the graph of compile range %s for later use",
  "Compiling a graph for compile range %s takes %.2f s"; ``decorators.py`` (0.32:
  ``compilation/aot`` cache) "saved AOT compiled function to %s" (0.32 prefixes the
  compiled module, "[backbone] "); ``monitor.py`` "torch.compile took %.2f s in total";
  ``core.py`` "init engine (profile, create kv cache, warmup model) took %.2f s
  (compilation: %.2f s)".
* hit: ``backends.py`` "Directly load the compiled graph(s) for compile range %s from the
  cache, took %.3f s"; the AOT cache "Directly load AOT compilation from path %s"; a
  standalone AOT artifact also "reconstructed serializable fn from standalone compile
  artifacts. num_artifacts=%d num_submods=%d".
* a stale or broken entry: "Compiling model again due to a load failure from %s, reason: %s".

Real AOT hits (public 0.2x logs, ``decorators.py:303-311``) still print "Using cache
directory" and "Dynamo bytecode transform time" (1.1-2.9 s) before the Inductor load
(0.2-1.9 s); torch.compile takes 1.6-4.9 s in total where the miss took 9.7-14.8 s.

**The key** (:func:`compile_key`): a *prediction* from the asked values, so trials can be
grouped before they run; what vLLM really did is the record's ``cache_dir`` hash. vLLM's
key (``AotCompileCache._compute_hash_key``, ``VllmBackend``'s cache dir) hashes
``envs.compile_factors()`` (every vLLM env var except an ignore list), ``VllmConfig.
compute_hash()`` (model, cache, parallel, scheduler, device, load, attention, lora,
speculative, structured outputs, observability, compilation, kernel, kv-transfer and
additional config, each with its own factors), the traced source files and the forward's
identity (vLLM version). Which knob goes where is in :data:`RELEVANT` / :data:`IRRELEVANT`;
a target in neither is counted as relevant (a false "same key" would promise a hit that
does not happen; a false "different key" only misses a saving).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = ["CompileRecord", "parse_compile_log", "compile_key", "compile_settings", "relevance",
           "RELEVANT", "IRRELEVANT", "IGNORED_VLLM_ENV", "validate_cache_dir", "cache_env",
           "CACHE_ENV"]

CACHE_ENV = "VLLM_CACHE_ROOT"

Cache = Literal["hit", "miss", "partial", "none"]

# (Name pid=N) prefixes vLLM (and Ray) put before a line; several may be nested.
_PREFIX_RE = re.compile(r"^\s*((?:\([\w.\-]+ pid=\d+\) ?)+)")
_MODULE_RE = r"(?:\[[\w.\-]+\] )?"        # 0.32: "[backbone] saved AOT compiled function ..."
_CACHE_DIR_RE = re.compile(r"Using cache directory: (.+?) for vLLM's torch\.compile")
_DYNAMO_RE = re.compile(r"Dynamo bytecode transform time: ([\d.]+) s")
_COMPILED_RE = re.compile(r"Compiling a graph for (?:compile range \(\d+, \d+\)|shape \S+|dynamic shape) "
                          r"takes ([\d.]+) s")
_LOADED_RE = re.compile(r"Directly load the compiled graph\(s\) for (?:compile range \(\d+, \d+\)|shape \S+|"
                        r"dynamic shape) from the cache, took ([\d.]+) s")
_AOT_SAVED_RE = re.compile(_MODULE_RE + r"saved AOT compiled function to (\S+)")
_AOT_LOADED_RE = re.compile(_MODULE_RE + r"Directly load AOT compilation from path (\S+)")
# The engine config line says whether torch.compile runs at all (no compile lines then
# mean "none"); with compilation on and no cache lines (the CPU build with
# VLLM_USE_AOT_COMPILE=0 prints only "Warming up model for the compilation...") the cache
# status is unknown, not "none".
_ENGINE_EAGER_RE = re.compile(r"Initializing a V1 LLM engine .*?\benforce_eager=(True|False)")
_ENGINE_MODE_RE = re.compile(r"Initializing a V1 LLM engine .*?'mode': <CompilationMode\.(\w+):")
_RELOAD_RE = re.compile(r"Compiling model again due to a load failure from (\S+), reason: (.*)$")
_TOTAL_RE = re.compile(_MODULE_RE + r"torch\.compile (?:took|takes) ([\d.]+) s in total")
_CAPTURE_RE = re.compile(r"Graph capturing finished in ([\d.]+) secs?")
_INIT_RE = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s"
                      r"(?: \(compilation: ([\d.]+) s\))?")


@dataclass
class CompileRecord:
    """What one server's log says about torch.compile and its cache.

    ``cache``: "hit" (every compiled graph and/or the AOT artifact was loaded), "miss"
    (compiled, nothing loaded), "partial" (some loaded, some compiled - e.g. the AOT
    artifact loaded but a graph range compiled, or a stale entry recompiled), "none" (the
    engine started without torch.compile: eager, or compilation off), None (unknown: the
    log stops before the engine was up, or a vLLM version whose lines are not known)."""

    cache: Cache | None = None
    compile_s: float | None = None            # vLLM's "compilation" / torch.compile total
    dynamo_s: float | None = None
    inductor_s: float | None = None           # compiling graphs (misses)
    load_s: float | None = None               # loading graphs from the cache (hits)
    cache_dir: str | None = None              # the first "Using cache directory"
    cache_hash: str | None = None             # its hash component (torch_compile_cache/<hash>/...)
    aot: Literal["loaded", "saved"] | None = None
    aot_path: str | None = None
    reload_reason: str | None = None          # "Compiling model again due to a load failure"
    graph_capture_s: float | None = None
    init_engine_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> CompileRecord | None:
        """None for None (an outcome written before compile records existed: unknown)."""

        if data is None:
            return None
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


def _split(line: str) -> tuple[str, str]:
    m = _PREFIX_RE.match(line)
    return (m.group(1).strip(), line[m.end():]) if m else ("", line)


def parse_compile_log(text: str) -> CompileRecord:
    """The compile record of one server log (any prefix of it; see CompileRecord.cache).

    Tensor-parallel workers each print the compile lines: times are taken from the process
    that printed the first one (rank 0 prints first), directories from the first line."""

    rec = CompileRecord()
    source: str | None = None     # the process whose times are read
    compiled = loaded = aot_saved = aot_loaded = reloaded = False
    totals: list[float] = []
    dyn: list[float] = []
    ind: list[float] = []
    lod: list[float] = []
    init_compilation: float | None = None
    started = False
    compiles: bool | None = None   # from the engine config line; None: not seen
    for raw in text.splitlines():
        prefix, line = _split(raw)

        def mine() -> bool:
            nonlocal source
            if source is None:
                source = prefix
            return prefix == source

        if (m := _CACHE_DIR_RE.search(line)) is not None:
            if rec.cache_dir is None:
                rec.cache_dir = m.group(1)
                h = re.search(r"torch_compile_cache[/\\]([0-9a-f]+)[/\\]", rec.cache_dir)
                rec.cache_hash = h.group(1) if h else None
            mine()
        elif (m := _DYNAMO_RE.search(line)) is not None:
            if mine():
                dyn.append(float(m.group(1)))
        elif (m := _COMPILED_RE.search(line)) is not None:
            compiled = True
            if mine():
                ind.append(float(m.group(1)))
        elif (m := _LOADED_RE.search(line)) is not None:
            loaded = True
            if mine():
                lod.append(float(m.group(1)))
        elif (m := _AOT_SAVED_RE.search(line)) is not None:
            aot_saved = True
            rec.aot_path = rec.aot_path or m.group(1)
        elif (m := _AOT_LOADED_RE.search(line)) is not None:
            aot_loaded = True
            rec.aot_path = rec.aot_path or m.group(1)
        elif (m := _RELOAD_RE.search(line)) is not None:
            reloaded = True
            rec.reload_reason = rec.reload_reason or m.group(2).strip()
        elif (m := _TOTAL_RE.search(line)) is not None:
            if mine():
                totals.append(float(m.group(1)))
        elif (m := _CAPTURE_RE.search(line)) is not None:
            if rec.graph_capture_s is None:
                rec.graph_capture_s = float(m.group(1))
        elif "Initializing a V1 LLM engine" in line:
            eager = _ENGINE_EAGER_RE.search(line)
            mode = _ENGINE_MODE_RE.search(line)
            compiles = not ((eager and eager.group(1) == "True") or (mode and mode.group(1) == "NONE"))
        elif (m := _INIT_RE.search(line)) is not None:
            started = True
            if rec.init_engine_s is None:
                rec.init_engine_s = float(m.group(1))
                init_compilation = float(m.group(2)) if m.group(2) else None
    rec.dynamo_s = round(sum(dyn), 3) if dyn else None
    rec.inductor_s = round(sum(ind), 3) if ind else None
    rec.load_s = round(sum(lod), 3) if lod else None
    rec.compile_s = init_compilation if init_compilation is not None else (
        round(sum(totals), 3) if totals else None)
    rec.aot = "loaded" if aot_loaded else ("saved" if aot_saved else None)
    hit = loaded or aot_loaded
    miss = compiled or aot_saved or reloaded
    if hit and miss:
        rec.cache = "partial"
    elif hit:
        rec.cache = "hit"
    elif miss:
        rec.cache = "miss"
    elif started and rec.cache_dir is None and not totals and compiles is not True:
        rec.cache = "none"
    return rec


# ------------------------------------------------------------------------------ the key

# Knob targets (as in a study's flat "asked" settings) whose value enters vLLM's compile
# cache key, with where. Prefix entries end with ".".
RELEVANT: dict[str, str] = {
    "model": "ModelConfig.compute_hash (every field but an ignore list)",
    "revision": "ModelConfig.compute_hash",
    "quantization": "ModelConfig.compute_hash",
    "dtype": "ModelConfig.compute_hash",
    "max_model_len": "ModelConfig.compute_hash (not in its ignore list)",
    "hf_overrides": "changes the model's config, hence the graph",
    "tensor_parallel_size": "ParallelConfig.compute_hash",
    "pipeline_parallel_size": "ParallelConfig.compute_hash",
    "data_parallel_size": "ParallelConfig.compute_hash",
    "enable_expert_parallel": "ParallelConfig.compute_hash",
    "kv_cache_dtype": "CacheConfig.compute_hash (not ignored: the attention ops change)",
    "block_size": "CacheConfig.compute_hash",
    "calculate_kv_scales": "CacheConfig.compute_hash",
    "kv_cache_memory_bytes": "CacheConfig field not in its ignore list (counted, to be safe)",
    "enforce_eager": "sets CompilationConfig.mode NONE: no compile at all (no key)",
    "optimization_level": "-O sets the compilation mode and cudagraph defaults (CompilationConfig)",
    "compilation_config.": "CompilationConfig.compute_hash hashes every field except cache/dump "
                           "paths, traced files and timings: mode, cudagraph_mode, capture sizes, "
                           "compile sizes/ranges, pass config ...",
    "cudagraph_capture_sizes": "CompilationConfig.cudagraph_capture_sizes",
    "max_cudagraph_capture_size": "CompilationConfig.max_cudagraph_capture_size",
    "max_num_batched_tokens": "upper end of the compile ranges (compile_ranges_split_points, "
                              "'compile range (1, N)'), a CompilationConfig field",
    "max_num_seqs": "default capture sizes are derived from it (max_cudagraph_capture_size), "
                    "which CompilationConfig hashes",
    "speculative_config.": "SpeculativeConfig.compute_hash, and k rounds the capture sizes; a "
                           "drafter compiles its own graphs",
    "attention_backend": "AttentionConfig.compute_hash",
    "attention_config.": "AttentionConfig.compute_hash",
    "kernel_config.": "KernelConfig.compute_hash",
    "additional_config": "hashed as JSON",
    "lora_config.": "LoRAConfig.compute_hash",
    "enable_lora": "LoRAConfig",
}

IRRELEVANT: dict[str, str] = {
    "gpu_memory_utilization": "CacheConfig ignore list",
    "enable_prefix_caching": "CacheConfig ignore list",
    "prefix_caching_hash_algo": "CacheConfig ignore list",
    "num_gpu_blocks_override": "CacheConfig ignore list",
    "kv_sharing_fast_prefill": "CacheConfig ignore list",
    "swap_space": "CacheConfig ignore list",
    "cpu_offload_gb": "CacheConfig ignore list (no torch.compile for offload)",
    "seed": "ModelConfig ignore list",
    "served_model_name": "ModelConfig ignore list",
    "tokenizer": "ModelConfig ignore list",
    "tokenizer_mode": "ModelConfig ignore list",
    "skip_tokenizer_init": "ModelConfig ignore list",
    "disable_cascade_attn": "ModelConfig ignore list",
    "logprobs_mode": "ModelConfig ignore list",
    "async_scheduling": "SchedulerConfig.compute_hash has no factors",
    "enable_chunked_prefill": "SchedulerConfig.compute_hash has no factors",
    "long_prefill_token_threshold": "SchedulerConfig.compute_hash has no factors",
    "max_num_partial_prefills": "SchedulerConfig.compute_hash has no factors",
    "max_long_partial_prefills": "SchedulerConfig.compute_hash has no factors",
    "scheduling_policy": "SchedulerConfig.compute_hash has no factors",
    "stream_interval": "SchedulerConfig.compute_hash has no factors",
    "disable_hybrid_kv_cache_manager": "SchedulerConfig.compute_hash has no factors",
    "disable_custom_all_reduce": "ParallelConfig.compute_hash ignore list ('runtime topology, "
                                 "networking, or launch details'); the all-reduce is chosen at run time",
    "distributed_executor_backend": "ParallelConfig.compute_hash ignore list",
    "disable_log_stats": "outside the graph",
    "disable_log_requests": "outside the graph",
    "enable_log_requests": "outside the graph",
    "host": "outside VllmConfig",
    "port": "outside VllmConfig",
    "uvicorn_log_level": "outside VllmConfig",
}

# vLLM env vars envs.compile_factors() leaves out (vllm/envs.py, 0.2x-0.3x; subset that a
# study may set). Every other VLLM_* variable is hashed. Variables that are not vLLM's
# (NCCL_*, TORCH_*, CUDA_*) are not hashed at all - except the RAY_EXPERIMENTAL_NOSET_*.
IGNORED_VLLM_ENV = frozenset({
    "VLLM_RPC_BASE_PATH", "VLLM_USE_MODELSCOPE", "VLLM_RINGBUFFER_WARNING_INTERVAL",
    "VLLM_DEBUG_DUMP_PATH", "VLLM_PORT", "VLLM_CACHE_ROOT", "VLLM_SERVER_DEV_MODE",
    "VLLM_DP_MASTER_IP", "VLLM_DP_MASTER_PORT", "VLLM_NIXL_SIDE_CHANNEL_HOST",
    "VLLM_RANDOMIZE_DP_DUMMY_INPUTS", "VLLM_CI_USE_S3", "VLLM_MODEL_REDIRECT_PATH", "VLLM_HOST_IP",
    "VLLM_FORCE_AOT_LOAD", "VLLM_USAGE_STATS_SERVER", "VLLM_NO_USAGE_STATS", "VLLM_DO_NOT_TRACK",
    "VLLM_LOGGING_LEVEL", "VLLM_LOGGING_PREFIX", "VLLM_LOGGING_STREAM", "VLLM_LOGGING_CONFIG_PATH",
    "VLLM_LOGGING_COLOR", "VLLM_LOG_STATS_INTERVAL", "VLLM_DEBUG_LOG_API_SERVER_RESPONSE",
    "VLLM_TUNED_CONFIG_FOLDER", "VLLM_ENGINE_ITERATION_TIMEOUT_S", "VLLM_HTTP_TIMEOUT_KEEP_ALIVE",
    "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "VLLM_KEEP_ALIVE_ON_ENGINE_DEATH", "VLLM_IMAGE_FETCH_TIMEOUT",
    "VLLM_VIDEO_FETCH_TIMEOUT", "VLLM_AUDIO_FETCH_TIMEOUT", "VLLM_MEDIA_CACHE",
    "VLLM_WORKER_MULTIPROC_METHOD", "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_V1_OUTPUT_PROC_CHUNK_SIZE",
    "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_MOE_PREPACK", "VLLM_ASSETS_CACHE", "VLLM_ASSETS_CACHE_MODEL_CLEAN",
    "VLLM_SKIP_MODEL_NAME_VALIDATION", "VLLM_ENABLE_CUDA_COMPATIBILITY", "VLLM_CUDA_COMPATIBILITY_PATH",
})


def relevance(target: str) -> tuple[bool, str]:
    """(does this knob target enter vLLM's compile cache key, why)."""

    if target.startswith("env:"):
        name = target[4:]
        if name.startswith("RAY_EXPERIMENTAL_NOSET_"):
            return True, "envs.compile_factors hashes the RAY_EXPERIMENTAL_NOSET_* variables"
        if not name.startswith("VLLM_"):
            return False, "not a vLLM variable: envs.compile_factors hashes vLLM's own only"
        if name in IGNORED_VLLM_ENV:
            return False, "in envs.compile_factors' ignore list"
        return True, "a vLLM variable envs.compile_factors hashes"
    for table, verdict in ((IRRELEVANT, False), (RELEVANT, True)):
        for key, why in table.items():
            if target == key or (key.endswith(".") and target.startswith(key)):
                if target in ("compilation_config.cache_dir", "compilation_config.debug_dump_path",
                              "compilation_config.local_cache_dir"):
                    return False, "CompilationConfig ignore list (paths)"
                return verdict, why
    return True, "not known to be outside vLLM's key: counted as relevant"


def _eager(asked: Mapping[str, Any]) -> bool:
    if asked.get("enforce_eager") in (True, "true", "True", 1):
        return True
    mode = asked.get("compilation_config.mode", asked.get("compilation_config.level"))
    return mode in (0, "0", "NONE", "none")


def compile_settings(asked: Mapping[str, Any]) -> dict[str, Any]:
    """The compile-relevant part of a trial's asked settings (flat target -> value)."""

    return {k: v for k, v in sorted(asked.items()) if v is not None and relevance(k)[0]}


def compile_key(asked: Mapping[str, Any]) -> str | None:
    """A short hash of the compile-relevant asked settings; None when the trial compiles
    nothing (eager, compilation mode NONE). Equal keys: the second trial should load."""

    if _eager(asked):
        return None
    text = json.dumps(compile_settings(asked), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------ cache dir


def validate_cache_dir(value: str | None) -> str | None:
    """``execution.compile_cache_dir``: ``~`` and ``$VARS`` expanded; must then be absolute.

    A relative path is refused: every server starts in its own working directory (and a
    multi-node study on other hosts), so a relative path would name a different directory
    per trial and nothing would be shared."""

    if value is None:
        return None
    text = str(value).strip()
    if not text:
        raise ValueError("compile_cache_dir is empty; leave it out to use vLLM's default")
    expanded = os.path.expandvars(os.path.expanduser(text))
    if "$" in expanded:
        raise ValueError(f"compile_cache_dir {value!r}: unset variable in {expanded!r}")
    if not os.path.isabs(expanded):
        raise ValueError(f"compile_cache_dir {value!r} is relative; give an absolute path (or "
                         "~/...): each server runs in its own directory, so a relative one "
                         "would not be shared between trials")
    return str(Path(expanded))


def cache_env(compile_cache_dir: str | None, study_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """What to add to a trial server's environment for ``execution.compile_cache_dir``:
    ``{VLLM_CACHE_ROOT: dir}``, or nothing when it is unset or the study sets
    VLLM_CACHE_ROOT itself (an explicit server env knob wins and is what export carries)."""

    if not compile_cache_dir or (study_env and CACHE_ENV in study_env):
        return {}
    return {CACHE_ENV: compile_cache_dir}
