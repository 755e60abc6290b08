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

Early stop (``EarlyStopPolicy``, None: never): the worker's rules with the request's plan (the study's
front and history when the trial started) - infeasible at verification / after the probe /
on a missed limit (rule 1), dominated after a level (rules 2 and 3), inside a level
(rule 4, see ``_inside`` for its time and noise model). The policy's switches take the
rules apart for the benchmarks; the default is what the worker does.

Every finished trial is also logged with what only the simulator knows (``TrialLog``:
true values, whether a stopped trial would have entered the front), which is what the
benchmarks measure.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tuner.engine.execution import Finished
from tuner.sim.ground_truth import Measured, level_of, measure
from tuner.sim.truth import PointTruth
from tuner.study import early_stop, sweep_guard
from tuner.study.outcome import TrialOutcome
from tuner.study.spec import StudySpec

__all__ = ["SimExecutor", "EarlyStopPolicy", "TrialLog"]


@dataclass(frozen=True)
class EarlyStopPolicy:
    """Which of the worker's early-stop rules the simulated worker applies (a request with
    no plan never stops, as on a real worker). What the worker does is
    ``EarlyStopPolicy(streaming_verify=True, inside=True)``; the defaults leave out the two
    rules the benchmarks measure separately."""

    infeasible: bool = True        # rule 1: not applied / probe failed / limit missed
    dominated: bool = True         # rule 2: dominated for sure after a level
    margin: float = early_stop.DEFAULT_MARGIN
    min_history: int = early_stop.DEFAULT_MIN_HISTORY
    max_gap: float = early_stop.DEFAULT_MAX_GAP
    reorder: bool = True           # rule 3: objective/limit levels first
    streaming_verify: bool = False  # not applied known from the log while starting (``verdict``)
    inside: bool = False           # rule 4: stop inside a level on its window so far
    inside_margin: float = early_stop.INSIDE_MARGIN


@dataclass
class TrialLog:
    """One trial that ran a (simulated) server, in the order the loop heard back from it."""

    number: int
    run_index: int                  # 1-based count of finished runs (the budget counter)
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

    @property
    def seconds(self) -> float:
        return self.finished_s - self.started_s


@dataclass
class _Play:
    """A played trial: when it ends, what it measured, where it stopped."""

    finished_s: float
    measured: Measured
    stopped: str | None = None
    after: str | None = None
    levels: dict[int, dict[str, float]] = field(default_factory=dict)   # what it reports
    bounds: tuple[float, ...] = ()
    wrong: bool = False
    compile: str | None = None
    compile_saved_s: float = 0.0


@dataclass
class _Job:
    group: int
    request: dict[str, Any]
    truth: PointTruth
    play: _Play
    started_s: float


@dataclass
class _Plan:
    """The request's early-stop plan, as the simulated worker reads it."""

    targets: list[early_stop.Target]
    front: list[tuple[float, ...]]
    history: list[dict[int, dict[str, float]]]

    @classmethod
    def of(cls, plan: Mapping[str, Any]) -> _Plan:
        guard = sweep_guard.SweepGuard(plan)
        return cls(guard.targets, guard.front, guard.history)


