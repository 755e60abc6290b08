"""Verification on the simulator: which knobs a point asked for its server really applies.

Step 3 of the ground truth (``tuner.sim.truth``): the simulated server's startup log
(``tuner.sim.dry_log``, the lines the served simulator prints) goes through the worker's
own verification (``parse_effective_config`` + ``verify``), so a point is *not applied*
exactly when a trial of it would be told so. A silent downgrade (custom all-reduce off on
PCIe, FULL -> FULL_AND_PIECEWISE on an UNIFORM_BATCH attention backend, ...) makes it
infeasible.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tuner.sim.args import ArgvError, parse_argv
from tuner.sim.dry_log import startup_log
from tuner.sim.effective import ConfigError, Effective, resolve
from tuner.sim.profile import Profile
from tuner.study.space import trial_command
from tuner.study.spec import StudySpec
from tuner.vllm.effective_config import parse_effective_config
from tuner.vllm.knobs import RenderedCommand
from tuner.vllm.verify import verify

__all__ = ["SimStart", "default_render", "log_mismatches", "sim_start"]


def default_render(spec: StudySpec, values: dict[str, Any]) -> RenderedCommand:
    """The trials' own renderer."""

    return trial_command(spec, values, python="python")


@dataclass(frozen=True)
class SimStart:
    """One point as the simulator would start it: the server's own arguments (the command
    left out), its environment, what the trial asked, and what the simulator applies."""

    argv: list[str]
    env: dict[str, str]
    asked: dict[str, Any]
    effective: Effective


def sim_start(spec: StudySpec, values: dict[str, Any], profile: Profile,
              render: Callable[[StudySpec, dict[str, Any]], RenderedCommand] = default_render) -> SimStart | None:
    """The simulator's start of ``values``, or None when that server would not start (a
    configuration error or a startup failure: nothing to verify)."""

    command = render(spec, values)
    argv, env, asked = command.argv[len(spec.server.command):], command.launch_env, command.asked
    try:
        eff = resolve(parse_argv(argv), env, profile)
    except (ConfigError, ArgvError):
        return None
    if eff.failure is not None:
        return None
    return SimStart(argv, env, asked, eff)


def log_mismatches(argv: Sequence[str], env: Mapping[str, str], asked: Mapping[str, Any],
                   profile: Profile) -> list[str]:
    """Asked targets the simulated server does not apply, as the worker finds them: its
    startup log (``tuner.sim.dry_log``) read back (``parse_effective_config``) and checked
    (``verify``) by the tuner's own code."""

    log = startup_log(argv, env, profile)
    return [c.target for c in verify(asked, parse_effective_config(log)).mismatches()]
