"""A third H200 run of the same study (``results/examples/smollm2-h200-run4``, 2026-12-03,
vLLM 0.26.0, SmolLM2-135M bfloat16), cut after five trials when the lent machine was taken
back: what it adds is the probe's verdicts on a fresh sample per trial, on another box.

FULL corrupted answers for the third time on a third machine, caught with a different
sample of prompts (seed 4, where the run before drew its own); FULL_AND_PIECEWISE,
FULL_DECODE_ONLY and PIECEWISE passed with many near-tie divergences and nothing far or
corrupt. Every figure asserted is one the box recorded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tuner.vllm.effective_config import parse_effective_config

STUDY = Path(__file__).resolve().parent.parent / "results" / "examples" / "smollm2-h200-run4"
TRIALS = STUDY / "trials"
EAGER, FAP, FDO, PIECEWISE, FULL = (TRIALS / f"000{i}" for i in range(5))


def _json(path: Path) -> Any:
    return json.loads(path.read_text())


@pytest.mark.parametrize(("trial", "mode"), [(FAP, "FULL_AND_PIECEWISE"), (FDO, "FULL_DECODE_ONLY"),
                                             (PIECEWISE, "PIECEWISE"), (FULL, "FULL")])
def test_each_mode_ran_as_asked(trial: Path, mode: str) -> None:
    eff = parse_effective_config((trial / "server.log").read_text(errors="replace"))
    assert eff.ready and eff.vllm_version == "0.26.0"
    assert (eff.enforce_eager, eff.cudagraph_mode_configured, eff.cudagraph_mode) == (False, mode, mode)
    assert _json(trial / "verification.json") and _json(trial / "outcome.json")["status"] == "completed"


@pytest.mark.parametrize("trial", [EAGER, FAP, FDO, PIECEWISE])
def test_correct_modes_pass_with_near_ties_only(trial: Path) -> None:
    probe = _json(trial / "probe.json")
    ref = probe["reference"]
    assert probe["passed"] and ref["passed"] and ref["reason"] == "ok"
    assert all(level["far"] == 0 and level["corrupt"] == 0 for level in ref["levels"])
    # Each trial drew its own sample of the bank.
    assert probe["sample_seed"] == int(trial.name)


def test_full_fails_again_for_corruption_on_its_own_sample() -> None:
    probe = _json(FULL / "probe.json")
    ref = probe["reference"]
    assert not probe["passed"] and probe["sample_seed"] == 4
    assert [level["corrupt"] for level in ref["levels"]] == [38, 2, 1, 0, 2, 0, 0]
    assert ref["reason"].startswith("43 corrupt position(s)")
    # Beyond teacher forcing: a retrieval answer changed where the reference was confident.
    assert 'trial \'The password for the back gate is "LIGHT RAIN"\'' in ref["reason"]
    assert _json(FULL / "outcome.json")["probe_passed"] is False


def test_status_puts_the_two_full_graph_modes_on_a_tie_at_the_front() -> None:
    pareto = _json(STUDY / "pareto.json")
    assert [p["trial"] for p in pareto["front"]] == [1]
    assert pareto["front"][0]["values"]["output_tok_s@cmax"] == pytest.approx(10767.2, abs=0.1)
    status = (STUDY / "status.txt").read_text()
    assert "tie: trials 1 and 2 are within noise" in status
    assert "4 probe_failed" in status and "3 stopped_early" in status
