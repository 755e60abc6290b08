"""The study file: strict pydantic models of everything a study declares.

A study file is YAML; ``tuner.study.study_file.parse_study`` turns its text into a frozen
``StudySpec`` or raises ``SpecError`` whose lines each name the file, the field path, the bad
value and what is allowed. Unknown keys are errors everywhere, so a typo never silently
becomes a default.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from tuner.secrets import is_secret_name
from tuner.study.bounds import bound_errors, unknown_bound_names
from tuner.study.durations import parse_duration
from tuner.load.load_spec import LoadSpec, rate_level_name
from tuner.load.slo import GOODPUT_KEYS, SloSpec
from tuner.probe.spec import ProbeSpec
from tuner.study.study_name import check_study_name
from tuner.vllm.compile_cache import check_cache_dir
from tuner.vllm.knobs import check_target_name, check_value
from tuner.vllm.multicast import MULTICAST_TARGETS, multicast_use

__all__ = [
    "StudySpec",
    "ConfirmSpec",
    "ServerSpec",
    "Parameter",
    "CategoricalParam",
    "IntParam",
    "FloatParam",
    "BoolParam",
    "ForbiddenSpec",
    "ObjectiveSpec",
    "LimitSpec",
    "BudgetSpec",
    "SamplerSpec",
    "VerifySpec",
    "SCHEMA_VERSION",
    "MAX_RATE",
]

SCHEMA_VERSION = 1

Scalar = str | int | float | bool | None
Seconds = Annotated[float, BeforeValidator(parse_duration)]


class _Strict(BaseModel):
    # allow_inf_nan: a NaN limit or an infinite timeout reaches arithmetic that assumes
    # ordinary numbers (early stop, durations); refused where it is written.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class ServerSpec(_Strict):
    """How to start the server under test. Flags and env here are fixed for every trial."""

    command: list[str] = Field(
        default_factory=lambda: ["vllm", "serve"],
        min_length=1,
        description="argv prefix that starts the server; '{python}' is replaced by the "
        "tuner's interpreter (used for the built-in simulator).",
    )
    model: str = Field(min_length=1, description="model path or id, passed as --model")
    served_model_name: str | None = Field(None, description="name the API serves the model as")
    host: str = Field("127.0.0.1", description="address the server binds; loopback unless needed")
    port: int = Field(8000, ge=1, le=65535, description="first port; parallel groups add 1, 2, ...")
    gpus_per_trial: int = Field(8, ge=0, description="GPUs one trial holds (a Ray resource)")
    cpus_per_trial: float = Field(1.0, ge=0, description="CPUs one trial holds (a Ray resource)")
    startup_timeout: Seconds = Field(1200.0, gt=0, description="readiness deadline, e.g. '20m'")
    stop_timeout: Seconds = Field(30.0, gt=0, description="grace after SIGTERM before SIGKILL")
    flags: dict[str, Any] = Field(default_factory=dict, description="fixed vLLM arguments")
    env: dict[str, Scalar] = Field(default_factory=dict, description="fixed environment")
    secret_env: list[str] = Field(
        default_factory=list,
        description="names of variables whose values are secrets: passed through from the "
        "tuner's environment, or given in env (also as '${NAME}': read where the study "
        "runs); their values are never written anywhere (docs/study-file.md, Secrets)",
    )
    secret_flags: list[str] = Field(
        default_factory=list,
        description="flags (or dotted config fields) in flags whose values are secrets, "
        "besides those with secret-looking names (api_key, *_token, *password*, ...)",
    )

    @model_validator(mode="after")
    def _check_secrets(self) -> ServerSpec:
        from tuner.secrets import MIN_SECRET_CHARS, reference_name, secret_slots

        targets = {t for key, value in self.flags.items() for t, _ in _leaves(key, value)} | set(self.flags)
        for name in self.secret_flags:
            if name not in targets:
                raise ValueError(f"secret_flags: {name!r} is not in server.flags; flags: "
                                 f"{', '.join(sorted(targets)) or 'none'}")
        for name in self.secret_env:
            if error := check_target_name(f"env:{name}"):
                raise ValueError(f"secret_env: {error}")
        refs: dict[str, str | None] = {}
        for slot in secret_slots(self):
            where = slot.where.removeprefix("env:")
            if slot.value is not None and reference_name(slot.value) is None \
                    and len(slot.value) < MIN_SECRET_CHARS:
                raise ValueError(f"{where}: a secret must have at least {MIN_SECRET_CHARS} characters "
                                 "(shorter ones cannot be told apart from ordinary text in server logs)")
            if slot.ref in refs and refs[slot.ref] != slot.value:
                raise ValueError(f"{where}: two different secrets would both be written as ${{{slot.ref}}}; "
                                 f"give one of them as a reference with its own name, e.g. ${{OTHER_{slot.ref}}}")
            refs[slot.ref] = slot.value
        return self

    @field_validator("flags")
    @classmethod
    def _check_flags(cls, flags: dict[str, Any]) -> dict[str, Any]:
        for key, value in flags.items():
            if error := check_target_name(key):
                raise ValueError(f"flags.{key}: {error}")
            for target, leaf in _leaves(key, value):
                if error := check_value(target, leaf):
                    raise ValueError(f"flags.{target}: {error}")
        return flags

    @field_validator("env")
    @classmethod
    def _check_env(cls, env: dict[str, Scalar]) -> dict[str, Scalar]:
        for name, value in env.items():
            if error := check_target_name(f"env:{name}"):
                raise ValueError(f"env.{name}: {error}")
            if error := check_value(f"env:{name}", _env_text(value)):
                raise ValueError(f"env.{name}: {error}")
        return env


def _leaves(prefix: str, value: Any) -> list[tuple[str, Any]]:
    if isinstance(value, dict):
        out: list[tuple[str, Any]] = []
        for k, v in value.items():
            out.extend(_leaves(f"{prefix}.{k}", v))
        return out
    return [(prefix, value)]


def _env_text(value: Scalar) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


Condition = dict[str, Scalar | list[Scalar]]


class _ParamBase(_Strict):
    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.\-]*$", description="unique parameter name")
    flag: str | None = Field(None, description="vLLM argument: snake_case or dotted config field")
    env: str | None = Field(None, description="environment variable the value goes to")
    when: Condition = Field(
        default_factory=dict,
        description="active only when every named parameter has one of the given values",
    )
    default: Any = Field(None, description="the server's value when this knob is not set")
    description: str = ""

    @property
    def target(self) -> str:
        return self.flag if self.flag is not None else f"env:{self.env}"

    @model_validator(mode="after")
    def _one_target(self) -> _ParamBase:
        if (self.flag is None) == (self.env is None):
            raise ValueError(f"parameter {self.name!r}: give exactly one of 'flag' or 'env'")
        if error := check_target_name(self.target):
            raise ValueError(f"parameter {self.name!r}: {error}")
        return self


class CategoricalParam(_ParamBase):
    kind: Literal["categorical"]
    values: list[Scalar] = Field(min_length=1, description="choices; null means 'leave unset'")

    def domain_size(self) -> int:
        return len(self.values)

    @model_validator(mode="after")
    def _check_values(self) -> CategoricalParam:
        seen: set[str] = set()
        for value in self.values:
            key = repr(value)
            if key in seen:
                raise ValueError(f"parameter {self.name!r}: value {value!r} is listed twice")
            seen.add(key)
            checked = _env_text(value) if self.env is not None else value
            if error := check_value(self.target, checked):
                raise ValueError(f"parameter {self.name!r} ({self.target}): {error}")
        return self

    def domain(self) -> list[Any]:
        return list(self.values)


class IntParam(_ParamBase):
    kind: Literal["int"]
    low: int
    high: int
    step: int = Field(1, ge=1)
    log: bool = False

    @model_validator(mode="after")
    def _check_range(self) -> IntParam:
        if self.low > self.high:
            raise ValueError(f"parameter {self.name!r}: low {self.low} is above high {self.high}")
        if self.log and (self.low < 1 or self.step != 1):
            raise ValueError(f"parameter {self.name!r}: log scale needs low >= 1 and step 1")
        for bound in (self.low, self.high):
            if error := check_value(self.target, bound):
                raise ValueError(f"parameter {self.name!r} ({self.target}): {error}")
        return self

    def domain(self) -> Sequence[Any]:
        # A range, not a list: membership, length and indexing without building a wide one.
        return range(self.low, self.high + 1, self.step)

    def domain_size(self) -> int:
        return (self.high - self.low) // self.step + 1

    def contains(self, value: Any) -> bool:
        """``value in domain()`` without building it (a range may be wide)."""

        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or value != int(value):
            return False
        return self.low <= value <= self.high and (int(value) - self.low) % self.step == 0


class FloatParam(_ParamBase):
    kind: Literal["float"]
    low: float
    high: float
    step: float | None = Field(None, gt=0)
    log: bool = False

    @model_validator(mode="after")
    def _check_range(self) -> FloatParam:
        if self.low > self.high:
            raise ValueError(f"parameter {self.name!r}: low {self.low} is above high {self.high}")
        if self.log and (self.low <= 0 or self.step is not None):
            raise ValueError(f"parameter {self.name!r}: log scale needs low > 0 and no step")
        return self

    def domain(self) -> Sequence[Any] | None:
        if self.step is None:
            return None
        return _FloatSteps(self.low, self.step, int(round((self.high - self.low) / self.step)) + 1)

    def domain_size(self) -> int | None:
        return None if self.step is None else int(round((self.high - self.low) / self.step)) + 1


class _FloatSteps(Sequence[float]):
    """low, low + step, ... (``count`` values, rounded as the sampler rounds them), built
    one at a time: a fine step over a wide range is a long sequence, never a long list."""

    def __init__(self, low: float, step: float, count: int) -> None:
        self._low, self._step, self._count = low, step, count

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._count))]
        if index < 0:
            index += self._count
        if not 0 <= index < self._count:
            raise IndexError(index)
        return round(self._low + index * self._step, 12)

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, (list, _FloatSteps)) else NotImplemented


class BoolParam(_ParamBase):
    kind: Literal["bool"]

    def domain(self) -> list[Any]:
        return [False, True]


Parameter = Annotated[
    CategoricalParam | IntParam | FloatParam | BoolParam, Field(discriminator="kind")
]


class ForbiddenSpec(_Strict):
    """A combination rejected before any server starts."""

    when: Condition = Field(min_length=1, description="every listed parameter matches")
    reason: str = Field(min_length=1, description="shown when the combination is rejected")


_METRIC = re.compile(r"^[a-z_]+(\.(mean|p50|p90|p99))?$")
MAX_RATE = "max_rate@slo"
TRIAL_METRICS = ("startup_s", "probe_s", "trial_s")


def _level_label(metric: str, concurrency: int | str, rate: float | None) -> str:
    if metric in TRIAL_METRICS or metric == MAX_RATE:
        return metric
    if rate is not None:
        return f"{metric}@{rate_level_name(rate)}"
    return f"{metric}@c{concurrency}"


class ObjectiveSpec(_Strict):
    metric: str = Field(description="e.g. output_tok_s, tpot_ms.mean, ttft_ms.p99, startup_s, "
                        "goodput_req_s, max_rate@slo")
    concurrency: int | Literal["max", "min"] = Field(
        "max", description="load level the metric is read at (ignored for trial-level metrics)"
    )
    rate: float | None = Field(
        None, gt=0, description="read at the open-loop level of this rate (one of "
        "load.request_rates) instead of a concurrency level: label metric@r<rate>")
    direction: Literal["maximize", "minimize"]

    @field_validator("metric")
    @classmethod
    def _check_metric(cls, metric: str) -> str:
        if metric != MAX_RATE and not _METRIC.match(metric):
            raise ValueError(
                f"{metric!r} is not a metric name; use e.g. output_tok_s, request_per_s, "
                "tpot_ms.mean, ttft_ms.p99, e2el_ms.p50, goodput_req_s, or one of "
                + ", ".join((*TRIAL_METRICS, MAX_RATE))
            )
        return metric

    @property
    def label(self) -> str:
        return _level_label(self.metric, self.concurrency, self.rate)


class LimitSpec(_Strict):
    """A service-level limit; a trial that misses it is infeasible (told as a constraint)."""

    metric: str
    concurrency: int | Literal["max", "min"] = "max"
    rate: float | None = Field(None, gt=0)
    max: float | None = None
    min: float | None = None

    _check_metric = field_validator("metric")(ObjectiveSpec._check_metric.__func__)  # type: ignore[attr-defined]

    @model_validator(mode="after")
    def _one_bound(self) -> LimitSpec:
        if (self.max is None) == (self.min is None):
            raise ValueError(f"limit on {self.metric!r}: give exactly one of 'max' or 'min'")
        return self

    @property
    def label(self) -> str:
        bound = f"<={self.max}" if self.max is not None else f">={self.min}"
        return f"{_level_label(self.metric, self.concurrency, self.rate)}{bound}"


class BudgetSpec(_Strict):
    n_trials: int = Field(20, ge=1, description="trials that run a server (baseline included)")
    timeout: Seconds | None = Field(None, gt=0, description="wall-clock limit, e.g. '8h'")
    trial_timeout: Seconds = Field(1800.0, gt=0, description="one trial's deadline, e.g. '30m'")
    max_retries: int = Field(1, ge=0, description="re-runs of a trial interrupted by the tuner")


class SamplerSpec(_Strict):
    name: Literal["auto", "tpe", "nsga2", "random", "grid"] = Field(
        "auto", description="auto: an initial design sized from the space, then the unmeasured point "
        "with the largest expected improvement (TPE + local search where the space cannot be enumerated); "
        "tpe: the earlier default (TPE + local search after random start-up trials)")
    seed: int = 0
    n_startup_trials: int | None = Field(None, ge=0, description="tpe: random trials before TPE models")


class VerifySpec(_Strict):
    require_applied: bool = Field(
        True, description="a knob the server did not apply makes the trial infeasible"
    )
    nccl_debug: Literal["auto", "on", "off"] = Field(
        "auto", description="auto: set NCCL_DEBUG=INFO when NCCL variables are searched"
    )


class ExecutionSpec(_Strict):
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
    gpu_free_timeout: Seconds | None = Field(
        None, gt=0, description="how long a trial waits for other processes to leave its GPUs "
        "(nvidia-smi) before it fails 'gpus_not_free' without starting a server, e.g. '2m'. "
        "Unset: what is left of server.stop_timeout after the previous server's stop"
    )

    @field_validator("compile_cache_dir")
    @classmethod
    def _check_compile_cache_dir(cls, value: str | None) -> str | None:
        return check_cache_dir(value)


class ConfirmSpec(_Strict):
    """Confirmation re-runs of front candidates (tuner.study.confirmation) and repeats that
    separate candidates noise cannot tell apart (tuner.study.ties)."""

    candidates: int = Field(
        0, ge=0, le=20, description="front points re-run once the budget is spent (0: none); "
        "chosen best-per-objective first, then the knee, then the rest of the front")
    repeats: int = Field(1, ge=1, le=5, description="fresh-server re-runs per candidate")
    tolerance: float = Field(
        0.10, gt=0, lt=1, description="relative change of an objective (median of the re-runs "
        "against the trial) in either direction beyond which the point is not reproducible")
    tie_runs: int = Field(
        0, ge=0, le=50, description="fresh-server re-runs to spend, after the confirmation "
        "re-runs, on front candidates whose intervals overlap, until they separate or these "
        "runs are spent (0: off); the report shows what was spent and what stayed a tie")


class SafetySpec(_Strict):
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


class StudySpec(_Strict):
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
    def _check_study(self) -> StudySpec:
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
            if p.target in _fixed_targets(self.server):
                raise ValueError(
                    f"parameters: {p.name!r} sets {p.target}, which server.flags/env already fix"
                )
            _check_condition(f"parameter {p.name!r} 'when'", p.when, params, exclude=p.name)
            if not self.safety.allow_multicast:
                for value in _multicast_candidates(p):
                    if why := multicast_use(p.target, value):
                        raise ValueError(
                            f"parameter {p.name!r}: value {value!r}: {why}: NVLink multicast is "
                            "off-limits unless safety.allow_multicast is true")
        _check_acyclic(params)
        if not self.safety.allow_multicast:
            for name, value in self.server.env.items():
                if why := multicast_use(f"env:{name}", value):
                    raise ValueError(f"server.env.{name}: {why}: NVLink multicast is off-limits "
                                     "unless safety.allow_multicast is true")
        for i, rule in enumerate(self.forbidden):
            _check_condition(f"forbidden[{i}]", rule.when, params, exclude=None)
        for name, value in self.baseline.items():
            if name not in params:
                raise ValueError(
                    f"baseline: {name!r} is not a parameter; parameters: {', '.join(params) or 'none'}"
                )
            _check_in_domain(f"baseline.{name}", params[name], value)
        for i, point in enumerate(self.starting_points):
            for name, value in point.items():
                if name not in params:
                    raise ValueError(
                        f"starting_points[{i}]: {name!r} is not a parameter; parameters: "
                        f"{', '.join(params) or 'none'}"
                    )
                _check_in_domain(f"starting_points[{i}].{name}", params[name], value)
        for p in self.parameters:
            if p.name not in self.baseline and p.default is not None:
                _check_in_domain(f"parameter {p.name!r} default", p, p.default)
        tp = int(self.server.flags.get("tensor_parallel_size", 1) or 1)
        pp = int(self.server.flags.get("pipeline_parallel_size", 1) or 1)
        if self.server.gpus_per_trial and tp * pp > self.server.gpus_per_trial:
            raise ValueError(
                f"server.gpus_per_trial: {self.server.gpus_per_trial} is fewer than "
                f"tensor_parallel_size x pipeline_parallel_size = {tp * pp}"
            )
        for where, items in (("objectives", self.objectives), ("limits", self.limits)):
            for item in items:
                _check_level(where, item, self)
        labels = [o.label for o in self.objectives]
        if len(set(labels)) != len(labels):
            raise ValueError(f"objectives: the same objective is listed twice: {labels}")
        return self

    @property
    def searches_max_rate(self) -> bool:
        """An objective or a limit names max_rate@slo: every trial searches it."""
        return (any(o.metric == MAX_RATE for o in self.objectives)
                or any(lim.metric == MAX_RATE for lim in self.limits))

    def parameter(self, name: str) -> CategoricalParam | IntParam | FloatParam | BoolParam:
        for p in self.parameters:
            if p.name == name:
                return p
        raise KeyError(name)


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
def _check_level(where: str, item: ObjectiveSpec | LimitSpec, spec: StudySpec) -> None:
    """Where an objective or limit is read: a measured level, and what its metric needs."""
    metric = item.metric
    # A saved spec (results/NAME/spec.yaml) lists every field, defaults included: only a
    # concurrency other than the default counts as given.
    concurrency_given = item.concurrency != "max"
    if metric == MAX_RATE:
        if spec.slo is None:
            raise ValueError(f"{where}: {MAX_RATE} needs an slo: section (the latency SLO the "
                             "rate must meet), e.g. slo: {{ttft_ms.p99: 2000}}")
        if concurrency_given or item.rate is not None:
            raise ValueError(f"{where}: {MAX_RATE} is one value per trial (the search over "
                             "rates); remove concurrency/rate")
        if isinstance(item, ObjectiveSpec) and item.direction != "maximize":
            raise ValueError(f"{where}: {MAX_RATE} can only be maximized (a higher rate within "
                             "the SLO is better)")
        return
    if metric in GOODPUT_KEYS and spec.slo is None:
        raise ValueError(f"{where}: {metric} needs an slo: section (requests are good when "
                         "they meet it), e.g. slo: {{ttft_ms.p99: 2000}}")
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


def _multicast_candidates(param: Parameter) -> list[Any]:
    """The values of ``param`` worth asking multicast_use about, without building a large
    range: none for a target that cannot turn multicast on; for an integer range its ends
    and the 0 and 1 inside it (the on/off values of those switches)."""

    if param.target not in MULTICAST_TARGETS:
        return []
    if isinstance(param, IntParam):
        inside = {v for v in (0, 1) if param.low <= v <= param.high}
        return sorted({param.low, param.high} | inside)
    return list(param.domain() or [])


def _fixed_targets(server: ServerSpec) -> set[str]:
    fixed = {t for key, value in server.flags.items() for t, _ in _leaves(key, value)}
    fixed |= {f"env:{name}" for name in server.env}
    return fixed


def _check_condition(where: str, cond: Condition, params: dict[str, Any], *, exclude: str | None) -> None:
    for name, expected in cond.items():
        if name == exclude:
            raise ValueError(f"{where}: a parameter cannot depend on itself")
        if name not in params:
            raise ValueError(
                f"{where}: {name!r} is not a parameter; parameters: {', '.join(params) or 'none'}"
            )
        for value in expected if isinstance(expected, list) else [expected]:
            _check_in_domain(f"{where}.{name}", params[name], value)


def _check_in_domain(where: str, param: Any, value: Any) -> None:
    if isinstance(param, IntParam):
        if not param.contains(value):
            raise ValueError(f"{where}: {value!r} is not one of {param.name}'s values "
                             f"({param.low}..{param.high} step {param.step})")
        return
    domain = param.domain()
    if isinstance(domain, _FloatSteps) and isinstance(value, (int, float)) and not isinstance(value, bool):
        index = round((value - param.low) / param.step) if math.isfinite(value) else -1
        if not (0 <= index < len(domain) and math.isclose(domain[index], value, rel_tol=1e-9, abs_tol=1e-12)):
            raise ValueError(f"{where}: {value!r} is not one of {param.name}'s values "
                             f"({param.low}..{param.high} step {param.step})")
        return
    if domain is None:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not (
            param.low <= value <= param.high
        ):
            raise ValueError(f"{where}: {value!r} is outside [{param.low}, {param.high}]")
        return
    if not any(value == d and type(value) is type(d) for d in domain) and not (
        isinstance(value, (int, float)) and not isinstance(value, bool) and value in domain
    ):
        shown = ", ".join("null" if d is None else repr(d) for d in domain[:12])
        more = ", ..." if len(domain) > 12 else ""
        raise ValueError(f"{where}: {value!r} is not one of {param.name}'s values ({shown}{more})")


def _check_acyclic(params: dict[str, Any]) -> None:
    state: dict[str, int] = {}

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            raise ValueError(f"parameters: conditions form a cycle: {' -> '.join(path + [name])}")
        state[name] = 1
        for parent in params[name].when:
            visit(parent, path + [name])
        state[name] = 2

    for name in params:
        visit(name, [])
