"""LoadSpec / WorkloadSpec validation and derived per-level counts."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tuner.load.load_spec import LoadSpec, WorkloadClass, WorkloadSpec


def test_defaults_are_the_documented_ones() -> None:
    spec = LoadSpec()
    assert spec.api == "completions"
    assert spec.concurrency == (1, 4, 16, 64)
    assert spec.requests_per_level is None
    assert spec.request_timeout_s == 600
    assert spec.max_level_seconds == 300
    assert spec.seed == 0
    (only,) = spec.workload.classes
    assert (only.name, only.kind, only.prompt_tokens, only.output_tokens) == (
        "open_ended", "open_ended", 128, 128,
    )
    assert only.prompt_tokens_jitter == pytest.approx(0.1)
    assert spec.workload.ignore_eos == "auto"


@pytest.mark.parametrize(
    ("concurrency", "expected"),
    [(1, 8), (2, 8), (3, 9), (64, 192)],  # max(min_requests=8, 3 x C)
)
def test_requests_for_default(concurrency: int, expected: int) -> None:
    assert LoadSpec().requests_for(concurrency) == expected


def test_requests_per_level_overrides() -> None:
    spec = LoadSpec(concurrency=[1, 4], requests_per_level=20)
    assert spec.requests_for(1) == 20
    assert spec.requests_for(4) == 20


@pytest.mark.parametrize(("concurrency", "expected"), [(1, 4), (2, 4), (3, 6), (64, 128)])
def test_warmup_default_is_max_2c_4(concurrency: int, expected: int) -> None:
    assert LoadSpec().warmup_for(concurrency) == expected


def test_warmup_override_including_zero() -> None:
    assert LoadSpec(warmup_requests=0).warmup_for(64) == 0
    assert LoadSpec(warmup_requests=7).warmup_for(1) == 7


def test_non_ascending_concurrency_names_the_values() -> None:
    with pytest.raises(ValidationError) as info:
        LoadSpec(concurrency=[1, 8, 4])
    msg = str(info.value)
    assert "concurrency" in msg
    assert "got 4 after 8 at position 2" in msg


def test_duplicate_level_rejected() -> None:
    with pytest.raises(ValidationError, match="strictly ascending"):
        LoadSpec(concurrency=[2, 2])


def test_zero_concurrency_rejected() -> None:
    with pytest.raises(ValidationError, match="concurrency level 0 at position 0 must be >= 1"):
        LoadSpec(concurrency=[0, 1])


def test_empty_concurrency_rejected() -> None:
    with pytest.raises(ValidationError, match="concurrency"):
        LoadSpec(concurrency=[])


def test_requests_per_level_below_top_concurrency_rejected() -> None:
    with pytest.raises(ValidationError, match="requests_per_level=10 is below the highest"):
        LoadSpec(concurrency=[1, 16], requests_per_level=10)


def test_unknown_field_rejected_with_its_path() -> None:
    with pytest.raises(ValidationError) as info:
        LoadSpec.model_validate({"workload": {"classes": [{"name": "a", "kind": "open_ended",
                                                             "promt_tokens": 5}]}})
    err = info.value.errors()[0]
    assert err["type"] == "extra_forbidden"
    assert err["loc"] == ("workload", "classes", 0, "promt_tokens")


def test_bad_kind_and_weight_rejected() -> None:
    with pytest.raises(ValidationError) as info:
        WorkloadClass(name="x", kind="poetry")  # type: ignore[arg-type]
    assert info.value.errors()[0]["loc"] == ("kind",)
    with pytest.raises(ValidationError) as info:
        WorkloadClass(name="x", kind="copy_heavy", weight=0)
    assert info.value.errors()[0]["loc"] == ("weight",)


def test_jitter_must_be_below_one() -> None:
    with pytest.raises(ValidationError):
        WorkloadClass(name="x", kind="open_ended", prompt_tokens_jitter=1.0)


def test_duplicate_class_names_rejected() -> None:
    with pytest.raises(ValidationError, match="'a' is used twice"):
        WorkloadSpec(
            classes=[
                WorkloadClass(name="a", kind="open_ended"),
                WorkloadClass(name="a", kind="copy_heavy"),
            ]
        )


@pytest.mark.parametrize(
    ("setting", "speculative", "expected"),
    [("auto", False, True), ("auto", True, False), (True, True, True), (False, False, False)],
)
def test_ignore_eos_resolution(setting: str | bool, speculative: bool, expected: bool) -> None:
    ws = WorkloadSpec(ignore_eos=setting)  # type: ignore[arg-type]
    assert ws.resolve_ignore_eos(speculative=speculative) is expected


def test_ignore_eos_rejects_other_strings() -> None:
    with pytest.raises(ValidationError):
        WorkloadSpec(ignore_eos="sometimes")  # type: ignore[arg-type]


def test_frozen() -> None:
    spec = LoadSpec()
    with pytest.raises(ValidationError):
        spec.seed = 3  # type: ignore[misc]


def test_yaml_shaped_dict_round_trips() -> None:
    raw = {
        "api": "chat",
        "concurrency": [1, 2, 8],
        "requests_per_stream": 5,
        "workload": {
            "ignore_eos": False,
            "classes": [
                {"name": "chat", "kind": "open_ended", "weight": 3, "prompt_tokens": 512},
                {"name": "code", "kind": "copy_heavy", "output_tokens": 256},
            ],
        },
    }
    spec = LoadSpec.model_validate(raw)
    assert spec.requests_for(8) == 40
    again = LoadSpec.model_validate(spec.model_dump(mode="json"))
    assert again == spec
