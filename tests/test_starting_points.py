"""`starting_points:` — configurations run right after the baseline (today's production
flags, say): completed like the baseline, refused at load when unknown, out of domain,
inactive or forbidden, and queued once per study even across resumes."""

from __future__ import annotations

import textwrap

import optuna
import pytest

from tuner.errors import SpecError
from tuner.store.records import read_records
from tuner.study import policy, space
from tuner.study.study_file import parse_study

STUDY = """
name: t
server:
  command: ["{python}", "-m", "tuner.sim"]
  model: m
parameters:
  - name: enforce_eager
    flag: enforce_eager
    kind: bool
  - name: cudagraph_mode
    flag: compilation_config.cudagraph_mode
    kind: categorical
    values: [FULL_AND_PIECEWISE, PIECEWISE, NONE]
    default: FULL_AND_PIECEWISE
    when: {enforce_eager: false}
  - name: spec_method
    flag: speculative_config.method
    kind: categorical
    values: [null, ngram]
  - name: spec_k
    flag: speculative_config.num_speculative_tokens
    kind: int
    low: 1
    high: 4
    default: 2
    when: {spec_method: ngram}
forbidden:
  - when: {enforce_eager: true, spec_method: ngram}
    reason: no speculation on the eager floor
baseline: {enforce_eager: true}
load:
  concurrency: [1, 4]
"""


def parse(extra: str) -> object:
    return parse_study(textwrap.dedent(STUDY) + textwrap.dedent(extra), "study.yaml")


def error_of(extra: str) -> str:
    with pytest.raises(SpecError) as info:
        parse(extra)
    return str(info.value)


def test_points_are_completed_from_the_baseline_and_defaults() -> None:
    spec = parse("""
        starting_points:
          - {enforce_eager: false, cudagraph_mode: PIECEWISE}
          - {enforce_eager: false, spec_method: ngram}
          - {}
    """)
    assert space.starting_point_values(spec) == [
        {"enforce_eager": False, "cudagraph_mode": "PIECEWISE", "spec_method": None},
        {"enforce_eager": False, "cudagraph_mode": "FULL_AND_PIECEWISE", "spec_method": "ngram", "spec_k": 2},
        {"enforce_eager": True, "spec_method": None},  # an empty point is the baseline
    ]


@pytest.mark.parametrize(("extra", "expected"), [
    ("starting_points: [{nope: 1}]\n", "starting_points[0]: 'nope' is not a parameter; parameters: enforce_eager"),
    ("starting_points: [{}, {cudagraph_mode: FULL}]\n", "starting_points[1].cudagraph_mode"),
    ("starting_points: [{spec_method: ngram, spec_k: 9}]\n", "starting_points[0].spec_k"),
    ("starting_points: [{spec_method: ngram}]\n",
     "starting_points[0]: the point is forbidden (no speculation on the eager floor)"),
    ("starting_points: [{cudagraph_mode: PIECEWISE}]\n",
     "starting_points[0].cudagraph_mode: set, but the parameter is inactive in this point "
     "(it applies only when enforce_eager=False)"),
])
def test_bad_points_are_refused_at_load(extra: str, expected: str) -> None:
    message = error_of(extra)
    assert message.startswith("study.yaml: ")
    assert expected in message


def test_a_knob_without_a_baseline_value_is_refused_at_load() -> None:
    text = textwrap.dedent(STUDY).replace("    default: 2\n", "").replace(
        "baseline: {enforce_eager: true}", "baseline: {enforce_eager: true, spec_method: ngram}")
    with pytest.raises(SpecError) as info:
        parse_study(text, "study.yaml")
    assert "parameter 'spec_k' has no baseline value" in str(info.value)


def test_baseline_then_points_are_queued_once() -> None:
    spec = parse("""
        starting_points:
          - {enforce_eager: false, cudagraph_mode: PIECEWISE}
          - {enforce_eager: false, cudagraph_mode: NONE}
    """)
    study = optuna.create_study(directions=["maximize", "minimize"])
    for _ in range(2):  # the second time is a resume: nothing queued twice
        for point in policy.first_points(spec, read_records(study)):
            study.enqueue_trial(point.values, user_attrs=point.attrs)
    waiting = study.get_trials(deepcopy=False)
    # The baseline, its two further starts for the study's noise (load.noise_starts), the points.
    assert [t.user_attrs.get("baseline", False) for t in waiting] == [True, False, False, False, False]
    assert [t.user_attrs.get("noise_start") for t in waiting] == [None, 2, 3, None, None]
    assert [t.user_attrs.get("starting_point") for t in waiting] == [None, None, None, 0, 1]
    assert [t.system_attrs["fixed_params"] for t in waiting] == [
        {"enforce_eager": True, "spec_method": None},
        {"enforce_eager": True, "spec_method": None},
        {"enforce_eager": True, "spec_method": None},
        {"enforce_eager": False, "cudagraph_mode": "PIECEWISE", "spec_method": None},
        {"enforce_eager": False, "cudagraph_mode": "NONE", "spec_method": None},
    ]


COMPILED = """
name: t
server:
  command: ["{python}", "-m", "tuner.sim"]
  model: m
parameters:
  - name: enforce_eager
    flag: enforce_eager
    kind: bool
  - name: cudagraph_mode
    flag: compilation_config.cudagraph_mode
    kind: categorical
    values: [FULL_AND_PIECEWISE, PIECEWISE, NONE]
    default: FULL_AND_PIECEWISE
    when: {enforce_eager: false}
  - name: nccl_proto
    env: NCCL_PROTO
    kind: categorical
    values: [null, LL, Simple]
baseline: {enforce_eager: false}
starting_points:
  - {enforce_eager: true}
  - {cudagraph_mode: PIECEWISE}
  - {nccl_proto: LL}
  - {cudagraph_mode: NONE}
  - {cudagraph_mode: PIECEWISE, nccl_proto: Simple}
load:
  concurrency: [1, 4]
"""


def test_points_sharing_a_compile_key_run_back_to_back_the_baselines_first() -> None:
    # The baseline compiles FULL_AND_PIECEWISE. NCCL_PROTO is outside vLLM's compile key, so
    # point 2 loads the baseline's graph and runs first; the two PIECEWISE points run back to
    # back; the eager point, which compiles nothing, runs last.
    spec = parse_study(COMPILED, "study.yaml")
    queued = policy.first_points(spec, [])
    assert queued[0].attrs.get("baseline")
    # The baseline's further starts share its compile key: they come right after it.
    assert [p.attrs.get("noise_start") for p in queued[1:3]] == [2, 3]
    assert [p.attrs.get("starting_point") for p in queued[3:]] == [2, 1, 4, 3, 0]
