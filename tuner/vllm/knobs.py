"""vLLM's knobs, each described once, and the one renderer that puts them on a command line.

A study names a knob by its *target*: a top-level engine argument in snake_case
(``enforce_eager``), a dotted field of a JSON config argument
(``compilation_config.cudagraph_mode``) or an environment variable (``env:NCCL_PROTO``).
:data:`KNOBS` has one :class:`Knob` per known target: its label, its valid values (with
their aliases, e.g. cudagraph mode ``2`` = ``FULL``), other spellings of the same target,
the :class:`~tuner.vllm.effective_config.EffectiveConfig` field the server log shows it in,
the rule that verifies it (``tuner.vllm.verify``), when a mismatch in a partial startup log
is already final, whether it enters vLLM's compile-cache key and what its log needs in the
environment. A target not in the table still gets an entry from its family (``env:NCCL_*``,
``env:VLLM_*``, a config argument such as ``speculative_config.*``, any other argument):
vLLM has hundreds of flags and a study may name any of them. Adding a knob is one entry
here plus a log fixture that shows it.

The catalog (spec validation), the verifier, downgrade detection while a server starts,
the compile-cache key and the labels in ``tuner status`` all read :func:`knob`.

:func:`render_command` turns fixed server settings plus a trial's settings into the argv,
the configuration environment (what is measured and exported) and the measurement-only
environment (``NCCL_DEBUG`` so the log shows NCCL's choices, ``VLLM_CACHE_ROOT`` for the
study's shared compile cache: never part of an export), with the flat asked settings the
verifier checks. Trials, the reference, confirmation re-runs and ``tuner export`` all call it.

Pure. Sources: ../shared/reference/vllm-knobs.md sections 1-4 and 7; vLLM's
``VllmConfig.compute_hash`` and ``envs.compile_factors`` for the compile-key column.

The kinds of value a knob accepts (``Choice``, ``Flag``, ``Int``, ...) live in
``tuner.vllm.knob_values``; vLLM's vocabularies (the cudagraph modes, ...), the table, its
lookups and the renderer stay together here, so following one knob from the study file to
the exported command stays in this module.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol

from tuner.vllm.knob_values import (
    ANY,
    Choice,
    EnvInt,
    Flag,
    Int,
    IntList,
    NcclList,
    Values,
)

if TYPE_CHECKING:  # only for annotations: `tuner status` reads labels without pydantic
    from tuner.vllm.effective_config import EffectiveConfig

__all__ = ["Knob", "KNOBS", "knob", "mismatch_text", "check_value", "check_target_name",
           "NCCL_LOG_ENV", "CACHE_ROOT_ENV", "IGNORED_VLLM_ENV", "RenderedCommand",
           "render_command", "argument_words", "check_argument_value", "shell_line", "env_text",
           "PYTHON_PLACEHOLDER", "GRAPH_KINDS",
           "CUDAGRAPH_MODE", "COMPILATION_MODE", "SPECULATIVE_METHOD", "DTYPE", "NCCL_ALGOS",
           "MULTICAST_ALGOS"]

# ------------------------------------------------------------------ vLLM's vocabularies

# Each cudagraph mode with the kinds of graph it captures (the capture bars' last word).
GRAPH_KINDS: Mapping[str, frozenset[str]] = {
    "NONE": frozenset(), "PIECEWISE": frozenset({"PIECEWISE"}), "FULL": frozenset({"FULL"}),
    "FULL_DECODE_ONLY": frozenset({"FULL"}), "FULL_AND_PIECEWISE": frozenset({"FULL", "PIECEWISE"})}
CUDAGRAPH_MODE = Choice(tuple(GRAPH_KINDS), ints={0: "NONE", 1: "PIECEWISE", 2: "FULL"})
COMPILATION_MODE = Choice(("NONE", "STOCK_TORCH_COMPILE", "DYNAMO_TRACE_ONCE", "VLLM_COMPILE"),
                          ints={0: "NONE", 1: "STOCK_TORCH_COMPILE", 2: "DYNAMO_TRACE_ONCE",
                                3: "VLLM_COMPILE"})
SPECULATIVE_METHOD = Choice(("ngram", "ngram_gpu", "suffix", "draft_model", "eagle", "eagle3",
                             "mtp", "dflash", "dspark", "medusa", "mlp_speculator",
                             "extract_hidden_states", "custom_class"), case_sensitive=True)
DTYPE = Choice(("auto", "half", "float16", "bfloat16", "float", "float32"), case_sensitive=True,
               aliases={"half": "float16", "fp16": "float16", "float": "float32",
                        "fp32": "float32", "bf16": "bfloat16"})
NCCL_ALGOS = ("Ring", "Tree", "CollnetDirect", "CollnetChain", "NVLS", "NVLSTree", "PAT")
# NVLink SHARP / multicast must stay off on shared hosts (vllm-knobs.md section 2): the
# study has to opt in before these can be searched (spec: safety.allow_multicast).
MULTICAST_ALGOS = ("NVLS", "NVLSTree")

# ------------------------------------------------------------------------------ the table

# What a server's log needs so NCCL reports the protocol/algorithm it chose (ENV lines).
NCCL_LOG_ENV: Mapping[str, str] = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV"}
CACHE_ROOT_ENV = "VLLM_CACHE_ROOT"


def _graph_downgrade_final(eff: EffectiveConfig) -> bool:
    # The attention backend's downgrade warning comes once, before the weights load; before
    # any capture line a mismatch is the mode itself, not a capture half-way through.
    return bool(eff.cudagraph_downgrades) and eff.graphs_captured is None \
        and not eff.graph_capture_skipped


@dataclass(frozen=True)
class Knob:
    """One vLLM knob. ``rule`` names the verification in ``tuner.vllm.verify.RULES``
    ("field": compare with the ``log`` field; "args": the ``non-default args:`` line);
    ``final``: a mismatch in a partial startup log is already final when it says True;
    ``compile_key``: whether the value enters vLLM's compile-cache key (``why``: where)."""

    target: str
    label: str
    values: Values = ANY
    log: str | None = None
    rule: str = ""
    compile_key: bool = True
    why: str = "not known to be outside vLLM's key: counted as relevant"
    aliases: tuple[str, ...] = ()
    final: Callable[[EffectiveConfig], bool] | None = None
    log_env: Mapping[str, str] = field(default_factory=dict)
    arg: str | None = None    # the rule's argument (an all-reduce backend's name, "reported")

    def __post_init__(self) -> None:
        if not self.rule:
            object.__setattr__(self, "rule", "field" if self.log else "args")


