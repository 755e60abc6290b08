"""What the tuner knows about vLLM 0.32/0.33 knobs, used to reject bad values early.

A study names its knobs by *target*: a top-level engine argument in snake_case
(``enforce_eager``), a dotted field of a JSON config argument
(``compilation_config.cudagraph_mode``) or an environment variable (``env:NCCL_PROTO``).
Only targets listed here are checked; any other target is passed through untouched,
because vLLM has hundreds of flags and the study may name any of them.

Sources: ../shared/reference/vllm-knobs.md sections 1-4 and 7.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CUDAGRAPH_MODES",
    "COMPILATION_MODES",
    "SPECULATIVE_METHODS",
    "NESTED_CONFIG_ARGS",
    "KnobRule",
    "check_value",
    "rule_for",
    "MULTICAST_ALGOS",
]

CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
COMPILATION_MODES = ("NONE", "STOCK_TORCH_COMPILE", "DYNAMO_TRACE_ONCE", "VLLM_COMPILE")
SPECULATIVE_METHODS = (
    "ngram", "ngram_gpu", "suffix", "draft_model", "eagle", "eagle3", "mtp",
    "dflash", "dspark", "medusa", "mlp_speculator", "extract_hidden_states", "custom_class",
)
NCCL_PROTOS = ("LL", "LL128", "Simple")
NCCL_ALGOS = ("Ring", "Tree", "CollnetDirect", "CollnetChain", "NVLS", "NVLSTree", "PAT")
# NVLink SHARP / multicast must stay off on shared hosts (vllm-knobs.md section 2):
# the study has to opt in explicitly before these can be searched.
MULTICAST_ALGOS = ("NVLS", "NVLSTree")
DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
P2P_LEVELS = ("LOC", "NVL", "PIX", "PXB", "PHB", "SYS")

# Engine arguments that take a JSON object; dotted targets under them are merged
# into one JSON value on the command line.
NESTED_CONFIG_ARGS = (
    "compilation_config",
    "speculative_config",
    "kernel_config",
    "kv_transfer_config",
    "structured_outputs_config",
    "observability_config",
    "pass_config",
)


@dataclass(frozen=True)
class KnobRule:
    """How one target's values are checked. ``check`` returns an error text or None."""

    description: str
    check: Callable[[Any], str | None]


def _enum(allowed: tuple[str, ...], *, ints: dict[int, str] | None = None,
          case_sensitive: bool = False) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if value is None:
            return None
        if ints and isinstance(value, int) and not isinstance(value, bool):
            return None if value in ints else (
                f"{value!r} is not allowed; allowed: {', '.join(allowed)} "
                f"or {', '.join(map(str, ints))}"
            )
        if isinstance(value, str):
            ok = value in allowed if case_sensitive else value.upper() in {a.upper() for a in allowed}
            if ok:
                return None
        return f"{value!r} is not allowed; allowed: {', '.join(allowed)}"

    return check


def _bool(value: Any) -> str | None:
    if value is None or isinstance(value, bool):
        return None
    return f"{value!r} is not a boolean; allowed: true, false"


def _env_flag(value: Any) -> str | None:
    if value is None or str(value).strip().lower() in {"0", "1", "true", "false"}:
        return None
    return f"{value!r} is not allowed; allowed: 0, 1"


def _int_range(low: int, high: int | None = None) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            return f"{value!r} is not an integer"
        if value < low or (high is not None and value > high):
            upper = f"..{high}" if high is not None else " or more"
            return f"{value!r} is out of range; allowed: {low}{upper}"
        return None

    return check


def _int_choice(allowed: tuple[int, ...]) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if value is None:
            return None
        try:
            as_int = int(value)
        except (TypeError, ValueError):
            as_int = None
        if as_int in allowed and str(value).strip() == str(as_int):
            return None
        return f"{value!r} is not allowed; allowed: {', '.join(map(str, allowed))}"

    return check


def _nccl_list(allowed: tuple[str, ...], *, per_collective: bool) -> Callable[[Any], str | None]:
    """NCCL list syntax: ``A,B``, ``^A`` (exclude); NCCL_ALGO also ``a,b;allreduce:tree``."""

    lowered = {a.lower() for a in allowed}

    def check(value: Any) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip():
            return f"{value!r} is not allowed; give a comma list of {', '.join(allowed)} (optionally ^-prefixed)"
        sections = value.split(";") if per_collective else [value]
        for section in sections:
            names = section.split(":", 1)[1] if per_collective and ":" in section else section
            names = names[1:] if names.startswith("^") else names
            for name in names.split(","):
                if name.strip().lower() not in lowered:
                    return (
                        f"{value!r} is not allowed: {name.strip()!r} is not one of "
                        f"{', '.join(allowed)} (comma list, optionally ^-prefixed to exclude)"
                    )
        return None

    return check


