"""The launcher against real processes: port check, fail-fast, stop escalation, the tag
that finds escaped processes, the watchdog, and the nvidia-smi parsers on recorded text."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import LOADED_BOX_SLACK_S, ROOT, free_port_block, processes_with_env, wait_no_orphans
from tests.waiting import wait_for
from tuner.adapters import gpu, proctree
from tuner.adapters.launcher import TAG_VAR, ServerProcess, check_port_free
from tuner.errors import PortInUse, ServerExited, ServerFatalLog, ServerStartTimeout

MODEL = "m"


def sim_env(marker: str, faults: list[dict] | None = None) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), TUNER_TEST_ID=marker, TUNER_SIM_PROFILE="tiny-cpu",
               TUNER_SIM_TIME_SCALE="0.01")
    if faults:
        env["TUNER_SIM_FAULTS"] = json.dumps(faults)
    return env


def sim_server(tmp_path: Path, marker: str, *, faults: list[dict] | None = None,
               argv: list[str] | None = None, tag: str | None = None, grace: float = 5.0) -> ServerProcess:
    port = free_port_block(1)
    argv = argv or [sys.executable, "-m", "tuner.sim", "--model", MODEL, "--port", str(port)]
    return ServerProcess(argv, sim_env(marker, faults), tmp_path / "server.log", host="127.0.0.1",
                         port=port, served_model_name=MODEL, pid_file=tmp_path / "server.pid",
                         tag=tag, stop_grace_s=grace)


@pytest.fixture
def marker(orphan_check: list[str]) -> str:
    value = uuid.uuid4().hex[:12]
    orphan_check.append(value)
    return value


def test_port_in_use_fails_fast_and_names_the_owner(tmp_path: Path, marker: str) -> None:
    port = free_port_block(1)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import socket,sys\n"
         "s=socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen()\n"
         "print('listening', flush=True); sys.stdin.read()", str(port)],   # holds it until let go
        env=sim_env(marker), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "listening"
        server = ServerProcess([sys.executable, "-m", "tuner.sim", "--model", MODEL, "--port", str(port)],
                               sim_env(marker), tmp_path / "server.log", host="127.0.0.1", port=port,
                               served_model_name=MODEL)
        began = time.monotonic()
        with pytest.raises(PortInUse) as info:
            server.start()
        assert time.monotonic() - began < 1.0 + LOADED_BOX_SLACK_S
        assert info.value.reason == "port_in_use"
        assert f"pid {holder.pid}" in str(info.value) and str(port) in str(info.value)
        assert server.pid is None, "no server may be started on a taken port"
    finally:
        holder.kill()
        holder.wait()
    check_port_free("127.0.0.1", port)  # free again once the holder is gone


@pytest.mark.parametrize(("fault", "reason"), [("crash_at_start", "cuda_error"),
                                               ("oom_at_start", "gpu_memory_insufficient")])
def test_death_at_start_is_detected_soon(tmp_path: Path, marker: str, fault: str,
                                                       reason: str) -> None:
    server = sim_server(tmp_path, marker, faults=[{"fault": fault}])

    async def scenario() -> tuple[Exception, float]:
        server.start()
        try:
            await server.wait_ready(60)
        except (ServerExited, ServerFatalLog) as exc:
            return exc, time.time()
        finally:
            await server.stop(5)
        raise AssertionError("a crashing server became ready")

    err, detected = asyncio.run(scenario())
    assert err.reason == reason, err
    assert err.log_excerpt
    # The log's last write precedes the process exit, so this bounds exit -> detection.
    latency = detected - (tmp_path / "server.log").stat().st_mtime
    assert latency < 2.0 + LOADED_BOX_SLACK_S, f"detected {latency:.2f}s after the server's last log line"
    assert not wait_no_orphans(marker)


def test_stop_escalates_to_sigkill_when_sigterm_is_ignored(tmp_path: Path, marker: str) -> None:
    server = sim_server(tmp_path, marker, faults=[{"fault": "ignore_sigterm"}], grace=1.0)

    async def scenario():
        server.start()
        await server.wait_ready(60)
        members = proctree.group_members(server.pid)
        assert len(members) == 2, members  # API server + EngineCore, one group
        return members, await server.stop(1.0)

    members, report = asyncio.run(scenario())
    assert report.signal_used == "SIGKILL"
    assert 1.0 <= report.seconds < 4.0 + LOADED_BOX_SLACK_S
    assert report.leftover_pids == []
    assert report.exit_code == -signal.SIGKILL
    assert not any(proctree.process_alive(pid) for pid in members)
    assert not (tmp_path / "server.pid").exists()
    assert not processes_with_env(marker)


# A server whose child leaves its process group; both live until a signal ends them.
ESCAPER = """
import signal, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"], start_new_session=True)
print("escaped", child.pid, flush=True)
signal.pause()
"""


def test_stop_kills_a_process_that_left_the_group(tmp_path: Path, marker: str) -> None:
    tag = f"t{marker}:0"
    server = sim_server(tmp_path, marker, argv=[sys.executable, "-c", ESCAPER], tag=tag, grace=1.0)

    async def scenario():
        server.start()
        said = server.log_path.read_text
        await asyncio.to_thread(wait_for, lambda: "\n" in said(), 20, "the escaper's line", context=said)
        escaped = int(said().split("escaped")[1].split()[0])
        assert escaped not in proctree.group_members(server.pid), "the child did leave the group"
        assert escaped in proctree.pids_with_env(TAG_VAR, tag)
        return escaped, await server.stop(1.0)

    escaped, report = asyncio.run(scenario())
    assert report.leftover_pids == []
    assert not proctree.process_alive(escaped)
    assert not processes_with_env(marker)


STARTER = """
import asyncio, json, sys
from pathlib import Path
from tuner.adapters.launcher import ServerProcess
argv, env, log, port = json.loads(sys.argv[1])
server = ServerProcess(argv, env, Path(log), host="127.0.0.1", port=port, served_model_name="m",
                       tag=env["TUNER_TEST_ID"] + ":0", stop_grace_s=2.0)
