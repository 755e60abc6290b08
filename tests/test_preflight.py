"""Pre-flight (issue 39, item 15): a study this machine cannot run is refused before Ray or
any server starts, every problem on its own line - the server executable (on the PATH the
server gets, or a script whose interpreter is gone), the model path, the GPUs nvidia-smi
shows, the ports. Pure rules first, then the gathering on real files, sockets and a stand-in
nvidia-smi, then `tuner run`, `tuner resume` and `tuner validate --preflight` as a user runs
them."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, free_port_block, run_tuner, write_study
from tuner.adapters.preflight import command_facts, gather, gpu_facts, port_state
from tuner.study.preflight import CommandFacts, HostFacts, group_count, problems, summary
from tuner.study.study_file import parse_study

DEMO = (ROOT / "search_spaces" / "demo.yaml").read_text()
GLM5 = (ROOT / "search_spaces" / "glm5-8xpcie.yaml").read_text()


def _spec(text: str, **server: object):
    data = yaml.safe_load(text)
    data["server"].update(server)
    return parse_study(yaml.safe_dump(data))


def _found(word: str = "vllm") -> CommandFacts:
    return CommandFacts(word, f"/usr/bin/{word}", exists=True, search_path="/usr/bin")


# -- the rules (pure) --------------------------------------------------------------------


def test_every_problem_is_one_line_naming_its_field_and_value() -> None:
    spec = _spec(GLM5, port=8000)
    facts = HostFacts(
        command=CommandFacts("vllm", None, search_path="/usr/bin:/bin"),
        model_exists=False, gpus=("NVIDIA H200",), ports={8000: "is already in use (held by pid 4242)"})
    lines = problems(spec, facts)
    assert lines == [
        "server.command: 'vllm' is not on the PATH the server inherits (/usr/bin:/bin); install it, give its "
        "full path, or activate the environment that has it before `tuner run`",
        "server.model: '/models/GLM-5-UD-Q4_K_XL.gguf' does not exist on this machine; copy the model there, "
        "fix the path, or give a hub id (org/name) for the server to download",
        "server.gpus_per_trial: 8 GPU(s) per trial, but nvidia-smi shows 1 (1 x NVIDIA H200) on this machine; "
        "lower server.gpus_per_trial (and tensor_parallel_size with it) or run on a box with more GPUs",
        "server.port: port 8000 on 127.0.0.1 is already in use (held by pid 4242); stop that process, or "
        "choose another server.port",
    ]
    assert all("\n" not in line for line in lines)


def test_what_is_no_problem() -> None:
    spec = _spec(GLM5, port=8000)
    ok = HostFacts(command=_found(), model_exists=True, gpus=("NVIDIA RTX PRO 6000",) * 8, ports={8000: None})
    assert problems(spec, ok) == []
    assert summary(spec, ok) == ("server /usr/bin/vllm; model /models/GLM-5-UD-Q4_K_XL.gguf found; "
                                 "8 x NVIDIA RTX PRO 6000 for 1 group(s) of 8; port(s) 8000 free on 127.0.0.1")
    # A hub id is the server's to download; only a path that is not there is a problem.
    hub = _spec(GLM5, model="zai-org/GLM-5")
    assert problems(hub, HostFacts(command=_found(), model_exists=False, gpus=("G",) * 8)) == []
    # The simulator reads no model and needs no GPU; without nvidia-smi GPUs are declared to Ray.
    demo = _spec(DEMO)
    sim = HostFacts(command=CommandFacts("{python}", sys.executable, exists=True), model_exists=None,
                    gpus=None, ports={18000: None})
    assert problems(demo, sim) == []
    assert "no nvidia-smi here, so 8 GPU(s) are declared to Ray, not checked" in summary(demo, sim)


def test_gpus_nvidia_smi_cannot_see_or_that_are_hidden() -> None:
    spec = _spec(GLM5)
    broken = HostFacts(command=_found(), gpu_error="NVIDIA-SMI has failed because it couldn't communicate with "
                                                   "the NVIDIA driver")
    assert problems(spec, broken) == [
        "server.gpus_per_trial: the study asks for 8 GPU(s) per trial, but nvidia-smi failed (NVIDIA-SMI has "
        "failed because it couldn't communicate with the NVIDIA driver); fix the driver first (run `nvidia-smi`)"]
    hidden = HostFacts(command=_found(), gpus=("G",) * 8, visible_devices="0,1,2,3")
    assert problems(spec, hidden) == [
        "server.gpus_per_trial: 8 GPU(s) per trial, but nvidia-smi shows 8 (8 x G), CUDA_VISIBLE_DEVICES='0,1,2,3' "
        "leaves 4 on this machine; lower server.gpus_per_trial (and tensor_parallel_size with it) or run on a "
        "box with more GPUs"]


def test_each_gpu_group_binds_its_own_port() -> None:
    spec = _spec(GLM5, port=9000, gpus_per_trial=2, flags={"tensor_parallel_size": 2})
    assert group_count(spec, 8) == 4 and group_count(spec, None) == 1 and group_count(spec, 1) == 1
    facts = HostFacts(command=_found(), gpus=("G",) * 8,
                      ports={9000: None, 9001: None, 9002: "is already in use", 9003: None})
    assert problems(spec, facts) == [
        "server.port + 2 (GPU group 2): port 9002 on 127.0.0.1 is already in use; stop that process, or choose "
        "another server.port"]


def test_a_script_whose_interpreter_is_gone_and_a_file_that_cannot_run() -> None:
    spec = _spec(GLM5)
    gone = CommandFacts("vllm", "/opt/old/bin/vllm", exists=True, missing_interpreter="/opt/old/bin/python3")
    assert problems(spec, HostFacts(command=gone, gpus=("G",) * 8)) == [
        "server.command: /opt/old/bin/vllm starts with '#!/opt/old/bin/python3', which does not exist (a virtual "
        "environment moved or deleted?); reinstall it, or name the interpreter in server.command"]
    flat = CommandFacts("./serve.sh", None, exists=True)
    assert problems(_spec(GLM5, command=["./serve.sh"]), HostFacts(command=flat, gpus=("G",) * 8)) == [
        "server.command: './serve.sh' is not executable; chmod +x it, or name its interpreter first"]


# -- the gathering (files, PATH, sockets, a stand-in nvidia-smi) ---------------------------


def _script(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_the_server_environments_path_is_the_one_searched(tmp_path: Path) -> None:
    _script(tmp_path / "kit", "vllm", f"#!{sys.executable}\n")
    assert command_facts("vllm", {"PATH": str(tmp_path / "kit")}).path == str(tmp_path / "kit" / "vllm")
    missing = command_facts("vllm", {"PATH": str(tmp_path)})
    assert (missing.path, missing.path_from_server_env, missing.search_path) == (None, True, str(tmp_path))
    # An entry point left by a deleted virtual environment: found, but its interpreter is gone.
    _script(tmp_path / "old", "vllm", f"#!{tmp_path}/deleted-venv/bin/python3\nimport vllm\n")
    orphan = command_facts("vllm", {"PATH": str(tmp_path / "old")})
    assert orphan.missing_interpreter == f"{tmp_path}/deleted-venv/bin/python3"
    assert command_facts("{python}", {}).path == sys.executable


def test_a_port_someone_listens_on_is_named_with_its_owner() -> None:
    port = free_port_block(1)
    assert port_state("127.0.0.1", port) == (None, None)
    with socket.socket() as held:
        held.bind(("127.0.0.1", port))
        held.listen()
        why, host_error = port_state("127.0.0.1", port)
    assert host_error is None and why == f"is already in use (held by pid {os.getpid()})"
    assert port_state("10.255.255.1", port)[1] == "Cannot assign requested address"


def test_nvidia_smi_listing_and_failing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    answer = "NVIDIA H200\nNVIDIA H200\n"
    _script(tmp_path / "ok", "nvidia-smi", f"#!{sys.executable}\nimport sys\nsys.stdout.write({answer!r})\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'ok'}{os.pathsep}{os.environ['PATH']}")
    assert gpu_facts() == (("NVIDIA H200", "NVIDIA H200"), None)
    failing = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that "
               "the latest NVIDIA driver is installed and running.")
    _script(tmp_path / "bad", "nvidia-smi", f"#!{sys.executable}\nimport sys\nprint({failing!r})\nsys.exit(9)\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bad'}{os.pathsep}{os.environ['PATH']}")
    assert gpu_facts() == (None, failing[:200])
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert gpu_facts() == (None, None)


def test_gather_for_the_demo_on_a_box_without_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    port = free_port_block(1)
    spec = _spec(DEMO, port=port)
    facts = gather(spec)
    # The simulator study as shipped: its model path does not exist and need not; its eight
    # GPUs are declared to Ray.
    assert (facts.model_exists, facts.gpus, facts.ports) == (None, None, {port: None})
    assert problems(spec, facts) == []


# -- as a user runs it -----------------------------------------------------------------


def _broken_study(tmp_path: Path) -> tuple[Path, str, socket.socket]:
    """A copy of the demo that cannot start here: a server command nowhere on PATH, a model
    path that is not there, its port held, and a stand-in nvidia-smi showing one GPU while
    the study asks for eight."""

    path, marker = write_study(tmp_path, updates={"server.command": ["no-such-vllm-here", "serve"],
                                                  "server.model": str(tmp_path / "models" / "GLM-5.gguf")})
    port = yaml.safe_load(path.read_text())["server"]["port"]
    held = socket.socket()
    held.bind(("127.0.0.1", port))
    held.listen()
    return path, marker, held


def test_run_refuses_before_anything_starts_naming_every_problem(tmp_path: Path) -> None:
    path, marker, held = _broken_study(tmp_path)
    smi = _script(tmp_path / "bin", "nvidia-smi", f"#!{sys.executable}\nprint('NVIDIA H200')\n")
    env_path = f"{smi.parent}{os.pathsep}{os.environ['PATH']}"
    results = tmp_path / "results"
    began = time.monotonic()
    try:
        run = subprocess.run([sys.executable, "-m", "tuner", "run", str(path), "--results", str(results)],
                             cwd=ROOT, capture_output=True, text=True, timeout=300,
                             env={**os.environ, "PATH": env_path})
    finally:
        held.close()
    took = time.monotonic() - began
    assert run.returncode == 3, (run.returncode, run.stdout[-2000:], run.stderr[-2000:])
    lines = run.stderr.strip().splitlines()
    assert lines[0].startswith("error: the study cannot start on this machine; nothing was started. "
                               "4 problem(s) found before any server or Ray:")
    assert lines[1].startswith("  server.command: 'no-such-vllm-here' is not on the PATH the server inherits")
    assert lines[2].startswith(f"  server.model: '{tmp_path}/models/GLM-5.gguf' does not exist on this machine")
    assert lines[3].startswith("  server.gpus_per_trial: 8 GPU(s) per trial, but nvidia-smi shows 1 "
                               "(1 x NVIDIA H200) on this machine")
    assert lines[4].startswith(f"  server.port: port {yaml.safe_load(path.read_text())['server']['port']} on "
                               f"127.0.0.1 is already in use (held by pid {os.getpid()})")
    assert len(lines) == 5 and "Traceback" not in run.stderr
    # Nothing started, nothing written: no Ray, no study folder to refuse the corrected file later.
    assert "[worker]" not in run.stdout and "[reference]" not in run.stdout
    assert not results.exists()
    assert took < 60, f"the refusal took {took:.1f}s"


@pytest.mark.slow
def test_resume_checks_again_once_its_leftovers_are_gone(tmp_path: Path, orphan_check: list[str]) -> None:
    # A study that ran, whose server command has since disappeared (its environment deleted).
    kit = tmp_path / "kit"
    _script(kit, "sim-server", f"#!{sys.executable}\nimport runpy, sys\nsys.argv[0] = 'tuner.sim'\n"
                               "runpy.run_module('tuner.sim', run_name='__main__')\n")
    path, marker = write_study(tmp_path, updates={"server.command": [str(kit / "sim-server")],
                                                  "server.model": "glm5-id", "probe.enabled": False,
                                                  "budget.n_trials": 1, "confirm": {"candidates": 0}})
    orphan_check.append(marker)
    results = tmp_path / "results"
    first = run_tuner("run", str(path), "--results", str(results), timeout=600)
    assert first.returncode == 0, first.stderr[-2000:]
    (kit / "sim-server").unlink()
    name = path.stem
    before = sorted(p.name for p in (results / name).iterdir())
    again = run_tuner("resume", name, "--results", str(results), "--n-trials", "2", timeout=300)
    assert again.returncode == 3, (again.stdout[-2000:], again.stderr[-2000:])
    assert again.stderr.splitlines()[1] == (f"  server.command: '{kit / 'sim-server'}' does not exist; give the "
                                            "path of vLLM's executable or interpreter")
    assert "[worker]" not in again.stdout
    assert sorted(p.name for p in (results / name).iterdir()) == before
    assert "[preflight] server " + str(kit / "sim-server") in first.stdout


def test_validate_preflight(tmp_path: Path) -> None:
    path, _marker, held = _broken_study(tmp_path)
    held.close()
    out = run_tuner("validate", str(path), "--preflight", timeout=120)
    assert out.returncode == 3, out.stderr
    assert "valid study" in out.stdout     # the file itself is fine
    problems_said = [line for line in out.stderr.splitlines() if line.startswith("  server.")]
    assert [line.split(":")[0].strip() for line in problems_said] == ["server.command", "server.model"]
    demo, _ = write_study(tmp_path)
    ok = run_tuner("validate", str(demo), "--preflight", timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "[preflight] server the built-in simulator" in ok.stdout
