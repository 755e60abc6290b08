"""Fault injection for the simulator (pure: parsing and matching; the effects live in the
modules that own the behaviour).

TUNER_SIM_FAULTS is a JSON list of objects `{"fault": NAME, "when": {target: value}, ...}`.
`when` is matched against the configuration the trial *asked* for, so a test can make one
specific configuration misbehave (e.g. only FULL cudagraphs produce garbage), which is how the
tuner's verifiers are exercised. A list value in `when` means "any of these".
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

FaultName = Literal[
    "slow_start", "crash_at_start", "oom_at_start", "hang_at_start", "crash_mid_load",
    "hang_mid_stream", "ignore_sigterm", "garbage_sse", "http_5xx", "garbage",
    "diverge_after_tokens", "garbage_when_batch_gt", "garbage_when_batch_lt",
    "garbage_when_prompt_gt", "garbage_when_prompt_in", "garbage_when_batch_eq",
    "garbage_for_wording", "garbage_on_turn",
    "silent_downgrade", "usage_lie", "html_reply", "huge_reply",
]
FAULT_NAMES: tuple[str, ...] = FaultName.__args__  # type: ignore[attr-defined]

_REQUIRED: dict[str, tuple[str, ...]] = {
    "slow_start": ("seconds",),
    "diverge_after_tokens": ("tokens",),
    "garbage_when_batch_gt": ("batch",),
    "garbage_when_batch_lt": ("batch",),
    "garbage_when_prompt_gt": ("tokens",),
    "garbage_when_prompt_in": ("low", "high"),
    "garbage_when_batch_eq": ("batch",),
    "garbage_for_wording": ("pattern",),
    "garbage_on_turn": ("turn",),
    "silent_downgrade": ("target", "value"),
    "huge_reply": ("megabytes",),
}


class Fault(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    fault: FaultName
    when: dict[str, Any] | None = None
    seconds: float | None = None        # slow_start: extra simulated startup seconds
    after_requests: int = 0             # request-count faults: the first N requests are fine
    count: int = 1                      # http_5xx: how many requests get a 500
    # Which requests after_requests / count count: all of them, or streamed ones only (the
    # load generator streams, the probe does not), so a fault aimed at the load phase stays
    # there however many requests the probe sends.
    counting: Literal["all", "streamed"] = "all"
    tokens: int | None = None           # diverge_after_tokens / garbage_when_prompt_gt
    batch: int | None = None            # garbage_when_batch_gt / _lt / _eq (lt 2: size 1 only)
    # Shape- and prompt-dependent corruption (issue 14: real kernels, graphs and caches are
    # specialised by shape, so real corruption often shows for some prompts only).
    low: int | None = None              # garbage_when_prompt_in: prompt tokens in [low, high)
    high: int | None = None
    pattern: str | None = None          # garbage_for_wording: regex on the last user message
    turn: int | None = None             # garbage_on_turn: chats with at least this many user turns
    target: str | None = None           # silent_downgrade: e.g. compilation_config.cudagraph_mode
    value: Any = None                   # silent_downgrade: the value actually used;
    #                                     usage_lie: the completion_tokens streamed instead
    factor: float | None = None         # usage_lie: streamed completion_tokens x factor
    megabytes: float | None = None      # huge_reply: size of the one line / body sent

    @model_validator(mode="after")
    def _params(self) -> Fault:
        missing = [p for p in _REQUIRED.get(self.fault, ()) if getattr(self, p) is None]
        if missing:
            raise ValueError(f"fault {self.fault!r} needs {', '.join(missing)}")
        if self.fault == "usage_lie" and (self.value is None) == (self.factor is None):
            raise ValueError("fault 'usage_lie' needs one of value (the count sent) or factor")
        if self.after_requests < 0 or self.count < 0:
            raise ValueError("after_requests and count must be >= 0")
        return self


class FaultError(Exception):
    """TUNER_SIM_FAULTS could not be parsed; the message says why."""


def parse_faults(text: str | None) -> list[Fault]:
    if not text or not text.strip():
        return []
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FaultError(f"TUNER_SIM_FAULTS is not valid JSON: {exc}") from exc
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list):
        raise FaultError("TUNER_SIM_FAULTS must be a JSON list of fault objects")
    faults = []
    for i, item in enumerate(data):
        try:
            faults.append(Fault.model_validate(item))
        except ValidationError as exc:
            raise FaultError(f"TUNER_SIM_FAULTS[{i}]: {exc}") from exc
    return faults


def _norm(value: Any) -> Any:
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        low = value.strip().lower()
        if low in ("true", "false"):
            return low == "true"
        if low in ("none", "null"):
            return None
        try:
            return float(low)
        except ValueError:
            return low
    return value


def value_matches(expected: Any, actual: Any) -> bool:
    """Loose equality: case-insensitive strings, "true"/True, "3"/3; a list means any-of."""
    if isinstance(expected, list):
        return any(value_matches(e, actual) for e in expected)
    return _norm(expected) == _norm(actual)


def applies(fault: Fault, lookup: Callable[[str], Any]) -> bool:
    """Whether the fault's `when` matches; `lookup(target)` gives the asked value."""
    if not fault.when:
        return True
    return all(value_matches(v, lookup(k)) for k, v in fault.when.items())


class ActiveFaults:
    """The faults whose `when` matched this run's asked configuration."""

    def __init__(self, faults: Sequence[Fault]) -> None:
        self.faults = tuple(faults)

    def get(self, name: str) -> Fault | None:
        return next((f for f in self.faults if f.fault == name), None)

    def all(self, name: str) -> list[Fault]:
        return [f for f in self.faults if f.fault == name]

    def __contains__(self, name: str) -> bool:
        return self.get(name) is not None