class SimExecutor:
    """``workers`` simulated GPU groups answering trials from ``lookup(values)``."""

    def __init__(self, spec: StudySpec, lookup: Callable[[dict[str, Any]], PointTruth], *, workers: int = 1,
                 seed: int = 0, noise: float = 0.0, policy: EarlyStopPolicy | None = None,
                 verdict: Callable[[dict[str, Any]], float | None] | None = None,
                 compile_cache: bool = False, true_front: set[str] | None = None,
                 stop_when: Callable[[list[TrialLog]], bool] | None = None) -> None:
        """``policy`` None: never stop early. ``verdict(values)``: seconds into the start when
        the log shows a knob not applied (``Evaluator.verdict_s``; streaming verification).
        ``true_front``: keys of the true front's points (for ``TrialLog.true_front``).
        ``stop_when(logs)``: once true, no group takes a new trial (a benchmark that has
        found what it looks for)."""

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
        """Play one trial against the ground truth, stopping where the worker would with
        the request's plan (the study's state when the trial started)."""

        spec = self.spec
        rng = random.Random(f"{self.seed}|{number}|noise")
        m = measure(spec, truth, noise=self.noise, rng=rng)
        start = self.now
        t = start + truth.startup_s - saving
        if truth.failed:
            return _Play(t + truth.stop_s, m)
        plan_data = request.get("early_stop")
        policy = self.policy if plan_data is not None else None
        if policy and policy.infeasible:
            reason = early_stop.infeasible_reason(applied=truth.applied, probe_passed=None,
                                                  require_applied=spec.verify.require_applied)
            if reason and policy.streaming_verify and self.verdict is not None:
                seen = self.verdict(dict(request["values"]))
                if seen is not None:
                    if saving and seen >= truth.compile_at_s:
                        seen -= saving        # a verdict from the end of the start comes sooner
                    return _Play(start + seen + truth.stop_s, m, reason, "startup")
            if reason:
                return _Play(t + truth.stop_s, m, reason, "verify")
        t += truth.probe_s
        if policy and policy.infeasible and not truth.probe_passed:
            return _Play(t + truth.stop_s, m, "probe_failed", "probe")
        levels = sorted(truth.levels)
        if policy is None or plan_data is None:
            return _Play(t + sum(truth.levels[c].load_s for c in levels) + truth.stop_s, m, levels=m.levels)
        plan = _Plan.of(plan_data)
        if policy.reorder:
            needed = [tg.level for tg in plan.targets] + [level_of(spec, lim.concurrency) for lim in spec.limits]
            levels = early_stop.level_order(levels, needed)
        limits = {k: v for k, v in m.constraints.items() if k.startswith("limit:")}
        for i, c in enumerate(levels):
            before = {lc: m.levels[lc] for lc in levels[:i]}
            if policy.inside:      # the last level too, as the load generator does
                inside = self._inside(number, truth, c, before, m.levels[c], plan, policy)
                if inside is not None:
                    seconds, bounds, where = inside
                    if where.endswith("at last dispatch") and not any(
                            level_of(spec, lim.concurrency) == c for lim in spec.limits):
                        # Rule 4a: the level's output tok/s is measured; told like rule 2.
                        return _Play(t + seconds + truth.stop_s, m, "dominated_exact", where,
                                     {**before, c: {"output_tok_s": m.levels[c]["output_tok_s"]}}, bounds)
                    return _Play(t + seconds + truth.stop_s, m, "dominated_inside", where, before, bounds,
                                 self._would_enter(m, plan))
            t += truth.levels[c].load_s
            if i + 1 == len(levels):
                continue
            measured = {lc: m.levels[lc] for lc in levels[:i + 1]}
            if policy.infeasible:
                missed = {k: v for k, v in limits.items() if self._limit_level(k) in measured}
                if early_stop.infeasible_reason(applied=True, probe_passed=True, limit_violations=missed):
                    return _Play(t + truth.stop_s, m, "limit", f"c{c}", measured)
            if policy.dominated:
                d = early_stop.decide(plan.targets, measured, levels[i + 1:], plan.front, plan.history,
                                      margin=policy.margin, min_history=policy.min_history,
                                      max_gap=policy.max_gap)
                if d.stop and d.reason == "dominated_exact":
                    # Objective values are measured: only informational levels are skipped.
                    return _Play(t + truth.stop_s, m, d.reason, f"c{c}", measured, d.bounds)
                if d.stop:
                    return _Play(t + truth.stop_s, m, "dominated", f"c{c}", measured, d.bounds,
                                 self._would_enter(m, plan))
        return _Play(t + truth.stop_s, m, levels=m.levels)

    def _would_enter(self, m: Measured, plan: _Plan) -> bool:
        """Whether a stopped trial's full measurement would have entered the front it was
        judged against (a wrong stop)."""

        return bool(m.feasible and m.objectives is not None and early_stop.dominated(
            m.objectives, plan.front, self._directions) is None)

    def _inside(self, number: int, truth: PointTruth, c: int, measured: dict[int, dict[str, float]],
                final: Mapping[str, float], plan: _Plan,
                policy: EarlyStopPolicy) -> tuple[float, tuple[float, ...], str] | None:
        """Rule 4 in the simulated trial: (seconds into level ``c`` when it stops, bounds,
        where) or None.

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
        mine = [tg for tg in plan.targets if tg.level == c]
        if (not mine or any(tg.metric != "output_tok_s" or tg.direction != "maximize" for tg in mine)
                or load.repeats != 1 or load.client_processes != 1):
            return None
        lv = truth.levels[c]
        n, w = load.requests_for(c), load.warmup_for(c)
        run_s = lv.load_s / (1 + w / max(1, n))
        d = run_s * min(c, n) / n
        full = run_s - 2 * d                      # [first wave done, last dispatch)
        if full <= 0:
            return None
        warm = run_s * w / max(1, n)
        judged = d * early_stop.INSIDE_MIN_SHARE
        checks = [(final["output_tok_s"], True, full, f"c{c} at last dispatch")]
        if judged < full:
            rng = random.Random(f"{self.seed}|{number}|inside|{c}")
            sigma = self.noise * math.sqrt(full / judged)
            rate = lv.metrics["output_tok_s"] * (math.exp(rng.gauss(0.0, sigma)) if sigma > 0 else 1.0)
            checks.insert(0, (rate, False, judged, f"inside c{c}"))
        for rate, exact, window_s, where in checks:
            bound = early_stop.inside_bound(rate, window_s=window_s, first_wave_s=d, stable=True,
                                            exact=exact, margin=policy.inside_margin)
            if not math.isfinite(bound):
                continue
            partial = {**measured, c: {"output_tok_s": bound}}
            bounds = early_stop.optimistic_values(plan.targets, partial, plan.history, margin=policy.margin,
                                                  min_history=policy.min_history, max_gap=policy.max_gap)
            if early_stop.dominated(bounds, plan.front, self._directions) is not None:
                return warm + d + window_s, bounds, where
        return None

    def _limit_level(self, key: str) -> int | None:
        for limit in self.spec.limits:
            if f"limit:{limit.label}" == key:
                return level_of(self.spec, limit.concurrency)
        return None

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
        reached_probe = play.after not in ("startup", "verify")
        record = None
        if play.stopped is not None:
            record = {"reason": play.stopped, "after": play.after,
                      "bounds": [b if math.isfinite(b) else None for b in play.bounds] or None}
        return TrialOutcome(
            number=number, status="completed", startup_s=startup_s,
            probe_s=truth.probe_s if reached_probe else None, trial_s=trial_s,
            levels={str(c): dict(m) for c, m in play.levels.items()},
            applied=truth.applied, mismatches=[{"target": t} for t in truth.mismatches],
            probe_passed=truth.probe_passed if reached_probe else None, early_stop=record,
            compile={"cache": play.compile} if play.compile else None)

    def _log(self, job: _Job) -> None:
        truth, play = job.truth, job.play
        true_m = measure(self.spec, truth)
        full = not truth.failed and play.stopped in (None, "dominated_exact")
        self.trials.append(TrialLog(
            number=int(job.request["number"]), run_index=len(self.trials) + 1, values=dict(job.request["values"]),
            key=truth.key, failed=truth.failed, feasible=full and play.measured.feasible,
            truly_feasible=true_m.feasible, measured=play.measured.objectives if full else None,
            true_values=true_m.objectives, started_s=job.started_s, finished_s=play.finished_s,
            stopped=play.stopped, stopped_after=play.after, would_enter_front=play.wrong,
            true_front=truth.key in self.true_front and not full,
            compile=play.compile, compile_saved_s=play.compile_saved_s))

