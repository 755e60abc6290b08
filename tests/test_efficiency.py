"""Per-GPU and per-dollar figures at every level (issue 40): the derivation by hand, the
cost: section's refusals, and a real `tuner run` on the simulator whose objectives are
usd_per_mtok and output_tok_s_per_gpu, carried to the trial records, the front and status."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, run_tuner, wait_no_orphans, write_study
from tuner.errors import SpecError
from tuner.load.efficiency import EFFICIENCY_KEYS, Holding, efficiency_flat
from tuner.study.cost import trial_holding
from tuner.study.study_file import parse_study

DEMO = yaml.safe_load((ROOT / "search_spaces" / "demo.yaml").read_text())


def test_the_figures_follow_from_the_throughput_and_its_interval() -> None:
    flat = {"output_tok_s": 4000.0, "output_tok_s.ci95": 80.0, "output_tok_s.n": 12.0}
    out = efficiency_flat(flat, Holding(gpus=8, usd_per_hour=8 * 2.49))
    assert out["output_tok_s_per_gpu"] == 500.0 and out["output_tok_s_per_gpu.ci95"] == 10.0
    # $19.92 an hour for 4,000 tok/s: 19.92 / 3600 / 4000 * 1e6 = $1.3833 per million tokens.
    assert out["usd_per_mtok"] == pytest.approx(1.383333, rel=1e-6)
    assert out["usd_per_mtok.ci95"] == pytest.approx(1.383333 * 0.02, rel=1e-6)   # same relative width
    assert out["usd_per_mtok.n"] == out["output_tok_s_per_gpu.n"] == 12.0
    # No GPUs: no per-GPU figure; no price: no cost; no throughput: neither.
    cpu = efficiency_flat(flat, Holding(gpus=0, usd_per_hour=1.0))
    assert math.isnan(cpu["output_tok_s_per_gpu"]) and cpu["usd_per_mtok"] == pytest.approx(1 / 3600 / 4000 * 1e6)
    assert math.isnan(efficiency_flat(flat, Holding(gpus=2))["usd_per_mtok"])
    idle = efficiency_flat({"output_tok_s": 0.0, "output_tok_s.ci95": 0.0}, Holding(gpus=2, usd_per_hour=5.0))
    assert idle["output_tok_s_per_gpu"] == 0.0 and math.isnan(idle["usd_per_mtok"])
    assert set(out) == {f"{k}{s}" for k in EFFICIENCY_KEYS for s in ("", ".ci95", ".n")}


def test_a_trial_holds_its_gpus_at_the_stated_price() -> None:
    spec = parse_study(yaml.safe_dump({**DEMO, "cost": {"gpu_hour": 2.5}}), "x.yaml")
    assert spec.holding == Holding(gpus=8, usd_per_hour=20.0)
    node = parse_study(yaml.safe_dump({**DEMO, "cost": {"node_hour": 30}}), "x.yaml")
    assert node.holding == Holding(gpus=8, usd_per_hour=30.0)
    assert parse_study(yaml.safe_dump(DEMO), "x.yaml").holding == Holding(gpus=8)
    assert trial_holding(0, None) is None


@pytest.mark.parametrize(("change", "message"), [
    ({"cost": {"gpu_hour": 2.5, "node_hour": 30}}, "give exactly one of gpu_hour"),
    ({"cost": {"gpu_hour": -1}}, "cost.gpu_hour"),
    ({"cost": {"usd": 3}}, "cost: unknown key 'usd'; allowed: gpu_hour, node_hour"),
    ({"objectives": [{"metric": "usd_per_mtok", "direction": "minimize"}]}, "usd_per_mtok needs a cost: section"),
    ({"server": {**DEMO["server"], "gpus_per_trial": 0},
      "objectives": [{"metric": "output_tok_s_per_gpu", "direction": "maximize"}]},
     "output_tok_s_per_gpu needs GPUs, and server.gpus_per_trial is 0"),
    ({"server": {**DEMO["server"], "gpus_per_trial": 0}, "cost": {"gpu_hour": 2.5}},
     "cost.gpu_hour: a trial holds no GPUs"),
])
def test_bad_cost_input_is_refused_before_any_server_starts(change: dict, message: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_study(yaml.safe_dump({**DEMO, **change}), "x.yaml")
    assert message in str(caught.value)


@pytest.mark.slow
def test_a_study_searches_on_cost_and_per_gpu_throughput(tmp_path: Path) -> None:
    path, marker = write_study(tmp_path, updates={
        "budget.n_trials": 3, "cost": {"gpu_hour": 2.49},
        "objectives": [{"metric": "usd_per_mtok", "concurrency": "max", "direction": "minimize"},
                       {"metric": "output_tok_s_per_gpu", "concurrency": 1, "direction": "maximize"}],
        "limits": [{"metric": "usd_per_mtok", "concurrency": "max", "max": 1000.0}]})
    results = tmp_path / "results"
    try:
        run = run_tuner("run", str(path), "--results", str(results), timeout=900)
        assert run.returncode == 0, run.stderr[-3000:]
        name = path.stem
        status = json.loads(run_tuner("status", name, "--results", str(results), "--json").stdout)
        trials = [t for t in status["trials"] if t.get("state") == "COMPLETE" and t.get("outcome") == "feasible"]
        assert trials, status["outcomes"]
        for trial in trials:
            levels = json.loads((results / name / "trials" / f"{trial['trial']:04d}" / "outcome.json")
                                .read_text())["levels"]
            for level in levels.values():
                tok = level["output_tok_s"]
                assert level["output_tok_s_per_gpu"] == pytest.approx(tok / 8)
                assert level["usd_per_mtok"] == pytest.approx(8 * 2.49 / 3600 / tok * 1e6)
                assert level["usd_per_mtok.ci95"] == pytest.approx(
                    level["usd_per_mtok"] * level["output_tok_s.ci95"] / tok)
            values = trial["values"]
            top = levels[str(max(int(c) for c in levels))]
            assert values["usd_per_mtok@cmax"] == pytest.approx(top["usd_per_mtok"])
            assert values["output_tok_s_per_gpu@c1"] == pytest.approx(levels["1"]["output_tok_s_per_gpu"])
        front = json.loads((results / name / "pareto.json").read_text())["front"]
        assert front and all("usd_per_mtok@cmax" in entry["values"] for entry in front)
        text = run_tuner("status", name, "--results", str(results)).stdout
        assert "usd_per_mtok@cmax=" in text and "output_tok_s_per_gpu@c1=" in text
    finally:
        assert not wait_no_orphans(marker)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
