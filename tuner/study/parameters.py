"""The study file's ``parameters:`` (the four kinds of searched knob and their domains) and
``forbidden:`` sections, and the checks of a value, a condition and the conditions' graph
against them (``StudySpec`` runs them across sections)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from tuner.study.spec_base import Condition, Scalar, Strict, env_text_or_none
from tuner.vllm.knobs import check_target_name, check_value
from tuner.vllm.multicast import MULTICAST_TARGETS

__all__ = ["Parameter", "CategoricalParam", "IntParam", "FloatParam", "BoolParam", "FloatSteps",
           "ForbiddenSpec", "check_in_domain", "check_condition", "check_acyclic",
           "multicast_candidates"]


class _ParamBase(Strict):
    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.\-]*$", description="unique parameter name")
    flag: str | None = Field(None, description="vLLM argument: snake_case or dotted config field")
    env: str | None = Field(None, description="environment variable the value goes to")
    when: Condition = Field(
        default_factory=dict,
        description="active only when every named parameter has one of the given values",
    )
    default: Any = Field(None, description="the server's value when this knob is not set")
    lossy: bool | None = Field(
        None, description="true: every value but the baseline's changes the model's answers (searched "
        "only under a quality: budget); false: none does, whatever the knob table says (e.g. the "
        "quantization a checkpoint is stored in); unset: the knob table decides (tuner/vllm/lossy.py)")
    description: str = ""

    @property
    def target(self) -> str:
        return self.flag if self.flag is not None else f"env:{self.env}"

    @model_validator(mode="after")
    def _one_target(self) -> _ParamBase:
        if (self.flag is None) == (self.env is None):
            raise ValueError(f"parameter {self.name!r}: give exactly one of 'flag' or 'env'")
        if error := check_target_name(self.target):
            raise ValueError(f"parameter {self.name!r}: {error}")
        return self


class CategoricalParam(_ParamBase):
    kind: Literal["categorical"]
    values: list[Scalar] = Field(min_length=1, description="choices; null means 'leave unset'")

    def domain_size(self) -> int:
        return len(self.values)

    @model_validator(mode="after")
    def _check_values(self) -> CategoricalParam:
        seen: set[str] = set()
        for value in self.values:
            key = repr(value)
            if key in seen:
                raise ValueError(f"parameter {self.name!r}: value {value!r} is listed twice")
            seen.add(key)
            checked = env_text_or_none(value) if self.env is not None else value
            if error := check_value(self.target, checked):
                raise ValueError(f"parameter {self.name!r} ({self.target}): {error}")
        return self

    def domain(self) -> list[Any]:
        return list(self.values)


class IntParam(_ParamBase):
    kind: Literal["int"]
    low: int
    high: int
    step: int = Field(1, ge=1)
    log: bool = False

    @model_validator(mode="after")
    def _check_range(self) -> IntParam:
        if self.low > self.high:
            raise ValueError(f"parameter {self.name!r}: low {self.low} is above high {self.high}")
        if self.log and (self.low < 1 or self.step != 1):
            raise ValueError(f"parameter {self.name!r}: log scale needs low >= 1 and step 1")
        for bound in (self.low, self.high):
            if error := check_value(self.target, bound):
                raise ValueError(f"parameter {self.name!r} ({self.target}): {error}")
        return self

    def domain(self) -> Sequence[Any]:
        # A range, not a list: membership, length and indexing without building a wide one.
        return range(self.low, self.high + 1, self.step)

    def domain_size(self) -> int:
        return (self.high - self.low) // self.step + 1

    def contains(self, value: Any) -> bool:
        """``value in domain()`` without building it (a range may be wide)."""

        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or value != int(value):
            return False
        return self.low <= value <= self.high and (int(value) - self.low) % self.step == 0


class FloatParam(_ParamBase):
    kind: Literal["float"]
    low: float
    high: float
    step: float | None = Field(None, gt=0)
    log: bool = False

    @model_validator(mode="after")
    def _check_range(self) -> FloatParam:
        if self.low > self.high:
            raise ValueError(f"parameter {self.name!r}: low {self.low} is above high {self.high}")
        if self.log and (self.low <= 0 or self.step is not None):
            raise ValueError(f"parameter {self.name!r}: log scale needs low > 0 and no step")
        return self

    def domain(self) -> Sequence[Any] | None:
        if self.step is None:
            return None
        return FloatSteps(self.low, self.step, int(round((self.high - self.low) / self.step)) + 1)

    def domain_size(self) -> int | None:
        return None if self.step is None else int(round((self.high - self.low) / self.step)) + 1


class FloatSteps(Sequence[float]):
    """low, low + step, ... (``count`` values, rounded as the sampler rounds them), built
    one at a time: a fine step over a wide range is a long sequence, never a long list."""

    def __init__(self, low: float, step: float, count: int) -> None:
        self._low, self._step, self._count = low, step, count

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._count))]
        if index < 0:
            index += self._count
        if not 0 <= index < self._count:
            raise IndexError(index)
        return round(self._low + index * self._step, 12)

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, (list, FloatSteps)) else NotImplemented


class BoolParam(_ParamBase):
    kind: Literal["bool"]

    def domain(self) -> list[Any]:
        return [False, True]


Parameter = Annotated[
    CategoricalParam | IntParam | FloatParam | BoolParam, Field(discriminator="kind")
]


class ForbiddenSpec(Strict):
    """A combination rejected before any server starts."""

    when: Condition = Field(min_length=1, description="every listed parameter matches")
    reason: str = Field(min_length=1, description="shown when the combination is rejected")


def multicast_candidates(param: Parameter) -> list[Any]:
    """The values of ``param`` worth asking multicast_use about, without building a large
    range: none for a target that cannot turn multicast on; for an integer range its ends
    and the 0 and 1 inside it (the on/off values of those switches)."""

    if param.target not in MULTICAST_TARGETS:
        return []
    if isinstance(param, IntParam):
        inside = {v for v in (0, 1) if param.low <= v <= param.high}
        return sorted({param.low, param.high} | inside)
    return list(param.domain() or [])


def check_condition(where: str, cond: Condition, params: dict[str, Any], *, exclude: str | None) -> None:
    """A ``when`` condition names known parameters (not ``exclude``) and values in their domains."""
    for name, expected in cond.items():
        if name == exclude:
            raise ValueError(f"{where}: a parameter cannot depend on itself")
        if name not in params:
            raise ValueError(
                f"{where}: {name!r} is not a parameter; parameters: {', '.join(params) or 'none'}"
            )
        for value in expected if isinstance(expected, list) else [expected]:
            check_in_domain(f"{where}.{name}", params[name], value)


def check_in_domain(where: str, param: Any, value: Any) -> None:
    """``value`` is one of ``param``'s values (ValueError naming ``where`` otherwise)."""
    if isinstance(param, IntParam):
        if not param.contains(value):
            raise ValueError(f"{where}: {value!r} is not one of {param.name}'s values "
                             f"({param.low}..{param.high} step {param.step})")
        return
    domain = param.domain()
    if isinstance(domain, FloatSteps) and isinstance(value, (int, float)) and not isinstance(value, bool):
        index = round((value - param.low) / param.step) if math.isfinite(value) else -1
        if not (0 <= index < len(domain) and math.isclose(domain[index], value, rel_tol=1e-9, abs_tol=1e-12)):
            raise ValueError(f"{where}: {value!r} is not one of {param.name}'s values "
                             f"({param.low}..{param.high} step {param.step})")
        return
    if domain is None:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not (
            param.low <= value <= param.high
        ):
            raise ValueError(f"{where}: {value!r} is outside [{param.low}, {param.high}]")
        return
    if not any(value == d and type(value) is type(d) for d in domain) and not (
        isinstance(value, (int, float)) and not isinstance(value, bool) and value in domain
    ):
        shown = ", ".join("null" if d is None else repr(d) for d in domain[:12])
        more = ", ..." if len(domain) > 12 else ""
        raise ValueError(f"{where}: {value!r} is not one of {param.name}'s values ({shown}{more})")


def check_acyclic(params: dict[str, Any]) -> None:
    """The parameters' ``when`` conditions form no cycle."""

    state: dict[str, int] = {}

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            raise ValueError(f"parameters: conditions form a cycle: {' -> '.join(path + [name])}")
        state[name] = 1
        for parent in params[name].when:
            visit(parent, path + [name])
        state[name] = 2

    for name in params:
        visit(name, [])
