"""Start, watch and stop one server process group.

The server runs in its own session (so it and every child it forks share one process
group we can signal), writes stdout and stderr straight to the trial's log file (never an
unread pipe), and is ready when ``/health`` answers 200 and ``/v1/models`` lists the served
name. Waiting ends early when the process exits or prints a known fatal line, so a dead
server costs a poll interval, not the startup timeout.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import errno
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tuner.adapters import proctree
from tuner.adapters.artifacts import open_private
from tuner.adapters.http_client import ReplyTooLarge, capped_request, server_client
from tuner.adapters.server_log import ServerLog
from tuner.adapters.spare import Spare, spare_target
from tuner.errors import PortInUse, ServerExited, ServerFatalLog, ServerRefusedKey, ServerStartTimeout
from tuner.secrets import Redactor
from tuner.vllm.failure_signatures import FatalSignature, trial_reason, vllm_message

__all__ = ["ServerProcess", "StopReport", "port_owner_message", "check_port_free", "TAG_VAR",
           "WATCHDOG_TAG_VAR"]

logger = logging.getLogger(__name__)

POLL_S = 0.1  # readiness and exit polling period: detection latency after a crash
# A generic failure line ("EngineCore failed to start.") waits this long for its root cause
# (the traceback that follows within milliseconds when vLLM prints one) before the start is
# failed with the generic reason: a server that hangs after it must not cost the timeout.
PENDING_GRACE_S = 1.0
# A server that printed a fatal line has no state worth a clean shutdown, and vLLM's API
# server can then ignore SIGTERM: on the H200 (KV cache too small) it held the GPU for the
# whole 30 s stop timeout after the fatal line, against under 1 s to detect it.
FATAL_STOP_GRACE_S = 5.0
# One readiness request's timeout. A server that holds its port open and never answers costs
# this much per request; the log and exit checks run beside the request, so it never delays
# a fatal line (see wait_ready).
READY_REQUEST_TIMEOUT_S = 2.0
# /health and /v1/models are a few hundred bytes; a model list of thousands of adapters stays
# well under this.
READY_REPLY_BYTES = 1 << 20
TAG_VAR = "TUNER_SERVER_GROUP"  # in the server's environment: "<study>:<run id>:<group>"
WATCHDOG_TAG_VAR = "TUNER_WATCHDOG_OF"  # the same tag, in the watchdog's environment


@dataclass
class StopReport:
    signal_used: str  # "none" (already exited), "SIGTERM" or "SIGKILL"
    seconds: float
    exit_code: int | None
    leftover_pids: list[int] = field(default_factory=list)


def port_owner_message(host: str, port: int) -> str:
    owners = proctree.listening_pids(port)
    who = f" (held by pid {', '.join(map(str, owners))})" if owners else ""
    return f"port {port} on {host} is already in use{who}; stop that process or change server.port"


def check_port_free(host: str, port: int) -> None:
    """Raise PortInUse when something already listens on host:port."""

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # SO_REUSEADDR lets us bind over TIME_WAIT leftovers of the previous trial's
        # server, while a live listener still makes bind fail.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                raise PortInUse(port_owner_message(host, port)) from exc
            raise


def _detail(found: FatalSignature | None) -> str:
    """``: <what it means>: <vLLM's own message>`` for an error text ("" without a signature)."""
    return f": {found.summary}: {vllm_message(found)}" if found is not None else ""


def _with_signature(err: ServerExited | ServerFatalLog,
                    found: FatalSignature | None) -> ServerExited | ServerFatalLog:
    """Attach the fatal line's signature (reason, summary, line) for the trial's outcome."""
    err.signature = None if found is None else found.model_dump(mode="json")
    return err


