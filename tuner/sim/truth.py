"""Ground truth of a study's search space on the simulator, computed without any server.

Every allowed point of the (discrete) space is taken through the same steps a real trial
takes, with each I/O step replaced by the simulator's pure model of it:

1. **Render**: ``tuner.study.space.trial_command`` (the tuner's one renderer) gives argv,
   env and the asked settings the verifier checks, exactly as the orchestrator builds a
   ``TrialRequest``.
2. **Start**: ``tuner.sim.args.parse_argv`` + ``tuner.sim.effective.resolve`` give the
   configuration the simulated vLLM would run. An argv/config error (``ConfigError``) or an
   engine failure (``Effective.failure``) makes the trial *failed* (told FAIL).
3. **Verify**: each asked target is compared with the value the simulated server really
   applies, the way ``tuner.vllm.verify`` reads it back from the log (see ``_got``).
   A silent downgrade (custom all-reduce off on PCIe, FULL -> FULL_AND_PIECEWISE on an
   UNIFORM_BATCH attention backend, ...) makes the point *not applied* -> infeasible.
   ``benchmarks/search_efficiency.py --check-verdicts`` replays every point through the
   real log path (simulated startup log -> ``parse_effective_config`` -> ``verify``) and
   tests/test_search_truth.py does so for a sample, so this mapping cannot drift silently.
4. **Probe**: the simulator garbles every answer of a configuration with
   ``Effective.corruption`` (e.g. NCCL_PROTO=LL128 forced over PCIe), so the correctness
   probe fails exactly for those -> infeasible.
5. **Load**: for every level of ``load.concurrency``, ``simulate_closed_loop`` with a
   ``Workload`` calibrated from the study's own requests (below) gives throughput, TPOT and
   TTFT; objectives and limits are read from these like ``tuner.study.scoring.metric_value``.

Workload calibration (why: ``simulate_closed_loop`` takes one prompt length, one output
length and n-gram hit/acceptance rates, while the load generator sends a mix of classes):
the requests each level really sends are rebuilt (``draft_requests`` + ``fit_draft`` with
the simulator's tokenizer, as ``/tokenize`` fitting does), each one's output is planned by
the simulator's model (``plan_output``: ``ignore_eos`` pads to ``max_tokens``; natural
stopping, used for speculative trials when ``ignore_eos: auto``, ends at the model's EOS),
and n-gram drafting is replayed over the real tokens with ``NgramIndex`` for the trial's
(k, prompt_lookup_min, prompt_lookup_max). A level's workload gets the mean prompt and
output length (output spread -> ``output_jitter``), the share of decode steps that found a
draft (``ngram_hit_rate``) and the per-position acceptance that reproduces the replayed
mean accepted tokens per draft (``ngram_accept_prob``). At concurrency 1 requests do not
interact, so each class is simulated on its own and per-request metrics (TPOT, TTFT) are
combined by request count: that keeps TPOT@c1 faithful for copy-heavy vs open-ended
requests, where n-gram speculation differs most.

Trial time model (for the early-stop savings): startup follows the simulator's startup
timeline (``Sim.startup``: API init, engine init, weight load, compile, profile run, KV
init, graph capture per size, server start), cut at the failing stage for failures; the
probe is simulated as short known-answer requests at the probe's levels; a load level costs
its warm-up (``warmup_for(c)`` requests, at the level's per-request cost) plus the measured
run; a fixed stop cost is added. A not-applied point is known at verification, a probe
failure after the probe. ``startup_s`` is a torch.compile cache miss; ``compile_key``,
``compile_s``, ``compile_hit_s`` and ``compile_at_s`` let a simulated study
(``tuner.sim.study``, ``compile_cache=True``) shorten a start whose key an earlier trial
compiled (``hit_saving_s``: Sim.startup's hit loads in ``StartupSpec.compile_hit_parts``).

Noise (``measure``): multiplicative lognormal per trial, level and metric, seeded, so a
simulated study can see the spread real measurements have.

Hypervolume: 2 objectives; values are turned into "smaller is better" and measured against
a reference point: the true front's nadir (its worst value of each objective) pushed out by
``REF_MARGIN`` (50 %) of the front's range in each objective. Why: the baseline as reference
gives no credit to trade-off points that beat it in one objective only (NCCL LL + MTP has
the best TPOT but less throughput than the baseline); the worst feasible point (eager mode)
makes almost any decent configuration score > 90 %; and a thin 10 % margin makes 95 %
depend on front points 1 % apart - less than measurement noise - instead of on finding
both ends of the front. With 50 %, 95 % on glm5-8xpcie needs the best-throughput region
and the best-TPOT point. The strict variant (``STRICT_REF_MARGIN``, 10 %) is reported too.
"""

