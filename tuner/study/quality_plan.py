"""What a trial's worker needs of the study's quality budget (pure): which of its values are
lossy, the budget, and the reference's answers to pair with - the ``quality`` of a
``TrialRequest``.

Only a trial with lossy values (tuner.vllm.lossy: an fp8 KV cache, fp8 weights; or a
parameter marked ``lossy: true`` set off its baseline value) gets a plan. A lossless trial
of a quality study gets none and no quality gate: it computes in the reference's numerics
class (bf16 weights and KV cache), so whatever moves its answers is the numerics noise the
corruption rule already judges - its accuracy drop is 0 by construction, and it still has to
pass that rule like every trial.

A lossy trial's corruption rule is loosened (``loosened_probe``): fp8 legitimately flips
tokens the reference was fairly sure of. Real fp8 on an H200 (SmolLM2-135M, docs/probe.md)
flipped greedy tokens at reference gaps up to 1.4 nats with an fp8 KV cache and a few above
2 nats with fp8 weights, where garbage replaces tokens 5 to 20 nats down or outside the
reference's top-k altogether. What the looser rule lets through is what the quality gate
measures: whether the changed answers are still right.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tuner.probe.quality_items import QualityReference
from tuner.probe.quality_stats import LossyValue
from tuner.probe.spec import ProbeSpec
from tuner.study.quality import QualitySpec, lossy_settings
from tuner.study.spec import StudySpec

__all__ = ["QualityPlan", "loosened_probe", "quality_plan", "reference_plan"]


class QualityPlan(BaseModel):
    """The quality gate a worker runs: the budget, the trial's lossy values, and the
    reference's answers (None in the reference job itself, which records them)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    spec: QualitySpec
    lossy: dict[str, LossyValue] = Field(default_factory=dict)
    reference: QualityReference | None = None


def quality_plan(spec: StudySpec, values: Mapping[str, Any],
                 reference: QualityReference | None) -> QualityPlan | None:
    """The plan of a trial at ``values`` (tuner.study.quality.lossy_settings names its lossy
    values); None for a study without a quality budget or a lossless trial (no gate)."""

    if spec.quality is None:
        return None
    lossy = lossy_settings(spec, values)
    if not lossy:
        return None
    return QualityPlan(spec=spec.quality, reference=reference,
                       lossy={name: LossyValue(value=value, reason=why) for name, (value, why) in lossy.items()})


def reference_plan(spec: StudySpec) -> QualityPlan | None:
    """The plan of the study's reference job: answer every quality item; None without a
    quality budget."""

    return None if spec.quality is None else QualityPlan(spec=spec.quality)


def loosened_probe(probe: ProbeSpec, plan: QualityPlan | None) -> ProbeSpec:
    """``probe`` with the corruption rule loosened for a lossy trial (``plan`` with lossy
    values): a near tie up to ``quality.lossy_near_tie_nats``, a token outside the reference's
    top-k judged by the bound on its gap, and teacher-forced agreement down to
    ``quality.lossy_min_prompt_top1`` - never stricter than the study's own."""

    if plan is None or not plan.lossy:
        return probe
    ref = probe.reference
    looser = ref.model_copy(update={
        "near_tie_nats": max(ref.near_tie_nats, plan.spec.lossy_near_tie_nats),
        "min_prompt_top1": min(ref.min_prompt_top1, plan.spec.lossy_min_prompt_top1),
        # fp8 picks tokens outside the reference's top-5 where that top-5 is flat (H100,
        # 2026-12-07: bounds of 0.125-0.5 nats): judged by the bound, not as corruption.
        "outside_top_k_by_bound": True,
    })
    return probe.model_copy(update={"reference": looser})
