"""Does the study's server load dummy weights (``load_format: dummy``: real kernels, random
weights)? Pure: read from the study spec alone.

Dummy weights are how speed is measured where the real weights are not on the box or too
slow to load (issue 34). Random weights answer no known-answer question right, but they are
deterministic (vLLM seeds every tensor), so the probe can still hold each trial to a
reference recorded from the same weights: ``probe.mode: auto`` turns reference-only there
(:func:`tuner.probe.spec.resolve_mode`). A search that mixes dummy and real weights would
compare trials with a reference of other weights, so it is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tuner.probe.spec import ProbeSpec, resolve_mode

# ``spec`` below is a tuner.study.spec.StudySpec, typed as Any: its own validator calls
# these, so naming the class here would make an import cycle.
StudySpec = Any

__all__ = ["DUMMY", "dummy_weights", "study_probe_mode", "weights_problem"]

DUMMY = "dummy"
TARGET = "load_format"


def _command_format(command: Sequence[str]) -> str | None:
    """The ``--load-format`` a study's ``server.command`` prefix passes itself, if any."""
    for i, arg in enumerate(command):
        if arg in ("--load-format", "--load_format") and i + 1 < len(command):
            return command[i + 1]
        for flag in ("--load-format=", "--load_format="):
            if arg.startswith(flag):
                return arg[len(flag):]
    return None


def _formats(spec: StudySpec) -> tuple[set[Any], str | None]:
    """Every load format a trial of ``spec`` may run with (None: the server's default, real
    weights), and the parameter that searches it (None when fixed)."""
    fixed = spec.server.flags.get(TARGET, _command_format(spec.server.command))
    for param in spec.parameters:
        if param.target == TARGET:
            return set(param.domain() or ()), param.name
    return {fixed}, None


def weights_problem(spec: StudySpec) -> str | None:
    """Why the study's weights cannot be judged by one reference: a searched load format
    that mixes dummy and real weights (with the probe on); None when consistent."""
    formats, searched = _formats(spec)
    if not spec.probe.enabled or searched is None or DUMMY not in formats or len(formats) == 1:
        return None
    others = sorted("null (the server's default)" if f is None else repr(f) for f in formats if f != DUMMY)
    return (f"parameters: {searched!r} searches load_format over dummy and {', '.join(others)}: "
            "random and real weights answer differently, so one reference cannot judge both; "
            "search one of them (or set probe.enabled: false)")


def dummy_weights(spec: StudySpec) -> bool:
    """Every trial of ``spec`` (and its reference) loads dummy weights."""
    formats, _ = _formats(spec)
    return formats == {DUMMY}


def study_probe_mode(spec: StudySpec) -> ProbeSpec:
    """``spec.probe`` with ``mode`` resolved for the study's weights.

    Raises:
        ValueError: one line - ``full`` asked on dummy weights, reference-only without a
            reference, or a search mixing dummy and real weights.
    """
    if problem := weights_problem(spec):
        raise ValueError(problem)
    return resolve_mode(spec.probe, dummy_weights=dummy_weights(spec))
