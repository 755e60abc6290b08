"""The spare interpreter of execution.startup.prestart (issue 35): started ahead, released into a
real server process (the simulator), refused where its imports could have seen a difference,
and never left behind."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

from tests.conftest import free_port_block
from tuner.adapters.launcher import TAG_VAR, ServerProcess
from tuner.adapters.spare import Spare, env_refusal, spare_target
from tuner.engine.prestart import SPARE_TAG_SUFFIX, SpareSlot, imports_ahead, startup_seconds


def _wait_status(spare: Spare, timeout_s: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while spare.status() is None and spare.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    status = spare.status()
    assert status is not None, "the spare never finished its imports"
    return status


def _module(tmp_path: Path, name: str, body: str) -> dict[str, str]:
    """A module the spare can import (its folder on PYTHONPATH), and the environment for it."""
    (tmp_path / f"{name}.py").write_text(body)
    return {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)}


def test_command_forms() -> None:
    assert spare_target(["/opt/py", "-m", "vllm.entrypoints.openai.api_server", "--port", "1"]) == (
        "/opt/py", "vllm.entrypoints.openai.api_server", ["--port", "1"])
    assert spare_target(["vllm", "serve", "m"]) is None
    assert spare_target(["python", "-X", "importtime", "-m", "vllm"]) is None


def test_env_rule() -> None:
    base = {"A": "1", "TUNER_SERVER_GROUP": "s:r:0:spare"}
    # Added, never looked up: fine. The tuner's own tag may differ.
    assert env_refusal(base, {**base, "NCCL_PROTO": "LL", "TUNER_SERVER_GROUP": "s:r:0"}, ["A"],
                       ignored=("TUNER_SERVER_GROUP",)) is None
    # Looked up by name during the imports (even while absent): its value is fixed now.
    assert "NCCL_PROTO" in env_refusal(base, {**base, "NCCL_PROTO": "LL"}, ["NCCL_PROTO"])
    # Changed and read: refused; read but unchanged: fine.
    assert "A" in env_refusal(base, {**base, "A": "2"}, ["A"])
    assert env_refusal(base, dict(base), ["A", "TUNER_SERVER_GROUP"]) is None
    # Native libraries read these as they load, where no Python hook sees it.
    assert "PYTORCH_CUDA_ALLOC_CONF" in env_refusal(base, {**base, "PYTORCH_CUDA_ALLOC_CONF": "x"}, [])
    assert "LD_PRELOAD" in env_refusal(base, {**base, "LD_PRELOAD": "x"}, [])


def test_records_what_its_imports_read_and_refuses_a_change_there(tmp_path: Path) -> None:
    # What the server module imports is imported ahead (the module itself runs at release).
    _module(tmp_path, "readsknob", "import os\nKNOB = os.environ.get('KNOB_AT_IMPORT')\n")
    env = _module(tmp_path, "servermod", "import readsknob\n")
    spare = Spare(python=sys.executable, module="servermod", env=env)
    spare.spawn()
    try:
        status = _wait_status(spare)
        assert "KNOB_AT_IMPORT" in status["env_read"] and status["cuda_initialized"] is False
        reason = spare.refusal(sys.executable, "servermod", {**env, "KNOB_AT_IMPORT": "1"})
        assert reason is not None and "KNOB_AT_IMPORT" in reason
        assert spare.refusal(sys.executable, "servermod", {**env, "OTHER": "1"}) is None
        assert "command changed" in spare.refusal(sys.executable, "othermodule", env)
    finally:
        spare.discard()
    assert spare.process is None and spare.folder is None


def test_ends_at_once_when_discarded_mid_import(tmp_path: Path) -> None:
    _module(tmp_path, "slowimport", "import time\ntime.sleep(120)\n")
    env = _module(tmp_path, "slowserver", "import slowimport\n")
    spare = Spare(python=sys.executable, module="slowserver", env=env)
    spare.spawn()
    process = spare.process
    assert process is not None
    time.sleep(0.5)   # inside its imports now
    began = time.monotonic()
    spare.discard(grace_s=10)
    # End of input ends it, imports or not: well before the 10 s grace would kill it.
    assert process.returncode == 0 and time.monotonic() - began < 5


def test_a_spare_whose_imports_start_cuda_leaves_and_turns_prestart_off(tmp_path: Path) -> None:
    # A stand-in torch whose CUDA reports itself initialised (a real import doing so would
    # hold the GPU and make a forked engine spawn).
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(
        "class cuda:\n    @staticmethod\n    def is_initialized():\n        return True\n")
    env = _module(tmp_path, "usescuda", "import torch\n")
    slot = SpareSlot()
    argv = [sys.executable, "-m", "usescuda"]
    slot.start_next(argv, env, relayed=False)
    spare = slot.spare
    assert spare is not None and spare.process is not None
    spare.process.wait(timeout=60)
    assert spare.process.returncode == 3
    taken, note = slot.take(argv, env, relayed=False)
    assert taken is None and note["used"] is False
    assert slot.off is not None and "CUDA" in slot.off
    slot.start_next(argv, env, relayed=False)
    assert slot.spare is None   # off for the rest of the run


def test_slot_drops_searched_variables_and_tags_the_spare_apart() -> None:
    slot = SpareSlot()
    env = {"PATH": "/usr/bin:/bin", TAG_VAR: "study:run:0", "NCCL_PROTO": "LL", "KEEP": "1"}
    slot.start_next([sys.executable, "-m", "json.tool", "--help"], env, relayed=False, searched=["NCCL_PROTO"])
    try:
        assert slot.spare is not None
        assert "NCCL_PROTO" not in slot.spare.env and slot.spare.env["KEEP"] == "1"
        # Not the group's tag while it waits: the stop of the server now starting ends every
        # process with that tag.
        assert slot.spare.env[TAG_VAR] == "study:run:0" + SPARE_TAG_SUFFIX
    finally:
        slot.discard()
    # A relayed server (secrets in its output) or another command form gets no spare.
    slot.start_next([sys.executable, "-m", "json.tool"], env, relayed=True)
    assert slot.spare is None
    slot.start_next(["vllm", "serve", "m"], env, relayed=False)
    assert slot.spare is None


def test_seconds_of_a_start_with_and_without_a_spare() -> None:
    assert startup_seconds(30.0, None) == (30.0, None)
    assert startup_seconds(30.0, {"used": False, "reason": "x"}) == (30.0, None)
    assert startup_seconds(30.0, {"used": True, "import_s": 14.5}) == (44.5, 30.0)
    assert imports_ahead({"used": True, "import_s": 14.5}) == 14.5


def test_released_into_a_real_server(tmp_path: Path) -> None:
    """The simulator's interpreter, imported ahead, becomes the server: it answers, its log
    holds both what it printed while importing and the server's own lines, and its stop
    leaves nothing."""
    port = free_port_block(1)
    argv = [sys.executable, "-m", "tuner.sim", "--model", "m", "--served-model-name", "m",
            "--port", str(port), "--host", "127.0.0.1", "--tensor-parallel-size", "8"]
    env = {**os.environ, "TUNER_SIM_PROFILE": "glm5-8xpcie", "TUNER_SIM_STARTUP_SCALE": "0.001"}
    slot = SpareSlot()
    slot.start_next(argv, {**env, TAG_VAR: "t:r:0"}, relayed=False)
    assert slot.spare is not None
    _wait_status(slot.spare)
    server = ServerProcess(argv, env, tmp_path / "server.log", host="127.0.0.1", port=port,
                           served_model_name="m", tag="t:r:0", stop_grace_s=10)
    spare, note = slot.take(argv, server.env, relayed=False)
    assert spare is not None and note["used"] is True and note["import_s"] > 0, note
    spare_pid = spare.pid

    async def run() -> None:
        server.start(spare)
        assert server.pid == spare_pid   # the same process, no new spawn
        await server.wait_ready(60)
        report = await server.stop(10)
        assert report.leftover_pids == []

    asyncio.run(run())
    log = (tmp_path / "server.log").read_text()
    assert "Starting vLLM" in log or "Application startup complete" in log, log[-2000:]
    assert not Path(f"/proc/{spare_pid}").exists() or "Z" in Path(f"/proc/{spare_pid}/stat").read_text().split()[2]


def test_status_json_is_written_atomically(tmp_path: Path) -> None:
    env = _module(tmp_path, "quick", "X = 1\n")
    spare = Spare(python=sys.executable, module="quick", env=env)
    spare.spawn()
    try:
        status = _wait_status(spare)
        assert set(status) >= {"pid", "import_s", "imported", "failed", "env_read", "cuda_initialized"}
        assert spare.folder is not None and not list(spare.folder.glob("*.tmp"))
        json.dumps(status)
    finally:
        spare.discard()


def test_a_server_whose_output_is_relayed_starts_cold(tmp_path: Path) -> None:
    env = _module(tmp_path, "quick2", "X = 1\n")
    slot = SpareSlot()
    argv = [sys.executable, "-m", "quick2"]
    slot.start_next(argv, env, relayed=False)
    assert slot.spare is not None
    _wait_status(slot.spare)
    taken, note = slot.take(argv, env, relayed=True)
    assert taken is None and "relay" in note["reason"]
