"""Verification on the simulator: which knobs a point asked for its server really applies.

Step 3 of the ground truth (``tuner.sim.truth``): each asked target is compared with the
value the simulated server really applies, the way ``tuner.vllm.verify`` reads it back from
the log (see ``_got``). A silent downgrade (custom all-reduce off on PCIe, FULL ->
FULL_AND_PIECEWISE on an UNIFORM_BATCH attention backend, ...) makes the point *not applied*
-> infeasible. ``benchmarks/search_efficiency.py --check-verdicts`` replays every point
through the real log path (simulated startup log -> ``parse_effective_config`` ->
``verify``) and tests/test_search_truth.py does so for a sample, so this mapping cannot
drift silently.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tuner.sim.args import ArgvError, parse_argv
from tuner.sim.effective import ConfigError, Effective, resolve
from tuner.sim.profile import Profile
from tuner.study.space import trial_command
from tuner.study.spec import StudySpec
from tuner.vllm.knobs import RenderedCommand

__all__ = ["SimStart", "default_render", "mismatches", "sim_start"]


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


def sim_start(spec: StudySpec, values: dict[str, Any], profile: Profile) -> SimStart | None:
    """The simulator's start of ``values``, or None when that server would not start (a
    configuration error or a startup failure: nothing to verify)."""

    command = default_render(spec, values)
    argv, env, asked = command.argv[len(spec.server.command):], command.launch_env, command.asked
    try:
        eff = resolve(parse_argv(argv), env, profile)
    except (ConfigError, ArgvError):
        return None
    if eff.failure is not None:
        return None
    return SimStart(argv, env, asked, eff)

def _norm(value: Any) -> Any:
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, str):
        text = value.strip()
        if text.lower() in ("true", "false"):
            return text.lower() == "true"
        try:
            return int(text)
        except ValueError:
            try:
                return float(text)
            except ValueError:
                return text.upper()
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


_UNVERIFIED = object()


def _got(target: str, asked: Any, eff: Effective) -> Any:
    """The value the log would show for ``target`` (``_UNVERIFIED``: the verifier cannot tell
    or reads it off vLLM's echo of the argument, which always matches what was asked)."""

    spec = eff.spec
    if target == "enforce_eager":
        return eff.enforce_eager
    if target == "compilation_config.cudagraph_mode":
        mode = eff.cudagraph_mode
        # Graphs asked but none captured: vLLM logs "Skipping CUDA graph capture".
        if mode != "NONE" and not eff.capture_sizes and eff.profile.hardware.platform == "cuda":
            return "NONE(skipped)"
        return mode
    if target == "compilation_config.mode":
        return eff.compile_mode
    if target in ("compilation_config.max_cudagraph_capture_size", "max_cudagraph_capture_size"):
        return eff.max_capture_size
    if target in ("compilation_config.cudagraph_capture_sizes", "cudagraph_capture_sizes"):
        return sorted(eff.capture_sizes_config)
    if target == "disable_custom_all_reduce":
        return "CUSTOM" not in eff.allreduce_backends if eff.tp > 1 else _UNVERIFIED
    if target == "speculative_config.method":
        return spec.method if spec else None
    if target == "speculative_config.num_speculative_tokens":
        return spec.num_spec_tokens if spec else None
    if target == "speculative_config.prompt_lookup_min":
        return spec.prompt_lookup_min if spec else None
    if target == "speculative_config.prompt_lookup_max":
        return spec.prompt_lookup_max if spec else None
    if target == "tensor_parallel_size":
        return eff.tp
    if target == "pipeline_parallel_size":
        return eff.pp
    if target == "async_scheduling":
        return eff.async_scheduling
    backend = {"env:VLLM_ALLREDUCE_USE_FLASHINFER": "FLASHINFER",
               "env:VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC": "FLASHINFER_PCIE_IPC",
               "env:VLLM_ALLREDUCE_USE_SYMM_MEM": "SYMM_MEM",
               "env:VLLM_USE_NCCL_SYMM_MEM": "NCCL_SYMM_MEM"}.get(target)
    if backend is not None:
        if eff.tp == 1 or eff.profile.hardware.platform != "cuda":
            return _UNVERIFIED
        return "1" if backend in eff.allreduce_backends else "0"
    if target.startswith("env:NCCL_"):
        # NCCL reports variables it read ("set by environment") when it runs the TP group
        # with NCCL_DEBUG=INFO; the simulator echoes them unchanged.
        name = target[4:]
        if "PYNCCL" not in eff.allreduce_backends or (eff.nccl.debug or "").upper() not in ("INFO", "TRACE"):
            return _UNVERIFIED
        if name == "NCCL_PROTO":
            return eff.nccl.proto_env
        if name == "NCCL_ALGO":
            return eff.nccl.algo_env
        return _UNVERIFIED
    return _UNVERIFIED


def mismatches(asked: Mapping[str, Any], eff: Effective) -> list[str]:
    """Asked targets the simulated server does not apply (what verify() calls not_applied)."""

    out = []
    for target, value in asked.items():
        got = _got(target, value, eff)
        if got is _UNVERIFIED:
            continue
        if target == "speculative_config.method" and isinstance(value, str) and value.lower() in ("none", ""):
            value = None
        want = _norm(value)
        have = _norm(got)
        if isinstance(want, str) and isinstance(have, str):
            same = want.replace(" ", "") == have.replace(" ", "")
        else:
            same = want == have
        if not same:
            out.append(target)
    return out
