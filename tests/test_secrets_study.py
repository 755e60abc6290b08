"""Secrets never land on disk or in any output (issue 16, defect 2): a whole study on the
simulator with a token in server.env, an API key as a flag and a passed-through variable;
then the study folder, `tuner status` (text and JSON), `tuner report`, `tuner validate`
and every export format hold references only. Folders are 0700, files 0600."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest
import yaml

from tests.conftest import ROOT, processes_with_env, wait_no_orphans, write_study

pytestmark = pytest.mark.slow

HF_TOKEN = "hf_PLANTEDtoken1234567890"
API_KEY = "sk-PLANTEDkey-abcdef-0987654321"
PASSED = "pw-PLANTED-passthrough-55555"          # only in the tuner's environment
PLANTED = (HF_TOKEN, API_KEY, PASSED)


def tuner(*args: str, env: dict[str, str] | None = None, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tuner", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("secrets")
    path, marker = write_study(tmp, updates={"budget.n_trials": 2, "server.secret_env": ["DB_PASSWORD"],
                                              "server.flags.api_key": API_KEY},
                               env={"HF_TOKEN": HF_TOKEN})
    results = tmp / "results"
    run = tuner("run", str(path), "--results", str(results), env={"DB_PASSWORD": PASSED})
    yield {"path": path, "name": path.stem, "results": results, "run": run, "tmp": tmp, "marker": marker}
    assert not wait_no_orphans(marker)


def _outputs(study: dict) -> dict[str, str]:
    name, results = study["name"], str(study["results"])
    out = {"run": study["run"].stdout + study["run"].stderr}
    for label, args in {
        "status": ("status", name, "--results", results),
        "status --json": ("status", name, "--results", results, "--json"),
        "report": ("report", name, "--results", results, "--markdown"),
        "validate": ("validate", str(study["path"])),
        **{f"export {fmt}": ("export", name, "--results", results, "--format", fmt)
           for fmt in ("shell", "env", "json", "systemd", "yaml")},
    }.items():
        run = tuner(*args)
        assert run.returncode == 0, (label, run.stderr[-2000:])
        out[label] = run.stdout + run.stderr
    return out


def test_the_study_ran_and_the_secret_flag_was_verified(study: dict) -> None:
    assert study["run"].returncode == 0, study["run"].stderr[-3000:]
    status = json.loads(tuner("status", study["name"], "--results", str(study["results"]), "--json").stdout)
    # The server's log shows the key as ${API_KEY}, as the trial asked for it: applied.
    assert status["outcomes"].get("feasible", 0) >= 1, status["outcomes"]


def test_no_planted_secret_anywhere_only_references(study: dict) -> None:
    folder = study["results"] / study["name"]
    outputs = _outputs(study)      # first: the report writes its files into the folder
    grep = subprocess.run(["grep", "-r", "-a", "-l", "-F", "-e", HF_TOKEN, "-e", API_KEY, "-e", PASSED,
                           str(folder)], capture_output=True, text=True)
    assert grep.stdout == "", f"secrets on disk in: {grep.stdout}"
    refs = subprocess.run(["grep", "-r", "-a", "-o", "-h", "-F", "-e", "${HF_TOKEN}", "-e", "${API_KEY}",
                           str(folder)], capture_output=True, text=True).stdout.split()
    assert "${API_KEY}" in refs and "${HF_TOKEN}" in refs   # written, as references
    assert (folder / "report" / "report.html").exists()
    for label, text in outputs.items():
        for secret in PLANTED:
            assert secret not in text, (label, secret)
    for fmt in ("shell", "json"):
        for ref in ("${API_KEY}", "${HF_TOKEN}", "${DB_PASSWORD}"):
            assert ref in outputs[f"export {fmt}"], (fmt, ref)
    unit = outputs["export systemd"]
    assert '"${API_KEY}"' in unit and "# API_KEY, DB_PASSWORD, HF_TOKEN: NAME=value lines" in unit
    print(f"grep -r over {folder}: nothing; references in files: {sorted(set(refs))}")


def test_study_folders_are_0700_and_files_0600(study: dict) -> None:
    folder = study["results"] / study["name"]
    loose = []
    for path in [folder, *folder.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        if path.is_dir() and mode != 0o700 or path.is_file() and mode & 0o077:
            loose.append(f"{oct(mode)} {path.relative_to(folder)}")
    assert not loose, loose


def test_resume_reads_the_secrets_from_the_environment(study: dict) -> None:
    saved = yaml.safe_load((study["results"] / study["name"] / "spec.yaml").read_text())
    assert saved["server"]["env"]["HF_TOKEN"] == "${HF_TOKEN}"
    assert saved["server"]["flags"]["api_key"] == "${API_KEY}"
    run = tuner("resume", study["name"], "--results", str(study["results"]), timeout=300)
    assert run.returncode == 2, run.stderr[-2000:]
    line = run.stderr.strip().splitlines()[-1]
    assert "API_KEY" in line and "HF_TOKEN" in line and "environment" in line, line
    run = tuner("resume", study["name"], "--results", str(study["results"]), "--n-trials", "3",
                env={"API_KEY": API_KEY, "HF_TOKEN": HF_TOKEN, "DB_PASSWORD": PASSED})
    assert run.returncode == 0, run.stderr[-3000:]
    grep = subprocess.run(["grep", "-r", "-a", "-l", "-F", "-e", HF_TOKEN, "-e", API_KEY, "-e", PASSED,
                           str(study["results"])], capture_output=True, text=True)
    assert grep.stdout == ""
    assert not processes_with_env(study["marker"]) or not wait_no_orphans(study["marker"])
