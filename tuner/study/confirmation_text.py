"""Confirmation verdicts as text and summaries, from their plain JSON form.

Kept apart from ``study.confirmation`` (pydantic models) so that ``tuner status``, which
answers without importing pydantic or Optuna, can show them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["blocks_export", "summary_text", "confirmation_brief", "pct"]


def blocks_export(confirmation: Any) -> str | None:
    """Why a point must not be exported without --force, or None."""

    if confirmation is None:
        return None
    data = confirmation.model_dump() if hasattr(confirmation, "model_dump") else confirmation
    if data.get("verdict") in ("not_confirmed", "failed"):
        return f"its confirmation re-run {data['verdict'].replace('_', ' ')}: {data.get('reason')}"
    return None


def confirmation_brief(data: dict[str, Any]) -> dict[str, Any]:
    """What pareto.json says about a point's confirmation (the full record is in confirm/)."""

    return {
        "verdict": data.get("verdict"),
        "reason": data.get("reason"),
        "reruns": len(data.get("runs") or []),
        "median": {c["label"]: c.get("median") for c in data.get("objectives") or []},
        "change": {c["label"]: c.get("change") for c in data.get("objectives") or []},
    }


def summary_text(confirmation: Any) -> str:
    """One line, e.g. ``confirmed (1 re-run): output_tok_s@c4 40.1 -> 39.6 (-1.2%), ...``."""

    data = confirmation.model_dump() if hasattr(confirmation, "model_dump") else confirmation
    n = len(data.get("runs") or [])
    parts = []
    for c in data.get("objectives") or []:
        if c.get("median") is None:
            continue
        text = f"{c['label']} {c['trial']:.4g} -> {c['median']:.4g} ({pct(c.get('change'))})"
        if c.get("spread") is not None:
            text += f" spread {c['spread']:.0%}"
        parts.append(text)
    head = f"{data['verdict'].replace('_', ' ')} ({n} re-run{'s' if n != 1 else ''})"
    if data["verdict"] == "failed":
        return f"{head}: {data.get('reason')}"
    return head + (": " + ", ".join(parts) if parts else "")


def pct(change: float | None) -> str:
    return "n/a" if change is None else f"{100 * change:+.1f}%"
