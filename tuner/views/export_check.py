"""`tuner export --check`: let vLLM itself judge an exported configuration.

The exported arguments are parsed by vLLM's own serve parser and turned into engine
arguments (and, when the model is on this machine, into a full engine config) in the
vLLM environment's interpreter — so whatever vLLM would reject at startup fails here,
with vLLM's own message, without starting a server. Each format that carries flags is
read back from its exported text, so a quoting mistake in a format is caught too.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

from tuner.adapters.environment import server_python
from tuner.study.spec import StudySpec
from tuner.views.export_formats import read_shell, read_systemd_exec

__all__ = ["VllmUnavailable", "vllm_python_for", "argv_from_export", "check_arguments",
           "env_from_export", "vllm_message", "CHECK_SCRIPT"]

# Runs inside the vLLM environment. Import paths moved between vLLM releases; the first
# that exists wins.
CHECK_SCRIPT = r"""
import contextlib, io, json, sys, traceback
argvs = json.loads(sys.argv[1])
build = sys.argv[2] == "1"
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    except ImportError:
        from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.engine.arg_utils import AsyncEngineArgs
except ImportError as exc:
    print("TUNER-NO-VLLM " + json.dumps(f"{type(exc).__name__}: {exc}"), flush=True)
    sys.exit(3)
for argv in argvs:
    err = io.StringIO()
    ok = False
    try:
        with contextlib.redirect_stderr(err):
            parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
            args = parser.parse_args(argv)
            validate_parsed_serve_args(args)
            engine_args = AsyncEngineArgs.from_cli_args(args)
            if build:
                engine_args.create_engine_config()
        ok = True
        message = ""
    except SystemExit:
        message = err.getvalue()
    except BaseException:
        message = err.getvalue() + traceback.format_exc()
    print("TUNER-CHECK " + json.dumps({"ok": ok, "message": message}), flush=True)
"""


class VllmUnavailable(ValueError):
    """The interpreter cannot run vLLM's parser at all (missing, no vLLM, vLLM broken): one
    reason for every format, not a verdict on any."""


def vllm_python_for(spec: StudySpec, explicit: str | None = None) -> str:
    """The interpreter of the vLLM environment the study's server command runs in."""

    if explicit:
        return explicit
    first = spec.server.command[0]
    if first == "{python}":
        raise ValueError("the study runs the simulator ({python}); pass --vllm-python PATH")
    python = server_python(spec.server.command)
    if python is None:
        raise ValueError(f"cannot tell which Python runs {first!r}; pass --vllm-python PATH")
    return python


def argv_from_export(fmt: str, text: str, spec: StudySpec) -> tuple[list[str], Path | None]:
    """The server arguments (after the command prefix) that an exported text carries.

    For ``yaml`` the text is written to a temporary file and passed as ``--config``
    (vLLM's own config-file reader then expands it); the caller deletes the file.
    """

    prefix = len(spec.server.command)
    if fmt == "json":
        return json.loads(text)["argv"][prefix:], None
    if fmt == "shell":
        return read_shell(text)[0][prefix:], None
    if fmt == "systemd":
        return read_systemd_exec(text)[prefix:], None
    if fmt == "yaml":
        handle = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
        with handle:
            handle.write(text)
        return ["--config", handle.name], Path(handle.name)
    raise ValueError(f"format {fmt!r} carries no server arguments")


def check_arguments(python: str, argvs: list[list[str]], *, env: dict[str, str], build_engine: bool,
                    timeout_s: float = 600) -> list[tuple[bool, str]]:
    """(accepted, vLLM's message) for each argument vector, in one vLLM process.

    Raises:
        VllmUnavailable: ``python`` cannot be run or cannot import vLLM's parser.
    """

    full_env = dict(os.environ)
    full_env.update(env)
    try:
        proc = subprocess.run(
            [python, "-c", CHECK_SCRIPT, json.dumps(argvs), "1" if build_engine else "0"],
            capture_output=True, text=True, timeout=timeout_s, env=full_env, check=False,
        )
    except OSError as exc:
        raise VllmUnavailable(f"--check: cannot run {python} ({exc.strerror or exc}); pass --vllm-python "
                              "with the vLLM environment's interpreter") from None
    except subprocess.TimeoutExpired:
        return [(False, f"vLLM's check did not finish within {timeout_s:.0f}s")] * len(argvs)
    for line in proc.stdout.splitlines():
        if line.startswith("TUNER-NO-VLLM "):
            raise VllmUnavailable(f"--check: {python} cannot import vLLM's argument parser "
                                  f"({json.loads(line[len('TUNER-NO-VLLM '):])}); pass --vllm-python "
                                  "with the vLLM environment's interpreter")
    results = [json.loads(line[len("TUNER-CHECK "):]) for line in proc.stdout.splitlines()
               if line.startswith("TUNER-CHECK ")]
    if len(results) != len(argvs):
        tail = "\n".join(proc.stderr.strip().splitlines()[-8:])
        return [(False, f"the vLLM check process failed (exit {proc.returncode}):\n{tail}")] * len(argvs)
    out = []
    for item in results:
        if item["ok"]:
            out.append((True, "accepted by vLLM's parser" + (" and engine config" if build_engine else "")))
        else:
            out.append((False, vllm_message(item["message"])))
    return out


# An exception line of a traceback ("pydantic_core...ValidationError: 1 validation error")
# or argparse's "vllm serve: error: ..." line.
_ERROR_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*(?:Error|Exception|Exit)\b.*|.*: error: .*)$")


def vllm_message(raw: str) -> str:
    """vLLM's own words from a rejected check: the last error line and what follows it.

    The traceback above it only says where vLLM raised, not why; the usage text argparse
    prints before its error line is the same for every mistake.
    """

    lines = [l for l in raw.strip().splitlines() if l.strip()]
    for i in range(len(lines) - 1, -1, -1):
        if _ERROR_LINE.match(lines[i]):
            return "\n".join(lines[i:i + 4])
    return "\n".join(lines[-4:]) or "rejected"


def env_from_export(text: str) -> dict[str, str]:
    """The variables an ``env`` export sets (shell assignments; a quoted value may span lines)."""

    argv, env = read_shell(text)
    if argv:
        raise ValueError(f"not a NAME=value assignment: {argv[0]!r}")
    return env
