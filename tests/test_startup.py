"""Startup broken down by phase from real server logs (vLLM 0.26.0 on an H200, the 0.32.0 CPU
build), the KV-cache and graph-capture figures they state, and how status shows them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tuner.adapters.artifacts import StudyPaths
from tuner.study.trials import TrialRecord
from tuner.views.status import _startup_summary, _trial_row, format_status
from tuner.vllm.log_digest import read_log
from tuner.vllm.startup import PHASES, StartupRecord, figures_text, median_phases, summary_text

LOGS = Path(__file__).parent / "fixtures" / "vllm_logs"
H200 = LOGS / "h200-0.26.0"
CPU = LOGS / "cpu-0.32.0"


def _log(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def test_h200_compiled_start_by_phase() -> None:
    # cudagraph-full_and_piecewise.log: banner 09:59:24, engine 09:59:39, "Model loading took"
    # 09:59:42, "torch.compile took 14.32 s" 09:59:56, KV cache size 09:59:58, "Graph capturing
    # finished" 10:00:01, init engine 10:00:13, "Starting vLLM server" 10:00:14.
    rec = read_log(_log(H200 / "cudagraph-full_and_piecewise.log")).startup(first_line_s=19.6, ready_s=70.3)
    assert rec.phases == {"imports": 19.6, "api_config": 0.0, "engine_spawn": 15.0, "weights": 3.0,
                          "compile": 14.0, "kv_cache": 2.0, "graph_capture": 3.0, "warmup": 12.0,
                          "api_start": 1.0, "serve": pytest.approx(0.7)}
    assert list(rec.phases) == [p for p in PHASES if p in rec.phases]
    assert sum(rec.phases.values()) == pytest.approx(70.3)
    assert rec.complete and rec.reached == "serve" and rec.tail_s is None
    assert (rec.kv_cache_tokens, rec.kv_cache_gib) == (3_226_544, 69.23)
    assert (rec.max_concurrency, rec.max_concurrency_tokens) == (787.73, 4096)
    assert (rec.graph_capture_s, rec.graph_capture_gib) == (3.0, 0.39)
    assert (rec.weights_gib, rec.weights_s) == (0.26, 1.460361)
    assert (rec.compile_cache, rec.compile_s, rec.init_engine_s) == ("miss", 14.32, 31.93)


def test_h200_eager_start_has_no_compile_and_no_graphs() -> None:
    rec = read_log(_log(H200 / "eager.log")).startup(first_line_s=20.0, ready_s=76.5)
    assert "compile" not in rec.phases and "graph_capture" not in rec.phases
    # The API server took 19 s between its arguments and "Resolved architecture" here (the
    # first start after the box came up), then the engine process 16 s to log.
    assert (rec.phases["api_config"], rec.phases["engine_spawn"]) == (19.0, 16.0)
    assert (rec.phases["weights"], rec.phases["kv_cache"], rec.phases["warmup"]) == (3.0, 4.0, 13.0)
    assert rec.kv_cache_tokens == 3_228_912 and rec.graph_capture_s is None
    assert rec.compile_cache == "none" and rec.complete


def test_h200_speculative_start_reads_the_v1_runner_lines() -> None:
    rec = read_log(_log(H200 / "spec-ngram-k4.log")).startup()
    assert (rec.weights_gib, rec.weights_s) == (0.25, 0.341225)   # "... GiB memory and ... seconds"
    assert rec.kv_cache_tokens == 3_152_720 and rec.graph_capture_gib == 0.33
    # The V1 runner (n-gram) warms up in about a second where the V2 runner takes 12-14 s.
    assert rec.phases["warmup"] == 1.0 and rec.phases["kv_cache"] == 10.0
    assert "imports" not in rec.phases and "serve" not in rec.phases   # no launcher figures given


@pytest.mark.parametrize("name", ["cudagraph-full.log", "cudagraph-full_decode_only.log",
                                  "cudagraph-piecewise.log"])
def test_every_real_compiled_h200_start_is_complete(name: str) -> None:
    rec = read_log(_log(H200 / name)).startup(first_line_s=20.0, ready_s=90.0)
    assert rec.complete and rec.compile_cache == "miss"
    assert all(rec.phases.get(p) is not None for p in PHASES)
    assert rec.graph_capture_s in (2.0, 3.0) and rec.kv_cache_tokens == 3_226_544


def test_cpu_build_compiled_start() -> None:
    rec = read_log(_log(CPU / "compiled.log")).startup(first_line_s=30.0, ready_s=210.0)
    # The CPU build compiles while "Warming up model for the compilation..." (no torch.compile
    # total line), sizes its KV cache from VLLM_CPU_KVCACHE_SPACE and captures no graphs.
    assert rec.phases["compile"] == 140.0 and "graph_capture" not in rec.phases
    assert (rec.kv_cache_tokens, rec.kv_cache_gib) == (46_592, 2.0)
    assert (rec.max_concurrency, rec.max_concurrency_tokens) == (22.75, 2048)
    assert rec.weights_s == 0.46 and rec.weights_gib is None
    assert rec.complete


def test_phases_add_up_to_the_measured_start_despite_whole_second_stamps() -> None:
    # The log spans 176 s of whole-second stamps after its first line; measured: 30 s to the
    # first line, ready 200 s after the spawn. The 6 s the stamps overstate come off the
    # longest phase (compile), so the phases still add up to what was measured.
    rec = read_log(_log(CPU / "compiled.log")).startup(first_line_s=30.0, ready_s=200.0)
    assert rec.phases["serve"] == 0.0 and rec.phases["compile"] == 134.0
    assert sum(rec.phases.values()) == pytest.approx(200.0)
    exact = read_log(_log(CPU / "compiled.log")).startup(first_line_s=30.0, ready_s=210.0)
    assert exact.phases["compile"] == 140.0 and exact.phases["serve"] == pytest.approx(4.0)
    assert sum(exact.phases.values()) == pytest.approx(210.0)


def test_failed_starts_say_how_far_they_got() -> None:
    memory = read_log(_log(H200 / "fail-gpu-memory-utilization.log")).startup(first_line_s=19.0)
    assert not memory.complete and memory.reached == "engine_spawn" and memory.tail_s == 1.0
    assert memory.kv_cache_tokens is None
    text = summary_text(memory.to_json())
    assert text.startswith("startup (never ready): imports 19 + config 0 + engine process 15")
    assert text.endswith("log ends 1s after engine process")
    # Rejected while parsing arguments: no logger line at all, only the launcher's clock.
    bogus = read_log(_log(H200 / "fail-bad-cudagraph-mode.log")).startup(first_line_s=None)
    assert bogus.phases == {} and bogus.reached is None and not bogus.complete


def test_a_log_cut_short_while_compiling() -> None:
    text = _log(H200 / "cudagraph-piecewise.log")
    cut = text[: text.rindex("\n", 0, text.index("Compiling a graph for compile range")) + 1]
    rec = read_log(cut).startup(first_line_s=20.0, ready_s=None)
    assert rec.reached == "weights" and not rec.complete
    assert rec.tail_s == 12.0   # 10:01:12 "Model loading took" -> 10:01:24 last line


def test_summary_and_figures_text() -> None:
    rec = read_log(_log(H200 / "cudagraph-full_and_piecewise.log")).startup(first_line_s=19.6, ready_s=70.3).to_json()
    assert summary_text(rec) == ("startup 70.3s = imports 19.6 + config 0 + engine process 15 + weights 3 + "
                                 "compile 14 + KV cache 2 + graphs 3 + warm-up 12 + API 1 + ready 0.7 "
                                 "(torch.compile cache miss)")
    assert figures_text(rec) == ("KV cache 3,226,544 tokens (69.23 GiB, 787.73x at 4,096 tokens), "
                                 "graph capture 3 s (0.39 GiB)")
    assert StartupRecord.from_json(rec) == StartupRecord(**rec)
    assert figures_text(read_log(_log(H200 / "fail-spec-mtp-unsupported.log")).startup().to_json()) is None


def test_median_phases_count_a_missing_phase_as_zero() -> None:
    compiled = read_log(_log(H200 / "cudagraph-full_and_piecewise.log")).startup(first_line_s=20.0, ready_s=71.0)
    eager = read_log(_log(H200 / "eager.log")).startup(first_line_s=20.0, ready_s=77.0)
    failed = read_log(_log(H200 / "fail-gpu-memory-utilization.log")).startup(first_line_s=20.0)
    med = median_phases([compiled.to_json(), eager.to_json(), failed.to_json()])
    assert med["total"] == 74.0 and med["compile"] == 7.0 and med["imports"] == 20.0
    assert median_phases([failed.to_json()]) == {}


def _row(number: int, rec: StartupRecord, paths: StudyPaths, **outcome: Any) -> dict[str, Any]:
    record = TrialRecord(number=number, state="COMPLETE", kind="run", params={"m": number},
                         values={"tok_s": 1.0},
                         attrs={"outcome": {"startup": rec.to_json(), "startup_s": rec.total_s, **outcome}})
    return _trial_row(record, paths)


def test_status_shows_each_trials_startup_and_the_median(tmp_path: Path) -> None:
    paths = StudyPaths(tmp_path / "s")
    miss = read_log(_log(H200 / "cudagraph-full_and_piecewise.log")).startup(first_line_s=19.6, ready_s=70.3)
    eager = read_log(_log(H200 / "eager.log")).startup(first_line_s=20.0, ready_s=77.0)
    rows = [_row(0, miss, paths, trial_s=100.0), _row(1, eager, paths, trial_s=120.0, gpu_wait_s=4.2)]
    records = [TrialRecord(number=i, state="COMPLETE", kind="run", params={}, attrs={"outcome": {
        "startup": r.to_json(), "startup_s": r.total_s, "trial_s": t}})
        for i, (r, t) in enumerate(((miss, 100.0), (eager, 120.0)))]
    status = {"study": "s", "running_now": False, "target_trials": 2, "finished_trials": 2,
              "outcomes": {"feasible": 2}, "failures": {}, "running": [],
              "skipped": {"duplicate": 0, "forbidden": 0}, "elapsed_s": 220.0, "time_left_s": None,
              "objectives": [{"label": "tok_s", "direction": "maximize"}], "baseline": None,
              "front": [], "trials": rows, "startup": _startup_summary(records)}
    text = format_status(status).splitlines()
    assert "  startup: median 73.7s over 2 server(s), 67% of trial time, torch.compile cache 1 miss" in text
    phases = "    median phases (s): imports 19.8 + config 9.5 + engine process 15.5"
    assert any(line.startswith(phases) for line in text)
    at = text.index("        " + summary_text(miss.to_json()))
    assert text[at + 1] == "          " + figures_text(miss.to_json())
    assert "          waited 4.2s for the GPUs before starting" in text


TUNER_H200 = LOGS / "h200-0.26.0-tuner"


def test_h200_cache_hit_start_recorded_by_the_tuner() -> None:
    # A FULL_AND_PIECEWISE server started by `tuner run` on the H200 after the same key had
    # been compiled into the study's cache dir: "Directly load the compiled graph(s) ... from
    # the cache", torch.compile 5.83 s (14.32 s on the miss above) and a 1 s warm-up where
    # the miss spent 12 s. The tuner's records of that start lie beside the log (README):
    # the launcher's two clock figures go in, and the parse must give the record back.
    hit = TUNER_H200 / "cudagraph-full_and_piecewise-cache-hit"
    recorded = json.loads(hit.with_suffix(".startup.json").read_text())
    assert (round(recorded["first_line_s"], 3), round(recorded["total_s"], 3)) == (20.389, 63.567)
    text = _log(hit.with_suffix(".log"))
    rec = read_log(text).startup(first_line_s=recorded["first_line_s"], ready_s=recorded["total_s"])
    assert rec.to_json() == recorded
    assert read_log(text).compile_record().to_json() == json.loads(hit.with_suffix(".compile_cache.json").read_text())
    assert (rec.compile_cache, rec.compile_s) == ("hit", 5.83)
    assert rec.phases["compile"] == 6.0 and rec.phases["warmup"] == 1.0
    assert rec.complete and sum(rec.phases.values()) == pytest.approx(63.567)
    assert (rec.kv_cache_tokens, rec.kv_cache_gib) == (3_228_880, 69.28)
    assert (rec.graph_capture_s, rec.graph_capture_gib) == (5.0, 0.39)


def test_h200_eager_starts_recorded_by_the_tuner() -> None:
    for name in ("reference-eager.log", "eager-hf-overrides-rope.log"):
        rec = read_log(_log(TUNER_H200 / name)).startup()
        assert rec.compile_cache == "none" and rec.graph_capture_s is None, name
        assert "compile" not in rec.phases and rec.kv_cache_tokens is not None, name


LEVERS_H100 = LOGS / "h100-0.26.0-levers"


@pytest.mark.parametrize("name", ["spare-cache-hit", "spare-cache-miss", "cold-cache-hit"])
def test_h100_starts_with_and_without_the_levers_add_up(name: str) -> None:
    """Real starts recorded by the tuner on an H100 (the fixture's README): the log parses back
    into the record the worker wrote, and the phases add up to the start it measured."""
    recorded = json.loads((LEVERS_H100 / f"{name}.startup.json").read_text())
    outcome = json.loads((LEVERS_H100 / f"{name}.outcome.json").read_text())
    text = _log(LEVERS_H100 / f"{name}.server.log")
    rec = read_log(text).startup(first_line_s=recorded["first_line_s"], ready_s=recorded["total_s"],
                                 overlapped_s=recorded.get("overlapped_s"))
    # The box's worker wrote "overlapped_s": null where no spare served; records now leave it out.
    assert rec.to_json() == {k: v for k, v in recorded.items() if v is not None or k != "overlapped_s"}
    assert rec.complete and recorded["total_s"] == outcome["startup_s"]
    assert sum(rec.phases.values()) == pytest.approx(outcome["startup_s"], abs=0.01)
    spare = outcome["prestart"]
    if name.startswith("spare"):
        # The imports the spare did ahead are in the start, not in what the trial waited.
        assert spare["used"] and rec.overlapped_s == spare["import_s"] > 15
        assert outcome["start_wait_s"] == pytest.approx(outcome["startup_s"] - spare["import_s"])
        assert rec.phases["imports"] == pytest.approx(spare["import_s"], abs=1.0)
        assert rec.phases["warmup"] <= 1.0   # the study's Triton cache: no kernel re-compiled
    else:
        assert spare is None and outcome["start_wait_s"] is None and rec.overlapped_s is None
        assert rec.phases["warmup"] == 13.0   # torch.compile's per-process Triton cache: recompiled


def test_h100_startup_plan_changed_the_kv_cache() -> None:
    """Why VLLM_ENABLE_STARTUP_PLAN is no lever: the re-used memory profile gave the cache-hit
    server 3.6 % fewer KV-cache tokens than a fresh profile of the same configuration."""
    planned = read_log(_log(LEVERS_H100 / "spare-cache-hit.server.log")).startup()
    fresh = read_log(_log(LEVERS_H100 / "cold-cache-hit.server.log")).startup()
    assert "Applying persisted startup plan" in _log(LEVERS_H100 / "spare-cache-hit.server.log")
    assert (planned.kv_cache_tokens, fresh.kv_cache_tokens) == (257_904, 267_504)
