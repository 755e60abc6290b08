"""An edited spec.yaml is never taken for the spec a study was measured with (issue 39,
item 6): `tensor_parallel_size: 8` changed to 4 in a finished study's spec.yaml made
`export` print `--tensor-parallel-size 4` and `resume` run new trials with 4.

study.json records what spec.yaml held when the study was created (``saved_spec``);
export, report, resume and confirm refuse a file that differs (exit 3, naming the file and
each changed field), status shows the study and says so. A study without that record (an
older study.json, a folder copied without one) is held to its trials' recorded commands.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, run_tuner, wait_no_orphans, write_study
from tuner.errors import StudyError
from tuner.store.handle import create_or_open, open_existing
from tuner.study.study_file import parse_study

EDIT = ("tensor_parallel_size: 8", "tensor_parallel_size: 4")
CHANGE = "server.flags.tensor_parallel_size: 8 -> 4"


def _edit(spec_yaml: Path, old: str, new: str) -> None:
    text = spec_yaml.read_text()
    assert old in text
    spec_yaml.write_text(text.replace(old, new, 1))


# -- the record and its comparison, without a server ---------------------------------------


@pytest.mark.parametrize("file", sorted(p.name for p in (ROOT / "search_spaces").glob("*.yaml")))
def test_a_study_as_created_reads_back_unchanged(tmp_path: Path, file: str) -> None:
    spec = parse_study((ROOT / "search_spaces" / file).read_text(), file)
    handle = create_or_open(spec, tmp_path)
    assert open_existing(tmp_path, handle.name).spec_changes == []
    assert json.loads(handle.paths.study_json.read_text())["saved_spec"]["digest"]


@pytest.fixture
def demo(tmp_path: Path):
    spec = parse_study((ROOT / "search_spaces" / "demo.yaml").read_text(), "demo.yaml")
    return create_or_open(spec, tmp_path)


def test_an_edited_field_is_refused_by_name(demo, tmp_path: Path) -> None:
    _edit(demo.paths.spec_yaml, *EDIT)
    with pytest.raises(StudyError) as err:
        open_existing(tmp_path, demo.name)
    message = str(err.value)
    assert str(demo.paths.spec_yaml) in message and CHANGE in message, message
    assert "--study NEW_NAME" in message and "\n" not in message
    assert open_existing(tmp_path, demo.name, edited_spec_ok=True).spec_changes == [CHANGE]
    with pytest.raises(StudyError, match="tensor_parallel_size"):
        create_or_open(parse_study((ROOT / "search_spaces" / "demo.yaml").read_text(), "demo.yaml"), tmp_path)


def test_what_does_not_decide_a_measurement_may_change(demo, tmp_path: Path) -> None:
    data = yaml.safe_load(demo.paths.spec_yaml.read_text())
    data["budget"]["n_trials"] = 40
    data["description"] = "longer now"
    data["server"]["port"] += 7
    data["execution"]["parallel_trials"] = 2
    demo.paths.spec_yaml.write_text("# reformatted by hand\n" + yaml.safe_dump(data, sort_keys=True))
    assert open_existing(tmp_path, demo.name).spec.budget.n_trials == 40


def test_added_removed_and_secret_fields_are_named_but_a_secret_is_never_shown(demo, tmp_path: Path) -> None:
    data = yaml.safe_load(demo.paths.spec_yaml.read_text())
    data["server"]["env"]["HF_TOKEN"] = "hf_abcdefghijklmnop"
    del data["server"]["env"]["VLLM_ALLREDUCE_USE_SYMM_MEM"]
    data["load"]["concurrency"] = [1, 8]
    demo.paths.spec_yaml.write_text(yaml.safe_dump(data, sort_keys=False))
    changes = open_existing(tmp_path, demo.name, edited_spec_ok=True).spec_changes
    assert "server.env.HF_TOKEN: (a secret's value; not shown)" in changes
    assert "server.env.VLLM_ALLREDUCE_USE_SYMM_MEM: 0 -> (absent)" in changes
    assert "load.concurrency[1]: 16 -> 8" in changes, changes
    assert not any("hf_abcdefghijklmnop" in c for c in changes)


# -- on a real (simulated) study -----------------------------------------------------------


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("spec39")
    path, marker = write_study(tmp)
    results = tmp / "results"
    run = run_tuner("run", str(path), "--results", str(results), "--n-trials", "2", timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    yield {"name": path.stem, "results": results}
    assert not wait_no_orphans(marker)


def _edited_copy(study: dict, tmp_path: Path, *, keep: tuple[str, ...] = ("optuna.db", "study.json")) -> Path:
    results = tmp_path / "copy"
    left_out = {"optuna.db", "study.json"} - set(keep)
    shutil.copytree(study["results"] / study["name"], results / study["name"],
                    ignore=shutil.ignore_patterns("run.lock", *left_out))
    _edit(results / study["name"] / "spec.yaml", *EDIT)
    return results


def _refused(run, where: Path) -> str:
    assert run.returncode == 3, (run.returncode, run.stdout[-1500:], run.stderr[-1500:])
    line = run.stderr.strip().splitlines()[-1]
    assert "Traceback" not in run.stderr and str(where) in line, run.stderr[-1500:]
    return line


@pytest.mark.slow
def test_export_report_and_resume_refuse_an_edited_spec(study: dict, tmp_path: Path) -> None:
    results = _edited_copy(study, tmp_path)
    folder = results / study["name"]
    before = {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    export = run_tuner("export", study["name"], "--results", str(results), "--trial", "0")
    assert CHANGE in _refused(export, folder / "spec.yaml") and export.stdout == ""
    report = run_tuner("report", study["name"], "--results", str(results), "-o", str(tmp_path / "rep"))
    assert CHANGE in _refused(report, folder / "spec.yaml")
    resume = run_tuner("resume", study["name"], "--results", str(results), "--n-trials", "3", timeout=300)
    assert CHANGE in _refused(resume, folder / "spec.yaml")
    after = {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    assert after == before, "a refused command changed the study folder"

    status = run_tuner("status", study["name"], "--results", str(results), "--brief")
    assert status.returncode == 0, status.stderr
    assert f"!! spec.yaml was edited after the study was created ({CHANGE})" in status.stdout, status.stdout
    as_json = json.loads(run_tuner("status", study["name"], "--results", str(results), "--json").stdout)
    assert as_json["spec_changes"] == [CHANGE] and as_json["finished_trials"] == 2


@pytest.mark.slow
def test_a_study_without_the_record_is_held_to_its_trials_commands(study: dict, tmp_path: Path) -> None:
    """An older study.json (no saved_spec), and a folder copied without study.json or
    optuna.db (as results/examples/smollm2-cpu): the trials' command.json say what ran."""

    results = _edited_copy(study, tmp_path)
    meta = json.loads((results / study["name"] / "study.json").read_text())
    del meta["saved_spec"]
    (results / study["name"] / "study.json").write_text(json.dumps(meta))
    files_only = _edited_copy(study, tmp_path / "files", keep=())
    for where in (results, files_only):
        export = run_tuner("export", study["name"], "--results", str(where), "--trial", "0")
        line = _refused(export, where / study["name"] / "spec.yaml")
        assert "trial 0's command: --tensor-parallel-size 8 -> --tensor-parallel-size 4" in line, line
        assert "what their command.json says" in line
    unedited = tmp_path / "unedited"
    shutil.copytree(study["results"] / study["name"], unedited / study["name"],
                    ignore=shutil.ignore_patterns("run.lock", "optuna.db", "study.json"))
    export = run_tuner("export", study["name"], "--results", str(unedited), "--trial", "0")
    assert export.returncode == 0 and "--tensor-parallel-size 8" in export.stdout, export.stderr
