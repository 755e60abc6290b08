"""The searched knobs no trial's log could confirm, as status and the report show them.

A trial counts as applied when nothing it asked for was seen changed; a knob whose effect the
server never logs (a variable vLLM does not print, a name nothing reads) is "unverifiable" in
its asked-vs-got table (tuner.vllm.verify). Shown as loudly as a mismatch, because nothing
shows the server ran what was asked.

Pure, and free of pydantic: ``tuner status`` imports it and must answer fast.
"""

from __future__ import annotations

from typing import Any

__all__ = ["unverified", "unverified_summary", "unverified_text"]


def unverified(checks: list[dict[str, Any]], searched: frozenset[str]) -> list[dict[str, Any]]:
    """The searched knobs a trial's log could not confirm: the trial counts as applied, but
    nothing shows its server ran what was asked (a variable vLLM never logs, a name
    nothing reads). Fixed settings are left out: they are the same in every trial."""

    return [{"target": c.get("target"), "asked": c.get("asked"), "note": c.get("note")}
            for c in checks if c.get("status") == "unverifiable" and c.get("target") in searched]


def unverified_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per searched knob never confirmed: why (the first note) and in which trials."""

    found: dict[str, dict[str, Any]] = {}
    for row in rows:
        for check in row.get("unverified") or []:
            item = found.setdefault(str(check["target"]), {"target": check["target"], "note": check["note"],
                                                           "trials": []})
            item["trials"].append(row["trial"])
    return list(found.values())


def unverified_text(item: dict[str, Any]) -> str:
    """One :func:`unverified_summary` item as the line status and the report show."""

    trials = item["trials"]
    shown = ", ".join(map(str, trials[:8])) + (f" and {len(trials) - 8} more" if len(trials) > 8 else "")
    return (f"NOT VERIFIED: {item['target']} ({item['note'] or 'the log does not show it'}) in trial(s) "
            f"{shown}: nothing shows the server applied it, yet those trials count as applied")
