"""The quality budget in the views: report (HTML, Markdown, the speed-vs-quality figure),
the export header in every format, pareto.json's front entries, and a damaged record.

The study is the committed CPU example (tests.conftest.copy_cpu_example) read from its trial
files, with the quality gate's records put into the trials' stored outcomes as the engine
stores them (``outcome.quality`` = ``QualityRecord.model_dump(mode="json")``): trial 0 the
lossless baseline, trial 4 (the front's point) a lossy trial inside the budget, trial 6 a
lossy trial that missed it (``quality_failed``), trial 2 an outcome whose record is damaged.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml

from tests.conftest import CPU_EXAMPLE, copy_cpu_example, rebuilt_study
from tuner.probe.quality_stats import QualityRecord
from tuner.store.folder import FolderStudyHandle, open_for_reading
from tuner.store.records import read_records
from tuner.study.outcome_summary import OutcomeSummary
from tuner.study.scoring import pareto_payload
from tuner.study.trials import TrialRecord
from tuner.views.export import render_export
from tuner.views.export_formats import FORMATS
from tuner.views.plots import quality_png
from tuner.views.quality_view import quality_html, quality_md
from tuner.views.report import write_report

PNG = b"\x89PNG\r\n\x1a\n"
KV = {"kv_cache_dtype": {"value": "fp8", "reason": "an fp8 KV cache stores keys and values in 8 bits"}}


def _record(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = dict(
        items=400, reference_accuracy=0.62, trial_accuracy=0.612, drop=0.008, drop_low=-0.004, drop_high=0.021,
        confidence=0.95, budget=0.03, verdict="pass", decided_at_cap=False, looks=2, probe_s=41.5, lossy=KV)
    base.update(over)
    return QualityRecord.model_validate(base).model_dump(mode="json")


PASSED = _record()
FAILED = _record(items=800, trial_accuracy=0.55, drop=0.07, drop_low=0.041, drop_high=0.099, verdict="fail",
                 looks=3, lossy={"quantization": {"value": "fp8", "reason": "fp8 quantizes the weights"}})
# Drop outside its own interval and a string where a number goes: not a record.
DAMAGED = {"drop": "lots", "items": -3}


class _Handle(FolderStudyHandle):
    """The example study read from its files, with the trials' stored attributes edited."""

    edits: dict[int, dict[str, Any]] = {}

    def load(self) -> optuna.Study:
        def edit(number: int, attrs: dict[str, Any], constraints: dict[str, float]) -> None:
            change = self.edits.get(number, {})
            if "quality" in change:
                attrs["outcome"] = {**attrs["outcome"], "quality": change["quality"]}
            if change.get("verdict"):
                attrs["verdict"] = change["verdict"]
                constraints["quality"] = 1.0

        return rebuilt_study(super().load(), self.name, edit)


EDITS = {4: {"quality": PASSED}, 6: {"quality": FAILED, "verdict": "quality_failed"}, 2: {"quality": DAMAGED}}


@pytest.fixture
def handle(tmp_path: Path) -> _Handle:
    root = copy_cpu_example(tmp_path)
    folder = open_for_reading(root, CPU_EXAMPLE.name, storage_url=None)
    made = _Handle(name=folder.name, paths=folder.paths, storage_url=folder.storage_url, spec=folder.spec)
    made.edits = EDITS
    return made


def _records(handle: _Handle) -> tuple[list[TrialRecord], list[str], list[str]]:
    study = handle.load()
    return (read_records(study), list(study.metric_names or []), [d.name.lower() for d in study.directions])


def test_the_stored_summary_reads_a_record_and_leaves_out_a_damaged_one() -> None:
    summary = OutcomeSummary.from_attr({"version": 2, "quality": PASSED})
    assert summary.quality is not None and summary.quality.drop == pytest.approx(0.008)
    assert summary.as_attr()["quality"] == PASSED
    assert OutcomeSummary.from_attr(summary.as_attr()) == summary
    for bad in (DAMAGED, "fp8", 3, [PASSED], {**PASSED, "verdict": "maybe"}):
        assert OutcomeSummary.from_attr({"quality": bad}).quality is None, bad
    # A trial without a record stores no key (its summary is as before quality budgets existed).
    assert OutcomeSummary.from_attr({}).quality is None and "quality" not in OutcomeSummary.from_attr({}).as_attr()


def test_report_shows_the_quality_section_and_its_figure(handle: _Handle, tmp_path: Path) -> None:
    out = tmp_path / "report"
    paths = write_report(handle, out)
    assert paths["quality.png"].read_bytes()[:8] == PNG and paths["quality.png"].stat().st_size > 5000
    page = (out / "report.html").read_text()
    section = page[page.index("<h2>Quality budget</h2>"):]
    section = section[:section.index("</table></div>")]
    assert '<img alt="speed against accuracy drop" src="data:image/png;base64,' in section
    assert '<tr class="feasible"><td>4</td><td>feasible</td><td>kv_cache_dtype=fp8 (an fp8 KV cache stores keys ' \
           'and values in 8 bits)</td><td>62.0%</td><td>61.2%</td><td>0.8 pts [-0.4, 2.1] (95%)</td><td>3.0 pts</td>' \
           '<td>pass</td><td>400 (2)</td><td>57.17</td></tr>' in section
    assert '<tr class="quality_failed"><td>6</td><td>quality_failed</td><td>quantization=fp8 (fp8 quantizes the ' \
           'weights)</td><td>62.0%</td><td>55.0%</td><td>7.0 pts [4.1, 9.9] (95%)</td><td>3.0 pts</td><td>fail</td>' \
           '<td>800 (3)</td><td>56.6</td></tr>' in section
    # The lossless baseline and the trial with a damaged record have no row.
    assert "<td>0</td>" not in section and "<td>2</td>" not in section
    markdown = (out / "report.md").read_text()
    assert "## Quality budget" in markdown and "![speed against accuracy drop](quality.png)" in markdown
    assert "| 4 | feasible | kv_cache_dtype=fp8 (an fp8 KV cache stores keys and values in 8 bits) | 62.0% | 61.2% " \
           "| 0.8 pts [-0.4, 2.1] (95%) | 3.0 pts | pass | 400 (2) | 57.17 |" in markdown
    assert "- trial 6: quality_failed — drop 7.0 pts [4.1, 9.9] (95%), budget 3.0: fail at 800 items" in markdown
    summary = json.loads((out / "report.json").read_text())
    assert summary["quality"] == {"4": PASSED, "6": FAILED}
    assert summary["front"] == [4]
    # The export shown in the report (the knee: trial 4) carries the same line.
    assert "#   lossy: kv_cache_dtype=fp8 (an fp8 KV cache stores keys and values in 8 bits); accuracy drop" in page


