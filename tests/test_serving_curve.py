"""The serving curve in the report (issue 40, part 5): throughput per GPU (per server on a CPU
study) against output tokens/s per user, for the front's configurations and the baseline,
across their measured concurrency levels; and energy per token against concurrency only
where the levels measured ``joules_per_token``.

The study is the committed CPU example (tests.conftest.copy_cpu_example) read from its trial
files: its front is trial 4 (eager float32, n-gram k=4 lookup 3-3), its baseline trial 0
(eager float32), both measured at c=1 and c=4; trial 5 stopped early after c=1 and trial 1
was not applied, so neither is drawn. Edits to the trials' stored outcomes (energy added,
the per-user metric removed) are made as the engine would store them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna

from tests.conftest import CPU_EXAMPLE, copy_cpu_example, rebuilt_study
from tuner.store.folder import FolderStudyHandle, open_for_reading
from tuner.store.records import read_records
from tuner.study.trials import TrialRecord
from tuner.views.plots import energy_png, serving_curve_png
from tuner.views.report import write_report
from tuner.views.serving_curve import (
    ENERGY_FIGURE,
    SERVING_FIGURE,
    CurvePoint,
    EnergyPoint,
    select_curves,
    serving_html,
    serving_md,
    throughput_axis,
)

PNG = b"\x89PNG\r\n\x1a\n"
LABELS, DIRECTIONS = ["output_tok_s@cmax", "tpot_ms.mean@c1"], ["maximize", "minimize"]

# The example's records (trials/000N/outcome.json, levels "1" and "4"): output_tok_s and
# output_tok_s_per_user, no intervals (the study ran one window per level).
TRIAL_4 = (CurvePoint(1, 31.06187036165144, None, 29.84833714682283, None),
           CurvePoint(4, 57.16589669304146, None, 17.2472116670732, None))
BASELINE_0 = (CurvePoint(1, 18.709465790260182, None, 18.66353759702962, None),
              CurvePoint(4, 49.94710437759078, None, 12.411629313793576, None))
# Energy the edits put into the levels (joules per output token, 95 % half-width).
JOULES = {0: {"1": (2.5, 0.1), "4": (1.25, 0.05)}, 4: {"1": (1.8, None), "4": (0.9, 0.04)}}

Edit = Callable[[int, dict[str, Any]], dict[str, Any]]


class _Edited(FolderStudyHandle):
    """The example study read from its files, each trial's stored outcome passed through ``edit``."""

    edit: Edit | None = None

    def load(self) -> optuna.Study:
        def edit(number: int, attrs: dict[str, Any], constraints: dict[str, float]) -> None:
            if self.edit is not None and isinstance(attrs.get("outcome"), dict):
                attrs["outcome"] = self.edit(number, attrs["outcome"])

        return rebuilt_study(super().load(), self.name, edit)


def _handle(tmp_path: Path, edit: Edit | None) -> _Edited:
    root = copy_cpu_example(tmp_path)
    folder = open_for_reading(root, CPU_EXAMPLE.name, storage_url=None)
    made = _Edited(name=folder.name, paths=folder.paths, storage_url=folder.storage_url, spec=folder.spec)
    made.edit = edit
    return made


def _with_levels(change: Callable[[int, str, dict[str, Any]], dict[str, Any]]) -> Edit:
    def edit(number: int, outcome: dict[str, Any]) -> dict[str, Any]:
        levels = {c: change(number, c, dict(level)) for c, level in (outcome.get("levels") or {}).items()}
        return {**outcome, "levels": levels}
    return edit


def _add_energy(number: int, concurrency: str, level: dict[str, Any]) -> dict[str, Any]:
    joules, ci = JOULES.get(number, {}).get(concurrency, (None, None))
    if joules is not None:
        level["joules_per_token"] = joules
        if ci is not None:
            level["joules_per_token.ci95"] = ci
    return level


def _no_per_user(number: int, concurrency: str, level: dict[str, Any]) -> dict[str, Any]:
    level.pop("output_tok_s_per_user", None)
    return level


def _records(handle: _Edited) -> list[TrialRecord]:
    return read_records(handle.load())


def test_the_report_draws_the_serving_curve_of_the_example(tmp_path: Path) -> None:
    out = tmp_path / "report"
    paths = write_report(_handle(tmp_path, None), out)
    figure = paths[SERVING_FIGURE].read_bytes()
    assert figure[:8] == PNG and len(figure) > 10_000
    # No level of the example measured energy: no energy figure, no energy caption.
    assert ENERGY_FIGURE not in paths and not (out / ENERGY_FIGURE).exists()
    page = paths["report.html"].read_text()
    section = page[page.index("<h2>Serving curve</h2>"):]
    section = section[:section.index("</div>")]
    assert f'<img alt="{SERVING_FIGURE}" src="data:image/png;base64,' in section
    assert "Throughput per server (the study holds no GPUs" in section
    assert "(trial 4, trial 0 (baseline))" in section
    assert "batches more gives more tokens per server but fewer to each user" in section
    assert "No measured level was left out." in section and "Energy per output token" not in section
    markdown = paths["report.md"].read_text()
    assert f"## Serving curve\n\n![serving curve: throughput against tokens per second per user]({SERVING_FIGURE})" \
           in markdown
    assert "No measured level was left out." in markdown and ENERGY_FIGURE not in markdown


