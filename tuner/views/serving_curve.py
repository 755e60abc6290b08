"""The serving curve in the report: for the front's configurations and the baseline,
throughput per GPU against tokens per second per user across the measured concurrency
levels, one line per configuration; and energy per output token against concurrency where
the levels measured it (``joules_per_token``).

Pure: which trials and which of their levels are drawn (``select_curves``) and the section's
text. The figures are ``tuner.views.plots.serving_curve_png`` and ``energy_png``.

A configuration that batches more serves more tokens per GPU but fewer to each user; the
curve shows that trade across the levels a trial measured, where the front's two numbers
show only the objectives' levels. A point is a concurrency level of a feasible trial's
sweep with both metrics measured: a level an early stop skipped or stopped inside is a
bound, not a measurement, and is left out, as is a level without the metrics (an older
record, a stop that measured only the throughput) and every level of a baseline that was
not feasible; the caption counts them.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tuner.study.trials import KIND_RUN, TrialRecord, front_records

__all__ = ["SERVING_FIGURE", "ENERGY_FIGURE", "CURVE_FIGURES", "THROUGHPUT", "PER_USER", "ENERGY", "CurvePoint",
           "EnergyPoint", "Curve", "ServingCurves", "select_curves", "throughput_axis", "serving_html", "serving_md"]

SERVING_FIGURE = "serving_curve.png"
ENERGY_FIGURE = "energy_per_token.png"
CURVE_FIGURES = (SERVING_FIGURE, ENERGY_FIGURE)
# The level metrics drawn (tuner.load.metrics); each may carry ``<key>.ci95``.
THROUGHPUT = "output_tok_s"
PER_USER = "output_tok_s_per_user"
ENERGY = "joules_per_token"


@dataclass(frozen=True, slots=True)
class CurvePoint:
    """One level of a configuration on the serving curve. ``throughput`` is per GPU (the
    level's output tok/s over the GPUs the trial held), per server on a study without GPUs;
    the intervals are 95 % half-widths, None where the level has none."""

    concurrency: int
    throughput: float
    throughput_ci: float | None
    per_user: float
    per_user_ci: float | None


@dataclass(frozen=True, slots=True)
class EnergyPoint:
    """One level's joules per output token (the trial's GPUs together) with its 95 % half-width."""

    concurrency: int
    joules_per_token: float
    ci: float | None


@dataclass(frozen=True, slots=True)
class Curve:
    """A configuration's points by concurrency (lowest first)."""

    number: int
    baseline: bool
    points: tuple[CurvePoint, ...]
    energy: tuple[EnergyPoint, ...]

    @property
    def name(self) -> str:
        return f"trial {self.number}" + (" (baseline)" if self.baseline else "")


@dataclass(frozen=True, slots=True)
class ServingCurves:
    """What the serving-curve section draws and what it left out."""

    gpus: int                      # GPUs a trial held (server.gpus_per_trial); 0: per server
    curves: tuple[Curve, ...]      # the front's trials in front order, then the baseline
    stopped_early: int             # levels an early stop skipped or stopped inside (bounds)
    without_metrics: int           # levels missing output_tok_s or output_tok_s_per_user
    infeasible_baseline: TrialRecord | None  # a completed baseline that was not feasible: not drawn
    infeasible_levels: int         # that baseline's levels

    @property
    def drawn(self) -> tuple[Curve, ...]:
        """The curves with at least one point on the serving curve."""

        return tuple(c for c in self.curves if c.points)

    @property
    def with_energy(self) -> tuple[Curve, ...]:
        """The curves with at least one level that measured energy per token."""

        return tuple(c for c in self.curves if c.energy)

    @property
    def left_out(self) -> int:
        return self.stopped_early + self.without_metrics + self.infeasible_levels

    @property
    def energy_spans_decades(self) -> bool:
        """Whether the energy figures span 10x or more (c=1 against a full batch does on a
        GPU: the idle draw over a handful of tokens), so the energy axis is logarithmic
        and the full batch's points are not flattened onto zero."""

        values = [p.joules_per_token for c in self.with_energy for p in c.energy]
        return bool(values) and min(values) > 0 and max(values) >= 10 * min(values)


def _number(value: object) -> float | None:
    """A finite metric value; None for a missing, non-numeric or non-finite one."""

    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _ci(level: Mapping[str, object], key: str, scale: float = 1.0) -> float | None:
    ci = _number(level.get(f"{key}.ci95"))
    return None if ci is None or ci < 0 else ci / scale


def _skipped(record: TrialRecord) -> set[int]:
    """The levels an early stop skipped or stopped inside: never measured in full."""

    stop = record.summary.early_stop or {}
    return {int(c) for c in stop.get("skipped_levels") or [] if str(c).isdigit()}


def _concurrency_levels(record: TrialRecord) -> dict[int, Mapping[str, object]]:
    return {int(key): level for key, level in record.summary.levels.items() if str(key).isdigit()}


