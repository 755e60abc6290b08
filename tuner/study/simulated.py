"""Whether a study is served by the built-in simulator, and the line that says so.

A simulated study's figures are the simulator's model of its hardware profile, never a
measurement, and its exported command starts the simulator. Status, export and report open
with :func:`simulated_label` for such a study, so neither is taken for a real server's; a dry
run's label also names the study file it stood in for. Light on purpose: ``tuner status``
reads it without the spec models.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence

__all__ = ["SIMULATOR_MODULE", "PROFILE_ENV", "is_simulator", "simulated_label", "saved_spec_label"]

SIMULATOR_MODULE = "tuner.sim"
PROFILE_ENV = "TUNER_SIM_PROFILE"


def is_simulator(command: Sequence[str]) -> bool:
    """The server is the built-in simulator (``{python} -m tuner.sim`` or ``tuner-sim``): it
    serves any model name and needs no GPU."""

    if not command:
        return False
    if posixpath.basename(command[0]) == "tuner-sim":
        return True
    return any(a == "-m" and b == SIMULATOR_MODULE for a, b in zip(command, command[1:]))


def simulated_label(command: Sequence[str], env: Mapping[str, object], dry_run_of: str | None) -> str | None:
    """The opening line of every view of a study served by the simulator; None for a real
    server. ``command`` and ``env``: the study's server section; ``dry_run_of``: the study
    file a dry run stood in for (its dry-run.json), None for a study that names the
    simulator itself (the quick start's)."""

    if not is_simulator([str(word) for word in command]):
        return None
    profile = env.get(PROFILE_ENV)
    model = f"profile {profile}" if isinstance(profile, str) and profile else "its default profile"
    what = "DRY RUN" if dry_run_of else "SIMULATOR"
    text = (f"{what}: served by the built-in simulator ({model}); every figure is the simulator's model, "
            "not a measurement, and the command starts the simulator, not vLLM")
    return text + (f"; `tuner run {dry_run_of}` measures the real server" if dry_run_of else "")


def saved_spec_label(data: object, dry_run_of: str | None) -> str | None:
    """:func:`simulated_label` of a study's saved spec.yaml as loaded YAML (anything: a copied
    folder's file is input like any other)."""

    server = data.get("server") if isinstance(data, dict) else None
    server = server if isinstance(server, dict) else {}
    command, env = server.get("command"), server.get("env")
    return simulated_label(command if isinstance(command, list) else [], env if isinstance(env, dict) else {},
                           dry_run_of)
