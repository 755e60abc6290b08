"""GPU start failures from recorded vLLM 0.26.0 H200 logs, replayed by a stand-in server that
prints the real lines and then hangs (as a vLLM API server can when its engine died): the
launcher fails the start with the typed reason soon after the fatal line (not after the startup
timeout), the trial's outcome carries vLLM's own message, and `tuner status` shows it. How soon
on an idle box is a benchmark's figure (benchmarks/fail_fast.py), not a test's."""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import LOADED_BOX_SLACK_S, ROOT, free_port_block, wait_no_orphans
from tests.waiting import wait_for
from tuner.adapters.artifacts import StudyPaths
from tuner.adapters.launcher import FATAL_STOP_GRACE_S, ServerProcess
from tuner.engine.worker import TrialWorker
from tuner.errors import ServerFatalLog
from tuner.study.outcome import TrialOutcome, TrialRequest
from tuner.study.policy import told_for
from tuner.study.scoring import outcome_summary
from tuner.study.trials import TrialRecord
from tuner.views.status import _trial_row, format_status

LOGS = ROOT / "tests" / "fixtures" / "vllm_logs"
# What the tests rule out takes 60 s: the startup timeout (the log never read) or a readiness
# request that holds the wait (raised to 60 s where a server holds its port). Detection itself
# takes POLL_S, plus PENDING_GRACE_S for a generic line; the slack is for a loaded CI box (a
# 1.1 s detection once took 2.96 s there).
DETECTED_WITHIN_S = 2.0 + LOADED_BOX_SLACK_S

# Prints the log file's lines (as the server would, unbuffered), notes the wall-clock time
# when the last one is out, then hangs until killed. "hold_port N" first listens on port N
# and never answers, as an API server whose engine died can hold its port.
REPLAY = """
import signal, socket, sys, time
extra = sys.argv[3:]
lines = open(sys.argv[1], encoding="utf-8", errors="replace").read().splitlines(True)
later = []
if "ignore_sigterm" in extra:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if "rest_at_sigterm" in extra:
    # The lines from vLLM's own "received signal=SIGTERM" on are printed when SIGTERM comes,
    # 3 s apart as on the real server; every later SIGTERM is ignored.
    cut = next(i for i, line in enumerate(lines) if "received signal=SIGTERM" in line)
    lines, later = lines[:cut], lines[cut:]
    def _stopping(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        sys.stdout.write(later[0])
        sys.stdout.flush()
        time.sleep(3)
        sys.stdout.writelines(later[1:])
        sys.stdout.flush()
        with open(sys.argv[2] + ".after", "w") as mark:
            mark.write(repr(time.time()))
    signal.signal(signal.SIGTERM, _stopping)
if "hold_port" in extra:
    held = socket.socket()
    held.bind(("127.0.0.1", int(extra[extra.index("hold_port") + 1])))
    held.listen(16)
time.sleep(0.3)
for line in lines:
    sys.stdout.write(line)
    sys.stdout.flush()
with open(sys.argv[2], "w") as mark:
    mark.write(repr(time.time()))
for _ in range(1200):
    time.sleep(0.1)
"""

CASES = [
    # (log, trial reason, the fatal line's own reason, vLLM's words in the message)
    ("h200-0.26.0/fail-gpu-memory-utilization.log", "gpu_memory_insufficient", "gpu_memory_insufficient",
     "ValueError: Free memory on device cuda:0 (139.29/139.8 GiB) on startup is less than desired "
     "GPU memory utilization (0.999, 139.66 GiB)."),
    ("h200-0.26.0-study/scenarios/b-kv-cache-too-small/server.log", "max_model_len_too_large",
     "max_model_len_too_large",
     "ValueError: To serve at least one request with the model's max seq len (4096), (0.09 GiB KV "
     "cache is needed, which is larger than the available KV cache memory (0.05 GiB)."),
    ("h200-0.26.0/fail-spec-mtp-unsupported.log", "invalid_config", "unsupported_speculative_method",
     "NotImplementedError: Unsupported speculative method: 'mtp'"),
    ("h200-0.26.0/fail-bad-cudagraph-mode.log", "invalid_config", "invalid_config", "KeyError: 'BOGUS'"),
]


@pytest.fixture
def marker(orphan_check: list[str]) -> str:
    value = uuid.uuid4().hex[:12]
    orphan_check.append(value)
    return value