# Config arguments taking a JSON object: (compile key, why) for a field with no entry of
# its own, and the field without which the others mean nothing (vLLM would reject a
# speculative config without a method, and a condition-less study could produce one).
_CONFIGS: Mapping[str, tuple[bool, str, str | None]] = {
    "compilation_config": (True, "CompilationConfig.compute_hash hashes every field except "
                           "cache/dump paths, traced files and timings", None),
    "speculative_config": (True, "SpeculativeConfig.compute_hash; k rounds the capture sizes "
                           "and a drafter compiles its own graphs", "method"),
    "attention_config": (True, "AttentionConfig.compute_hash", None),
    "kernel_config": (True, "KernelConfig.compute_hash", None),
    "lora_config": (True, "LoRAConfig.compute_hash", None),
}

# vLLM variables envs.compile_factors() leaves out (vllm/envs.py, 0.2x-0.3x; the subset a
# study may set). Every other VLLM_* variable is hashed; other variables (NCCL_*, TORCH_*,
# CUDA_*) are not, except RAY_EXPERIMENTAL_NOSET_*.
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


def _family(target: str) -> Knob:
    """The entry of a target the table does not list, from the family it belongs to."""
    if target.startswith("env:"):
        name = target[4:]
        if name.startswith("NCCL_"):
            # NCCL prints "NCCL_X set by environment to V" only with NCCL_DEBUG=INFO (ENV).
            return Knob(target, name, rule="nccl_env", log_env=NCCL_LOG_ENV, compile_key=False,
                        why="not a vLLM variable: envs.compile_factors hashes vLLM's own only")
        if name.startswith("RAY_EXPERIMENTAL_NOSET_"):
            return Knob(target, name, rule="unlogged_env",
                        why="envs.compile_factors hashes the RAY_EXPERIMENTAL_NOSET_* variables")
        if name.startswith("VLLM_"):
            ignored = name in IGNORED_VLLM_ENV
            return Knob(target, name, rule="unlogged_env", compile_key=not ignored,
                        why="in envs.compile_factors' ignore list" if ignored else _ENV_SWITCH)
        return Knob(target, name, rule="unlogged_env", compile_key=False,
                    why="not a vLLM variable: envs.compile_factors hashes vLLM's own only")
    head = target.split(".", 1)[0]
    if head != target and head in _CONFIGS:
        key, why, _ = _CONFIGS[head]
        return Knob(target, target, compile_key=key, why=why)
    return Knob(target, target)


