"""`tuner report`, `status` and `export` on the committed real CPU study.

results/examples/smollm2-cpu is a real run of search_spaces/smollm2-cpu.yaml kept without
its Optuna storage (text files only); the commands rebuild the study from the trial files
(tuner/store/folder.py). The checks hold for any run of that study: they compare with the
pareto.json and export the real run wrote from its storage, not with fixed numbers.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest

from tests.conftest import CPU_EXAMPLE, copy_cpu_example, needs_chromium, render_in_chromium, run_tuner

NAME = CPU_EXAMPLE.name


def _files(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def results(tmp_path: Path) -> Path:
    return copy_cpu_example(tmp_path)


@pytest.fixture
def pareto() -> dict:
    return json.loads((CPU_EXAMPLE / "pareto.json").read_text())


@needs_chromium
def test_report_of_the_real_cpu_study_renders_in_chromium(results: Path, pareto: dict, tmp_path: Path) -> None:
    before = _files(results / NAME)
    out_dir = tmp_path / "report"
    out = run_tuner("report", NAME, "--results", str(results), "-o", str(out_dir), "--markdown", timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    for name in ("report.html", "pareto.png", "best_so_far.png"):
        assert (out_dir / name).stat().st_size > 1000, name
    markdown = (out_dir / "report.md").read_text()
    for entry in pareto["front"]:
        assert f"| {entry['trial']} | " in markdown, entry["trial"]
    for name in ("pareto.png", "best_so_far.png"):
        assert (out_dir / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    assert "## Pareto front" in out.stdout
    # Rebuilt from the trial files, the front is the one the run computed from its storage.
    report = json.loads((out_dir / "report.json").read_text())
    assert sorted(report["front"]) == sorted(e["trial"] for e in pareto["front"])
    page = (out_dir / "report.html").read_text()
    assert f"<td>{pareto['baseline']['trial']} (baseline)</td>" in page
    assert _files(results / NAME) == before, "the report wrote into the study folder"

    dom, console = render_in_chromium(out_dir / "report.html", tmp_path / "profile")
    assert 'data-plots-rendered="yes"' in dom, "figures did not render"
    assert '<div id="pareto"><img alt="Pareto front"' in dom
    assert not console, console


def test_status_from_trial_files_matches_the_runs_pareto_json(results: Path, pareto: dict) -> None:
    out = run_tuner("status", NAME, "--results", str(results), "--json", timeout=120)
    assert out.returncode == 0, out.stderr
    status = json.loads(out.stdout)
    assert status["finished_trials"] == pareto["trials_finished"]
    assert status["baseline"]["trial"] == pareto["baseline"]["trial"]
    got = {row["trial"]: row["values"] for row in status["front"]}
    want = {e["trial"]: e["values"] for e in pareto["front"]}
    assert set(got) == set(want)
    for trial, values in want.items():
        for label, value in values.items():
            assert math.isclose(got[trial][label], value, rel_tol=1e-12), (trial, label)


def test_export_from_trial_files_is_the_runs_export(results: Path) -> None:
    committed = json.loads((CPU_EXAMPLE / "export-best-throughput.json").read_text())
    out = run_tuner("export", NAME, "--results", str(results), "--pick", "best-throughput",
                    "--format", "json", timeout=120)
    assert out.returncode == 0, out.stderr
    exported = json.loads(out.stdout)
    for key in ("argv", "env", "trial", "outcome", "objectives", "params"):
        assert exported[key] == committed[key], key


def test_picks_with_filters_on_the_real_front(results: Path, pareto: dict) -> None:
    """Lowest latency above a throughput floor, best throughput under a latency limit."""

    tput, lat = (o["label"] for o in pareto["objectives"])
    front = pareto["front"]
    best_tput = max(front, key=lambda e: e["values"][tput])
    best_lat = min(front, key=lambda e: e["values"][lat])

    def pick(*args: str) -> int:
        out = run_tuner("export", NAME, "--results", str(results), "--format", "json", *args, timeout=120)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)["trial"]

    floor = best_tput["values"][tput]
    assert pick("--pick", "lowest-latency", "--where", f"{tput}>={floor}") == best_tput["trial"]
    limit = best_lat["values"][lat]
    assert pick("--pick", "best-throughput", "--where", f"{lat}<={limit}") == best_lat["trial"]
    assert pick("--pick", "best-throughput") == best_tput["trial"]
    assert pick("--pick", "lowest-latency") == best_lat["trial"]
    assert pick("--trial", str(pareto["baseline"]["trial"])) == pareto["baseline"]["trial"]

    none = run_tuner("export", NAME, "--results", str(results), "--pick", "best-throughput",
                     "--where", f"{tput}>={floor * 10}", timeout=120)
    assert none.returncode == 2 and "no feasible trial matches the pick and filters" in none.stderr