def _curve(record: TrialRecord, gpus: int) -> tuple[Curve, int, int]:
    """The trial's curve, with how many of its levels were stopped early and how many lacked
    the metrics."""

    skipped = _skipped(record)
    levels = _concurrency_levels(record)
    points, energy = [], []
    without = 0
    for concurrency in sorted(set(levels) - skipped):
        level = levels[concurrency]
        throughput, per_user = _number(level.get(THROUGHPUT)), _number(level.get(PER_USER))
        if throughput is None or per_user is None:
            without += 1
        else:
            scale = float(gpus) if gpus > 0 else 1.0
            points.append(CurvePoint(concurrency, throughput / scale, _ci(level, THROUGHPUT, scale),
                                     per_user, _ci(level, PER_USER)))
        joules = _number(level.get(ENERGY))
        if joules is not None:
            energy.append(EnergyPoint(concurrency, joules, _ci(level, ENERGY)))
    return (Curve(record.number, record.is_baseline, tuple(points), tuple(energy)), len(skipped), without)


def select_curves(records: Sequence[TrialRecord], labels: list[str], directions: list[str],
                  gpus: int) -> ServingCurves:
    """The front's trials (in front order) and the study's completed baseline, each with its
    measured levels' points; ``gpus``: ``server.gpus_per_trial`` (0: a CPU study, per server)."""

    chosen = list(front_records(list(records), labels, directions))
    baseline = next((r for r in records if r.kind == KIND_RUN and r.is_baseline and r.state == "COMPLETE"), None)
    infeasible, infeasible_levels = None, 0
    if baseline is not None and all(r.number != baseline.number for r in chosen):
        if baseline.feasible:
            chosen.append(baseline)
        else:
            infeasible = baseline
            infeasible_levels = len(set(_concurrency_levels(baseline)) | _skipped(baseline))
    curves, stopped, without = [], 0, 0
    for record in chosen:
        curve, skipped, missing = _curve(record, gpus)
        curves.append(curve)
        stopped += skipped
        without += missing
    return ServingCurves(gpus=gpus, curves=tuple(curves), stopped_early=stopped, without_metrics=without,
                         infeasible_baseline=infeasible, infeasible_levels=infeasible_levels)


def throughput_axis(gpus: int) -> str:
    """The serving curve's throughput axis label."""

    if gpus > 0:
        return f"output tokens/s per GPU ({gpus} GPU{'s' if gpus != 1 else ''} per trial)"
    return "output tokens/s per server (a CPU study: no GPUs)"


def _left_out_text(curves: ServingCurves) -> str:
    if not curves.left_out:
        return "No measured level was left out."
    parts = []
    if curves.stopped_early:
        parts.append(f"{curves.stopped_early} stopped early, not measured in full (their values are bounds)")
    if curves.without_metrics:
        parts.append(f"{curves.without_metrics} without {THROUGHPUT} or {PER_USER}")
    if curves.infeasible_baseline is not None:
        parts.append(f"{curves.infeasible_levels} of the baseline (trial {curves.infeasible_baseline.number}: "
                     f"{curves.infeasible_baseline.outcome}, not feasible)")
    return f"{curves.left_out} point{'s' if curves.left_out != 1 else ''} left out: " + "; ".join(parts) + "."


def _caption(curves: ServingCurves) -> str:
    per = "per GPU (each level's output tok/s divided by the GPUs a trial held)" if curves.gpus > 0 else (
        "per server (the study holds no GPUs, so each level's output tok/s as measured)")
    names = ", ".join(c.name for c in curves.drawn)
    unit = "GPU" if curves.gpus > 0 else "server"
    return (f"Throughput {per} against the output tokens per second each user sees ({PER_USER}), across the "
            f"concurrency levels each configuration measured: one line per configuration ({names}), each point "
            "marked with its concurrency, error bars the 95 % intervals where the level has one. A configuration "
            f"that batches more gives more tokens per {unit} but fewer to each user, so the curve, not one level's "
            "number, shows which configuration serves best at the per-user speed you need. "
            + _left_out_text(curves))


def _energy_caption(curves: ServingCurves) -> str:
    names = ", ".join(c.name for c in curves.with_energy)
    return (f"Energy per output token ({ENERGY}, joules: the trial's GPUs together over the level's steady window) "
            f"against concurrency, for the levels that measured it ({names}); error bars the 95 % intervals "
            "where the level has one" + ("; the energy axis is logarithmic (the figures span 10x or more)."
                                         if curves.energy_spans_decades else "."))


def serving_html(curves: ServingCurves, figures: Mapping[str, str]) -> str:
    """The report's serving-curve section (``figures``: each drawn figure's <img> tag by file
    name); empty when neither figure was drawn."""

    parts = []
    if SERVING_FIGURE in figures and curves.drawn:
        parts.append(f"{figures[SERVING_FIGURE]}<p>{html.escape(_caption(curves))}</p>")
    if ENERGY_FIGURE in figures and curves.with_energy:
        parts.append(f"{figures[ENERGY_FIGURE]}<p>{html.escape(_energy_caption(curves))}</p>")
    if not parts:
        return ""
    return '<h2>Serving curve</h2><div id="serving-curve">' + "".join(parts) + "</div>"


def serving_md(curves: ServingCurves, shown_figures: set[str] | frozenset[str]) -> list[str]:
    """The serving-curve section of report.md; no lines when neither figure was written."""

    md: list[str] = []
    if SERVING_FIGURE in shown_figures and curves.drawn:
        md += [f"![serving curve: throughput against tokens per second per user]({SERVING_FIGURE})", "",
               _caption(curves), ""]
    if ENERGY_FIGURE in shown_figures and curves.with_energy:
        md += [f"![energy per token against concurrency]({ENERGY_FIGURE})", "", _energy_caption(curves), ""]
    return ["", "## Serving curve", "", *md[:-1]] if md else []
