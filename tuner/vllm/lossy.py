"""Which knob values change the model's output by design (lossy), and why.

An fp8 KV cache (``--kv-cache-dtype fp8``) or fp8 weights (``--quantization fp8``) are big
speed-ups (1.23x / 1.58x on an 8B model on an H100) and also round every key, value or
weight to fewer bits: the answers change, a little, on purpose. Such a value is no bug for
the probe to reject; the study searches it only under an accuracy budget it states
(``quality:``, ``tuner.study.quality``), and its baseline - the quality reference - may not
use one. A parameter's ``lossy: true`` / ``false`` in the study file overrides this table
(e.g. ``quantization`` naming the format a checkpoint is already stored in loses nothing).

* ``kv_cache_dtype`` other than ``auto`` (the model's own dtype): keys and values stored in
  fewer bits (fp8 and its variants; any other named dtype counted lossy too: it can only be
  the same precision or lower, and "the same" is the model's to say, not the flag's);
* ``quantization`` other than None (the checkpoint as stored): the weights quantized.

A value of None (unset: the server's default, lossless) is never lossy. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

__all__ = ["LOSSY_TARGETS", "lossy_reason"]

# The knobs with lossy values -> what they change.
LOSSY_TARGETS: Final[Mapping[str, str]] = {
    "kv_cache_dtype": "the KV cache's precision",
    "quantization": "the weights' precision",
}


def lossy_reason(target: str, value: Any) -> str | None:
    """Why setting ``target`` (a knob target as in a study file: ``kv_cache_dtype``,
    ``env:NAME``) to ``value`` changes the model's output by design, or None when it does not."""

    if value is None or target not in LOSSY_TARGETS:
        return None
    text = str(value).strip()
    if target == "kv_cache_dtype":
        if text.lower() == "auto":
            return None
        if text.lower().startswith("fp8"):
            return "an fp8 KV cache stores keys and values in 8 bits"
        return f"a {text} KV cache stores keys and values in {text}, not in the model's own dtype"
    if text.lower().startswith("fp8"):
        return f"quantization {text} quantizes the weights to 8 bits"
    return f"quantization {text} quantizes the weights"
