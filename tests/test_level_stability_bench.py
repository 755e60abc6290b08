"""benchmarks/level_stability.py end to end on the simulator (one fresh start, one level):
the script the lead runs on the H200 must keep working as the tuner's modules move."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from tests.conftest import ROOT


def test_level_stability_runs_both_arms_and_writes_the_figures(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location(
        "level_stability", ROOT / "benchmarks" / "level_stability.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "ls.json"
    rc = bench.main(["--study", str(ROOT / "search_spaces" / "demo.yaml"), "--starts", "2",
                     "--levels", "1", "--after", "min_window_s=0.5", "max_level_seconds=20",
                     "--out", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert [s["order"][0] for s in data["starts"]] == ["before", "after"]   # alternating
    assert data["specs"]["before"]["sizing"] == "requests"
    assert data["specs"]["before"]["requests_per_stream"] == 2            # the study's own
    assert data["specs"]["after"]["sizing"] == "steady"
    for arm in ("before", "after"):
        lv = data["summary"][arm]["levels"]["1"]
        assert len(lv["output_tok_s"]["values"]) == 2 and lv["output_tok_s"]["cv"] is not None
        assert lv["tpot_ms_p50"]["mean"] > 0
    assert data["summary"]["load_time_ratio"] > 0
    assert data["machine"]["loadavg_1m_before"] >= 0
