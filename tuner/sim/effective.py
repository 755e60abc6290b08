"""Pure resolution of argv + env + profile into the configuration vLLM would actually run.

This is where the simulator reproduces vLLM's *silent and logged downgrades*: -O level
defaults, --enforce-eager, cudagraph/compile-mode incompatibility, CPU forcing NONE with no
log, capture-size defaults, the per-attention-backend cudagraph downgrade, custom all-reduce
turning itself off, NCCL protocol/algorithm selection, KV-cache sizing. Log *text* for each
decision is attached as a Notice so the I/O layer can print it at the right moment.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tuner.sim.args import SimArgs
from tuner.sim.comm import NcclInfo, allreduce_backends, resolve_nccl
from tuner.sim.events import Failure, Notice
from tuner.sim.faults import Fault, applies
from tuner.sim.lossy import resolve_lossy
from tuner.sim.perf_model import MODEL_DRAFTERS, PerfConfig
from tuner.sim.profile import Profile

GIB = 2**30
LEVEL_DEFAULTS = {0: ("NONE", 0), 1: ("PIECEWISE", 3), 2: ("FULL_AND_PIECEWISE", 3),
                  3: ("FULL_AND_PIECEWISE", 3)}
COMPILATION_MODE_NAMES = ("NONE", "STOCK_TORCH_COMPILE", "DYNAMO_TRACE_ONCE", "VLLM_COMPILE")
SPEC_METHODS = ("ngram", "ngram_gpu", "suffix", "draft_model", "eagle", "eagle3", "mtp",
                "dflash", "dspark", "medusa", "mlp_speculator", "extract_hidden_states",
                "custom_class")
SPEC_KEYS = frozenset({"method", "model", "num_speculative_tokens", "prompt_lookup_min",
                       "prompt_lookup_max", "draft_tensor_parallel_size", "quantization",
                       "enforce_eager", "rejection_sample_method", "draft_sample_method",
                       "max_model_len", "revision", "code_revision", "disable_by_batch_size",
                       "speculative_token_tree", "parallel_drafting", "suffix_decoding_max_tree_depth",
                       "suffix_decoding_max_cached_requests", "suffix_decoding_max_spec_factor",
                       "suffix_decoding_min_token_prob", "synthetic_acceptance_rate"})
DTYPE_NAMES = {"half": "float16", "float16": "float16", "bfloat16": "bfloat16",
               "float": "float32", "float32": "float32"}


class ConfigError(Exception):
    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.message)
        self.failure = failure


@dataclass(frozen=True)
class SpecConfig:
    method: str
    model: str | None
    num_spec_tokens: int
    prompt_lookup_min: int
    prompt_lookup_max: int

    def render(self) -> str:
        model = repr(self.model) if self.model else "None"
        return (f"SpeculativeConfig(method={self.method!r}, model={model}, "
                f"num_spec_tokens={self.num_spec_tokens})")


@dataclass(frozen=True)
class Effective:
    profile: Profile
    model: str
    served_model_names: tuple[str, ...]
    host: str
    port: int
    tp: int
    pp: int
    dtype: str
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    gpu_memory_utilization: float
    enforce_eager: bool
    disable_custom_all_reduce: bool
    compile_mode: int
    cudagraph_mode_config: str       # what the engine-config line shows
    cudagraph_mode: str              # what actually runs, after the attention-backend check
    capture_sizes_config: tuple[int, ...]
    capture_sizes: tuple[int, ...]   # what is captured (spec rounding applied)
    max_capture_size: int
    spec: SpecConfig | None
    seed: int
    disable_log_stats: bool
    kv_cache_dtype: str
    enable_prefix_caching: bool
    async_scheduling: bool
    allreduce_backends: tuple[str, ...]
    nccl: NcclInfo
    kv_cache_gib: float
    kv_cache_tokens: int
    weights_gib_per_rank: float
    corruption: str | None
    numerics_salt: int
    log_stats_interval_s: float
    notices: tuple[Notice, ...]
    failure: Failure | None
    perf: PerfConfig
    asked: Mapping[str, Any] = field(default_factory=dict)
    load_format: str = "auto"        # "dummy": random weights (the model answers nonsense)
    quantization: str | None = None  # --quantization (None: the profile model's own format)
    lossy: tuple[str, ...] = ()      # lossy knobs in effect (tuner.sim.lossy)
    lossy_drop: float = 0.0          # their true accuracy drop: known-answer items flipped

    def notices_for(self, phase: str) -> list[Notice]:
        return [n for n in self.notices if n.phase == phase]


def _fail(exc_type: str, message: str, *frames: str) -> ConfigError:
    return ConfigError(Failure("api", exc_type, message, frames))


def asked_config(args: SimArgs, env: Mapping[str, str], profile: Profile) -> dict[str, Any]:
    """The configuration the trial asked for (pre-downgrade), for matching fault `when`s."""
    cc = args.compilation_config or {}
    level_cg, level_mode = LEVEL_DEFAULTS[args.optimization_level]
    eager = bool(args.enforce_eager)
    spec = dict(args.speculative_config or {})
    if args.spec_method:
        spec.setdefault("method", args.spec_method)
    if args.spec_tokens is not None:
        spec.setdefault("num_speculative_tokens", args.spec_tokens)
    asked: dict[str, Any] = {
        "model": args.model,
        "enforce_eager": eager,
        "compilation_config.cudagraph_mode": "NONE" if eager else cc.get("cudagraph_mode") or level_cg,
        "compilation_config.mode": 0 if eager else cc.get("mode", level_mode),
        "optimization_level": args.optimization_level,
        "disable_custom_all_reduce": bool(args.disable_custom_all_reduce),
        "speculative_config.method": spec.get("method"),
        "speculative_config.num_speculative_tokens": spec.get("num_speculative_tokens"),
        "tensor_parallel_size": args.tensor_parallel_size,
        "pipeline_parallel_size": args.pipeline_parallel_size,
        "max_num_seqs": args.max_num_seqs or profile.defaults.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens or profile.defaults.max_num_batched_tokens,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "kv_cache_dtype": args.kv_cache_dtype,
        "quantization": args.quantization,
        "dtype": args.dtype,
        "enable_prefix_caching": args.enable_prefix_caching is not False,
    }
    for k, v in env.items():
        asked["env:" + k] = v
    return asked


def _resolve_spec(args: SimArgs, profile: Profile, notices: list[Notice]) -> SpecConfig | None:
    sc = dict(args.speculative_config or {})
    for flag, key in (("spec_method", "method"), ("spec_model", "model"),
                      ("spec_tokens", "num_speculative_tokens")):
        if args.given.get(flag) is not None:
            if key in sc:
                raise _fail("ValueError", f"--{flag.replace('_', '-')} and speculative_config."
                            f"{key} are mutually exclusive; set only one of them.")
            sc[key] = args.given[flag]
    if not sc:
        return None
    extra = sorted(set(sc) - SPEC_KEYS)
    if extra:
        raise _fail("pydantic_core._pydantic_core.ValidationError",
                    f"1 validation error for SpeculativeConfig\n{extra[0]}\n  Extra inputs are "
                    f"not permitted [type=extra_forbidden, input_value={sc[extra[0]]!r}]")
    method, model, k = sc.get("method"), sc.get("model"), sc.get("num_speculative_tokens")
    no_model = ("pydantic_core._pydantic_core.ValidationError",
                "1 validation error for SpeculativeConfig\n  Value error, num_speculative_tokens "
                "was provided but without speculative model. [type=value_error]")
    if method is None:
        if model is None:
            raise _fail(*no_model)
        method = "eagle" if "eagle" in str(model).lower() else "draft_model"
    method = str(method)
    if method.endswith("_mtp"):
        notices.append(Notice("api", "WARNING", "speculative.py:612",
                              f"method `{method}` is deprecated and replaced with mtp."))
        method = "mtp"
    if method not in SPEC_METHODS:
        allowed = ", ".join(repr(m) for m in SPEC_METHODS)
        raise _fail("pydantic_core._pydantic_core.ValidationError",
                    f"1 validation error for SpeculativeConfig\nmethod\n  Input should be "
                    f"{allowed} [type=literal_error, input_value={method!r}, input_type=str]")
    if method == "suffix" and not profile.arctic_inference_installed:
        raise _fail("ImportError", "Arctic Inference is required for suffix decoding. Install via "
                    "`pip install arctic-inference==0.1.1`.")
    if method == "mtp":
        if not profile.model.has_mtp_layers:
            raise _fail("NotImplementedError", "Unsupported speculative method: 'mtp'",
                        '  File "site-packages/vllm/config/speculative.py", line 909, in '
                        "__post_init__\n    raise NotImplementedError(")
        k = k if k is not None else profile.model.mtp_num_layers
        if k > profile.model.mtp_num_layers:
            notices.append(Notice("api", "WARNING", "speculative.py:498",
                                  "Enabling num_speculative_tokens > 1 will run multiple times of "
                                  "forward on same MTP layer,which may result in lower acceptance "
                                  "rate"))
    elif method in MODEL_DRAFTERS and not model:
        raise _fail(*no_model)
    if method == "suffix" and k is None:
        k = 24
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise _fail("ValueError", "num_speculative_tokens must be provided with speculative model "
                    "unless the draft model config contains an n_predict parameter.")
    lo, hi = sc.get("prompt_lookup_min"), sc.get("prompt_lookup_max")
    lo, hi = (lo if lo is not None else hi or 5), (hi if hi is not None else lo or 5)
    if method.startswith("ngram") and not 1 <= lo <= hi:
        raise _fail("ValueError", f"prompt_lookup_min={lo} must be > 0 and <= "
                    f"prompt_lookup_max={hi}")
    return SpecConfig(method, model, k, lo, hi)


def _capture_sizes(args: SimArgs, cc: Mapping[str, Any], mns: int, mnbt: int, k: int,
                   profile: Profile, notices: list[Notice]) -> tuple[tuple[int, ...], int]:
    flag_sizes, flag_max = args.cudagraph_capture_sizes, args.max_cudagraph_capture_size
    if flag_sizes is not None and cc.get("cudagraph_capture_sizes") is not None:
        raise _fail("ValueError", "cudagraph_capture_sizes and compilation_config.cudagraph_capture"
                    "_sizes are mutually exclusive. Please set only one of them.")
    if flag_max is not None and cc.get("max_cudagraph_capture_size") is not None:
        raise _fail("ValueError", "max_cudagraph_capture_size and compilation_config.max_cudagraph"
                    "_capture_size are mutually exclusive. Please set only one of them.")
    explicit = flag_sizes if flag_sizes is not None else cc.get("cudagraph_capture_sizes")
    max_size = flag_max if flag_max is not None else cc.get("max_cudagraph_capture_size")
    if explicit:
        sizes = sorted(set(explicit))
        if max_size is not None and max_size != sizes[-1]:
            raise _fail("ValueError", f"customized max_cudagraph_capture_size(={max_size}) should "
                        "be consistent with the max value of cudagraph_capture_sizes"
                        f"(={sizes[-1]})")
        return tuple(sizes), sizes[-1]
    ceiling = 1024 if profile.hardware.datacenter_blackwell else 512
    if max_size is None:
        max_size = min(mns * (1 + k) * 2, ceiling)
    max_size = min(max_size, mnbt)
    base = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, max_size + 1, 16))
    sizes = [s for s in base if s <= max_size]
    if max_size not in sizes and max_size == mnbt:
        sizes.append(max_size)
    if sizes and sizes[-1] != max_size:
        notices.append(Notice("api", "WARNING", "compilation.py:1262",
                              f"Truncating max_cudagraph_capture_size to {sizes[-1]}"))
    return tuple(sizes), (sizes[-1] if sizes else 0)


def _backend_downgrade(cg: str, mode: int, k: int, profile: Profile,
                       notices: list[Notice]) -> tuple[str, Failure | None]:
    """The worker-init check of cudagraph mode against the attention backend's support."""
    support = profile.attention.cudagraph_support
    cls = profile.attention.backend_class
    split_attn = mode == 3
    mixed = {"FULL_AND_PIECEWISE": "PIECEWISE", "FULL_DECODE_ONLY": "NONE"}.get(cg, cg)
    head = f"CUDAGraphMode.{cg} is not supported with {cls} backend (support: AttentionCGSupport.{support})"
    if mixed == "FULL" and support != "ALWAYS":
        if support == "NEVER":
            return cg, Failure("engine", "ValueError", head + "; please try cudagraph_mode="
                               "PIECEWISE, and make sure compilation mode is VLLM_COMPILE",
                               stage="attn")
        new = "FULL_AND_PIECEWISE" if split_attn else "FULL_DECODE_ONLY"
        notices.append(Notice("attn", "WARNING", "compilation.py:1421", f"{head}; setting "
                              f"cudagraph_mode={new}"))
        cg = new
    decode_full = cg in ("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
    head = f"CUDAGraphMode.{cg} is not supported with {cls} backend (support: AttentionCGSupport.{support})"
    if decode_full and support == "NEVER":
        if split_attn:
            notices.append(Notice("attn", "WARNING", "compilation.py:1446", f"{head}; setting "
                                  "cudagraph_mode=PIECEWISE because attention is compiled piecewise"))
            return "PIECEWISE", None
        notices.append(Notice("attn", "WARNING", "compilation.py:1453", f"{head}; setting "
                              "cudagraph_mode=NONE because attention is not compiled piecewise"))
        return "NONE", None
    if decode_full and k > 0 and support in ("NEVER", "UNIFORM_SINGLE_TOKEN_DECODE"):
        new = "PIECEWISE" if split_attn else "NONE"
        notices.append(Notice("attn", "WARNING", "compilation.py:1470", f"CUDAGraphMode.{cg} is "
                              "not supported with spec-decode for attention backend "
                              f"{cls} (support: AttentionCGSupport.{support}); setting "
                              f"cudagraph_mode={new}"))
        return new, None
    return cg, None


def _round_for_spec(sizes: Sequence[int], max_size: int, k: int) -> tuple[int, ...]:
    q = 1 + k
    return tuple(sorted({-(-s // q) * q for s in sizes if -(-s // q) * q <= max_size}))


@dataclass(frozen=True)
class _Limits:
    """Parallelism and scheduler limits, checked the way vLLM's config validation does."""

    tp: int
    pp: int
    max_len: int
    mns: int                         # max_num_seqs
    mnbt: int                        # max_num_batched_tokens


@dataclass(frozen=True)
class _Graphs:
    """torch.compile and CUDA-graph settings: as configured, and as the worker runs them."""

    eager: bool
    mode: int
    cg: str                          # what the engine-config line shows
    final_cg: str                    # after the attention-backend check
    sizes: tuple[int, ...]           # configured capture sizes
    max_cap: int
    run_sizes: tuple[int, ...]       # what is captured (spec rounding applied)
    failure: Failure | None          # the attention backend refuses the mode


@dataclass(frozen=True)
class _Memory:
    weights_gib: float               # per rank
    kv_gib: float
    kv_tokens: int
    failure: Failure | None


def resolve(args: SimArgs, env: Mapping[str, str], profile: Profile,
            faults: Sequence[Fault] = ()) -> Effective:
    """argv+env+profile -> Effective; raises ConfigError for API-server-time failures.

    The steps run in vLLM's order, since the notices they add are logged in that order and
    the first engine failure found is the one reported."""
    notices: list[Notice] = []
    cuda = profile.hardware.platform == "cuda"
    asked = asked_config(args, env, profile)
    over = _silent_overrides(faults, asked)
    env = {**env, **{k[4:]: str(v) for k, v in over.items() if k.startswith("env:")}}
    limits = _limits(args, env, profile, over)
    dtype = DTYPE_NAMES.get(args.dtype, profile.model.default_dtype)
    notices.append(Notice("api", "INFO", "model.py:623",
                          f"Resolved architecture: {profile.model.architecture}"))
    notices.append(Notice("api", "INFO", "model.py:1788", f"Using max model len {limits.max_len}"))
    notices.append(Notice("api", "INFO", "scheduler.py:252",
                          f"Chunked prefill is enabled with max_num_batched_tokens={limits.mnbt}."))
    spec = _overridden_spec(_resolve_spec(args, profile, notices), over)
    k = spec.num_spec_tokens if spec else 0
    async_sched = _async_scheduling(args, spec, cuda, notices)
    graphs = _resolve_graphs(args, over, limits, spec, profile, notices)
    failure = graphs.failure or _world_size_failure(env, profile, limits)
    disable_car = bool(over.get("disable_custom_all_reduce", args.disable_custom_all_reduce)) or not cuda
    backends = allreduce_backends(limits.tp, disable_car, env, profile, notices)
    nccl, corruption, nccl_failure = resolve_nccl(env, profile, "PYNCCL" in backends)
    failure = failure or nccl_failure
    util = float(over.get("gpu_memory_utilization", args.gpu_memory_utilization))
    kv_dtype = str(over.get("kv_cache_dtype", args.kv_cache_dtype))
    lossy = resolve_lossy(args.quantization, kv_dtype, dtype, profile, env)
    if lossy.refused is not None:
        raise ConfigError(lossy.refused)
    memory = _memory(args, env, profile, limits, graphs, util, kv_dtype, lossy.weights_factor)
    failure = failure or memory.failure or lossy.failure
    prefix = bool(over.get("enable_prefix_caching",
                           True if args.enable_prefix_caching is None else args.enable_prefix_caching))
    tp, pp, block = limits.tp, limits.pp, profile.defaults.block_size
    salt_src = (f"{graphs.mode}|{graphs.final_cg}|{backends}|{nccl.protos}|{nccl.algo}|{dtype}|"
                f"{kv_dtype}|{tp}")
    salt = int.from_bytes(hashlib.blake2b(salt_src.encode(), digest_size=8).digest(), "big")
    perf = PerfConfig(
        tp=tp, pp=pp, compile_mode=graphs.mode, cudagraph_mode=graphs.final_cg,
        max_capture_size=max(graphs.run_sizes) if graphs.run_sizes else 0,
        allreduce_backends=backends, nccl_protos=nccl.protos, nccl_algo=nccl.algo,
        nccl_p2p_disabled=nccl.p2p_disabled, nccl_max_channels=nccl.max_channels,
        spec_method=spec.method if spec else None, num_spec_tokens=k,
        prompt_lookup_min=spec.prompt_lookup_min if spec else 5,
        prompt_lookup_max=spec.prompt_lookup_max if spec else 5,
        async_scheduling=async_sched, kv_fp8=kv_dtype.startswith("fp8"),
        activation_bytes=4 if dtype == "float32" else 2, max_num_seqs=limits.mns,
        max_num_batched_tokens=limits.mnbt, kv_capacity_tokens=max(memory.kv_tokens, block),
        block_size=block, enable_prefix_caching=prefix, weights_factor=lossy.weights_factor if cuda else 1.0)
    return Effective(
        profile=profile, model=args.model,
        served_model_names=tuple(args.served_model_name or [args.model]),
        host=args.host or "127.0.0.1", port=args.port, tp=tp, pp=pp, dtype=dtype,
        max_model_len=limits.max_len, max_num_seqs=limits.mns, max_num_batched_tokens=limits.mnbt,
        gpu_memory_utilization=util, enforce_eager=graphs.eager, disable_custom_all_reduce=disable_car,
        compile_mode=graphs.mode, cudagraph_mode_config=graphs.cg, cudagraph_mode=graphs.final_cg,
        capture_sizes_config=graphs.sizes, capture_sizes=graphs.run_sizes, max_capture_size=graphs.max_cap,
        spec=spec, seed=args.seed, disable_log_stats=bool(args.disable_log_stats),
        kv_cache_dtype=kv_dtype, enable_prefix_caching=prefix, async_scheduling=async_sched,
        allreduce_backends=backends, nccl=nccl, kv_cache_gib=memory.kv_gib, kv_cache_tokens=memory.kv_tokens,
        weights_gib_per_rank=memory.weights_gib, corruption=corruption, numerics_salt=salt,
        log_stats_interval_s=max(_log_stats_interval(env), 0.1), notices=tuple(notices),
        failure=failure, perf=perf, asked=asked, load_format=str(args.load_format),
        quantization=lossy.quantization, lossy=lossy.knobs, lossy_drop=lossy.drop)


def _silent_overrides(faults: Sequence[Fault], asked: Mapping[str, Any]) -> dict[str, Any]:
    """silent_downgrade faults that apply: the value used differs from the one asked, and
    nothing is logged. Keyed like the asked config ("env:NAME" for variables)."""
    over: dict[str, Any] = {}
    for f in faults:
        if f.fault == "silent_downgrade" and applies(f, asked.get) and f.target:
            over[f.target] = f.value
    return over


def _limits(args: SimArgs, env: Mapping[str, str], profile: Profile, over: Mapping[str, Any]) -> _Limits:
    model = profile.model
    tp, pp = args.tensor_parallel_size, args.pipeline_parallel_size
    if tp < 1 or pp < 1:
        raise _fail("ValueError", "tensor_parallel_size and pipeline_parallel_size must be >= 1")
    if model.num_attention_heads % tp:
        raise _fail("ValueError", f"Total number of attention heads ({model.num_attention_heads})"
                    f" must be divisible by tensor parallel size ({tp}).")
    max_len = args.max_model_len or model.max_model_len
    if max_len > model.max_model_len and env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") != "1":
        raise _fail("pydantic_core._pydantic_core.ValidationError", "1 validation error for "
                    f"ModelConfig\n  Value error, User-specified max_model_len ({max_len}) is "
                    f"greater than the derived max_model_len (max_position_embeddings="
                    f"{model.max_model_len} or model_max_length=None in model's config.json). To "
                    "allow overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1."
                    " [type=value_error]")
    mns = int(over.get("max_num_seqs", args.max_num_seqs or profile.defaults.max_num_seqs))
    mnbt = int(over.get("max_num_batched_tokens",
                        args.max_num_batched_tokens or profile.defaults.max_num_batched_tokens))
    if mnbt < mns:
        raise _fail("ValueError", f"max_num_batched_tokens ({mnbt}) must be greater than or "
                    f"equal to max_num_seqs ({mns}).")
    return _Limits(tp, pp, max_len, mns, mnbt)


def _overridden_spec(spec: SpecConfig | None, over: Mapping[str, Any]) -> SpecConfig | None:
    """The speculative config after silent_downgrade faults on its method or k."""
    if "speculative_config.method" in over:
        m = over["speculative_config.method"]
        spec = None if m in (None, "none", "None") else SpecConfig(
            str(m), spec.model if spec else None, spec.num_spec_tokens if spec else 3,
            spec.prompt_lookup_min if spec else 2, spec.prompt_lookup_max if spec else 4)
    if spec and "speculative_config.num_speculative_tokens" in over:
        spec = SpecConfig(spec.method, spec.model, int(over["speculative_config.num_speculative_tokens"]),
                          spec.prompt_lookup_min, spec.prompt_lookup_max)
    return spec


def _async_scheduling(args: SimArgs, spec: SpecConfig | None, cuda: bool, notices: list[Notice]) -> bool:
    async_sched = cuda
    if args.unknown.get("no_async_scheduling") is True or args.unknown.get("async_scheduling") is False:
        async_sched = False
    if spec and spec.method in ("ngram", "ngram_gpu", "suffix", "medusa", "mlp_speculator") and cuda:
        notices.append(Notice("api", "WARNING", "vllm.py:1597", "Async scheduling not supported with "
                              "ngram-based speculative decoding and will be disabled."))
        async_sched = False
    notices.append(Notice("api", "INFO", "vllm.py:1109", "Asynchronous scheduling is "
                          f"{'enabled' if async_sched else 'disabled'}."))
    return async_sched


def _compile_modes(args: SimArgs, cc: Mapping[str, Any], over: Mapping[str, Any], cuda: bool,
                   notices: list[Notice]) -> tuple[bool, int, str]:
    """(enforce_eager, compilation mode, cudagraph mode) as the engine config shows them."""
    eager = bool(over.get("enforce_eager", args.enforce_eager))
    level_cg, level_mode = LEVEL_DEFAULTS[args.optimization_level]
    if args.enforce_eager:
        notices.append(Notice("api", "WARNING", "vllm.py:1691", "Enforce eager set, disabling "
                              "torch.compile, CUDAGraphs, and JIT kernel warmup. This is equivalent "
                              "to setting -cc.mode=none -cc.cudagraph_mode=none and "
                              "--kernel_config.enable_jit_warmup=False"))
    if eager:
        mode, cg = 0, "NONE"
    else:
        mode = cc.get("mode") if cc.get("mode") is not None else level_mode
        cg = cc.get("cudagraph_mode") or level_cg
    if cg in ("PIECEWISE", "FULL_AND_PIECEWISE") and mode != 3:
        new = "FULL_DECODE_ONLY" if cg == "FULL_AND_PIECEWISE" else "NONE"
        notices.append(Notice("api", "INFO", "vllm.py:1089", f"Cudagraph mode {cg} is not "
                              f"compatible with compilation mode {mode}. Overriding to {new}."))
        cg = new
    if eager and cuda:
        notices.append(Notice("api", "INFO", "vllm.py:1929", "Cudagraph is disabled under eager mode"))
    if not cuda:
        # CPU has no static graphs: forced to NONE with no log line; VLLM_COMPILE becomes
        # DYNAMO_TRACE_ONCE with inductor (platforms/cpu.py).
        cg = "NONE"
        mode = 2 if mode == 3 else mode
    if "compilation_config.mode" in over:
        mode = int(over["compilation_config.mode"])
    if "compilation_config.cudagraph_mode" in over:
        cg = str(over["compilation_config.cudagraph_mode"]).upper()
    return eager, mode, cg


def _resolve_graphs(args: SimArgs, over: Mapping[str, Any], limits: _Limits, spec: SpecConfig | None,
                    profile: Profile, notices: list[Notice]) -> _Graphs:
    cuda = profile.hardware.platform == "cuda"
    k = spec.num_spec_tokens if spec else 0
    cc = dict(args.compilation_config or {})
    eager, mode, cg = _compile_modes(args, cc, over, cuda, notices)
    sizes: tuple[int, ...] = ()
    max_cap = 0
    if cg != "NONE":
        sizes, max_cap = _capture_sizes(args, cc, limits.mns, limits.mnbt, k, profile, notices)
    if "compilation_config.max_cudagraph_capture_size" in over and sizes:
        max_cap = int(over["compilation_config.max_cudagraph_capture_size"])
        sizes = tuple(s for s in sizes if s <= max_cap)
    failure: Failure | None = None
    final_cg = cg
    if cuda and cg != "NONE":
        final_cg, failure = _backend_downgrade(cg, mode, k, profile, notices)
    run_sizes = sizes if final_cg != "NONE" else ()
    if spec and final_cg in ("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE") and run_sizes:
        run_sizes = _round_for_spec(run_sizes, max_cap, k)
    return _Graphs(eager, mode, cg, final_cg, sizes, max_cap, run_sizes, failure)


def _world_size_failure(env: Mapping[str, str], profile: Profile, limits: _Limits) -> Failure | None:
    """TP x PP larger than the GPUs CUDA_VISIBLE_DEVICES leaves visible."""
    hw = profile.hardware
    if hw.platform != "cuda":
        return None
    visible = hw.num_devices
    if env.get("CUDA_VISIBLE_DEVICES") is not None:
        ids = [x.strip() for x in env["CUDA_VISIBLE_DEVICES"].split(",") if x.strip()]
        visible = len([x for x in ids if x.isdigit() and int(x) < hw.num_devices])
    world = limits.tp * limits.pp
    if world <= visible:
        return None
    return Failure("engine", "ValueError", f"World size ({world}) is larger than the "
                   f"number of available GPUs ({visible}) in this node. If this is "
                   "intentional and you are using: - ray, set '--distributed-executor-"
                   "backend ray'. - multiprocessing, set '--nnodes' appropriately.")


def _memory(args: SimArgs, env: Mapping[str, str], profile: Profile, limits: _Limits, graphs: _Graphs,
            util: float, kv_dtype: str, weights_factor: float = 1.0) -> _Memory:
    """Weights, KV-cache size and the first memory failure vLLM would report."""
    failure: Failure | None = None
    hw, model = profile.hardware, profile.model
    cuda = hw.platform == "cuda"
    tp, pp, mnbt, max_len = limits.tp, limits.pp, limits.mnbt, limits.max_len
    weights = model.weights_gib * weights_factor / (tp * pp)   # fp8 weights: fewer bytes
    act = (profile.defaults.activation_fixed_gib
           + profile.defaults.activation_gib_per_1k_batched_tokens * mnbt / 1000)
    graph_mem = profile.startup.graph_memory_gib_per_size * len(graphs.run_sizes) * (
        2 if graphs.final_cg == "FULL_AND_PIECEWISE" else 1)
    kv_bytes = model.kv_bytes_per_token / (tp if model.kv_sharded_by_tp else 1)
    kv_bytes *= 0.5 if kv_dtype.startswith("fp8") else 1.0
    if cuda:
        if util * hw.memory_gib > hw.free_memory_gib and failure is None:
            failure = Failure("engine", "ValueError", f"Free memory on device cuda:0 "
                              f"({hw.free_memory_gib:.2f}/{hw.memory_gib:.2f} GiB) on startup is "
                              f"less than desired GPU memory utilization ({util}, "
                              f"{util * hw.memory_gib:.2f} GiB). Decrease GPU memory utilization "
                              "or reduce GPU memory used by other processes.")
        kv_gib = util * hw.memory_gib - weights - act - profile.defaults.non_torch_gib - graph_mem
    else:
        kv_gib = float(env.get("VLLM_CPU_KVCACHE_SPACE", hw.cpu_kvcache_default_gib))
    if args.kv_cache_memory_bytes:
        kv_gib = args.kv_cache_memory_bytes / GIB
    if cuda and weights > hw.free_memory_gib and failure is None:
        failure = Failure("engine", "torch.OutOfMemoryError", "CUDA out of memory. Tried to "
                          f"allocate 1.50 GiB. GPU 0 has a total capacity of {hw.memory_gib:.2f} "
                          "GiB of which 1.02 GiB is free. Including non-PyTorch memory, this "
                          f"process has {hw.memory_gib - 1.02:.2f} GiB memory in use.", stage="load")
    block = profile.defaults.block_size
    kv_tokens = max(0, int(kv_gib * GIB / kv_bytes) // block * block)
    if failure is None and kv_gib <= 0:
        failure = Failure("engine", "ValueError", "No available memory for the cache blocks. Try "
                          "increasing `gpu_memory_utilization` when initializing the engine.",
                          stage="kv")
    elif failure is None and kv_tokens < max_len:
        need = max_len * kv_bytes / GIB
        failure = Failure("engine", "ValueError", f"To serve at least one request with the "
                          f"models's max seq len ({max_len}), ({need:.2f} GiB KV cache is needed, "
                          f"which is larger than the available KV cache memory ({kv_gib:.2f} GiB). "
                          f"Based on the available memory, the estimated maximum model length is "
                          f"{kv_tokens}. Try increasing `gpu_memory_utilization` or decreasing "
                          "`max_model_len` when initializing the engine.", stage="kv")
    return _Memory(weights, kv_gib, kv_tokens, failure)


def _log_stats_interval(env: Mapping[str, str]) -> float:
    try:
        return float(env.get("VLLM_LOG_STATS_INTERVAL", "10"))
    except ValueError:
        return 10.0


def compilation_mode_name(mode: int) -> str:
    return COMPILATION_MODE_NAMES[mode] if 0 <= mode < 4 else str(mode)