_RULES: dict[str, KnobRule] = {
    "compilation_config.cudagraph_mode": KnobRule(
        "CUDA-graph mode", _enum(CUDAGRAPH_MODES, ints={0: "NONE", 1: "PIECEWISE", 2: "FULL"})
    ),
    "compilation_config.mode": KnobRule(
        "compilation mode", _enum(COMPILATION_MODES, ints={0: "NONE", 1: "STOCK_TORCH_COMPILE",
                                                          2: "DYNAMO_TRACE_ONCE", 3: "VLLM_COMPILE"})
    ),
    "compilation_config.max_cudagraph_capture_size": KnobRule("max capture size", _int_range(1)),
    "max_cudagraph_capture_size": KnobRule("max capture size", _int_range(1)),
    "optimization_level": KnobRule("optimization level", _int_range(0, 3)),
    "speculative_config.method": KnobRule(
        "speculative method", _enum(SPECULATIVE_METHODS, case_sensitive=True)
    ),
    "speculative_config.num_speculative_tokens": KnobRule("speculative k", _int_range(1, 64)),
    "speculative_config.prompt_lookup_min": KnobRule("n-gram lookup min", _int_range(1)),
    "speculative_config.prompt_lookup_max": KnobRule("n-gram lookup max", _int_range(1)),
    "enforce_eager": KnobRule("eager mode", _bool),
    "disable_custom_all_reduce": KnobRule("custom all-reduce off", _bool),
    "enable_prefix_caching": KnobRule("prefix caching", _bool),
    "enable_chunked_prefill": KnobRule("chunked prefill", _bool),
    "dtype": KnobRule("dtype", _enum(DTYPES, case_sensitive=True)),
    "tensor_parallel_size": KnobRule("tensor parallel size", _int_range(1)),
    "pipeline_parallel_size": KnobRule("pipeline parallel size", _int_range(1)),
    "max_num_seqs": KnobRule("max sequences per batch", _int_range(1)),
    "max_num_batched_tokens": KnobRule("max batched tokens", _int_range(1)),
    "env:NCCL_PROTO": KnobRule("NCCL protocol", _nccl_list(NCCL_PROTOS, per_collective=False)),
    "env:NCCL_ALGO": KnobRule("NCCL algorithm", _nccl_list(NCCL_ALGOS, per_collective=True)),
    "env:NCCL_P2P_LEVEL": KnobRule("NCCL P2P level", _enum(P2P_LEVELS, case_sensitive=True)),
    "env:NCCL_P2P_DISABLE": KnobRule("NCCL P2P off", _env_flag),
    "env:NCCL_NTHREADS": KnobRule("NCCL threads", _int_choice((64, 128, 256, 512))),
    "env:VLLM_ALLREDUCE_USE_FLASHINFER": KnobRule("FlashInfer all-reduce", _env_flag),
    "env:VLLM_ALLREDUCE_USE_SYMM_MEM": KnobRule("symmetric-memory all-reduce", _env_flag),
    "env:VLLM_USE_NCCL_SYMM_MEM": KnobRule("NCCL symmetric memory", _env_flag),
    "env:VLLM_CUSTOM_ALLREDUCE_ALGO": KnobRule("custom all-reduce algorithm", _enum(("1stage", "2stage"), case_sensitive=True)),
    "env:VLLM_FLASHINFER_ALLREDUCE_BACKEND": KnobRule("FlashInfer all-reduce backend", _enum(("auto", "trtllm", "mnnvl"), case_sensitive=True)),
}

_IDENT = re.compile(r"^[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)*$")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def rule_for(target: str) -> KnobRule | None:
    return _RULES.get(target)


def check_value(target: str, value: Any) -> str | None:
    """Error text if ``value`` is invalid for ``target``; None when valid or unknown."""

    rule = _RULES.get(target)
    return rule.check(value) if rule else None


def check_target_name(target: str) -> str | None:
    """Error text if ``target`` is not a well-formed flag path or ``env:NAME``."""

    if target.startswith("env:"):
        return None if _ENV.match(target[4:]) else f"{target[4:]!r} is not a valid environment variable name"
    if not _IDENT.match(target):
        return (
            f"{target!r} is not a vLLM argument name; use snake_case "
            "(e.g. enforce_eager) or a dotted config field (e.g. compilation_config.cudagraph_mode)"
        )
    return None
