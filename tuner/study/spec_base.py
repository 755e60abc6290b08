"""What every model of the study file shares: the strict base (frozen, unknown keys
refused, no NaN or infinity), the scalar values flags, environment and conditions hold,
durations, and how a scalar is written into the environment.

The models themselves: ``tuner.study.server_spec`` (server:), ``tuner.study.parameters``
(parameters:, forbidden:), ``tuner.study.objectives`` (objectives:, limits:) and
``tuner.study.spec`` (the rest, and the whole ``StudySpec``).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict

from tuner.study.durations import parse_duration
from tuner.vllm.knobs import env_text

__all__ = ["Strict", "Scalar", "Seconds", "Condition", "env_text_or_none"]

Scalar = str | int | float | bool | None
Seconds = Annotated[float, BeforeValidator(parse_duration)]
Condition = dict[str, Scalar | list[Scalar]]


class Strict(BaseModel):
    # allow_inf_nan: a NaN limit or an infinite timeout reaches arithmetic that assumes
    # ordinary numbers (early stop, durations); refused where it is written.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


def env_text_or_none(value: Scalar) -> str | None:
    """A scalar as an environment variable's text (booleans as 1/0); None stays None."""

    return None if value is None else env_text(value)
