"""The study file's ``objectives:`` and ``limits:``: a metric read at a load level (a
concurrency, an open-loop rate, the trace replay, or the trial itself), maximized, minimized
or bounded."""

from __future__ import annotations

import difflib
import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from tuner.load.efficiency import EFFICIENCY_KEYS
from tuner.load.level_energy import ENERGY_KEYS
from tuner.load.load_spec import rate_level_name
from tuner.load.metrics import EXTRA_FLAT_KEYS, FLAT_KEYS
from tuner.load.slo import GOODPUT_KEYS
from tuner.load.trace_spec import TRACE_LEVEL
from tuner.study.spec_base import Strict
from tuner.study.trial_metrics import TRIAL_METRICS

__all__ = ["KNOWN_METRICS", "ObjectiveSpec", "LimitSpec", "MAX_RATE", "TRIAL_METRICS", "level_label", "open_level"]


_METRIC = re.compile(r"^[a-z_]+(\.(mean|p50|p90|p99))?$")
MAX_RATE = "max_rate@slo"
# Every name a level or a trial carries a value under (docs/study-file.md): a name outside it
# would be read as "not measured" in every trial, so it is refused before any server starts.
KNOWN_METRICS: frozenset[str] = frozenset(
    (*FLAT_KEYS, *(k for k in EXTRA_FLAT_KEYS if _METRIC.match(k)), *GOODPUT_KEYS, *EFFICIENCY_KEYS, *ENERGY_KEYS,
     *TRIAL_METRICS, MAX_RATE))


def level_label(metric: str, concurrency: int | str, rate: float | None, level: str | None = None) -> str:
    if metric in TRIAL_METRICS or metric == MAX_RATE:
        return metric
    if level is not None:
        return f"{metric}@{level}"
    if rate is not None:
        return f"{metric}@{rate_level_name(rate)}"
    return f"{metric}@c{concurrency}"


def open_level(item: object) -> str | None:
    """The open-loop level an objective or limit reads (``r2.0``, ``trace``); None: a
    concurrency level or the trial."""
    if getattr(item, "level", None) == TRACE_LEVEL:
        return TRACE_LEVEL
    rate = getattr(item, "rate", None)
    return None if rate is None else rate_level_name(rate)


class ObjectiveSpec(Strict):
    metric: str = Field(description="e.g. output_tok_s, tpot_ms.mean, ttft_ms.p99, startup_s, "
                        "accuracy_drop (with a quality: section), goodput_req_s, max_rate@slo")
    concurrency: int | Literal["max", "min"] = Field(
        "max", description="load level the metric is read at (ignored for trial-level metrics)"
    )
    rate: float | None = Field(
        None, gt=0, description="read at the open-loop level of this rate (one of "
        "load.request_rates) instead of a concurrency level: label metric@r<rate>")
    level: Literal["trace"] | None = Field(
        None, description="trace: read at the trace level (load.trace, a timed dataset replayed at "
        "its timestamps) instead of a concurrency level: label metric@trace")
    direction: Literal["maximize", "minimize"]

    @field_validator("metric")
    @classmethod
    def _check_metric(cls, metric: str) -> str:
        if metric not in KNOWN_METRICS:
            close = difflib.get_close_matches(metric, sorted(KNOWN_METRICS), n=1, cutoff=0.75)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ValueError(
                f"{metric!r} is not a metric the tuner measures; {hint}use e.g. output_tok_s, request_per_s, "
                "tpot_ms.mean, ttft_ms.p99, e2el_ms.p50, goodput_req_s, or one of "
                + ", ".join((*TRIAL_METRICS, MAX_RATE)) + " (every name: docs/study-file.md)"
            )
        return metric

    @property
    def label(self) -> str:
        return level_label(self.metric, self.concurrency, self.rate, self.level)


class LimitSpec(Strict):
    """A service-level limit; a trial that misses it is infeasible (told as a constraint)."""

    metric: str
    concurrency: int | Literal["max", "min"] = "max"
    rate: float | None = Field(None, gt=0)
    level: Literal["trace"] | None = None
    max: float | None = None
    min: float | None = None

    _check_metric = field_validator("metric")(ObjectiveSpec._check_metric.__func__)  # type: ignore[attr-defined]

    @model_validator(mode="after")
    def _one_bound(self) -> LimitSpec:
        if (self.max is None) == (self.min is None):
            raise ValueError(f"limit on {self.metric!r}: give exactly one of 'max' or 'min'")
        return self

    @property
    def label(self) -> str:
        bound = f"<={self.max}" if self.max is not None else f">={self.min}"
        return f"{level_label(self.metric, self.concurrency, self.rate, self.level)}{bound}"

