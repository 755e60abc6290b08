"""Lossy settings of the simulated server and the answers they cost (pure).

An fp8 KV cache (``--kv-cache-dtype fp8``) or fp8 weights (``--quantization fp8``) change a
real model's output by design: a few known-answer items that the bf16 model answers right
come out wrong. The simulator reproduces that with a *true accuracy drop* per configuration
and a deterministic rule for which items flip: a hash of the prompt text below the drop.
The hash depends on the prompt alone, so the same items flip in every trial of one
configuration, at every concurrency, in every rerun, and the reference (lossless) and a
trial can be paired item by item; because the rule is ``hash < drop``, a smaller drop flips
a subset of a larger drop's items.

The drop: the profile's ``lossy_accuracy_drop`` (one number per knob, summed when both are
on), else :data:`DEFAULT_DROPS`; ``TUNER_SIM_LOSSY_DROP`` (one number) overrides it for any
lossy configuration. docs/simulator.md, "Lossy settings".
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from tuner.sim.events import Failure
from tuner.sim.profile import Profile

__all__ = ["DEFAULT_DROPS", "DROP_ENV", "KNOBS", "Lossy", "answers_wrong", "lossy_settings", "resolve_lossy",
           "true_drop"]

KNOBS = ("kv_cache_dtype", "quantization")
# A profile without lossy_accuracy_drop: about what an fp8 KV cache and fp8 weights cost an
# 8B model on easy known-answer items (a point or two), weights costing more than the cache.
DEFAULT_DROPS: Mapping[str, float] = {"kv_cache_dtype": 0.01, "quantization": 0.02}
DROP_ENV = "TUNER_SIM_LOSSY_DROP"
_SIXTEEN_BITS = ("float16", "bfloat16")


def lossy_settings(kv_cache_dtype: str, quantization: str | None, dtype: str) -> tuple[str, ...]:
    """The lossy knobs among the server's settings, in :data:`KNOBS` order.

    ``dtype`` is the dtype the model runs in (float32, bfloat16, ...): a 16-bit KV cache
    loses bits only under a float32 model; an fp8 one always does. Any ``--quantization``
    quantizes the weights the reference runs unquantized."""
    kv = kv_cache_dtype.lower()
    out = []
    if kv.startswith("fp8") or (kv in _SIXTEEN_BITS and dtype == "float32"):
        out.append("kv_cache_dtype")
    if quantization not in (None, "", "None", "none"):
        out.append("quantization")
    return tuple(out)


def _env_drop(env: Mapping[str, str]) -> float | None:
    raw = env.get(DROP_ENV)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{DROP_ENV}={raw!r}: not a number (an accuracy drop, 0 <= drop <= 1)") from None
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{DROP_ENV}={raw!r}: out of range (an accuracy drop, 0 <= drop <= 1)")
    return value


def true_drop(settings: tuple[str, ...], profile_drops: Mapping[str, float] | None,
              env: Mapping[str, str]) -> float:
    """The configuration's true accuracy drop: 0 for a lossless one; else the env override,
    or the per-knob drops (the profile's, else the defaults) summed, capped at 1."""
    if not settings:
        return 0.0
    override = _env_drop(env)
    if override is not None:
        return override
    table = DEFAULT_DROPS if profile_drops is None else profile_drops
    return min(1.0, sum(table.get(knob, DEFAULT_DROPS[knob]) for knob in settings))


def prompt_unit(prompt_text: str) -> float:
    """A uniform number in [0, 1) from the prompt text alone (64 bits of blake2b)."""
    digest = hashlib.blake2b(prompt_text.encode("utf-8"), digest_size=8, person=b"sim-lossy").digest()
    return int.from_bytes(digest, "big") / 2**64


def answers_wrong(prompt_text: str, drop: float) -> bool:
    """Whether a configuration with true drop ``drop`` answers this prompt wrong."""
    return drop > 0 and prompt_unit(prompt_text) < drop


@dataclass(frozen=True)
class Lossy:
    """What ``--quantization`` and the KV-cache dtype make of one server start."""

    quantization: str | None          # as the engine-config line prints it (the model's own if unset)
    knobs: tuple[str, ...]            # lossy knobs in effect (lossy_settings)
    drop: float                       # their true accuracy drop (true_drop)
    weights_factor: float             # share of the weight bytes left (fp8 weights: less)
    failure: Failure | None = None    # an engine failure they cause (printed at its stage)
    refused: Failure | None = None    # vLLM refuses them while building its config


def _api(message: str) -> Failure:
    return Failure("api", "ValueError", message)


def resolve_lossy(quantization: str | None, kv_cache_dtype: str, dtype: str, profile: Profile,
                  env: Mapping[str, str]) -> Lossy:
    """The lossy side of a configuration, with vLLM's refusals: fp8 weights under a float32
    model or below SM 7.5 (config/vllm.py), an fp8 KV cache on a CPU without AVX-512 or AMX
    (vLLM 0.32, v1/attention/backends/cpu_attn.py ``_get_attn_isa``: raised when the
    attention metadata builder starts, after the KV cache is sized)."""
    own = profile.model.quantization
    if quantization in (None, "", own):
        quantization, factor, lossy_quant = own, 1.0, None   # the model's own format: the reference's too
    elif quantization != "fp8":
        return Lossy(quantization, (), 0.0, 1.0, refused=_api(
            f"--quantization {quantization}: the simulator models fp8 only (the profile's model is "
            f"{own or 'unquantized'})"))
    else:
        hw = profile.hardware
        capability = int(float(hw.compute_capability) * 10)
        if hw.platform == "cuda" and capability < 75:
            return Lossy(quantization, (), 0.0, 1.0, refused=_api(
                "The quantization method fp8 is not supported for the current GPU. Minimum "
                f"capability: 75. Current capability: {capability}."))
        if dtype not in _SIXTEEN_BITS:
            return Lossy(quantization, (), 0.0, 1.0, refused=_api(
                f"torch.{dtype} is not supported for quantization method fp8. Supported dtypes: "
                "[torch.bfloat16, torch.float16]"))
        factor, lossy_quant = profile.perf.fp8_weights_factor, quantization
    failure = None
    hw = profile.hardware
    if kv_cache_dtype.startswith("fp8") and hw.platform == "cpu" and not hw.cpu_avx512:
        failure = Failure("engine", "NotImplementedError", "FP8 KV cache on CPU requires x86 with AVX-512 or "
                          "AMX.", ('  File "site-packages/vllm/v1/attention/backends/cpu_attn.py", line 541, '
                                   "in _get_attn_isa\n    raise NotImplementedError(",), stage="kv_backend")
    knobs = lossy_settings(kv_cache_dtype, lossy_quant, dtype)
    table = profile.lossy_accuracy_drop
    drops = None if table is None else {str(knob): drop for knob, drop in table.items()}
    return Lossy(quantization, knobs, true_drop(knobs, drops, env), factor, failure)
