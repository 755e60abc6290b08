"""A whole study in real `tuner` processes on a noisy simulator (issue 15): levels sized by
time, intervals and the unstable flag in status, pareto.json, export and the HTML report
(rendered in headless Chromium), and ``confirm.tie_runs`` spending fresh-server repeats on
candidates noise cannot tell apart.

Three configurations that differ only in ``--max-num-seqs`` (256/258/260: no difference at
these levels) are the same configuration three times: any gap between them is noise, so
they must come out tied, never as a winner: on two shared cores fresh starts of one
configuration differ by ~10 %, which one run's sub-windows do not see, so the study states
that between-start noise (``load.noise_floor``). The simulator also jitters throughput
(+-40 % every 50 ms).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, needs_chromium, render_in_chromium, tuner_argv, wait_no_orphans, write_study
from tuner.sim.profile import PROFILE_DIR

pytestmark = pytest.mark.slow


def _tuner(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(tuner_argv(*args), cwd=ROOT, capture_output=True, text=True,
                          timeout=900, env=dict(os.environ))


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("noise-study")
    profile = yaml.safe_load((PROFILE_DIR / "tiny-cpu.yaml").read_text())
    profile["noise"] = {"throughput_jitter": 0.4, "jitter_period_s": 0.05}
    (tmp / "noisy.yaml").write_text(yaml.safe_dump(profile))
    path, marker = write_study(tmp, updates={
        "server.model": "/models/smol", "server.served_model_name": "smol",
        "server.flags": {}, "server.gpus_per_trial": 0,
        "parameters": [{"name": "case", "flag": "max_num_seqs", "kind": "categorical",
                        "values": [256, 258, 260], "default": 256}],
        "forbidden": [],
        "load": {"concurrency": [1, 2], "sizing": "steady", "min_window_s": 1.0,
                 "stability_subwindows": 4, "min_requests": 4, "max_level_seconds": 8,
                 # Two shared cores: fresh starts of one configuration differ by ~10 %.
                 "noise_floor": 0.08,
                 "workload": {"classes": [{"name": "chat", "kind": "open_ended",
                                           "prompt_tokens": 32, "output_tokens": 24}]}},
        "probe.enabled": False,
        "budget": {"n_trials": 3, "trial_timeout": "2m"},
        "sampler": {"name": "grid", "seed": 0},
        "confirm": {"candidates": 1, "repeats": 1, "tolerance": 0.9, "tie_runs": 2},
    }, env={"TUNER_SIM_PROFILE": str(tmp / "noisy.yaml"), "TUNER_SIM_TIME_SCALE": 0.5,
            "TUNER_SIM_STARTUP_SCALE": 0.002})
    data = yaml.safe_load(path.read_text())
    data["server"]["env"].pop("VLLM_ALLREDUCE_USE_FLASHINFER", None)
    data["server"]["env"].pop("VLLM_ALLREDUCE_USE_SYMM_MEM", None)
    data.pop("probe", None)
    data["probe"] = {"enabled": False}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    results = tmp / "results"
    began = time.monotonic()
    out = _tuner("run", str(path), "--results", str(results))
    print(out.stdout[-6000:], out.stderr[-3000:], f"\nstudy took {time.monotonic() - began:.1f}s")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    yield {"name": path.stem, "results": results, "root": results / path.stem, "out": out}
    assert not wait_no_orphans(marker, timeout=5), "orphan simulator processes"


def test_pareto_json_carries_intervals_and_ties(study: dict) -> None:
    pareto = json.loads((study["root"] / "pareto.json").read_text())
    assert pareto["front"]
    for entry in pareto["front"]:
        assert set(entry["noise"]) == set(entry["values"])
        assert all(v is not None and v > 0 for v in entry["noise"].values()), entry
        assert "unstable" in entry and "samples" in entry
    # The same configuration three times: whatever was measured best is tied, not a winner.
    tied = {n for t in pareto["ties"] for n in t["trials"]}
    assert tied, pareto["ties"]
    assert {e["trial"] for e in pareto["front"]} & tied


def test_tie_runs_spent_and_recorded(study: dict) -> None:
    ties = json.loads((study["root"] / "confirm" / "ties.json").read_text())
    assert ties["budget_runs"] == 2 and 1 <= ties["spent_runs"] <= 2
    assert ties["ties_at_start"]
    # The re-runs joined the candidates' confirmation verdicts.
    reruns = [p for p in (study["root"] / "confirm").iterdir() if p.is_dir()]
    assert len(reruns) >= 1 + ties["spent_runs"] - 1
    assert "[ties]" in study["out"].stdout


def test_status_and_export_show_the_noise(study: dict) -> None:
    status = _tuner("status", study["name"], "--results", str(study["results"]))
    assert status.returncode == 0, status.stderr
    assert "±" in status.stdout and "tie: trials" in status.stdout, status.stdout
    exported = _tuner("export", study["name"], "--results", str(study["results"]),
                      "--pick", "best-throughput", "--format", "json", "--force")
    assert exported.returncode == 0, exported.stderr
    meta = json.loads(exported.stdout)
    assert all(v is not None for v in meta["noise"].values()) and "ties" in meta


@needs_chromium
def test_report_shows_intervals_ties_and_spend_in_chromium(study: dict, tmp_path: Path) -> None:
    out_dir = tmp_path / "report"
    out = _tuner("report", study["name"], "--results", str(study["results"]), "-o", str(out_dir))
    assert out.returncode == 0, out.stdout + out.stderr
    dom, console = render_in_chromium(out_dir / "report.html", tmp_path / "profile")
    assert not console, console
    assert "±" in dom and 'id="ties"' in dom and "within noise" in dom
    assert 'id="tie-runs"' in dom and "extra fresh-server runs spent" in dom
