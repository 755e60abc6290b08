"""``tuner.engine.measure`` against the simulator (a real process, started and stopped here)."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import run_tuner
from tests.sim_process import serving_sim
from tuner.engine.measure import MeasureError, format_summary, measure
from tuner.load.record_files import read_records_jsonl
from tuner.probe.client import load_probe_items
from tuner.probe.sample import known_sample
from tuner.study.study_file import parse_study

ROOT = Path(__file__).resolve().parents[1]

STUDY = """
name: measure-test
server:
  command: ["{{python}}", -m, tuner.sim]
  model: /models/smol
  served_model_name: {served}
load:
  api: completions
  concurrency: [1, 4]
  requests_per_stream: 2
  min_requests: 4
  warmup_requests: 2
  repeats: {repeats}
  workload:
    classes:
      - {{name: chat, kind: open_ended, prompt_tokens: 32, output_tokens: 12}}
probe:
  concurrency: [1, 2]
  min_accuracy: 0.0
"""


def study(served: str = "smol", repeats: int = 1):
    return parse_study(STUDY.format(served=served, repeats=repeats), "measure-test.yaml")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The simulator serving as 'smol' on a free port; process group killed at the end."""
    with serving_sim(tmp_path_factory.mktemp("sim")) as url:
        yield url


def test_measure_with_probe_writes_everything(sim: str, tmp_path: Path) -> None:
    out = tmp_path / "m"
    summary = measure(sim + "/v1", study(), probe=True, out_dir=out)
    assert summary["model"] == "smol" and summary["models_listed"] == ["smol"]
    assert summary["ignore_eos"] is True and summary["speculative"] is False
    # Without a reference: the bank's known answers, one item of every stratum (and the
    # shorter long-context items), at both probe levels - answered, not 404 on a /v1 URL.
    asked = len(known_sample(load_probe_items(study().probe), 0))
    assert summary["probe"] is not None and summary["probe"]["total"] == 2 * asked
    assert summary["probe"]["passed"], summary["probe"]["reason"]
    assert set(summary["levels"]) == {"1", "4"}
    for c, lv in summary["levels"].items():
        m = lv["metrics"]
        assert m["failed"] == 0 and m["completed"] == max(4, 2 * int(c))
        assert m["output_tok_s"] > 0 and m["tpot_ms.mean"] > 0
        assert lv["token_agreement"] is True
        records = read_records_jsonl(out / f"requests-c{c}.jsonl")
        assert len(records) == m["completed"] and all(r.output_tokens == 12 for r in records)
    assert json.loads((out / "summary.json").read_text()) == summary
    metrics = json.loads((out / "metrics.json").read_text())
    assert [lv["concurrency"] for lv in metrics["levels"]] == [1, 4]
    probe = json.loads((out / "probe.json").read_text())
    assert probe["total"] == 2 * asked
    text = format_summary(summary)
    assert "probe" in text and "smol" in text and str(out) in text
    assert len([ln for ln in text.splitlines() if ln.strip().startswith(("1 ", "4 "))]) == 2


def test_measure_discovers_the_model_and_repeats(sim: str, tmp_path: Path) -> None:
    summary = measure(sim, study(served="not-served", repeats=2), probe=False,
                      out_dir=tmp_path / "m")
    assert summary["model"] == "smol" and summary["probe"] is None
    assert any("does not list" in w for w in summary["warnings"])
    assert not (tmp_path / "m" / "probe.json").exists()
    for lv in summary["levels"].values():
        assert lv["repeats"] == 2 and lv["metrics"]["repeats"] == 2.0
    assert "median of 2" in format_summary(summary)


def test_measure_reports_and_saves_open_loop_rate_levels(sim: str, tmp_path: Path) -> None:
    text = STUDY.format(served="smol", repeats=1).replace(
        "  concurrency: [1, 4]\n", "  concurrency: [1]\n  request_rates: [20.0]\n  rate_duration_s: 0.5\n")
    spec = parse_study(text, "measure-test.yaml")
    out = tmp_path / "m"
    summary = measure(sim, spec, probe=False, out_dir=out)
    assert set(summary["levels"]) == {"1", "r20.0"}
    rate = summary["levels"]["r20.0"]["metrics"]
    assert rate["failed"] == 0 and rate["completed"] >= 4 and rate["output_tok_s"] > 0
    records = read_records_jsonl(out / "requests-r20.0.jsonl")
    assert len(records) == rate["completed"]
    rows = [ln.split()[0] for ln in format_summary(summary).splitlines()[3:5]]
    assert rows == ["1", "r20.0"]


