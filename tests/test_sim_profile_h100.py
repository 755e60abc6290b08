"""The llama8b-h100 simulator profile held to what the real H100 measured: the committed
d8b-h100 study (``results/examples/d8b-h100``, vLLM 0.26.0, Llama-3-8B shapes with random
weights). The simulator's ground truth of each configuration the box ran (``tuner.sim.truth``:
the study's own requests through the profile's model, no process) must land within 10 % of
what the box's trial files say: output tok/s at c=32 and TPOT at c=1 for vLLM's defaults,
every other CUDA-graph mode, NONE and eager; startup on a torch.compile miss, a hit and
eager; the KV cache. n-gram speculation is left out: on random weights its drafts were
accepted 100 % of the time, which no real model does and the profile does not try to copy."""

from __future__ import annotations

import json
import statistics
from typing import Any

import pytest

from tests.conftest import ROOT
from tuner.sim.profile import builtin_profiles, load_profile
from tuner.sim.truth import Evaluator
from tuner.sim.truth_time import TimeModel
from tuner.sim.truth_verify import sim_start
from tuner.study.study_file import parse_study

STUDY = ROOT / "results" / "examples" / "d8b-h100"
TOLERANCE = 0.10
DEFAULTS = {"enforce_eager": False, "cudagraph_mode": "FULL_AND_PIECEWISE", "spec_method": None}
EAGER = {"enforce_eager": True, "spec_method": None}


def _mode(mode: str) -> dict[str, Any]:
    return {**DEFAULTS, "cudagraph_mode": mode}


def _runs() -> list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]:
    """(values, outcome, startup) of every server the box started: trials and re-runs."""

    out = []
    for folder in sorted([*(STUDY / "trials").iterdir(), *(STUDY / "confirm").glob("*-*")]):
        values = json.loads((folder / "command.json").read_text())["values"]
        startup = json.loads((folder / "startup.json").read_text())
        outcome_file = folder / "outcome.json"
        out.append((values, json.loads(outcome_file.read_text()) if outcome_file.is_file() else {}, startup))
    return out


RUNS = _runs()


@pytest.fixture(scope="module")
def evaluator() -> Evaluator:
    spec = parse_study((ROOT / "search_spaces" / "d8b-h100.yaml").read_text())
    return Evaluator(spec, load_profile("llama8b-h100"))


def test_the_profile_is_llama3_8b_on_one_h100() -> None:
    profile = load_profile("llama8b-h100")
    model, hw = profile.model, profile.hardware
    assert "llama8b-h100" in builtin_profiles() and profile.name == "llama8b-h100"
    assert (model.hidden_size, model.num_layers, model.num_attention_heads, model.num_experts) == (4096, 32, 32, 0)
    assert model.kv_bytes_per_token == 32 * 2 * 8 * 128 * 2 and model.default_dtype == "bfloat16"
    assert (hw.platform, hw.num_devices, hw.compute_capability, hw.interconnect) == ("cuda", 1, "9.0", "none")
    assert "H100" in hw.device_name


@pytest.mark.parametrize("values", [DEFAULTS, EAGER, _mode("NONE"), _mode("PIECEWISE"), _mode("FULL_DECODE_ONLY"),
                                    _mode("FULL")], ids=["defaults", "eager", "NONE", "PIECEWISE",
                                                         "FULL_DECODE_ONLY", "FULL"])
def test_speed_within_ten_percent_of_the_box(evaluator: Evaluator, values: dict[str, Any]) -> None:
    runs = [o for v, o, _ in RUNS if v == values and o.get("levels")]
    assert runs, f"no trial of {values} in {STUDY}"
    truth = evaluator.evaluate(values)
    assert truth.status == "completed" and truth.applied, truth
    tpot = statistics.fmean(o["levels"]["1"]["tpot_ms.mean"] for o in runs)
    assert truth.levels[1].metrics["tpot_ms.mean"] == pytest.approx(tpot, rel=TOLERANCE)
    # A trial the box stopped inside c=32 (dominated) left what it measured up to then and
    # the optimistic bound it was judged by.
    c32, bounds = [], []
    for o in runs:
        if "32" in o["levels"]:
            c32.append(o["levels"]["32"]["output_tok_s"])
        else:
            c32.append(o["early_stop"]["inside"]["output_tok_s"])
            bounds.append(o["early_stop"]["bounds"][0])
    got = truth.levels[32].metrics["output_tok_s"]
    assert got == pytest.approx(statistics.fmean(c32), rel=TOLERANCE)
    assert all(got <= bound for bound in bounds), (got, bounds)


def test_startup_and_kv_cache_within_ten_percent_of_the_box(evaluator: Evaluator) -> None:
    compiled = [(s["total_s"], s["compile_cache"]) for v, _, s in RUNS if not v.get("enforce_eager")]
    eager = [s["total_s"] for v, _, s in RUNS if v.get("enforce_eager")]
    miss = statistics.median(t for t, cache in compiled if cache == "miss")
    hit = statistics.median(t for t, cache in compiled if cache == "hit")
    prepare = TimeModel().prepare_s     # the ground truth's trial start adds it; the box's startup does not
    defaults, eager_truth = evaluator.evaluate(DEFAULTS), evaluator.evaluate(EAGER)
    assert defaults.startup_s - prepare == pytest.approx(miss, rel=TOLERANCE)
    assert defaults.startup_s - prepare - defaults.hit_saving_s == pytest.approx(hit, rel=TOLERANCE)
    assert eager_truth.startup_s - prepare == pytest.approx(statistics.median(eager), rel=TOLERANCE)
    start = sim_start(evaluator.spec, DEFAULTS, evaluator.profile)
    assert start is not None
    box_kv = next(s["kv_cache_tokens"] for v, _, s in RUNS if v == DEFAULTS)
    assert start.effective.kv_cache_tokens == pytest.approx(box_kv, rel=0.01)