def _replayer(tmp_path: Path, log: Path, marker: str, *extra: str) -> tuple[list[str], dict[str, str]]:
    argv = [sys.executable, "-c", REPLAY, str(log), str(tmp_path / "printed"), *extra]
    return argv, {"PATH": "/usr/bin:/bin", "TUNER_TEST_ID": marker, "PYTHONPATH": str(ROOT)}


@pytest.mark.parametrize(("log", "reason", "detail", "words"), CASES)
def test_fatal_line_then_hang_fails_at_once(tmp_path: Path, marker: str, log: str,
                                            reason: str, detail: str, words: str) -> None:
    argv, env = _replayer(tmp_path, LOGS / log, marker)
    port = free_port_block(1)
    server = ServerProcess(argv, env, tmp_path / "server.log", host="127.0.0.1", port=port,
                           served_model_name="smol", stop_grace_s=2.0)

    async def scenario() -> tuple[ServerFatalLog, float]:
        server.start()
        try:
            with pytest.raises(ServerFatalLog) as info:
                await server.wait_ready(60)
            return info.value, time.time()
        finally:
            await server.stop(2.0)

    err, detected = asyncio.run(scenario())
    printed = float((tmp_path / "printed").read_text())
    assert err.reason == reason
    assert err.signature is not None and err.signature["reason"] == detail
    assert words in str(err), str(err)
    # The process never exits by itself: only the log can have ended the wait, and a hang
    # would have taken the 60 s startup timeout.
    assert detected - printed < DETECTED_WITHIN_S, f"detected {detected - printed:.2f}s after the fatal line"
    assert not wait_no_orphans(marker)


def test_a_server_that_printed_a_fatal_line_and_ignores_sigterm_is_killed_soon(
        tmp_path: Path, marker: str) -> None:
    """As scenario b's real server did on the H200: the fatal line, then SIGTERM ignored.
    The study's 30 s stop timeout is for servers with something to shut down; this one
    is SIGKILLed after the short fatal-line grace and gives the GPU back."""
    log = LOGS / "h200-0.26.0-study/scenarios/b-kv-cache-too-small/server.log"
    argv, env = _replayer(tmp_path, log, marker, "ignore_sigterm")
    server = ServerProcess(argv, env, tmp_path / "server.log", host="127.0.0.1", port=free_port_block(1),
                           served_model_name="smol", stop_grace_s=30.0)

    async def scenario():
        server.start()
        try:
            with pytest.raises(ServerFatalLog):
                await server.wait_ready(60)
        finally:
            report = await server.stop(30.0)
        return report

    report = asyncio.run(scenario())
    assert report.signal_used == "SIGKILL"
    assert FATAL_STOP_GRACE_S <= report.seconds < FATAL_STOP_GRACE_S + 3.0 + LOADED_BOX_SLACK_S, report
    assert FATAL_STOP_GRACE_S < 30.0
    assert not wait_no_orphans(marker)


def test_a_server_that_fails_its_start_while_stopping_is_killed_soon_after(tmp_path: Path, marker: str) -> None:
    """Three vLLM CPU ranks stopped mid-start (tests/test_realvllm_tp.py's Ctrl-C): the engine
    prints "EngineCore failed to start." 3 s after SIGTERM and the API server then ignores it.
    The recorded log, replayed with that timing: SIGKILL follows the failure line after the
    short fatal-line grace, not after the 30 s stop timeout."""

    log = LOGS / "cpu-0.32.0" / "tp3-sigterm-mid-start.log"
    argv, env = _replayer(tmp_path, log, marker, "rest_at_sigterm")
    server = ServerProcess(argv, env, tmp_path / "server.log", host="127.0.0.1", port=free_port_block(1),
                           served_model_name="smol", stop_grace_s=30.0)

    async def scenario():
        server.start()
        wait_for(lambda: (tmp_path / "printed").exists(), 30, "the replay to reach SIGTERM's line")
        return await server.stop(30.0)

    report = asyncio.run(scenario())
    assert report.signal_used == "SIGKILL" and report.leftover_pids == [], report
    failed = float((tmp_path / "printed.after").read_text())
    assert 3.0 + FATAL_STOP_GRACE_S <= report.seconds < 3.0 + FATAL_STOP_GRACE_S + LOADED_BOX_SLACK_S, report
    assert "EngineCore failed to start." in (tmp_path / "server.log").read_text()
    assert failed > 0 and not wait_no_orphans(marker)