def test_a_study_without_quality_records_has_no_section(tmp_path: Path) -> None:
    root = copy_cpu_example(tmp_path)
    paths = write_report(open_for_reading(root, CPU_EXAMPLE.name, storage_url=None), tmp_path / "report")
    assert "quality.png" not in paths
    assert "Quality budget" not in (tmp_path / "report" / "report.html").read_text()
    assert "Quality budget" not in (tmp_path / "report" / "report.md").read_text()


def test_the_figure_places_a_failed_gate_without_speed_and_needs_a_record() -> None:
    labels, directions = ["output_tok_s@cmax", "tpot_ms.mean@c1"], ["maximize", "minimize"]
    unmeasured = TrialRecord(number=3, state="COMPLETE", kind="run", params={}, constraints={"quality": 1.0},
                             attrs={"outcome": {"version": 2, "quality": FAILED}, "verdict": "quality_failed"})
    lossless = TrialRecord(number=0, state="COMPLETE", kind="run", params={}, values={labels[0]: 50.0, labels[1]: 40.0},
                           attrs={"outcome": {"version": 2, "levels": {"1": {"tpot_ms.mean": 40.0},
                                                                       "4": {"output_tok_s": 50.0}}},
                                  "baseline": True})
    figure = quality_png([lossless, unmeasured], labels, directions)
    assert figure is not None and figure[:8] == PNG
    assert quality_png([lossless], labels, directions) is None
    assert quality_html([lossless], labels, directions, "") == "" and quality_md([lossless], labels, directions,
                                                                                 True) == []
    assert "<td>not measured</td>" in quality_html([unmeasured], labels, directions, "")


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_export_names_the_lossy_choices_and_their_drop(handle: _Handle, fmt: str) -> None:
    records, _, _ = _records(handle)
    chosen = next(r for r in records if r.number == 4)
    text = render_export(handle.spec, handle.name, chosen, fmt)
    line = ("lossy: kv_cache_dtype=fp8 (an fp8 KV cache stores keys and values in 8 bits); accuracy drop 0.8 pts "
            "[-0.4, 2.1] (95%) on 400 items, budget 3.0 pts: pass")
    if fmt == "json":
        assert json.loads(text)["quality"] == PASSED     # json has no comments: with its other metadata
    elif fmt == "env":
        assert "lossy" not in text     # an env file carries only the header's first line, as for the values
    else:
        assert f"#   {line}\n" in text
        if fmt == "yaml":
            assert yaml.safe_load(text)   # the comment lines leave the config readable
    lossless = next(r for r in records if r.number == 0)
    assert "lossy" not in render_export(handle.spec, handle.name, lossless, "shell")
    assert json.loads(render_export(handle.spec, handle.name, lossless, "json"))["quality"] is None


def test_pareto_json_entries_carry_the_drop(handle: _Handle) -> None:
    records, labels, directions = _records(handle)
    payload = pareto_payload(handle.name, records, labels, directions, now=0.0)
    (entry,) = payload["front"]
    assert entry["trial"] == 4
    assert entry["quality"] == {"drop": 0.008, "drop_low": -0.004, "drop_high": 0.021, "verdict": "pass",
                                "items": 400}
    # Trial 6 missed the budget: not on the front although it is nearly as fast.
    assert 6 not in {e["trial"] for e in payload["front"]}


def test_a_damaged_record_breaks_no_view(handle: _Handle, tmp_path: Path) -> None:
    handle.edits = {n: {"quality": DAMAGED} for n in (0, 2, 4, 6)}
    records, labels, directions = _records(handle)
    assert all(r.summary.quality is None for r in records)
    paths = write_report(handle, tmp_path / "report")
    assert "quality.png" not in paths and "Quality budget" not in paths["report.html"].read_text()
    assert "lossy" not in render_export(handle.spec, handle.name, next(r for r in records if r.number == 4), "shell")
    assert "quality" not in pareto_payload(handle.name, records, labels, directions, now=0.0)["front"][0]


def test_the_drop_is_read_with_its_own_interval_not_the_start_noise(handle: _Handle) -> None:
    """A lossy trial's accuracy_drop carries the larger side of the gate's interval (0.8 pts
    [-0.4, 2.1]: ±1.3 pts); a lossless trial's drop is exact (0 by construction)."""
    records, _, _ = _records(handle)
    by_number = {r.number: r for r in records}
    assert by_number[4].noise(["accuracy_drop"])["accuracy_drop"] == pytest.approx(0.013)
    assert by_number[6].noise(["accuracy_drop"])["accuracy_drop"] == pytest.approx(0.029)
    assert by_number[0].noise(["accuracy_drop"])["accuracy_drop"] is None
