"""Early stop inside a real trial (TrialWorker against the simulator, no Ray): a knob the
starting server downgrades ends the start before "ready", and a dominated trial skips its
remaining load levels; the orchestrator tells both as stopped, never on the front."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import write_study
from tuner.study.outcome import TrialOutcome, TrialRequest
from tuner.study.policy import early_stop_plan
from tuner.study.scoring import stopped_told
from tuner.study.sweep_guard import SweepGuard
from tuner.study.trials import TrialRecord


def _request(tmp_path: Path, values: dict[str, Any], plan_front: list[list[float]] | None,
             startup_scale: float = 0.02, env: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
    from tuner.commands.run import load_spec_file
    from tuner.study.space import trial_command

    study, _ = write_study(tmp_path, env={"TUNER_SIM_STARTUP_SCALE": startup_scale, **(env or {})},
                           updates={"server.startup_timeout": "120s", "budget.trial_timeout": "5m"})
    spec = load_spec_file(str(study))
    command = trial_command(spec, values, port=spec.server.port)
    plan = early_stop_plan(spec, [])
    if plan_front is not None:
        plan = plan.model_copy(update={"front": plan_front})
    request = TrialRequest(
        study=study.stem, number=0, values=values,
        asked=command.asked, argv=command.argv, env=command.launch_env,
        host=spec.server.host, port=spec.server.port, served_model_name=spec.server.served_model_name,
        trial_dir=str(tmp_path / "trial"), startup_timeout_s=120, stop_timeout_s=10, deadline_s=300,
        load=spec.load.model_dump(mode="json"), probe=spec.probe.model_dump(mode="json"), ignore_eos=True,
        early_stop=plan)
    return spec, request.model_dump(mode="json")


def _run(request: dict[str, Any]) -> TrialOutcome:
    from tuner.engine.worker import TrialWorker

    return TrialOutcome.model_validate(asyncio.run(TrialWorker().run_trial(request)))


def test_a_downgraded_knob_stops_the_start_before_ready(tmp_path: Path) -> None:
    # FULL graphs on the simulated box's attention backend: vLLM downgrades them to
    # FULL_AND_PIECEWISE at attention init, long before weights, compile and capture.
    values = {"enforce_eager": False, "cudagraph_mode": "FULL", "nccl_proto": None, "spec_method": None}
    spec, request = _request(tmp_path, values, plan_front=None)
    out = _run(request)
    assert out.status == "completed" and out.applied is False
    assert out.early_stop and out.early_stop["after"] == "startup"
    assert out.early_stop["mismatches"] == ["compilation_config.cudagraph_mode"]
    assert out.probe_passed is None and out.levels == {}
    trial_dir = Path(request["trial_dir"])
    assert json.loads((trial_dir / "verification.json").read_text())["applied"] is False
    assert not (trial_dir / "probe.json").exists() and not (trial_dir / "server.pid").exists()
    log = (trial_dir / "server.log").read_text()
    assert "Application startup complete" not in log and "Capturing CUDA graphs" not in log
    values_told, violated, _ = stopped_told(spec, out, worst=[1.0, 99.0])
    assert TrialRecord(0, "COMPLETE", "run", {}, constraints=violated).outcome == "not_applied"
    assert violated["early_stopped"] == 1.0


# PIECEWISE silently run as FULL_AND_PIECEWISE: no notice while starting, so only the full
# log's verification (graph capture, printed last) shows the knob was not applied.
SILENT_DOWNGRADE = json.dumps([{"fault": "silent_downgrade",
                                "when": {"compilation_config.cudagraph_mode": "PIECEWISE"},
                                "target": "compilation_config.cudagraph_mode", "value": "FULL_AND_PIECEWISE"}])


@pytest.mark.parametrize("probe", [True, False], ids=["probe on", "probe off"])
def test_a_knob_not_applied_stops_after_verify_with_or_without_the_probe(tmp_path: Path, probe: bool) -> None:
    values = {"enforce_eager": False, "cudagraph_mode": "PIECEWISE", "nccl_proto": None, "spec_method": None}
    spec, request = _request(tmp_path, values, plan_front=None, env={"TUNER_SIM_FAULTS": SILENT_DOWNGRADE})
    request["probe"]["enabled"] = probe
    out = _run(request)
    assert out.status == "completed" and out.applied is False
    assert out.mismatches and out.mismatches[0]["target"] == "compilation_config.cudagraph_mode"
    # Stopped after verification, not while starting: neither the probe nor any level ran.
    assert out.early_stop and out.early_stop["reason"] == "not_applied" and out.early_stop["after"] == "verify"
    assert out.early_stop["skipped_levels"] == [1, 16]
    assert out.probe_passed is None and out.levels == {} and out.load_s is None
    trial_dir = Path(request["trial_dir"])
    assert not (trial_dir / "probe.json").exists() and not list(trial_dir.glob("requests-*.jsonl"))
    values_told, violated, _ = stopped_told(spec, out, worst=[1.0, 99.0])
    assert TrialRecord(0, "COMPLETE", "run", {}, constraints=violated).outcome == "not_applied"


# quiethost: rule 4a fires inside the level only once its window is stable, a timing of the
# simulator; on CI (2026-12-07) beside the real-vLLM lane and the SLO simulator study it was not,
# and the trial was not told dominated_exact.
@pytest.mark.quiethost
def test_a_dominated_trial_measures_its_objective_levels_and_skips_the_rest(tmp_path: Path) -> None:
    values = {"enforce_eager": True, "nccl_proto": None, "spec_method": None}
    # A front point better in both objectives than anything the simulator can do.
    spec, request = _request(tmp_path, values, plan_front=[[1e9, 1e-3]], startup_scale=0.002)
    assert SweepGuard(request["early_stop"]).levels([1, 16]) == [1, 16]
    # The demo's levels are its objective levels (1, 16); add an informational one.
    request["load"]["concurrency"] = [1, 4, 16]
    request["early_stop"]["order"] = [1, 16, 4]
    out = _run(request)
    assert out.status == "completed" and out.applied is True and out.probe_passed is True
    assert out.early_stop and out.early_stop["reason"] == "dominated_exact"
    assert out.early_stop["after"] == "c16" and out.early_stop["skipped_levels"] == [4]
    assert sorted(out.levels) == ["1", "16"]
    metrics = json.loads((Path(request["trial_dir"]) / "metrics.json").read_text())
    assert metrics["stopped_levels"] == [4]
    # Without a plan the same trial measures every level.
    request["early_stop"] = None
    request["trial_dir"] = str(tmp_path / "trial-full")
    full = _run(request)
    assert full.early_stop is None and sorted(full.levels) == ["1", "16", "4"]


def test_a_dominated_trial_stops_inside_its_throughput_level(tmp_path: Path) -> None:
    values = {"enforce_eager": True, "nccl_proto": None, "spec_method": None}
    spec, request = _request(tmp_path, values, plan_front=[[1e9, 1e-3]], startup_scale=0.002)
    # Three requests per stream: the throughput level (16) has a steady window between its
    # first wave and its drain, so its rate is known by the last dispatch (rule 4a).
    request["load"]["concurrency"] = [1, 4, 16]
    request["load"]["requests_per_stream"] = 3
    request["early_stop"]["order"] = [1, 16, 4]
    # The study's noise between starts as the orchestrator passes it (its estimate when the
    # trial starts, tuner.study.between_starts).
    request["load"]["noise_floor"] = 0.03
    out = _run(request)
    assert out.status == "completed" and out.early_stop is not None
    assert out.noise_floor == 0.03     # what the intervals carry, for readers to swap
    assert out.early_stop["reason"] == "dominated_exact", out.early_stop
    assert out.early_stop["after"] == "c16 at last dispatch" and out.early_stop["skipped_levels"] == [16, 4]
    c16 = out.early_stop["measured"]["16"]
    assert c16["completed"] < c16["planned"]          # the drain was not waited for
    # The level's output tok/s is recorded, so the orchestrator tells it like any completed
    # trial (scoring.metric_value reads it), dominated by the front it was judged against.
    assert sorted(out.levels) == ["1", "16"] and out.levels["16"]["output_tok_s"] == c16["output_tok_s"]
    # Its interval is the between-start noise (levels sized by request count have no
    # sub-window interval): 1.96 x 3 % x value, so status shows it with a "±" like the rest.
    assert c16["output_tok_s.ci95"] == 0.0
    assert out.levels["16"]["output_tok_s.ci95"] == pytest.approx(1.959964 * 0.03 * c16["output_tok_s"])
    from tuner.study.scoring import metric_value
    assert metric_value(spec, out, spec.objectives[0]) == c16["output_tok_s"]
    metrics = json.loads((Path(request["trial_dir"]) / "metrics.json").read_text())
    assert metrics["stopped_levels"] == [16, 4]
