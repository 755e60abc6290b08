"""Simulated studies: the study loop (``tuner.engine.orchestrator.StudyLoop``) and its policy
(``tuner.study.policy``) driven through the in-process executor (``tuner.sim.executor``),
every trial answered from a ``tuner.sim.ground_truth.GroundTruth`` table with measurement noise.

Nothing here decides what to ask, run or tell: that is the tuner's own loop, as in a real
study. This module only sets the study up (an in-memory Optuna study with the benchmark's
sampler, the executor, the points a variant enqueues first) and reads the run back
(``StudyRun``: the executor's trial log and the study's proposal counts).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

from tuner.engine.orchestrator import StudyLoop
from tuner.sim.executor import EarlyStopPolicy, SimExecutor, TrialLog
from tuner.sim.ground_truth import GroundTruth
from tuner.sim.truth import StartupVerdict
from tuner.store.records import read_records
from tuner.study.pareto import Point, pareto_front
from tuner.study.spec import StudySpec
from tuner.study.trials import KIND_DUPLICATE, KIND_FORBIDDEN

__all__ = ["TrialLog", "StudyRun", "EarlyStopPolicy", "run_study"]

SamplerFactory = Callable[[StudySpec, int], optuna.samplers.BaseSampler]


@dataclass
class StudyRun:
    trials: list[TrialLog] = field(default_factory=list)
    proposals: int = 0              # asks, including forbidden and duplicate ones
    forbidden: int = 0
    duplicates: int = 0
    exhausted: bool = False

    def hv_curve(self, truth: GroundTruth, *, strict: bool = False) -> list[float]:
        """True hypervolume of the truly feasible points fully measured after each finished run."""

        out, rows = [], []
        for t in self.trials:
            if t.truly_feasible and t.true_values is not None and t.measured is not None:
                rows.append(t.true_values)
            out.append(truth.hv_of(rows, strict=strict))
        return out

    def reported_front_hv(self, truth: GroundTruth, directions: Sequence[str]) -> float:
        """True hypervolume of what the study would report: its front by measured values."""

        rows = [t for t in self.trials if t.feasible and t.measured is not None and t.true_values is not None]
        front = pareto_front([Point(i, t.measured) for i, t in enumerate(rows) if t.measured is not None],
                             directions)
        return truth.hv_of([rows[p.number].true_values for p in front])  # type: ignore[misc]

    @property
    def total_seconds(self) -> float:
        return sum(t.seconds for t in self.trials)

    @property
    def compile_saved_seconds(self) -> float:
        """Startup seconds the torch.compile cache saved (run with ``compile_cache``)."""

        return sum(t.compile_saved_s for t in self.trials)

    @property
    def compile_hits(self) -> int:
        return sum(t.compile == "hit" for t in self.trials)

    @property
    def makespan(self) -> float:
        return max((t.finished_s for t in self.trials), default=0.0)


def simulated_spec(spec: StudySpec, *, seed: int, grid: bool, early_stop_plan: bool) -> StudySpec:
    """The study file as a simulated study runs it: the run's seed (the grid's shuffle and
    the random fill-in follow it), the grid sampler when asked, no wall-clock limit (the
    clock is simulated), and early-stop plans sent only when the worker may stop."""

    sampler = spec.sampler.model_copy(update={"seed": seed, **({"name": "grid"} if grid else {})})
    return spec.model_copy(update={
        "sampler": sampler,
        "budget": spec.budget.model_copy(update={"timeout": None}),
        "execution": spec.execution.model_copy(update={"early_stop": early_stop_plan}),
    })


def run_study(spec: StudySpec, truth: GroundTruth, sampler_factory: SamplerFactory, *, n_trials: int,
              seed: int, noise: float = 0.0, workers: int = 1, policy: EarlyStopPolicy | None = None,
              grid: bool = False, initial: Sequence[dict[str, Any]] = (),
              stop_at_full: bool = False,
              verdict: Callable[[dict[str, Any]], StartupVerdict | None] | None = None,
              compile_cache: bool = False) -> StudyRun:
    """One simulated study of at most ``n_trials`` runs.

    ``sampler_factory(spec, seed)`` builds the sampler; ``grid``: the study's grid order
    (every point once, shuffled by ``seed``); ``initial``: points enqueued after the
    baseline (an initial design); ``stop_at_full``: stop once the evaluated points cover the
    whole true front. ``policy``: the worker's early stop (None: never);
    ``verdict(values)``: the log that shows a knob not applied while the server starts, and
    when (``Evaluator.startup_verdict``), used by ``EarlyStopPolicy.streaming_verify``.
    ``compile_cache``: model vLLM's torch.compile cache shared by the study's servers."""

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sim_spec = simulated_spec(spec, seed=seed, grid=grid, early_stop_plan=policy is not None)
    study = optuna.create_study(directions=[o.direction for o in spec.objectives],
                                sampler=sampler_factory(spec, seed))
    with warnings.catch_warnings():   # "experimental" since Optuna 3.2; the tuner uses it too
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names([o.label for o in spec.objectives])

    def found_all(logs: list[TrialLog]) -> bool:
        # Benchmarks of search speed need nothing after the whole true front is found.
        rows = [t.true_values for t in logs if t.truly_feasible and t.measured is not None
                and t.true_values is not None]
        return truth.hv_of(rows) >= truth.hypervolume * (1 - 1e-9)

    executor = SimExecutor(sim_spec, truth.get, workers=workers, seed=seed, noise=noise, policy=policy,
                           verdict=verdict, compile_cache=compile_cache, true_front=truth.front_keys(),
                           stop_when=found_all if stop_at_full else None)
    loop = StudyLoop(sim_spec, spec.name, executor, trials_root=Path("trials"), n_trials=n_trials,
                     clock=executor.clock)
    loop.enqueue_first_points(study)
    for values in initial:
        study.enqueue_trial(values, user_attrs={"attempt": 1, "initial_design": True})
    reason = loop.run_loop(study)
    records = [r for r in read_records(study) if r.state != "WAITING"]
    return StudyRun(trials=executor.trials, proposals=len(records),
                    forbidden=sum(r.kind == KIND_FORBIDDEN for r in records),
                    duplicates=sum(r.kind == KIND_DUPLICATE for r in records),
                    exhausted=reason == "exhausted")