def test_measure_unreachable_server_is_a_clear_error(tmp_path: Path) -> None:
    port = _free_port()
    with pytest.raises(MeasureError, match="cannot reach /v1/models"):
        measure(f"http://127.0.0.1:{port}", study(), probe=False, out_dir=tmp_path)


# -- `tuner measure` through the command line (a subprocess, as a user runs it) ---------


def _study_file(tmp_path: Path) -> Path:
    path = tmp_path / "measure-test.yaml"
    path.write_text(STUDY.format(served="smol", repeats=1))
    return path


def test_cli_measure_prints_and_saves_the_metrics(sim: str, tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    run = run_tuner("measure", str(_study_file(tmp_path)), "--url", sim, "--probe", "-o", str(out_dir),
                    timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    saved = json.loads((out_dir / "summary.json").read_text())
    asked = len(known_sample(load_probe_items(study().probe), 0))
    assert saved["url"] == sim and saved["model"] == "smol" and saved["probe"]["total"] == 2 * asked
    assert set(saved["levels"]) == {"1", "4"}
    # Every level's row is printed with the saved numbers (format_summary's 1-decimal rounding).
    rows = {ln.split()[0]: ln.split() for ln in run.stdout.splitlines()
            if ln.strip() and ln.split()[0] in saved["levels"]}
    assert set(rows) == {"1", "4"}, run.stdout
    for c, lv in saved["levels"].items():
        m = lv["metrics"]
        assert m["completed"] == max(4, 2 * int(c)) and m["failed"] == 0
        assert rows[c][1] == f"{m['output_tok_s']:,.1f}"
        assert rows[c][4] == f"{m['ttft_ms.p50']:,.1f}"
        assert len(read_records_jsonl(out_dir / f"requests-c{c}.jsonl")) == m["completed"]
    assert "probe passed" in run.stdout and f"files in {out_dir}" in run.stdout
    assert (out_dir / "probe.json").exists() and (out_dir / "metrics.json").exists()


def test_cli_measure_default_folder_is_under_results(sim: str, tmp_path: Path) -> None:
    run = run_tuner("measure", str(_study_file(tmp_path)), "--url", sim + "/v1",
                    "--results", str(tmp_path / "res"), timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    folders = list((tmp_path / "res" / "measure-test" / "measure").iterdir())
    assert len(folders) == 1 and (folders[0] / "summary.json").exists()
    assert not (folders[0] / "probe.json").exists()  # no --probe, no probe
    assert "probe" not in run.stdout.split("\n", 1)[1].split("times in ms")[0]


def test_cli_measure_server_down_exits_3_with_the_reason(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    run = run_tuner("measure", str(_study_file(tmp_path)), "--url", url, "-o", str(tmp_path / "o"),
                    timeout=120)
    assert run.returncode == 3, run.stdout + run.stderr
    assert f"error: {url}: cannot reach /v1/models" in run.stderr
    assert "Traceback" not in run.stderr and not (tmp_path / "o").exists()


def test_cli_measure_bad_study_file_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(STUDY.format(served="smol", repeats=1).replace("concurrency: [1, 4]", "concurrency: [0]"))
    run = run_tuner("measure", str(bad), "--url", "http://127.0.0.1:9", timeout=120)
    assert run.returncode == 2, run.stdout + run.stderr
    assert run.stderr.startswith("error: ") and "bad.yaml" in run.stderr and "concurrency" in run.stderr
    missing = run_tuner("measure", "--url", "http://127.0.0.1:9", timeout=60)
    assert missing.returncode == 2 and "file" in missing.stderr  # argparse: positional required


def test_cli_measure_refuses_to_overwrite_a_finished_trials_files(sim: str, tmp_path: Path) -> None:
    """-o into a trial's folder (a copy of a real one) would replace its measurements with
    another server's: refused, naming the files, unless --force."""
    import shutil

    from tests.conftest import CPU_EXAMPLE

    trial = tmp_path / "trial"
    shutil.copytree(CPU_EXAMPLE / "trials" / "0000", trial)
    before = {p.name: p.read_bytes() for p in trial.iterdir()}
    run = run_tuner("measure", str(_study_file(tmp_path)), "--url", sim + "/v1", "-o", str(trial), timeout=300)
    assert run.returncode == 2, run.stdout + run.stderr
    assert run.stderr.startswith(f"error: -o {trial}: holds command.json, metrics.json, outcome.json")
    assert "--force to overwrite them" in run.stderr
    assert {p.name: p.read_bytes() for p in trial.iterdir()} == before
    forced = run_tuner("measure", str(_study_file(tmp_path)), "--url", sim + "/v1", "-o", str(trial), "--force",
                       timeout=300)
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert (trial / "metrics.json").read_bytes() != before["metrics.json"] and (trial / "summary.json").exists()
