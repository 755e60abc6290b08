"""The study file's ``load.trace:``: a timed dataset replayed at its own timestamps, as one
open-loop level named ``trace`` (pure).

Which requests the level sends (a window of the trace, then a cap) and when: request i of the
selection is due ``(t_i - t_first) * time_scale`` seconds after the level starts, ``t`` being
the trace's own timestamps and ``t_first`` the first selected one's, so the trace's gaps and
bursts are kept (compressed or stretched by ``time_scale``) and the level starts with its first
request. The runner is :mod:`tuner.load.open_levels`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tuner.load.dataset import Dataset, TraceRequest
from tuner.load.level_names import TRACE_LEVEL, is_open_level

__all__ = ["TRACE_LEVEL", "TraceSpec", "field_rule", "is_open_level", "select_trace", "trace_problem",
           "trace_schedule", "trace_text"]


def field_rule(name: str, ok: Callable[[Any], bool], allowed: str, *, shown: str = "!r") -> Any:
    """A field validator of a study-file model: ``name``'s value (None passes) must satisfy
    ``ok``, else one line names the field, the value (``shown``: repr, or ``g`` format)
    and what is ``allowed``."""

    def check(value: Any) -> Any:
        if value is not None and not ok(value):
            text = repr(value) if shown == "!r" else format(value, shown)
            raise ValueError(f"{name}={text} is not allowed; allowed: {allowed}")
        return value

    return field_validator(name)(check)


class TraceSpec(BaseModel):
    """How the trace level replays the dataset's timestamps. Present (``load.trace: {}`` for
    every default): the level is measured, after the rate levels."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    time_scale: float = Field(
        default=1.0,
        description="Multiplies every gap between requests: 1.0 replays at the trace's own pace, "
                    "0.5 twice as fast, 2.0 half as fast.")
    start_s: float = Field(
        default=0.0,
        description="Start of the replayed window, in seconds of trace time after its first request.")
    duration_s: float | None = Field(
        default=None,
        description="Length of the window in seconds of trace time (None: to the trace's end).")
    max_requests: int | None = Field(
        default=None,
        description="At most this many requests: the window's first ones (None: all of them).")

    _valid_scale = field_rule("time_scale", lambda v: math.isfinite(v) and v > 0,
                              "a finite number > 0 (1.0: the trace's own pace, 0.5: twice as fast)", shown="g")
    _valid_start = field_rule("start_s", lambda v: math.isfinite(v) and v >= 0,
                              "a finite number of seconds >= 0 (trace time after its first request)", shown="g")
    _valid_duration = field_rule("duration_s", lambda v: math.isfinite(v) and v > 0,
                                 "a finite number of seconds > 0, or null for the rest of the trace", shown="g")
    _valid_cap = field_rule("max_requests", lambda v: v >= 1,
                            "an integer >= 1, or null for every request of the window")


def select_trace(trace: Sequence[TraceRequest], spec: TraceSpec) -> list[TraceRequest]:
    """The requests the level sends: those in the window (``start_s`` <= offset from the
    trace's first request < ``start_s + duration_s``), then the first ``max_requests``."""

    if not trace:
        return []
    first_ms = trace[0].timestamp_ms
    end = math.inf if spec.duration_s is None else spec.start_s + spec.duration_s
    chosen = [r for r in trace if spec.start_s <= (r.timestamp_ms - first_ms) / 1000.0 < end]
    return chosen if spec.max_requests is None else chosen[: spec.max_requests]


def trace_schedule(selected: Sequence[TraceRequest], time_scale: float) -> list[float]:
    """Due times in seconds from the level start: the first selected request at 0."""

    if not selected:
        return []
    first_ms = selected[0].timestamp_ms
    return [(r.timestamp_ms - first_ms) / 1000.0 * time_scale for r in selected]


def trace_problem(dataset: Dataset, spec: TraceSpec, *, max_level_seconds: float) -> str | None:
    """Why ``load.trace`` cannot replay ``dataset``, one line (None: it can). Checked when the
    study is read, before any server starts."""

    if not dataset.timed:
        return (f"load.trace replays a timed dataset, and format {dataset.format} has no timestamps; "
                "use a mooncake trace (timestamp, input_length, output_length, hash_ids) or remove load.trace")
    selected = select_trace(dataset.trace, spec)
    span = (dataset.trace[-1].timestamp_ms - dataset.trace[0].timestamp_ms) / 1000.0
    if not selected:
        end = "the end" if spec.duration_s is None else f"{spec.start_s + spec.duration_s:g} s"
        return (f"load.trace: the window from {spec.start_s:g} s to {end} holds none of the trace's "
                f"{len(dataset.trace):,} requests (they span {span:g} s); allowed: start_s below {span:g}")
    last = trace_schedule(selected, spec.time_scale)[-1]
    if last >= max_level_seconds:
        return (f"load.trace: the replay of {len(selected):,} requests lasts {last:g} s at time_scale "
                f"{spec.time_scale:g}, not within load.max_level_seconds={max_level_seconds:g}; shorten it "
                "(duration_s, max_requests, a smaller time_scale) or raise load.max_level_seconds")
    return None


def trace_text(dataset: Dataset, spec: TraceSpec) -> str:
    """What the trace level will replay, one line (for the output when the study is read)."""

    selected = select_trace(dataset.trace, spec)
    first_ms = dataset.trace[0].timestamp_ms
    start = (selected[0].timestamp_ms - first_ms) / 1000.0
    end = (selected[-1].timestamp_ms - first_ms) / 1000.0
    lasts = trace_schedule(selected, spec.time_scale)[-1]
    return (f"trace level: {len(selected):,} of {len(dataset.trace):,} requests (trace time {start:g} s to "
            f"{end:g} s), replayed in {lasts:g} s at time_scale {spec.time_scale:g}")