def test_the_selection_is_the_front_and_the_baseline_with_their_measured_levels(tmp_path: Path) -> None:
    records = _records(_handle(tmp_path, None))
    curves = select_curves(records, LABELS, DIRECTIONS, gpus=0)
    assert [(c.number, c.baseline) for c in curves.curves] == [(4, False), (0, True)]
    by_number = {c.number: c for c in curves.curves}
    assert by_number[4].points == TRIAL_4
    assert by_number[0].points == BASELINE_0
    assert all(not c.energy for c in curves.curves)
    assert curves.left_out == 0 and curves.infeasible_baseline is None
    # Trial 5 (stopped early after c=1), 6 and 2 (behind the front) and 1 (not applied): not drawn.
    assert {c.number for c in curves.drawn} == {0, 4}
    # Per GPU: each level's throughput over the GPUs a trial held; the interval scales with it.
    two = select_curves(records, LABELS, DIRECTIONS, gpus=2)
    assert [p.throughput for p in two.curves[0].points] == [31.06187036165144 / 2, 57.16589669304146 / 2]
    assert [p.per_user for p in two.curves[0].points] == [29.84833714682283, 17.2472116670732]
    assert throughput_axis(2) == "output tokens/s per GPU (2 GPUs per trial)"
    assert throughput_axis(0) == "output tokens/s per server (a CPU study: no GPUs)"


def _run(number: int, levels: dict[str, dict[str, Any]], *, values: tuple[float, float], baseline: bool = False,
         constraints: dict[str, float] | None = None, early_stop: dict[str, Any] | None = None) -> TrialRecord:
    outcome: dict[str, Any] = {"version": 2, "levels": levels}
    if early_stop is not None:
        outcome["early_stop"] = early_stop
    return TrialRecord(number=number, state="COMPLETE", kind="run", params={}, values=dict(zip(LABELS, values)),
                       constraints=constraints or {}, attrs={"outcome": outcome, "baseline": baseline})


def test_bounds_missing_metrics_and_an_infeasible_baseline_are_left_out_and_counted() -> None:
    full = {"output_tok_s": 800.0, "output_tok_s.ci95": 40.0, "output_tok_s_per_user": 50.0,
            "output_tok_s_per_user.ci95": 2.0}
    front = _run(3, {"1": {"output_tok_s": 100.0, "output_tok_s_per_user": 100.0},
                     "16": full,
                     "32": {"output_tok_s": 900.0, "output_tok_s_per_user": float("nan")},   # not measured
                     "64": {"output_tok_s": 950.0}},                                     # older record
                 values=(800.0, 10.0))
    # Feasible, but its early stop skipped c=8 and stopped inside c=16: bounds, not points.
    stopped = _run(7, {"1": {"output_tok_s": 90.0, "output_tok_s_per_user": 90.0},
                       "16": {"output_tok_s": 700.0}},
                   values=(1000.0, 11.0), early_stop={"reason": "dominated_inside", "after": "inside c16",
                                                      "bounds": [1000.0, 11.0], "skipped_levels": [16, 8]})
    baseline = _run(0, {"1": full, "4": full}, values=(500.0, 9.0), baseline=True,
                    constraints={"limit:ttft_ms.p90@c4": 3.0}, )
    curves = select_curves([front, stopped, baseline], LABELS, DIRECTIONS, gpus=8)
    assert [c.number for c in curves.curves] == [7, 3]
    assert curves.curves[1].points == (CurvePoint(1, 12.5, None, 100.0, None), CurvePoint(16, 100.0, 5.0, 50.0, 2.0))
    assert curves.curves[0].points == (CurvePoint(1, 90.0 / 8, None, 90.0, None),)
    assert (curves.stopped_early, curves.without_metrics, curves.infeasible_levels) == (2, 2, 2)
    assert curves.infeasible_baseline is baseline and curves.left_out == 6
    html_text = serving_html(curves, {SERVING_FIGURE: "<img>"})
    assert ("6 points left out: 2 stopped early, not measured in full (their values are bounds); 2 without "
            "output_tok_s or output_tok_s_per_user; 2 of the baseline (trial 0: limit_missed, not feasible).") \
        in html_text
    assert "per GPU (each level&#x27;s output tok/s divided by the GPUs a trial held)" in html_text
    figure = serving_curve_png(curves)
    assert figure is not None and figure[:8] == PNG