server.start()
asyncio.run(server.wait_ready(60))
print(server.pid, flush=True)
asyncio.run(asyncio.sleep(600))
"""


def test_watchdog_stops_the_server_when_its_worker_dies(tmp_path: Path, marker: str) -> None:
    """A SIGKILLed trial worker runs no finally: the watchdog must stop its server."""

    port = free_port_block(1)
    argv = [sys.executable, "-m", "tuner.sim", "--model", MODEL, "--port", str(port)]
    payload = json.dumps([argv, sim_env(marker), str(tmp_path / "server.log"), port])
    starter = subprocess.Popen([sys.executable, "-c", STARTER, payload], cwd=ROOT,
                               env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE, text=True)
    try:
        line = starter.stdout.readline()
        assert line.strip().isdigit(), f"starter failed: {line!r}"
        pgid = int(line)
        assert proctree.group_members(pgid)
        watchdogs = [p for p in processes_with_env(marker) if "tuner.adapters.watchdog" in proctree.cmdline(p)]
        assert len(watchdogs) == 1, watchdogs
        starter.send_signal(signal.SIGKILL)
        starter.wait()
        killed_at = time.monotonic()
        wait_for(lambda: not proctree.group_members(pgid), 30,
                 "the watchdog to stop the server (it outlived its worker)")
        took = time.monotonic() - killed_at
        assert took < 4.0 + LOADED_BOX_SLACK_S, f"watchdog took {took:.1f}s"  # 0.2 s poll + SIGTERM handling
    finally:
        starter.kill()
        starter.wait()
    assert not wait_no_orphans(marker), "the watchdog itself must exit once the server is gone"


# nvidia-smi output recorded on an 8x H200 host (UUIDs shortened), with one process
# per GPU as vLLM with TP=8 leaves them, plus a row with a non-numeric memory field.
COMPUTE_APPS = """\
GPU-8f1c2a3b-0000-4000-8000-000000000000, 412337, 130852
GPU-8f1c2a3b-0000-4000-8000-000000000001, 412338, 130852
GPU-8f1c2a3b-0000-4000-8000-000000000002, 412339, [N/A]

GPU-8f1c2a3b-0000-4000-8000-000000000007, 412344, 130780
No running processes found
"""
INDEX_UUID = """\
0, GPU-8f1c2a3b-0000-4000-8000-000000000000
1, GPU-8f1c2a3b-0000-4000-8000-000000000001
2, GPU-8f1c2a3b-0000-4000-8000-000000000002
7, GPU-8f1c2a3b-0000-4000-8000-000000000007
"""


def test_nvidia_smi_compute_apps_parser() -> None:
    apps = gpu.parse_compute_apps(COMPUTE_APPS)
    assert [(a.pid, a.used_mib) for a in apps] == [(412337, 130852), (412338, 130852), (412339, 0),
                                                   (412344, 130780)]
    assert apps[3].gpu_uuid.endswith("0007")
    assert gpu.parse_compute_apps("No running processes found\n") == []


def test_nvidia_smi_visible_devices_by_index_or_uuid() -> None:
    assert gpu.select_uuids(INDEX_UUID, ["0", "7"]) == {
        "GPU-8f1c2a3b-0000-4000-8000-000000000000", "GPU-8f1c2a3b-0000-4000-8000-000000000007"}
    assert gpu.select_uuids(INDEX_UUID, ["GPU-8f1c2a3b-0000-4000-8000-000000000001"]) == {
        "GPU-8f1c2a3b-0000-4000-8000-000000000001"}
    busy = [a for a in gpu.parse_compute_apps(COMPUTE_APPS)
            if a.gpu_uuid in gpu.select_uuids(INDEX_UUID, ["1", "2"])]
    assert [a.pid for a in busy] == [412338, 412339]


ENDLESS_MODELS = r"""
import http.server, sys, time

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.path == "/health":
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        # /v1/models: a body that never ends, 100 MB/s
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        chunk = b" " * (1 << 20)
        try:
            self.wfile.write(b'{"data": [')
            while True:
                self.wfile.write(chunk)
                time.sleep(0.01)
        except OSError:
            pass

print("serving", flush=True)
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def test_readiness_reads_a_bounded_reply_from_an_endless_server(tmp_path: Path, marker: str) -> None:
    """Whatever answers on the port, readiness reads at most a small cap of each reply: an
    endless /v1/models body costs the start its deadline, never the tuner's memory (issue 39:
    a reply is bounded wherever the tuner reads one)."""

    import resource

    port = free_port_block(1)
    server = ServerProcess([sys.executable, "-c", ENDLESS_MODELS, str(port)], sim_env(marker),
                           tmp_path / "server.log", host="127.0.0.1", port=port, served_model_name=MODEL)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    async def scenario() -> float:
        server.start()
        began = time.monotonic()
        try:
            with pytest.raises(ServerStartTimeout):
                await server.wait_ready(6)
        finally:
            await server.stop(5)
        return time.monotonic() - began

    spent = asyncio.run(scenario())
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert spent < 15, f"the start took {spent:.1f}s against a 6 s deadline"
    # Uncapped, six seconds of this server are 600 MB read into one reply.
    assert grown_mb < 150, f"readiness grew this process by {grown_mb:.0f} MB"
    assert not wait_no_orphans(marker)
