"""benchmarks/level_stability.py end to end on the simulator (one fresh start, one level):
the script the lead runs on the H200 must keep working as the tuner's modules move."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from tests.conftest import ROOT


def _bench():  # type: ignore[no-untyped-def]
    """benchmarks/level_stability.py as a module (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location(
        "level_stability", ROOT / "benchmarks" / "level_stability.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_level_stability_runs_both_arms_and_writes_the_figures(tmp_path: Path) -> None:
    bench = _bench()
    out = tmp_path / "ls.json"
    cpus = sorted(os.sched_getaffinity(0))
    mine = os.sched_getaffinity(0)
    try:
        rc = bench.main(["--study", str(ROOT / "search_spaces" / "demo.yaml"), "--starts", "2",
                         "--levels", "1", "--after", "min_window_s=0.5", "max_level_seconds=20",
                         "--repeats", "2", "--server-cpus", str(cpus[0]),
                         "--client-cpus", str(cpus[-1]), "--out", str(out)])
        assert os.sched_getaffinity(0) == {cpus[-1]}, "the load generator runs on its CPUs"
    finally:
        os.sched_setaffinity(0, mine)
    assert rc == 0
    data = json.loads(out.read_text())
    assert [s["order"] for s in data["starts"]] == [["before", "after", "after"],
                                                    ["after", "before", "after"]]
    assert data["server_cpus"] == [cpus[0]] and data["client_cpus"] == [cpus[-1]]
    # Every start ran the after arm twice: the within-start spread is a number.
    assert all(len(s["arms"]["after_repeats"]) == 1 for s in data["starts"])
    assert data["summary"]["after_within_start_cv"]["output_tok_s"]["1"] is not None
    assert data["specs"]["before"]["sizing"] == "requests"
    assert data["specs"]["before"]["requests_per_stream"] == 2            # the study's own
    assert data["specs"]["after"]["sizing"] == "steady"
    for arm in ("before", "after"):
        lv = data["summary"][arm]["levels"]["1"]
        assert len(lv["output_tok_s"]["values"]) == 2 and lv["output_tok_s"]["cv"] is not None
        assert lv["tpot_ms_p50"]["mean"] > 0
    assert data["summary"]["load_time_ratio"] > 0
    assert data["machine"]["loadavg_1m_before"] >= 0


def _run_json(path: Path, tok_s: float, levels: list[int]) -> dict:
    """What one --starts 1 run writes, reduced to the keys --merge and summarize read."""
    lv = {"output_tok_s": tok_s, "tpot_ms_p50": 1000 / tok_s, "unstable": False,
          "client_bound": False, "client_lag_ms_p99": 1.0}
    arm = {"duration_s": 10.0, "levels": {str(c): lv for c in levels}}
    data = {"argv": ["vllm", "--port", "41234"], "levels": levels, "specs": {"before": {}, "after": {}},
            "repeats": 1, "server_cpus": [], "client_cpus": [],
            "starts": [{"start": 0, "startup_s": 50.0, "order": ["before", "after"],
                        "arms": {"before": arm, "after": arm}}]}
    path.write_text(json.dumps(data))
    return data


def test_merge_joins_runs_of_one_configuration_and_refuses_two(tmp_path: Path) -> None:
    bench = _bench()
    _run_json(tmp_path / "a.json", 500.0, [1])
    b = _run_json(tmp_path / "b.json", 400.0, [1])
    b["argv"][-1] = "45678"                       # another port: still one configuration
    (tmp_path / "b.json").write_text(json.dumps(b))
    _run_json(tmp_path / "other.json", 450.0, [2])
    out = tmp_path / "m.json"
    assert bench.main(["--merge", str(tmp_path / "a.json"), str(tmp_path / "b.json"),
                       "--out", str(out)]) == 0
    merged = json.loads(out.read_text())
    assert [s["start"] for s in merged["starts"]] == [0, 1]
    after = merged["summary"]["after"]["levels"]["1"]["output_tok_s"]
    assert after["values"] == [500.0, 400.0] and after["cv"] == pytest.approx(0.1571, abs=1e-3)
    with pytest.raises(SystemExit, match="levels differs"):
        bench.main(["--merge", str(tmp_path / "a.json"), str(tmp_path / "other.json"),
                    "--out", str(tmp_path / "bad.json")])
