"""The study file: strict pydantic models of everything a study declares.

A study file is YAML; ``tuner.study.study_file.parse_study`` turns its text into a frozen
``StudySpec`` or raises ``SpecError`` whose lines each name the file, the field path, the bad
value and what is allowed. Unknown keys are errors everywhere, so a typo never silently
becomes a default.

Here: the settings sections (budget, sampler, verify, execution, confirm, safety) and
``StudySpec``, whose checks span sections. The other sections' models live by concept:
``tuner.study.server_spec`` (server:), ``tuner.study.parameters`` (parameters:, forbidden:,
and the domain and condition checks), ``tuner.study.objectives`` (objectives:, limits:),
with their shared base in ``tuner.study.spec_base``.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationInfo, field_validator, model_validator

from tuner.load.efficiency import Holding
from tuner.load.level_energy import ENERGY_KEYS
from tuner.load.load_spec import LoadSpec
from tuner.load.slo import GOODPUT_KEYS, SloSpec
from tuner.probe.spec import ProbeSpec
from tuner.secrets import is_secret_name
from tuner.study.bounds import bound_errors, unknown_bound_names
from tuner.study.cost import CostSpec, trial_holding
from tuner.study.objectives import MAX_RATE, LimitSpec, ObjectiveSpec
from tuner.study.parameters import (
    ForbiddenSpec,
    Parameter,
    check_acyclic,
    check_condition,
    check_in_domain,
    multicast_candidates,
)
from tuner.study.quality import QualitySpec, quality_problem
from tuner.study.server_spec import ServerSpec, fixed_targets
from tuner.study.spec_base import Scalar, Seconds, Strict
from tuner.study.study_name import check_study_name
from tuner.study.trial_metrics import ACCURACY_DROP, TRIAL_METRIC_DIRECTION, TRIAL_METRICS
from tuner.study.weights import study_probe_mode
from tuner.vllm.compile_cache import check_cache_dir
from tuner.vllm.multicast import multicast_use

__all__ = [
    "StudySpec",
    "dummy_weights_warning",
    "ConfirmSpec",
    "BudgetSpec",
    "SamplerSpec",
    "VerifySpec",
    "ExecutionSpec",
    "SafetySpec",
    "SCHEMA_VERSION",
]

SCHEMA_VERSION = 1


class BudgetSpec(Strict):
    n_trials: int = Field(20, ge=1, description="trials that run a server (baseline included)")
    timeout: Seconds | None = Field(None, gt=0, description="wall-clock limit, e.g. '8h'")
    trial_timeout: Seconds = Field(1800.0, gt=0, description="one trial's deadline, e.g. '30m'")
    max_retries: int = Field(1, ge=0, description="re-runs of a trial interrupted by the tuner")


class SamplerSpec(Strict):
    name: Literal["auto", "tpe", "nsga2", "random", "grid"] = Field(
        "auto", description="auto: an initial design sized from the space, then the unmeasured point "
        "with the largest expected improvement (TPE + local search where the space cannot be enumerated); "
        "tpe: the earlier default (TPE + local search after random start-up trials)")
    seed: int = 0
    n_startup_trials: int | None = Field(None, ge=0, description="tpe: random trials before TPE models")


class VerifySpec(Strict):
    require_applied: bool = Field(
        True, description="a knob the server did not apply makes the trial infeasible"
    )
    nccl_debug: Literal["auto", "on", "off"] = Field(
        "auto", description="auto: set NCCL_DEBUG=INFO when NCCL variables are searched"
    )


class StartupSpec(Strict):
    """What the tuner does to make its servers start sooner (docs/gpu-box.md, "Startup
    levers", with what each saved on an H100). Measurement only: neither changes the
    configuration measured or exported."""

    prestart: bool = Field(
        True, description="start the next server's interpreter, and its imports, while the current "
        "server starts; the next trial hands it its configuration instead of spawning a process "
        "(17-26 s less to wait per start on an H100, 8 s on the 2-core CPU build). Used only where "
        "the imports cannot have seen a difference (tuner/adapters/spare.py); a spare never imports "
        "during a load level")
    triton_cache: bool = Field(
        True, description="TRITON_CACHE_DIR under the study's cache root (execution.compile_cache_dir; "
        "none with 'vllm-default'): torch.compile otherwise gives every server a Triton cache of its "
        "own, and each compiled start re-compiled its warm-up kernels (12-16 s on an H100)")


class ExecutionSpec(Strict):
    parallel_trials: int | None = Field(
        None, ge=1, description="GPU groups used at once; default: as many as the cluster has"
    )
    early_stop: bool = Field(
        True, description="stop a trial once what it measured proves it cannot reach the front "
        "(tuner/study/early_stop.py); false measures every trial in full"
    )
    compile_cache_dir: str | None = Field(
        None, description="vLLM's cache root (VLLM_CACHE_ROOT) for every server this study "
        "starts, so trials share torch.compile artifacts there; absolute ('~' and $VARS "
        "expanded). Unset: the study's own <study folder>/vllm-cache (or VLLM_CACHE_ROOT when "
        "the tuner runs with it set); 'vllm-default': vLLM's own (~/.cache/vllm, shared by "
        "every study on the node). A VLLM_CACHE_ROOT in server.env wins. Not carried into exports"
    )
    startup: StartupSpec = Field(default_factory=StartupSpec, description="startup levers")
    gpu_free_timeout: Seconds | None = Field(
        None, gt=0, description="how long a trial waits for other processes to leave its GPUs "
        "(nvidia-smi) before it fails 'gpus_not_free' without starting a server, e.g. '2m'. "
        "Unset: what is left of server.stop_timeout after the previous server's stop"
    )

    @field_validator("compile_cache_dir")
    @classmethod
    def _check_compile_cache_dir(cls, value: str | None) -> str | None:
        return check_cache_dir(value)


class ConfirmSpec(Strict):
    """Confirmation re-runs of front candidates (tuner.study.confirmation) and repeats that
    separate candidates noise cannot tell apart (tuner.study.ties)."""

    candidates: int = Field(
        0, ge=0, le=20, description="front points re-run once the budget is spent (0: none); "
        "chosen best-per-objective first, then the knee, then the rest of the front")
    repeats: int = Field(1, ge=1, le=5, description="fresh-server re-runs per candidate")
    tolerance: float | None = Field(
        None, gt=0, lt=1, description="relative change of an objective (median of the re-runs "
        "against the trial) in either direction beyond which the point is not reproducible. "
        "Unset: from the study's noise between starts, per objective (the 95 % interval of a "
        "re-run's difference from the trial, tuner.study.study_noise.confirmation_tolerances)")
    min_change: float = Field(
        0.01, ge=0, lt=1, description="with the tolerance from the study's noise: a change smaller "
        "than this is never called not reproducible, however quiet the box (a difference must be "
        "both beyond the noise and big enough to change a choice)")
    tie_runs: int = Field(
        0, ge=0, le=50, description="fresh-server re-runs to spend, after the confirmation "
        "re-runs, on front candidates whose intervals overlap, until they separate or these "
        "runs are spent (0: off); the report shows what was spent and what stayed a tie")


class SafetySpec(Strict):
    allow_multicast: bool = Field(
        False, description="allow settings that turn NVLink multicast on (NCCL_ALGO NVLS/NVLSTree, "
        "NCCL_NVLS_ENABLE, TORCH_SYMM_MEM_DISABLE_MULTICAST=0, NVSHMEM_DISABLE_NVLS=0, ... - "
        "tuner/vllm/multicast.py) in parameters and server.env"
    )
    bounds: dict[str, float] = Field(
        default_factory=dict,
        description="raised upper bounds by name, e.g. {load.concurrency: 20000} "
        "(tuner/study/bounds.py and docs/study-file.md list them)",
    )

    @field_validator("bounds")
    @classmethod
    def _known_bounds(cls, bounds: dict[str, float]) -> dict[str, float]:
        from tuner.study.bounds import BOUNDS

        unknown = unknown_bound_names(bounds)
        if unknown:
            raise ValueError(f"unknown bound {unknown[0]!r}; bounds: {', '.join(b.name for b in BOUNDS)}")
        for name, value in bounds.items():
            if not value > 0:
                raise ValueError(f"{name}: {value} is not allowed; give a number above 0")
        return bounds


class StudySpec(Strict):
    schema_version: Literal[1] = 1
    name: str = Field(description="study name (tuner/study/study_name.py: letters, digits, _ . -)")
    description: str = ""
    server: ServerSpec
    parameters: list[Parameter] = Field(default_factory=list)
    forbidden: list[ForbiddenSpec] = Field(default_factory=list)
    baseline: dict[str, Scalar] = Field(
        default_factory=dict,
        description="parameter values of the baseline trial; unlisted parameters take their "
        "'default', or null/false",
    )
    starting_points: list[dict[str, Scalar]] = Field(
        default_factory=list,
        description="configurations to run right after the baseline (e.g. today's production "
        "flags, or a point a colleague swears by); unlisted parameters take their baseline value",
    )
    objectives: list[ObjectiveSpec] = Field(
        default_factory=lambda: [
            ObjectiveSpec(metric="output_tok_s", concurrency="max", direction="maximize"),
            ObjectiveSpec(metric="tpot_ms.mean", concurrency=1, direction="minimize"),
        ],
        min_length=1,
    )
    limits: list[LimitSpec] = Field(default_factory=list)
    slo: SloSpec | None = Field(
        None, description="latency SLO, {metric.statistic: bound in ms}: goodput at every "
        "level, and the search for max_rate@slo (tuner.load.slo)")
    load: LoadSpec = Field(default_factory=LoadSpec)
    probe: ProbeSpec = Field(default_factory=ProbeSpec)
    quality: QualitySpec | None = Field(
        None, description="the accuracy budget lossy values (fp8 KV cache, quantized weights, a "
        "parameter marked lossy: true) are searched under; without it they are refused")
    cost: CostSpec | None = Field(
        None, description="what one trial's hardware costs an hour ({gpu_hour: 2.49} or {node_hour: 20}): "
        "every level then says what a million output tokens cost (usd_per_mtok)")
    budget: BudgetSpec = Field(default_factory=BudgetSpec)
    sampler: SamplerSpec = Field(default_factory=SamplerSpec)
    verify: VerifySpec = Field(default_factory=VerifySpec)
    execution: ExecutionSpec = Field(default_factory=ExecutionSpec)
    confirm: ConfirmSpec = Field(default_factory=ConfirmSpec)
    safety: SafetySpec = Field(default_factory=SafetySpec)

    @field_validator("name")
    @classmethod
    def _check_name(cls, name: str) -> str:
        return check_study_name(name)

    @model_validator(mode="after")
    def _check_study(self, info: ValidationInfo) -> StudySpec:
        # Sizes and finiteness first: the checks below build parameter domains, and the
        # rest of the tuner sizes buffers and waits by these numbers.
        if problem := _unusable(self):
            raise ValueError(problem)
        if errors := bound_errors(self, self.safety.bounds):
            more = f" (and {len(errors) - 1} more value(s) above their bounds)" if len(errors) > 1 else ""
            raise ValueError(errors[0] + more)
        params = {p.name: p for p in self.parameters}
        if len(params) != len(self.parameters):
            dup = [p.name for p in self.parameters if sum(q.name == p.name for q in self.parameters) > 1]
            raise ValueError(f"parameters: name {dup[0]!r} is used twice")
        targets: dict[str, str] = {}
        for p in self.parameters:
            secret_target = p.target.removeprefix("env:")
            if is_secret_name(secret_target.split(".")[-1]) or secret_target in self.server.secret_env \
                    or p.target in self.server.secret_flags:
                raise ValueError(f"parameters: {p.name!r} searches {p.target}, a secret; a searched value "
                                 "is shown everywhere, so a secret can only be fixed (server.flags/env)")
            if p.target in targets:
                raise ValueError(
                    f"parameters: {p.name!r} and {targets[p.target]!r} both set {p.target}"
                )
            targets[p.target] = p.name
            if p.target in fixed_targets(self.server):
                raise ValueError(
                    f"parameters: {p.name!r} sets {p.target}, which server.flags/env already fix"
                )
            check_condition(f"parameter {p.name!r} 'when'", p.when, params, exclude=p.name)
            if not self.safety.allow_multicast:
                for value in multicast_candidates(p):
                    if why := multicast_use(p.target, value):
                        raise ValueError(
                            f"parameter {p.name!r}: value {value!r}: {why}: NVLink multicast is "
                            "off-limits unless safety.allow_multicast is true")
        check_acyclic(params)
        if not self.safety.allow_multicast:
            for name, value in self.server.env.items():
                if why := multicast_use(f"env:{name}", value):
                    raise ValueError(f"server.env.{name}: {why}: NVLink multicast is off-limits "
                                     "unless safety.allow_multicast is true")
        for i, rule in enumerate(self.forbidden):
            check_condition(f"forbidden[{i}]", rule.when, params, exclude=None)
        for name, value in self.baseline.items():
            if name not in params:
                raise ValueError(
                    f"baseline: {name!r} is not a parameter; parameters: {', '.join(params) or 'none'}"
                )
            check_in_domain(f"baseline.{name}", params[name], value)
        for i, point in enumerate(self.starting_points):
            for name, value in point.items():
                if name not in params:
                    raise ValueError(
                        f"starting_points[{i}]: {name!r} is not a parameter; parameters: "
                        f"{', '.join(params) or 'none'}"
                    )
                check_in_domain(f"starting_points[{i}].{name}", params[name], value)
        for p in self.parameters:
            if p.name not in self.baseline and p.default is not None:
                check_in_domain(f"parameter {p.name!r} default", p, p.default)
        tp = int(self.server.flags.get("tensor_parallel_size", 1) or 1)
        pp = int(self.server.flags.get("pipeline_parallel_size", 1) or 1)
        if self.server.gpus_per_trial and tp * pp > self.server.gpus_per_trial:
            raise ValueError(
                f"server.gpus_per_trial: {self.server.gpus_per_trial} is fewer than "
                f"tensor_parallel_size x pipeline_parallel_size = {tp * pp}"
            )
        _check_cost(self)
        for where, items in (("objectives", self.objectives), ("limits", self.limits)):
            for item in items:
                _check_level(where, item, self)
        labels = [o.label for o in self.objectives]
        if len(set(labels)) != len(labels):
            raise ValueError(f"objectives: the same objective is listed twice: {labels}")
        # The probe's mode against the server's weights (dummy: reference-only).
        study_probe_mode(self)
        if problem := quality_problem(self, saved=bool((info.context or {}).get("saved"))):
            raise ValueError(problem)
        return self

    @property
    def searches_max_rate(self) -> bool:
        """An objective or a limit names max_rate@slo: every trial searches it."""
        return (any(o.metric == MAX_RATE for o in self.objectives)
                or any(lim.metric == MAX_RATE for lim in self.limits))

    @property
    def names_energy(self) -> bool:
        """An objective or a limit reads an energy figure (tuner.load.level_energy)."""
        return any(o.metric in ENERGY_KEYS for o in self.objectives) or any(
            lim.metric in ENERGY_KEYS for lim in self.limits)

    @property
    def holding(self) -> Holding | None:
        """What one trial holds and costs (per-GPU and per-dollar figures at every level)."""
        return trial_holding(self.server.gpus_per_trial, self.cost)

    @property
    def searched_env(self) -> list[str]:
        """The environment variables the parameters search (their values change per trial)."""
        return [p.target.removeprefix("env:") for p in self.parameters if p.target.startswith("env:")]


def _unusable(value: Any, path: str = "") -> str | None:
    """What is wrong with the first NaN, infinity or NUL character anywhere in a validated
    spec, else None.

    The study's own models refuse non-finite numbers (allow_inf_nan); this also covers the
    sections defined elsewhere (load, probe) and free-form values (flags, env,
    conditions). A NUL cannot be in an argument, a variable or a file name (exec and the
    kernel end a string there), so a server would never run the value that was measured.
    """

    where = path or "(top level)"
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{where} is not a finite number; give an ordinary number"
    if isinstance(value, str):
        return None if "\0" not in value else (
            f"{where} contains a NUL character, which no command line, environment or file can carry")
    if isinstance(value, BaseModel):
        items: Any = ((k, getattr(value, k)) for k in type(value).model_fields)
    elif isinstance(value, dict):
        items = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    else:
        return None
    for key, child in items:
        if isinstance(key, str) and "\0" in key:
            return f"{where}: a key contains a NUL character"
        child_path = f"{path}[{key}]" if isinstance(key, int) else (f"{path}.{key}" if path else str(key))
        if found := _unusable(child, child_path):
            return found
    return None


def _check_cost(spec: StudySpec) -> None:
    """A per-GPU price needs GPUs to multiply."""
    if spec.cost is not None and spec.cost.gpu_hour is not None and spec.server.gpus_per_trial == 0:
        raise ValueError("cost.gpu_hour: a trial holds no GPUs (server.gpus_per_trial is 0); price the "
                         "machine instead, cost: {node_hour: ...}")


def _check_level(where: str, item: ObjectiveSpec | LimitSpec, spec: StudySpec) -> None:
    """Where an objective or limit is read: a measured level, and what its metric needs."""
    metric = item.metric
    # A saved spec (results/NAME/spec.yaml) lists every field, defaults included: only a
    # concurrency other than the default counts as given.
    concurrency_given = item.concurrency != "max"
    if metric == MAX_RATE:
        if spec.slo is None:
            raise ValueError(f"{where}: {MAX_RATE} needs an slo: section (the latency SLO the "
                             "rate must meet), e.g. slo: {ttft_ms.p99: 2000}")
        if concurrency_given or item.rate is not None or item.level is not None:
            raise ValueError(f"{where}: {MAX_RATE} is one value per trial (the search over "
                             "rates); remove concurrency/rate/level")
        if isinstance(item, ObjectiveSpec) and item.direction != "maximize":
            raise ValueError(f"{where}: {MAX_RATE} can only be maximized (a higher rate within "
                             "the SLO is better)")
        return
    if metric == ACCURACY_DROP:
        if spec.quality is None:
            raise ValueError(f"{where}: {ACCURACY_DROP} needs a quality: section (the accuracy budget the "
                             "drop is measured under), e.g. quality: {max_accuracy_drop: 0.02}")
        if isinstance(item, ObjectiveSpec) and item.direction != TRIAL_METRIC_DIRECTION[metric]:
            raise ValueError(f"{where}: {ACCURACY_DROP} can only be minimized (a smaller loss of "
                             "accuracy is better)")
    if metric == "usd_per_mtok" and spec.cost is None:
        raise ValueError(f"{where}: usd_per_mtok needs a cost: section (what a trial's hardware costs an "
                         "hour), e.g. cost: {gpu_hour: 2.49}")
    if metric == "output_tok_s_per_gpu" and spec.server.gpus_per_trial == 0:
        raise ValueError(f"{where}: output_tok_s_per_gpu needs GPUs, and server.gpus_per_trial is 0 (a CPU "
                         "build); use output_tok_s, or usd_per_mtok with cost: {node_hour: ...}")
    if metric in GOODPUT_KEYS and spec.slo is None:
        raise ValueError(f"{where}: {metric} needs an slo: section (requests are good when "
                         "they meet it), e.g. slo: {ttft_ms.p99: 2000}")
    if item.level is not None:
        if concurrency_given or item.rate is not None:
            raise ValueError(f"{where}: {metric}: level {item.level} is a level of its own; remove "
                             "concurrency/rate")
        if metric in TRIAL_METRICS:
            raise ValueError(f"{where}: {metric} is a trial-level metric; remove level")
        if spec.load.trace is None:
            raise ValueError(f"{where}: {metric} at level trace is not a measured level; load.trace "
                             "replays a timed dataset as that level (load.trace: {} for the whole trace)")
        return
    if item.rate is not None:
        if concurrency_given:
            raise ValueError(f"{where}: {metric}: give concurrency or rate, not both")
        if metric in TRIAL_METRICS:
            raise ValueError(f"{where}: {metric} is a trial-level metric; remove rate")
        rates = spec.load.request_rates
        if not any(abs(item.rate - r) <= 1e-9 * r for r in rates):
            raise ValueError(f"{where}: {metric} at rate {item.rate} is not a measured level; "
                             f"load.request_rates is {list(rates)}")
        return
    levels = spec.load.concurrency
    if isinstance(item.concurrency, int) and item.concurrency not in levels:
        raise ValueError(
            f"{where}: {metric} at concurrency {item.concurrency} is not a "
            f"measured level; load.concurrency is {list(levels)}"
        )


def dummy_weights_warning(spec: StudySpec) -> str | None:
    """Why speculative decoding measured on random weights (``load_format: dummy``) says
    nothing of the real model's speed-up; None when the study does not combine them."""

    def sets(target: str, value: object = None) -> bool:
        fixed = spec.server.flags.get(target)
        if fixed is not None and (value is None or fixed == value):
            return True
        return any(p.flag is not None and (p.flag == target or p.flag.startswith(target + "."))
                   and (value is None or value in (getattr(p, "values", None) or [])) for p in spec.parameters)

    if not (sets("load_format", "dummy") and sets("speculative_config")):
        return None
    return ("load_format 'dummy' with speculative decoding in the study: random weights repeat themselves, so "
            "n-gram and draft acceptance is that of random text (100 % for n-gram on an 8B-class dummy model on "
            "an H100), not your model's; the speed-up it measures is no evidence for your traffic - judge "
            "speculation with the real weights")