@pytest.mark.parametrize("hold_port", [False, True], ids=["port-closed", "port-held-silent"])
def test_a_generic_failure_with_no_root_cause_is_not_left_waiting(tmp_path: Path, marker: str,
                                                                  hold_port: bool) -> None:
    """With the port held open and silent, each readiness request hangs for its whole timeout
    (60 s here): the fatal line must still end the wait at once, not after the request."""

    log = tmp_path / "generic.log"
    real = (LOGS / "h200-0.26.0" / "fail-gpu-memory-utilization.log").read_text(encoding="utf-8")
    # The real log up to the engine's "EngineCore failed to start." and not a line further.
    log.write_text(real[: real.index("EngineCore failed to start.") + len("EngineCore failed to start.\n")])
    port = free_port_block(1)
    argv, env = _replayer(tmp_path, log, marker, *(["hold_port", str(port)] if hold_port else []))
    server = ServerProcess(argv, env, tmp_path / "server.log", host="127.0.0.1", port=port,
                           served_model_name="smol", stop_grace_s=2.0, ready_request_timeout_s=60.0)

    async def scenario() -> tuple[ServerFatalLog, float]:
        server.start()
        try:
            with pytest.raises(ServerFatalLog) as info:
                await server.wait_ready(60)
            return info.value, time.time()
        finally:
            await server.stop(2.0)

    err, detected = asyncio.run(scenario())
    assert err.reason == "engine_core_failed"
    assert detected - float((tmp_path / "printed").read_text()) < DETECTED_WITHIN_S
    assert not wait_no_orphans(marker)


def _request(tmp_path: Path, argv: list[str], env: dict[str, str]) -> dict:
    return TrialRequest(
        study="gpu-fail", number=3, values={"spec": "mtp"}, asked={"speculative_config.method": "mtp"},
        argv=argv, env=env, host="127.0.0.1", port=free_port_block(1), served_model_name="smol",
        trial_dir=str(tmp_path / "trial"), startup_timeout_s=60, stop_timeout_s=2, deadline_s=120,
        # The start fails: neither the load nor the probe settings are ever read.
        load={}, probe={}, ignore_eos=True).model_dump(mode="json")


def test_rejected_configuration_reaches_outcome_and_status(tmp_path: Path, marker: str) -> None:
    argv, env = _replayer(tmp_path, LOGS / "h200-0.26.0" / "fail-spec-mtp-unsupported.log", marker)
    outcome = TrialOutcome.model_validate(asyncio.run(TrialWorker().run_trial(_request(tmp_path, argv, env))))
    assert (outcome.status, outcome.reason, outcome.phase) == ("failed", "invalid_config", "start")
    assert outcome.message == ("server printed a fatal line: the model does not support the requested "
                               "speculative method: NotImplementedError: Unsupported speculative method: 'mtp'")
    assert outcome.signature["reason"] == "unsupported_speculative_method"
    # The start's breakdown says how far it got: past the imports (the replay waits 0.3 s
    # before its first line), never to the engine process.
    assert outcome.startup is not None and not outcome.startup["complete"]
    assert outcome.startup["reached"] == "imports" and outcome.startup["phases"]["imports"] >= 0.3
    saved = json.loads((tmp_path / "trial" / "outcome.json").read_text())
    assert saved["reason"] == "invalid_config" and saved["signature"] == outcome.signature
    assert json.loads((tmp_path / "trial" / "startup.json").read_text()) == outcome.startup

    # What the study stores (the orchestrator's told_for) and what `tuner status` prints.
    told = told_for(None, outcome, lambda: None)   # a failed outcome needs no spec
    record = TrialRecord(number=3, state="FAIL", kind="run", params={"spec": "mtp"},
                         attrs={"outcome": outcome_summary(outcome).as_attr(), **told.user_attrs()})
    assert record.outcome == "failed:invalid_config"
    row = _trial_row(record, StudyPaths(tmp_path / "s"))
    text = format_status({"study": "s", "running_now": False, "target_trials": 1, "finished_trials": 1,
                          "outcomes": {record.outcome: 1}, "failures": {"invalid_config": 1},
                          "running": [], "skipped": {"duplicate": 0, "forbidden": 0}, "elapsed_s": 9.0,
                          "time_left_s": None, "objectives": [{"label": "tok_s", "direction": "maximize"}],
                          "baseline": None, "front": [], "trials": [row]})
    assert "    3 failed:invalid_config" in text
    assert "NotImplementedError: Unsupported speculative method: 'mtp'" in text
    assert not wait_no_orphans(marker)
