"""The quality budget in the views: what each lossy trial gave up in accuracy beside what it
gained in speed (the report's section and the export header's line; pareto.json's entry is
``tuner.study.scoring.pareto_payload``'s).

A trial's ``QualityRecord`` (tuner.probe.quality_stats) is read from its stored outcome
(``OutcomeSummary.quality``); a lossless trial has none and a record that does not read as
one is left out there, so nothing here fails on a damaged outcome. Text only: the figure is
``tuner.views.plots.quality_png``.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from tuner.probe.quality_stats import QualityRecord
from tuner.study.trials import KIND_RUN, TrialRecord

__all__ = ["QUALITY_FIGURE", "lossy_text", "drop_text", "quality_header", "speed_label",
           "quality_html", "quality_md"]

QUALITY_FIGURE = "quality.png"
_HEAD = ["trial", "outcome", "lossy values", "reference accuracy", "trial accuracy", "accuracy drop",
         "budget", "verdict", "items (looks)"]
_NOTE = ("Accuracy on the quality items, the trial's answers paired with the reference's on the same items; "
         "the drop is in accuracy points with its interval (tuner.probe.quality_stats: Newcombe's paired "
         "interval, each look at its share of the error). A trial passes when the whole interval is inside "
         "the budget; one still undecided at the item cap fails (not shown to be inside).")


def _pts(fraction: float) -> str:
    return f"{100 * fraction:.1f}"


def lossy_text(record: QualityRecord) -> str:
    """``kv_cache_dtype=fp8 (an fp8 KV cache stores ...)``, each lossy value with its reason."""

    return ", ".join(f"{name}={lossy.value} ({lossy.reason})" for name, lossy in record.lossy.items()) or "none"


def drop_text(record: QualityRecord) -> str:
    """``accuracy drop 0.8 pts [-0.4, 2.1] (95%) on 400 items, budget 3.0 pts: pass``."""

    text = (f"accuracy drop {_pts(record.drop)} pts [{_pts(record.drop_low)}, {_pts(record.drop_high)}] "
            f"({100 * record.confidence:g}%) on {record.items} items, budget {_pts(record.budget)} pts: "
            f"{record.verdict}")
    return text + (" (undecided at the item cap)" if record.decided_at_cap else "")


def quality_header(record: QualityRecord) -> str:
    """The export header's line: the lossy choices and what they were measured to cost."""

    return f"lossy: {lossy_text(record)}; {drop_text(record)}"


def speed_label(labels: Sequence[str], directions: Sequence[str]) -> str | None:
    """The study's first objective to maximize (its throughput), None when it has none."""

    return next((label for label, d in zip(labels, directions) if d == "maximize"), None)


def _rows(runs: Sequence[TrialRecord], speed: str | None) -> list[list[str]]:
    """One row of cells per trial with a quality record, by trial number (``_HEAD`` order, then
    the speed objective's value when the study has one)."""

    rows = []
    for r in sorted(runs, key=lambda r: r.number):
        q = r.summary.quality
        if r.kind != KIND_RUN or q is None:
            continue
        verdict = q.verdict + (" (undecided at the cap)" if q.decided_at_cap else "")
        cells = [str(r.number), r.outcome, lossy_text(q), f"{q.reference_accuracy:.1%}", f"{q.trial_accuracy:.1%}",
                 f"{_pts(q.drop)} pts [{_pts(q.drop_low)}, {_pts(q.drop_high)}] ({100 * q.confidence:g}%)",
                 f"{_pts(q.budget)} pts", verdict, f"{q.items} ({q.looks})"]
        if speed is not None:
            value = r.measured_values().get(speed)
            cells.append("not measured" if value is None else f"{value:.4g}")
        rows.append(cells)
    return rows


def quality_html(runs: Sequence[TrialRecord], labels: Sequence[str], directions: Sequence[str],
                 figure_tag: str) -> str:
    """The report's quality section (``figure_tag``: the speed-vs-quality figure's <img>, or
    empty); empty when no trial has a quality record."""

    speed = speed_label(labels, directions)
    rows = _rows(runs, speed)
    if not rows:
        return ""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in [*_HEAD, *([speed] if speed else [])])
    body = "\n".join(f'<tr class="{html.escape(cells[1])}">' + "".join(f"<td>{html.escape(c)}</td>" for c in cells)
                     + "</tr>" for cells in rows)
    return (f'<h2>Quality budget</h2><div id="quality">{figure_tag}<p>{html.escape(_NOTE)}</p>'
            f"<table><tr>{head}</tr>\n{body}</table></div>")


def quality_md(runs: Sequence[TrialRecord], labels: Sequence[str], directions: Sequence[str],
               with_figure: bool) -> list[str]:
    """The quality section of report.md; no lines when no trial has a quality record."""

    speed = speed_label(labels, directions)
    rows = _rows(runs, speed)
    if not rows:
        return []
    head = [*_HEAD, *([speed] if speed else [])]
    md = ["", "## Quality budget", ""]
    if with_figure:
        md += [f"![speed against accuracy drop]({QUALITY_FIGURE})", ""]
    md += [_NOTE, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    md += ["| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |" for cells in rows]
    return md