from __future__ import annotations

import json
import math
import random
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from tuner.study import space
from tuner.study.space import trial_command
from tuner.study.outcome import TrialOutcome
from tuner.load.load_spec import LoadSpec
from tuner.study.pareto import Point, pareto_front
from tuner.vllm.knobs import RenderedCommand
from tuner.study.sampling import grid_points
from tuner.study.spec import StudySpec
from tuner.load.workload import draft_requests, fit_draft, level_stream
from tuner.sim.args import ArgvError, parse_argv
from tuner.sim.cache import compile_hash
from tuner.sim.effective import ConfigError, Effective, resolve
from tuner.sim.model import TOKENIZER, NgramIndex, chat_prompt, count_accepted, plan_output
from tuner.sim.perf_model import NGRAM_METHODS, LevelEstimate, PerfConfig, Workload, simulate_closed_loop
from tuner.sim.profile import Profile
from tuner.study.scoring import constraints as scoring_constraints
from tuner.study.scoring import level_for, metric_value

__all__ = [
    "LevelTruth", "PointTruth", "GroundTruth", "TimeModel", "Measured", "enumerate_points",
    "build_ground_truth", "evaluate_point", "hypervolume", "reference_point", "measure",
    "Evaluator", "REF_MARGIN", "STRICT_REF_MARGIN", "EVAL_VERSION",
]

# Bump when a change here alters what evaluate() returns for a point: benchmarks/truth.py
# keys its cache on it (front, reference and hypervolume are recomputed on every load).
EVAL_VERSION = 2     # 2: compile-cache fields (compile_key, compile_s, compile_hit_s, compile_at_s)
REF_MARGIN = 0.5
STRICT_REF_MARGIN = 0.1
# Probe requests are short known-answer questions (tuner.probe.items): a few dozen
# prompt tokens, answers well under the probe's max_tokens.
PROBE_PROMPT_TOKENS = 48
PROBE_OUTPUT_TOKENS = 12


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
                   compile_at_s=float(data.get("compile_at_s", 0.0)))


@dataclass(frozen=True)
class TimeModel:
    """Constant parts of a trial's wall time that the simulator does not model."""

    stop_s: float = 10.0             # SIGTERM -> process group gone, GPUs checked free
    prepare_s: float = 5.0           # GPU check, trial folder, launcher start


# ------------------------------------------------------------------------------- space


def enumerate_points(spec: StudySpec) -> list[dict[str, Any]]:
    """Every allowed point (active parameters only, forbidden rules applied), file order.

    The grid sampler's own enumeration, so the truth covers exactly the points a study can
    propose."""

    try:
        return grid_points(spec)
    except ValueError as exc:
        raise ValueError("ground truth needs a discrete space: give every float parameter a step") from exc


def default_render(spec: StudySpec, values: dict[str, Any]) -> RenderedCommand:
    """The trials' own renderer."""

    return trial_command(spec, values, python="python")


@dataclass(frozen=True)
class SimStart:
    """One point as the simulator would start it: the server's own arguments (the command
    left out), its environment, what the trial asked, and what the simulator applies."""

    argv: list[str]
    env: dict[str, str]
    asked: dict[str, Any]
    effective: Effective


def sim_start(spec: StudySpec, values: dict[str, Any], profile: Profile) -> SimStart | None:
    """The simulator's start of ``values``, or None when that server would not start (a
    configuration error or a startup failure: nothing to verify)."""

    command = default_render(spec, values)
    argv, env, asked = command.argv[len(spec.server.command):], command.launch_env, command.asked
    try:
        eff = resolve(parse_argv(argv), env, profile)
    except (ConfigError, ArgvError):
        return None
    if eff.failure is not None:
        return None
    return SimStart(argv, env, asked, eff)


# ------------------------------------------------------------------------------- verify


def _norm(value: Any) -> Any:
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, str):
        text = value.strip()
        if text.lower() in ("true", "false"):
            return text.lower() == "true"
        try:
            return int(text)
        except ValueError:
            try:
                return float(text)
            except ValueError:
                return text.upper()
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


