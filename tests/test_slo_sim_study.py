"""The shipped simulator SLO study end to end (search_spaces/glm5-8xpcie-slo.yaml, one
trial): `tuner run` searches max_rate@slo in every trial through the real worker, sweep
and open-loop client against the served simulator; status, the report, pareto.json and
the export show it; the found rate is within the simulator model's band around its
ground truth (tuner/sim/slo_truth.py; a short level's p90 is noisy, and the served
simulator runs on a shared machine, so the band here is 25 %: at TUNER_SIM_TIME_SCALE 0.1
a modelled 50 ms engine step is a 5 ms sleep, and on a loaded machine each sleep overshoots
by a millisecond or more, which shows as slower TPOT and a lower rate (-8 to -12 %
measured at load average 20); the 5 % check being benchmarks/slo_truth.py's)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, free_port_block, run_tuner
from tuner.sim.profile import load_profile
from tuner.sim.slo_truth import COARSE_SEEDS, model_clock, open_loop_point, true_max_rate
from tuner.sim.truth import Evaluator
from tuner.study.study_file import parse_study

# Not quiethost, although the found rate is a timing of the simulator: its band is 25 % and
# its trial deadline was the failure seen on CI beside a vLLM CPU server (before the three
# pooled runs a level below); with a real vLLM server of the realvllm lane beside it the whole
# time it passed in 288 s (2026-12-07), and it is the longest of the quiet-host tests, which
# hold up the real-vLLM lane.
pytestmark = [pytest.mark.slow]


@pytest.mark.timeout(1800)
def test_glm5_slo_study_on_the_simulator(tmp_path: Path) -> None:
    data = yaml.safe_load((ROOT / "search_spaces" / "glm5-8xpcie-slo.yaml").read_text())
    data["server"]["port"] = free_port_block(2)
    # One trial, the baseline: its rate search is what is checked against the truth, and
    # each trial costs ~4.5 min of real time (seven 12 s rate levels, two closed levels).
    data["budget"]["n_trials"] = 1
    # The search's machinery against a 25 % band, not the 5 % bar (benchmarks/slo_truth.py):
    # three pooled runs a level keep the trial near 4 min; the study's 7 overran the 600 s
    # trial deadline once on CI beside a vLLM server.
    data["load"]["rate_search"]["max_parts"] = 3
    study = tmp_path / "glm5-slo.yaml"
    study.write_text(yaml.safe_dump(data, sort_keys=False))
    results = tmp_path / "results"
    out = run_tuner("run", str(study), "--results", str(results), timeout=1500)
    assert out.returncode == 0, f"load {os.getloadavg()}\n" + out.stdout[-3000:] + out.stderr[-3000:]
    name = data["name"]
    study_dir = results / name

    spec, scale = model_clock(parse_study(study.read_text()))
    ev = Evaluator(spec, load_profile("glm5-8xpcie"))
    checked = 0
    for trial_dir in sorted((study_dir / "trials").iterdir()):
        outcome = json.loads((trial_dir / "outcome.json").read_text())
        if outcome["status"] != "completed" or outcome.get("early_stop"):
            continue
        record = outcome["max_rate"]
        assert record["status"] in ("found", "levels"), record
        assert record["levels"] <= data["load"]["rate_search"]["max_levels"]
        values = json.loads((trial_dir / "command.json").read_text()).get("values") \
            if (trial_dir / "command.json").exists() else None
        if values is None:
            continue
        point = open_loop_point(ev, values)
        assert point is not None
        # The coarse truth (8 seeds, a few percent off the 64-seed one) is plenty for a
        # 25 % band, and 10x cheaper.
        truth = true_max_rate(ev, point, spec.slo, low=spec.load.rate_search.low,
                              high=spec.load.rate_search.high, seeds=COARSE_SEEDS) / scale
        print(f"trial {trial_dir.name}: served {record['max_rate']} truth {truth:.3g}")
        assert abs(record["max_rate"] - truth) / truth <= 0.25, (record, truth, os.getloadavg())
        checked += 1
    assert checked >= 1

    status = run_tuner("status", name, "--results", str(results))
    assert "max_rate@slo" in status.stdout and "rate levels:" in status.stdout, status.stdout
    pareto = json.loads((study_dir / "pareto.json").read_text())
    assert all("max_rate" in e for e in pareto["front"])
    report = run_tuner("report", name, "--results", str(results))
    assert report.returncode == 0, report.stderr
    assert "## Latency SLO" in (study_dir / "report" / "report.md").read_text()
    export = run_tuner("export", name, "--results", str(results), "--format", "json")
    assert export.returncode == 0, export.stderr
    meta = json.loads(export.stdout)
    assert meta["slo"] == data["slo"] and meta["max_rate"]["max_rate"] > 0
