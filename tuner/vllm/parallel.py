"""The ranks of a multi-rank server and the all-reduce its tensor-parallel group ran.

vLLM starts one worker process per rank. Each logs ``world_size=W rank=R ... backend=B``
and, once its groups (and their communicators) exist, ``rank R in world size W is
assigned as DP rank d, PP rank p, PCP rank c, TP rank t, ...``; under the mp executor its
lines carry the tag ``(Worker_TP<t> pid=N)``. Those lines are all the log says about the
ranks, so :func:`rank_line` keeps each one whole (rank, TP rank, world size, process tag,
pid) for the trial's record.

Which all-reduce the TP group ran (:func:`derive_allreduce`), in vLLM's own names:

* GPU: the TP group's ``Using [...] all-reduce backends (in dispatch order)`` line, e.g.
  ``FLASHINFER, CUSTOM, SYMM_MEM, PYNCCL`` (the first eligible one serves each call).
* CPU: vLLM's ``CpuCommunicator`` uses its shared-memory all-reduce (``CPU_SHM``) for the
  TP group and logs a line only when it falls back to torch.distributed over gloo
  (``CPU SHM communicator disabled for group tp...``: then ``GLOO``). So on CPU a
  multi-rank log that reached the rank assignment without that line ran ``CPU_SHM``.
* tensor parallel size 1: no TP all-reduce at all (``[]``).

Pure (the regexes and the derivation; the line anatomy stays in effective_config).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["RANK_MARKER", "SHM_OFF_MARKER", "rank_line", "shm_off_group", "derive_allreduce",
           "allreduce_text", "ranks_text", "parallel_lines"]

RANK_MARKER = " in world size "
SHM_OFF_MARKER = "CPU SHM communicator disabled"

_TAG_RE = re.compile(r"\(([\w.\-]+) pid=(\d+)\)")
_RANK_RE = re.compile(r"\brank (\d+) in world size (\d+) is assigned as .*?\bTP rank (\d+)")
_SHM_OFF_RE = re.compile(r"CPU SHM communicator disabled for group ([^:\s]+)")


def rank_line(line: str) -> dict[str, Any] | None:
    """One rank's assignment line as {rank, tp_rank, world_size, process, pid}, or None.
    ``process``/``pid``: the line's process tag (None when the line has none)."""

    if not (m := _RANK_RE.search(line)):
        return None
    tag = _TAG_RE.match(line)
    return {"rank": int(m.group(1)), "tp_rank": int(m.group(3)), "world_size": int(m.group(2)),
            "process": tag.group(1) if tag else None, "pid": int(tag.group(2)) if tag else None}


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
    elif _cpu(f) and f.get("ranks") and (f.get("world_size") or 0) > 1:
        # No fallback line before the ranks' assignment (module doc): the last rank's line.
        f["allreduce"] = ["CPU_SHM"]
        ev["allreduce"] = ev["ranks_last"]


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
    shown = ", ".join(f"TP rank {r['tp_rank']}" + (f" ({r['process']} pid {r['pid']})" if r.get("process") else "")
                      for r in ranks)
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