def _k(target: str, label: str, **kw: Any) -> Knob:
    """A table entry: what its family says (verification, compile key, log environment)
    unless the entry says otherwise."""
    if "log" in kw and "rule" not in kw:
        kw["rule"] = "field"
    return replace(_family(target), label=label, **kw)


_MODEL, _CACHE, _PAR = ("ModelConfig.compute_hash", "CacheConfig ignore list",
                        "ParallelConfig.compute_hash")
_SCHED = "SchedulerConfig.compute_hash has no factors"
_OUTSIDE = "outside the compiled graph (VllmConfig does not hash it)"
_ENV_SWITCH = "envs.compile_factors hashes every vLLM variable outside its ignore list"

_TABLE: tuple[Knob, ...] = (
    # compilation and CUDA graphs
    _k("compilation_config.cudagraph_mode", "CUDA-graph mode", values=CUDAGRAPH_MODE,
       log="cudagraph_mode", rule="cudagraph_mode", final=_graph_downgrade_final),
    _k("compilation_config.mode", "compilation mode", values=COMPILATION_MODE,
       log="compilation_mode", rule="compilation_mode", aliases=("compilation_config.level",)),
    _k("compilation_config.cudagraph_capture_sizes", "capture sizes", values=IntList(),
       log="cudagraph_capture_sizes", aliases=("cudagraph_capture_sizes",),
       compile_key=True, why="CompilationConfig.cudagraph_capture_sizes"),
    _k("compilation_config.max_cudagraph_capture_size", "max capture size", values=Int(1),
       log="max_cudagraph_capture_size", aliases=("max_cudagraph_capture_size",),
       compile_key=True, why="CompilationConfig.max_cudagraph_capture_size"),
    *(_k(f"compilation_config.{name}", name, compile_key=False, why="CompilationConfig ignore list (paths)")
      for name in ("cache_dir", "debug_dump_path", "local_cache_dir")),
    _k("enforce_eager", "eager mode", values=Flag(), log="enforce_eager", rule="enforce_eager",
       compile_key=True, why="sets CompilationConfig.mode NONE: no compile at all (no key)"),
    _k("optimization_level", "optimization level", values=Int(0, 3),
       compile_key=True, why="-O sets the compilation mode and cudagraph defaults (CompilationConfig)"),
    # speculative decoding
    _k("speculative_config.method", "speculative method", values=SPECULATIVE_METHOD,
       log="speculative_method", rule="speculative_method"),
    _k("speculative_config.num_speculative_tokens", "speculative k", values=Int(1, 64),
       log="num_speculative_tokens"),
    _k("speculative_config.prompt_lookup_min", "n-gram lookup min", values=Int(1),
       log="prompt_lookup_min"),
    _k("speculative_config.prompt_lookup_max", "n-gram lookup max", values=Int(1),
       log="prompt_lookup_max"),
    # model, parallelism, memory, scheduling
    _k("model", "model", compile_key=True, why=f"{_MODEL} (every field but an ignore list)"),
    _k("revision", "model revision", compile_key=True, why=_MODEL),
    _k("quantization", "quantization", log="quantization", rule="optional_field", compile_key=True,
       why=_MODEL),
    _k("dtype", "dtype", values=DTYPE, log="dtype", rule="dtype", compile_key=True, why=_MODEL),
    _k("max_model_len", "max model length", compile_key=True, why=f"{_MODEL} (not in its ignore list)"),
    _k("hf_overrides", "model config overrides", compile_key=True, why="changes the model's graph"),
    _k("tensor_parallel_size", "tensor parallel size", values=Int(1),
       log="tensor_parallel_size", rule="parallel_size", compile_key=True, why=_PAR),
    _k("pipeline_parallel_size", "pipeline parallel size", values=Int(1),
       log="pipeline_parallel_size", compile_key=True, why=_PAR),
    _k("data_parallel_size", "data parallel size", compile_key=True, why=_PAR),
    _k("enable_expert_parallel", "expert parallelism", compile_key=True, why=_PAR),
    _k("disable_custom_all_reduce", "custom all-reduce off", values=Flag(),
       log="disable_custom_all_reduce", rule="custom_all_reduce",
       final=lambda eff: eff.custom_all_reduce_active is not None, compile_key=False,
       why="ParallelConfig ignore list: the all-reduce is chosen at run time"),
    _k("distributed_executor_backend", "executor backend", compile_key=False, why=f"{_PAR} ignore list"),
    _k("kv_cache_dtype", "KV-cache dtype", log="kv_cache_dtype", compile_key=True,
       why="CacheConfig.compute_hash"),
    _k("block_size", "KV block size", compile_key=True, why="CacheConfig.compute_hash"),
    _k("calculate_kv_scales", "KV scales", compile_key=True, why="CacheConfig.compute_hash"),
    _k("kv_cache_memory_bytes", "KV-cache bytes", compile_key=True, why="CacheConfig, not ignored"),
    *(_k(name, label, values=v, compile_key=False, why=_CACHE) for name, label, v in (
        ("gpu_memory_utilization", "GPU memory share", ANY),
        ("enable_prefix_caching", "prefix caching", Flag()),
        ("prefix_caching_hash_algo", "prefix hash", ANY),
        ("num_gpu_blocks_override", "GPU blocks", ANY),
        ("kv_sharing_fast_prefill", "KV-sharing prefill", ANY),
        ("swap_space", "swap space", ANY),
        ("cpu_offload_gb", "CPU offload", ANY))),
    *(_k(name, name.replace("_", " "), compile_key=False, why=f"{_MODEL} ignore list") for name in (
        "seed", "served_model_name", "tokenizer", "tokenizer_mode", "skip_tokenizer_init",
        "disable_cascade_attn", "logprobs_mode")),
    _k("max_num_batched_tokens", "max batched tokens", values=Int(1), compile_key=True,
       why="upper end of the compile ranges ('compile range (1, N)'), a CompilationConfig field"),
    _k("max_num_seqs", "max sequences per batch", values=Int(1), compile_key=True,
       why="default capture sizes derive from it, and CompilationConfig hashes them"),
    _k("async_scheduling", "async scheduling", values=Flag(), log="async_scheduling",
       compile_key=False, why=_SCHED),
    _k("enable_chunked_prefill", "chunked prefill", values=Flag(), compile_key=False, why=_SCHED),
    *(_k(name, name.replace("_", " "), compile_key=False, why=_SCHED) for name in (
        "long_prefill_token_threshold", "max_num_partial_prefills", "max_long_partial_prefills",
        "scheduling_policy", "stream_interval", "disable_hybrid_kv_cache_manager")),
    _k("attention_backend", "attention backend", compile_key=True, why="AttentionConfig.compute_hash"),
    _k("additional_config", "additional config", compile_key=True, why="hashed as JSON"),
    _k("enable_lora", "LoRA", compile_key=True, why="LoRAConfig"),
    *(_k(name, name.replace("_", " "), compile_key=False, why=_OUTSIDE) for name in (
        "disable_log_stats", "disable_log_requests", "enable_log_requests", "host", "port",
        "uvicorn_log_level")),
    # environment: NCCL (not vLLM's: outside the compile key), then vLLM's own switches.
    # arg="reported": NCCL_DEBUG=INFO always prints "NAME set by environment to V" for it, so
    # its absence among such lines means the variable never reached NCCL.
    _k("env:NCCL_PROTO", "NCCL protocol", values=NcclList(("LL", "LL128", "Simple")), arg="reported"),
    _k("env:NCCL_ALGO", "NCCL algorithm", values=NcclList(NCCL_ALGOS, per_collective=True),
       arg="reported"),
    _k("env:NCCL_P2P_LEVEL", "NCCL P2P level", arg="reported",
       values=Choice(("LOC", "NVL", "PIX", "PXB", "PHB", "SYS"), case_sensitive=True)),
    _k("env:NCCL_P2P_DISABLE", "NCCL P2P off", values=Flag(env=True)),
    _k("env:NCCL_NTHREADS", "NCCL threads", values=Int(64, choices=(64, 128, 256, 512)),
       arg="reported"),
    *(_k(f"env:{name}", label, arg="reported") for name, label in (
        ("NCCL_BUFFSIZE", "NCCL buffer size"), ("NCCL_MIN_NCHANNELS", "NCCL min channels"),
        ("NCCL_MAX_NCHANNELS", "NCCL max channels"))),
    *(_k(f"env:{name}", label, values=Flag(env=True), log="allreduce_backends",
         rule="allreduce_backend", arg=backend)
      for name, label, backend in (
          ("VLLM_ALLREDUCE_USE_FLASHINFER", "FlashInfer all-reduce", "FLASHINFER"),
          ("VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC", "FlashInfer PCIe all-reduce",
           "FLASHINFER_PCIE_IPC"),
          ("VLLM_ALLREDUCE_USE_SYMM_MEM", "symmetric-memory all-reduce", "SYMM_MEM"),
          ("VLLM_USE_NCCL_SYMM_MEM", "NCCL symmetric memory", "NCCL_SYMM_MEM"))),
    _k("env:VLLM_CUSTOM_ALLREDUCE_ALGO", "custom all-reduce algorithm",
       values=Choice(("1stage", "2stage"), case_sensitive=True)),
    _k("env:VLLM_FLASHINFER_ALLREDUCE_BACKEND", "FlashInfer all-reduce backend",
       values=Choice(("auto", "trtllm", "mnnvl"), case_sensitive=True)),
    # The tuner's clients reopen a connection idle for IDLE_REUSE_LIMIT_S (2 s,
    # tuner/load/protocol.py); a server that closes idle connections sooner races them and
    # resets requests that say nothing about the configuration.
    _k("env:VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "HTTP keep-alive timeout",
       values=EnvInt(3, why="the tuner's clients keep an idle connection up to 2 s, and a "
                            "server that closes it sooner resets their requests")),
)

