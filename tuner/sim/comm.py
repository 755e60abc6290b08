"""Pure resolution of the TP communication setup: vLLM's all-reduce backend dispatch list
(custom all-reduce turning itself off, SymmMem/FlashInfer availability) and NCCL's reading of
NCCL_PROTO / NCCL_ALGO / NCCL_P2P_DISABLE, including the unsafe or impossible choices
(LL128 forced over PCIe corrupts data; NVLS without NVSwitch fails with ncclInvalidUsage).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tuner.sim.events import Failure, Notice
from tuner.sim.profile import Profile

NCCL_PROTOS = {"simple": "Simple", "ll": "LL", "ll128": "LL128"}
NCCL_ALGOS = {"ring": "Ring", "tree": "Tree", "collnetdirect": "CollnetDirect",
              "collnetchain": "CollnetChain", "nvls": "NVLS", "nvlstree": "NVLSTree", "pat": "PAT"}
AR_POTENTIAL = ("FLASHINFER_PCIE_IPC", "FLASHINFER", "NCCL_SYMM_MEM", "QUICK_REDUCE",
                "AITER_CUSTOM", "CUSTOM", "SYMM_MEM", "PYNCCL")


@dataclass(frozen=True)
class NcclInfo:
    debug: str | None
    proto_env: str | None
    algo_env: str | None
    protos: tuple[str, ...] | None
    algo: str
    p2p_disabled: bool
    max_channels: int | None


def _truthy(env: Mapping[str, str], name: str, default: str) -> bool:
    return env.get(name, default).strip().lower() in ("1", "true", "yes")


def _parse_nccl_list(raw: str, names: Mapping[str, str]) -> set[str]:
    """NCCL_PROTO / NCCL_ALGO syntax: comma list, or `^a,b` to exclude; unknown tokens ignored."""
    raw = raw.strip()
    exclude = raw.startswith("^")
    items = {names[t.strip().lower()] for t in raw.lstrip("^").split(",")
             if t.strip().lower() in names}
    return set(names.values()) - items if exclude else items


def resolve_nccl(env: Mapping[str, str], profile: Profile, uses_nccl: bool
                  ) -> tuple[NcclInfo, str | None, Failure | None]:

    nccl = profile.nccl
    hw = profile.hardware
    proto_env, algo_env = env.get("NCCL_PROTO"), env.get("NCCL_ALGO")
    corruption = failure = None
    protos: tuple[str, ...] | None = None
    if proto_env:
        enabled = _parse_nccl_list(proto_env, NCCL_PROTOS)
        positive = not proto_env.strip().startswith("^")
        if "LL128" in enabled and positive and hw.interconnect != "nvlink" and uses_nccl:
            # NCCL only enables LL128 where it is known to be safe; forcing it elsewhere can
            # silently corrupt reductions (NCCL docs). The model then emits garbage.
            corruption = "NCCL_PROTO forces LL128 on a PCIe topology (unsafe; corrupts data)"
        if "LL128" in enabled and not positive and hw.interconnect != "nvlink":
            enabled.discard("LL128")
        protos = tuple(p for p in ("Simple", "LL", "LL128") if p in enabled)
    algo = nccl.default_algo
    available = set(nccl.algos_available)
    if hw.interconnect == "nvlink" and hw.nvswitch_multicast and env.get("NCCL_NVLS_ENABLE") != "0":
        available |= {"NVLS", "NVLSTree"}
    if algo_env:
        spec = algo_env
        for part in algo_env.split(";"):
            coll, sep, algos = part.partition(":")
            if sep and coll.strip().lower() == "allreduce":
                spec = algos
                break
            if not sep:
                spec = part
        allowed = _parse_nccl_list(spec, NCCL_ALGOS)
        usable = [a for a in ("Ring", "Tree", "NVLS", "NVLSTree") if a in allowed & available]
        if uses_nccl and not usable:
            failure = Failure(
                "engine", "torch.distributed.DistBackendError",
                "NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, invalid "
                f"usage (run with NCCL_DEBUG=WARN for details), NCCL version {hw.nccl_version}\n"
                "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.",
                nccl_line=("enqueue.cc:1783 NCCL WARN Error : no algorithm/protocol available for "
                           f"function AllReduce with datatype ncclBfloat16. NCCL_ALGO was set to "
                           f"{algo_env}."), stage="comm")
        elif usable:
            algo = nccl.default_algo if nccl.default_algo in usable else usable[0]
    if uses_nccl and protos is not None and not protos and failure is None:
        failure = Failure("engine", "torch.distributed.DistBackendError",
                          "NCCL error: invalid usage, NCCL_PROTO enables no protocol\n"
                          "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.",
                          stage="comm")
    try:
        channels = int(env["NCCL_MAX_NCHANNELS"]) if "NCCL_MAX_NCHANNELS" in env else None
    except ValueError:
        channels = None
    info = NcclInfo(env.get("NCCL_DEBUG"), proto_env, algo_env, protos, algo,
                    env.get("NCCL_P2P_DISABLE", "0").strip() == "1", channels)
    return info, corruption, failure


def allreduce_backends(tp: int, disable_car: bool, env: Mapping[str, str], profile: Profile,
               notices: list[Notice]) -> tuple[str, ...]:

    hw = profile.hardware
    if tp == 1 or hw.platform != "cuda":
        return ()
    backends = []
    sm_ok = hw.compute_capability in ("9.0", "10.0")
    if _truthy(env, "VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC", "0") and hw.flashinfer_allreduce:
        backends.append("FLASHINFER_PCIE_IPC")
    if _truthy(env, "VLLM_ALLREDUCE_USE_FLASHINFER", "1") and hw.flashinfer_allreduce:
        fi_backend = env.get("VLLM_FLASHINFER_ALLREDUCE_BACKEND", "auto")
        if fi_backend == "mnnvl" or (fi_backend == "auto" and hw.nvswitch_multicast):
            backends.append("FLASHINFER")
        elif fi_backend in ("auto", "trtllm"):
            backends.append("FLASHINFER")
    if _truthy(env, "VLLM_USE_NCCL_SYMM_MEM", "0") and hw.nvswitch_multicast:
        backends.append("NCCL_SYMM_MEM")
    if not disable_car:
        src = "custom_all_reduce.py:214"
        silence = " To silence this warning, specify disable_custom_all_reduce=True explicitly."
        if tp not in (2, 4, 6, 8, 16):
            notices.append(Notice("comm", "WARNING", src, "Custom allreduce is disabled due to an "
                                  f"unsupported world size: {tp}. Supported world sizes: "
                                  f"[2, 4, 6, 8, 16].{silence}"))
        elif tp > 2 and hw.interconnect != "nvlink":
            notices.append(Notice("comm", "WARNING", "custom_all_reduce.py:270", "Custom allreduce"
                                  " is disabled because it's not supported on more than two "
                                  f"PCIe-only GPUs.{silence}"))
        else:
            backends.append("CUSTOM")
    if _truthy(env, "VLLM_ALLREDUCE_USE_SYMM_MEM", "1"):
        if sm_ok and tp in (2, 4, 6, 8):
            backends.append("SYMM_MEM")
        else:
            notices.append(Notice("comm", "WARNING", "symm_mem.py:66", "SymmMemCommunicator: Device "
                                  f"capability {hw.compute_capability} not supported, "
                                  "communicator is not available."))
    backends.append("PYNCCL")
    return tuple(backends)