_UNVERIFIED = object()


def _got(target: str, asked: Any, eff: Effective) -> Any:
    """The value the log would show for ``target`` (``_UNVERIFIED``: the verifier cannot tell
    or reads it off vLLM's echo of the argument, which always matches what was asked)."""

    spec = eff.spec
    if target == "enforce_eager":
        return eff.enforce_eager
    if target == "compilation_config.cudagraph_mode":
        mode = eff.cudagraph_mode
        # Graphs asked but none captured: vLLM logs "Skipping CUDA graph capture".
        if mode != "NONE" and not eff.capture_sizes and eff.profile.hardware.platform == "cuda":
            return "NONE(skipped)"
        return mode
    if target == "compilation_config.mode":
        return eff.compile_mode
    if target in ("compilation_config.max_cudagraph_capture_size", "max_cudagraph_capture_size"):
        return eff.max_capture_size
    if target in ("compilation_config.cudagraph_capture_sizes", "cudagraph_capture_sizes"):
        return sorted(eff.capture_sizes_config)
    if target == "disable_custom_all_reduce":
        return "CUSTOM" not in eff.allreduce_backends if eff.tp > 1 else _UNVERIFIED
    if target == "speculative_config.method":
        return spec.method if spec else None
    if target == "speculative_config.num_speculative_tokens":
        return spec.num_spec_tokens if spec else None
    if target == "speculative_config.prompt_lookup_min":
        return spec.prompt_lookup_min if spec else None
    if target == "speculative_config.prompt_lookup_max":
        return spec.prompt_lookup_max if spec else None
    if target == "tensor_parallel_size":
        return eff.tp
    if target == "pipeline_parallel_size":
        return eff.pp
    if target == "async_scheduling":
        return eff.async_scheduling
    backend = {"env:VLLM_ALLREDUCE_USE_FLASHINFER": "FLASHINFER",
               "env:VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC": "FLASHINFER_PCIE_IPC",
               "env:VLLM_ALLREDUCE_USE_SYMM_MEM": "SYMM_MEM",
               "env:VLLM_USE_NCCL_SYMM_MEM": "NCCL_SYMM_MEM"}.get(target)
    if backend is not None:
        if eff.tp == 1 or eff.profile.hardware.platform != "cuda":
            return _UNVERIFIED
        return "1" if backend in eff.allreduce_backends else "0"
    if target.startswith("env:NCCL_"):
        # NCCL reports variables it read ("set by environment") when it runs the TP group
        # with NCCL_DEBUG=INFO; the simulator echoes them unchanged.
        name = target[4:]
        if "PYNCCL" not in eff.allreduce_backends or (eff.nccl.debug or "").upper() not in ("INFO", "TRACE"):
            return _UNVERIFIED
        if name == "NCCL_PROTO":
            return eff.nccl.proto_env
        if name == "NCCL_ALGO":
            return eff.nccl.algo_env
        return _UNVERIFIED
    return _UNVERIFIED


def mismatches(asked: Mapping[str, Any], eff: Effective) -> list[str]:
    """Asked targets the simulated server does not apply (what verify() calls not_applied)."""

    out = []
    for target, value in asked.items():
        got = _got(target, value, eff)
        if got is _UNVERIFIED:
            continue
        if target == "speculative_config.method" and isinstance(value, str) and value.lower() in ("none", ""):
            value = None
        want = _norm(value)
        have = _norm(got)
        if isinstance(want, str) and isinstance(have, str):
            same = want.replace(" ", "") == have.replace(" ", "")
        else:
            same = want == have
        if not same:
            out.append(target)
    return out


# ------------------------------------------------------------------------------- workloads


@dataclass(frozen=True)
class _Request:
    cls: str
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]


def _level_requests(load: LoadSpec, concurrency: int, ignore_eos: bool) -> list[_Request]:
    """The measured requests of one level, as the load generator builds and the sim answers them."""

    chat = load.api == "chat"

    def encode(text: str) -> list[int]:
        if chat:
            text = chat_prompt([{"role": "user", "content": text}])
        return TOKENIZER.encode(text)

    out = []
    drafts = draft_requests(load.workload, load.requests_for(concurrency), seed=load.seed,
                            stream=level_stream("measure", concurrency))
    for d in drafts:
        if load.fit_prompt_tokens:
            prompt = fit_draft(d.draft, d.target_prompt_tokens, lambda t: len(encode(t)))
        else:
            prompt = d.to_plan(ignore_eos=ignore_eos).prompt
        text = chat_prompt([{"role": "user", "content": prompt}]) if chat else prompt
        ids = TOKENIZER.encode(text)
        plan = plan_output(text, ids, max_tokens=d.workload_class.output_tokens, ignore_eos=ignore_eos,
                           temperature=0.0)
        out.append(_Request(d.workload_class.name, tuple(ids), tuple(plan.ids)))
    return out


