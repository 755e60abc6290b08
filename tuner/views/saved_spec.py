"""What the views read from a study's saved spec.yaml without the spec models (``tuner status``
stays fast and works on a folder whose spec no longer validates): the knobs it searches and
its noise override, and from those the study's between-start noise."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tuner.adapters.artifacts import StudyPaths
from tuner.study.between_starts import StudyNoise
from tuner.study.study_noise import noise_of_study, with_study_noise
from tuner.study.trials import TrialRecord

__all__ = ["noisy_records", "saved_noise_floor", "searched_targets", "study_noise_at"]


def _saved_spec(spec_yaml: Path) -> dict[str, Any]:
    """The study's saved spec.yaml as plain data (no spec models); empty when unreadable."""

    from tuner.study.safe_yaml import YamlInputError, load_bounded

    try:
        data = load_bounded(spec_yaml.read_text(encoding="utf-8"))
    except (OSError, YamlInputError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def saved_noise_floor(spec_yaml: Path) -> float | None:
    """The study's ``load.noise_floor`` override from its saved spec.yaml; None: measured."""

    load = _saved_spec(spec_yaml).get("load")
    value = load.get("noise_floor") if isinstance(load, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def study_noise_at(paths: StudyPaths, records: list[TrialRecord], labels: list[str]) -> StudyNoise:
    """The study's between-start noise from its trials and ``confirm/`` re-runs."""

    return noise_of_study(records, paths.confirmations(), labels, override=saved_noise_floor(paths.spec_yaml))


def searched_targets(spec_yaml: Path) -> frozenset[str]:
    """The targets the study's parameters search (``enforce_eager``, ``env:NCCL_PROTO``),
    read from its saved spec.yaml without the spec models; empty when it cannot be read."""

    params = _saved_spec(spec_yaml).get("parameters")
    return frozenset(str(p["flag"]) if p.get("flag") is not None else f"env:{p.get('env')}"
                     for p in params or [] if isinstance(p, dict))


def noisy_records(paths: StudyPaths, records: list[TrialRecord], labels: list[str]) -> list[TrialRecord]:
    """The records, each reading its intervals with the study's between-start noise."""

    return with_study_noise(records, study_noise_at(paths, records, labels))
