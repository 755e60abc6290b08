"""scripts/gpu_evidence.sh on the simulator: the study runs under a wall-clock budget and
ends with every started trial finished (none interrupted), then status, report, export and
one confirmation re-run write their files, each step logged in steps.txt."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, free_port_block


@pytest.mark.timeout(400)
def test_evidence_run_on_the_simulator(tmp_path: Path) -> None:
    data = yaml.safe_load((ROOT / "search_spaces" / "demo.yaml").read_text())
    data["name"] = "evidence"
    data["server"]["port"] = free_port_block(2)
    data["budget"]["n_trials"] = 2
    study = tmp_path / "evidence.yaml"
    study.write_text(yaml.safe_dump(data, sort_keys=False))
    env = {**os.environ, "PYTHON": sys.executable, "STEPS": "study,confirm",
           "STUDY_TIMEOUT": "300", "CONFIRM_LIMIT": "120",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = tmp_path / "out"
    # Run where a user would keep results (its own folder), not in the repository.
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_evidence.sh"), str(study), str(out)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=380)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    steps = (out / "steps.txt").read_text()
    for line in ("study rc=0", "status rc=0", "report rc=0", "export --check done", "confirm rc=", "study.tgz",
                 "DONE"):
        assert line in steps, steps
    assert "nvidia-smi failed" in steps            # no GPU here, said and not fatal
    status = (out / "status.txt").read_text()
    assert "study evidence: 2/2 trials finished" in status
    assert "re-run 0" in status and "(1 re-run)" in status
    trials = sorted((tmp_path / "results" / "evidence" / "trials").iterdir())
    outcomes = [json.loads((t / "outcome.json").read_text()) for t in trials]
    assert len(outcomes) == 2 and all(o.get("reason") != "interrupted" for o in outcomes)
    assert (out / "study.tgz").stat().st_size > 0
