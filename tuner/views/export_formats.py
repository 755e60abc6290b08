"""The export formats: one measured command written so that each format's own reader gets
back exactly that command - argv and environment, secrets as references.

Input words carry secret references as ``secrets.MARK + NAME + secrets.MARK``; every other
character is literal and is quoted by the rules of the format it is written in:

- shell, env: POSIX shell words (``shlex.quote``; a reference is ``"${NAME}"``, the rest
  single-quoted around it). A value may span lines inside its quotes: the file is read
  back as a whole by a shell (or ``shlex``), never line by line.
- systemd: one line per setting. Words are double-quoted with C escapes (``\\n``,
  ``\\"``, ``\\\\``, ``\\xHH``) as systemd's extract_first_word unquotes them, ``%`` is
  doubled (specifiers, in every setting), ``$`` is doubled in ExecStart= only (variables
  are expanded there and nowhere else; in Environment= ``$`` has no meaning). A reference
  is ``${NAME}`` in ExecStart=; secrets reach the unit through EnvironmentFile=.
- yaml: a vLLM ``--config`` file (``yaml.safe_dump``, which escapes what YAML needs); the
  start command and every other comment line have control characters escaped, and a
  secret flag stays on that command line (vLLM cannot read a variable from the file).
- json: ``json.dumps``; references are ``${NAME}`` for the names listed under ``secrets``.

A NUL character cannot be in any argument or environment variable (exec ends a string
there), so a word holding one is refused in every format, as is an environment name no
shell or unit can assign. Pure: text in, text out.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

import yaml

from tuner.secrets import MARK, as_reference, split_marked

__all__ = ["Exported", "ExportFormatError", "shell_text", "env_text", "json_text", "systemd_text",
           "yaml_text", "comment_line", "FORMATS"]

FORMATS = ("shell", "env", "json", "systemd", "yaml")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Characters a systemd word may hold without quotes (quoting is never wrong; this keeps
# ordinary units readable).
_SYSTEMD_PLAIN = re.compile(r"[A-Za-z0-9_.,:/=+@-]+")


class ExportFormatError(ValueError):
    """The command cannot be written in the asked format; the message says why and which
    format can carry it."""


@dataclass(frozen=True)
class Exported:
    """What a format writes. ``argv``/``env`` words are marked (see module doc);
    ``config``: the vLLM ``--config`` mapping without the arguments that hold a secret,
    which are ``config_argv`` (marked words, after the command prefix ``prefix``)."""

    argv: list[str]
    env: dict[str, str]
    header: list[str]
    study: str
    title: str = ""
    prefix: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    config_argv: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def secrets(self) -> list[str]:
        names = {text for word in [*self.argv, *self.env.values(), *self.config_argv]
                 for is_ref, text in split_marked(word) if is_ref}
        return sorted(names)


def _check(exported: Exported, fmt: str) -> None:
    for name in exported.env:
        if not _ENV_NAME.fullmatch(name):
            raise ExportFormatError(f"environment variable {name!r} cannot be set by a shell or a unit file")
    for where, word in [*((f"argument {i}", w) for i, w in enumerate(exported.argv)),
                        *((f"environment variable {k}", v) for k, v in exported.env.items()),
                        *((f"argument {w!r}", w) for w in exported.config_argv)]:
        try:
            parts = split_marked(word)
        except ValueError:
            parts = [(False, "\0")]   # a NUL that is no reference mark
        if any(not is_ref and "\0" in text for is_ref, text in parts) or \
                any(is_ref and not _ENV_NAME.fullmatch(text) for is_ref, text in parts):
            raise ExportFormatError(f"{where} contains a NUL character, which no command line or "
                                    f"environment can carry ({fmt} export refused)")


def comment_line(text: str) -> str:
    """``# text`` on one line whatever ``text`` holds (control characters escaped)."""

    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text.replace(MARK, ""))
    return "# " + shown if shown else "#"


# -- POSIX shell --------------------------------------------------------------------------

def _shell_word(word: str, *, command: bool = False) -> str:
    out = []
    for is_ref, text in split_marked(word):
        if is_ref:
            out.append(f'"${{{text}}}"')
        elif command and "=" in text:
            # A first word with '=' would be read as an assignment unless quoted.
            out.append("'" + text.replace("'", "'\"'\"'") + "'")
        else:
            out.append(shlex.quote(text))
    return "".join(out) or "''"


