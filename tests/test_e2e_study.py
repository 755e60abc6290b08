"""End to end on the simulator: a real `tuner run` (Ray, Optuna SQLite, server processes),
then status, and the export started as is."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT, run_tuner, write_study
from tuner.core.effective_config import parse_effective_config
from tuner.core.verify import verify

pytestmark = pytest.mark.slow


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "exported command exited"
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError("exported server never became ready")


def test_demo_study_runs_exports_and_export_starts_that_config(tmp_path: Path, orphan_check: list[str]) -> None:
    study, marker = write_study(tmp_path)
    orphan_check.append(marker)
    results = tmp_path / "results"
    began = time.monotonic()
    out = run_tuner("run", str(study), "--results", str(results), timeout=900)
    took = time.monotonic() - began
    print(out.stdout[-3000:])
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    name = study.stem
    assert "Pareto front" in out.stdout
    pareto = json.loads((results / name / "pareto.json").read_text())
    assert pareto["front"], "empty Pareto front"
    assert pareto["baseline"] is not None
    print(f"study of 12 trials took {took:.1f}s")

    status = run_tuner("status", name, "--results", str(results), "--json")
    assert status.returncode == 0, status.stderr
    info = json.loads(status.stdout)
    assert info["finished_trials"] == 12
    assert info["outcomes"].get("feasible", 0) >= 6
    for row in info["trials"]:
        if row["state"] == "COMPLETE":
            trial_dir = results / name / "trials" / f"{row['trial']:04d}"
            for f in ("command.json", "server.log", "verification.json", "probe.json", "metrics.json", "outcome.json"):
                assert (trial_dir / f).exists(), f"{trial_dir}/{f} missing"
            assert not (trial_dir / "server.pid").exists()

    exported = run_tuner("export", name, "--results", str(results), "--pick", "best-throughput", "--format", "json")
    assert exported.returncode == 0, exported.stderr
    spec = json.loads(exported.stdout)
    front_numbers = {entry["trial"] for entry in pareto["front"]}
    assert spec["trial"] in front_numbers

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
    # The effective-config line matches the trial's parameters.
    params = spec["params"]
    if params.get("enforce_eager"):
        assert effective.enforce_eager is True
    elif "cudagraph_mode" in params:
        assert effective.cudagraph_mode == params["cudagraph_mode"]
    assert effective.speculative_method == params.get("spec_method")
