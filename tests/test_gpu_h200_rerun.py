"""The H200 study re-run after the probe fix (``results/examples/smollm2-h200-run3``, vLLM 0.26.0,
SmolLM2-135M bfloat16, 2026-12-02), read back through the tuner's own parsers and rules.

The folder is the study as the box wrote it (raw request files and ``optuna.db`` left out),
so every figure asserted here is one the tuner recorded or printed there; a parser or rule
that reads the real text differently fails here. The first run of the same study, on another
H200, is ``results/examples/smollm2-h200-run1`` (and ``test_gpu_h200_run.py``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.gpu_records import rejudged, reparsed_startup, server_log
from tuner.study.study_file import parse_study
from tuner.vllm.compile_cache import parse_compile_log
from tuner.vllm.effective_config import parse_effective_config
from tuner.vllm.startup import median_phases, summary_text

ROOT = Path(__file__).resolve().parent.parent
STUDY = ROOT / "results" / "examples" / "smollm2-h200-run3"
RUN1 = ROOT / "results" / "examples" / "smollm2-h200-run1"
TRIALS = STUDY / "trials"
RERUN = STUDY / "confirm" / "0002-1"
# Trial folders by what they ran (trial 7 was a duplicate proposal, told again and not run).
EAGER, FAP, FDO, PIECEWISE, FULL, NONE, NGRAM = (TRIALS / f"000{i}" for i in range(7))


def _json(path: Path) -> Any:
    return json.loads(path.read_text())


# ----------------------------------------------------------------------------- the probe


def test_the_saved_spec_leaves_the_exact_answer_rule_unset() -> None:
    # run1 judged trials with the spec loaded back from spec.yaml, where the exact-answer
    # rule looked "set by the study" and failed two correct modes at 0.66; the same file
    # must now load with the rule unset, and the box recorded the bank's bar of 0.
    spec = parse_study((STUDY / "spec.yaml").read_text(), "spec.yaml")
    assert spec.probe.reference.min_exact_fraction is None
    for trial in (FAP, FDO):
        assert _json(trial / "probe.json")["reference"]["thresholds"]["min_exact_fraction"] == 0.0
    assert _json(RUN1 / "trials" / "0001" / "probe.json")["reference"]["thresholds"][
        "min_exact_fraction"] == 0.66


@pytest.mark.parametrize(("trial", "exact_at_32"), [(FAP, 20), (FDO, 21)])
def test_full_graph_modes_pass_on_near_ties_the_old_rule_would_have_failed(trial: Path,
                                                                          exact_at_32: int) -> None:
    ref = _json(trial / "probe.json")["reference"]
    assert ref["passed"] and ref["reason"] == "ok" and ref["corrupt"] == []
    top = ref["levels"][0]
    assert (top["concurrency"], top["exact"], top["prompts"]) == (32, exact_at_32, 32)
    # Below the template probe's 66 % bar (run1's false alarm), yet nothing far or corrupt:
    # every divergence is a near tie, which is numerics.
    assert top["exact_fraction"] < 0.66
    assert all(level["far"] == 0 and level["corrupt"] == 0 for level in ref["levels"])
    assert _json(trial / "outcome.json")["probe_passed"] is True


def test_full_mode_fails_for_corruption_with_the_evidence() -> None:
    probe = _json(FULL / "probe.json")
    ref = probe["reference"]
    assert not probe["passed"] and not ref["passed"]
    assert sum(level["corrupt"] for level in ref["levels"]) == 41
    assert ref["levels"][0]["corrupt"] == 38                     # batch 32, teacher-forced
    assert ref["reason"].startswith("41 corrupt position(s)")
    assert "open4-chat at batch 32: teacher-forced positions [0, 1, 2, 4, 5] replaced" in ref["reason"]
    outcome = _json(FULL / "outcome.json")
    assert outcome["probe_passed"] is False and outcome["load_s"] is None   # never measured


# ------------------------------------------------------- compile cache: miss, then hit


def test_the_same_configuration_misses_then_hits_the_studys_compile_cache() -> None:
    miss, hit = parse_compile_log(server_log(FDO)), parse_compile_log(server_log(RERUN))
    assert miss.to_json() == _json(FDO / "compile_cache.json")
    assert hit.to_json() == _json(RERUN / "compile_cache.json")
    assert (miss.cache, miss.aot, hit.cache, hit.aot) == ("miss", "saved", "hit", "loaded")
    # One entry of the study's own cache: compiled by trial 2, loaded by its re-run.
    assert hit.cache_hash == miss.cache_hash and hit.aot_path == miss.aot_path
    assert hit.cache_dir.startswith("/tmp/tuner-h200-compile-cache/torch_compile_cache/")
    assert (miss.compile_s, hit.compile_s) == (20.61, 5.12)
    assert (miss.init_engine_s, hit.init_engine_s) == (41.71, 10.92)


def test_the_startup_drop_by_phase() -> None:
    before, after = reparsed_startup(FDO), reparsed_startup(RERUN)
    assert before == _json(FDO / "startup.json") and after == _json(RERUN / "startup.json")
    assert (before["compile_cache"], after["compile_cache"]) == ("miss", "hit")
    assert before["total_s"] == pytest.approx(92.1, abs=0.05)
    assert after["total_s"] == pytest.approx(56.8, abs=0.05)
    # What the hit saved: compile 21 -> 6 s and the V2 runner's warm-up 15 -> 1 s.
    assert (before["phases"]["compile"], after["phases"]["compile"]) == (21.0, 6.0)
    assert (before["phases"]["warmup"], after["phases"]["warmup"]) == (15.0, 1.0)
    status = (STUDY / "status.txt").read_text()
    assert summary_text(before) in status


def test_each_compiled_mode_has_its_own_key_so_the_study_itself_only_missed() -> None:
    hashes = set()
    for trial in (FAP, FDO, PIECEWISE, FULL, NONE):
        rec = parse_compile_log(server_log(trial))
        assert rec.cache == "miss", trial.name
        hashes.add(rec.cache_hash)
    assert len(hashes) == 5
    for trial in (EAGER, NGRAM):
        assert parse_compile_log(server_log(trial)).cache == "none"
    med = median_phases([reparsed_startup(t) for t in (EAGER, FAP, FDO, PIECEWISE, FULL, NONE, NGRAM)])
    assert med["total"] == pytest.approx(98.4, abs=0.05)
    assert "startup: median 98.4s over 7 server(s), 61% of trial time, torch.compile cache 5 miss" in (
        STUDY / "status.txt").read_text()


# ------------------------------------------------------------ what ran, and the verdict


def test_the_rerun_ran_full_decode_only_as_asked() -> None:
    eff = parse_effective_config(server_log(RERUN))
    assert eff.ready and eff.vllm_version == "0.26.0" and eff.warnings == []
    assert (eff.enforce_eager, eff.cudagraph_mode_configured, eff.cudagraph_mode) == (
        False, "FULL_DECODE_ONLY", "FULL_DECODE_ONLY")
    assert eff.graphs_captured == ["FULL"]


def test_a_better_rerun_outside_the_tolerance_is_not_reproducible() -> None:
    recorded = _json(STUDY / "confirm" / "0002.json")
    verdict = rejudged(recorded, 2)
    assert verdict.verdict == "not_reproducible" == recorded["verdict"]
    assert verdict.reason == recorded["reason"] == (
        "output_tok_s@cmax 7354 -> 8163 (+11.0%, better by more than 10%)")
    # Within tolerance it would have been reproduced: the rule is about the size of the move.
    assert rejudged(recorded, 2, tolerance=0.12, repeats=1).verdict == "reproduced"
    assert "not reproducible (1 re-run): output_tok_s@cmax 7354 -> 8163 (+11.0%)" in (
        STUDY / "status.txt").read_text()


def test_status_shows_the_reruns_cache_hit_start_under_the_verdict(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    from tuner.commands.main import main

    shutil.copytree(STUDY, tmp_path / "smollm2-h200")
    assert main(["status", "smollm2-h200", "--results", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    verdict = next(i for i, line in enumerate(lines) if "not reproducible (1 re-run)" in line)
    assert lines[verdict + 1].strip() == "re-run 0002-1: " + summary_text(_json(RERUN / "startup.json"))
    assert lines[verdict + 1].endswith("(torch.compile cache hit)")
    # ...and the trial's own first start, further down, compiled.
    first = summary_text(_json(FDO / "startup.json"))
    assert first.endswith("(torch.compile cache miss)") and first in "\n".join(lines[verdict + 2:])
