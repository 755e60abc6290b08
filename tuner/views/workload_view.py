"""The workload a study measures, as status and the report show it: a few lines from the
study's workload.json (tuner.load.workload_profile wrote it at ``run``/``resume``), read as
plain JSON, so ``tuner status`` imports nothing heavier than the standard library for it.

A study run before workload.json existed has none and shows no workload block.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

from tuner.study.durations import format_duration

__all__ = ["FIGURE", "TRACE_FIGURE", "workload_html", "workload_lines", "workload_md"]

# The report's figure files.
FIGURE = "workload.png"
TRACE_FIGURE = "arrivals.png"


def _n(value: Any) -> str:
    number = float(value)
    return f"{int(number):,}" if number.is_integer() else f"{number:,.1f}"


def _dist(d: Mapping[str, Any], *, with_max: bool = True) -> str:
    text = f"p50 {_n(d['p50'])}, p90 {_n(d['p90'])}"
    return text + (f", max {_n(d['max'])}" if with_max else "")


def _lines(profile: Mapping[str, Any]) -> list[str]:
    """The block's lines, unindented (KeyError, TypeError, ValueError: not a profile)."""

    entries, requests = int(profile["entries"]), int(profile["requests"])
    if profile["source"] == "synthetic":
        head = f"synthetic classes {profile['description']}: as configured, over {requests:,} requests"
    else:
        head = f"dataset {profile['description']}: {entries:,} entries, {requests:,} requests"
    lines = [head,
             f"prompt tokens {_dist(profile['prompt_tokens'])} ({profile['length_method']}); "
             f"output tokens {_dist(profile['output_tokens'], with_max=False)}"]
    turns, multi = profile["turns"], int(profile["multi_turn"])
    if multi:
        lines.append(f"turns per conversation {_dist(turns)} ({multi:,} of {entries:,} multi-turn)")
    else:
        lines.append("turns: one per entry")
    lines.append(f"prefix repeat: {float(profile['prefix_repeat_share']):.0%} of prompt tokens repeat an earlier "
                 f"prefix ({profile['prefix_method']})")
    trace = profile.get("trace")
    if trace:
        rate = trace.get("mean_rate")
        busiest = max(trace["rates"])
        lines.append(f"trace: {int(trace['requests']):,} requests over {format_duration(float(trace['duration_s']))}"
                     + (f", mean {float(rate):.2f} req/s" if rate is not None else "")
                     + f"; busiest {_n(trace['bucket_s'])} s bucket {busiest:.2f} req/s")
    return lines


def _safe_lines(profile: Mapping[str, Any]) -> list[str]:
    try:
        return _lines(profile)
    except (KeyError, TypeError, ValueError, AttributeError):
        return ["workload.json is not a workload profile this tuner reads"]


def workload_lines(profile: Mapping[str, Any] | None) -> list[str]:
    """``tuner status``'s workload block (indented); empty without a profile."""

    if not profile:
        return []
    first, *rest = _safe_lines(profile)
    return [f"  workload: {first}", *(f"    {line}" for line in rest)]


def workload_html(profile: Mapping[str, Any] | None, images: list[str]) -> str:
    """The report's Workload section (``images``: its figures as <img> tags), or a line
    saying the study has no profile."""

    if not profile:
        return ('<h2>Workload</h2><p id="workload">No workload profile: the study was run before '
                "tuner wrote workload.json.</p>")
    items = "".join(f"<li>{html.escape(line)}</li>" for line in _safe_lines(profile))
    return f'<h2>Workload</h2><div id="workload"><ul>{items}</ul>{"".join(images)}</div>'


def workload_md(profile: Mapping[str, Any] | None, figures: list[str]) -> list[str]:
    """The report.md Workload section (``figures``: its figure files), empty without a profile."""

    if not profile:
        return []
    return (["", "## Workload", ""] + [f"- {line}" for line in _safe_lines(profile)]
            + [x for name in figures for x in ("", f"![{name.removesuffix('.png')}]({name})")])
