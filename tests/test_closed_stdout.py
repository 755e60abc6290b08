"""A reader that goes away (`tuner export NAME | head -3`, a closed `tee`) is no error: a
short command exits 141 without a traceback, and a running study keeps running - its record
is the study folder, not the terminal."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, tuner_argv, write_study
from tests.faultkit import MEASURING


def _run_into_closed_pipe(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    read_end, write_end = os.pipe()
    os.close(read_end)                     # the reader is gone before the first line
    try:
        return subprocess.run(tuner_argv(*args), stdout=write_end, stderr=subprocess.PIPE, text=True,
                              timeout=timeout, cwd=ROOT, check=False)
    finally:
        os.close(write_end)


@pytest.mark.slow
def test_a_study_outlives_its_closed_stdout_and_export_exits_141(tmp_path: Path,
                                                                 orphan_check: list[str]) -> None:
    path, marker = write_study(tmp_path, updates={**MEASURING, "budget.n_trials": 2})
    orphan_check.append(marker)
    results = tmp_path / "results"
    run = _run_into_closed_pipe("run", str(path), "--results", str(results), timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Traceback" not in run.stderr and "BrokenPipeError" not in run.stderr, run.stderr[-3000:]
    trials = results / path.stem / "trials"
    assert sorted(d.name for d in trials.iterdir() if (d / "outcome.json").is_file()) == ["0000", "0001"]

    export = _run_into_closed_pipe("export", path.stem, "--results", str(results), timeout=120)
    assert export.returncode == 141, export.stderr
    assert export.stderr == ""
