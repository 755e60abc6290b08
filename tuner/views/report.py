"""`tuner report`: one self-contained HTML page, PNG figures and a Markdown summary.

The HTML embeds its figures as data URIs and needs no network to view. Everything shown
comes from the study's records (Optuna storage) and the per-trial files.
"""

from __future__ import annotations

import base64
import html
import json
import logging
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from tuner.adapters.artifacts import atomic_write_text, make_private_dir, open_private, read_json
from tuner.load.host_steadiness import check_text
from tuner.load.max_rate_text import max_rate_text, max_rate_value_text
from tuner.store.handle import StudyHandle
from tuner.store.records import read_records
from tuner.study.confirmation_text import summary_text
from tuner.study.durations import format_duration
from tuner.study.environment import environment_for, environment_lines
from tuner.study.noise import noisy_front, plus_minus, tie_text, unstable_text
from tuner.study.objectives import MAX_RATE
from tuner.study.simulated import simulated_label
from tuner.study.study_noise import with_study_noise
from tuner.study.trials import KIND_RUN, TrialRecord, front_records, noisy_points
from tuner.views.export import ExportError, choose_record, noise_notes, render_export
from tuner.views.plots import (
    arrivals_png,
    best_so_far_png,
    importance_png,
    pareto_png,
    quality_png,
    serving_figures,
    startup_png,
    workload_png,
)
from tuner.views.quality_view import QUALITY_FIGURE, quality_html, quality_md
from tuner.views.saved_spec import searched_targets, study_noise_at
from tuner.views.serving_curve import CURVE_FIGURES, ServingCurves, select_curves, serving_html, serving_md
from tuner.views.status import read_checks, value_text
from tuner.views.workload_view import FIGURE, TRACE_FIGURE, workload_html, workload_md
from tuner.vllm.knobs import mismatch_text
from tuner.vllm.startup import PHASE_LABELS, PHASES, figures_text, median_phases
from tuner.vllm.unverified import unverified, unverified_summary, unverified_text

__all__ = ["write_report", "knob_importances"]

logger = logging.getLogger(__name__)


