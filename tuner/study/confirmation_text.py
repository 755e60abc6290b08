"""Confirmation verdicts as text and summaries, from their plain JSON form.

Kept apart from ``study.confirmation`` (pydantic models) so that ``tuner status``, which
answers without importing pydantic or Optuna, can show them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["blocks_export", "summary_text", "confirmation_brief", "pct", "verdict_of"]


# Verdicts stored before issue 15 renamed them ("a better result confirms" is gone).
_LEGACY = {"confirmed": "reproduced", "not_confirmed": "not_reproducible"}


def verdict_of(data: dict[str, Any]) -> str:
    """The verdict word, legacy names mapped to today's."""

    v = str(data.get("verdict"))
    return _LEGACY.get(v, v)


def blocks_export(confirmation: Any) -> str | None:
    """Why a point must not be exported without --force, or None."""

    if confirmation is None:
        return None
    data = confirmation.model_dump() if hasattr(confirmation, "model_dump") else confirmation
    verdict = verdict_of(data)
    if verdict == "not_reproducible":
        return f"its confirmation re-run did not reproduce it: {data.get('reason')}"
    if verdict == "failed":
        return f"its confirmation re-run failed: {data.get('reason')}"
    return None


def confirmation_brief(data: dict[str, Any]) -> dict[str, Any]:
    """What pareto.json says about a point's confirmation (the full record is in confirm/)."""

    return {
        "verdict": verdict_of(data),
        "reason": data.get("reason"),
        "reruns": len(data.get("runs") or []),
        "median": {c["label"]: c.get("median") for c in data.get("objectives") or []},
        "change": {c["label"]: c.get("change") for c in data.get("objectives") or []},
    }


def summary_text(confirmation: Any) -> str:
    """One line, e.g. ``reproduced (1 re-run): output_tok_s@c4 40.1 -> 39.6 (-1.2%), ...``."""

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
    verdict = verdict_of(data)
    head = f"{verdict.replace('_', ' ')} ({n} re-run{'s' if n != 1 else ''})"
    if verdict == "failed":
        return f"{head}: {data.get('reason')}"
    return head + (": " + ", ".join(parts) if parts else "")


def pct(change: float | None) -> str:
    return "n/a" if change is None else f"{100 * change:+.1f}%"
