"""Every committed example study under results/examples still loads in `status`, `report` and
`export`, as committed (issue 37: the code around a study's files changes, its files do not).

Each example is read from a copy, with the commands a user types, and checked against what the
run itself wrote when it finished (its pareto.json): the same baseline and front, an exported
trial that is on that front or within noise of it (export passes over a front trial whose re-run
did not reproduce) with the command it ran, a report whose front is that front. Nothing the
commands do may write into the study folder.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import shutil
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_tuner

EXAMPLES = sorted(p for p in (ROOT / "results" / "examples").iterdir() if (p / "spec.yaml").exists())


def _digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_every_example_folder_is_a_study() -> None:
    # A folder under results/examples without spec.yaml would silently drop out of the test below.
    folders = sorted(p for p in (ROOT / "results" / "examples").iterdir() if p.is_dir())
    assert folders and [p.name for p in folders] == [p.name for p in EXAMPLES]


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_study_loads_in_status_report_and_export(example: Path, tmp_path: Path) -> None:
    root = tmp_path / "results"
    shutil.copytree(example, root / example.name)
    folder = root / example.name
    before = _digests(folder)
    pareto = json.loads((example / "pareto.json").read_text())
    front = {entry["trial"]: entry for entry in pareto["front"]}
    candidates = front | {entry["trial"]: entry for entry in pareto.get("within_noise") or []}
    assert front, f"{example.name}: the committed pareto.json has an empty front"

    out = run_tuner("status", example.name, "--results", str(root), "--json", timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    status = json.loads(out.stdout)
    assert status["baseline"]["trial"] == pareto["baseline"]["trial"]
    shown = {row["trial"]: row["values"] for row in status["front"]}
    assert set(shown) == set(front)
    for trial, entry in front.items():
        for label, value in entry["values"].items():
            assert math.isclose(shown[trial][label], value, rel_tol=1e-9), (trial, label)

    out = run_tuner("export", example.name, "--results", str(root), "--format", "json", timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    exported = json.loads(out.stdout)
    passed_over = {int(t) for t, c in status["confirmations"].items() if c["verdict"] == "not_reproducible"}
    if exported["trial"] not in candidates:
        # export takes the best reproducible trial when every front trial failed its re-run
        assert set(front) <= passed_over, (exported["trial"], passed_over)
        assert exported["outcome"] == "feasible"
    trial_folder = folder / "trials" / f"{exported['trial']:04d}"
    ran = json.loads((trial_folder / "command.json").read_text())
    # The interpreter is exported as a path that works from anywhere; the rest is what ran.
    assert exported["argv"][1:] == ran["argv"][1:]
    assert Path(exported["argv"][0]).name == Path(ran["argv"][0]).name
    assert exported["env"].items() <= ran["env"].items()

    report_dir = tmp_path / "report"
    out = run_tuner("report", example.name, "--results", str(root), "-o", str(report_dir), "--markdown",
                    timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads((report_dir / "report.json").read_text())
    assert sorted(report["front"]) == sorted(front)
    markdown = (report_dir / "report.md").read_text()
    for trial in front:
        # a row per front trial; its cell may carry a flag after the number (UNSTABLE: ...)
        assert re.search(rf"^\| {trial}( \||\s[A-Z])", markdown, re.M), trial

    assert _digests(folder) == before, "a read-only command wrote into the study folder"
