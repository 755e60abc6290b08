"""Ground truth of a study's search space on the simulator, computed without any server.

Every allowed point of the (discrete) space is taken through the same steps a real trial
takes, with each I/O step replaced by the simulator's pure model of it:

1. **Render**: ``tuner.study.space.trial_command`` (the tuner's one renderer) gives argv,
   env and the asked settings the verifier checks, exactly as the orchestrator builds a
   ``TrialRequest``.
2. **Start**: ``tuner.sim.args.parse_argv`` + ``tuner.sim.effective.resolve`` give the
   configuration the simulated vLLM would run. An argv/config error (``ConfigError``) or an
   engine failure (``Effective.failure``) makes the trial *failed* (told FAIL).
3. **Verify**: the simulated server's startup log goes through the worker's own
   verification (``tuner.sim.truth_verify``); a silent downgrade makes the point *not
   applied* -> infeasible.
4. **Probe**: the simulator garbles every answer of a configuration with
   ``Effective.corruption`` (e.g. NCCL_PROTO=LL128 forced over PCIe), so the correctness
   probe fails exactly for those -> infeasible.
5. **Load**: for every level of ``load.concurrency``, ``simulate_closed_loop`` with a
   ``Workload`` calibrated from the study's own requests (``tuner.sim.truth_workload``)
   gives throughput, TPOT and TTFT; objectives and limits are read from these like
   ``tuner.study.scoring.metric_value``. At concurrency 1 requests do not interact, so each
   class is simulated on its own and per-request metrics (TPOT, TTFT) are combined by
   request count: that keeps TPOT@c1 faithful for copy-heavy vs open-ended requests, where
   n-gram speculation differs most.

Trial time (``tuner.sim.truth_time``): startup follows the simulator's startup timeline,
cut at the failing stage; the probe is simulated as short known-answer requests at the
probe's levels; a load level costs its warm-up (``warmup_for(c)`` requests, at the level's
per-request cost) plus the measured run; a fixed stop cost is added. A not-applied point is
known at verification (or while starting: ``Evaluator.startup_verdict``), a probe failure
after the probe.

``tuner.sim.ground_truth`` evaluates a whole space into a table, scores it (``measure``,
with noise for simulated studies) and computes the true front and hypervolume.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from tuner.load.stats import percentile
from tuner.sim.args import ArgvError, parse_argv
from tuner.sim.dry_log import startup_log
from tuner.sim.effective import ConfigError, Effective, resolve
from tuner.sim.events import Failure
from tuner.sim.perf_model import NGRAM_METHODS, LevelEstimate, PerfConfig, Workload, simulate_closed_loop
from tuner.sim.profile import Profile
from tuner.sim.truth_time import TimeModel, compile_fields, startup_s
from tuner.sim.truth_verify import default_render, log_mismatches, sim_start
from tuner.sim.truth_workload import LevelRequest, calibrate_workload, level_requests
from tuner.study import space
from tuner.study.sampling import grid_points
from tuner.study.spec import StudySpec
from tuner.vllm.effective_config import EffectiveConfig, parse_effective_config
from tuner.vllm.failure_signatures import match_fatal_line, trial_reason
from tuner.vllm.knobs import RenderedCommand
from tuner.vllm.verify import startup_mismatches

__all__ = [
    "LevelTruth", "PointTruth", "StartupVerdict", "enumerate_points", "Evaluator", "EVAL_VERSION",
]

# Bump when a change here or in the modules it uses (truth_verify, truth_workload, truth_time)
# alters what evaluate() returns for a point: benchmarks/truth.py keys its cache on it
# (front, reference and hypervolume are recomputed on every load).
# 3: a failed start's reason is the real loop's classification of its error line.
# 4: a lossy point's true accuracy drop (lossy_drop, tuner.sim.lossy), for the quality gate.
EVAL_VERSION = 4     # 2: compile-cache fields (compile_key, compile_s, compile_hit_s, compile_at_s)
# Probe requests are short known-answer questions (tuner.probe.items): a few dozen
# prompt tokens, answers well under the probe's max_tokens; a dozen per level (the retired
# template probe's default count, which this cost model was set against).
PROBE_PROMPT_TOKENS = 48
PROBE_OUTPUT_TOKENS = 12
PROBE_REQUESTS = 12


# ------------------------------------------------------------------------------- records


@dataclass(frozen=True)
class LevelTruth:
    concurrency: int
    metrics: dict[str, float]        # output_tok_s, tpot_ms.mean, ttft_ms.mean, ttft_ms.p90, e2el_ms.mean
    load_s: float                    # warm-up + measured run, simulated seconds


@dataclass(frozen=True)
class PointTruth:
    """What a trial of one point would report, noise-free."""

    values: dict[str, Any]
    status: str                      # "completed" | "failed"
    reason: str | None = None        # failure reason (failed) or None
    message: str | None = None
    applied: bool = True
    mismatches: tuple[str, ...] = ()
    probe_passed: bool = True
    levels: dict[int, LevelTruth] = field(default_factory=dict)
    startup_s: float = 0.0
    probe_s: float = 0.0
    stop_s: float = 0.0
    # torch.compile cache (tuner.sim.cache): the point's compile key (None: nothing is
    # compiled, or the start fails before compiling), the seconds compiling takes on a miss
    # (startup_s assumes a miss), the seconds loading takes on a hit, and when (seconds
    # into the trial) the compiled entry is written, i.e. usable by a later start.
    compile_key: str | None = None
    compile_s: float = 0.0
    compile_hit_s: float = 0.0
    compile_at_s: float = 0.0
    # The configuration's true accuracy drop on known-answer items (tuner.sim.lossy: 0 for a
    # lossless one): what the simulated quality gate (tuner.sim.quality_gate) samples from.
    lossy_drop: float = 0.0

    @property
    def hit_saving_s(self) -> float:
        """How much shorter the start is when the compile cache already holds the key."""

        return max(0.0, self.compile_s - self.compile_hit_s) if self.compile_key else 0.0

    @property
    def key(self) -> str:
        return space.params_key(self.values)

    @property
    def failed(self) -> bool:
        return self.status == "failed"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["levels"] = {str(c): asdict(lv) for c, lv in self.levels.items()}
        data["mismatches"] = list(self.mismatches)
        if not self.lossy_drop:
            # Left out at 0 (every point of a lossless space): the cached tables of such
            # spaces keep their rows, so a restamp, not a rebuild, carries them over.
            del data["lossy_drop"]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PointTruth:
        levels = {int(c): LevelTruth(int(lv["concurrency"]), dict(lv["metrics"]), float(lv["load_s"]))
                  for c, lv in data.get("levels", {}).items()}
        return cls(values=dict(data["values"]), status=data["status"], reason=data.get("reason"),
                   message=data.get("message"), applied=bool(data["applied"]),
                   mismatches=tuple(data.get("mismatches", ())), probe_passed=bool(data["probe_passed"]),
                   levels=levels, startup_s=float(data["startup_s"]), probe_s=float(data["probe_s"]),
                   stop_s=float(data["stop_s"]), compile_key=data.get("compile_key"),
                   compile_s=float(data.get("compile_s", 0.0)),
                   compile_hit_s=float(data.get("compile_hit_s", 0.0)),
                   compile_at_s=float(data.get("compile_at_s", 0.0)),
                   lossy_drop=float(data.get("lossy_drop", 0.0)))


@dataclass(frozen=True)
class StartupVerdict:
    """A knob the simulated server's log shows not applied while it starts: what the log so
    far establishes and the seconds into the trial when it is seen (``Evaluator.startup_verdict``)."""

    seconds: float
    effective: EffectiveConfig


# ------------------------------------------------------------------------------- space


def enumerate_points(spec: StudySpec) -> list[dict[str, Any]]:
    """Every allowed point (active parameters only, forbidden rules applied), file order.

    The grid sampler's own enumeration, so the truth covers exactly the points a study can
    propose."""

    try:
        return grid_points(spec)
    except ValueError as exc:
        raise ValueError("ground truth needs a discrete space: give every float parameter a step") from exc


# ------------------------------------------------------------------------------- evaluator


@dataclass
class Evaluator:
    """Evaluates points of one study; memoises requests, workloads and simulations."""

    spec: StudySpec
    profile: Profile
    render: Callable[[StudySpec, dict[str, Any]], RenderedCommand] = default_render
    time_model: TimeModel = field(default_factory=TimeModel)
    _requests: dict[tuple[int, bool], list[LevelRequest]] = field(default_factory=dict)
    _workloads: dict[tuple[Any, ...], Workload] = field(default_factory=dict)
    _sims: dict[tuple[PerfConfig, Workload, int], LevelEstimate] = field(default_factory=dict)

    # -- workloads -------------------------------------------------------------------
    def requests(self, concurrency: int, ignore_eos: bool) -> list[LevelRequest]:
        key = (concurrency, ignore_eos)
        if key not in self._requests:
            self._requests[key] = level_requests(self.spec.load, concurrency, ignore_eos)
        return self._requests[key]

    def workload(self, concurrency: int, ignore_eos: bool, ngram: tuple[int, int, int] | None,
                 cls: str | None = None) -> Workload:
        key = (concurrency, ignore_eos, ngram, cls)
        if key not in self._workloads:
            reqs = self.requests(concurrency, ignore_eos)
            if cls is not None:
                reqs = [r for r in reqs if r.cls == cls]
                per_stream = len(reqs)        # one stream sends this class's requests
            else:
                per_stream = -(-self.spec.load.requests_for(concurrency) // concurrency)
            self._workloads[key] = calibrate_workload(reqs, per_stream, ngram)
        return self._workloads[key]

    def simulate(self, perf: PerfConfig, workload: Workload, concurrency: int) -> LevelEstimate:
        key = (perf, workload, concurrency)
        if key not in self._sims:
            self._sims[key] = simulate_closed_loop(self.profile, perf, workload, concurrency)
        return self._sims[key]

    # -- one point -------------------------------------------------------------------
    def evaluate(self, values: dict[str, Any]) -> PointTruth:
        spec = self.spec
        tm = self.time_model
        command = self.render(spec, values)
        argv, env, asked = command.argv[len(spec.server.command):], command.launch_env, command.asked
        try:
            eff = resolve(parse_argv(argv), env, self.profile)
        except ArgvError as exc:
            return PointTruth(values, "failed", "invalid_config", exc.text.strip().splitlines()[-1],
                              startup_s=tm.prepare_s + 2.0, stop_s=tm.stop_s)
        except ConfigError as exc:
            return PointTruth(values, "failed", "invalid_config", exc.failure.message.splitlines()[0],
                              startup_s=tm.prepare_s + self.profile.startup.api_init_s / 2, stop_s=tm.stop_s)
        if eff.failure is not None:
            reason = failure_reason(eff.failure)
            # A start failing after torch.compile (KV-cache sizing) has written its entry.
            cc = compile_fields(eff, env, tm) if eff.failure.stage in ("kv", "kv_backend") else {}
            return PointTruth(values, "failed", reason, eff.failure.message.splitlines()[0],
                              startup_s=tm.prepare_s + startup_s(eff, until=eff.failure.stage),
                              stop_s=tm.stop_s, **cc)
        wrong = tuple(log_mismatches(argv, env, asked, self.profile))
        # The probe's verdict is the model's own (a garbling configuration fails, every
        # other passes): the real probe needs a server answering, which the served simulator
        # does in tests/test_probe_sim.py; here no request is sent.
        probe_ok = eff.corruption is None
        ignore_eos = space.trial_ignore_eos(spec, asked)
        ngram = ngram_of(eff)
        levels = {c: self._level(eff.perf, c, ignore_eos, ngram) for c in spec.load.concurrency}
        return PointTruth(values, "completed", None, None, applied=not wrong, mismatches=wrong,
                          probe_passed=probe_ok, levels=levels,
                          startup_s=tm.prepare_s + startup_s(eff), probe_s=self._probe_s(eff.perf),
                          stop_s=tm.stop_s, lossy_drop=eff.lossy_drop, **compile_fields(eff, env, tm))

    def startup_verdict(self, values: dict[str, Any]) -> StartupVerdict | None:
        """What the worker's early stop while starting sees of ``values``: the simulated
        server's log up to where the weights start loading, and when that is (seconds into
        the trial), if that log already proves a knob not applied for good (the worker's
        rule, ``tuner.vllm.verify.startup_mismatches``); None otherwise (a verdict, if any,
        waits for the full log, at verification).

        Cut there because the downgrades vLLM prints once (communicator and attention init)
        come before the weights load and what follows takes minutes: the worker's poll of
        the log (every few seconds) sees them at about that time."""

        start = sim_start(self.spec, values, self.profile, self.render)
        if start is None:
            return None
        lines = startup_log(start.argv, start.env, self.profile).splitlines()
        cut = next(i for i, line in enumerate(lines) if "Loading weights" in line or "Loading model" in line)
        early = parse_effective_config("\n".join(lines[:cut]))
        if not startup_mismatches(start.asked, early):
            return None
        return StartupVerdict(self.time_model.prepare_s + startup_s(start.effective, until="attn"), early)

    def _level(self, perf: PerfConfig, c: int, ignore_eos: bool,
               ngram: tuple[int, int, int] | None) -> LevelTruth:
        load = self.spec.load
        pooled = self.simulate(perf, self.workload(c, ignore_eos, ngram), c)
        metrics = {
            "output_tok_s": pooled.steady_output_tok_s or pooled.output_tok_s,
            "tpot_ms.mean": pooled.mean_tpot_s * 1e3,
            "ttft_ms.mean": pooled.mean_ttft_s * 1e3,
            "e2el_ms.mean": pooled.mean_latency_s * 1e3,
        }
        if c == 1:
            # Sequential requests do not interact: simulate each class alone and combine
            # per-request metrics by count (keeps copy-heavy vs open-ended apart).
            reqs = self.requests(c, ignore_eos)
            counts: dict[str, int] = {}
            for r in reqs:
                counts[r.cls] = counts.get(r.cls, 0) + 1
            per_class = {cls: self.simulate(perf, self.workload(c, ignore_eos, ngram, cls), 1) for cls in counts}
            n = sum(counts.values())
            tokens = sum(per_class[cls].output_tok_s * per_class[cls].duration_s for cls in counts)
            seconds = sum(per_class[cls].duration_s for cls in counts)
            metrics["output_tok_s"] = tokens / seconds
            metrics["tpot_ms.mean"] = sum(per_class[cls].mean_tpot_s * counts[cls] for cls in counts) / n * 1e3
            metrics["ttft_ms.mean"] = sum(per_class[cls].mean_ttft_s * counts[cls] for cls in counts) / n * 1e3
            metrics["e2el_ms.mean"] = sum(per_class[cls].mean_latency_s * counts[cls] for cls in counts) / n * 1e3
            ttfts = sorted(per_class[r.cls].mean_ttft_s * 1e3 for r in reqs)
            metrics["ttft_ms.p90"] = percentile(ttfts, 90)
            metrics["tpot_ms.p90"] = percentile(sorted(per_class[r.cls].mean_tpot_s * 1e3 for r in reqs), 90)
        # Warm-up runs at the level's concurrency, so it costs warmup/requests of the run.
        load_s = pooled.duration_s * (1 + load.warmup_for(c) / max(1, load.requests_for(c)))
        return LevelTruth(c, metrics, load_s)

    def _probe_s(self, perf: PerfConfig) -> float:
        probe = self.spec.probe
        if not probe.concurrency:
            return 0.0
        total = 0.0
        for c in probe.concurrency:
            per_stream = -(-PROBE_REQUESTS // c)
            wl = Workload(prompt_tokens=PROBE_PROMPT_TOKENS, output_tokens=min(PROBE_OUTPUT_TOKENS, probe.max_tokens),
                          requests_per_stream=per_stream)
            total += self.simulate(perf, wl, c).duration_s
        return total


def failure_reason(failure: Failure) -> str:
    """The reason the launcher gives a start failing with ``failure`` (its error line, classified)."""
    lines = f"{failure.exc_type}: {failure.message}".split("\n")
    found = next((sig for line in lines if (sig := match_fatal_line(line)) is not None), None)
    return "server_exited" if found is None else trial_reason(found)


def ngram_of(eff: Effective) -> tuple[int, int, int] | None:
    """(k, prompt_lookup_min, prompt_lookup_max) of a server drafting by n-gram lookup."""

    if eff.spec is not None and eff.spec.method in NGRAM_METHODS:
        return eff.spec.num_spec_tokens, eff.spec.prompt_lookup_min, eff.spec.prompt_lookup_max
    return None