KNOBS: Mapping[str, Knob] = {k.target: k for k in _TABLE}
_BY_ALIAS = {alias: k for k in _TABLE for alias in k.aliases}

def knob(target: str) -> Knob:
    """The table's entry for ``target`` (or one of its aliases), else its family's."""
    found = KNOBS.get(target) or _BY_ALIAS.get(target)
    if found is None:
        return _family(target)
    return found if found.target == target else replace(found, target=target)


def mismatch_text(check: Mapping[str, Any]) -> str:
    """A stored knob check (``tuner.vllm.verify.KnobCheck`` as JSON) as one line for people:
    the target with its label, asked and got, and vLLM's reason when the log gave one."""
    target = str(check.get("target"))
    label = knob(target).label
    name = target if label == target else f"{target} ({label})"
    note = f" ({check['note']})" if check.get("note") else ""
    return f"{name}: asked {check.get('asked')!r}, got {check.get('got')!r}{note}"


def check_value(target: str, value: Any) -> str | None:
    """Error text if ``value`` is invalid for ``target``; None when valid or unchecked."""
    return knob(target).values.check(value)


_IDENT = re.compile(r"^[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)*$")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def check_target_name(target: str) -> str | None:
    """Error text if ``target`` is not a well-formed flag path or ``env:NAME``."""
    if target.startswith("env:"):
        return None if _ENV.match(target[4:]) else f"{target[4:]!r} is not a valid environment variable name"
    if not _IDENT.match(target):
        return (f"{target!r} is not a vLLM argument name; use snake_case (e.g. enforce_eager) "
                "or a dotted config field (e.g. compilation_config.cudagraph_mode)")
    return None


