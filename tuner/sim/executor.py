"""An in-process executor: trials answered by the simulator's performance model, on
simulated time (``tuner.engine.execution.Executor``).

No server, no Ray, no files, no waiting: ``submit`` looks the point up (``lookup``: a
``GroundTruth`` table, or ``Evaluator.evaluate`` for a point at a time), plays the trial's
timeline - start, verification, probe, each load level - with measurement noise and the
early stop a worker would apply with the plan in the request, and ``poll`` returns the
trial that finishes first, moving the clock (``now``) to its end. So ``tuner.engine.orchestrator.
StudyLoop`` runs exactly as on a cluster: parallel groups finish out of order, and
constant-liar TPE sees the same pending trials.

Timeline of a trial (``PointTruth``'s time model): startup (cut at the failing stage, or
at the verdict for a knob the log shows not applied while starting), the probe, each load
level (warm-up included), a stop. With ``compile_cache`` the servers share vLLM's
torch.compile cache, as on a real node: a trial whose compile key a trial compiled before
it started loads instead of compiling, and starts ``PointTruth.hit_saving_s`` sooner.
A lossy trial of a study with ``quality:`` runs the quality gate after a passing probe
(``tuner.sim.quality_gate``: answers drawn with the point's true accuracy drop, judged by
the real gate's statistics): its items take their time inside the probe's, its record is
the outcome's ``quality`` (a fail: ``quality_failed``, the load still measured).

Early stop (``EarlyStopPolicy``, None: never): the trial walks the worker's steps
(``tuner.engine.worker.Worker.run_trial``) and consults the worker's own guard
(``tuner.study.sweep_guard.SweepGuard``) with the request's plan (the study's front and
history when the trial started) wherever the worker does: while starting, after
verification, after the probe, inside each level and after each level. What the simulator
adds is only what a real trial would observe - when the log shows a knob not applied
(``verdict``), the level's window while it runs (``_windows``) - and the time each step
takes. The policy's switches edit the plan (the benchmarks take the rules apart); the
default is what the worker does.

Every finished trial is also logged with what only the simulator knows (``TrialLog``:
true values, whether a stopped trial would have entered the front), which is what the
benchmarks measure.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tuner.engine.execution import Finished
from tuner.probe.quality_stats import QualityRecord
from tuner.sim.ground_truth import Measured, measure
from tuner.sim.quality_gate import ITEM_S, gate_plan, simulate_gate, simulated_reference, true_record
from tuner.sim.truth import PointTruth, StartupVerdict
from tuner.study import early_stop
from tuner.study.outcome import TrialOutcome
from tuner.study.spec import StudySpec
from tuner.study.sweep_guard import SweepGuard
from tuner.study.trial_metrics import ACCURACY_DROP

__all__ = ["SimExecutor", "EarlyStopPolicy", "TrialLog"]


@dataclass(frozen=True)
class EarlyStopPolicy:
    """Which of the worker's early-stop rules the simulated worker applies, as switches on
    the plan its guard reads (a request with no plan never stops, as on a real worker).
    What the worker does is ``EarlyStopPolicy(streaming_verify=True, inside=True)``; the
    defaults leave out the two rules the benchmarks measure separately. Rule 1 (infeasible
    at verification, after the probe, on a missed limit) always applies."""

    dominated: bool = True         # rules 2-4: False sends an empty front (nothing dominates)
    reorder: bool = True           # objective/limit levels first; False: ascending levels
    streaming_verify: bool = False  # not applied known from the log while starting (``verdict``)
    inside: bool = False           # rule 4: stop inside a level on its window so far
    inside_margin: float = early_stop.INSIDE_MARGIN

    def plan(self, plan: Mapping[str, Any], levels: Sequence[int]) -> dict[str, Any]:
        """The request's plan (``SweepPlan`` as JSON) with this policy's switches."""

        out = dict(plan)
        if not self.dominated:
            out["front"] = []
        if not self.reorder:
            out["order"] = sorted(levels)
        out["inside_margin"] = self.inside_margin if self.inside else None
        return out


@dataclass
class TrialLog:
    """One trial that ran a (simulated) server, in the order the loop heard back from it."""

    number: int
    values: dict[str, Any]
    key: str
    failed: bool
    feasible: bool                  # as measured (constraints met, whole sweep or rule 4a)
    truly_feasible: bool            # ground truth: applied, probe ok, limits met
    measured: tuple[float, ...] | None
    true_values: tuple[float, ...] | None
    started_s: float
    finished_s: float
    stopped: str | None = None      # early-stop reason
    stopped_after: str | None = None  # phase after which it stopped ("verify", "probe", "c4", ...)
    would_enter_front: bool = False  # stopped, yet its full measurement would be on the front then
    true_front: bool = False        # stopped before its objectives were measured, yet a true front point
    compile: str | None = None      # torch.compile cache: "hit", "miss", None (nothing compiled)
    compile_saved_s: float = 0.0    # startup seconds the hit saved
    quality: str | None = None      # the quality gate's verdict ("pass", "fail"), None: no gate ran

    @property
    def seconds(self) -> float:
        return self.finished_s - self.started_s


@dataclass
class _Play:
    """A played trial: when it ends, what it measured, where it stopped (the guard's record)."""

    finished_s: float
    measured: Measured
    record: dict[str, Any] | None = None
    levels: dict[int, dict[str, float]] = field(default_factory=dict)   # what it reports
    probed: bool = False
    wrong: bool = False
    compile: str | None = None
    compile_saved_s: float = 0.0
    quality: QualityRecord | None = None   # the gate's record (a lossy trial past the probe)

    @property
    def stopped(self) -> str | None:
        return None if self.record is None else str(self.record["reason"])

    @property
    def after(self) -> str | None:
        return None if self.record is None else str(self.record["after"])


@dataclass
class _Job:
    group: int
    request: dict[str, Any]
    truth: PointTruth
    play: _Play
    started_s: float


class SimExecutor:
    """``workers`` simulated GPU groups answering trials from ``lookup(values)``."""

    def __init__(self, spec: StudySpec, lookup: Callable[[dict[str, Any]], PointTruth], *, workers: int = 1,
                 seed: int = 0, noise: float = 0.0, policy: EarlyStopPolicy | None = None,
                 verdict: Callable[[dict[str, Any]], StartupVerdict | None] | None = None,
                 compile_cache: bool = False, true_front: set[str] | None = None,
                 stop_when: Callable[[list[TrialLog]], bool] | None = None,
                 quality_item_s: float = ITEM_S) -> None:
        """``policy`` None: never stop early. ``verdict(values)``: the log that shows a knob
        not applied while the server starts, and when (``Evaluator.startup_verdict``).
        ``true_front``: keys of the true front's points (for ``TrialLog.true_front``).
        ``stop_when(logs)``: once true, no group takes a new trial (a benchmark that has
        found what it looks for). ``quality_item_s``: seconds per quality item a lossy
        trial's gate asks (``tuner.sim.quality_gate.ITEM_S``)."""

        self.spec = spec
        self.lookup = lookup
        self.workers = workers
        self.seed = seed
        self.noise = noise
        self.policy = policy
        self.verdict = verdict
        self.compile_cache = compile_cache
        self.true_front = true_front or set()
        self.stop_when = stop_when
        self.quality_item_s = quality_item_s
        self._quality_reference: list[tuple[str, bool]] | None = None   # simulated_reference, once
        self.now = 0.0
        self.trials: list[TrialLog] = []
        self._heap: list[tuple[float, int, int]] = []
        self._jobs: dict[int, _Job] = {}       # group -> its running job
        self._compiled: dict[str, float] = {}  # compile key -> when its cache entry was written
        self._directions = [o.direction for o in spec.objectives]

    # -- the Executor protocol -----------------------------------------------------------

    @property
    def n_groups(self) -> int:
        return self.workers

    def idle_groups(self) -> list[int]:
        if self.stop_when is not None and self.stop_when(self.trials):
            return []
        return [g for g in range(self.workers) if g not in self._jobs]

    def pending_groups(self) -> list[int]:
        return []

    def running(self) -> list[dict[str, Any]]:
        return [job.request for job in self._jobs.values()]

    def clock(self) -> float:
        return self.now

    def submit(self, group: int, request: dict[str, Any], *, deadline_s: float,
               method: str = "run_trial") -> None:
        if method != "run_trial":
            raise ValueError(f"the simulated executor runs trials only, not {method!r} "
                             "(turn probe.reference off in a simulated study)")
        if group in self._jobs:
            raise ValueError(f"group {group} is busy")
        truth = self.lookup(dict(request["values"]))
        play = self._execute(int(request["number"]), truth, request)
        self._jobs[group] = _Job(group, request, truth, play, self.now)
        heapq.heappush(self._heap, (play.finished_s, int(request["number"]), group))

    def poll(self, timeout_s: float, *, stop_grace_s: float) -> list[Finished]:
        """The trial that ends first (the clock moves to its end); [] when none runs."""

        if not self._heap:
            return []
        end, _, group = heapq.heappop(self._heap)
        self.now = max(self.now, end)
        job = self._jobs.pop(group)
        self._log(job)
        return [Finished(group, job.request, self._outcome(job).model_dump(mode="json"), None)]

    def cancel_all(self, *, wait_s: float, reason: str = "interrupted") -> list[Finished]:
        return self.abandon_all(reason, f"trial cancelled by the tuner ({reason})")

    def abandon_all(self, reason: str, message: str) -> list[Finished]:
        out = [Finished(job.group, job.request, None, reason, message) for job in self._jobs.values()]
        self._jobs.clear()
        self._heap.clear()
        return out

    def kill_now(self, reason: str, message: str) -> list[Finished]:
        return self.abandon_all(reason, message)

    # -- one trial -----------------------------------------------------------------------

    def _execute(self, number: int, truth: PointTruth, request: Mapping[str, Any]) -> _Play:
        """The trial's timeline (``_play``) with the torch.compile cache applied: a trial
        whose compile key was written by a trial before it started loads instead of
        compiling (``hit_saving_s`` off its start); one that gets past its compile writes
        the entry at ``compile_at_s`` into its run."""

        key = truth.compile_key if self.compile_cache else None
        written = self._compiled.get(key) if key else None
        hit = written is not None and written <= self.now
        saving = truth.hit_saving_s if hit else 0.0
        out = self._play(number, truth, request, saving)
        if key is not None:
            compiled_at = self.now + truth.compile_at_s
            past_compile = (out.finished_s - truth.stop_s) >= compiled_at - saving - 1e-9
            if past_compile and not hit:
                self._compiled[key] = min(self._compiled.get(key, math.inf), compiled_at)
            if past_compile or hit:
                out.compile, out.compile_saved_s = ("hit", saving) if hit else ("miss", 0.0)
        return out

    def _play(self, number: int, truth: PointTruth, request: Mapping[str, Any], saving: float) -> _Play:
        """Play one trial against the ground truth, step by step as the worker runs it,
        stopping where the worker's guard stops it with the request's plan."""

        spec = self.spec
        rng = random.Random(f"{self.seed}|{number}|noise")
        # The gate's record, should the trial get past a passing probe (its draws are its own
        # seed's, so whether it runs changes nothing else); told with the measurement.
        plan = None if truth.failed or not truth.probe_passed else gate_plan(spec, request)
        gate = None if plan is None else simulate_gate(plan, self._reference(), truth.lossy_drop, seed=self.seed,
                                                       number=number, item_s=self.quality_item_s)
        m = measure(spec, truth, noise=self.noise, rng=rng, quality=gate)
        start = self.now
        t = start + truth.startup_s - saving
        if truth.failed:
            return _Play(t + truth.stop_s, m)
        plan = request.get("early_stop")
        policy = self.policy
        guard = SweepGuard(None if policy is None or plan is None else policy.plan(plan, spec.load.concurrency))
        if guard.enabled and policy is not None and policy.streaming_verify and self.verdict is not None:
            seen = self.verdict(dict(request["values"]))
            if seen is not None and guard.stop_while_starting(request["asked"], seen.effective):
                return _Play(start + seen.seconds + truth.stop_s, m, guard.record)
        probed = bool(request["probe"]["enabled"]) and not guard.stop_after("verify", applied=truth.applied)
        # The worker runs the gate inside its probe step, after a passing probe.
        quality = gate if probed else None
        probe_s = truth.probe_s + (0.0 if quality is None else quality.probe_s)
        if probed:
            t += probe_s
        if guard.stop_after("probe", probe_passed=truth.probe_passed if probed else None):
            return _Play(t + truth.stop_s, m, guard.record, probed=probed, quality=quality)
        guard.trial_metrics = {"startup_s": truth.startup_s - saving, "probe_s": probe_s if probed else None,
                               ACCURACY_DROP: 0.0 if quality is None else quality.drop}
        levels = guard.levels(spec.load.concurrency)
        # The load generator judges inside a level with one client process and no repeats
        # (tuner.load.sweep).
        inside = guard.enabled and spec.load.repeats == 1 and spec.load.client_processes == 1
        measured: dict[int, dict[str, float]] = {}
        for i, c in enumerate(levels):
            later = levels[i + 1:]
            for seconds, window in self._windows(number, truth, c, m.levels[c]) if inside else []:
                if guard.inside_level(c, window, later):
                    # A rule-4a stop measured the level: told with it, like the worker's (the
                    # simulated levels carry no interval, so neither does this one).
                    told = {**measured, **{int(k): v for k, v in guard.measured_levels(0.0).items()}}
                    return _Play(t + seconds + truth.stop_s, m, guard.record, told, probed,
                                 self._wrong(m, guard), quality=quality)
            t += truth.levels[c].load_s
            measured[c] = m.levels[c]
            if later and guard.after_level(dict(measured), later):
                return _Play(t + truth.stop_s, m, guard.record, measured, probed, self._wrong(m, guard),
                             quality=quality)
        return _Play(t + truth.stop_s, m, levels=m.levels, probed=probed, quality=quality)

    def _reference(self) -> list[tuple[str, bool]]:
        """The study's simulated reference answers to its quality items ([] without ``quality:``),
        computed the first time a gate or the truth needs them, as the reference job answers once."""

        if self._quality_reference is None:
            quality = self.spec.quality
            self._quality_reference = [] if quality is None else simulated_reference(self.spec.probe,
                                                                                     quality.max_items)
        return self._quality_reference

    def _wrong(self, m: Measured, guard: SweepGuard) -> bool:
        """Whether a trial stopped on a bound would have entered, fully measured, the front
        it was judged against (a wrong stop; what only the simulator can know)."""

        if guard.record is None or guard.record["reason"] not in ("dominated", "dominated_inside"):
            return False
        return bool(m.feasible and m.objectives is not None and early_stop.dominated(
            m.objectives, guard.front, self._directions) is None)

    def _windows(self, number: int, truth: PointTruth, c: int,
                 final: Mapping[str, float]) -> list[tuple[float, dict[str, Any]]]:
        """The load generator's views of level ``c``'s window while it runs, each with the
        seconds into the level when it is seen (what ``SweepGuard.inside_level`` reads).

        Time model (the ground truth's: a level's time is proportional to its requests): the
        measured run of n requests on C streams is n / C rounds of equal length d, after the
        warm-up; the window opens when the first wave is done (d), rule 4b may judge from
        d * (1 + INSIDE_MIN_SHARE), and the window closes at the last dispatch, one round
        before the end, where rule 4a judges the level's own (noisy) output tok/s - at that
        moment already fixed. Rule 4b's rate so far is the level's true output tok/s with
        lognormal noise of sigma ``noise * sqrt(full window / window so far)``, drawn
        independently of the level's own measurement noise (independence makes a wrong stop
        likelier than the real, overlapping windows would)."""

        load = self.spec.load
        lv = truth.levels[c]
        n, w = load.requests_for(c), load.warmup_for(c)
        run_s = lv.load_s / (1 + w / max(1, n))
        d = run_s * min(c, n) / n
        full = run_s - 2 * d                      # [first wave done, last dispatch)
        if full <= 0:
            return []
        warm = run_s * w / max(1, n)
        judged = d * early_stop.INSIDE_MIN_SHARE
        views = []
        if judged < full:
            rng = random.Random(f"{self.seed}|{number}|inside|{c}")
            sigma = self.noise * math.sqrt(full / judged)
            rate = lv.metrics["output_tok_s"] * (math.exp(rng.gauss(0.0, sigma)) if sigma > 0 else 1.0)
            views.append((warm + d + judged, {"output_tok_s": rate, "window_s": judged, "first_wave_s": d,
                                              "stable": True, "exact": False}))
        views.append((warm + d + full, {"output_tok_s": final["output_tok_s"], "window_s": full,
                                        "first_wave_s": d, "stable": True, "exact": True}))
        return views

    # -- what the worker reports, and what only the simulator knows ----------------------

    def _outcome(self, job: _Job) -> TrialOutcome:
        """The outcome a worker would report for the played trial."""

        truth, play = job.truth, job.play
        number = int(job.request["number"])
        trial_s = play.finished_s - job.started_s
        startup_s = max(0.0, truth.startup_s - play.compile_saved_s)
        if truth.failed:
            return TrialOutcome(number=number, status="failed", reason=truth.reason, message=truth.message,
                                phase="start", startup_s=startup_s, trial_s=trial_s)
        gate_s = 0.0 if play.quality is None else play.quality.probe_s
        return TrialOutcome(
            number=number, status="completed", startup_s=startup_s,
            probe_s=truth.probe_s + gate_s if play.probed else None, trial_s=trial_s,
            levels={str(c): dict(m) for c, m in play.levels.items()},
            applied=truth.applied, mismatches=[{"target": t} for t in truth.mismatches],
            probe_passed=truth.probe_passed if play.probed else None, early_stop=play.record,
            compile={"cache": play.compile} if play.compile else None, quality=play.quality)

    def _log(self, job: _Job) -> None:
        truth, play = job.truth, job.play
        true_m = measure(self.spec, truth, quality=true_record(self.spec, truth, self._reference()))
        full = not truth.failed and play.stopped in (None, "dominated_exact")
        self.trials.append(TrialLog(
            number=int(job.request["number"]), values=dict(job.request["values"]),
            key=truth.key, failed=truth.failed, feasible=full and play.measured.feasible,
            truly_feasible=true_m.feasible, measured=play.measured.objectives if full else None,
            true_values=true_m.objectives, started_s=job.started_s, finished_s=play.finished_s,
            stopped=play.stopped, stopped_after=play.after, would_enter_front=play.wrong,
            true_front=truth.key in self.true_front and not full,
            compile=play.compile, compile_saved_s=play.compile_saved_s,
            quality=None if play.quality is None else play.quality.verdict))

