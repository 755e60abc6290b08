"""A whole `tuner run` on the simulator serving dummy weights (``server.flags.load_format:
dummy``, issue 34): the probe turns reference-only on its own, the reference is trusted
without known answers, a clean configuration passes and one that answers garbage is
rejected, and status and report say that known answers were not judged.

One knob, ``case`` (= --max-num-seqs): 256 (the baseline, and so the reference) is
correct, 257 answers garbage."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_tuner, wait_no_orphans
from tests.faultkit import fault_study
from tuner.probe.spec import DUMMY_TEXT

pytestmark = pytest.mark.slow


def test_dummy_weights_study_judges_by_the_reference_alone(tmp_path) -> None:
    study, marker = fault_study(tmp_path, {256: [], 257: [{"fault": "garbage"}]},
                                updates={"budget.trial_timeout": "60s", "probe.reference.enabled": True,
                                         "server.flags.load_format": "dummy"})
    results = tmp_path / "results"
    try:
        out = run_tuner("run", str(study), "--results", str(results), timeout=600)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        assert f"({DUMMY_TEXT}, agrees with itself)" in out.stdout, out.stdout[-3000:]
        name, root = study.stem, results / study.stem
        reference = json.loads((root / "reference.json").read_text())
        evidence = json.loads((root / "reference_probe.json").read_text())
        assert evidence["trusted"] is True and evidence["probe_mode"] == DUMMY_TEXT
        assert reference["mode"] == "reference_only" and reference["known_answers_accuracy"] is None
        assert "--load-format dummy" in evidence["command"]

        status = run_tuner("status", name, "--results", str(results), "--json")
        rows = {row["params"]["case"]: row for row in json.loads(status.stdout)["trials"]}
        clean, garbage = rows[256], rows[257]
        assert clean["outcome"] == "feasible", clean
        assert clean["probe_coverage"].startswith(DUMMY_TEXT + "; lengths "), clean
        assert garbage["outcome"] == "probe_failed", garbage
        assert garbage["probe_reason"].startswith("reference: ") and "known answers" not in garbage["probe_reason"]
        probe = json.loads((root / "trials" / f"{clean['trial']:04d}" / "probe.json").read_text())
        assert probe["mode"] == "reference_only" and probe["known_answers"]["skipped"] is True

        text = run_tuner("status", name, "--results", str(results)).stdout
        assert f"  probe: {DUMMY_TEXT}" in text, text
        assert run_tuner("report", name, "--results", str(results)).returncode == 0
        assert f"Probe: {DUMMY_TEXT}." in (root / "report" / "report.md").read_text()
    finally:
        assert not wait_no_orphans(marker, timeout=5), "orphan simulator processes"