def test_a_front_without_the_per_user_metric_has_no_figure_and_no_section(tmp_path: Path) -> None:
    handle = _handle(tmp_path, _with_levels(_no_per_user))
    curves = select_curves(_records(handle), LABELS, DIRECTIONS, gpus=0)
    assert not curves.drawn and curves.without_metrics == 4
    assert serving_curve_png(curves) is None and energy_png(curves) is None
    assert serving_html(curves, {}) == "" and serving_md(curves, set()) == []
    paths = write_report(handle, tmp_path / "report")
    assert SERVING_FIGURE not in paths and ENERGY_FIGURE not in paths
    assert not (tmp_path / "report" / SERVING_FIGURE).exists()
    assert "Serving curve" not in paths["report.html"].read_text()
    assert "Serving curve" not in paths["report.md"].read_text()


def test_the_energy_figure_only_where_levels_carry_joules_per_token(tmp_path: Path) -> None:
    handle = _handle(tmp_path, _with_levels(_add_energy))
    curves = select_curves(_records(handle), LABELS, DIRECTIONS, gpus=0)
    by_number = {c.number: c for c in curves.curves}
    assert by_number[4].energy == (EnergyPoint(1, 1.8, None), EnergyPoint(4, 0.9, 0.04))
    assert by_number[0].energy == (EnergyPoint(1, 2.5, 0.1), EnergyPoint(4, 1.25, 0.05))
    # Energy changes nothing on the serving curve.
    assert by_number[4].points == TRIAL_4 and by_number[0].points == BASELINE_0
    out = tmp_path / "report"
    paths = write_report(handle, out)
    energy = paths[ENERGY_FIGURE].read_bytes()
    assert energy[:8] == PNG and len(energy) > 10_000 and SERVING_FIGURE in paths
    page = paths["report.html"].read_text()
    section = page[page.index("<h2>Serving curve</h2>"):]
    section = section[:section.index("</div>")]
    assert f'<img alt="{ENERGY_FIGURE}" src="data:image/png;base64,' in section
    assert "Energy per output token (joules_per_token, joules" in section
    assert "for the levels that measured it (trial 4, trial 0 (baseline))" in section
    markdown = paths["report.md"].read_text()
    assert f"![energy per token against concurrency]({ENERGY_FIGURE})" in markdown


def test_energy_on_one_trial_only_draws_that_trial() -> None:
    with_energy = _run(3, {"1": {"output_tok_s": 10.0, "output_tok_s_per_user": 10.0, "joules_per_token": 3.0},
                           "8": {"output_tok_s": 60.0, "output_tok_s_per_user": 7.5, "joules_per_token": "n/a"}},
                       values=(60.0, 100.0))
    without = _run(0, {"1": {"output_tok_s": 9.0, "output_tok_s_per_user": 9.0}}, values=(9.0, 111.0), baseline=True)
    curves = select_curves([with_energy, without], LABELS, DIRECTIONS, gpus=1)
    assert [c.number for c in curves.with_energy] == [3]
    assert curves.with_energy[0].energy == (EnergyPoint(1, 3.0, None),)   # a non-number is no measurement
    figure = energy_png(curves)
    assert figure is not None and figure[:8] == PNG
    md = serving_md(curves, {SERVING_FIGURE, ENERGY_FIGURE})
    assert md[:3] == ["", "## Serving curve", ""] and md[-1].endswith("for the levels that measured it (trial 3); "
                                                                       "error bars the 95 % intervals where the "
                                                                       "level has one.")
    assert select_curves([without], LABELS, DIRECTIONS, gpus=1).with_energy == ()


def test_energy_spanning_ten_times_goes_on_a_log_axis() -> None:
    # c=1 on a GPU spends the idle draw on a handful of tokens: 10 J against 0.4 J at c=32.
    spread = _run(3, {"1": {"output_tok_s": 70.0, "output_tok_s_per_user": 70.0, "joules_per_token": 9.7,
                            "joules_per_token.ci95": 12.0},
                      "32": {"output_tok_s": 1300.0, "output_tok_s_per_user": 40.0, "joules_per_token": 0.43}},
                  values=(1300.0, 100.0))
    curves = select_curves([spread], LABELS, DIRECTIONS, gpus=1)
    assert curves.energy_spans_decades
    assert serving_md(curves, {ENERGY_FIGURE})[-1].endswith("the energy axis is logarithmic (the figures span "
                                                            "10x or more).")
    figure = energy_png(curves)            # the bar past zero is cut, not an error on a log axis
    assert figure is not None and figure[:8] == PNG
    close = _run(4, {"1": {"output_tok_s": 70.0, "output_tok_s_per_user": 70.0, "joules_per_token": 3.9},
                     "32": {"output_tok_s": 1300.0, "output_tok_s_per_user": 40.0, "joules_per_token": 0.43}},
                 values=(1300.0, 100.0))
    assert not select_curves([close], LABELS, DIRECTIONS, gpus=1).energy_spans_decades
