"""Figures of a study (matplotlib, Agg backend): Pareto front, best-so-far, knob importance,
startup time by phase, the workload's lengths and a trace's arrivals, speed against the
quality budget's accuracy drop, the serving curve and energy per token against concurrency.

Each function takes plain records and returns PNG bytes, so the report can both embed
them (self-contained HTML) and write them as files.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on servers and in CI
import matplotlib.pyplot as plt

from tuner.study.pareto import Point, pareto_front
from tuner.study.trials import KIND_RUN, TrialRecord
from tuner.views.quality_view import speed_label
from tuner.views.serving_curve import ENERGY_FIGURE, PER_USER, SERVING_FIGURE, Curve, ServingCurves, throughput_axis
from tuner.vllm.startup import PHASE_LABELS, PHASES

__all__ = ["pareto_png", "best_so_far_png", "importance_png", "startup_png", "workload_png", "arrivals_png",
           "quality_png", "serving_curve_png", "energy_png", "serving_figures", "OUTCOME_STYLE"]

# outcome -> (marker, colour, legend label)
OUTCOME_STYLE = {
    "feasible": ("o", "#1f77b4", "feasible"),
    "probe_failed": ("X", "#d62728", "probe failed"),
    # A lossy configuration whose accuracy drop was not shown inside the study's budget.
    "quality_failed": ("x", "#bcbd22", "over the quality budget"),
    "not_applied": ("^", "#ff7f0e", "config not applied"),
    "limit_missed": ("s", "#9467bd", "limit missed"),
    "load_errors": ("P", "#8c564b", "requests failed"),
    # Measured by the client's own token count: the server's was not believed.
    "token_count_mismatch": ("D", "#e377c2", "token counts not believed"),
    # Stopped inside its sweep: one objective is the optimistic bound it was judged on.
    "stopped_early": ("v", "#7f7f7f", "stopped early (bound)"),
}


def _png(fig: plt.Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def pareto_png(records: Sequence[TrialRecord], labels: Sequence[str], directions: Sequence[str]) -> bytes:
    """Objective 1 (y) against objective 2 (x); every measured trial marked by outcome."""

    fig, ax = plt.subplots(figsize=(7.5, 5))
    y_label, x_label = labels[0], labels[1] if len(labels) > 1 else labels[0]
    # Only measured values are plotted: a trial stopped early was told bounds or the worst
    # values seen, and such a point would sit on top of another one and mislead.
    measured = [r for r in records if {y_label, x_label} <= set(r.measured_values())]
    for outcome, (marker, colour, legend) in OUTCOME_STYLE.items():
        pts = [r for r in measured if r.outcome == outcome]
        if pts:
            ax.scatter([r.values[x_label] for r in pts], [r.values[y_label] for r in pts],
                       marker=marker, c=colour, s=46, alpha=0.8, label=f"{legend} ({len(pts)})")
    points = [Point(r.number, tuple(r.values[l] for l in labels), r.feasible) for r in measured
              if set(labels) <= set(r.measured_values())]
    front = pareto_front(points, directions)
    on_front = {p.number for p in front}
    for r in measured:
        # Every point carries its trial number, so the figure can be read against the tables.
        if r.number not in on_front:
            ax.annotate(f"#{r.number}", (r.values[x_label], r.values[y_label]), textcoords="offset points",
                        xytext=(5, -10), fontsize=7, color="#555")
    if front and len(labels) > 1:
        ordered = sorted(front, key=lambda p: p.values[1])
        ax.plot([p.values[1] for p in ordered], [p.values[0] for p in ordered], "-", c="#2ca02c",
                lw=1.5, zorder=1)
        ax.scatter([p.values[1] for p in ordered], [p.values[0] for p in ordered], marker="*",
                   s=190, c="#2ca02c", edgecolors="black", zorder=3, label=f"Pareto front ({len(front)})")
        for p in ordered:
            ax.annotate(f"#{p.number}", (p.values[1], p.values[0]), textcoords="offset points",
                        xytext=(6, 4), fontsize=8)
    baseline = next((r for r in measured if r.is_baseline), None)
    if baseline is not None:
        ax.scatter([baseline.values[x_label]], [baseline.values[y_label]], marker="D", s=80,
                   facecolors="none", edgecolors="black", lw=1.5, label="baseline", zorder=4)
    crashed = sum(1 for r in records if r.kind == "run" and r.state == "FAIL")
    shown = {r.number for r in measured}
    unmeasured = sum(1 for r in records if r.kind == "run" and r.state == "COMPLETE" and r.number not in shown)
    notes = ([f"{crashed} trial(s) failed to run"] if crashed else []) + (
        [f"{unmeasured} trial(s) stopped before measuring these objectives (e.g. config not applied)"]
        if unmeasured else [])
    if notes:
        ax.text(0.99, 0.01, "; ".join(notes) + " - not plotted", transform=ax.transAxes,
                ha="right", va="bottom", fontsize=8, color="#555")
    ax.set_xlabel(x_label + (" (lower is better)" if len(directions) > 1 and directions[1] == "minimize" else ""))
    ax.set_ylabel(y_label + (" (higher is better)" if directions[0] == "maximize" else ""))
    ax.set_title("Trials and Pareto front")
    ax.grid(True, alpha=0.3)
    if measured:
        ax.legend(fontsize=8, loc="best")
    return _png(fig)


def best_so_far_png(records: Sequence[TrialRecord], labels: Sequence[str], directions: Sequence[str]) -> bytes:
    fig, axes = plt.subplots(len(labels), 1, figsize=(7.5, 2.6 * len(labels)), squeeze=False)
    runs = sorted((r for r in records if r.kind == "run" and r.state in ("COMPLETE", "FAIL")),
                  key=lambda r: r.number)
    for ax, label, direction in zip(axes[:, 0], labels, directions):
        best = math.nan
        xs, ys, feas_x, feas_y = [], [], [], []
        for i, r in enumerate(runs, start=1):
            value = r.values.get(label)
            if r.feasible and value is not None:
                feas_x.append(i)
                feas_y.append(value)
                if math.isnan(best) or (value > best if direction == "maximize" else value < best):
                    best = value
            xs.append(i)
            ys.append(best)
        ax.plot(xs, ys, drawstyle="steps-post", c="#2ca02c", label="best feasible so far")
        ax.scatter(feas_x, feas_y, s=14, c="#1f77b4", alpha=0.6, label="feasible trial")
        ax.set_ylabel(label, fontsize=8)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    axes[-1, 0].set_xlabel("trials run (in order)")
    fig.suptitle("Best value so far")
    return _png(fig)


def importance_png(importances: dict[str, dict[str, float]]) -> bytes:
    """Horizontal bars per objective: {objective: {param: importance}}."""

    n = max(1, len(importances))
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 3.2), squeeze=False)
    for ax, (label, values) in zip(axes[0], importances.items()):
        names = list(values)[::-1]
        ax.barh(names, [values[k] for k in names], color="#1f77b4")
        ax.set_title(label, fontsize=9)
        ax.set_xlim(0, 1)
        ax.tick_params(labelsize=8)
    fig.suptitle("Which knobs mattered (PED-ANOVA importance)")
    return _png(fig)


def startup_png(records: Sequence[TrialRecord]) -> bytes | None:
    """One horizontal bar per trial whose server was started: seconds by startup phase
    (tuner.vllm.startup), stacked, the compile-cache outcome beside it; None when no trial
    has a startup record."""

    rows = [(r.number, rec) for r in sorted(records, key=lambda r: r.number)
            if r.kind == "run" and (rec := r.startup_record) is not None and rec.phases]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(8, 0.9 + 0.32 * len(rows)))
    colours = plt.get_cmap("tab10")
    for i, (_number, rec) in enumerate(rows):
        left = 0.0
        for j, phase in enumerate(PHASES):
            width = float(rec.phases.get(phase) or 0.0)
            if width > 0:
                ax.barh(i, width, left=left, color=colours(j), label=PHASE_LABELS[phase] if i == 0 else None)
                left += width
        note = "" if rec.complete else " never ready"
        if rec.compile_cache not in (None, "none"):
            note = f" compile cache {rec.compile_cache}" + note
        ax.text(left, i, f" {left:.0f}s{note}", va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), [f"trial {number}" for number, _ in rows])
    ax.invert_yaxis()
    ax.set_xlabel("seconds from spawn (log timestamps: 1 s resolution)")
    ax.set_title("Server startup by phase")
    handles, labels = [], []
    for j, phase in enumerate(PHASES):
        handles.append(plt.Rectangle((0, 0), 1, 1, color=colours(j)))
        labels.append(PHASE_LABELS[phase])
    ax.legend(handles, labels, fontsize=7, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.25 - 0.5 / len(rows)))
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)


def workload_png(profile: Mapping[str, Any]) -> bytes:
    """Histograms of prompt and output tokens per request, from a workload profile's
    (tuner.load.workload_profile) bins, with p50 and p90 marked."""

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    for ax, key, title in zip(axes, ("prompt_tokens", "output_tokens"), ("prompt tokens", "output tokens")):
        dist = profile[key]
        edges, counts = dist["edges"], dist["counts"]
        ax.bar(edges[:-1], counts, width=[b - a for a, b in zip(edges, edges[1:])], align="edge",
               color="#1f77b4", edgecolor="white", lw=0.5)
        for q, style in (("p50", "-"), ("p90", "--")):
            ax.axvline(dist[q], color="#d62728", ls=style, lw=1, label=f"{q} {dist[q]:g}")
        ax.set_xlabel(f"{title} per request")
        ax.set_ylabel("requests")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle(f"Workload: {profile['requests']:,} requests ({profile['length_method']})", fontsize=10)
    return _png(fig)


def arrivals_png(trace: Mapping[str, Any]) -> bytes:
    """A timed trace's arrival rate over time: requests/s per bucket, the mean as a line."""

    fig, ax = plt.subplots(figsize=(9, 3))
    bucket, rates = float(trace["bucket_s"]), trace["rates"]
    edges = [i * bucket for i in range(len(rates))] + [max(float(trace["duration_s"]), (len(rates) - 1) * bucket)]
    ax.step(edges, [*rates, rates[-1]], where="post", c="#1f77b4",
            label=f"requests/s per {bucket:g} s")
    if trace.get("mean_rate") is not None:
        ax.axhline(trace["mean_rate"], color="#2ca02c", ls="--", lw=1, label=f"mean {trace['mean_rate']:.2f} req/s")
    ax.set_xlabel("seconds from the trace's first request")
    ax.set_ylabel("requests/s")
    ax.set_ylim(bottom=0)
    ax.set_title(f"Trace arrivals: {trace['requests']:,} requests over {float(trace['duration_s']):,.0f} s")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return _png(fig)


