"""The study loop (tuner.engine.orchestrator.StudyLoop) with its real policy, driven through the
in-process executor (tuner.sim.executor.SimExecutor): no Ray, no processes, no files.

Points are answered by a hand-written table (below), not by the simulator's model, so each
outcome kind is where the test puts it."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import optuna
import pytest

from tests.sim_studies import SMALL_STUDY
from tuner.engine.orchestrator import StudyLoop
from tuner.sim.executor import EarlyStopPolicy, SimExecutor
from tuner.sim.truth import LevelTruth, PointTruth
from tuner.store.records import read_records
from tuner.study import space
from tuner.study.sampling import grid_points
from tuner.study.study_file import parse_study

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")

SPEC = parse_study(SMALL_STUDY, "small")
BASE = space.baseline_values(SPEC)


def _metrics(values: dict[str, Any]) -> tuple[float, float]:
    """A deterministic (throughput, TPOT) per point; the baseline is best in both."""

    if space.params_key(values) == space.params_key(BASE):
        return 1000.0, 4.0
    h = int(hashlib.sha256(space.params_key(values).encode()).hexdigest()[:8], 16)
    return 300.0 + h % 500, 6.0 + h % 7


def truth_of(values: dict[str, Any]) -> PointTruth:
    """LL128 fails to start, MTP is not applied, no CUDA graphs garble the probe, the rest
    is measured."""

    if values.get("nccl_proto") == "LL128":
        return PointTruth(values, "failed", "nccl_error", "NCCL WARN", startup_s=30.0, stop_s=5.0)
    thr, tpot = _metrics(values)
    levels = {1: LevelTruth(1, {"output_tok_s": thr / 16, "tpot_ms.mean": tpot, "ttft_ms.p90": 80.0}, 10.0),
              4: LevelTruth(4, {"output_tok_s": thr / 4, "tpot_ms.mean": tpot, "ttft_ms.p90": 90.0}, 10.0),
              16: LevelTruth(16, {"output_tok_s": thr, "tpot_ms.mean": tpot, "ttft_ms.p90": 99.0}, 10.0)}
    mtp = values.get("spec_method") == "mtp"
    return PointTruth(values, "completed", applied=not mtp,
                      mismatches=("speculative_config.method",) if mtp else (),
                      probe_passed=values.get("cudagraph_mode") != "NONE", levels=levels,
                      startup_s=60.0, probe_s=5.0, stop_s=5.0)


def run(n_trials: int, *, workers: int = 1, seed: int = 0, policy: EarlyStopPolicy | None = None,
        spec: Any = SPEC, progress: Any = None) -> tuple[optuna.Study, SimExecutor, StudyLoop, str]:
    study = optuna.create_study(directions=[o.direction for o in spec.objectives],
                                sampler=optuna.samplers.RandomSampler(seed=seed))
    study.set_metric_names([o.label for o in spec.objectives])
    executor = SimExecutor(spec, truth_of, workers=workers, seed=seed, policy=policy)
    loop = StudyLoop(spec, spec.name, executor, trials_root=Path("trials"), n_trials=n_trials,
                     clock=executor.clock, progress=progress or (lambda line: None))
    loop.enqueue_first_points(study)
    reason = loop.run_loop(study)
    return study, executor, loop, reason


def test_the_budget_runs_the_baseline_first_and_tells_each_outcome_kind() -> None:
    study, executor, _, reason = run(14, workers=2)
    assert reason == "budget"
    records = {r.number: r for r in read_records(study)}
    runs = [r for r in records.values() if r.kind == "run"]
    assert len(runs) == 14 == len(executor.trials)
    assert executor.trials[0].values == BASE and records[0].attrs["baseline"] is True
    assert executor.now > 0                                  # simulated time moved, nothing waited
    outcomes = {r.outcome.split(":")[0] for r in runs}
    assert {"feasible", "not_applied"} <= outcomes
    for r in runs:
        if r.params.get("nccl_proto") == "LL128":
            assert r.state == "FAIL" and r.attrs["failure"]["reason"] == "nccl_error"
        elif r.params.get("spec_method") == "mtp":
            assert r.state == "COMPLETE" and r.constraints["applied"] == 1.0
        elif r.params.get("cudagraph_mode") == "NONE":
            assert r.state == "COMPLETE" and r.constraints["probe"] == 1.0
        else:
            assert r.outcome == "feasible" and " vllm serve " in r.attrs["command"]
    # Forbidden and repeated proposals never reached the executor; each is marked. The
    # baseline's further starts for the study's noise are the only repeats, on purpose.
    noise_starts = [r.number for r in runs if r.attrs.get("noise_start")]
    assert noise_starts == [1, 2] and all(records[n].params == records[0].params for n in noise_starts)
    ran = [t.key for t in executor.trials if t.number not in noise_starts]
    assert len(ran) == len(set(ran))
    assert all(space.forbidden_reason(SPEC, t.values) is None for t in executor.trials)
    for r in records.values():
        if r.kind == "forbidden":
            assert r.constraints.get("forbidden") == 1.0 or r.state == "FAIL"
        if r.kind == "duplicate":
            assert r.attrs["duplicate_of"] < r.number


def test_a_small_space_is_exhausted_and_every_point_runs_once() -> None:
    start, end = SMALL_STUDY.index("  - {name: spec_method"), SMALL_STUDY.index("forbidden:")
    spec = parse_study(SMALL_STUDY[:start] + SMALL_STUDY[end:], "tiny")     # 2 x (1 + 3) x 3 points, less 1
    points = {space.params_key(p) for p in grid_points(spec)}
    study, executor, _, reason = run(len(points) + 20, spec=spec)
    assert reason == "exhausted"
    # Every point once, the baseline three times (load.noise_starts: the study's own noise).
    assert {t.key for t in executor.trials} == points
    assert len(executor.trials) == len(points) + spec.load.noise_starts - 1
    assert any(r.attrs.get("filled_in") for r in read_records(study))     # the random fill-in ran


def test_an_interrupt_cancels_running_trials_marks_them_and_queues_a_retry() -> None:
    loop_box: list[StudyLoop] = []

    def progress(line: str) -> None:
        if line.startswith("[trial 3] start") and loop_box:
            loop_box[0].stop_reason = "interrupted"          # what the first Ctrl-C does

    study = optuna.create_study(directions=[o.direction for o in SPEC.objectives],
                                sampler=optuna.samplers.RandomSampler(seed=1))
    study.set_metric_names([o.label for o in SPEC.objectives])
    executor = SimExecutor(SPEC, truth_of, workers=2, seed=1)
    loop = StudyLoop(SPEC, SPEC.name, executor, trials_root=Path("trials"), n_trials=20,
                     clock=executor.clock, progress=progress)
    loop_box.append(loop)
    loop.enqueue_first_points(study)
    assert loop.run_loop(study) == "interrupted"
    assert executor.running() == []
    records = read_records(study)
    cut = [r for r in records if r.attrs.get("failure", {}).get("reason") == "interrupted"]
    assert cut and all(r.state == "FAIL" for r in cut)
    retries = [r for r in records if r.state == "WAITING"]
    assert sorted(r.attrs["retry_of"] for r in retries) == sorted(r.number for r in cut)
    assert all(r.attrs["attempt"] == 2 for r in retries)


def test_the_worker_gets_the_study_front_and_stops_a_dominated_trial() -> None:
    study, executor, _, _ = run(10, policy=EarlyStopPolicy(), seed=2)
    stopped = [t for t in executor.trials if t.stopped]
    assert stopped, "no trial was stopped early"
    records = {r.number: r for r in read_records(study)}
    for t in stopped:
        r = records[t.number]
        assert r.attrs["outcome"]["early_stop"]["reason"] == t.stopped
        if t.stopped == "dominated_exact":
            assert "early_stopped" not in r.constraints   # objectives measured: told as measured
        else:
            assert r.constraints["early_stopped"] == 1.0 and not r.feasible
    assert not any(t.would_enter_front for t in stopped)
