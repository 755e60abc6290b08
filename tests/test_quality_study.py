"""Lossy knobs under a quality budget inside a real `tuner run` on the simulator (Ray, Optuna
SQLite, server processes): the reference answers the quality items once, a lossy trial runs
the loosened corruption rule and then the quality gate against those answers, and the
verdict follows the simulator's true accuracy drop (TUNER_SIM_LOSSY_DROP).

The space: kv_cache_dtype [auto, fp8] x quantization [null, fp8]. The baseline (auto, null) is
lossless and the reference; (fp8, null) and (auto, fp8) are lossy; (fp8, fp8) answers garbage
(the simulator's corrupt fault), which the corruption rule must still reject, loosened or not.
Run once with no true drop (every lossy trial passes) and once with a drop of 0.2, four
times the budget (every lossy trial fails, its speed still measured)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import run_tuner, wait_no_orphans, write_study
from tests.faultkit import FAST, SIM_ENV

pytestmark = pytest.mark.slow

BASELINE, KV, WEIGHTS, GARBAGE = ("auto", None), ("fp8", None), ("auto", "fp8"), ("fp8", "fp8")
BUDGET = 0.05


def _study(tmp_path: Path, drop: float) -> tuple[Path, str]:
    updates: dict[str, Any] = dict(FAST)
    updates.update({
        "probe.reference.enabled": True,
        # A reference job answering 200 quality items and trials asking up to 200 on two
        # shared cores: a minute each is ample on an idle box, two leave room on a busy one.
        "budget.trial_timeout": "120s",
        "budget.n_trials": 4,
        "parameters": [
            {"name": "kv_cache_dtype", "flag": "kv_cache_dtype", "kind": "categorical",
             "values": ["auto", "fp8"], "default": "auto"},
            {"name": "quantization", "flag": "quantization", "kind": "categorical", "values": [None, "fp8"]},
        ],
        "baseline": {"kv_cache_dtype": "auto", "quantization": None},
        "quality": {"max_accuracy_drop": BUDGET, "items": 100, "max_items": 200},
        "objectives": [{"metric": "output_tok_s", "concurrency": "max", "direction": "maximize"},
                       {"metric": "accuracy_drop", "direction": "minimize"}],
    })
    faults = [{"fault": "garbage", "when": {"kv_cache_dtype": "fp8", "quantization": "fp8"}}]
    return write_study(tmp_path, updates=updates,
                       env={**SIM_ENV, "TUNER_SIM_FAULTS": json.dumps(faults), "TUNER_SIM_LOSSY_DROP": drop})


@pytest.fixture(scope="module", params=[0.0, 0.2], ids=["no-drop", "drop-0.2"])
def study(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp_path = tmp_path_factory.mktemp("quality-study")
    path, marker = _study(tmp_path, request.param)
    results = tmp_path / "results"
    out = run_tuner("run", str(path), "--results", str(results), timeout=900)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-3000:]
    name = path.stem
    status = run_tuner("status", name, "--results", str(results), "--json")
    assert status.returncode == 0, status.stderr
    text = run_tuner("status", name, "--results", str(results))
    assert text.returncode == 0, text.stderr
    rows = {(r["params"]["kv_cache_dtype"], r["params"].get("quantization")): r
            for r in json.loads(status.stdout)["trials"]}
    assert set(rows) == {BASELINE, KV, WEIGHTS, GARBAGE}, rows
    root = results / name
    outcomes = {point: json.loads((root / "trials" / f"{row['trial']:04d}" / "outcome.json").read_text())
                for point, row in rows.items()}
    yield {"drop": request.param, "root": root, "rows": rows, "outcomes": outcomes, "text": text.stdout,
           "out": out.stdout}
    assert not wait_no_orphans(marker, timeout=5), "orphan simulator processes"


def test_the_reference_answers_the_quality_items_once(study: dict) -> None:
    recorded = json.loads((study["root"] / "quality_reference.json").read_text())
    answers = recorded["answers"]
    assert len(answers) == 200 and len({a["id"] for a in answers}) == 200
    assert all(set(a) >= {"id", "prompt_hash", "right"} for a in answers)
    assert sum(a["right"] for a in answers) / 200 >= 0.5
    assert "[reference] quality items:" in study["out"]


def test_the_lossless_baseline_runs_no_gate_and_loses_nothing(study: dict) -> None:
    row, outcome = study["rows"][BASELINE], study["outcomes"][BASELINE]
    assert row["outcome"] == "feasible" and outcome["probe_passed"] is True
    assert outcome["quality"] is None and row["quality"] is None
    assert row["values"]["accuracy_drop"] == 0.0


@pytest.mark.parametrize("point", [KV, WEIGHTS], ids=["fp8-kv", "fp8-weights"])
def test_lossy_trials_are_judged_by_their_true_drop(study: dict, point: tuple) -> None:
    row, outcome = study["rows"][point], study["outcomes"][point]
    # The loosened corruption rule lets fp8's near-tie flips through; the gate decides.
    assert outcome["probe_passed"] is True, outcome["probe_reason"]
    quality = outcome["quality"]
    assert quality is not None and quality["budget"] == BUDGET
    assert set(quality["lossy"]) == ({"kv_cache_dtype"} if point == KV else {"quantization"})
    assert quality["probe_s"] > 0 and outcome["probe_s"] >= quality["probe_s"]
    assert quality["drop_low"] <= quality["drop"] <= quality["drop_high"]
    # Its speed is measured and kept whatever the verdict.
    assert row["values"].get("output_tok_s@cmax", 0) > 0, row["values"]
    assert row["values"]["accuracy_drop"] == pytest.approx(quality["drop"])
    if study["drop"] == 0.0:
        assert quality["verdict"] == "pass" and row["outcome"] == "feasible"
        assert quality["drop"] == 0.0 and quality["drop_high"] <= BUDGET and quality["looks"] == 1
    else:
        assert quality["verdict"] == "fail" and row["outcome"] == "quality_failed"
        assert quality["drop_low"] > BUDGET and not quality["decided_at_cap"]
        assert quality["drop"] == pytest.approx(0.2, abs=0.1)


def test_garbage_is_still_probe_failed_under_the_budget(study: dict) -> None:
    row, outcome = study["rows"][GARBAGE], study["outcomes"][GARBAGE]
    assert row["outcome"] == "probe_failed", row
    assert outcome["probe_passed"] is False and outcome["quality"] is None


def test_status_shows_each_gated_trial_verdict_drop_and_bound(study: dict) -> None:
    word = "PASS" if study["drop"] == 0.0 else "FAIL"
    lines = [line for line in study["text"].splitlines() if line.strip().startswith("quality ")]
    assert len(lines) == 2, study["text"]
    assert all(line.strip().startswith(f"quality {word}: drop ") and f"budget {100 * BUDGET:.1f} pts" in line
               for line in lines), lines
    if word == "FAIL":
        assert study["text"].count("quality_failed") >= 2


def test_a_reference_below_min_reference_accuracy_stops_the_study_before_any_trial(
        tmp_path: Path, orphan_check: list[str]) -> None:
    # The simulator's reference answers about 0.88 of the items right: a floor of 0.99 refuses it.
    path, marker = _study(tmp_path, 0.0)
    data = yaml.safe_load(path.read_text())
    data["quality"]["min_reference_accuracy"] = 0.99
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    orphan_check.append(marker)
    results = tmp_path / "results"
    out = run_tuner("run", str(path), "--results", str(results), timeout=600)
    assert out.returncode == 3, out.stdout[-3000:] + out.stderr[-3000:]
    assert "of the 200 quality items right, below quality.min_reference_accuracy 0.99" in out.stderr
    root = results / path.stem
    assert len(json.loads((root / "quality_reference.json").read_text())["answers"]) == 200  # the evidence
    assert not list((root / "trials").glob("*/command.json")), "a trial ran against a reference refused"
