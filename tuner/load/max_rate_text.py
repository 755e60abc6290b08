"""A ``max_rate@slo`` search record in words (``tuner status``, the report, ``tuner measure``).

Reads the JSON form of :class:`tuner.load.rate_search.MaxRateResult` (a plain dict), so
``tuner status`` can show it without importing pydantic. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["max_rate_text", "max_rate_value_text", "probes_text"]


def _rate(x: Any) -> str:
    return "-" if x is None else f"{float(x):.3g}"


def max_rate_value_text(record: Mapping[str, Any] | None) -> str:
    """The answer alone: ``3.46``, ``>=100`` (a lower bound), ``0 (slo_unmet)``, ``-``."""
    if not record:
        return "-"
    value, status = record.get("max_rate"), record.get("status")
    if status == "slo_unmet":
        return "0 (slo_unmet)"
    if value is None:
        return "-"
    return (">=" if record.get("lower_bound") else "") + _rate(value)


def probes_text(record: Mapping[str, Any]) -> str:
    """Every probed rate in order with its verdict: ``8 missed, 2 met, 4 missed``."""
    out = []
    for p in record.get("probes") or []:
        word = "met" if p.get("met") else "missed"
        extra = []
        if p.get("margin") is not None:
            extra.append(f"x{float(p['margin']):.3g}")
        if p.get("within_noise"):
            extra.append("within noise")
        if p.get("reused"):
            extra.append("configured level")
        out.append(f"{_rate(p.get('rate'))} {word}" + (f" ({', '.join(extra)})" if extra else ""))
    return ", ".join(out)


def max_rate_text(record: Mapping[str, Any] | None) -> str:
    """One line: the answer, how sure it is, and how it was found."""
    if not record:
        return "max_rate@slo: not searched"
    status = record.get("status")
    lo, hi = (list(record.get("bracket") or [None, None]) + [None, None])[:2]
    head = f"max_rate@slo {max_rate_value_text(record)} req/s"
    if status == "slo_unmet":
        why = f"the SLO is missed even at the lowest allowed rate {_rate(record.get('low'))}"
    elif status == "lower_bound":
        why = f"met at the highest allowed rate {_rate(record.get('high'))}: a lower bound"
    elif status == "found":
        why = (f"met at {_rate(lo)}, missed at {_rate(hi)} "
               f"(+{float(record.get('precision') or 0):.1%}, target "
               f"{float(record.get('precision_target') or 0):.0%})")
    elif status == "stopped":
        why = f"search stopped early: cannot reach the front (answer below {_rate(hi)})"
    elif status == "budget":
        why = f"trial time ran out; bracket {_rate(lo)}-{_rate(hi)}"
    else:
        prec = record.get("precision")
        why = (f"level budget spent; bracket {_rate(lo)}-{_rate(hi)}"
               + ("" if prec is None else f" (+{float(prec):.1%}, target "
                  f"{float(record.get('precision_target') or 0):.0%})"))
        if hi is None and lo is not None:
            why += ": a lower bound"
    if record.get("answer") == "fit" and record.get("fit"):
        fit = record["fit"]
        why += (f"; verdicts near the boundary within noise: the answer is where the margins "
                f"of {int(fit.get('levels', 0))} levels ({int(fit.get('runs', 0))} runs) "
                f"cross 1")
    text = f"{head}: {why}; {record.get('levels', 0)} rate levels: {probes_text(record)}"
    pairs = record.get("non_monotonic") or []
    if pairs:
        text += "; noise near the boundary: " + ", ".join(
            f"missed {_rate(a)} but met {_rate(b)}" for a, b in pairs)
    return text
