"""One line for a lossy trial's quality verdict (pure, standard library only: `tuner status`
reads a study without importing pydantic). Its input is the stored
``probe.quality_stats.QualityRecord`` as JSON (the trial's ``outcome.quality``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["quality_line"]


def _num(raw: Mapping[str, Any], key: str) -> float | None:
    value = raw.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _pts(value: float | None) -> str:
    return "?" if value is None else f"{100 * value:.1f}"


def quality_line(raw: Mapping[str, Any]) -> str:
    """``quality PASS: drop 1.2 pts [-0.8, 3.1] (95%), budget 5.0 pts, 200 items (1 look); ...``:
    the verdict, the accuracy drop in accuracy points with its interval (the upper bound is
    what the budget is held to), how many items and looks it took, both accuracies and the
    lossy values judged (like QualityRecord.summary, from the stored JSON)."""

    verdict = str(raw.get("verdict") or "?")
    confidence = _num(raw, "confidence")
    level = "" if confidence is None else f" ({100 * confidence:g}%)"
    items, looks = raw.get("items"), raw.get("looks")
    parts = [f"quality {verdict.upper()}: drop {_pts(_num(raw, 'drop'))} pts "
             f"[{_pts(_num(raw, 'drop_low'))}, {_pts(_num(raw, 'drop_high'))}]{level}, "
             f"budget {_pts(_num(raw, 'budget'))} pts, {items} items"
             + (f" ({looks} look{'' if looks == 1 else 's'})" if looks else "")]
    if raw.get("decided_at_cap") and verdict == "fail":
        parts.append("undecided at max_items: not shown inside the budget")
    ref, trial = _num(raw, "reference_accuracy"), _num(raw, "trial_accuracy")
    if ref is not None and trial is not None:
        parts.append(f"accuracy {trial:.3f} vs reference {ref:.3f}" + _disagreed(raw.get("pairs")))
    lossy = raw.get("lossy")
    if isinstance(lossy, Mapping) and lossy:
        parts.append("lossy: " + ", ".join(f"{name}={_value(v)}" for name, v in lossy.items()))
    return "; ".join(parts)


def _disagreed(pairs: Any) -> str:
    """`` (disagreed on 23: 12 only the reference right, 11 only the trial)``: the discordant
    items, which alone move the drop and set its interval's width."""

    if not isinstance(pairs, Mapping):
        return ""
    ref_only, trial_only = pairs.get("ref_only"), pairs.get("trial_only")
    if not isinstance(ref_only, int) or not isinstance(trial_only, int):
        return ""
    return (f" (disagreed on {ref_only + trial_only}: {ref_only} only the reference right, "
            f"{trial_only} only the trial)")


def _value(entry: Any) -> str:
    if isinstance(entry, Mapping) and "value" in entry:
        return str(entry["value"])
    return str(entry)