def _shell_assignment(name: str, value: str) -> str:
    return f"{name}={_shell_word(value)}"


def shell_text(exported: Exported) -> str:
    """Comment header, then ``NAME=value ... argv`` as one POSIX shell command."""

    _check(exported, "shell")
    words = [_shell_assignment(k, v) for k, v in exported.env.items()]
    words += [_shell_word(w, command=i == 0) for i, w in enumerate(exported.argv)]
    return "\n".join(comment_line(h) for h in exported.header) + "\n" + " ".join(words) + "\n"


def env_text(exported: Exported) -> str:
    """``NAME=value`` assignments a POSIX shell can source (``set -a; . ./FILE``)."""

    _check(exported, "env")
    lines = [comment_line(exported.header[0])] if exported.header else []
    lines += [_shell_assignment(k, v) for k, v in exported.env.items()]
    return "\n".join(lines) + "\n"


# -- JSON -------------------------------------------------------------------------------

def _json_word(word: str) -> str:
    return "".join(as_reference(text) if is_ref else text for is_ref, text in split_marked(word))


def json_text(exported: Exported) -> str:
    _check(exported, "json")
    return json.dumps({
        "argv": [_json_word(w) for w in exported.argv],
        "env": {k: _json_word(v) for k, v in exported.env.items()},
        # ${NAME} in argv/env is a reference exactly for these names: set them at deploy time.
        "secrets": exported.secrets,
        **exported.meta,
    }, indent=2) + "\n"


# -- systemd ------------------------------------------------------------------------------

def _systemd_literal(text: str, *, exec_line: bool) -> str:
    out = []
    for c in text:
        if c == "\\":
            out.append("\\\\")
        elif c == '"':
            out.append('\\"')
        elif c == "%":
            out.append("%%")
        elif c == "$" and exec_line:
            out.append("$$")
        elif c == "\n":
            out.append("\\n")
        elif c == "\t":
            out.append("\\t")
        elif ord(c) < 0x20 or c == "\x7f":
            out.append(f"\\x{ord(c):02x}")
        else:
            out.append(c)
    return "".join(out)


def _systemd_word(word: str, *, exec_line: bool) -> str:
    parts = split_marked(word)
    if any(is_ref for is_ref, _ in parts) and not exec_line:
        raise ExportFormatError("internal: a reference outside ExecStart=")
    body = "".join(f"${{{text}}}" if is_ref else _systemd_literal(text, exec_line=exec_line)
                   for is_ref, text in parts)
    if _SYSTEMD_PLAIN.fullmatch(word):
        return body
    return f'"{body}"'


def _unit_value(text: str) -> str:
    """A free-text setting (Description=): specifiers doubled, one line."""

    return "".join(c if c.isprintable() else " " for c in text).replace("%", "%%")


def systemd_text(exported: Exported) -> str:
    """A service unit: Environment= per variable, secrets through EnvironmentFile=."""

    _check(exported, "systemd")
    secret_env = [k for k, v in exported.env.items() if any(r for r, _ in split_marked(v))]
    for name in secret_env:
        if split_marked(exported.env[name]) != [(True, name)]:
            raise ExportFormatError(
                f"environment variable {name} holds a secret inside a longer value, which systemd's "
                "Environment= cannot refer to; use --format shell or json")
    lines = [comment_line(h) for h in exported.header]
    lines += [
        "[Unit]",
        f"Description={_unit_value(f'vLLM server ({exported.title or exported.study})')}",
        "After=network-online.target",
        "Wants=network-online.target",
        "",
        "[Service]",
        "Type=simple",
    ]
    for name, value in exported.env.items():
        if name not in secret_env:
            lines.append("Environment=" + _systemd_word(f"{name}={value}", exec_line=False))
    secrets = exported.secrets
    if secrets:
        lines.append(comment_line(f"{', '.join(secrets)}: NAME=value lines in the file below (mode 0600)"))
        lines.append(f"EnvironmentFile={_unit_value(f'/etc/vllm/{exported.study}.secrets')}")
    argv = list(exported.argv)
    if argv and "/" not in argv[0]:
        argv = ["/usr/bin/env", *argv]  # ExecStart needs an absolute path or a PATH lookup
    lines += [
        "ExecStart=" + " ".join(_systemd_word(a, exec_line=True) for a in argv),
        "Restart=on-failure",
        "RestartSec=10",
        # vLLM handles SIGTERM; its workers share the group, which control-group kill covers.
        "KillMode=control-group",
        "TimeoutStopSec=60",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ]
    return "\n".join(lines)


