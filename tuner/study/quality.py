"""The study file's ``quality:`` section (the accuracy budget lossy knobs are searched
under), and the checks that tie it to the rest of the study.

A lossy value (``tuner.vllm.lossy``: an fp8 KV cache, quantized weights; or any value but
the baseline's of a parameter marked ``lossy: true``) changes the model's answers by design.
The study searches one only when it states how much accuracy it may cost:
``quality: {max_accuracy_drop: 0.02}`` (2 accuracy points, measured on the probe's
known-answer items, paired with the reference's answers on the same items; the statistics
are ``tuner.probe.quality_stats``'s). Refused at load, before any server starts:

* a lossy searched value without ``quality:`` (one line: the parameter, the value, why it is
  lossy and how to allow it);
* a lossy baseline value: the baseline is the quality reference every trial is held to;
* ``quality:`` where no known answer can be judged: the probe disabled, ``probe.mode:
  reference_only``, or dummy weights (``load_format: dummy``: random weights answer no item
  right, so there is no accuracy to lose).

Pure. ``spec`` below is a ``tuner.study.spec.StudySpec`` typed as Any: its own validator
calls these, so naming the class here would make an import cycle.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import Field, ValidationInfo, field_validator, model_validator

from tuner.study.spec_base import Strict
from tuner.study.weights import dummy_weights
from tuner.vllm.lossy import lossy_reason

__all__ = ["QualitySpec", "BUDGET_HINT", "lossy_value_reason", "lossy_settings", "quality_problem"]

# How a study allows its lossy values, quoted in every refusal.
BUDGET_HINT = "add quality: {max_accuracy_drop: 0.02} to search it under an accuracy budget"


class QualitySpec(Strict):
    """The accuracy budget of a study that searches lossy values (docs/study-file.md,
    "Lossy knobs under a quality budget")."""

    max_accuracy_drop: float = Field(
        description="the most accuracy a lossy configuration may lose against the reference, as an "
        "absolute fraction of the known-answer items (0.02 = 2 accuracy points); a trial passes only "
        "when the upper end of the drop's confidence interval is within it")
    confidence: float = Field(
        0.95, description="confidence of the drop's interval, shared out over the planned looks")
    items: int = Field(
        200, description="known-answer items of the first look; each further look doubles them")
    max_items: int = Field(
        800, description="the most items a trial is asked; undecided there = not shown to be "
        "within the budget (the trial fails)")
    min_reference_accuracy: float = Field(
        0.5, description="the reference's accuracy on the quality items must reach this, else the "
        "study stops before any trial (a drop from a model that cannot answer means nothing)")
    # A lossy trial's corruption rule (tuner.study.quality_plan.loosened_probe): fp8 flips
    # tokens the reference was fairly sure of. Real fp8 on an H200 flipped greedy tokens at
    # reference gaps up to 1.4 nats (fp8 KV cache) and a few above 2 nats (fp8 weights; 3.4 with
    # both), while garbage replaces tokens far below the reference's. A token outside the
    # reference's top-k is judged by the bound on its gap in a lossy trial (fp8 on an H100 chose
    # such tokens where the top-5 spanned 0.125-0.625 nats): reference.outside_top_k_by_bound.
    lossy_near_tie_nats: float = Field(
        4.0, description="a lossy trial's probe.reference.near_tie_nats (never lower than the study's "
        "own): a replaced token up to this many nats below the reference's is numerics, not corruption")
    lossy_min_prompt_top1: float = Field(
        0.8, description="a lossy trial's probe.reference.min_prompt_top1 (never higher than the "
        "study's own): teacher-forced positions that must agree with the reference")

    @field_validator("lossy_near_tie_nats")
    @classmethod
    def _check_nats(cls, value: float) -> float:
        if not value > 0:
            raise ValueError(f"{value!r} is not allowed; give a number of nats above 0 (e.g. 4.0)")
        return value

    @field_validator("lossy_min_prompt_top1", "min_reference_accuracy")
    @classmethod
    def _check_fraction(cls, value: float, info: ValidationInfo) -> float:
        if not 0 <= value <= 1:
            example = {"lossy_min_prompt_top1": 0.8, "min_reference_accuracy": 0.5}[info.field_name or ""]
            raise ValueError(f"{value!r} is not allowed; give a fraction from 0 to 1 (e.g. {example})")
        return value

    @field_validator("max_accuracy_drop")
    @classmethod
    def _check_drop(cls, value: float) -> float:
        if not 0 < value < 1:
            raise ValueError(f"{value!r} is not allowed; give a fraction above 0 and below 1 (accuracy "
                             "points / 100: 0.02 = 2 points)")
        return value

    @field_validator("confidence")
    @classmethod
    def _check_confidence(cls, value: float) -> float:
        if not 0.5 < value < 1:
            raise ValueError(f"{value!r} is not allowed; give a number above 0.5 and below 1 (e.g. 0.95)")
        return value

    @field_validator("items")
    @classmethod
    def _check_items(cls, value: int) -> int:
        if value < 20:
            raise ValueError(f"{value!r} is not allowed; give 20 or more (fewer items cannot tell a "
                             "small drop from chance)")
        return value

    @model_validator(mode="after")
    def _check_cap(self) -> QualitySpec:
        if self.max_items < self.items:
            raise ValueError(f"max_items: {self.max_items} is not allowed; give at least items "
                             f"({self.items}), the first look's size")
        return self


# A parameter's baseline value could not be told here (no baseline entry, no default):
# tuner.study.space refuses such a study with its own message.
_UNKNOWN = object()


def _baseline_value(spec: Any, param: Any) -> Any:
    """The baseline's value of ``param``: its ``baseline:`` entry, else the knob's default
    (False for a switch, null where null is a value), else _UNKNOWN."""
    if param.name in spec.baseline:
        return spec.baseline[param.name]
    if param.default is not None:
        return param.default
    if param.kind == "bool":
        return False
    if param.kind == "categorical" and None in param.values:
        return None
    return _UNKNOWN


def _same(a: Any, b: Any) -> bool:
    return bool(a == b) and (type(a) is type(b) or not (isinstance(a, bool) or isinstance(b, bool)))


def lossy_value_reason(param: Any, value: Any, baseline: Any) -> str | None:
    """Why ``param`` at ``value`` changes the model's answers by design, None when it does
    not: the parameter's own ``lossy:`` marking first (true: any value but the baseline's
    ``baseline``), else the knob table (``tuner.vllm.lossy``)."""
    if param.lossy is False:
        return None
    if param.lossy is True:
        if baseline is not _UNKNOWN and _same(value, baseline):
            return None
        return f"the parameter is marked lossy: true, and {value!r} is not the baseline's {baseline!r}" \
            if baseline is not _UNKNOWN else "the parameter is marked lossy: true"
    return lossy_reason(param.target, value)


def lossy_settings(spec: Any, values: Mapping[str, Any]) -> dict[str, tuple[Any, str]]:
    """The lossy values of one configuration (a trial's parameter values, inactive ones left
    out): parameter name -> (value, why it is lossy); empty for a lossless configuration,
    which needs no quality gate."""
    out: dict[str, tuple[Any, str]] = {}
    for param in spec.parameters:
        if param.name in values:
            value = values[param.name]
            if why := lossy_value_reason(param, value, _baseline_value(spec, param)):
                out[param.name] = (value, why)
    return out


def _candidates(param: Any, baseline: Any) -> Sequence[Any]:
    """The values of ``param`` worth asking about, without building a wide range: every
    listed value; of a range, its ends (a value other than the baseline's where there is one)."""
    if param.kind in ("categorical", "bool"):
        return list(param.domain())
    ends = [param.low, param.high]
    return [v for v in ends if baseline is _UNKNOWN or not _same(v, baseline)] or ends


def quality_problem(spec: Any, *, saved: bool = False) -> str | None:
    """The first reason ``spec`` cannot run as written where lossy values or its quality
    budget are concerned (one line), else None.

    ``saved``: a study's own spec.yaml. One written before lossy values needed a budget
    searched them without one (its lossy trials failed the probe), and must still open in
    ``status``, ``report`` and ``export``: only the quality section's own checks apply."""
    if saved:
        return None if spec.quality is None else _judging_problem(spec)
    for i, param in enumerate(spec.parameters):
        baseline = _baseline_value(spec, param)
        if baseline is not _UNKNOWN and (why := lossy_value_reason(param, baseline, baseline)):
            lossless = [v for v in _candidates(param, baseline) if not lossy_value_reason(param, v, baseline)]
            fix = f"set baseline.{param.name} to {lossless[0]!r}" if lossless else "search a lossless value too"
            return (f"baseline: {param.name} = {baseline!r} is lossy ({why}); the baseline is the quality "
                    f"reference every trial's accuracy is measured against, so it must be lossless: {fix} "
                    f"(or mark parameters[{i}] lossy: false if the value loses nothing for this model)")
    if spec.quality is None:
        for i, param in enumerate(spec.parameters):
            baseline = _baseline_value(spec, param)
            for value in _candidates(param, baseline):
                if why := lossy_value_reason(param, value, baseline):
                    return (f"parameters[{i}] ({param.name}): {value!r} is lossy ({why}); "
                            f"{BUDGET_HINT}, or drop the value")
        return None
    return _judging_problem(spec)


def _judging_problem(spec: Any) -> str | None:
    """Why the study's known answers cannot judge its quality budget, None when they can."""
    if not spec.probe.enabled:
        return ("quality: needs the probe (probe.enabled is false): the accuracy drop is measured on its "
                "known-answer items; turn the probe on or remove quality:")
    if dummy_weights(spec):
        return ("quality: the server loads dummy weights (load_format: dummy): random weights answer no "
                "known-answer item right, so there is no accuracy to hold a budget to; load the real "
                "weights or remove quality:")
    if spec.probe.mode == "reference_only":
        return ("quality: probe.mode is reference_only, which judges no known answer, and the accuracy "
                "drop is measured on them; set probe.mode to full (or auto) or remove quality:")
    if not spec.probe.reference.enabled:
        return ("quality: needs the probe's reference (probe.reference.enabled is false): the reference job "
                "records the reference's answers every lossy trial is paired with; turn it on or remove quality:")
    return None
