"""The configuration the study's reference is recorded from, and its server command.

Pure. It renders through ``tuner.study.space.server_command``, the same path as the
trials, confirmation re-runs and ``tuner export`` (``space.trial_command``). Pinning a
relative interpreter to the current folder (a trial runs elsewhere) is the caller's, at
dispatch time (``tuner.engine.orchestrator``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuner.errors import SpecError
from tuner.study import space
from tuner.study.scoring import values_text
from tuner.study.spec import StudySpec

__all__ = ["reference_configuration", "ReferenceConfiguration"]

# Config arguments the conservative reference drops: each is a path (graphs, the compiler,
# a drafter) a trial's bug could live in, and the reference must not share it.
_NOT_IN_REFERENCE = ("compilation_config", "speculative_config")


@dataclass(frozen=True)
class ReferenceConfiguration:
    values: dict[str, Any]
    argv: list[str]
    env: dict[str, str]
    asked: dict[str, Any]
    label: str


def reference_configuration(spec: StudySpec, *, port: int | None = None, python: str | None = None,
                            compile_cache_dir: str | None = None) -> ReferenceConfiguration:
    """The configuration the study's reference is recorded from: the baseline's values
    with ``probe.reference.values`` on top, then (``conservative``) enforce_eager on and
    no compilation or speculative config, fixed flags included.

    Raises:
        SpecError: ``probe.reference.values`` names a parameter the study does not have.
    """

    ref = spec.probe.reference
    names = {p.name for p in spec.parameters}
    unknown = sorted(set(ref.values) - names)
    if unknown:
        raise SpecError(f"probe.reference.values: unknown parameter(s) {unknown}; "
                        f"the study's parameters are {sorted(names)}")
    values = {**space.baseline_values(spec), **ref.values}
    settings = space.settings_for(spec, values)
    server = spec.server
    label = "baseline" + (f" with {values_text(ref.values)}" if ref.values else "")
    if ref.conservative:
        settings = {t: v for t, v in settings.items() if t.split(".")[0] not in _NOT_IN_REFERENCE}
        settings["enforce_eager"] = True
        flags = {k: v for k, v in server.flags.items() if k.split(".")[0] not in _NOT_IN_REFERENCE}
        server = server.model_copy(update={"flags": flags})
        label += ", eager, no compilation config, no speculation"
    # The reference is a server of the study like any other: it gets the same measurement
    # environment, the study's compile cache and startup levers included.
    command = space.server_command(spec, server, settings, port=port, python=python,
                                   compile_cache_dir=compile_cache_dir, running=True)
    return ReferenceConfiguration(values, command.argv, command.launch_env, command.asked, label)
