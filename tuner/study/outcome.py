"""What crosses the boundary between the orchestrator and a worker: one request, one outcome.

Both are plain pydantic data so they travel through Ray as dicts and land on disk as JSON;
the request's plans (load, probe, reference, early stop) are typed models, validated once
where the request is built and once where a worker reads it, never re-parsed by hand.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tuner.load.efficiency import Holding
from tuner.load.load_spec import LoadSpec
from tuner.load.slo import SloSpec
from tuner.probe.quality_stats import QualityRecord
from tuner.probe.record import Reference
from tuner.probe.spec import ProbeSpec
from tuner.study.quality_plan import QualityPlan
from tuner.study.sweep_guard import SweepPlan

__all__ = ["TrialRequest", "TrialOutcome", "PHASES"]

PHASES = ("prepare", "start", "verify", "probe", "load", "stop")


class TrialRequest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    study: str
    run: str = Field(default="", description="the study run this job belongs to (one per `tuner "
                     "run`/`resume`/`confirm` process): with the study and the GPU group, the tag "
                     "of its server's processes, so a run's clean-up never touches another run's")
    number: int
    values: dict[str, Any]
    asked: dict[str, Any] = Field(description="flat target -> value the server is asked for")
    argv: list[str]
    env: dict[str, str] = Field(description="variables the study sets (on top of the worker's)")
    secret_env: list[str] = Field(default_factory=list)
    secrets: dict[str, str] = Field(
        default_factory=dict, description="reference -> value of the study's own secrets (the "
        "worker keeps them, and secret_env values from its environment, out of every file it writes)")
    api_key_ref: str | None = Field(
        default=None, description="reference of the API key the server is started with (its "
        "value is in secrets or the worker's environment): every request carries it; None: "
        "VLLM_API_KEY from the worker's environment if set, as vLLM reads it")
    host: str
    port: int
    served_model_name: str
    trial_dir: str
    startup_timeout_s: float
    stop_timeout_s: float
    gpu_free_timeout_s: float | None = Field(
        default=None, description="how long the worker waits for other processes to leave the "
        "trial's GPUs before failing it gpus_not_free; None: what is left of stop_timeout_s")
    deadline_s: float = Field(description="the whole trial's budget in seconds")
    load: LoadSpec
    probe: ProbeSpec = Field(description="the study's probe section, with the reference's "
                             "known-answer accuracy once there is a reference")
    ignore_eos: bool
    metrics_needed: list[int] = Field(default_factory=list, description="load levels to run")
    early_stop: SweepPlan | None = Field(
        default=None, description="study.sweep_guard.sweep_plan: when the worker may stop the "
        "trial (objectives, limits, the front when it started); None: never")
    kind: Literal["trial", "reference"] = Field(
        default="trial",
        description="'reference': the study's once-per-study reference recording (no load)")
    reference: Reference | None = Field(
        default=None, description="the study's recorded reference every trial's probe is "
        "compared with; None: known answers only")
    slo: SloSpec | None = Field(
        default=None, description="the study's SLO: goodput and the SLO verdict at every "
        "level; None: no SLO")
    search_max_rate: bool = Field(
        default=False, description="search max_rate@slo after the other levels "
        "(load.rate_search; an objective or limit names it)")
    prestart: bool = Field(
        default=False, description="execution.startup.prestart: start the next server's "
        "interpreter while this trial runs (tuner.engine.prestart)")
    searched_env: list[str] = Field(
        default_factory=list, description="the environment variables the study searches (their "
        "values change from trial to trial): a spare interpreter starts without them")
    quality: QualityPlan | None = Field(
        default=None, description="the quality gate (study.quality_plan): the budget, the trial's "
        "lossy values and the reference's answers to pair with; in the reference job, the items "
        "to answer. None: no gate (no quality budget, or a lossless trial)")
    idle_draw: bool = Field(
        default=False, description="measure the idle draw (once per worker) beside the levels' energy: "
        "the study names an energy objective or limit (3.5 s a worker other studies do not spend)")
    holding: Holding | None = Field(
        default=None, description="what the trial's server holds and costs an hour: every level's per-GPU "
        "and per-dollar figures (tuner.load.efficiency); None: a CPU study without a price")


class TrialOutcome(BaseModel):
    model_config = ConfigDict(extra="forbid")

    number: int
    status: Literal["completed", "failed"]
    reason: str | None = None
    message: str | None = None
    phase: str | None = None
    log_excerpt: str | None = None
    host: str | None = None
    started_unix: float | None = None
    finished_unix: float | None = None
    detected_unix: float | None = Field(
        default=None, description="when the worker detected the failure (wall clock)")
    startup_s: float | None = Field(
        default=None, description="seconds the server took to start, its interpreter's imports "
        "included (also when a spare did them ahead, execution.startup.prestart)")
    start_wait_s: float | None = Field(
        default=None, description="seconds the trial itself waited for its server: startup_s less "
        "the imports a spare did ahead; None: no spare, the wait was startup_s")
    prestart: dict[str, Any] | None = Field(
        default=None, description="tuner.engine.prestart: whether a spare interpreter became this "
        "trial's server (import seconds saved) or why not; None: prestart off")
    probe_s: float | None = None
    load_s: float | None = None
    trial_s: float | None = None
    levels: dict[str, dict[str, float | None]] = Field(
        default_factory=dict, description="concurrency (as text) -> flat metrics"
    )
    rate_levels: dict[str, dict[str, float | None]] = Field(
        default_factory=dict, description="open-loop level name (r2.0, trace) -> flat metrics: "
        "load.request_rates, the trace level (load.trace) and the max_rate@slo search's levels")
    max_rate: dict[str, Any] | None = Field(
        default=None, description="load.rate_search.MaxRateResult of the max_rate@slo search "
        "(answer, status, bracket, every probed rate); None: not searched")
    server_side: dict[str, dict[str, Any]] = Field(default_factory=dict)
    load_failures: dict[str, str] = Field(
        default_factory=dict, description="level key as in levels / rate_levels -> its failed "
        "measured requests in one line (load.results.failure_text); a level whose objective has "
        "no value because of them fails the trial load_errors")
    applied: bool | None = None
    mismatches: list[dict[str, Any]] = Field(default_factory=list)
    parallel: dict[str, Any] | None = Field(
        default=None, description="vllm.verify.parallel_summary: world size, the ranks' lines, the "
        "TP all-reduce that ran, the asked knobs not applicable on this server; None: not verified")
    probe_passed: bool | None = None
    probe_reason: str | None = None
    probe_coverage: str | None = Field(
        default=None, description="What the probe covered (prompt-length buckets, decode "
        "batch sizes, strata, compared positions), one line: probe.shapes.Coverage.short")
    probe_agreement: str | None = Field(
        default=None, description="How far the answers moved from the reference's (identical "
        "answers, near-tie divergences, corrupt positions), one line: probe.agreement")
    stop: dict[str, Any] = Field(default_factory=dict)
    early_stop: dict[str, Any] | None = Field(
        default=None, description="study.sweep_guard.SweepGuard.record: why and after which "
        "step the trial stopped before its full sweep; None: it ran everything")
    compile: dict[str, Any] | None = Field(
        default=None, description="vllm.compile_cache.CompileRecord from the server log "
        "(torch.compile cache hit/miss, compile and capture seconds); None: unknown")
    startup: dict[str, Any] | None = Field(
        default=None, description="vllm.startup.StartupRecord from the server log: startup "
        "time by phase, KV-cache size, graph capture; None: no server was started")
    signature: dict[str, str] | None = Field(
        default=None, description="the fatal log line a failed start was classified by "
        "(vllm.failure_signatures.FatalSignature: reason, summary, line)")
    gpu_wait_s: float | None = Field(
        default=None, description="seconds the trial waited for its GPUs to be free of other "
        "processes before starting the server")
    noise_floor: float | None = Field(
        default=None, description="the between-start CV the level intervals carry (the study's "
        "override or its measured noise when the trial started, tuner.study.between_starts); readers "
        "replace it with the study's current one. None: an outcome from before it was recorded")
    quality: QualityRecord | None = Field(
        default=None, description="the quality gate's verdict on a lossy trial (probe.quality_stats: "
        "paired accuracy drop, its interval, pass or fail); None: no gate ran (lossless, no "
        "budget, or the corruption rule failed it first)")
    energy: dict[str, Any] | None = Field(
        default=None, description="the trial's energy counter (engine.trial_energy): {source, idle_w, "
        "idle_ci95, idle_s} where one could be read (idle: the worker's first trial, once), "
        "{unavailable: reason} where none; None: no load measured")
    warnings: list[str] = Field(default_factory=list)
