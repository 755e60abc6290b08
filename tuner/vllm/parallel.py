"""The ranks of a multi-rank server and the all-reduce its tensor-parallel group ran.

vLLM starts one worker process per rank. Each logs ``world_size=W rank=R local_rank=L ...
backend=B`` under its first tag ``(Worker pid=N)``; once its groups exist the mp executor
retags its lines ``(Worker_TP<t> pid=N)``, and rank 0 alone logs ``rank 0 in world size W is
assigned as DP rank d, PP rank p, PCP rank c, TP rank t, ...`` (seen on the real three-rank
CPU log, tests/fixtures/vllm_logs/cpu-0.32.0/tp3-eager.log). :func:`merge_ranks` joins them
by pid into one record per rank: rank, TP rank, world size, process tag, pid.

Which all-reduce the TP group ran (:func:`derive_allreduce`), in vLLM's own names:

* GPU: the TP group's ``Using [...] all-reduce backends (in dispatch order)`` line, e.g.
  ``FLASHINFER, CUSTOM, SYMM_MEM, PYNCCL`` (the first eligible one serves each call).
* CPU: vLLM's ``CpuCommunicator`` uses its shared-memory all-reduce (``CPU_SHM``) for the
  TP group unless it logs ``CPU SHM communicator disabled for group tp...``, falling back to
  torch.distributed over gloo (``GLOO``), as every rank did on this project's 2-core box.
  Without that line by the rank assignment (printed after the groups are built) it is CPU_SHM.
* tensor parallel size 1: no TP all-reduce at all (``[]``).

Pure (the regexes and the derivation; the line anatomy stays in effective_config).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["RANK_MARKER", "SHM_OFF_MARKER", "TP_TAG_MARKER", "world_rank", "assignment", "tp_tag",
           "merge_ranks", "shm_off_group", "derive_allreduce", "allreduce_text", "ranks_text",
           "parallel_lines"]

RANK_MARKER = " in world size "
SHM_OFF_MARKER = "CPU SHM communicator disabled"
TP_TAG_MARKER = "_TP"

_TAG_RE = re.compile(r"\(([\w.\-]+) pid=(\d+)\)")
_WORLD_RANK_RE = re.compile(r"\bworld_size=(\d+) rank=(\d+) ")
_ASSIGNED_RE = re.compile(r"\brank (\d+) in world size (\d+) is assigned as .*?\bTP rank (\d+)")
_TP_TAG_RE = re.compile(r"\((\w*_TP(\d+)) pid=(\d+)\)")
_SHM_OFF_RE = re.compile(r"CPU SHM communicator disabled for group ([^:\s]+)")


def world_rank(line: str) -> dict[str, Any] | None:
    """A rank's ``world_size=W rank=R ...`` line as {rank, world_size, process, pid}, or None."""

    if not (m := _WORLD_RANK_RE.search(line)):
        return None
    tag = _TAG_RE.match(line)
    return {"rank": int(m.group(2)), "tp_rank": None, "world_size": int(m.group(1)),
            "process": tag.group(1) if tag else None, "pid": int(tag.group(2)) if tag else None}


def assignment(line: str) -> tuple[int, int] | None:
    """(rank, TP rank) of a ``rank R in world size W is assigned as ...`` line, or None."""

    m = _ASSIGNED_RE.search(line)
    return (int(m.group(1)), int(m.group(3))) if m else None


def tp_tag(line: str) -> tuple[int, int, str] | None:
    """(pid, TP rank, tag) of a line tagged ``(Worker_TP<t> pid=N)``, or None."""

    m = _TP_TAG_RE.match(line)
    return (int(m.group(3)), int(m.group(2)), m.group(1)) if m else None


def merge_ranks(ranks: dict[int, dict[str, Any]], assigned: dict[int, int],
                tags: dict[int, tuple[int, str]]) -> list[dict[str, Any]]:
    """One record per rank, by rank: its TP rank from its assignment line, else from the
    ``_TP<t>`` tag its pid later logged under (which also names the process)."""

    out = []
    for rank in sorted(ranks):
        record = dict(ranks[rank])
        tagged = tags.get(record["pid"]) if record["pid"] is not None else None
        record["tp_rank"] = assigned.get(rank, tagged[0] if tagged else None)
        if tagged:
            record["process"] = tagged[1]
        out.append(record)
    return out


def shm_off_group(line: str) -> str | None:
    """The group a ``CPU SHM communicator disabled`` line names, else None."""

    m = _SHM_OFF_RE.search(line)
    return m.group(1) if m else None


def derive_allreduce(f: dict[str, Any], ev: dict[str, str]) -> None:
    """Set ``f["allreduce"]`` (the TP group's all-reduce backends in dispatch order; [] for
    none) and its evidence, when the log tells; leave both unset when it does not."""

    if f.get("allreduce") is not None:      # the CPU fallback line: its own evidence
        return
    # The evidence is one line's excerpt, as for every field: the line that settles it.
    tp = f.get("tensor_parallel_size")
    if tp == 1:
        f["allreduce"] = []
        ev["allreduce"] = ev["tensor_parallel_size"]
    elif f.get("allreduce_backends") is not None:
        f["allreduce"] = list(f["allreduce_backends"])
        ev["allreduce"] = ev["allreduce_backends"]
    elif _cpu(f) and "tp_assignment" in ev and (f.get("world_size") or 0) > 1:
        # No fallback line by the rank assignment (module doc): its line is the evidence.
        f["allreduce"] = ["CPU_SHM"]
        ev["allreduce"] = ev["tp_assignment"]


def _cpu(f: dict[str, Any]) -> bool:
    return f.get("platform") == "cpu" or f.get("distributed_backend") == "gloo" \
        or f.get("kv_cache_device") == "CPU"


def allreduce_text(backends: list[str] | None) -> str:
    """``CPU_SHM``, ``FLASHINFER > CUSTOM > PYNCCL`` (dispatch order), ``none`` or ``unknown``."""

    if backends is None:
        return "unknown"
    return " > ".join(backends) if backends else "none (tensor_parallel_size=1)"


def ranks_text(ranks: list[dict[str, Any]] | None, world_size: int | None) -> str:
    """``world size 3: TP rank 0 (Worker_TP0 pid 101), ...`` for status and notes."""

    if not ranks:
        return f"world size {world_size}: no rank lines" if world_size else "no rank lines"
    shown = ", ".join(f"TP rank {'?' if r['tp_rank'] is None else r['tp_rank']}"
                      + (f" ({r['process']} pid {r['pid']})" if r.get("process") else "") for r in ranks)
    return f"world size {world_size or ranks[0]['world_size']}: {shown}"


def parallel_lines(parallel: dict[str, Any] | None, checks: list[dict[str, Any]]) -> list[str]:
    """A trial's ranks, its all-reduce and its not-applicable knobs, as ``tuner status``
    lists them under the trial (no line for a single-rank trial without such knobs)."""

    lines = []
    if parallel and (parallel.get("world_size") or 0) > 1:
        lines.append(f"ranks: {ranks_text(parallel.get('ranks'), parallel.get('world_size'))}; "
                     f"all-reduce: {allreduce_text(parallel.get('allreduce'))}")
    for check in checks:
        if check.get("status") == "not_applicable":
            why = str(check.get("note") or "").removeprefix("not applicable here: ")
            lines.append(f"not applicable here: {check.get('target')}={check.get('asked')!r}: {why}")
            if check.get("evidence"):
                lines.append(f"  evidence: {str(check['evidence'])[:200]}")
    return lines