def quality_png(records: Sequence[TrialRecord], labels: Sequence[str], directions: Sequence[str]) -> bytes | None:
    """The study's first throughput objective (y) against the accuracy drop in points (x) with
    its interval as error bars, the budget as a vertical line: lossless trials at no drop,
    a failed gate marked apart (at the bottom when its speed was never measured); None when
    no trial has a quality record."""

    runs = [r for r in records if r.kind == KIND_RUN]
    gated = [(r, r.summary.quality) for r in runs if r.summary.quality is not None]
    if not gated:
        return None
    speed = speed_label(labels, directions) or labels[0]
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    lossless = [r for r in runs if r.summary.quality is None and r.feasible and speed in r.measured_values()]
    if lossless:
        ax.scatter([0.0] * len(lossless), [r.values[speed] for r in lossless], marker="o", c="#7f7f7f",
                   s=30, alpha=0.7, label=f"lossless ({len(lossless)})", zorder=2)
        for r in lossless:
            ax.annotate(f"#{r.number}", (0.0, r.values[speed]), textcoords="offset points", xytext=(-18, -3),
                        fontsize=7, color="#555")
    for verdict, marker, colour, legend in (("pass", "o", "#1f77b4", "inside the budget"),
                                            ("fail", "X", "#b71c1c", "quality budget missed")):
        group = [(r, q) for r, q in gated if q.verdict == verdict]
        for i, (r, q) in enumerate(group):
            measured = r.measured_values().get(speed)
            x, y = 100 * q.drop, 0.0 if measured is None else measured
            ax.errorbar([x], [y], xerr=[[x - 100 * q.drop_low], [100 * q.drop_high - x]], fmt=marker,
                        color=colour, ms=8, capsize=4, zorder=3, label=f"{legend} ({len(group)})" if i == 0 else None)
            ax.annotate(f"#{r.number}" + (" (speed not measured)" if measured is None else ""), (x, y),
                        textcoords="offset points", xytext=(6, 4), fontsize=8)
    baseline = next((r for r in lossless if r.is_baseline), None)
    if baseline is not None:
        ax.scatter([0.0], [baseline.values[speed]], marker="D", s=80, facecolors="none", edgecolors="black",
                   lw=1.5, label="baseline (reference)", zorder=4)
    for budget in sorted({q.budget for _, q in gated}):
        ax.axvline(100 * budget, color="#d62728", ls="--", lw=1.2, label=f"budget {100 * budget:.1f} pts")
    ax.axvline(0.0, color="#555", lw=0.6)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("accuracy drop against the reference, points (interval as error bars)")
    ax.set_ylabel(speed + " (higher is better)")
    ax.set_title("Speed against accuracy drop")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return _png(fig)


