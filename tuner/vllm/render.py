"""One pure function from (fixed server settings, trial settings) to (argv, env).

The trial runner and ``tuner export`` both call ``render_command``, so the exported
command is byte for byte what was measured. Settings are keyed by target: a top-level
argument (``enforce_eager``), a dotted config field (``compilation_config.cudagraph_mode``,
merged with every other field of the same config into one JSON value) or ``env:NAME``.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tuner.study.spec import ServerSpec

__all__ = ["RenderedCommand", "render_command", "server_arguments", "asked_settings", "shell_line",
           "PYTHON_PLACEHOLDER"]

PYTHON_PLACEHOLDER = "{python}"


@dataclass(frozen=True)
class RenderedCommand:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


def _flag_name(key: str) -> str:
    return "--" + key.replace("_", "-")


def _env_text(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _set_nested(tree: dict[str, Any], path: list[str], value: Any) -> None:
    node = tree
    for part in path[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[path[-1]] = value


def _drop_unset(value: Any) -> Any:
    """Remove null leaves and then-empty objects: null means 'server default'."""

    if isinstance(value, dict):
        cleaned = {k: _drop_unset(v) for k, v in value.items() if v is not None}
        return {k: v for k, v in cleaned.items() if not (isinstance(v, dict) and not v)}
    return value


def asked_settings(server: ServerSpec, settings: Mapping[str, Any]) -> dict[str, Any]:
    """Everything the trial asks the server for, flat by target (fixed + trial), nulls dropped."""

    flat: dict[str, Any] = {}

    def add(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                add(f"{prefix}.{k}", v)
        elif value is not None:
            flat[prefix] = value

    for key, value in server.flags.items():
        add(key, value)
    for name, value in server.env.items():
        if value is not None:
            flat[f"env:{name}"] = _env_text(value)
    for target, value in settings.items():
        if value is None:
            continue
        flat[target] = _env_text(value) if target.startswith("env:") else value
    # A speculative field without a method is meaningless: vLLM would reject it, and a
    # condition-less study could produce it, so the method decides.
    if "speculative_config.method" not in flat:
        flat = {k: v for k, v in flat.items() if not k.startswith("speculative_config.")}
    return flat


def server_arguments(server: ServerSpec, settings: Mapping[str, Any], *,
                     port: int | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """(arguments, env): every engine argument by snake_case name, in command-line order.

    Nested config fields are merged into one object per config argument and null leaves
    (meaning "server default") are dropped. Both the command line and the vLLM
    ``--config`` YAML are written from this one mapping.
    """

    asked = asked_settings(server, settings)
    args: dict[str, Any] = {"model": server.model}
    if server.served_model_name:
        args["served_model_name"] = server.served_model_name
    args["host"] = server.host
    args["port"] = port if port is not None else server.port
    env: dict[str, str] = {}
    for target, value in asked.items():
        if target.startswith("env:"):
            env[target[4:]] = _env_text(value)
            continue
        head, *rest = target.split(".")
        if rest:
            existing = args.get(head)
            if not isinstance(existing, dict):
                existing = {}
                args[head] = existing
            _set_nested(existing, rest, value)
        else:
            args[head] = value
    cleaned = {k: _drop_unset(v) for k, v in args.items()}
    return {k: v for k, v in cleaned.items() if not (isinstance(v, dict) and not v)}, env


def render_command(
    server: ServerSpec,
    settings: Mapping[str, Any],
    *,
    python: str = "python",
    port: int | None = None,
    extra_env: Mapping[str, str] | None = None,
) -> RenderedCommand:
    """argv and environment (only the variables the study sets) for one trial.

    Booleans render as ``--flag`` / ``--no-flag``; lists as repeated values after the flag;
    objects and dotted fields as one compact JSON value per config argument.
    """

    args, env = server_arguments(server, settings, port=port)
    argv = [python if part == PYTHON_PLACEHOLDER else part for part in server.command]
    for key, value in args.items():
        flag = _flag_name(key)
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + key.replace("_", "-"))
        elif isinstance(value, dict):
            argv += [flag, json.dumps(value, separators=(",", ":"))]
        elif isinstance(value, list):
            argv += [flag, *(str(v) for v in value)]
        else:
            argv += [flag, str(value)]
    if extra_env:
        env.update(extra_env)
    return RenderedCommand(argv=argv, env=env)


def shell_line(command: RenderedCommand, *, redact: tuple[str, ...] = ()) -> str:
    """A POSIX shell line: ``VAR=value ... argv`` with every word quoted as needed."""

    # A secret is exported as a reference to the variable, never its value.
    parts = [
        f'{name}="${{{name}}}"' if name in redact else f"{name}={shlex.quote(value)}"
        for name, value in command.env.items()
    ]
    return " ".join(parts + [shlex.quote(a) for a in command.argv])
