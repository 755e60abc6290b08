"""Hardware profiles for the simulator: what machine and model the fake `vllm serve` pretends to be.

A profile is a YAML file validated by the strict pydantic models below (unknown keys are
rejected, so a typo in a profile fails loudly instead of silently using a default). Every
duration is in *simulated* seconds or milliseconds; TUNER_SIM_TIME_SCALE is applied later by
the I/O layer, never here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

PROFILE_DIR = Path(__file__).parent / "profiles"
DEFAULT_PROFILE = "glm5-8xpcie"

CgSupport = Literal["ALWAYS", "UNIFORM_BATCH", "UNIFORM_SINGLE_TOKEN_DECODE", "NEVER"]
Proto = Literal["Simple", "LL", "LL128"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSpec(_Strict):
    """The served model as the engine sees it."""

    display_name: str = Field(description="Human name shown in the simulator notice line.")
    architecture: str = Field(description="Printed in 'Resolved architecture: ...'.")
    num_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0, description="Bytes per token of an all-reduce = hidden*2.")
    num_attention_heads: int = Field(gt=0, description="TP must divide this.")
    max_model_len: int = Field(gt=0, description="Derived max length when --max-model-len is unset.")
    default_dtype: Literal["bfloat16", "float16", "float32"]
    quantization: str | None = Field(description="Shown as quantization=... in the config line.")
    weights_gib: float = Field(gt=0, description="Total weight bytes; split over TP*PP ranks.")
    kv_bytes_per_token: int = Field(gt=0, description="KV bytes per token per rank at dtype auto.")
    kv_sharded_by_tp: bool = Field(description="False for MLA: the latent KV is replicated per rank.")
    num_experts: int = Field(ge=0, description="Routed experts (0 = dense model).")
    experts_per_token: int = Field(ge=0)
    allreduces_per_step: int = Field(ge=0, description="TP all-reduce calls per forward step.")
    has_mtp_layers: bool = Field(description="Whether speculative method 'mtp' is supported.")
    mtp_num_layers: int = Field(ge=0, description="n_predict used when mtp omits num_spec_tokens.")


class HardwareSpec(_Strict):
    platform: Literal["cuda", "cpu"]
    device_name: str
    num_devices: int = Field(gt=0)
    memory_gib: float = Field(gt=0, description="Total memory per device.")
    free_memory_gib: float = Field(gt=0, description="Free memory per device at startup.")
    compute_capability: str = Field(description="e.g. '12.0'; SymmMem/FlashInfer AR need 9.0/10.0.")
    interconnect: Literal["pcie", "nvlink", "none"]
    nvswitch_multicast: bool = Field(description="NVLS / mnnvl workspace available.")
    flashinfer_allreduce: bool = Field(description="FlashInfer all-reduce usable (installed, SM90/100).")
    datacenter_blackwell: bool = Field(description="Default max capture size 1024 instead of 512.")
    nccl_version: str
    cpu_kvcache_default_gib: float = Field(default=4.0, gt=0, description="CPU: KV space default.")
    # vLLM's CPU attention takes an fp8 KV cache only on x86 with AVX-512 or AMX; the 2-core
    # box of tiny-cpu has neither, so vLLM refuses it there (docs/simulator.md, lossy settings).
    cpu_avx512: bool = Field(default=False, description="CPU: AVX-512 or AMX present (fp8 KV cache runs).")


class AttentionSpec(_Strict):
    backend: str = Field(description="Name in 'Using X attention backend'.")
    backend_class: str = Field(description="Class name in the cudagraph downgrade warning.")
    potential: list[str]
    cudagraph_support: CgSupport


class ServingDefaults(_Strict):
    """What vLLM would pick for unset flags on this machine (arg_utils per-device defaults)."""

    max_num_seqs: int = Field(gt=0)
    max_num_batched_tokens: int = Field(gt=0)
    activation_fixed_gib: float = Field(ge=0, description="Profiling-run peak, per rank, fixed part.")
    activation_gib_per_1k_batched_tokens: float = Field(
        ge=0, description="Peak part that grows with max_num_batched_tokens (MoE workspaces).")
    non_torch_gib: float = Field(ge=0)
    block_size: int = Field(default=16, gt=0)


class NcclSpec(_Strict):
    """Small-message ring all-reduce cost, per call, when captured in a CUDA graph.

    latency(N ranks) = base_us + 2*(N-1)*hop_us, the shape of NCCL's own tuning model.
    """

    default_proto: Proto = Field(description="Protocol NCCL's tuner ends up using here by default.")
    default_enabled_protos: list[Proto] = Field(description="Enabled when NCCL_PROTO is unset.")
    base_us: dict[Proto, float]
    hop_us: dict[Proto, float]
    busbw_gbps: dict[Proto, float] = Field(description="Bus bandwidth per protocol.")
    algos_available: list[str] = Field(description="Algorithms usable for all-reduce here.")
    default_algo: str
    algo_latency_factor: dict[str, float]
    algo_bw_factor: dict[str, float]
    shm_latency_factor: float = Field(gt=0, description="Penalty when NCCL_P2P_DISABLE=1.")
    shm_bw_factor: float = Field(gt=0)
    default_channels: int = Field(gt=0)


class OtherAllReduceSpec(_Strict):
    """Per-call latency of the non-NCCL backends, where the profile makes them available."""

    custom_us: float = Field(gt=0)
    custom_max_bytes: int = Field(gt=0)
    flashinfer_us: float = Field(gt=0)
    symm_mem_us: float = Field(gt=0)
    other_busbw_gbps: float = Field(gt=0)


class PerfSpec(_Strict):
    """Step-time model coefficients; see perf_model.py for the formula."""

    reference_tp: int = Field(gt=0, description="TP at which the ms figures below were calibrated.")
    dense_ms: float = Field(ge=0, description="Non-expert weight streaming per step.")
    expert_ms: float = Field(ge=0, description="Streaming every routed expert once.")
    same_seq_token_weight: float = Field(
        ge=0, le=1, description="How much an extra token of the same sequence widens expert use.")
    per_token_ms: float = Field(ge=0, description="Compute-bound cost per token in a step.")
    attention_us_per_ctx_token: float = Field(ge=0)
    overhead_ms: dict[Literal["eager", "compiled", "piecewise", "full"], float] = Field(
        description="Launch/Python overhead per step by execution regime.")
    eager_allreduce_extra_us: float = Field(ge=0, description="Per-call launch cost outside graphs.")
    sched_overhead_ms: float = Field(ge=0, description="CPU scheduling hidden by async scheduling.")
    sched_per_seq_us: float = Field(ge=0)
    ngram_lookup_us_per_seq: float = Field(ge=0)
    verify_ms_per_draft_token: float = Field(
        ge=0, description="Rejection sampling + multi-query attention per verified draft token.")
    drafter_ms_per_token: float = Field(ge=0, description="MTP/draft-model cost per drafted token.")
    drafter_accept_prob: list[float] = Field(description="Per-position acceptance of model drafters.")
    pp_send_us: float = Field(ge=0)
    kv_fp8_speedup: float = Field(gt=0, description="Attention cost divisor with an fp8 KV cache.")
    fp8_weights_factor: float = Field(
        0.5, gt=0, le=1, description="Share of the weight bytes, and so of the weight-streaming "
        "time of a step, left with --quantization fp8 (GPU; 0.5: bytes halve, more where "
        "embeddings and the LM head stay 16-bit or fp8 GEMMs fall short of 2x).")


class StartupSpec(_Strict):
    api_init_s: float = Field(ge=0)
    engine_init_s: float = Field(ge=0)
    weight_load_s: float = Field(ge=0)
    dynamo_s: float = Field(ge=0, description="Dynamo bytecode transform (compiled modes only).")
    inductor_s: float = Field(ge=0, description="Inductor graph compile (compiled modes only).")
    profile_run_s: float = Field(ge=0)
    kv_init_s: float = Field(ge=0)
    capture_piecewise_s_per_size: float = Field(ge=0)
    capture_full_s_per_size: float = Field(ge=0)
    graph_memory_gib_per_size: float = Field(ge=0)
    server_start_s: float = Field(ge=0)
    # vLLM's JIT kernel warm-up after graph capture, before "init engine ... took" (the
    # phase tuner/vllm/startup.py calls warmup): ~12 s on an H100 with vLLM 0.26 in every
    # compiled mode, graphs or not; --enforce-eager skips it.
    warmup_s: float = Field(0.0, ge=0, description="JIT kernel warm-up unless enforce_eager")
    # A torch.compile cache hit (tuner/sim/cache.py). vLLM 0.32 on CUDA compiles AOT by
    # default (VLLM_USE_AOT_COMPILE with torch >= 2.10): a hit loads the saved artifact, yet
    # real hit logs still print the Dynamo line (1.1-2.9 s where misses on similar models
    # take ~4.9 s) before the Inductor graphs load (0.2-1.9 s where compiling took 6.5 s):
    # torch.compile 1.6-4.9 s in total against 9.7-14.8 s. Defaults: 30 % of dynamo_s and
    # 10 % of inductor_s.
    dynamo_hit_s: float | None = Field(None, ge=0, description="Dynamo line on a cache hit")
    inductor_load_s: float | None = Field(None, ge=0, description="loading compiled graphs on a hit")

    @property
    def compile_hit_parts(self) -> tuple[float, float]:
        """(dynamo, inductor load) seconds of a cache hit."""

        return (0.3 * self.dynamo_s if self.dynamo_hit_s is None else self.dynamo_hit_s,
                0.1 * self.inductor_s if self.inductor_load_s is None else self.inductor_load_s)


class NoiseSpec(_Strict):
    """Measurement noise a real box shows and a model does not: throughput that wanders and
    a server that is slow for a while after its first request (lazy JIT, autotuning, clocks
    ramping). Both multiply the engine's step time (tuner/sim/noise.py); off by default."""

    throughput_jitter: float = Field(
        0.0, ge=0, lt=1, description="Step time x a factor drawn from [1-j, 1+j] per period.")
    jitter_period_s: float = Field(
        1.0, gt=0, description="Wall seconds one jitter factor holds (server clock).")
    warmup_ramp_s: float = Field(
        0.0, ge=0, description="Wall seconds after the first request during which steps are slower.")
    warmup_slowdown: float = Field(
        1.0, ge=0, description="Extra step time at the first request (1.0 = twice as slow), "
        "falling linearly to none at warmup_ramp_s.")
    start_spread: float = Field(
        0.0, ge=0, lt=1, description="Each server start runs at a speed drawn once from "
        "[1-s, 1+s] (the between-start noise of a real box).")
    seed: int | None = Field(
        None, description="Seed of the draws; None: a fresh seed every server start.")


