"""How far a trial's answers moved from the reference's, as one line (pure).

A probe that passes says only "not corrupt". A user choosing between two passing
configurations also wants to know how much each changes the answers: a compiled GPU mode
that leaves 20 of 32 answers identical at batch 32, or a bfloat16 trial against a float32
reference that rewrites half the chat answers at near ties (docs/probe.md). Both pass by
the numerics rule, and both should be visible where the choice is made: ``tuner status``,
the report and the export's metadata.

This works on the plain dict of ``probe.json``'s ``reference`` member (what
:class:`tuner.probe.reference_score.ReferenceResult` dumps), so ``tuner status`` can read
it back from old trial folders without importing the models.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["agreement_line"]


def _top_level(levels: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The largest batch size asked in full (the one a trial's load reaches); a single-stream
    subset level only when nothing else was asked."""

    full = [lvl for lvl in levels if not lvl.get("subset")] or list(levels)
    return max(full, key=lambda lvl: int(lvl["concurrency"]))


def agreement_line(reference: Mapping[str, Any] | None) -> str | None:
    """``answers identical to the reference's: 53/88 over 7 batch sizes (20/32 at batch
    32); 35 diverged at a near tie (largest 0.25 nats), 0 corrupt positions; teacher-forced
    top-1 98%`` - or None when the trial was not compared with a reference.

    Near ties are counted from ``close`` (every version of probe.json has it); corrupt
    positions from ``corrupt``, or ``far`` answers in records written before it existed.
    """

    if not reference:
        return None
    levels = [lvl for lvl in reference.get("levels") or [] if int(lvl.get("prompts", 0)) > 0]
    if not levels:
        return None
    top = _top_level(levels)
    exact = sum(int(lvl["exact"]) for lvl in levels)
    asked = sum(int(lvl["prompts"]) for lvl in levels)
    near = sum(int(lvl.get("close", 0)) for lvl in levels)
    corrupt = sum(int(lvl.get("corrupt", lvl.get("far", 0))) for lvl in levels)
    gaps = [float(s["gap"]) for s in reference.get("scores") or []
            if s.get("verdict") == "close" and s.get("gap") is not None]
    sizes = "batch size" if len(levels) == 1 else f"{len(levels)} batch sizes"
    line = f"answers identical to the reference's: {exact}/{asked} over {sizes}"
    if len(levels) > 1:
        line += f" ({top['exact']}/{top['prompts']} at batch {top['concurrency']})"
    line += f"; {near} diverged at a near tie"
    if gaps:
        line += f" (largest {max(gaps):.2f} nats)"
    line += f", {corrupt} corrupt position{'' if corrupt == 1 else 's'}"
    forced = [float(lvl["forced_top1"]) for lvl in levels if lvl.get("forced_top1") is not None]
    if forced:
        line += f"; teacher-forced top-1 {min(forced):.0%}"
    return line