def knob_importances(study: optuna.Study, records: list[TrialRecord]) -> tuple[dict[str, dict[str, float]], str]:
    """PED-ANOVA importance per objective over real measured trials only.

    Placeholder trials (forbidden or duplicate proposals told with made-up values so the
    sampler learns) would distort the analysis, so a scratch in-memory study holds just
    the trials that ran. Conditional knobs absent from some trials are left out by Optuna.
    """

    # Only trials that measured every objective: bounds and placeholders are what the
    # sampler was told, not how a knob moved the server.
    labels = list(study.metric_names or [])
    real = {r.number for r in records if set(r.measured_values()) >= set(labels)}
    trials = [t for t in study.get_trials(deepcopy=False) if t.number in real and t.values]
    if len(trials) < 4:
        return {}, "fewer than 4 measured trials: importance not computed"
    scratch = optuna.create_study(directions=study.directions)
    for t in trials:
        scratch.add_trial(optuna.trial.create_trial(
            params=t.params, distributions=t.distributions, values=t.values))
    out: dict[str, dict[str, float]] = {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for i, label in enumerate(labels):
                out[label] = optuna.importance.get_param_importances(
                    scratch, target=lambda t, i=i: t.values[i],
                    evaluator=optuna.importance.PedAnovaImportanceEvaluator())
    except (ValueError, RuntimeError, ImportError) as exc:
        return {}, f"importance not computed: {exc}"
    return out, ""


def _value(r: TrialRecord, label: str) -> str:
    """An objective's value as shown; max_rate@slo as its search says it (>=100: a lower
    bound; 0 (slo_unmet))."""

    record = r.summary.max_rate
    if label == MAX_RATE and record:
        return max_rate_value_text(record)
    return value_text(r.measured_values().get(label))


def _share(value: Any) -> str:
    return "-" if not isinstance(value, (int, float)) else f"{value:.0%}"


def slo_section(slo_text: str, front: list[TrialRecord]) -> tuple[str, list[str]]:
    """The report's SLO section as HTML and as Markdown lines: the SLO, then per front trial
    its max_rate@slo search and the goodput it measured at each level."""

    rows, md = [], ["", "## Latency SLO", "", f"SLO: `{slo_text}` (per request as `vllm bench serve "
                    "--goodput`; the level's statistic for the verdict).", ""]
    for r in front:
        outcome = r.summary
        levels = {**{f"c={c}": lv for c, lv in outcome.levels.items()}, **outcome.rate_levels}
        good = ", ".join(
            f"{name}: {value_text(lv.get('goodput_req_s'))} req/s, {value_text(lv.get('goodput_tok_s'))} tok/s "
            f"({_share(lv.get('slo_attained'))} within SLO)"
            for name, lv in levels.items() if lv.get("goodput_req_s") is not None)
        search = max_rate_text(outcome.max_rate) if outcome.max_rate else ""
        rows.append(f"<tr><td>{r.number}</td><td>{html.escape(search)}</td>"
                    f"<td>{html.escape(good)}</td></tr>")
        md.append(f"- trial {r.number}: " + "; ".join(x for x in (search, "goodput " + good if good else "") if x))
    table = ("<table><tr><th>trial</th><th>max_rate@slo search</th><th>goodput by level</th></tr>"
             + "\n".join(rows) + "</table>")
    page = (f"<h2>Latency SLO</h2><p>SLO: <code>{html.escape(slo_text)}</code> — a request is "
            "good when it meets every term (as <code>vllm bench serve --goodput</code>); a level "
            "meets the SLO when each term's statistic does.</p>" + table)
    return page, md


def _pm(r: TrialRecord, label: str) -> str:
    """A value with its 95 % half-width, e.g. ``8648 ± 210``."""

    if label == MAX_RATE and r.summary.max_rate:
        return _value(r, label)       # as its search says it: >=high, 0 (slo_unmet)
    value = r.measured_values().get(label)
    if value is not None:
        return plus_minus(float(value), r.noise([label]).get(label), " ± ")
    told = r.values.get(label)
    level = r.bound_labels([label]).get(label)
    if told is not None and level is not None:   # stopped early before this level's end
        return f"{value_text(told)} (bound, c={level} not measured)"
    return "not measured" if r.kind == KIND_RUN and r.state == "COMPLETE" else "–"


def noise_ties(records: list[TrialRecord], labels: list[str], directions: list[str]) -> list[str]:
    """Every tie noise leaves on and around the front, as sentences."""

    noisy = noisy_points(records, labels)
    return [tie_text(t) for t in noisy_front(noisy, directions, labels)[1]] if noisy else []


def _separation_html(path: Path) -> str:
    """What ``confirm.tie_runs`` spent separating ties, and what stayed a tie (tuner.engine.tie_runs)."""

    data = read_json(path, dict)
    if data is None:
        return ""
    items = [f"<li>separated: {html.escape(t['text'].replace('are within noise', 'were within noise'))}</li>"
             for t in data.get("separated") or []]
    items += [f"<li>still a tie: {html.escape(t['text'])}</li>" for t in data.get("remaining_ties") or []]
    pooled = "; ".join(
        f"trial {n}: " + ", ".join(
            f"{html.escape(k)} {html.escape(plus_minus(v, p['noise'].get(k), ' ± '))}"
            for k, v in p["values"].items()) + f" ({p['runs']} runs)"
        for n, p in (data.get("pooled") or {}).items())
    return (f'<div id="tie-runs"><h3>Separating near-ties</h3><p>{data.get("spent_runs", 0)} of '
            f'{data.get("budget_runs", 0)} extra fresh-server runs spent '
            f'({format_duration(float(data.get("spent_s") or 0))}).</p>'
            f'<ul>{"".join(items) or "<li>no tie to separate</li>"}</ul>'
            f'<p>Pooled over runs: {pooled}</p></div>')


def _unstable(r: TrialRecord) -> str:
    levels = r.unstable_levels
    if not levels:
        return ""
    return "UNSTABLE: " + unstable_text(levels, r.client_bound_levels)


def _img(data: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(data).decode()}">'


def _trial_rows(records: list[TrialRecord], labels: list[str], handle: StudyHandle) -> str:
    rows = []
    searched = searched_targets(handle.paths.spec_yaml)
    for r in sorted((r for r in records if r.kind == KIND_RUN), key=lambda r: r.number):
        outcome = r.summary
        values = "".join(f"<td>{html.escape(_pm(r, l))}</td>" for l in labels)
        params = ", ".join(f"{html.escape(k)}={html.escape(value_text(v))}" for k, v in r.params.items())
        notes = []
        if r.unstable_levels:
            notes.append(f'<span class="unstable">{html.escape(_unstable(r))}</span>')
        checks = read_checks(handle, r.number)
        verified = [c for c in checks
                    if c.get("status") == "applied" and not str(c.get("target")).startswith("env:TUNER_")]
        for check in unverified(checks, searched):
            notes.append(f'<span class="unstable">NOT VERIFIED: {html.escape(str(check["target"]))}='
                         f'{html.escape(value_text(check.get("asked")))} '
                         f'({html.escape(str(check.get("note")))})</span>')
        if verified:
            notes.append("applied: " + ", ".join(
                f"{html.escape(str(c['target']))}={html.escape(value_text(c.get('got')))}" for c in verified))
        for m in outcome.mismatches:
            notes.append(
                f"not applied: {html.escape(mismatch_text(m))}"
                + (f"<br><code>{html.escape(str(m.get('evidence'))[:240])}</code>" if m.get("evidence") else "")
            )
        if outcome.probe_passed is False:
            notes.append("probe failed: " + html.escape(str(outcome.probe_reason)))
        if (agreement := handle.paths.probe_agreement(r.number, outcome)) is not None:
            notes.append("probe: " + html.escape(agreement))
        if outcome.max_rate:
            notes.append(html.escape(max_rate_text(outcome.max_rate)))
        failure = r.failure
        if r.state == "FAIL" and failure is not None:
            notes.append(f"{html.escape(failure.reason)}: {html.escape(failure.message or '')}")
        startup = outcome.startup_s
        baseline_tag = " (baseline)" if r.is_baseline else ""
        rows.append(
            f'<tr class="{html.escape(r.outcome.split(":")[0])}"><td>{r.number}{baseline_tag}</td>'
            f"<td>{html.escape(r.outcome)}</td>{values}<td>{value_text(startup)}</td><td>{params}</td>"
            f"<td>{'<br>'.join(notes)}</td></tr>"
        )
    return "\n".join(rows)


def _startup_rows(runs: list[TrialRecord]) -> list[tuple[str, list[str], str]]:
    """(trial, seconds per phase as text, what the log says about KV cache and graphs) for
    every trial that started a server."""

    rows = []
    for r in sorted(runs, key=lambda r: r.number):
        rec = r.startup_record
        if rec is None:
            continue
        cells = [_secs(rec.phases.get(p)) for p in PHASES]
        total = rec.total_s if rec.complete else None
        cache = rec.compile_cache or "unknown"
        rows.append((f"{r.number}{' (baseline)' if r.is_baseline else ''}",
                     cells + [_secs(total) if total is not None else "never ready", cache],
                     figures_text(rec) or ""))
    return rows


def _secs(value: Any) -> str:
    return "–" if value is None else f"{float(value):.1f}"


_STARTUP_HEAD = [PHASE_LABELS[p] for p in PHASES] + ["total", "compile cache"]
_STARTUP_NOTE = ("Seconds per phase (tuner/vllm/startup.py): imports and ready come from the "
                 "tuner's clock, the rest from vLLM's log timestamps (1 s resolution); – means the "
                 "phase did not happen (eager: no compile, no graphs) or the log never got there.")


def _startup_html(runs: list[TrialRecord], figure: bytes | None) -> str:
    rows = _startup_rows(runs)
    if not rows:
        return "<p>No trial started a server with a startup record.</p>"
    medians = median_phases([r.startup_record for r in runs if r.startup_record is not None])
    head = "".join(f"<th>{html.escape(h)}</th>" for h in _STARTUP_HEAD)
    body = "\n".join(f"<tr><td>{html.escape(t)}</td>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells)
                     + f"<td>{html.escape(fig)}</td></tr>" for t, cells, fig in rows)
    if medians:
        body += ("\n<tr><th>median</th>" + "".join(f"<th>{_secs(medians.get(p))}</th>" for p in PHASES)
                 + f"<th>{_secs(medians.get('total'))}</th><th></th><th></th></tr>")
    image = _img(figure, "startup by phase") if figure else ""
    return (f"{image}<p>{html.escape(_STARTUP_NOTE)}</p><table><tr><th>trial</th>{head}"
            f"<th>KV cache, graph capture (from the log)</th></tr>\n{body}</table>")


def _startup_md(runs: list[TrialRecord], with_figure: bool) -> list[str]:
    rows = _startup_rows(runs)
    if not rows:
        return []
    md = ["", "## Server startup", ""]
    if with_figure:
        md += ["![startup by phase](startup.png)", ""]
    md += [_STARTUP_NOTE, "", "| trial | " + " | ".join(_STARTUP_HEAD) + " | KV cache, graph capture |",
           "|---|" + "---|" * (len(_STARTUP_HEAD) + 1)]
    md += [f"| {t} | " + " | ".join(cells) + f" | {fig} |" for t, cells, fig in rows]
    medians = median_phases([r.startup_record for r in runs if r.startup_record is not None])
    if medians:
        md.append("| median | " + " | ".join(_secs(medians.get(p)) for p in PHASES)
                  + f" | {_secs(medians.get('total'))} |  |  |")
    return md


_SCRIPT = """<script>
// Marks whether every figure decoded, so a headless browser check can assert it.
window.addEventListener("load", function () {
  var imgs = Array.prototype.slice.call(document.images);
  var ok = imgs.length > 0 && imgs.every(function (i) { return i.complete && i.naturalWidth > 0; });
  document.body.setAttribute("data-plots-rendered", ok ? "yes" : "no");
});
</script>
"""

_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:13px}
td,th{border:1px solid #ccc;padding:4px 8px;vertical-align:top;text-align:left}
th{background:#f3f3f3} tr.feasible td:nth-child(2){color:#1a7f37}
tr.probe_failed td:nth-child(2),tr.failed td:nth-child(2){color:#c62828}
tr.not_applied td:nth-child(2){color:#e65100} code,pre{font-size:12px;background:#f6f8fa}
tr.quality_failed td:nth-child(2){color:#c62828}
pre{padding:8px;overflow-x:auto;white-space:pre-wrap} img{max-width:100%}
.unstable{color:#c62828;font-weight:bold}
"""


def write_report(handle: StudyHandle, out_dir: Path, *, pick: str = "knee") -> dict[str, Path]:
    """Write report.html, report.md and the PNG figures; return their paths."""

    study = handle.load()
    labels = list(study.metric_names or [])
    stored = read_records(study)
    between = study_noise_at(handle.paths, stored, labels)
    records = with_study_noise(stored, between)
    directions = [d.name.lower() for d in study.directions]
    make_private_dir(out_dir)
    workload = handle.paths.workload_profile()
    curves = select_curves(records, labels, directions, handle.spec.server.gpus_per_trial)
    figures, importances, importance_note = _figures(study, records, labels, directions, workload)
    figures.update(serving_figures(curves))
    paths = _write_figures(out_dir, figures)

    runs = [r for r in records if r.kind == KIND_RUN]
    front = front_records(records, labels, directions)
    confirmations = handle.paths.confirmations()
    baseline = next((r for r in runs if r.is_baseline and r.state == "COMPLETE"), None)
    try:
        chosen = choose_record(records, labels, directions, trial=None, pick=pick, filters=[], force=False,
                               confirmations=confirmations)
        export_text = render_export(handle.spec, handle.name, chosen, "shell",
                                    noise_notes(records, labels, directions, chosen),
                                    handle.paths.probe_agreement(chosen.number, chosen.summary),
                                    environment_for(chosen.number, *handle.paths.environment()),
                                    handle.paths.dry_run_of())
    except ExportError as exc:
        chosen, export_text = None, f"# nothing to export: {exc}\n"
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.outcome] = counts.get(r.outcome, 0) + 1
    shown = _Shown(
        handle=handle, labels=labels, directions=directions, runs=runs, front=front,
        baseline=baseline, confirmations=confirmations, counts=counts,
        elapsed=float(study.user_attrs.get("elapsed_s", 0.0)), workload=workload,
        ties=noise_ties(records, labels, directions), pick=pick, export_text=export_text,
        noise_lines=between.lines(), curves=curves,
        simulated=simulated_label(handle.spec.server.command, handle.spec.server.env, handle.paths.dry_run_of()))
    slo_html, slo_md = ("", [])
    if handle.spec.slo is not None:
        slo_html, slo_md = slo_section(handle.spec.slo.text(), front)
    imp_html = _img(figures["importance.png"], "knob importance") if importances else (
        f"<p>{html.escape(importance_note)}</p>")
    page = _report_html(shown, records, figures, slo_html, imp_html)
    atomic_write_text(out_dir / "report.html", page)
    paths["report.html"] = out_dir / "report.html"

    atomic_write_text(out_dir / "report.md", _report_md(shown, slo_md, set(figures)))
    paths["report.md"] = out_dir / "report.md"
    atomic_write_text(out_dir / "report.json", json.dumps({
        "study": handle.name, "labels": labels, "directions": directions,
        "front": [r.number for r in front], "chosen": None if chosen is None else chosen.number,
        "noise": {str(r.number): r.noise(labels) for r in front},
        "unstable": {str(r.number): r.unstable_levels for r in front if r.unstable_levels},
        "ties": shown.ties,
        "between_starts": between.as_dict(),
        "probe_agreement": {str(r.number): a for r in front
                            if (a := handle.paths.probe_agreement(r.number, r.summary))},
        "host_check": handle.paths.last_host_check(),
        "probe_mode": handle.paths.probe_mode(),
        "environment": handle.paths.environment()[0],
        "environment_changes": handle.paths.environment()[1],
        "confirmations": {str(n): c.get("verdict") for n, c in confirmations.items()},
        "importances": importances, "importance_note": importance_note, "workload": workload,
        "quality": {str(r.number): r.summary.quality.model_dump(mode="json") for r in runs if r.summary.quality},
    }, indent=2) + "\n")
    return paths


def _figures(study: optuna.Study, records: list[TrialRecord], labels: list[str], directions: list[str],
             workload: dict[str, Any] | None) -> tuple[dict[str, bytes], dict[str, dict[str, float]], str]:
    """The report's PNG figures by file name, with the knob importances they plot and why
    those are missing (empty when computed)."""
    figures = {
        "pareto.png": pareto_png(records, labels, directions),
        "best_so_far.png": best_so_far_png(records, labels, directions),
    }
    startup_figure = startup_png(records)
    if startup_figure is not None:
        figures["startup.png"] = startup_figure
    if (quality_figure := quality_png(records, labels, directions)) is not None:
        figures[QUALITY_FIGURE] = quality_figure
    if workload:
        figures.update(_workload_figures(workload))
    importances, importance_note = knob_importances(study, records)
    if importances:
        figures["importance.png"] = importance_png(importances)
    return figures, importances, importance_note


def _workload_figures(workload: dict[str, Any]) -> dict[str, bytes]:
    """The workload's lengths and, for a trace, its arrivals; none from a workload.json this
    tuner does not read (the section says so)."""
    try:
        figures = {FIGURE: workload_png(workload)}
        if workload.get("trace"):
            figures[TRACE_FIGURE] = arrivals_png(workload["trace"])
    except (KeyError, TypeError, ValueError, IndexError):
        return {}
    return figures


def _write_figures(out_dir: Path, figures: dict[str, bytes]) -> dict[str, Path]:
    """Write each figure (private, through a temporary file); return their paths."""
    paths: dict[str, Path] = {}
    for name, data in figures.items():
        path = out_dir / name
        tmp = path.with_suffix(".tmp")
        with open_private(tmp, "wb") as fh:
            fh.write(data)
        tmp.replace(path)
        paths[name] = path
    return paths


@dataclass(frozen=True, slots=True)
class _Shown:
    """What the HTML page and the Markdown summary both show."""

    handle: StudyHandle
    labels: list[str]
    directions: list[str]
    runs: list[TrialRecord]  # the trials that ran
    front: list[TrialRecord]
    baseline: TrialRecord | None  # the completed baseline trial, if any
    confirmations: dict[int, dict[str, Any]]  # confirmation verdicts by trial number
    counts: dict[str, int]  # trials run, by outcome
    elapsed: float  # time used, seconds
    ties: list[str]  # noise ties as sentences (noise_ties)
    pick: str
    export_text: str  # the chosen configuration as a shell command
    noise_lines: list[str]  # the study's noise between fresh starts (tuner.study.between_starts)
    workload: dict[str, Any] | None  # workload.json (tuner.load.workload_profile), if the study has one
    curves: ServingCurves  # the serving curve's configurations and points (tuner.views.serving_curve)
    simulated: str | None  # the opening line when the simulator served the study (tuner.study.simulated)

    def ratio(self, r: TrialRecord, label: str) -> str:
        base = self.baseline.measured_values() if self.baseline is not None else {}
        value = r.measured_values().get(label)
        if not base.get(label) or value is None:
            return ""
        return f" ({value / base[label]:.2f}× baseline)"

    def confirmed(self, r: TrialRecord) -> str:
        found = self.confirmations.get(r.number)
        return "not re-run" if found is None else summary_text(found)


def _report_html(shown: _Shown, records: list[TrialRecord], figures: dict[str, bytes],
                 slo_html: str, imp_html: str) -> str:
    """The self-contained report page (figures embedded as data URIs)."""
    handle, labels, directions, front = shown.handle, shown.labels, shown.directions, shown.front
    runs, counts, baseline, pick = shown.runs, shown.counts, shown.baseline, shown.pick
    elapsed, export_text = shown.elapsed, shown.export_text
    ratio, confirmed = shown.ratio, shown.confirmed
    front_rows = "\n".join(
        "<tr><td>{}{}</td>{}<td>{}</td><td>{}</td></tr>".format(
            r.number,
            f' <span class="unstable">{html.escape(_unstable(r))}</span>' if r.unstable_levels else "",
            "".join(f"<td>{html.escape(_pm(r, l))}{ratio(r, l)}</td>" for l in labels),
            html.escape(", ".join(f"{k}={value_text(v)}" for k, v in r.params.items())),
            html.escape(confirmed(r)),
        ) for r in front
    )
    ties_html = "".join(f"<li>{html.escape(t)}</li>" for t in shown.ties)
    noise_html = "".join(f"<li>{html.escape(t)}</li>" for t in shown.noise_lines)
    separation = _separation_html(handle.paths.confirm_root / "ties.json")
    host = handle.paths.last_host_check()
    host_html = f'<p id="host-check">{html.escape(check_text(host))}.</p>' if host else ""
    if (mode := handle.paths.probe_mode()) is not None:
        host_html += f'<p id="probe-mode">Probe: {html.escape(mode)}.</p>'
    host_html += "".join(f'<p class="environment">{html.escape(line.strip())}</p>'
                         for line in environment_lines(*handle.paths.environment()))
    unstable_front = [r for r in front if r.unstable_levels]
    warn_html = "".join(
        f'<p class="unstable" id="unstable-warning">Trial {r.number} is on the front but '
        f"{html.escape(_unstable(r))}: its numbers moved while they were measured.</p>"
        for r in unstable_front)
    head = "".join(f"<th>{html.escape(l)}</th>" for l in labels)
    counts_text = ", ".join(f"{html.escape(k)} {v}" for k, v in sorted(counts.items()))
    objectives_text = ", ".join(f"{html.escape(l)} ({d})" for l, d in zip(labels, directions))
    baseline_text = (f"trial {baseline.number} — "
                     + ", ".join(f"{l}={value_text(baseline.measured_values().get(l))}" for l in labels)
                     if baseline else "not measured")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>tuner report: {html.escape(handle.name)}</title>
<style>{_CSS}</style></head><body>
<h1>Study {html.escape(handle.name)}</h1>
{f'<p class="unstable" id="simulated">{html.escape(shown.simulated)}.</p>' if shown.simulated else ""}
<p>{len(runs)} trials run ({counts_text}),
time used {format_duration(elapsed)}. Objectives: {objectives_text}.
Generated {time.strftime("%Y-%m-%d %H:%M:%S")}.</p>
<h2>Pareto front</h2>
<div id="pareto">{_img(figures["pareto.png"], "Pareto front")}</div>
{warn_html}
<table id="front"><tr><th>trial</th>{head}<th>parameters</th><th>confirmation re-run</th></tr>
{front_rows or '<tr><td colspan="9">no feasible trial yet</td></tr>'}</table>
<p>Values are ± their 95 % interval (tuner.load.uncertainty): differences inside it are ties.</p>
<div id="between-starts"><p>Noise between fresh starts of one configuration, which every interval carries
beyond its own run (tuner.study.between_starts):</p><ul>{noise_html}</ul></div>
{f'<ul id="ties">{ties_html}</ul>' if ties_html else '<p id="ties">No ties within noise.</p>'}
{separation}
{host_html}
<p>Baseline: {baseline_text}.</p>
{serving_html(shown.curves, {n: _img(figures[n], n) for n in CURVE_FIGURES if n in figures})}
{workload_html(shown.workload, [_img(figures[n], n) for n in (FIGURE, TRACE_FIGURE) if n in figures])}
{slo_html}
{quality_html(runs, labels, directions, _img(figures[QUALITY_FIGURE], "speed against accuracy drop")
              if QUALITY_FIGURE in figures else "")}
<h2>Chosen configuration ({html.escape(pick)})</h2>
<pre id="export">{html.escape(export_text)}</pre>
<h2>Progress</h2>
{_img(figures["best_so_far.png"], "best so far")}
<h2>Which knobs mattered</h2>
{imp_html}
<h2>Server startup</h2>
{_startup_html(runs, figures.get("startup.png"))}
<h2>All trials</h2>
<table><tr><th>trial</th><th>outcome</th>{head}<th>startup s</th><th>parameters</th><th>asked vs got, failures</th></tr>
{_trial_rows(records, labels, handle)}</table>
{_SCRIPT}</body></html>
"""


def _report_md(shown: _Shown, slo_md: list[str], shown_figures: set[str]) -> str:
    """The Markdown summary (report.md); ``shown_figures``: the figure files written beside it."""
    labels, front, runs, counts = shown.labels, shown.front, shown.runs, shown.counts
    confirmations, ratio = shown.confirmations, shown.ratio
    md = [f"# Study {shown.handle.name}", "", *([f"**{shown.simulated}.**", ""] if shown.simulated else []),
          f"{len(runs)} trials run — " + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))
          + f"; time used {format_duration(shown.elapsed)}.", "", "## Pareto front", "",
          "| trial | " + " | ".join(labels) + " | parameters |",
          "|---|" + "---|" * len(labels) + "---|"]
    for r in front:
        md.append(f"| {r.number}{' ' + _unstable(r) if r.unstable_levels else ''} | "
                  + " | ".join(_pm(r, l) + ratio(r, l) for l in labels)
                  + " | " + ", ".join(f"{k}={value_text(v)}" for k, v in r.params.items()) + " |")
    md += ["", "Values are ± their 95 % interval; differences inside it are ties."]
    md += ["", "Noise between fresh starts of one configuration:"] + [f"- {t}" for t in shown.noise_lines]
    md += [f"- {t}" for t in shown.ties]
    agreements = [(r.number, a) for r in front
                  if (a := shown.handle.paths.probe_agreement(r.number, r.summary))]
    if agreements:
        md += ["", "The probe passed each of them; how far their answers moved from the reference's:"]
        md += [f"- trial {n}: {a}" for n, a in agreements]
    if (mode := shown.handle.paths.probe_mode()) is not None:
        md += ["", f"Probe: {mode}."]
    if (host := shown.handle.paths.last_host_check()) is not None:
        md += ["", check_text(host) + "."]
    md += [line.strip() for line in environment_lines(*shown.handle.paths.environment())]
    md += serving_md(shown.curves, shown_figures)
    md += workload_md(shown.workload, [n for n in (FIGURE, TRACE_FIGURE) if n in shown_figures])
    md += slo_md
    md += quality_md(runs, labels, shown.directions, QUALITY_FIGURE in shown_figures)
    if confirmations:
        md += ["", "## Confirmation re-runs", ""]
        md += [f"- trial {n}: {summary_text(c)}" for n, c in sorted(confirmations.items())]
    searched = searched_targets(shown.handle.paths.spec_yaml)
    never = unverified_summary([{"trial": r.number, "unverified": unverified(read_checks(shown.handle, r.number),
                                                                             searched)} for r in runs])
    if never:
        md += ["", "## Searched knobs never verified", ""] + [f"- {unverified_text(item)}" for item in never]
    problems = [r for r in runs if r.outcome != "feasible"]
    if problems:
        md += ["", "## Not on the front because", ""]
        for r in problems:
            detail = (None if r.failure is None else r.failure.message) if r.state == "FAIL" else ""
            for m in r.summary.mismatches:
                detail = mismatch_text(m)
            if r.summary.quality is not None and r.summary.quality.verdict == "fail":
                detail = r.summary.quality.summary()
            md.append(f"- trial {r.number}: {r.outcome}" + (f" — {detail}" if detail else ""))
    md += _startup_md(runs, "startup.png" in shown_figures)
    md += ["", f"## Chosen configuration ({shown.pick})", "",
           "```sh", shown.export_text.rstrip(), "```", ""]
    return "\n".join(md)