def _bars(cis: Sequence[float | None]) -> list[float] | None:
    """Error bar half-widths, 0 where a level has none; None (no bars) when none has one."""

    return None if all(ci is None for ci in cis) else [ci or 0.0 for ci in cis]


def _curve_style(curve: Curve, i: int) -> dict[str, Any]:
    """The baseline black and dashed with diamonds, the front's trials in the tab10 colours."""

    if curve.baseline:
        return {"color": "black", "ls": "--", "marker": "D", "mfc": "none"}
    return {"color": plt.get_cmap("tab10")(i % 10), "ls": "-", "marker": "o"}


def serving_curve_png(curves: ServingCurves) -> bytes | None:
    """Throughput per GPU (y; per server on a CPU study) against output tokens/s per user (x),
    one line per configuration through its levels by concurrency, each point marked ``c=N``,
    the levels' 95 % intervals as error bars; None when no configuration has a point."""

    drawn = curves.drawn
    if not drawn:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for i, curve in enumerate(drawn):
        pts = curve.points
        ax.errorbar([p.per_user for p in pts], [p.throughput for p in pts],
                    xerr=_bars([p.per_user_ci for p in pts]), yerr=_bars([p.throughput_ci for p in pts]),
                    capsize=3, lw=1.5, ms=6, label=curve.name, zorder=3, **_curve_style(curve, i))
        for p in pts:
            ax.annotate(f"c={p.concurrency}", (p.per_user, p.throughput), textcoords="offset points",
                        xytext=(6, 4), fontsize=8)
    if curves.left_out:
        ax.text(0.99, 0.01, f"{curves.left_out} level(s) left out (not measured, see the caption)",
                transform=ax.transAxes, ha="right", va="bottom", fontsize=8, color="#555")
    ax.set_xlabel(f"output tokens/s per user ({PER_USER}; higher: faster for each user)")
    ax.set_ylabel(throughput_axis(curves.gpus))
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.set_title("Serving curve: throughput against speed per user")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return _png(fig)


