"""The knob table (tuner.vllm.knobs): one entry per knob, read by the spec's value checks,
the verifier, startup downgrade detection and the compile-cache key alike."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import pytest

from tuner.vllm.compile_cache import compile_key
from tuner.vllm.effective_config import EffectiveConfig, parse_effective_config
from tuner.vllm.knobs import KNOBS, check_value, knob
from tuner.vllm.verify import RULES, startup_mismatches, verify

LOGS = Path(__file__).parent / "fixtures" / "vllm_logs"


@cache
def fixtures() -> dict[str, EffectiveConfig]:
    return {str(p.relative_to(LOGS)): parse_effective_config(p.read_text(encoding="utf-8"))
            for p in sorted(LOGS.glob("*/*.log"))}


def test_every_entry_names_a_rule_and_a_log_field_that_exist() -> None:
    fields = set(EffectiveConfig.model_fields)
    for k in KNOBS.values():
        assert k.rule in RULES, k.target
        assert k.log is None or k.log in fields, k.target
        assert k.label and k.label.strip() == k.label, k.target


def test_every_knob_read_off_a_log_field_has_a_fixture_that_shows_it() -> None:
    """Adding a knob is one entry plus its log fixture: a log field no recorded log fills
    would be a verification nobody has seen work."""
    shown = {field for eff in fixtures().values() for field in EffectiveConfig.model_fields
             if getattr(eff, field) is not None}
    missing = sorted(k.target for k in KNOBS.values() if k.log and k.log not in shown)
    assert not missing


@pytest.mark.parametrize(("alias", "name"), [(0, "NONE"), (1, "PIECEWISE"), (2, "FULL"),
                                             ("full_decode_only", "FULL_DECODE_ONLY")])
def test_cudagraph_aliases_are_one_table_for_checking_and_verifying(alias: Any, name: str) -> None:
    """The integer aliases used to be written twice (catalog and verifier); now the value
    check, the verifier and the compile key all read the same entry."""
    target = "compilation_config.cudagraph_mode"
    assert check_value(target, alias) is None
    assert knob(target).values.canonical(alias) == name
    log = {"NONE": "h200-0.26.0/eager.log", "PIECEWISE": "h200-0.26.0/cudagraph-piecewise.log",
           "FULL": "h200-0.26.0/cudagraph-full.log",
           "FULL_DECODE_ONLY": "h200-0.26.0/cudagraph-full_decode_only.log"}[name]
    assert verify({target: alias}, fixtures()[log]).applied
    base = {"model": "/m", "compilation_config.mode": 3}
    assert compile_key({**base, target: alias}) == compile_key({**base, target: name})
    assert check_value(target, 3) is not None and "0, 1, 2" in (check_value(target, 3) or "")


def test_aliases_of_a_target_share_its_entry() -> None:
    for alias in ("max_cudagraph_capture_size", "compilation_config.max_cudagraph_capture_size"):
        k = knob(alias)
        assert (k.target, k.label, k.log) == (alias, "max capture size", "max_cudagraph_capture_size")
    eff = fixtures()["h200-0.26.0/cudagraph-full_and_piecewise.log"]
    assert [c.status for c in verify({"max_cudagraph_capture_size": 512,
                                      "compilation_config.max_cudagraph_capture_size": "256"},
                                     eff).checks] == ["applied", "not_applied"]


@pytest.mark.parametrize(("target", "rule", "compile_key", "log_env"), [
    ("env:NCCL_BUFFSIZE", "nccl_env", False, True),      # any NCCL variable: NCCL's report
    ("env:NCCL_PROTO", "nccl_env", False, True),
    ("env:VLLM_PORT", "unlogged_env", False, False),     # in envs.compile_factors' ignore list
    ("env:VLLM_SOMETHING_NEW", "unlogged_env", True, False),
    ("env:HF_HOME", "unlogged_env", False, False),
    ("speculative_config.draft_tensor_parallel_size", "args", True, False),
    ("compilation_config.cache_dir", "args", False, False),
    ("some_future_flag", "args", True, False),
])
def test_a_target_without_an_entry_gets_its_familys(target: str, rule: str, compile_key: bool,
                                                    log_env: bool) -> None:
    k = knob(target)
    assert (k.target, k.rule, k.compile_key, bool(k.log_env)) == (target, rule, compile_key, log_env)


def test_startup_downgrades_are_final_only_where_the_table_says() -> None:
    """tp4-pcie-nccl-debug.log: FULL downgraded at attention init and custom all-reduce off
    on >2 PCIe GPUs, both before the weights load; the NCCL protocol differs too, but its
    entry has no `final`, so a partial log never stops the start for it."""
    text = (LOGS / "handwritten" / "tp4-pcie-nccl-debug.log").read_text(encoding="utf-8")
    lines = text.splitlines()
    cut = next(i for i, line in enumerate(lines) if "Capturing CUDA graphs" in line)
    asked = {"compilation_config.cudagraph_mode": "FULL", "disable_custom_all_reduce": False,
             "env:NCCL_PROTO": "Simple"}
    assert sorted(startup_mismatches(asked, parse_effective_config("\n".join(lines[:cut])))) == [
        "compilation_config.cudagraph_mode", "disable_custom_all_reduce"]
    assert {c.target for c in verify(asked, parse_effective_config(text)).mismatches()} == set(asked)


@pytest.mark.parametrize("value, error", [
    ("5", None), ("3", None), (30, None),
    ("2", "'2' is too low; allowed: a whole number, 3 or more"), ("1", "too low"),
    ("five", "not a whole number"), ("2.5", "not a whole number"),
])
def test_a_server_keep_alive_below_the_clients_idle_limit_is_refused(value: Any, error: str | None) -> None:
    got = check_value("env:VLLM_HTTP_TIMEOUT_KEEP_ALIVE", value)
    if error is None:
        assert got is None
    else:
        assert got is not None and error in got and "reset" in got


def test_a_study_setting_a_short_keep_alive_is_refused_naming_the_field() -> None:
    from tuner.study.server_spec import ServerSpec

    with pytest.raises(ValueError,
                       match=r"env\.VLLM_HTTP_TIMEOUT_KEEP_ALIVE: '1' is too low; allowed: a whole number, 3"):
        ServerSpec.model_validate({"model": "m", "env": {"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": 1}})
