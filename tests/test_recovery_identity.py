"""Recovery signals only the process group a pid file really names (issue 16, defect 8):
never a foreign process because the file's argv is empty, never pgid 1 or the tuner's own
group, never a process that reused the pid."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.waiting import wait_for
from tuner.adapters import proctree
from tuner.adapters.artifacts import StudyPaths
from tuner.engine import recovery, runfile


@pytest.fixture
def foreign():
    """A process the tuner did not start, leading its own group (like a server would)."""

    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _pid_file(tmp_path: Path, record: dict) -> StudyPaths:
    paths = StudyPaths(tmp_path / "study")
    folder = paths.trial_dir(0)
    folder.mkdir(parents=True)
    (folder / "server.pid").write_text(json.dumps({"host": socket.gethostname(), "tag": None, **record}))
    return paths


@pytest.mark.parametrize("record", [
    {"argv": []},
    {"argv": None},
    {},
    {"argv": ["sleep"]},            # a prefix of the foreign command line is not its argv
    {"argv": ["sleep", "300"], "start_ticks": 1},   # same command, but another process
])
def test_a_pid_file_that_does_not_name_the_process_kills_nothing(tmp_path: Path, foreign, record) -> None:
    paths = _pid_file(tmp_path, {"pgid": foreign.pid, **record})
    recovery.stop_leftover_servers(paths, 0.5, lambda line: None)
    assert foreign.poll() is None, "a foreign process was stopped"
    paths = _pid_file(tmp_path / "again", {"pgid": foreign.pid, **record})
    assert recovery.kill_servers_now(paths.pid_files()) == []
    assert foreign.poll() is None


@pytest.mark.parametrize("pgid", [1, os.getpgrp(), 0, -5])
def test_init_and_the_tuners_own_group_are_never_signalled(tmp_path: Path, pgid: int, monkeypatch) -> None:
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(proctree, "signal_group", lambda g, s: sent.append((g, s)))
    # The recorded argv is the group leader's real one: only the group itself must rule it out.
    leader = proctree.cmdline(pgid) if pgid > 0 else ["x"]
    paths = _pid_file(tmp_path, {"pgid": pgid, "argv": leader})
    recovery.stop_leftover_servers(paths, 0.1, lambda line: None)
    assert recovery.kill_servers_now(paths.pid_files()) == []
    assert sent == []


def test_the_recorded_process_is_still_found_and_stopped(tmp_path: Path) -> None:
    # Lives until stopped (or until this test lets go of its stdin).
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                            start_new_session=True)
    try:
        paths = _pid_file(tmp_path, {"pgid": proc.pid, "argv": [sys.executable, "-c", "..."],
                                     "start_ticks": proctree.start_ticks(proc.pid)})
        lines: list[str] = []
        recovery.stop_leftover_servers(paths, 5, lines.append)
        proc.wait(timeout=10)
        assert any("stopped a server" in l for l in lines)
    finally:
        proc.kill()


def test_a_legacy_pid_file_with_the_exact_argv_is_still_ours(tmp_path: Path) -> None:
    proc = subprocess.Popen(["sleep", "301"], start_new_session=True)
    try:
        # The pid file is written once the child runs `sleep` (until its exec it is a copy of us).
        wait_for(lambda: proctree.cmdline(proc.pid) == ["sleep", "301"], 10, "the child to exec sleep")
        paths = _pid_file(tmp_path, {"pgid": proc.pid, "argv": ["sleep", "301"]})
        assert recovery.kill_servers_now(paths.pid_files()) == [proc.pid]
        proc.wait(timeout=10)
    finally:
        proc.kill()


def test_the_run_file_never_kills_by_an_empty_command_line(tmp_path: Path, foreign) -> None:
    (tmp_path / "run.json").write_text(json.dumps({
        "driver_pid": 999999999, "driver_cmdline": ["x"], "host": socket.gethostname(),
        "local_processes": [{"pid": foreign.pid, "cmdline": []}, {"pid": 1, "cmdline": proctree.cmdline(1)},
                            {"pid": os.getpid(), "cmdline": proctree.cmdline(os.getpid())}],
    }))
    sent: list[int] = []
    real_kill = os.kill

    def fake_kill(pid: int, sig: int) -> None:
        if sig == signal.SIGKILL:
            sent.append(pid)
        else:
            real_kill(pid, sig)

    original = os.kill
    os.kill = fake_kill
    try:
        runfile.clean_up_previous_run(tmp_path)
    finally:
        os.kill = original
    assert sent == [] and foreign.poll() is None


def test_ranks_whose_leader_is_gone_are_found_by_the_runs_tag(tmp_path: Path) -> None:
    """Issue 41: a multi-rank server's workers outliving its API server (the group leader)
    after a kill -9 of the tuner are stopped by the next resume, found by the killed run's
    tag; a process carrying another run's tag is left alone."""

    gone = subprocess.Popen(["true"], start_new_session=True)
    gone.wait(timeout=10)          # a leader that no longer exists
    tag, other = "study:run-killed:0", "study:run-other:0"
    ranks = [subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                              env={**os.environ, "TUNER_SERVER_GROUP": t}, start_new_session=True)
             for t in (tag, tag, other)]
    try:
        wait_for(lambda: len(proctree.pids_with_env("TUNER_SERVER_GROUP", tag)) == 2, 10, "the ranks to start")
        paths = _pid_file(tmp_path, {"pgid": gone.pid, "argv": ["python", "-m", "vllm"], "tag": tag,
                                     "start_ticks": 1})
        lines: list[str] = []
        recovery.stop_leftover_servers(paths, 1, lines.append)
        for rank in ranks[:2]:
            rank.wait(timeout=10)
        assert proctree.pids_with_env("TUNER_SERVER_GROUP", tag) == []
        assert ranks[2].poll() is None, "a process of another run was stopped"
        assert any("found by the run's tag" in line for line in lines), lines
        assert not paths.pid_files()
    finally:
        for rank in ranks:
            rank.kill()
            rank.wait(timeout=10)
