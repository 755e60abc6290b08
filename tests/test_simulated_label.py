"""A study the simulator served says so first, in status, export and report: its figures are
the simulator's model, never a measurement, and its exported command starts the simulator
(tuner.study.simulated)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import ROOT, run_tuner
from tuner.study.simulated import is_simulator, saved_spec_label, simulated_label
from tuner.study.study_file import parse_study

DRY = "DRY RUN: served by the built-in simulator (profile llama8b-h100); every figure is the simulator's model"


def test_only_a_simulator_command_gets_the_label() -> None:
    assert is_simulator(["python3", "-m", "tuner.sim"]) and is_simulator(["/opt/bin/tuner-sim", "--x"])
    assert not is_simulator(["python3", "-m", "vllm.entrypoints.openai.api_server"]) and not is_simulator([])
    real = parse_study((ROOT / "search_spaces" / "d8b-h100.yaml").read_text())
    assert simulated_label(real.server.command, real.server.env, None) is None
    demo = parse_study((ROOT / "search_spaces" / "demo.yaml").read_text())
    assert simulated_label(demo.server.command, demo.server.env, None) == (
        "SIMULATOR: served by the built-in simulator (profile glm5-8xpcie); every figure is the simulator's "
        "model, not a measurement, and the command starts the simulator, not vLLM")
    assert simulated_label(["tuner-sim"], {}, "/s/x.yaml") == (
        "DRY RUN: served by the built-in simulator (its default profile); every figure is the simulator's "
        "model, not a measurement, and the command starts the simulator, not vLLM; `tuner run /s/x.yaml` "
        "measures the real server")
    # A saved spec.yaml read as plain YAML, whatever shape it has.
    assert saved_spec_label({"server": {"command": ["python", "-m", "tuner.sim"], "env": {}}}, None).startswith(
        "SIMULATOR: served by the built-in simulator (its default profile)")
    for odd in (None, [], {"server": 3}, {"server": {"command": "tuner-sim"}}):
        assert saved_spec_label(odd, None) is None


def test_a_dry_run_says_so_in_status_export_and_report(tmp_path: Path) -> None:
    results = tmp_path / "results"
    study = ROOT / "search_spaces" / "d8b-h100-energy.yaml"
    run = run_tuner("run", "--dry-run", str(study), "--results", str(results), "--n-trials", "1", timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    name = "d8b-h100-energy-dry-run"
    status = run_tuner("status", name, "--results", str(results))
    assert status.stdout.splitlines()[1] == (f"  {DRY}, not a measurement, and the command starts the simulator, "
                                             f"not vLLM; `tuner run {study}` measures the real server")
    as_json = json.loads(run_tuner("status", name, "--results", str(results), "--json").stdout)
    assert as_json["simulated"].startswith(DRY)
    export = run_tuner("export", name, "--results", str(results), "--trial", "0", "--force")
    assert export.returncode == 0, export.stderr
    assert export.stdout.splitlines()[1].startswith(f"#   {DRY}")
    meta = json.loads(run_tuner("export", name, "--results", str(results), "--trial", "0", "--force",
                                "--format", "json").stdout)
    assert json.dumps(meta).count(DRY) == 1
    report = run_tuner("report", name, "--results", str(results))
    assert report.returncode == 0, report.stderr
    md = (results / name / "report" / "report.md").read_text().splitlines()
    assert md[2].startswith(f"**{DRY}")
    assert f'<p class="unstable" id="simulated">{DRY.replace(chr(39), "&#x27;")}' in (
        results / name / "report" / "report.html").read_text()