# ------------------------------------------------------------------------------ the renderer

PYTHON_PLACEHOLDER = "{python}"


class ServerLike(Protocol):
    """What the renderer reads of a study's ``server:`` section (tuner's ServerSpec)."""

    @property
    def command(self) -> Sequence[str]: ...
    @property
    def model(self) -> str: ...
    @property
    def served_model_name(self) -> str | None: ...
    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def flags(self) -> Mapping[str, Any]: ...
    @property
    def env(self) -> Mapping[str, str | int | float | bool | None]: ...


@dataclass(frozen=True)
class RenderedCommand:
    """One server's command. ``env``: the variables the configuration sets (measured and
    exported); ``measurement_env``: added only to measure it, never exported; ``asked``:
    every setting by target, flat (what the verifier checks); ``args``: the engine
    arguments by name, config arguments as objects (a vLLM ``--config`` file)."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    measurement_env: dict[str, str] = field(default_factory=dict)
    asked: dict[str, Any] = field(default_factory=dict)
    args: dict[str, Any] = field(default_factory=dict)

    @property
    def launch_env(self) -> dict[str, str]:
        """What the server is started with (on top of the worker's environment)."""
        return {**self.env, **self.measurement_env}


def env_text(value: Any) -> str:
    """A value as an environment variable's text (booleans as 1/0)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _asked(server: ServerLike, settings: Mapping[str, Any]) -> dict[str, Any]:
    """Fixed flags and env, then the trial's settings: flat by target, nulls ("the
    server's default") dropped, config fields without their required field dropped."""

    asked: dict[str, Any] = {}

    def add(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                add(f"{prefix}.{k}", v)
        elif value is not None:
            asked[prefix] = value

    for key, value in server.flags.items():
        add(key, value)
    for name, text in server.env.items():
        if text is not None:
            asked[f"env:{name}"] = env_text(text)
    for target, value in settings.items():
        if value is not None:
            asked[target] = env_text(value) if target.startswith("env:") else value
    for head, (_, _, required) in _CONFIGS.items():
        if required and f"{head}.{required}" not in asked:
            asked = {k: v for k, v in asked.items() if not k.startswith(head + ".")}
    return asked


def _set_nested(tree: dict[str, Any], path: list[str], value: Any) -> None:
    node = tree
    for part in path[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[path[-1]] = value


def check_argument_value(value: Any) -> str | None:
    """Error text if a list value has an element vLLM would read as a flag (see
    :func:`argument_words`); None otherwise."""

    if isinstance(value, list):
        for i, item in enumerate(value):
            if str(item).startswith("-"):
                return (f"element {i} ({str(item)!r}) starts with '-': vLLM would read it as a flag, "
                        "not as a value (a list is written as words after its flag, which cannot "
                        "take the --flag=value form)")
    return None


def argument_words(key: str, value: Any) -> list[str]:
    """One engine argument on a command line: ``--flag``/``--no-flag`` for a boolean, one
    compact JSON word for a config object, the elements after the flag for a list, else
    the value after the flag - as ``--flag=value`` when it starts with '-', since argparse
    reads a separate ``--trust-remote-code`` as the next flag, not as this one's value.

    Raises:
        ValueError: a list element starts with '-' (a list cannot take the ``=`` form).
    """

    flag = "--" + key.replace("_", "-")
    if isinstance(value, bool):
        return [flag if value else "--no-" + key.replace("_", "-")]
    if isinstance(value, dict):
        return [flag, json.dumps(value, separators=(",", ":"))]
    if isinstance(value, list):
        if error := check_argument_value(value):
            raise ValueError(f"{key}: {error}")
        return [flag, *(str(v) for v in value)]
    text = str(value)
    return [f"{flag}={text}"] if text.startswith("-") else [flag, text]


def render_command(server: ServerLike, settings: Mapping[str, Any], *, python: str = "python",
                   port: int | None = None, nccl_debug: Literal["auto", "on", "off"] = "off",
                   searched: Iterable[str] = (), compile_cache_dir: str | None = None,
                   ) -> RenderedCommand:
    """The command for ``settings`` (trial values by target; null: server default).

    Each argument renders as :func:`argument_words` writes it; the fields of one config
    argument become one JSON value. ``nccl_debug`` "auto"
    adds the log environment the ``searched`` targets need to be verified, "on" NCCL's
    always. ``compile_cache_dir`` (absolute: expand ``~`` and variables before) becomes
    VLLM_CACHE_ROOT. Neither overrides a variable the configuration sets itself.
    """

    asked = _asked(server, settings)
    args: dict[str, Any] = {"model": server.model}
    if server.served_model_name:
        args["served_model_name"] = server.served_model_name
    args["host"] = server.host
    args["port"] = port if port is not None else server.port
    env: dict[str, str] = {}
    for target, value in asked.items():
        if target.startswith("env:"):
            env[target[4:]] = value
        elif "." in target:
            head, *rest = target.split(".")
            if not isinstance(args.get(head), dict):
                args[head] = {}
            _set_nested(args[head], rest, value)
        else:
            args[target] = value
    argv = [python if part == PYTHON_PLACEHOLDER else part for part in server.command]
    for key, value in args.items():
        argv += argument_words(key, value)
    log_env: dict[str, str] = dict(NCCL_LOG_ENV) if nccl_debug == "on" else {}
    if nccl_debug != "off":
        for target in searched:
            log_env.update(knob(target).log_env)
    measurement = {k: v for k, v in log_env.items() if k not in env}
    if compile_cache_dir is not None:
        if not posixpath.isabs(compile_cache_dir):
            raise ValueError(f"compile_cache_dir {compile_cache_dir!r} is not absolute: "
                             "expand it where the study is run, before rendering")
        if CACHE_ROOT_ENV not in env:
            measurement[CACHE_ROOT_ENV] = compile_cache_dir
    return RenderedCommand(argv, env, measurement, asked, args)


def shell_line(command: RenderedCommand, *, redact: tuple[str, ...] = ()) -> str:
    """A POSIX shell line: ``VAR=value ... argv`` (the configuration env) quoted as needed."""

    # A secret is exported as a reference to the variable, never its value.
    parts = [f'{name}="${{{name}}}"' if name in redact else f"{name}={shlex.quote(value)}"
             for name, value in command.env.items()]
    return " ".join(parts + [shlex.quote(a) for a in command.argv])
