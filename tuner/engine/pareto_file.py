"""pareto.json, rewritten after every trial: the front with its intervals, ties, gains over the
baseline, confirmation verdicts and the study's noise between starts (tuner.study.scoring)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from tuner.adapters.artifacts import StudyPaths, atomic_write_json
from tuner.errors import ArtifactWriteError
from tuner.study.between_starts import StudyNoise
from tuner.study.confirmation import confirmation_brief
from tuner.study.scoring import pareto_payload
from tuner.study.trials import TrialRecord

__all__ = ["write_pareto_file"]


def write_pareto_file(paths: StudyPaths, name: str, records: list[TrialRecord], labels: list[str],
                      directions: Sequence[str], between: StudyNoise, progress: Callable[[str], None]) -> None:
    """Rewrite pareto.json atomically; on a full disk the previous version stays."""

    payload = pareto_payload(name, records, labels, directions, now=time.time(), between=between)
    confirmations = paths.confirmations()
    for entry in payload["front"]:
        found = confirmations.get(entry["trial"])
        if found is not None:
            entry["confirmation"] = confirmation_brief(found)
    try:
        atomic_write_json(paths.pareto_json, payload)
    except ArtifactWriteError as err:
        progress(f"[warning] pareto.json not updated ({err.reason}): {err}; "
                 "the previous version is intact and is rewritten after the next trial")
