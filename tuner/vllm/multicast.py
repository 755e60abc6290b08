"""Which settings turn NVLink multicast (NVLS / NVLink SHARP, multimem) on.

On a shared multi-GPU host a program that uses NVLink multicast can put the host's GPUs,
which others use too, out of service for a long time (shared/reference/gpu-box.md: keep
``NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1`` in every
server's environment). A study may therefore neither search nor fix any of the settings
below at a value that enables it unless ``safety.allow_multicast`` is true
(``tuner.study.spec`` refuses the study file; reference/vllm-knobs.md sections 2-3):

* ``NCCL_NVLS_ENABLE`` other than 0 (NCCL's own default enables NVLS where NVSwitch has it);
* ``NCCL_ALGO`` naming ``NVLS`` or ``NVLSTree`` (``^NVLS``, an exclusion, is fine);
* ``TORCH_SYMM_MEM_DISABLE_MULTICAST=0`` and ``NVSHMEM_DISABLE_NVLS=0`` (the switches that
  keep PyTorch's symmetric memory and NVSHMEM off multicast, turned back on);
* ``VLLM_FLASHINFER_ALLREDUCE_BACKEND=mnnvl`` (FlashInfer's all-reduce on an NVSwitch
  multicast workspace) and ``VLLM_USE_NCCL_SYMM_MEM=1`` (NCCL symmetric-memory
  collectives, which use NVLS where it exists).

A value of None (unset: the variable is inherited from the tuner's environment) is never
refused here. Pure: no environment is read.
"""

from __future__ import annotations

from typing import Any

from tuner.vllm.knobs import MULTICAST_ALGOS

__all__ = ["MULTICAST_TARGETS", "multicast_use"]

# The variables that can turn multicast on -> what they turn on.
MULTICAST_TARGETS: dict[str, str] = {
    "env:NCCL_NVLS_ENABLE": "NCCL's NVLink SHARP (NVLS) collectives",
    "env:NCCL_ALGO": "NCCL's NVLS/NVLSTree algorithms",
    "env:TORCH_SYMM_MEM_DISABLE_MULTICAST": "PyTorch symmetric-memory multicast",
    "env:NVSHMEM_DISABLE_NVLS": "NVSHMEM's NVLS",
    "env:VLLM_FLASHINFER_ALLREDUCE_BACKEND": "FlashInfer's mnnvl all-reduce (multicast workspace)",
    "env:VLLM_USE_NCCL_SYMM_MEM": "NCCL symmetric-memory collectives (NVLS)",
}


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value).strip()


def _truthy(text: str) -> bool:
    return text.lower() not in ("0", "false", "no", "off", "")


def multicast_use(target: str, value: Any) -> str | None:
    """Why setting ``target`` (a knob target, ``env:NAME`` for a variable) to ``value``
    turns NVLink multicast on, or None when it does not."""

    if value is None or target not in MULTICAST_TARGETS:
        return None
    text = _text(value)
    name = target[4:]
    what = MULTICAST_TARGETS[target]
    if target == "env:NCCL_ALGO":
        # "ring,tree;allreduce:nvls": sections per collective, each a list of algorithms that
        # a leading ^ turns into a list of exclusions.
        for section in text.split(";"):
            algos = section.split(":")[-1].strip()
            if algos.startswith("^"):
                continue
            if any(a.strip().lower() in (m.lower() for m in MULTICAST_ALGOS) for a in algos.split(",")):
                return f"{name}={text} selects {what}"
        return None
    if target == "env:NCCL_NVLS_ENABLE":
        return f"{name}={text} enables {what}" if _truthy(text) else None
    if target in ("env:TORCH_SYMM_MEM_DISABLE_MULTICAST", "env:NVSHMEM_DISABLE_NVLS"):
        return None if _truthy(text) else f"{name}={text} re-enables {what}"
    if target == "env:VLLM_FLASHINFER_ALLREDUCE_BACKEND":
        return f"{name}={text} selects {what}" if text.lower() == "mnnvl" else None
    return f"{name}={text} enables {what}" if _truthy(text) else None
