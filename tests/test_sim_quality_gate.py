"""The quality gate on the in-process simulated executor (tuner.sim.executor, tuner.sim.quality_gate):
a lossy trial of a study with ``quality:`` draws its paired answers with the point's true
accuracy drop, the real gate's statistics judge them, and the outcome carries the record and
the gate's time as a worker's would. No server, no processes.

Points are answered by a hand-written table (the drop is where the test puts it), run through
the study's own loop (tuner.engine.orchestrator.StudyLoop) as tuner/sim/study.py runs it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest

from tuner.engine.execution import Finished
from tuner.engine.orchestrator import StudyLoop
from tuner.probe.quality_stats import QualityRecord, look_sizes
from tuner.sim.executor import SimExecutor
from tuner.sim.ground_truth import GroundTruth
from tuner.sim.profile import load_profile
from tuner.sim.quality_gate import ITEM_S, gate_plan, simulate_gate, simulated_reference
from tuner.sim.truth import Evaluator, LevelTruth, PointTruth, enumerate_points
from tuner.store.records import TrialRecord, read_records
from tuner.study.quality_plan import quality_plan
from tuner.study.study_file import parse_study
from tuner.study.trial_metrics import ACCURACY_DROP

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")

ROOT = Path(__file__).resolve().parents[1]
# fp8 KV cache x fp8 weights on SmolLM2 under a 5-point budget: 4 points, 3 of them lossy;
# objectives output_tok_s at c=32 and accuracy_drop.
LOSSY = parse_study((ROOT / "search_spaces/smollm2-h100-lossy.yaml").read_text(encoding="utf-8"), "lossy")
BUDGET = 0.05
REFERENCE = simulated_reference(LOSSY.probe, LOSSY.quality.max_items)
ACCURACY = sum(right for _, right in REFERENCE) / len(REFERENCE)


def _lossy(values: dict[str, Any]) -> bool:
    return values.get("kv_cache_dtype") == "fp8" or values.get("quantization") == "fp8"


def table(drop: float):
    """Every point measured and passing the probe; fp8 is faster, and a lossy point's true
    accuracy drop (tuner.sim.lossy's flip rate) is ``drop``."""

    def truth_of(values: dict[str, Any]) -> PointTruth:
        speed = 1000.0 * (1.5 if values.get("quantization") == "fp8" else 1.0) * (
            1.2 if values.get("kv_cache_dtype") == "fp8" else 1.0)
        levels = {c: LevelTruth(c, {"output_tok_s": speed * c / 32, "tpot_ms.mean": 5.0, "ttft_ms.p90": 50.0}, 20.0)
                  for c in LOSSY.load.concurrency}
        return PointTruth(values, "completed", levels=levels, startup_s=60.0, probe_s=4.0, stop_s=5.0,
                          lossy_drop=drop if _lossy(values) else 0.0)
    return truth_of


class Recording(SimExecutor):
    """The simulated executor, keeping every outcome it reports."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.finished: list[Finished] = []

    def poll(self, timeout_s: float, *, stop_grace_s: float) -> list[Finished]:
        out = super().poll(timeout_s, stop_grace_s=stop_grace_s)
        self.finished.extend(out)
        return out


def run(drop: float, *, seed: int = 0) -> tuple[dict[int, TrialRecord], Recording]:
    """Every point of the lossy study once (and the baseline's further noise starts)."""

    study = optuna.create_study(directions=[o.direction for o in LOSSY.objectives],
                                sampler=optuna.samplers.RandomSampler(seed=seed))
    study.set_metric_names([o.label for o in LOSSY.objectives])
    executor = Recording(LOSSY, table(drop), seed=seed)
    loop = StudyLoop(LOSSY, LOSSY.name, executor, trials_root=Path("trials"), n_trials=30,
                     clock=executor.clock, progress=lambda line: None)
    loop.enqueue_first_points(study)
    assert loop.run_loop(study) == "exhausted"
    records = {r.number: r for r in read_records(study) if r.kind == "run"}
    return records, executor


def outcomes(executor: Recording) -> dict[int, dict[str, Any]]:
    return {int(f.request["number"]): f.result for f in executor.finished if f.result is not None}


def test_a_true_drop_of_zero_passes_the_gate_and_lossless_trials_run_none() -> None:
    records, executor = run(0.0)
    told = outcomes(executor)
    lossy = [n for n, r in records.items() if _lossy(r.params)]
    assert len(lossy) == 3 and len(records) == 4      # load.noise_floor given: no further starts
    for n, r in records.items():
        quality = told[n]["quality"]
        if n in lossy:
            record = QualityRecord.model_validate(quality)
            # No item flips: the first look's interval already lies inside the budget.
            assert record.verdict == "pass" and record.drop == 0.0 and record.looks == 1
            assert record.items == LOSSY.quality.items
            assert set(record.lossy) == {k for k, v in r.params.items() if v == "fp8"}
        else:
            assert quality is None
        assert r.outcome == "feasible" and r.constraints["quality"] == 0.0
        assert r.values[ACCURACY_DROP] == 0.0
    assert {t.quality for t in executor.trials if _lossy(t.values)} == {"pass"}
    assert all(t.feasible and t.truly_feasible for t in executor.trials)


def test_a_drop_well_above_the_budget_is_quality_failed_with_its_speed_kept() -> None:
    records, executor = run(0.20)
    told = outcomes(executor)
    for n, r in records.items():
        if not _lossy(r.params):
            assert r.outcome == "feasible" and told[n]["quality"] is None
            continue
        record = QualityRecord.model_validate(told[n]["quality"])
        assert record.verdict == "fail" and record.drop_low > BUDGET and not record.decided_at_cap
        assert r.outcome == "quality_failed" and r.constraints["quality"] == 1.0
        # Infeasible like a failed probe, yet its load was measured and told.
        assert r.state == "COMPLETE" and set(told[n]["levels"]) == {str(c) for c in LOSSY.load.concurrency}
        assert r.values[ACCURACY_DROP] == pytest.approx(record.drop)
        assert r.values["output_tok_s@cmax"] > 1000.0
    logs = [t for t in executor.trials if _lossy(t.values)]
    assert logs and all(t.quality == "fail" and not t.feasible and not t.truly_feasible for t in logs)


def test_the_record_is_consistent_and_the_gate_time_is_in_the_trial() -> None:
    records, executor = run(0.06)      # near the budget: more than one look, now and then
    told = outcomes(executor)
    sizes = look_sizes(LOSSY.quality.items, LOSSY.quality.max_items)
    lossless = next(t for t in executor.trials if not _lossy(t.values))
    for t in executor.trials:
        if not _lossy(t.values):
            continue
        record = QualityRecord.model_validate(told[t.number]["quality"])
        assert record.drop_low <= record.drop <= record.drop_high
        assert record.items == sizes[record.looks - 1]
        assert record.reference_accuracy == pytest.approx(ACCURACY, abs=0.05)
        assert record.trial_accuracy == pytest.approx(record.reference_accuracy - record.drop)
        assert record.budget == BUDGET and record.confidence == LOSSY.quality.confidence
        assert record.probe_s == pytest.approx(record.items * ITEM_S)
        # Inside the probe step, as on a worker: probe_s and the trial's time carry the gate.
        assert told[t.number]["probe_s"] == pytest.approx(4.0 + record.probe_s)
        assert t.seconds == pytest.approx(lossless.seconds + record.probe_s)
        assert told[t.number]["trial_s"] == pytest.approx(t.seconds)
    assert records


def test_the_gate_is_deterministic_under_a_seed() -> None:
    def signature(seed: int) -> list[tuple[int, Any, float]]:
        _, executor = run(0.05, seed=seed)
        told = outcomes(executor)
        return [(t.number, told[t.number]["quality"], t.seconds) for t in executor.trials]

    assert signature(3) == signature(3)


def test_the_simulated_reference_is_the_simulated_models_own_answers() -> None:
    assert len(REFERENCE) == LOSSY.quality.max_items == len({item for item, _ in REFERENCE})
    # The simulated model answers most of the bank, not all (about 0.84), the same every time.
    assert 0.6 < ACCURACY < 1.0
    assert simulated_reference(LOSSY.probe, 200) == REFERENCE[:200]


def test_simulated_gate_judges_like_the_real_one() -> None:
    plan = quality_plan(LOSSY, {"kv_cache_dtype": "fp8", "quantization": None}, None)
    assert plan is not None

    def gate(drop: float, number: int = 5) -> QualityRecord:
        return simulate_gate(plan, REFERENCE, drop, seed=1, number=number)

    clean = gate(0.0)
    assert (clean.verdict, clean.looks, clean.items, clean.drop) == ("pass", 1, 200, 0.0)
    assert clean.reference_accuracy == clean.trial_accuracy
    bad = gate(0.3)
    assert bad.verdict == "fail" and bad.looks == 1 and bad.drop > 0.15
    # Every trial its own draws, the same on every run.
    assert len({gate(0.05, n).model_dump_json() for n in range(8)}) > 1
    assert gate(0.05, 7) == gate(0.05, 7)
    # Only right answers turn wrong: the trial never answers an item the reference missed.
    assert all(r.trial_accuracy <= r.reference_accuracy for r in (gate(0.05, n) for n in range(8)))
    # Undecided at the cap: a fail marked as such.
    capped = [r for r in (gate(0.06, n) for n in range(40)) if r.decided_at_cap]
    assert capped and all(r.verdict == "fail" and r.items == 800 and r.looks == 3 for r in capped)


def test_a_study_without_quality_gets_no_gate() -> None:
    plain = LOSSY.model_copy(update={"quality": None})
    values = {"kv_cache_dtype": "auto", "quantization": None}
    assert gate_plan(plain, {"values": {**values, "kv_cache_dtype": "fp8"}}) is None
    assert gate_plan(LOSSY, {"values": values}) is None                    # lossless
    assert gate_plan(LOSSY, {"values": {**values, "kv_cache_dtype": "fp8"}}) is not None
    assert gate_plan(LOSSY, {"values": {**values, "kv_cache_dtype": "fp8"}, "quality": None}) is None


def test_the_evaluator_gives_each_point_the_lossy_models_drop() -> None:
    ev = Evaluator(LOSSY, load_profile("llama8b-h100"))
    points = {(p["kv_cache_dtype"], p["quantization"]): ev.evaluate(p) for p in enumerate_points(LOSSY)}
    drops = {k: p.lossy_drop for k, p in points.items()}
    # tuner.sim.lossy.DEFAULT_DROPS (the profile sets none): 1 point for the cache, 2 for the weights.
    assert drops == pytest.approx({("auto", None): 0.0, ("fp8", None): 0.01, ("auto", "fp8"): 0.02,
                                   ("fp8", "fp8"): 0.03})
    for p in points.values():
        row = p.to_json()
        assert ("lossy_drop" in row) == bool(p.lossy_drop)     # a lossless row as it was
        assert PointTruth.from_json(row) == p


def test_the_true_front_leaves_out_a_point_over_the_budget() -> None:
    truth_of = table(0.0)
    points = [truth_of(v) for v in enumerate_points(LOSSY)]
    fastest = max(points, key=lambda p: p.levels[32].metrics["output_tok_s"])
    within = GroundTruth.build(LOSSY, points)
    over = GroundTruth.build(LOSSY, [PointTruth(**{**p.__dict__, "lossy_drop": 0.2}) if p is fastest else p
                                     for p in points])
    assert fastest.key in within.front_keys() and fastest.key not in over.front_keys()
