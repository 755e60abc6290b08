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


def quality_line(raw: Mapping[str, Any]) -> str:
    """``quality PASS: accuracy drop 0.012 (95 % bound 0.031, budget 0.05) over 200 items ...``:
    the verdict, the drop with its upper bound against the budget, how many items and looks
    it took, both accuracies and the lossy values judged."""

    verdict = str(raw.get("verdict") or "?")
    drop, high, budget = _num(raw, "drop"), _num(raw, "drop_high"), _num(raw, "budget")
    confidence = _num(raw, "confidence")
    level = f"{confidence:.0%} " if confidence is not None else ""
    parts = [f"quality {verdict.upper()}: accuracy drop "
             + ("?" if drop is None else f"{drop:+.3f}")
             + f" ({level}bound " + ("?" if high is None else f"{high:.3f}")
             + ", budget " + ("?" if budget is None else f"{budget:g}") + ")"]
    items, looks = raw.get("items"), raw.get("looks")
    parts.append(f"over {items} items" + (f" ({looks} look{'s' if looks != 1 else ''})" if looks else ""))
    if raw.get("decided_at_cap") and verdict == "fail":
        parts.append("undecided at max_items: not shown inside the budget")
    ref, trial = _num(raw, "reference_accuracy"), _num(raw, "trial_accuracy")
    if ref is not None and trial is not None:
        parts.append(f"accuracy {trial:.3f} vs reference {ref:.3f}")
    lossy = raw.get("lossy")
    if isinstance(lossy, Mapping) and lossy:
        parts.append("lossy: " + ", ".join(f"{name}={_value(v)}" for name, v in lossy.items()))
    return "; ".join(parts)


def _value(entry: Any) -> str:
    if isinstance(entry, Mapping) and "value" in entry:
        return str(entry["value"])
    return str(entry)
