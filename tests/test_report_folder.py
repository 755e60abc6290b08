"""A study folder without its Optuna storage reads back as the storage did.

A real (simulated) study is run with a crash and a wrong-answer fault injected, then its
folder is copied without optuna.db and study.json: `tuner status --json` on the copy must
say what it says on the original, trial by trial, outcome by outcome, and `report` and
`export` must pick the same points. This is what lets the committed example
(results/examples/smollm2-cpu, text files only) be reported and exported.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from tests.conftest import run_tuner, write_study

pytestmark = pytest.mark.slow

FAULTS = [
    {"fault": "crash_at_start", "when": {"env:NCCL_PROTO": "LL", "speculative_config.method": None}},
    {"fault": "garbage", "when": {"speculative_config.num_speculative_tokens": [4, 5]}},
]
# Known only to the storage: proposals that never ran, and the run's own clock.
STORAGE_ONLY = {"skipped", "elapsed_s", "time_left_s"}
# Known only to the run record (study.json, left out of the copy below): the --n-trials given
# to `tuner run` (without it the target is the study file's own budget), and the environment
# the first run pinned.
RUN_RECORD_ONLY = {"target_trials", "environment", "environment_changes"}


def _status(results: Path, name: str) -> dict:
    out = run_tuner("status", name, "--results", str(results), "--json", timeout=120)
    assert out.returncode == 0, out.stderr
    status = json.loads(out.stdout)
    for row in status["front"] + status["trials"]:
        row.pop("seconds")  # the storage's timestamps include the tell; the files' do not
    return status


def test_folder_without_storage_reads_back_like_the_storage(tmp_path: Path, orphan_check: list[str]) -> None:
    study, marker = write_study(tmp_path, env={"TUNER_SIM_FAULTS": json.dumps(FAULTS)},
                                updates={"sampler": {"name": "random", "seed": 3}})
    orphan_check.append(marker)
    results = tmp_path / "results"
    run = run_tuner("run", str(study), "--results", str(results), "--n-trials", "8", timeout=900)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    name = study.stem

    files_only = tmp_path / "files-only"
    shutil.copytree(results / name, files_only / name,
                    ignore=shutil.ignore_patterns("optuna.db", "study.json", "run.lock"))
    original, rebuilt = _status(results, name), _status(files_only, name)
    outcomes = {row["outcome"] for row in original["trials"]}
    assert "feasible" in outcomes and any(o.startswith("failed:") for o in outcomes) \
        and outcomes & {"probe_failed", "not_applied"}, f"the faults should give varied outcomes: {outcomes}"
    for key in original.keys() - STORAGE_ONLY - RUN_RECORD_ONLY:
        assert rebuilt[key] == original[key], key
    assert original["target_trials"] == 8
    assert original["environment"]["host"] and rebuilt["environment"] is None
    assert rebuilt["target_trials"] == yaml.safe_load(study.read_text())["budget"]["n_trials"]

    for pick in ("knee", "best-throughput", "lowest-latency"):
        a = run_tuner("export", name, "--results", str(results), "--pick", pick, "--format", "json")
        b = run_tuner("export", name, "--results", str(files_only), "--pick", pick, "--format", "json")
        assert a.returncode == b.returncode == 0, a.stderr + b.stderr
        ja, jb = json.loads(a.stdout), json.loads(b.stdout)
        assert {k: v for k, v in ja.items() if k not in ("exported_unix", "environment")} == \
            {k: v for k, v in jb.items() if k not in ("exported_unix", "environment")}, pick
        assert ja["environment"]["packages"]["vllm-tuner"] and jb["environment"] is None

    report = run_tuner("report", name, "--results", str(files_only), "-o", str(tmp_path / "rep"))
    assert report.returncode == 0, report.stderr
    summary = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert sorted(summary["front"]) == sorted(row["trial"] for row in original["front"])
    assert not (files_only / name / "optuna.db").exists(), "reading the folder created a storage"
