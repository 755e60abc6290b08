"""Compare what a trial asked vLLM for with what its log says vLLM applied.

`verify(asked, effective)` returns one :class:`KnobCheck` per asked target:

* ``applied``: the log shows the asked value in effect;
* ``not_applied``: the log shows something else (a silent downgrade, a forced value, a
  leftover setting) — the trial measured a different configuration than it claims;
* ``unverifiable``: the log cannot tell (the note says what would make it tell).

Targets (see ``catalog``): top-level engine args (``enforce_eager``), dotted fields of
JSON config args (``compilation_config.cudagraph_mode``) and ``env:NAME``. How each target
is read back is one row of ``_CHECKERS``/``_PREFIX_CHECKERS``; any other target falls back
to vLLM's own record of parsed arguments, the ``non-default args:`` line.

Only asked targets are checked: a knob the trial did not name is never a failure. To make
sure a setting is *off* (e.g. no leftover speculation, field-notes trap 2), ask for it
explicitly: ``speculative_config.method: null`` (or ``"none"``) means "speculation must be
off" and is verified like any other value.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, model_validator

from tuner.vllm.effective_config import EffectiveConfig, excerpt_around_key

__all__ = ["KnobCheck", "Status", "VerificationResult", "verify"]

Status = Literal["applied", "not_applied", "unverifiable"]


class KnobCheck(BaseModel):
    """The verdict on one asked target."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    target: str
    asked: Any
    got: Any = None
    status: Status
    evidence: str | None = None
    note: str | None = None


class VerificationResult(BaseModel):
    """All checks of one trial; ``applied`` is False as soon as one check is not_applied."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    checks: list[KnobCheck]
    applied: bool

    @model_validator(mode="after")
    def _applied_matches_checks(self) -> VerificationResult:
        if self.applied != all(c.status != "not_applied" for c in self.checks):
            raise ValueError("applied must be True exactly when no check is not_applied")
        return self

    def mismatches(self) -> list[KnobCheck]:
        return [c for c in self.checks if c.status == "not_applied"]

    def unverifiable(self) -> list[KnobCheck]:
        return [c for c in self.checks if c.status == "unverifiable"]


def verify(asked: Mapping[str, Any], effective: EffectiveConfig) -> VerificationResult:
    """Check every asked target against the effective configuration. Never raises on
    unknown targets or odd values: those come back as ``unverifiable``."""
    checks = [_checker_for(str(target))(str(target), value, effective)
              for target, value in asked.items()]
    return VerificationResult(checks=checks, applied=all(c.status != "not_applied" for c in checks))


# ---------------------------------------------------------------------------------------
# Value normalisation

_CUDAGRAPH_INTS = {0: "NONE", 1: "PIECEWISE", 2: "FULL"}
_COMPILATION_INTS = {0: "NONE", 1: "STOCK_TORCH_COMPILE", 2: "DYNAMO_TRACE_ONCE", 3: "VLLM_COMPILE"}
_DTYPE_ALIASES = {"half": "float16", "fp16": "float16", "float": "float32", "fp32": "float32",
                  "bf16": "bfloat16"}
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}
_OFF = {"", "none", "null", "off", "false"}
_INT_RE = re.compile(r"[+-]?[0-9]+")


def _norm_bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    return None


def _norm_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and _INT_RE.fullmatch(value.strip()):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _enum_normaliser(ints: dict[int, str]) -> Callable[[Any], str | None]:
    def norm(value: Any) -> str | None:
        number = _norm_int(value)
        if number is not None:
            return ints.get(number)
        return value.strip().upper() if isinstance(value, str) and value.strip() else None

    return norm


_norm_cudagraph = _enum_normaliser(_CUDAGRAPH_INTS)
_norm_compilation = _enum_normaliser(_COMPILATION_INTS)


def _norm_dtype(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    text = value.strip().lower().removeprefix("torch.")
    return _DTYPE_ALIASES.get(text, text)


def _norm_int_list(value: Any) -> list[int] | None:
    if not isinstance(value, list | tuple):
        return None
    numbers = [_norm_int(v) for v in value]
    return None if any(n is None for n in numbers) else sorted(n for n in numbers if n is not None)


def _norm_generic(value: Any) -> Any:
    """Loose equality for the non-default-args fallback: YAML gives "4", vLLM 4."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, str):
        if (b := _norm_bool(value)) is not None and value.strip().lower() in ("true", "false"):
            return b
        if (n := _norm_int(value)) is not None:
            return n
        try:
            return float(value)
        except ValueError:
            return value.strip().lower()
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list | tuple):
        return [_norm_generic(v) for v in value]
    if isinstance(value, dict):
        return {k: _norm_generic(v) for k, v in value.items()}
    return value


