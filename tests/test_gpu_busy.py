"""A trial whose GPU another process holds: nvidia-smi's listing parsed (processes by name and
memory, and memory held by processes it cannot list), the worker waiting a bounded time and
then either starting or failing `gpus_not_free` without starting a server."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import sys
import uuid
from pathlib import Path

import pytest

from tests.conftest import ROOT, free_port_block, wait_no_orphans
from tuner.adapters import gpu
from tuner.engine.worker import TrialWorker
from tuner.study.outcome import TrialOutcome, TrialRequest

H200 = "GPU-5f3c8a61-7d2e-4b0a-9c1e-2a4b6c8d0e1f"
# `nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory,process_name --format=csv,noheader,nounits`
# and `--query-gpu=index,uuid,memory.used,memory.total` on one H200 (143,771 MiB) while a
# python3 process holds 20 GiB with torch (plus its CUDA context).
APPS_BUSY = f"{H200}, 4242, 20996, /usr/bin/python3\n"
GPUS_BUSY = f"0, {H200}, 21003, 143771\n"
GPUS_IDLE = f"0, {H200}, 1, 143771\n"


def test_compute_apps_with_process_names() -> None:
    apps = gpu.parse_compute_apps(APPS_BUSY + f"{H200}, 77, 512, [Not Found]\n"
                                  f"{H200}, 78, 100, python3 -c import torch, time\n")
    assert [(a.pid, a.used_mib, a.name) for a in apps] == [
        (4242, 20996, "/usr/bin/python3"), (77, 512, ""), (78, 100, "python3 -c import torch, time")]
    assert gpu.parse_gpu_memory(GPUS_BUSY + "garbage\n") == [gpu.GpuMemory("0", H200, 21003, 143771)]


def test_busy_by_listed_process_or_by_unexplained_memory() -> None:
    apps, memory = gpu.parse_compute_apps(APPS_BUSY), gpu.parse_gpu_memory(GPUS_BUSY)
    busy = gpu.busy_on(apps, memory, {H200})
    assert busy and busy.processes == tuple(apps) and busy.unseen_mib == ()
    assert busy.text() == "pid 4242 (/usr/bin/python3, 20996 MiB)"
    # A container that cannot see the holder's PID: nvidia-smi lists nobody, the memory is used.
    hidden = gpu.busy_on([], memory, {H200})
    assert hidden and hidden.unseen_mib == (("0", 21003),)
    assert "21003 MiB on GPU 0 held by processes nvidia-smi does not list" in hidden.text()
    assert not gpu.busy_on([], gpu.parse_gpu_memory(GPUS_IDLE), {H200})
    assert not gpu.busy_on(apps, memory, {"GPU-other"}), "another group's GPU is not ours"
    assert gpu.busy_on(apps, memory, None), "no CUDA_VISIBLE_DEVICES: every GPU counts"


FAKE_SMI = """#!{python}
# Answers the two queries the worker makes like nvidia-smi on an H200 where a python3 process
# holds 20 GiB, until the state file says it has gone (after FREE_AFTER compute-apps queries).
import sys
from pathlib import Path
state = Path({state!r})
calls = int(state.read_text()) if state.exists() else 0
free_after = {free_after}
if any(a.startswith("--query-compute-apps") for a in sys.argv):
    state.write_text(str(calls + 1))
    busy = free_after < 0 or calls < free_after
    sys.stdout.write({apps!r} if busy else "")
    sys.exit(0)
busy = free_after < 0 or calls <= free_after
sys.stdout.write({gpus_busy!r} if busy else {gpus_idle!r})
"""


def _fake_smi(tmp_path: Path, free_after: int) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir()
    smi = folder / "nvidia-smi"
    smi.write_text(FAKE_SMI.format(python=sys.executable, state=str(tmp_path / "calls"), free_after=free_after,
                                   apps=APPS_BUSY, gpus_busy=GPUS_BUSY, gpus_idle=GPUS_IDLE))
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    return folder


@pytest.fixture
def marker(orphan_check: list[str]) -> str:
    value = uuid.uuid4().hex[:12]
    orphan_check.append(value)
    return value


def _request(tmp_path: Path, marker: str, gpu_free_timeout_s: float) -> dict:
    # The server, if it is ever started, prints vLLM's argparse rejection and exits at once.
    argv = [sys.executable, "-c", "import sys; print(\"KeyError: 'BOGUS'\", flush=True); sys.exit(1)"]
    return TrialRequest(
        study="gpu-busy", number=0, values={}, asked={}, argv=argv,
        env={"TUNER_TEST_ID": marker, "PYTHONPATH": str(ROOT)}, host="127.0.0.1", port=free_port_block(1),
        served_model_name="smol", trial_dir=str(tmp_path / "trial"), startup_timeout_s=30, stop_timeout_s=2,
        gpu_free_timeout_s=gpu_free_timeout_s, deadline_s=gpu_free_timeout_s + 60, load={}, probe={},
        ignore_eos=True).model_dump(mode="json")


def test_a_held_gpu_fails_the_trial_without_starting_a_server(tmp_path: Path, marker: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{_fake_smi(tmp_path, free_after=-1)}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    outcome = TrialOutcome.model_validate(asyncio.run(TrialWorker().run_trial(_request(tmp_path, marker, 1.5))))
    assert (outcome.status, outcome.reason, outcome.phase) == ("failed", "gpus_not_free", "prepare")
    assert outcome.message == ("the trial's GPUs are still in use after waiting 1.5s: pid 4242 "
                               "(/usr/bin/python3, 20996 MiB); the server was not started")
    # Bounded by the timeout plus one look (two nvidia-smi starts, slow on a loaded host).
    assert 1.5 <= outcome.gpu_wait_s < 30.0
    assert not (tmp_path / "trial" / "server.log").exists() and outcome.startup is None
    saved = json.loads((tmp_path / "trial" / "outcome.json").read_text())
    assert saved["reason"] == "gpus_not_free" and saved["gpu_wait_s"] == outcome.gpu_wait_s
    assert not wait_no_orphans(marker)


def test_a_gpu_freed_during_the_wait_lets_the_trial_start(tmp_path: Path, marker: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{_fake_smi(tmp_path, free_after=3)}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    # The holder goes after three looks, each of which starts two nvidia-smi processes (here
    # Python scripts). On a loaded 2-core CI host those starts took over 30 s in all
    # (2026-12-03), so the bound is generous: the test is about the order of events.
    outcome = TrialOutcome.model_validate(asyncio.run(TrialWorker().run_trial(_request(tmp_path, marker, 240))))
    # It waited for the holder to go, then started the server (which rejected its arguments).
    assert (outcome.phase, outcome.reason) == ("start", "invalid_config"), outcome.message
    assert 0.4 <= outcome.gpu_wait_s < 240.0
    assert any(w.startswith("waited ") and "pid 4242 (/usr/bin/python3, 20996 MiB)" in w for w in outcome.warnings)
    assert (tmp_path / "trial" / "server.log").exists()
    assert not wait_no_orphans(marker)
