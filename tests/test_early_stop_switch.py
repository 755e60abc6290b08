"""The study file's switch for early stopping (``execution.early_stop``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tuner.errors import SpecError
from tuner.study.study_file import parse_study

ROOT = Path(__file__).resolve().parents[1]


def _study(**execution: object) -> str:
    data = yaml.safe_load((ROOT / "search_spaces" / "demo.yaml").read_text())
    data["execution"] = {**(data.get("execution") or {}), **execution}
    return yaml.safe_dump(data, sort_keys=False)


def test_early_stop_is_on_by_default_and_can_be_switched_off() -> None:
    assert parse_study(_study(), "demo.yaml").execution.early_stop is True
    assert parse_study(_study(early_stop=False), "demo.yaml").execution.early_stop is False


def test_a_bad_switch_value_is_an_error_naming_the_field() -> None:
    with pytest.raises(SpecError) as err:
        parse_study(_study(early_stop="sometimes"), "demo.yaml")
    assert "early_stop" in str(err.value) and "demo.yaml" in str(err.value)