@dataclass(frozen=True)
class _NgramStats:
    steps: int
    hit_steps: int
    accepted: int


def _replay_ngram(req: _Request, k: int, lo: int, hi: int) -> _NgramStats:
    """Decode one request as the simulator's engine drafts with prompt lookup."""

    ids = req.output_ids
    total = len(ids)
    index = NgramIndex(req.prompt_ids, lo, hi)
    emitted = min(1, total)                 # prefill emits the first token, undrafted
    index.extend(ids[:emitted])
    steps = hits = accepted = 0
    while emitted < total:
        draft = index.propose(k)
        drafts = max(0, min(len(draft), total - emitted - 1))
        acc = count_accepted(draft[:drafts], ids[emitted:emitted + drafts + 1])
        steps += 1
        if drafts:
            hits += 1
            accepted += acc
        n = min(acc + 1, total - emitted)
        index.extend(ids[emitted:emitted + n])
        emitted += n
    return _NgramStats(steps, hits, accepted)


def _accept_prob(mean_accepted: float, k: int) -> float:
    """p with sum_{i=1..k} p^i == mean_accepted (geometric acceptance, as the model draws)."""

    if mean_accepted <= 0:
        return 0.0
    if mean_accepted >= k:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(mid ** i for i in range(1, k + 1)) < mean_accepted:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _workload(reqs: Sequence[_Request], per_stream: int, ngram: tuple[int, int, int] | None) -> Workload:
    prompts = [len(r.prompt_ids) for r in reqs]
    outputs = [len(r.output_ids) for r in reqs]
    mean_out = statistics.fmean(outputs)
    spread = statistics.pstdev(outputs) if len(outputs) > 1 else 0.0
    # A uniform draw on mean*(1 +- j) has standard deviation mean*j/sqrt(3).
    jitter = min(0.95, math.sqrt(3) * spread / mean_out) if mean_out else 0.0
    hit = acc_p = 0.0
    if ngram is not None:
        k, lo, hi = ngram
        stats = [_replay_ngram(r, k, lo, hi) for r in reqs]
        steps = sum(s.steps for s in stats)
        hits = sum(s.hit_steps for s in stats)
        hit = hits / steps if steps else 0.0
        acc_p = _accept_prob(sum(s.accepted for s in stats) / hits, k) if hits else 0.0
    return Workload(prompt_tokens=max(1, round(statistics.fmean(prompts))),
                    output_tokens=max(1, round(mean_out)), requests_per_stream=per_stream,
                    ngram_hit_rate=hit, ngram_accept_prob=acc_p, output_jitter=round(jitter, 4))


# ------------------------------------------------------------------------------- evaluator