def _is_off(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in _OFF
    return value is None or value is False


# ---------------------------------------------------------------------------------------
# Check builders

Checker = Callable[[str, Any, EffectiveConfig], KnobCheck]


def _check(target: str, asked: Any, status: Status, got: Any = None, evidence: str | None = None,
           note: str | None = None) -> KnobCheck:
    return KnobCheck(target=target, asked=asked, got=got, status=status, evidence=evidence,
                     note=note)


def _uninterpretable(target: str, asked: Any, got: Any = None,
                     evidence: str | None = None) -> KnobCheck:
    return _check(target, asked, "unverifiable", got, evidence,
                  note=f"cannot interpret the asked value {asked!r}")


def _seen(eff: EffectiveConfig, field: str) -> bool:
    # A field is "seen" when the log established it, even as None (e.g. speculation off).
    return getattr(eff, field) is not None or field in eff.evidence


def _from_non_default_args(target: str, asked: Any, eff: EffectiveConfig) -> KnobCheck:
    """Fallback: compare with vLLM's record of the arguments it parsed."""
    if eff.non_default_args is None:
        return _check(target, asked, "unverifiable", note="no `non-default args:` line in the log")
    node: Any = eff.non_default_args
    for key in target.split("."):
        if not isinstance(node, dict) or node.get(key) is None:
            return _check(target, asked, "unverifiable",
                          note="not among vLLM's non-default args: vLLM used its default, "
                               "which the log does not print")
        node = node[key]
    line = eff.non_default_args_line or ""
    evidence = excerpt_around_key(line, target) or eff.evidence.get("non_default_args")
    status: Status = "applied" if _norm_generic(node) == _norm_generic(asked) else "not_applied"
    return _check(target, asked, status, node, evidence, note="from the non-default args line")


def _field_rule(field: str, norm: Callable[[Any], Any]) -> Checker:
    """A target read straight off one EffectiveConfig field."""

    def check(target: str, asked: Any, eff: EffectiveConfig) -> KnobCheck:
        if not _seen(eff, field):
            return _from_non_default_args(target, asked, eff)
        want, got = norm(asked), getattr(eff, field)
        if want is None:
            return _uninterpretable(target, asked, got, eff.evidence.get(field))
        status: Status = "applied" if got is not None and norm(got) == want else "not_applied"
        return _check(target, asked, status, got, eff.evidence.get(field))

    return check


def _check_dtype(target: str, asked: Any, eff: EffectiveConfig) -> KnobCheck:
    if _norm_dtype(asked) == "auto":
        # auto resolves from the model's config.json, which the log does not show.
        return _check(target, asked, "unverifiable", eff.dtype, eff.evidence.get("dtype"),
                      note="dtype=auto follows the model's config; the log shows only the result")
    return _field_rule("dtype", _norm_dtype)(target, asked, eff)


_GRAPH_KINDS = {"NONE": set(), "PIECEWISE": {"PIECEWISE"}, "FULL": {"FULL"},
                "FULL_DECODE_ONLY": {"FULL"}, "FULL_AND_PIECEWISE": {"FULL", "PIECEWISE"}}


def _capture_problem(mode: str, eff: EffectiveConfig) -> tuple[str, str | None] | None:
    """Whether the capture lines contradict `mode` (GPU only). Returns (note, evidence)."""
    if mode != "NONE" and eff.graph_capture_skipped:
        return "vLLM skipped CUDA graph capture", eff.evidence.get("graph_capture_skipped")
    if eff.graphs_captured is None:
        return None
    # Bars are labelled "FULL" (V2 runner) or "decode, FULL" (V1): the kind is the last word.
    kinds = {label.rsplit(",", 1)[-1].strip().upper() for label in eff.graphs_captured}
    kinds &= {"FULL", "PIECEWISE"}
    if mode in _GRAPH_KINDS and kinds != _GRAPH_KINDS[mode]:
        return (f"captured graphs {sorted(kinds)} do not match mode {mode}",
                eff.evidence.get("graphs_captured"))
    return None


def _check_cudagraph_mode(target: str, asked: Any, eff: EffectiveConfig) -> KnobCheck:
    want = _norm_cudagraph(asked)
    got = eff.cudagraph_mode
    evidence = eff.evidence.get("cudagraph_mode")
    if want is None:
        return _uninterpretable(target, asked, got, evidence)
    if got is None:
        return _check(target, asked, "unverifiable", note="no engine config line in the log")
    if got != want:
        if eff.cudagraph_downgrades:
            note = "vLLM downgraded it: " + ", ".join(
                f"{d.from_mode or '?'}→{d.to_mode}" for d in eff.cudagraph_downgrades)
        elif eff.platform == "cpu":
            note = "the CPU build forces cudagraph_mode NONE without logging it"
        else:
            note = f"the engine ran {got}"
        return _check(target, asked, "not_applied", got, evidence, note)
    if eff.platform != "cpu" and (problem := _capture_problem(got, eff)):
        return _check(target, asked, "not_applied", got, problem[1], problem[0])
    return _check(target, asked, "applied", got, evidence)


def _check_compilation_mode(target: str, asked: Any, eff: EffectiveConfig) -> KnobCheck:
    want = _norm_compilation(asked)
    got = eff.compilation_mode
    evidence = eff.evidence.get("compilation_mode")
    if got is None:
        return _from_non_default_args(target, asked, eff)
    if want is None:
        return _uninterpretable(target, asked, got, evidence)
    if got == want:
        return _check(target, asked, "applied", got, evidence)
    if want == "VLLM_COMPILE" and got == "DYNAMO_TRACE_ONCE" and eff.platform == "cpu":
        return _check(target, asked, "applied", got, evidence,
                      note="the CPU platform substitutes DYNAMO_TRACE_ONCE for VLLM_COMPILE")
    return _check(target, asked, "not_applied", got, evidence)


def _check_enforce_eager(target: str, asked: Any, eff: EffectiveConfig) -> KnobCheck:
    base = _field_rule("enforce_eager", _norm_bool)(target, asked, eff)
    if base.status != "applied" or _norm_bool(asked) is not True:
        return base
    # Eager means no graphs at all; a config claiming otherwise is not eager.
    if eff.cudagraph_mode not in (None, "NONE"):
        return base.model_copy(update={"status": "not_applied", "got": eff.cudagraph_mode,
                                       "evidence": eff.evidence.get("cudagraph_mode"),
                                       "note": "enforce_eager=True but cudagraph_mode is not NONE"})
    if eff.graphs_captured:
        return base.model_copy(update={"status": "not_applied",
                                       "evidence": eff.evidence.get("graphs_captured"),
                                       "note": "enforce_eager=True but CUDA graphs were captured"})
    return base


def _check_custom_all_reduce(target: str, asked: Any, eff: EffectiveConfig) -> KnobCheck:
    want_disabled = _norm_bool(asked)
    if want_disabled is None:
        return _uninterpretable(target, asked)
    active = eff.custom_all_reduce_active
    active_ev = eff.evidence.get("custom_all_reduce_active")
    config, config_ev = eff.disable_custom_all_reduce, eff.evidence.get("disable_custom_all_reduce")
    if not want_disabled:  # custom all-reduce wanted
        if active is False:
            return _check(target, asked, "not_applied", True, active_ev,
                          note=f"custom all-reduce is off: {eff.custom_all_reduce_reason}")
        if active:
            return _check(target, asked, "applied", False, active_ev)
        if config is None:
            return _from_non_default_args(target, asked, eff)
        note = None
        if eff.tensor_parallel_size == 1:
            note = "tensor_parallel_size=1: there is no all-reduce, so it is never built"
        return _check(target, asked, "applied" if config is False else "not_applied",
                      config, config_ev, note)
    if config is True or active is False:
        return _check(target, asked, "applied", True, config_ev if config else active_ev)
    if active:
        return _check(target, asked, "not_applied", False, active_ev,
                      note="CUSTOM is still among the all-reduce backends")
    if config is False:
        return _check(target, asked, "not_applied", False, config_ev)
    return _from_non_default_args(target, asked, eff)


def _check_speculative_method(target: str, asked: Any, eff: EffectiveConfig) -> KnobCheck:
    got = eff.speculative_method
    evidence = eff.evidence.get("speculative_method")
    if not _seen(eff, "speculative_method"):
        return _check(target, asked, "unverifiable", note="no engine config line in the log")
    if _is_off(asked):
        if got is None:
            return _check(target, asked, "applied", None, evidence)
        return _check(target, asked, "not_applied", got, evidence,
                      note="speculative decoding is on although none was asked (leftover setting?)")
    if not isinstance(asked, str):
        return _uninterpretable(target, asked, got, evidence)
    want = asked.strip().lower()
    if got is not None and got.lower() == want:
        return _check(target, asked, "applied", got, evidence)
    if got == "mtp" and want.endswith("_mtp"):
        return _check(target, asked, "applied", got, evidence,
                      note="vLLM rewrites the *_mtp aliases to mtp")
    return _check(target, asked, "not_applied", got, evidence)


# NCCL prints "NCCL_X set by environment to V" (NCCL_DEBUG=INFO, ENV subsystem) for these,
# so their absence among other such lines means the variable did not reach NCCL.
_NCCL_ALWAYS_LOGGED = frozenset({
    "NCCL_PROTO", "NCCL_ALGO", "NCCL_BUFFSIZE", "NCCL_NTHREADS", "NCCL_MIN_NCHANNELS",
    "NCCL_MAX_NCHANNELS", "NCCL_P2P_LEVEL",
})


def _nccl_value(value: Any) -> str:
    return str(value).replace(" ", "").upper()


def _check_nccl_env(target: str, asked: Any, eff: EffectiveConfig) -> KnobCheck:
    name = target.removeprefix("env:")
    if eff.platform == "cpu" or eff.distributed_backend == "gloo" or eff.kv_cache_device == "CPU":
        return _check(target, asked, "unverifiable", note="NCCL not used on this platform")
    env = eff.nccl_env or {}
    if name in env:
        same = _nccl_value(env[name]) == _nccl_value(asked)
        status: Status = "applied" if same else "not_applied"
        return _check(target, asked, status, env[name], eff.evidence.get(f"nccl_env.{name}"))
    if env and name in _NCCL_ALWAYS_LOGGED:
        return _check(target, asked, "not_applied", None, eff.evidence.get("nccl_env"),
                      note=f"NCCL reported its environment without {name}: "
                           "the variable did not reach the worker processes")
    if env:
        return _check(target, asked, "unverifiable",
                      note=f"NCCL does not always report {name}")
    if eff.nccl_debug_seen:
        return _check(target, asked, "unverifiable",
                      note="NCCL debug output has no ENV lines; add ENV to NCCL_DEBUG_SUBSYS")
    if eff.world_size == 1:
        return _check(target, asked, "unverifiable",
                      note="world size 1: NCCL carries no collectives here")
    return _check(target, asked, "unverifiable", note="enable NCCL_DEBUG=INFO to verify")


def _allreduce_env_rule(backend: str) -> Checker:
    """vLLM env switches for one all-reduce backend, read off the TP group's backends line."""

    def check(target: str, asked: Any, eff: EffectiveConfig) -> KnobCheck:
        want = _norm_bool(asked)
        backends = eff.allreduce_backends
        if want is None:
            return _uninterpretable(target, asked)
        if backends is None:
            return _check(target, asked, "unverifiable", note="no all-reduce backends line "
                          "(tensor_parallel_size=1, CPU, or older vLLM)")
        evidence = eff.evidence.get("allreduce_backends")
        if (backend in backends) == want:
            return _check(target, asked, "applied", backends, evidence)
        note = (f"{backend} is still used" if not want
                else f"{backend} is not used for the TP group (unsupported on this hardware?)")
        return _check(target, asked, "not_applied", backends, evidence, note)

    return check


def _check_unlogged_env(target: str, asked: Any, eff: EffectiveConfig) -> KnobCheck:
    return _check(target, asked, "unverifiable", note="vLLM does not log this variable's value")


# One row per knob: adding a knob is adding a line.
_CHECKERS: dict[str, Checker] = {
    "enforce_eager": _check_enforce_eager,
    "disable_custom_all_reduce": _check_custom_all_reduce,
    "dtype": _check_dtype,
    "tensor_parallel_size": _field_rule("tensor_parallel_size", _norm_int),
    "pipeline_parallel_size": _field_rule("pipeline_parallel_size", _norm_int),
    "compilation_config.cudagraph_mode": _check_cudagraph_mode,
    "compilation_config.mode": _check_compilation_mode,
    "compilation_config.cudagraph_capture_sizes":
        _field_rule("cudagraph_capture_sizes", _norm_int_list),
    "cudagraph_capture_sizes": _field_rule("cudagraph_capture_sizes", _norm_int_list),
    "compilation_config.max_cudagraph_capture_size":
        _field_rule("max_cudagraph_capture_size", _norm_int),
    "max_cudagraph_capture_size": _field_rule("max_cudagraph_capture_size", _norm_int),
    "speculative_config.method": _check_speculative_method,
    "speculative_config.num_speculative_tokens": _field_rule("num_speculative_tokens", _norm_int),
    "speculative_config.prompt_lookup_min": _field_rule("prompt_lookup_min", _norm_int),
    "speculative_config.prompt_lookup_max": _field_rule("prompt_lookup_max", _norm_int),
    "async_scheduling": _field_rule("async_scheduling", _norm_bool),
    "env:VLLM_ALLREDUCE_USE_FLASHINFER": _allreduce_env_rule("FLASHINFER"),
    "env:VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC": _allreduce_env_rule("FLASHINFER_PCIE_IPC"),
    "env:VLLM_ALLREDUCE_USE_SYMM_MEM": _allreduce_env_rule("SYMM_MEM"),
    "env:VLLM_USE_NCCL_SYMM_MEM": _allreduce_env_rule("NCCL_SYMM_MEM"),
}
_PREFIX_CHECKERS: tuple[tuple[str, Checker], ...] = (
    ("env:NCCL_", _check_nccl_env),
    ("env:", _check_unlogged_env),
)


def _checker_for(target: str) -> Checker:
    if target in _CHECKERS:
        return _CHECKERS[target]
    for prefix, checker in _PREFIX_CHECKERS:
        if target.startswith(prefix):
            return checker
    return _from_non_default_args
