"""Study-file validation: every bad input names file, field, value and what is allowed."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tuner.errors import SpecError
from tuner.study.study_file import parse_study

ROOT = Path(__file__).resolve().parents[1]

BASE = """
name: t
server:
  command: ["{python}", "-m", "tuner.sim"]
  model: m
  gpus_per_trial: 8
parameters:
  - name: cudagraph_mode
    flag: compilation_config.cudagraph_mode
    kind: categorical
    values: [FULL_AND_PIECEWISE, PIECEWISE]
    default: FULL_AND_PIECEWISE
  - name: spec_method
    flag: speculative_config.method
    kind: categorical
    values: [null, ngram]
  - name: spec_k
    flag: speculative_config.num_speculative_tokens
    kind: int
    low: 1
    high: 4
    when: {spec_method: ngram}
load:
  concurrency: [1, 4]
"""


def parse(extra: str = "", base: str = BASE) -> object:
    return parse_study(textwrap.dedent(base) + textwrap.dedent(extra), "study.yaml")


def error_of(text: str) -> str:
    with pytest.raises(SpecError) as info:
        parse_study(textwrap.dedent(text), "study.yaml")
    return str(info.value)


def test_valid_base_parses() -> None:
    spec = parse()
    assert [p.name for p in spec.parameters] == ["cudagraph_mode", "spec_method", "spec_k"]
    assert spec.server.host == "127.0.0.1"
    assert spec.objectives[0].label == "output_tok_s@cmax"


@pytest.mark.parametrize("path", sorted((ROOT / "search_spaces").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_search_spaces_are_valid(path: Path) -> None:
    spec = parse_study(path.read_text(), str(path))
    assert spec.parameters


def test_bad_cudagraph_mode_lists_the_five_modes() -> None:
    message = error_of(BASE.replace("values: [FULL_AND_PIECEWISE, PIECEWISE]", "values: [FULL, BOGUS]"))
    assert "study.yaml" in message
    assert "parameters[0] (cudagraph_mode)" in message
    assert "'BOGUS'" in message
    for mode in ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"):
        assert mode in message


def test_unknown_key_is_rejected_with_allowed_keys() -> None:
    message = error_of(BASE.replace("  gpus_per_trial: 8", "  gpus_per_trail: 8"))
    assert "server: unknown key 'gpus_per_trail'" in message
    assert "gpus_per_trial" in message  # listed among the allowed keys


def test_unknown_top_level_section() -> None:
    message = error_of(BASE + "budgett: {n_trials: 3}\n")
    assert "unknown key 'budgett'" in message and "budget" in message


def test_wrong_kind_value_names_allowed_kinds() -> None:
    message = error_of(BASE.replace("kind: int", "kind: integer"))
    assert "parameters[2] (spec_k)" in message
    assert "'categorical'" in message and "'int'" in message


def test_condition_on_unknown_parameter() -> None:
    message = error_of(BASE.replace("when: {spec_method: ngram}", "when: {spec_mode: ngram}"))
    assert "'spec_mode' is not a parameter" in message
    assert "spec_method" in message


def test_condition_value_outside_parent_domain() -> None:
    message = error_of(BASE.replace("when: {spec_method: ngram}", "when: {spec_method: eagle}"))
    assert "'eagle' is not one of spec_method's values" in message


def test_condition_cycle() -> None:
    text = BASE.replace(
        "    values: [null, ngram]\n", "    values: [null, ngram]\n    when: {spec_k: 2}\n"
    )
    assert "cycle" in error_of(text)


def test_bad_nccl_proto_and_nvls_guard() -> None:
    extra = """
      - name: proto
        env: NCCL_PROTO
        kind: categorical
        values: [LL, LL256]
    """
    text = BASE.replace("load:", textwrap.indent(textwrap.dedent(extra).strip("\n"), "  ") + "\nload:")
    message = error_of(text)
    assert "'LL256'" in message and "LL128" in message and "Simple" in message
    nvls = text.replace("LL256", "LL").replace("NCCL_PROTO", "NCCL_ALGO").replace("[LL, LL]", "[Ring, NVLS]")
    assert "multicast" in error_of(nvls)


def test_int_range_reversed() -> None:
    message = error_of(BASE.replace("low: 1\n    high: 4", "low: 5\n    high: 4"))
    assert "low 5 is above high 4" in message


def test_fixed_flag_values_are_checked() -> None:
    text = BASE.replace("  gpus_per_trial: 8",
                        "  gpus_per_trial: 8\n  flags:\n    compilation_config: {cudagraph_mode: bogus}")
    message = error_of(text)
    assert "server.flags" in message or "server" in message
    assert "compilation_config.cudagraph_mode" in message and "'bogus'" in message


def test_parameter_cannot_override_fixed_flag() -> None:
    text = BASE.replace("  gpus_per_trial: 8",
                        "  gpus_per_trial: 8\n  flags:\n    compilation_config: {cudagraph_mode: FULL}")
    assert "already fix" in error_of(text)


def test_objective_at_unmeasured_concurrency() -> None:
    message = error_of(BASE + "objectives:\n  - {metric: tpot_ms.mean, concurrency: 8, direction: minimize}\n")
    assert "concurrency 8 is not a measured level" in message and "[1, 4]" in message


def test_bad_metric_name_and_direction() -> None:
    message = error_of(BASE + "objectives:\n  - {metric: tok/s, concurrency: 1, direction: up}\n")
    assert "'tok/s' is not a metric the tuner measures" in message
    assert "'maximize'" in message and "'minimize'" in message


def test_duration_strings() -> None:
    spec = parse("budget: {n_trials: 3, timeout: 8h, trial_timeout: 1h30m}\n")
    assert spec.budget.timeout == 8 * 3600 and spec.budget.trial_timeout == 5400
    message = error_of(BASE + "budget: {timeout: eight hours}\n")
    assert "budget.timeout" in message and "'eight hours'" in message and "'8h'" in message


def test_tp_larger_than_gpus() -> None:
    text = BASE.replace("  gpus_per_trial: 8", "  gpus_per_trial: 4\n  flags: {tensor_parallel_size: 8}")
    assert "fewer than tensor_parallel_size" in error_of(text)


def test_baseline_unknown_param_and_bad_value() -> None:
    assert "'nope' is not a parameter" in error_of(BASE + "baseline: {nope: 1}\n")
    assert "'FULL' is not one of cudagraph_mode" in error_of(BASE + "baseline: {cudagraph_mode: FULL}\n")


def test_yaml_syntax_error_names_file() -> None:
    assert error_of("name: [unclosed\n").startswith("study.yaml: not valid YAML")


def test_missing_required_field() -> None:
    message = error_of(BASE.replace("  model: m\n", ""))
    assert "server.model" in message and "required" in message.lower()


def test_duplicate_target() -> None:
    extra = """
      - name: cg2
        flag: compilation_config.cudagraph_mode
        kind: categorical
        values: [NONE]
    """
    text = BASE.replace("load:", textwrap.indent(textwrap.dedent(extra).strip("\n"), "  ") + "\nload:")
    assert "both set compilation_config.cudagraph_mode" in error_of(text)


def test_an_objective_or_limit_on_a_metric_nobody_measures_is_refused_with_a_suggestion(tmp_path) -> None:
    """A typo in a metric name would read as "not measured" in every trial, hours later."""
    from tuner.study.objectives import KNOWN_METRICS, LimitSpec, ObjectiveSpec

    with pytest.raises(ValueError, match=r"'output_tok_z' is not a metric the tuner measures; did you mean "
                                         r"'output_tok_s'\?"):
        ObjectiveSpec(metric="output_tok_z", direction="maximize")
    with pytest.raises(ValueError, match=r"'latency_ms\.p99' is not a metric the tuner measures; use e\.g\."):
        LimitSpec(metric="latency_ms.p99", max=100)
    for name in ("output_tok_s", "tpot_ms.p99", "goodput_tok_s", "stability_ratio", "run_output_tok_s",
                 "accuracy_drop", "startup_s"):
        assert name in KNOWN_METRICS