# -- vLLM --config YAML --------------------------------------------------------------------

def yaml_text(exported: Exported) -> str:
    """A vLLM ``--config`` file; the environment (part of the measured configuration) and
    any secret flag go on the start command in the header."""

    _check(exported, "yaml")
    for key, value in exported.config.items():
        # vLLM's --config reader turns `key: value` into `--key value`: a value starting
        # with '-' becomes a flag of its own there.
        if isinstance(value, str) and value.startswith("-"):
            raise ExportFormatError(
                f"--{key}: the value {value!r} starts with '-', which vLLM's --config reader passes "
                "on as a flag, not as this argument's value; use --format shell, env, json or systemd")
    start = [_shell_assignment(k, v) for k, v in exported.env.items()]
    start += [_shell_word(w, command=i == 0) for i, w in enumerate(exported.prefix)]
    start += [_shell_word(w) for w in exported.config_argv] + ["--config", "THIS_FILE.yaml"]
    command = " ".join(start)
    if any(not c.isprintable() and c != " " for c in command):
        raise ExportFormatError(
            "the yaml format writes the start command (environment included) in a comment line, "
            "which cannot hold a newline or another control character in a value; use --format "
            "shell, env, json or systemd")
    lines = [comment_line(h) for h in exported.header]
    lines += ["# Start with (the environment is part of the measured configuration):", "#   " + command]
    body = yaml.safe_dump(exported.config, sort_keys=False, default_flow_style=False, allow_unicode=False)
    return "\n".join(lines) + "\n" + body


# -- reading back (tuner export --check) ------------------------------------------------

_C_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "a": "\a", "b": "\b",
              "f": "\f", "v": "\v", "s": " "}


def _unit_words(value: str) -> list[str]:
    """An ExecStart=/Environment= value split into words as systemd unquotes what
    ``systemd_text`` writes (quotes, C escapes, ``%%``); ``$`` is left to the caller."""

    words: list[str] = []
    i, n = 0, len(value)
    while i < n:
        if value[i] in " \t":
            i += 1
            continue
        word: list[str] = []
        quote = ""
        while i < n and (quote or value[i] not in " \t"):
            c = value[i]
            if c == "\\" and i + 1 < n:
                nxt = value[i + 1]
                if nxt == "x":
                    word.append(chr(int(value[i + 2:i + 4], 16)))
                    i += 4
                    continue
                word.append(_C_ESCAPES.get(nxt, nxt))
                i += 2
            elif c in "\"'" and (not quote or c == quote):
                quote = "" if quote else c
                i += 1
            else:
                word.append(c)
                i += 1
        words.append("".join(word).replace("%%", "%"))
    return words


def read_systemd_exec(text: str) -> list[str]:
    """The ExecStart= words of a ``systemd_text`` unit, ``$$`` as ``$`` (``${NAME}`` kept),
    without the ``/usr/bin/env`` the unit adds for a program found on PATH."""

    line = next(l for l in text.split("\n") if l.startswith("ExecStart="))  # systemd splits on \\n only
    words = [w.replace("$$", "$") for w in _unit_words(line[len("ExecStart="):])]
    return words[1:] if words and words[0] == "/usr/bin/env" else words


def read_shell(text: str) -> tuple[list[str], dict[str, str]]:
    """(argv, env) of a ``shell_text`` export, read as a shell reads it (comments, quotes
    spanning lines, leading NAME=value assignments)."""

    words = shlex.split(text, comments=True)
    env: dict[str, str] = {}
    while words and "=" in words[0] and _ENV_NAME.fullmatch(words[0].split("=", 1)[0]):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    return words, env
