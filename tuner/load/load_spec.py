"""The study file's ``load:`` section: what load each trial is measured under.

A trial is measured by a closed-loop concurrency sweep (measurement.md §4, recommended
default 1): at each level C, C streams each send a request as soon as their previous one
finished. Before each level a warm-up with *different* prompts touches CUDA-graph sizes,
JIT and connections without warming the prefix or suffix-decoding cache (§4.4).

Pure data: the runner is :mod:`tuner.load.sweep`, prompts come from
:mod:`tuner.load.workload`.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tuner.load.dataset import MOONCAKE_BLOCK_TOKENS, DatasetFormat
from tuner.load.host_steadiness import MIN_SECONDS as HOST_CHECK_MIN_S
from tuner.load.rate_search import RateSearchSpec
from tuner.load.trace_spec import TraceSpec, field_rule

HOST_CHECK_MAX_S = 600.0

__all__ = ["Api", "Arrival", "DatasetSource", "LoadSpec", "OnUnstable", "Sizing", "WorkloadClass", "WorkloadKind",
           "WorkloadSpec", "rate_level_name"]

Api = Literal["completions", "chat"]
Sizing = Literal["steady", "requests"]
OnUnstable = Literal["flag", "infeasible"]
Arrival = Literal["poisson", "gamma"]
WorkloadKind = Literal["open_ended", "copy_heavy", "shared_prefix"]


class WorkloadClass(BaseModel):
    """One kind of request in the synthetic workload, mixed with the others by weight."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="Label carried into every request record; metrics can be split by it.",
    )
    kind: WorkloadKind = Field(
        description=(
            "open_ended: varied writing/explaining requests with filler context (where n-gram "
            "speculation looks bad). copy_heavy: a passage of code or text to repeat with "
            "small edits (where n-gram and suffix speculation look good). measurement.md §6 "
            "asks for both so speculative configs are not judged on one content type. "
            "shared_prefix: groups of requests that begin with the same system prompt of "
            "prefix_tokens, then a question of their own (agents, RAG, chat products), the "
            "traffic where prefix caching and chunked prefill pay."
        ),
    )
    weight: float = Field(
        default=1.0, gt=0, description="Relative share of this class among the requests."
    )
    prompt_tokens: int = Field(
        default=128, ge=1, le=1_000_000, description="Target prompt length in tokens."
    )
    output_tokens: int = Field(
        default=128, ge=1, le=1_000_000, description="max_tokens sent with every request."
    )
    prompt_tokens_jitter: float = Field(
        default=0.1,
        ge=0.0,
        lt=1.0,
        description=(
            "Range ratio: each prompt's target is drawn uniformly from "
            "prompt_tokens*(1±jitter), so requests do not move in lockstep (§4.9)."
        ),
    )
    prefix_tokens: int | None = Field(
        default=None, ge=1, le=1_000_000,
        description=(
            "shared_prefix only: length of the shared system prompt, part of prompt_tokens "
            "(the rest is each request's own question). Required for shared_prefix."
        ),
    )
    prefix_groups: int | None = Field(
        default=None, ge=1, le=100_000,
        description=(
            "shared_prefix only: how many different shared prompts the requests are spread "
            "over (default 8); each request draws its group at random."
        ),
    )

    @model_validator(mode="after")
    def _prefix_fields(self) -> WorkloadClass:
        shared = self.kind == "shared_prefix"
        if not shared:
            for name in ("prefix_tokens", "prefix_groups"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name} is for kind shared_prefix only (class {self.name!r} is "
                                     f"{self.kind})")
            return self
        if self.prefix_tokens is None:
            raise ValueError(f"class {self.name!r}: kind shared_prefix needs prefix_tokens (the shared "
                             "system prompt's length in tokens)")
        shortest = math.floor(self.prompt_tokens * (1 - self.prompt_tokens_jitter))
        if self.prefix_tokens >= shortest:
            raise ValueError(
                f"class {self.name!r}: prefix_tokens {self.prefix_tokens} leaves no room for a question "
                f"in the shortest prompt ({shortest} tokens: prompt_tokens {self.prompt_tokens} with "
                f"jitter {self.prompt_tokens_jitter}); make prompt_tokens larger than prefix_tokens")
        return self

    @property
    def groups(self) -> int:
        return self.prefix_groups if self.prefix_groups is not None else 8