class ServerProcess:
    """One server process group. Not thread-safe; one trial owns one instance."""

    def __init__(
        self,
        argv: list[str],
        env: Mapping[str, str],
        log_path: Path,
        *,
        host: str,
        port: int,
        served_model_name: str,
        pid_file: Path | None = None,
        tag: str | None = None,
        stop_grace_s: float = 30.0,
        redactor: Redactor | None = None,
        headers: Mapping[str, str] | None = None,
        ready_request_timeout_s: float = READY_REQUEST_TIMEOUT_S,
    ) -> None:
        self.argv = list(argv)
        self.ready_request_timeout_s = ready_request_timeout_s
        # Sent with the readiness requests: the API key (Authorization) a server started
        # with --api-key requires on /v1/models.
        self.headers = dict(headers or {})
        self.env = dict(env)
        self.tag = tag
        self.stop_grace_s = stop_grace_s
        if tag is not None:
            self.env[TAG_VAR] = tag
        self.log_path = log_path
        self.host = host
        self.port = port
        self.served_model_name = served_model_name
        self.pid_file = pid_file
        # With secrets to hide, the server's output reaches its log through a relay that
        # writes every secret as ${REF} (it never lands on disk); without, straight to file.
        self.redactor = redactor if redactor else None
        self._relay: threading.Thread | None = None
        self.process: asyncio.subprocess.Process | None = None
        self._popen_pid: int | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        # The log, read as it grows (fatal lines, and what the trial reads back after).
        self.log = ServerLog(log_path)
        self._scanner = self.log.digest.fatal
        # When a generic fatal line was first seen (waiting for its root cause), else None.
        self._pending_since: float | None = None
        self.started_at: float | None = None

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._popen_pid

    def start(self, spare: Spare | None = None) -> None:
        """Spawn the server, or release ``spare`` into it (tuner.adapters.spare: the caller
        checked that it may); either way its output lands in the log."""

        try:
            check_port_free(self.host, self.port)
        except BaseException:
            if spare is not None:
                spare.discard()
            raise
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open_private(self.log_path, "ab")  # handed to the child, or to the relay
        if spare is not None:
            log.close()
            target = spare_target(self.argv)
            assert target is not None and self.redactor is None, "a spare runs [PYTHON, -m, MODULE] with no relay"
            self._adopt(spare.release(target[2], self.env, self.log_path))
            return
        try:
            proc = subprocess.Popen(  # argument vector only, never a shell
                self.argv,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE if self.redactor else log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        except BaseException:
            log.close()
            raise
        if self.redactor and proc.stdout is not None:
            self._relay = threading.Thread(target=_relay_redacted, args=(proc.stdout, log, self.redactor),
                                           name=f"log-relay-{proc.pid}", daemon=True)
            self._relay.start()
        else:
            log.close()
        self._adopt(proc)

    def _adopt(self, proc: subprocess.Popen[bytes]) -> None:
        """From here on ``proc`` (the leader of its own process group) is this server."""

        self._proc = proc
        self._popen_pid = proc.pid
        self.started_at = self.log.started_at = time.monotonic()
        self._start_watchdog(proc.pid)
        if self.pid_file is not None:
            record = {
                "pgid": proc.pid,
                # The start time identifies the process beyond its (reusable) pid; the argv,
                # secrets as references, is for people and for pid files of older versions.
                "start_ticks": proctree.start_ticks(proc.pid),
                "argv": self.redactor.data(self.argv) if self.redactor else self.argv,
                "host": socket.gethostname(),
                "started_unix": time.time(),
                "port": self.port,
                "tag": self.tag,
            }
            tmp = self.pid_file.with_suffix(".tmp")
            with open_private(tmp, "w") as fh:
                fh.write(json.dumps(record))
            os.replace(tmp, self.pid_file)
        logger.info("started server pid=%d port=%d", proc.pid, self.port)

    def _start_watchdog(self, pgid: int) -> None:
        env = {k: v for k, v in self.env.items() if k != TAG_VAR}
        if self.tag is not None:
            env[WATCHDOG_TAG_VAR] = self.tag
        # The worker may import the tuner from a path Ray set up (runtime_env) rather
        # than from the environment: make the same package importable by the watchdog.
        package_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        self._watchdog = subprocess.Popen(
            [sys.executable, "-m", "tuner.adapters.watchdog", str(os.getpid()), str(pgid),
             str(self.stop_grace_s)],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True,
        )

    def _stop_watchdog(self) -> None:
        dog, self._watchdog = self._watchdog, None
        if dog is None:
            return
        dog.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            dog.wait(timeout=5)

    def _escaped(self) -> list[int]:
        """Processes of this server's tree that left its process group (setsid)."""

        return proctree.pids_with_env(TAG_VAR, self.tag) if self.tag is not None else []

    def exit_code(self) -> int | None:
        return self._proc.poll() if self._popen_pid is not None else None

    @property
    def first_line_s(self) -> float | None:
        """Seconds from spawn to the first vLLM logger line read back: the end of the Python
        imports (vllm.startup's first phase); None until one was seen."""
        return self.log.first_line_s

    def log_excerpt(self) -> str:
        self.log.poll()
        return self._scanner.excerpt()

    async def wait_ready(self, timeout_s: float) -> float:
        """Seconds until ready. Raises ServerExited, ServerFatalLog or ServerStartTimeout.

        The readiness request runs beside the log and exit checks, not between them: a
        server that accepts a connection and never answers (vLLM's API server can hold its
        port open after its engine died) would otherwise delay a fatal line by the
        request's own timeout."""

        assert self.started_at is not None, "start() first"
        deadline = self.started_at + timeout_s
        self._pending_since = None
        async with server_client(timeout=self.ready_request_timeout_s, headers=self.headers) as client:
            while True:
                self._raise_if_dead()
                probe = asyncio.ensure_future(self._ready(client))
                try:
                    while not probe.done():
                        await asyncio.wait({probe}, timeout=POLL_S)
                        self._raise_if_dead()
                finally:
                    if not probe.done():
                        probe.cancel()
                        # wait(), not await: the probe's own CancelledError is expected,
                        # while a cancel of this coroutine (Ctrl-C) must still propagate.
                        await asyncio.wait({probe})
                if probe.result():
                    return time.monotonic() - self.started_at
                if time.monotonic() >= deadline:
                    raise ServerStartTimeout(
                        f"server not ready after {timeout_s:.0f}s (startup timeout)",
                        log_excerpt=self._scanner.excerpt(),
                    )
                await asyncio.sleep(POLL_S)

    def _raise_if_dead(self) -> None:
        """Raise when the process has exited or its log has a settled fatal line (a generic
        one after :data:`PENDING_GRACE_S` without its root cause)."""

        self.log.poll()
        code = self.exit_code()
        if code is not None:
            self.log.finish()  # the rest of the log, the last line even without its newline
            found = self._scanner.signature
            raise _with_signature(ServerExited(
                f"server exited with code {code} before it was ready{_detail(found)}",
                reason=trial_reason(found) if found else "server_exited",
                log_excerpt=self._scanner.excerpt(),
            ), found)
        found = self._scanner.signature
        if found is not None and not self._scanner.settled():
            self._pending_since = self._pending_since or time.monotonic()
            if time.monotonic() - self._pending_since < PENDING_GRACE_S:
                found = None
        if found is not None:
            raise _with_signature(ServerFatalLog(
                f"server printed a fatal line{_detail(found)}",
                reason=trial_reason(found),
                log_excerpt=self._scanner.excerpt(),
            ), found)

    async def _ready(self, client: httpx.AsyncClient) -> bool:
        try:
            # Both read up to a cap: a server (or whatever holds the port) that answers an
            # endless body must not hold the start, or the tuner's memory, until the deadline.
            health = await capped_request(client, "GET", f"{self.base_url}/health",
                                          limit=READY_REPLY_BYTES)
            if health.status_code != 200:
                return False
            models = await capped_request(client, "GET", f"{self.base_url}/v1/models",
                                          limit=READY_REPLY_BYTES)
            if models.status_code in (401, 403):
                # Waiting cannot help: a key refused now is refused until the deadline.
                raise self._refused(models.status_code)
            if models.status_code != 200:
                return False
            names = {m.get("id") for m in models.json().get("data", []) if isinstance(m, dict)}
            return self.served_model_name in names
        except (httpx.HTTPError, ValueError, AttributeError, ReplyTooLarge):
            return False

    def _refused(self, status: int) -> ServerRefusedKey:
        sent = any(k.lower() == "authorization" for k in self.headers)
        how = "refused the study's API key" if sent else "requires an API key and the study gives none"
        return ServerRefusedKey(
            f"the server {how} (HTTP {status} on GET /v1/models): give the key it is started "
            "with as server.flags.api_key or server.env VLLM_API_KEY, as a reference such as "
            "'${VLLM_API_KEY}' set in the tuner's environment", log_excerpt=self._scanner.excerpt())

    async def stop(self, grace_s: float) -> StopReport:
        """SIGTERM the group, wait ``grace_s`` (at most :data:`FATAL_STOP_GRACE_S` once the
        log showed a fatal line, before or during the stop), SIGKILL the group, reap,
        confirm it is gone."""

        if self._popen_pid is None:
            return StopReport("none", 0.0, None)
        began = time.monotonic()
        pgid = self._popen_pid
        used = "none"
        if self._group_alive(pgid):
            used = "SIGTERM"
            proctree.signal_group(pgid, signal.SIGTERM)
            while time.monotonic() - began < grace_s:
                self._proc.poll()
                if not self._group_alive(pgid):
                    break
                # A server with a fatal line, printed before the stop or during it, gets the short
                # grace from that line on: vLLM stopped while it starts fails its start
                # ("EngineCore failed to start." 3 s after SIGTERM on three CPU ranks) and its API
                # server then ignores SIGTERM.
                if grace_s > FATAL_STOP_GRACE_S and self._fatal_line_now():
                    grace_s = min(grace_s, time.monotonic() - began + FATAL_STOP_GRACE_S)
                await asyncio.sleep(0.05)
            else:
                used = "SIGKILL"
                proctree.signal_group(pgid, signal.SIGKILL)
        # Reap our direct child; grandchildren are re-parented and reaped by init.
        with contextlib.suppress(Exception):
            for _ in range(100):
                if self._proc.poll() is not None:
                    break
                await asyncio.sleep(0.02)
        for _ in range(100):
            if not self._group_alive(pgid):
                break
            proctree.signal_group(pgid, signal.SIGKILL)
            await asyncio.sleep(0.02)
        for pid in self._escaped():
            # Left the group, so it got no SIGTERM; the group's grace is over: SIGKILL.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        for _ in range(100):
            if not self._escaped():
                break
            await asyncio.sleep(0.02)
        self._stop_watchdog()
        self._join_relay()
        leftovers = sorted(set(proctree.group_members(pgid)) | set(self._escaped()))
        if self.pid_file is not None and not leftovers:
            with contextlib.suppress(FileNotFoundError):
                self.pid_file.unlink()
        report = StopReport(used, time.monotonic() - began, self._proc.poll(), leftovers)
        logger.info("stopped server pgid=%d with %s in %.2fs", pgid, used, report.seconds)
        return report

    def _fatal_line_now(self) -> bool:
        with contextlib.suppress(OSError):
            self.log.poll()
        return self._scanner.signature is not None or self._scanner.failed_while_stopping is not None

    def kill_now(self) -> None:
        """Synchronous last resort (signal handlers, interpreter exit)."""

        if self._popen_pid is not None:
            proctree.signal_group(self._popen_pid, signal.SIGKILL)
            for pid in self._escaped():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                self._proc.wait(timeout=5)
        self._stop_watchdog()

    def _join_relay(self) -> None:
        # The relay ends at EOF, when every process holding the pipe has exited; one that
        # escaped the group and keeps it open must not hold up the stop.
        if self._relay is not None:
            self._relay.join(timeout=5)

    @staticmethod
    def _group_alive(pgid: int) -> bool:
        return bool(proctree.group_members(pgid))


def _relay_redacted(source: Any, log: Any, redactor: Redactor) -> None:
    """Copy the server's output to its log with every secret replaced by its reference.

    A value may be split across reads: the last ``longest - 1`` characters stay behind
    until more arrives (a value cannot start earlier and still be incomplete), except
    after a newline when no secret contains one. Runs until EOF; closes ``log``.
    """

    keep = max(redactor.longest - 1, 0)
    pending = ""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="surrogateescape")
    try:
        while True:
            chunk = os.read(source.fileno(), 65536)
            pending += decoder.decode(chunk, final=not chunk)
            pending = redactor.text(pending)
            if not chunk:
                break
            cut = max(len(pending) - keep, 0)
            newline = pending.rfind("\n")
            if newline >= 0 and not redactor.has_newline:
                cut = max(cut, newline + 1)
            if cut:
                log.write(pending[:cut].encode("utf-8", errors="surrogateescape"))
                pending = pending[cut:]
        if pending:
            log.write(pending.encode("utf-8", errors="surrogateescape"))
    except OSError:
        logger.warning("server log relay stopped", exc_info=True)
    finally:
        log.close()
        source.close()
