"""Gather what the pre-flight judges (tuner.study.preflight): the server executable as the
server's own PATH resolves it, the model path, nvidia-smi's GPUs and whether the study's
ports can be bound. Nothing is started but one ``nvidia-smi`` query; under a second.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from tuner.adapters import proctree
from tuner.study.preflight import CommandFacts, HostFacts, model_path_to_check, ports_to_check, usable_gpus
from tuner.study.spec import StudySpec
from tuner.vllm.knobs import PYTHON_PLACEHOLDER

__all__ = ["gather", "command_facts", "gpu_facts", "port_state"]

NVIDIA_SMI_TIMEOUT_S = 15.0


def command_facts(word: str, server_env: Mapping[str, object]) -> CommandFacts:
    """Where ``word`` (the server command's first word) resolves. The server is started with
    the tuner's environment updated by server.env, and a word without '/' is looked up on
    that environment's PATH (subprocess does so), so server.env's PATH wins when it has one."""

    if word == PYTHON_PLACEHOLDER:
        return CommandFacts(word, sys.executable, exists=True)
    if "/" in word:
        # Relative paths are made absolute against the tuner's working directory before a
        # server starts (tuner.engine.referencing.pinned): judged the same way here.
        full = os.path.abspath(word)
        runnable = os.path.isfile(full) and os.access(full, os.X_OK)
        found = CommandFacts(word, full if runnable else None, exists=os.path.exists(full))
        search = os.environ.get("PATH", os.defpath)
    else:
        in_server_env = "PATH" in server_env
        search = str(server_env["PATH"]) if in_server_env else os.environ.get("PATH", os.defpath)
        path = shutil.which(word, path=search)
        found = CommandFacts(word, path, exists=path is not None, search_path=search,
                             path_from_server_env=in_server_env)
    if found.path is None:
        return found
    missing = _missing_interpreter(found.path, search)
    return found if missing is None else dataclasses.replace(found, missing_interpreter=missing)


def _missing_interpreter(path: str, search: str) -> str | None:
    """The ``#!`` line of a script whose interpreter is not there (an entry point such as
    ``vllm`` left behind by a moved or deleted virtual environment), else None."""

    try:
        with open(path, "rb") as fh:
            first = fh.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode(errors="replace").split()
    if not words:
        return None
    if Path(words[0]).name == "env" and len(words) > 1 and not words[1].startswith("-"):
        return None if shutil.which(words[1], path=search) else " ".join(words)
    return None if os.access(words[0], os.X_OK) else " ".join(words)


def gpu_facts(timeout_s: float = NVIDIA_SMI_TIMEOUT_S) -> tuple[tuple[str, ...] | None, str | None]:
    """(GPU names, None) from nvidia-smi; (None, None) where there is none; (None, why) when
    it is there but does not answer (a driver that is not loaded, a hung GPU)."""

    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None, None
    try:
        done = subprocess.run([exe, "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=timeout_s, check=False, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None, f"no answer in {timeout_s:g} s"
    except OSError as exc:
        return None, str(exc)
    if done.returncode != 0:
        said = (done.stdout + done.stderr).strip().splitlines()
        return None, (said[0][:200] if said else f"exit status {done.returncode}")
    return tuple(line.strip() for line in done.stdout.splitlines() if line.strip()), None


def port_state(host: str, port: int) -> tuple[str | None, str | None]:
    """(why the port cannot be bound, why the host cannot be bound at all); (None, None) when
    a server could listen there now."""

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return None, f"it does not resolve: {exc.strerror}"
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # As the launcher binds: TIME_WAIT leftovers of an earlier server are no obstacle.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                owners = proctree.listening_pids(port)
                held = f" (held by pid {', '.join(map(str, owners))})" if owners else ""
                return f"is already in use{held}", None
            if exc.errno == errno.EACCES:
                return "may not be bound by this user (ports below 1024 need root)", None
            return None, exc.strerror or str(exc)
    return None, None


def gather(spec: StudySpec) -> HostFacts:
    """The facts tuner.study.preflight.problems judges, for ``spec`` on this machine."""

    command = command_facts(spec.server.command[0], spec.server.env)
    model = model_path_to_check(spec)
    model_exists = None if model is None else os.path.exists(os.path.expanduser(model))
    gpus, gpu_error = gpu_facts() if spec.server.gpus_per_trial else (None, None)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    usable = usable_gpus(gpus, visible)
    ports: dict[int, str | None] = {}
    host_error = None
    for port in ports_to_check(spec, usable):
        ports[port], host_error = port_state(spec.server.host, port)
        if host_error is not None:
            break
    return HostFacts(command=command, model_exists=model_exists, gpus=gpus, gpu_error=gpu_error,
                     visible_devices=visible, ports=ports, host_error=host_error)