def _default_classes() -> tuple[WorkloadClass, ...]:
    return (WorkloadClass(name="open_ended", kind="open_ended"),)


class DatasetSource(BaseModel):
    """A file of the user's own requests (tuner.load.dataset reads it)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str = Field(
        min_length=1,
        description="The dataset file; a relative path is relative to the study file's folder.",
    )
    format: DatasetFormat = Field(
        default="auto",
        description=(
            "prompts ({prompt, output_tokens} JSONL, as vllm bench serve's custom dataset), "
            "sharegpt, openai-chat, mooncake (a timed trace), or auto (told by the first "
            "entry's keys; the detected format is said in the output)."
        ),
    )
    output_tokens: int = Field(
        default=128, ge=1, le=1_000_000,
        description="max_tokens for an entry that does not give its own output length.",
    )
    block_tokens: int = Field(
        default=MOONCAKE_BLOCK_TOKENS, ge=1, le=1_000_000,
        description="mooncake: tokens per hash id (the published traces use 512).",
    )
    think_time_s: float = Field(
        default=0.0, ge=0.0, le=3600.0,
        description="Multi-turn conversations: pause between a reply's end and the next turn "
                    "(the user reading and typing); the conversation holds its stream meanwhile.",
    )


class WorkloadSpec(BaseModel):
    """The request mix and how output length is controlled."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    classes: tuple[WorkloadClass, ...] = Field(
        default_factory=_default_classes,
        min_length=1,
        description="Request classes, mixed by weight (exact proportions per level).",
    )
    dataset: DatasetSource | None = Field(
        default=None,
        description=(
            "Requests drawn from the user's own file instead of the synthetic classes "
            "(measurement.md, Workloads): text is sent verbatim."
        ),
    )
    ignore_eos: Literal["auto"] | bool = Field(
        default="auto",
        description=(
            "Send ignore_eos so every config generates exactly max_tokens. 'auto' = true for "
            "trials without speculative decoding and false for speculative ones, because "
            "ignore_eos produces degenerate repetitive continuations that inflate n-gram "
            "acceptance (measurement.md §4.9, §6)."
        ),
    )

    @field_validator("classes")
    @classmethod
    def _unique_names(cls, classes: tuple[WorkloadClass, ...]) -> tuple[WorkloadClass, ...]:
        seen: set[str] = set()
        for c in classes:
            if c.name in seen:
                raise ValueError(
                    f"workload class name {c.name!r} is used twice; names must be unique"
                )
            seen.add(c.name)
        return classes

    @model_validator(mode="after")
    def _one_source(self) -> WorkloadSpec:
        # Compared with the default rather than by fields set: a dumped spec (study.json, a
        # trial request crossing Ray) carries the default classes beside its dataset.
        if self.dataset is not None and self.classes != _default_classes():
            raise ValueError("classes and dataset are two sources of requests; name one of them")
        return self

    def resolve_ignore_eos(self, *, speculative: bool) -> bool:
        """The ignore_eos value the runner sends for a trial.

        Args:
            speculative: whether the trial enables speculative decoding.
        """
        if self.ignore_eos == "auto":
            return not speculative
        return self.ignore_eos


# Fields that size a level by request count (sizing: requests only).
_REQUEST_SIZING = ("requests_per_level", "requests_per_stream", "warmup_requests")