@dataclass
class Evaluator:
    """Evaluates points of one study; memoises requests, workloads and simulations."""

    spec: StudySpec
    profile: Profile
    render: Callable[[StudySpec, dict[str, Any]], RenderedCommand] = default_render
    time_model: TimeModel = field(default_factory=TimeModel)
    _requests: dict[tuple[int, bool], list[_Request]] = field(default_factory=dict)
    _workloads: dict[tuple[Any, ...], Workload] = field(default_factory=dict)
    _sims: dict[tuple[PerfConfig, Workload, int], LevelEstimate] = field(default_factory=dict)

    # -- workloads -------------------------------------------------------------------
    def requests(self, concurrency: int, ignore_eos: bool) -> list[_Request]:
        key = (concurrency, ignore_eos)
        if key not in self._requests:
            self._requests[key] = _level_requests(self.spec.load, concurrency, ignore_eos)
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
            self._workloads[key] = _workload(reqs, per_stream, ngram)
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
            reason = {"kv": "gpu_memory_insufficient", "load": "gpu_memory_insufficient",
                      "comm": "nccl_error"}.get(eff.failure.stage, "server_exited")
            # A start failing after torch.compile (KV-cache sizing) has written its entry.
            cc = _compile_fields(eff, env, tm) if eff.failure.stage == "kv" else {}
            return PointTruth(values, "failed", reason, eff.failure.message.splitlines()[0],
                              startup_s=tm.prepare_s + _startup_s(eff, until=eff.failure.stage),
                              stop_s=tm.stop_s, **cc)
        wrong = tuple(mismatches(asked, eff))
        probe_ok = eff.corruption is None
        ignore_eos = spec.load.workload.ignore_eos
        if ignore_eos == "auto":
            ignore_eos = asked.get("speculative_config.method") is None
        ngram = None
        if eff.spec is not None and eff.spec.method in NGRAM_METHODS:
            ngram = (eff.spec.num_spec_tokens, eff.spec.prompt_lookup_min, eff.spec.prompt_lookup_max)
        levels = {c: self._level(eff.perf, c, bool(ignore_eos), ngram) for c in spec.load.concurrency}
        return PointTruth(values, "completed", None, None, applied=not wrong, mismatches=wrong,
                          probe_passed=probe_ok, levels=levels,
                          startup_s=tm.prepare_s + _startup_s(eff), probe_s=self._probe_s(eff.perf),
                          stop_s=tm.stop_s, **_compile_fields(eff, env, tm))

    def verdict_s(self, values: dict[str, Any]) -> float | None:
        """Seconds into startup when the log already shows a knob not applied (None if every
        knob is applied or the start fails). See ``_STAGE_OF`` for where each verdict comes from."""

        spec = self.spec
        command = self.render(spec, values)
        asked = command.asked
        try:
            eff = resolve(parse_argv(command.argv[len(spec.server.command):]), command.launch_env,
                          self.profile)
        except (ArgvError, ConfigError):
            return None
        if eff.failure is not None:
            return None
        wrong = mismatches(asked, eff)
        if not wrong:
            return None
        return self.time_model.prepare_s + min(_verdict_stage_s(eff, target) for target in wrong)

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
            metrics["ttft_ms.p90"] = _percentile(ttfts, 90)
            metrics["tpot_ms.p90"] = _percentile(sorted(per_class[r.cls].mean_tpot_s * 1e3 for r in reqs), 90)
        # Warm-up runs at the level's concurrency, so it costs warmup/requests of the run.
        load_s = pooled.duration_s * (1 + load.warmup_for(c) / max(1, load.requests_for(c)))
        return LevelTruth(c, metrics, load_s)

    def _probe_s(self, perf: PerfConfig) -> float:
        probe = self.spec.probe
        if not probe.concurrency:
            return 0.0
        total = 0.0
        for c in probe.concurrency:
            per_stream = -(-probe.items // c)
            wl = Workload(prompt_tokens=PROBE_PROMPT_TOKENS, output_tokens=min(PROBE_OUTPUT_TOKENS, probe.max_tokens),
                          requests_per_stream=per_stream)
            total += self.simulate(perf, wl, c).duration_s
        return total


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""

    if not sorted_values:
        return math.nan
    pos = (len(sorted_values) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


_STAGES = ("init", "comm", "attn", "load", "kv")

# Where in Sim.startup's log (= vLLM's order) a not-applied target can be stopped on while
# the server starts: exactly the verdicts tuner.vllm.verify.startup_mismatches accepts
# from a partial log - the custom all-reduce outcome at communicator init ("comm") and the
# attention backend's CUDA-graph downgrade right after ("attn"), both before the weights
# load. Every other verdict waits for the full log (end of startup), as in the worker.
_STAGE_OF = {
    "disable_custom_all_reduce": "comm",
    "compilation_config.cudagraph_mode": "attn",
}


def _verdict_stage_s(eff: Effective, target: str) -> float:
    st = eff.profile.startup
    stage = _STAGE_OF.get(target)
    if target == "compilation_config.cudagraph_mode" and eff.cudagraph_mode != "NONE" and not eff.capture_sizes:
        stage = None          # "capture skipped": only known at the end of startup
    return {"comm": st.api_init_s + st.engine_init_s,
            "attn": st.api_init_s + st.engine_init_s}.get(stage or "", _startup_s(eff))


def _compile_fields(eff: Effective, env: Mapping[str, str], tm: TimeModel) -> dict[str, Any]:
    """PointTruth's compile-cache fields for a start that gets through torch.compile: the
    simulator's own key (tuner.sim.cache.compile_hash) and its miss/hit timeline."""

    if eff.compile_mode == 0:
        return {}
    st = eff.profile.startup
    dynamo, load = st.compile_hit_parts
    compile_s = st.dynamo_s + st.inductor_s
    at = tm.prepare_s + st.api_init_s + st.engine_init_s + st.weight_load_s + compile_s
    return {"compile_key": compile_hash(eff, env)[:16], "compile_s": compile_s,
            "compile_hit_s": dynamo + load, "compile_at_s": at}


def _startup_s(eff: Effective, until: str | None = None) -> float:
    """Simulated seconds of Sim.startup, or until the stage where it fails."""

    st = eff.profile.startup
    t = st.api_init_s + st.engine_init_s
    if until in ("init", "comm", "attn"):
        return t
    t += st.weight_load_s
    if until == "load":
        return t
    if eff.compile_mode != 0:
        t += st.dynamo_s + st.inductor_s
    t += st.profile_run_s
    if until == "kv":
        return t
    t += st.kv_init_s
    if eff.capture_sizes:
        per = {"FULL_AND_PIECEWISE": st.capture_piecewise_s_per_size + st.capture_full_s_per_size,
               "PIECEWISE": st.capture_piecewise_s_per_size}.get(eff.cudagraph_mode, st.capture_full_s_per_size)
        t += per * len(eff.capture_sizes)
    return t + st.server_start_s


def evaluate_point(spec: StudySpec, profile: Profile, values: dict[str, Any]) -> PointTruth:
    return Evaluator(spec, profile).evaluate(values)


# ------------------------------------------------------------------------------- scoring


def level_of(spec: StudySpec, concurrency: int | str) -> int:
    """The load level ``concurrency`` names (tuner.study.scoring's rule)."""

    return level_for(spec, concurrency)


def _outcome(truth: PointTruth, levels: Mapping[int, Mapping[str, float]]) -> TrialOutcome:
    """The outcome a worker would report for this point: what tuner.study.scoring reads."""

    return TrialOutcome(number=0, status="completed", applied=truth.applied,
                        mismatches=[{"target": t} for t in truth.mismatches],
                        probe_passed=truth.probe_passed,
                        levels={str(c): dict(m) for c, m in levels.items()})


def metric_of(spec: StudySpec, levels: Mapping[int, Mapping[str, float]], item: Any) -> float | None:
    level = levels.get(level_of(spec, item.concurrency))
    if level is None:
        return None
    return level.get(item.metric)


@dataclass(frozen=True)
class Measured:
    """One (possibly noisy) measurement of a point: what the tuner would be told."""

    objectives: tuple[float, ...] | None       # None: failed trial
    constraints: dict[str, float]
    levels: dict[int, dict[str, float]]

    @property
    def feasible(self) -> bool:
        return self.objectives is not None and all(v <= 0 for v in self.constraints.values())


def measure(spec: StudySpec, truth: PointTruth, *, noise: float = 0.0,
            rng: random.Random | None = None) -> Measured:
    """The outcome a trial reports: level metrics with multiplicative lognormal noise
    (sigma ``noise``), objectives and constraints as tuner.study.scoring computes them."""

    if truth.failed:
        return Measured(None, {}, {})
    levels: dict[int, dict[str, float]] = {}
    for c, lv in truth.levels.items():
        if noise > 0:
            assert rng is not None, "noise needs an rng"
            levels[c] = {k: v * math.exp(rng.gauss(0.0, noise)) for k, v in lv.metrics.items()}
        else:
            levels[c] = dict(lv.metrics)
    # Objectives and constraints exactly as the orchestrator computes them (tuner.study.scoring).
    outcome = _outcome(truth, levels)
    objectives = []
    for o in spec.objectives:
        value = metric_value(spec, outcome, o)
        if value is None:
            raise ValueError(f"ground truth has no {o.metric} at concurrency {o.concurrency}")
        objectives.append(value)
    constraints = scoring_constraints(spec, outcome)
    return Measured(tuple(objectives), constraints, levels)


# ------------------------------------------------------------------------------- hypervolume


def _signed(values: Sequence[float], directions: Sequence[str]) -> tuple[float, ...]:
    return tuple(-v if d == "maximize" else v for v, d in zip(values, directions, strict=True))


def reference_point(front: Sequence[Sequence[float]], directions: Sequence[str],
                    margin: float = REF_MARGIN) -> tuple[float, ...]:
    """Nadir of ``front`` pushed out by ``margin`` of its range (in objective units)."""

    if not front:
        raise ValueError("an empty front has no reference point")
    signed = [_signed(v, directions) for v in front]
    ref = []
    for col in zip(*signed):
        lo, hi = min(col), max(col)
        span = hi - lo if hi > lo else abs(hi) or 1.0
        ref.append(hi + margin * span)
    # back to objective units
    return tuple(-r if d == "maximize" else r for r, d in zip(ref, directions))


def hypervolume(points: Iterable[Sequence[float]], directions: Sequence[str],
                reference: Sequence[float]) -> float:
    """Area dominated by ``points`` and bounded by ``reference`` (2 objectives)."""

    if len(directions) != 2:
        raise ValueError("hypervolume is implemented for 2 objectives")
    ref = _signed(reference, directions)
    pts = sorted({_signed(p, directions) for p in points if all(s < r for s, r in zip(_signed(p, directions), ref))})
    area = 0.0
    best_y = ref[1]
    for x, y in pts:            # ascending first objective; keep only improving second
        if y < best_y:
            area += (ref[0] - x) * (best_y - y)
            best_y = y
    return area


# ------------------------------------------------------------------------------- table


@dataclass
class GroundTruth:
    spec_name: str
    labels: list[str]
    directions: list[str]
    points: list[PointTruth]
    front: list[int] = field(default_factory=list)           # indices into points
    reference: tuple[float, ...] = ()
    hypervolume: float = 0.0
    strict_reference: tuple[float, ...] = ()
    strict_hypervolume: float = 0.0

    def __post_init__(self) -> None:
        self._by_key = {p.key: i for i, p in enumerate(self.points)}

    def index(self, values: Mapping[str, Any]) -> int:
        return self._by_key[space.params_key(values)]

    def get(self, values: Mapping[str, Any]) -> PointTruth:
        return self.points[self.index(values)]

    def front_keys(self) -> set[str]:
        return {self.points[i].key for i in self.front}

    def hv_of(self, objective_rows: Iterable[Sequence[float]], *, strict: bool = False) -> float:
        return hypervolume(objective_rows, self.directions, self.strict_reference if strict else self.reference)

    @classmethod
    def build(cls, spec: StudySpec, points: list[PointTruth]) -> GroundTruth:
        labels = [o.label for o in spec.objectives]
        directions = [o.direction for o in spec.objectives]
        table = cls(spec.name, labels, directions, points)
        pts = []
        for i, p in enumerate(points):
            m = measure(spec, p)
            if m.objectives is not None:
                pts.append(Point(i, m.objectives, m.feasible))
        front = pareto_front(pts, directions)
        table.front = [p.number for p in front]
        if front:
            values = [p.values for p in front]
            table.reference = reference_point(values, directions)
            table.hypervolume = hypervolume(values, directions, table.reference)
            table.strict_reference = reference_point(values, directions, STRICT_REF_MARGIN)
            table.strict_hypervolume = hypervolume(values, directions, table.strict_reference)
        return table

    def to_json(self) -> dict[str, Any]:
        return {"spec": self.spec_name, "labels": self.labels, "directions": self.directions,
                "front": self.front, "reference": list(self.reference), "hypervolume": self.hypervolume,
                "strict_reference": list(self.strict_reference), "strict_hypervolume": self.strict_hypervolume,
                "points": [p.to_json() for p in self.points]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GroundTruth:
        return cls(data["spec"], list(data["labels"]), list(data["directions"]),
                   [PointTruth.from_json(p) for p in data["points"]], list(data["front"]),
                   tuple(data["reference"]), float(data["hypervolume"]),
                   tuple(data.get("strict_reference", ())), float(data.get("strict_hypervolume", 0.0)))


def build_ground_truth(spec: StudySpec, profile: Profile, *,
                       points: list[dict[str, Any]] | None = None,
                       progress: Callable[[int, int], None] | None = None,
                       evaluator: Evaluator | None = None) -> GroundTruth:
    ev = evaluator or Evaluator(spec, profile)
    pts = enumerate_points(spec) if points is None else points
    out = []
    for i, values in enumerate(pts):
        out.append(ev.evaluate(values))
        if progress is not None:
            progress(i + 1, len(pts))
    return GroundTruth.build(spec, out)


def dumps(truth: GroundTruth) -> str:
    return json.dumps(truth.to_json(), separators=(",", ":"))