def energy_png(curves: ServingCurves) -> bytes | None:
    """Joules per output token (y, logarithmic when the figures span 10x or more) against
    concurrency (x, log 2 when the levels span 4x or more), one line per configuration with
    its levels' 95 % intervals; None when no level of the drawn configurations measured
    energy."""

    measured = curves.with_energy
    if not measured:
        return None
    log_y = curves.energy_spans_decades
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for i, curve in enumerate(measured):
        pts = curve.energy
        bars = _bars([p.ci for p in pts])
        yerr: list[float] | list[list[float]] | None = bars
        if bars is not None and log_y:
            # A lower bar at or past zero has no place on a log axis: it stops at a tenth of the value.
            yerr = [[min(b, 0.9 * p.joules_per_token) for b, p in zip(bars, pts, strict=True)], bars]
        ax.errorbar([p.concurrency for p in pts], [p.joules_per_token for p in pts],
                    yerr=yerr, capsize=3, lw=1.5, ms=6, label=curve.name, zorder=3, **_curve_style(curve, i))
    levels = sorted({p.concurrency for c in measured for p in c.energy})
    if levels[0] > 0 and levels[-1] >= 4 * levels[0]:
        ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(c) for c in levels])
    ax.set_xlabel("concurrency (requests in flight)")
    if log_y:
        ax.set_yscale("log")
        ax.set_ylabel("joules per output token (log; lower is better)")
    else:
        ax.set_ylabel("joules per output token (lower is better)")
        ax.set_ylim(bottom=0)
    ax.set_title("Energy per token against concurrency")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return _png(fig)


def serving_figures(curves: ServingCurves) -> dict[str, bytes]:
    """The serving curve and the energy figure by file name, each where it has something to draw."""

    drawn = {SERVING_FIGURE: serving_curve_png(curves), ENERGY_FIGURE: energy_png(curves)}
    return {name: figure for name, figure in drawn.items() if figure is not None}
