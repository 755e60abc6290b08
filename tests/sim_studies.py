"""Small study files for tests that need a whole ground truth (tuner.sim.truth) fast:
GLM-5 on the simulator's field-notes profile, but short requests and low concurrency."""

from __future__ import annotations

from typing import Any

from tuner.sim.ground_truth import GroundTruth
from tuner.sim.profile import Profile
from tuner.sim.truth import Evaluator, enumerate_points
from tuner.study.spec import StudySpec


def build_ground_truth(spec: StudySpec, profile: Profile, *,
                       points: list[dict[str, Any]] | None = None) -> GroundTruth:
    """Every point of ``spec`` (or ``points``) evaluated on ``profile``."""
    ev = Evaluator(spec, profile)
    return GroundTruth.build(spec, [ev.evaluate(v) for v in (enumerate_points(spec) if points is None else points)])


SMALL_STUDY = """
name: es-small
server:
  command: [vllm, serve]
  model: /models/glm5
  flags: {tensor_parallel_size: 8}
  env: {VLLM_ALLREDUCE_USE_FLASHINFER: 0, VLLM_ALLREDUCE_USE_SYMM_MEM: 0}
parameters:
  - {name: enforce_eager, flag: enforce_eager, kind: bool}
  - name: cudagraph_mode
    flag: compilation_config.cudagraph_mode
    kind: categorical
    values: [FULL_AND_PIECEWISE, FULL, NONE]
    default: FULL_AND_PIECEWISE
    when: {enforce_eager: false}
  - {name: nccl_proto, env: NCCL_PROTO, kind: categorical, values: [null, LL, LL128]}
  - {name: spec_method, flag: speculative_config.method, kind: categorical, values: [null, mtp]}
  - {name: spec_k, flag: speculative_config.num_speculative_tokens, kind: int, low: 1, high: 2,
     when: {spec_method: mtp}}
forbidden:
  - when: {enforce_eager: true, nccl_proto: LL128}
    reason: tests need a forbidden rule
baseline: {}
limits:
  - {metric: ttft_ms.p90, concurrency: 1, max: 5000}
load:
  concurrency: [1, 4, 16]
  requests_per_stream: 2
  min_requests: 4
  workload:
    classes:
      - {name: chat, kind: open_ended, weight: 3, prompt_tokens: 96, output_tokens: 48}
      - {name: edit, kind: copy_heavy, weight: 1, prompt_tokens: 160, output_tokens: 48}
budget: {n_trials: 30}
"""