class PowerSpec(_Strict):
    """Electrical power the simulated hardware draws, per device: per GPU on a CUDA profile,
    per CPU package on a CPU one (tuner/sim/power.py writes it as an energy counter). Power
    is ``idle_w + (busy_w - idle_w) * utilisation``, utilisation the share of time the
    engine has work. Defaults where a profile names none: DEFAULT_POWER."""

    idle_w: float = Field(ge=0, description="Watts with no request in the engine.")
    busy_w: float = Field(gt=0, description="Watts while the engine has work (at most the TDP).")

    @model_validator(mode="after")
    def _busy_at_least_idle(self) -> PowerSpec:
        if self.busy_w < self.idle_w:
            raise ValueError(f"power.busy_w {self.busy_w} is below power.idle_w {self.idle_w}")
        return self


# An H100/H200-class GPU: ~70 W idle with a model loaded, 700 W board limit (SXM). A CPU
# package: a desktop/server part's ~20 W idle and 65 W under load.
DEFAULT_POWER = {"cuda": PowerSpec(idle_w=70.0, busy_w=700.0), "cpu": PowerSpec(idle_w=20.0, busy_w=65.0)}


class Profile(_Strict):
    name: str
    description: str
    model: ModelSpec
    hardware: HardwareSpec
    attention: AttentionSpec
    defaults: ServingDefaults
    nccl: NcclSpec
    allreduce: OtherAllReduceSpec
    perf: PerfSpec
    startup: StartupSpec
    noise: NoiseSpec = Field(default_factory=NoiseSpec)
    model_runner: Literal["v1", "v2"] = Field(description="Decides capture bar wording.")
    arctic_inference_installed: bool = False
    # True accuracy drop of a lossy setting (tuner/sim/lossy.py), per knob, summed when both
    # are on; None: tuner.sim.lossy.DEFAULT_DROPS. TUNER_SIM_LOSSY_DROP overrides both.
    lossy_accuracy_drop: dict[Literal["kv_cache_dtype", "quantization"], float] | None = Field(
        None, description="Accuracy drop per lossy knob (0 <= drop <= 1).")
    power: PowerSpec | None = Field(None, description="Watts per device; None: DEFAULT_POWER by platform.")

    @property
    def power_spec(self) -> PowerSpec:
        """The profile's power, or the platform's default."""
        return self.power or DEFAULT_POWER[self.hardware.platform]

    @model_validator(mode="after")
    def _consistent(self) -> Profile:
        if self.nccl.default_algo not in self.nccl.algos_available:
            raise ValueError("nccl.default_algo must be one of nccl.algos_available")
        for table in (self.nccl.base_us, self.nccl.hop_us, self.nccl.busbw_gbps):
            if set(table) != {"Simple", "LL", "LL128"}:
                raise ValueError("nccl tables need Simple, LL and LL128 entries")
        if not self.perf.drafter_accept_prob:
            raise ValueError("perf.drafter_accept_prob needs at least one position")
        if self.hardware.free_memory_gib > self.hardware.memory_gib:
            raise ValueError("hardware.free_memory_gib exceeds memory_gib")
        for knob, drop in (self.lossy_accuracy_drop or {}).items():
            if not 0.0 <= drop <= 1.0:
                raise ValueError(f"lossy_accuracy_drop.{knob} = {drop}: an accuracy drop must be "
                                 "between 0 and 1")
        return self


class ProfileError(Exception):
    """A profile name or file that cannot be used; the message is shown to the user."""


def builtin_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def parse_profile(text: str, source: str) -> Profile:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ProfileError(f"profile {source}: invalid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ProfileError(f"profile {source}: top level must be a mapping")
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        raise ProfileError(f"profile {source}: {exc}") from exc


def load_profile(name_or_path: str | None) -> Profile:
    """Built-in name (e.g. 'tiny-cpu') or a path to a YAML file; None means the default."""
    ref = name_or_path or DEFAULT_PROFILE
    path = Path(ref)
    if not (ref.endswith((".yaml", ".yml")) or "/" in ref):
        path = PROFILE_DIR / f"{ref}.yaml"
        if not path.is_file():
            raise ProfileError(
                f"unknown simulator profile {ref!r}; built-in: {', '.join(builtin_profiles())}")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ProfileError(f"cannot read profile {ref}: {exc}") from exc
    return parse_profile(text, str(path))
