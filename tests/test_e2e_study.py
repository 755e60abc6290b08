"""End to end on the simulator: a real `tuner run` (Ray, Optuna SQLite, server processes),
then status, the export started as is, and the report rendered in headless Chromium."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import run_tuner, wait_no_orphans, write_study
from tests.waiting import answers_health, wait_for
from tuner.vllm.effective_config import parse_effective_config
from tuner.vllm.verify import verify

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo_study(tmp_path_factory: pytest.TempPathFactory):
    tmp_path = tmp_path_factory.mktemp("e2e")
    study, marker = write_study(tmp_path)
    results = tmp_path / "results"
    began = time.monotonic()
    out = run_tuner("run", str(study), "--results", str(results), timeout=900)
    took = time.monotonic() - began
    print(out.stdout[-3000:])
    print(f"study of 12 trials took {took:.1f}s")
    yield {"out": out, "name": study.stem, "results": results, "tmp": tmp_path, "marker": marker}
    assert not wait_no_orphans(marker, timeout=5), "orphan simulator processes"


def test_study_finishes_with_front_and_artifacts(demo_study: dict) -> None:
    out, name, results = demo_study["out"], demo_study["name"], demo_study["results"]
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "Pareto front" in out.stdout
    pareto = json.loads((results / name / "pareto.json").read_text())
    assert pareto["front"], "empty Pareto front"
    assert pareto["baseline"] is not None

    status = run_tuner("status", name, "--results", str(results), "--json")
    assert status.returncode == 0, status.stderr
    info = json.loads(status.stdout)
    assert info["finished_trials"] == 12
    assert info["outcomes"].get("feasible", 0) >= 6
    for row in info["trials"]:
        if row["state"] == "COMPLETE":
            trial_dir = results / name / "trials" / f"{row['trial']:04d}"
            # A trial stopped early skips what comes after the stop: a knob found not applied
            # at startup or verify has no probe and no load, one failing its probe no load.
            stopped = (json.loads((trial_dir / "outcome.json").read_text()).get("early_stop") or {}).get("after")
            expected = ["command.json", "server.log", "verification.json", "outcome.json"]
            expected += [] if stopped in ("startup", "verify") else ["probe.json"]
            expected += [] if stopped in ("startup", "verify", "probe") else ["metrics.json"]
            for f in expected:
                assert (trial_dir / f).exists(), f"{trial_dir}/{f} missing"
            assert not (trial_dir / "server.pid").exists()
    # Infeasible trials never reach the front.
    front = {e["trial"] for e in pareto["front"]}
    for row in info["trials"]:
        if row["outcome"] != "feasible":
            assert row["trial"] not in front


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    wait_for(lambda: answers_health(url), timeout, "the exported server to be ready",
             unless=lambda: proc.poll() is not None and "exported command exited")


def test_exported_best_throughput_starts_that_configuration(demo_study: dict) -> None:
    name, results, tmp_path = demo_study["name"], demo_study["results"], demo_study["tmp"]
    pareto = json.loads((results / name / "pareto.json").read_text())
    exported = run_tuner("export", name, "--results", str(results), "--pick", "best-throughput", "--format", "json")
    assert exported.returncode == 0, exported.stderr
    spec = json.loads(exported.stdout)
    assert spec["trial"] in {entry["trial"] for entry in pareto["front"]}

    # Run the exported command as is (its 'python' is this interpreter) and read the log back.
    argv = [sys.executable if a == "python" else a for a in spec["argv"]]
    log_path = tmp_path / "exported.log"
    env = dict(os.environ)
    env.update(spec["env"])
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        port = argv[argv.index("--port") + 1]
        wait_healthy(f"http://127.0.0.1:{port}", proc)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    effective = parse_effective_config(log_path.read_text())
    trial_dir = results / name / "trials" / f"{spec['trial']:04d}"
    asked = json.loads((trial_dir / "command.json").read_text())["asked"]
    result = verify(asked, effective)
    assert result.applied, result.mismatches()
    applied = {c.target for c in result.checks if c.status == "applied"}
    for target in asked:
        if target.startswith(("compilation_config.", "speculative_config.", "enforce_eager")):
            assert target in applied, f"{target} not confirmed by the exported server's log"
    params = spec["params"]
    if params.get("enforce_eager"):
        assert effective.enforce_eager is True
    elif "cudagraph_mode" in params:
        assert effective.cudagraph_mode == params["cudagraph_mode"]
    assert effective.speculative_method == params.get("spec_method")


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None and os.environ.get("CI") != "true",
                    reason="chromium not installed (.ci/run installs it)")
def test_report_renders_in_headless_chromium(demo_study: dict, tmp_path: Path) -> None:
    name, results = demo_study["name"], demo_study["results"]
    out = run_tuner("report", name, "--results", str(results), "--markdown")
    assert out.returncode == 0, out.stderr
    report_dir = results / name / "report"
    for f in ("report.html", "report.md", "pareto.png", "best_so_far.png"):
        assert (report_dir / f).stat().st_size > 1000, f
    assert "## Pareto front" in out.stdout
    assert CHROMIUM is not None
    run = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
         "--virtual-time-budget=5000", "--dump-dom", (report_dir / "report.html").as_uri()],
        capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert 'data-plots-rendered="yes"' in run.stdout, "figures did not render"
    console = [l for l in run.stderr.splitlines() if ":CONSOLE" in l]
    assert not console, console