class LoadSpec(BaseModel):
    """Closed-loop concurrency sweep (and optional open-loop rate levels) run against every
    trial's server."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    api: Api = Field(
        default="completions",
        description="Endpoint: /v1/completions or /v1/chat/completions (single user message).",
    )
    sizing: Sizing = Field(
        default="steady",
        description=(
            "How long a closed-loop level runs. steady: by time and steady state - the "
            "streams run until the latest window of at least min_window_s, holding at least "
            "max(min_requests, C) completions, has sub-window output rates within "
            "stability_max_ratio of each other (everything before it is warm-up), or until "
            "max_level_seconds (then the level is unstable). requests: a fixed request count "
            "(requests_per_stream, requests_per_level) after warmup_requests; short on a "
            "fast server (on an H200 a c=32 level of 3 requests per stream lasted ~1.5 s). "
            "A file that sets requests_per_stream, requests_per_level or warmup_requests "
            "without sizing means requests (as before sizing existed)."
        ),
    )
    min_window_s: float = Field(
        default=10.0,
        gt=0,
        description="sizing: steady: shortest measured window, in seconds.",
    )
    stability_subwindows: int = Field(
        default=5,
        ge=3,
        le=20,
        description="sizing: steady: equal sub-windows the window is cut into for the rule.",
    )
    stability_max_ratio: float = Field(
        default=1.10,
        gt=1.0,
        le=3.0,
        description=(
            "sizing: steady: the stability rule - max/min of the sub-windows' output tok/s "
            "(Perf Analyzer's 10 %, measurement.md §4.5)."
        ),
    )
    noise_floor: float | None = Field(
        default=None,
        ge=0.0,
        lt=1.0,
        description=(
            "Between-start noise (a coefficient of variation across fresh server starts of one "
            "configuration, which one run's sub-windows cannot see), as a fixed override. Unset "
            "(the default), the study measures it: from the baseline's load.noise_starts fresh "
            "starts and every confirmation or tie re-run, per objective (tuner.study.between_starts). "
            "Set, every interval gets 1.96 x noise_floor x value added in quadrature instead."
        ),
    )
    noise_starts: int = Field(
        default=3,
        ge=1,
        le=10,
        description=(
            "Fresh starts of the baseline at the start of the study, from which the study measures "
            "its between-start noise (1: none beyond the baseline itself; the noise then comes "
            "from confirmation and tie re-runs alone). Each start is a trial of the budget. "
            "Ignored when load.noise_floor is set."
        ),
    )
    host_check_s: float = Field(
        default=0.0,
        description=(
            "Seconds of `tuner host-check` before the first server of every run and resume "
            "(0: none; else 10 to 600). The CPUs' own spread is recorded in host-check.json, "
            "printed, shown by `tuner status`, and a warning says when load.noise_floor is "
            "below it."
        ),
    )
    on_unstable: OnUnstable = Field(
        default="flag",
        description=(
            "A level that never met the stability rule marks its trial unstable. flag: the "
            "trial counts, marked UNSTABLE in status, report, pareto.json and exports. "
            "infeasible: the trial is told with the 'unstable' constraint violated (never on "
            "the front)."
        ),
    )
    concurrency: tuple[int, ...] = Field(
        default=(1, 4, 16, 64),
        min_length=1,
        description=(
            "Closed-loop levels, strictly ascending, each >= 1. Report E2EL/TPOT and per-user "
            "tok/s at C=1 and throughput near saturation (measurement.md §4.1)."
        ),
    )
    requests_per_level: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Measured requests per level. None = max(min_requests, requests_per_stream x C)."
        ),
    )
    requests_per_stream: int = Field(
        default=3,
        ge=1,
        description=(
            "Requests per concurrent stream when requests_per_level is None. The steady-state "
            "window only exists with >= 2 per stream; §4.2 suggests ~10 for stable numbers."
        ),
    )
    min_requests: int = Field(
        default=8,
        ge=1,
        description=(
            "Floor on measured requests per level (matters at low C). sizing: steady: the "
            "window holds at least max(min_requests, C) completed requests."
        ),
    )
    max_level_seconds: float = Field(
        default=300.0,
        gt=0,
        description=(
            "A level stops issuing new requests after this long; in-flight ones finish. "
            "sizing: steady: a level that has not met the stability rule by then is unstable."
        ),
    )
    warmup_requests: int | None = Field(
        default=None,
        ge=0,
        description=(
            "Warm-up requests before each level, at that level's concurrency and with prompts "
            "distinct from the measured ones. None = max(2C, 4); 0 disables warm-up."
        ),
    )
    request_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="Total time allowed for one request, stream included; then it is failed.",
    )
    fit_prompt_tokens: bool = Field(
        default=True,
        description=(
            "Trim measured prompts to exact token counts with the server's /tokenize. If the "
            "endpoint is missing the ~1.3 tokens/word estimate is used (recorded in results)."
        ),
    )
    repeats: int = Field(
        default=1,
        ge=1,
        le=20,
        description=(
            "Measure each level this many times (fresh prompts of the same shape each time, "
            "one warm-up before the first). Metrics report the median across repeats and "
            "the spread (min, max, coefficient of variation); aiperf suggests 3-5 "
            "(measurement.md §4)."
        ),
    )
    client_processes: int = Field(
        default=1,
        ge=1,
        le=64,
        description=(
            "Client processes a level's streams are sharded over, each with its own event "
            "loop (records share one CLOCK_MONOTONIC time base). One process streams about "
            "60,000+ tokens/s on one core (benchmarks/client_capacity.py); raise this when "
            "a server streams faster than that and the machine has spare cores."
        ),
    )
    workload: WorkloadSpec = Field(
        default_factory=WorkloadSpec, description="The request mix and output-length control."
    )
    seed: int = Field(default=0, description="Seed of the synthetic prompts.")
    request_rates: tuple[float, ...] = Field(
        default=(),
        description=(
            "Open-loop levels in requests per second, strictly ascending, each > 0, measured "
            "after the concurrency levels: requests are sent at seeded arrival times computed "
            "up front, however many are still in flight (measurement.md §2). Level name "
            "r<rate> (e.g. r2.0): objectives and limits read them with rate: <rate>."
        ),
    )
    arrival: Arrival = Field(
        default="poisson",
        description="Inter-arrival distribution of rate levels: poisson, or gamma (burstiness).",
    )
    burstiness: float = Field(
        default=1.0,
        description=(
            "Gamma shape of the inter-arrival gaps, as vLLM's bench (--burstiness): 1.0 is "
            "Poisson, < 1 burstier, > 1 more regular (CV = 1/sqrt(burstiness)). Only with "
            "arrival: gamma."
        ),
    )
    rate_duration_s: float = Field(
        default=60.0,
        description=(
            "Nominal length of a rate level: it plans max(min_requests, round(rate x "
            "rate_duration_s)) requests, the last one due at requests/rate seconds."
        ),
    )
    max_in_flight: int = Field(
        default=1024,
        description=(
            "Safety cap on in-flight requests at a rate level. When it binds, requests wait "
            "and the wait is recorded (client_queue_ms, cap_waits): a level that hits it "
            "measured a saturated client queue, not the intended arrival rate."
        ),
    )
    trace: TraceSpec | None = Field(
        default=None, description="Replay the timed dataset (mooncake) at its own timestamps as the open-loop "
        "level trace, after the rate levels ({}: all of it at its pace); objectives read it with level: trace.")
    rate_search: RateSearchSpec = Field(
        default_factory=RateSearchSpec,
        description=(
            "Where and how precisely max_rate@slo is searched (used when an objective or a "
            "limit names max_rate@slo): rate levels like request_rates', chosen by "
            "tuner.load.rate_search."
        ),
    )

    @field_validator("concurrency")
    @classmethod
    def _ascending_levels(cls, levels: tuple[int, ...]) -> tuple[int, ...]:
        for i, c in enumerate(levels):
            if c < 1:
                raise ValueError(f"concurrency level {c} at position {i} must be >= 1")
            if i and c <= levels[i - 1]:
                raise ValueError(
                    f"concurrency levels must be strictly ascending; got {c} after "
                    f"{levels[i - 1]} at position {i}"
                )
        return levels

    @field_validator("request_rates", mode="before")
    @classmethod
    def _valid_rates(cls, rates: object) -> object:
        if not isinstance(rates, (list, tuple)):
            raise ValueError(
                f"request_rates={rates!r} must be a list of requests per second, e.g. [2.0, 8.0]"
            )
        prev: float | None = None
        for i, r in enumerate(rates):
            if isinstance(r, bool) or not isinstance(r, (int, float)):
                raise ValueError(
                    f"request_rates[{i}]={r!r} is not a number; allowed: finite numbers > 0 "
                    "(requests per second)"
                )
            if not math.isfinite(r) or r <= 0:
                raise ValueError(
                    f"request_rates[{i}]={r!r} is not allowed; allowed: finite numbers > 0 "
                    "(requests per second)"
                )
            if prev is not None and r <= prev:
                raise ValueError(
                    f"request_rates must be strictly ascending; got {r} after {prev} at "
                    f"position {i}"
                )
            prev = float(r)
        return rates

    _valid_burstiness = field_rule("burstiness", lambda v: math.isfinite(v) and v > 0,
                                   "a finite number > 0 (gamma shape; 1.0 = Poisson)")
    _valid_rate_duration = field_rule("rate_duration_s", lambda v: math.isfinite(v) and v > 0,
                                      "a finite number of seconds > 0")
    # Two 5-s means at least (the spread is theirs), and no study waits longer than 10 min.
    _valid_host_check = field_rule("host_check_s", lambda v: v == 0 or HOST_CHECK_MIN_S <= v <= HOST_CHECK_MAX_S,
                                   f"0 (no check) or {HOST_CHECK_MIN_S:g} to {HOST_CHECK_MAX_S:g} seconds")
    _valid_cap = field_rule("max_in_flight", lambda v: v >= 1, "an integer >= 1")

    @model_validator(mode="after")
    def _poisson_is_shape_one(self) -> LoadSpec:
        if self.arrival == "poisson" and self.burstiness != 1.0:
            raise ValueError(
                f"burstiness={self.burstiness} with arrival: poisson; Poisson arrivals have "
                "burstiness 1.0, use arrival: gamma for another shape"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _sizing_from_old_files(cls, data: object) -> object:
        # A study file written before load.sizing existed sizes its levels by request count
        # whenever it sets one of those fields: it keeps meaning what it meant.
        if isinstance(data, dict) and "sizing" not in data and any(
                data.get(name) is not None for name in _REQUEST_SIZING):
            return {**data, "sizing": "requests"}
        return data

    @model_validator(mode="after")
    def _sizing_fields(self) -> LoadSpec:
        # A setting that sizes levels by request count would be silently ignored by a level
        # sized by time: name it instead.
        if self.sizing == "steady":
            for name in _REQUEST_SIZING:
                # Compared with the default, not model_fields_set: a spec dumped and
                # validated again (TrialRequest.load) lists every field as set.
                if getattr(self, name) != type(self).model_fields[name].default:
                    raise ValueError(
                        f"load.{name} sizes levels by request count and applies only with "
                        "load.sizing: requests; with sizing: steady (the default) a level "
                        "runs by time (min_window_s, min_requests, max_level_seconds)"
                    )
            if self.client_processes > 1:
                raise ValueError(
                    f"load.client_processes={self.client_processes} needs load.sizing: "
                    "requests; a level sized by time judges its window in one client process"
                )
            if self.min_window_s > self.max_level_seconds:
                raise ValueError(
                    f"load.min_window_s={self.min_window_s} is longer than "
                    f"load.max_level_seconds={self.max_level_seconds}; no window could fit"
                )
        return self

    @model_validator(mode="after")
    def _trace_has_a_dataset(self) -> LoadSpec:
        if self.trace is not None and self.workload.dataset is None:
            raise ValueError("load.trace replays a timed dataset; name one in load.workload.dataset "
                             "(format mooncake), or remove load.trace")
        return self

    @model_validator(mode="after")
    def _enough_requests(self) -> LoadSpec:
        # A level with fewer requests than streams never reaches its nominal concurrency,
        # so its numbers would be reported under the wrong label.
        top = self.concurrency[-1]
        if self.requests_per_level is not None and self.requests_per_level < top:
            raise ValueError(
                f"requests_per_level={self.requests_per_level} is below the highest "
                f"concurrency level {top}; that level would never run {top} requests at once"
            )
        return self

    def requests_for(self, concurrency: int) -> int:
        """Measured requests at one level."""
        if self.requests_per_level is not None:
            return self.requests_per_level
        return max(self.min_requests, self.requests_per_stream * concurrency)

    def requests_for_rate(self, rate: float) -> int:
        """Planned requests at one rate level."""
        return max(self.min_requests, round(rate * self.rate_duration_s))

    def warmup_for(self, concurrency: int) -> int:
        """Warm-up requests before one level.

        The default max(2C, 4) is below measurement.md's max(2C, 32): on the slow hosts this
        tuner also targets, 32 long requests at C=1 would cost more than the level itself,
        and two rounds of C already touch every batch size the level will use.
        """
        if self.warmup_requests is not None:
            return self.warmup_requests
        return max(2 * concurrency, 4)


def rate_level_name(rate: float) -> str:
    """Name of an open-loop level, e.g. ``r2.0`` (records go to ``requests-r2.0.jsonl``)."""
    return f"r{float(rate)}"
