"""When a study run stops starting trials, and what it does once the last one is back: the
loop's decisions (tuner.engine.orchestrator), apart from its clock, executor and storage.

Pure: the loop passes the numbers in and acts on the answer.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["AfterTrials", "after_trials", "may_start", "out_of_time", "out_of_time_line"]

# What a run does once its trials are back: re-run the front (``confirm``), say why it
# does not (``skip``), or nothing (an interrupt, lost workers).
AfterTrials = Literal["confirm", "skip", "none"]


def may_start(stop_reason: str | None, finished_runs: int, in_flight: int, n_trials: int) -> bool:
    """Whether another trial may start: no stop reason yet, and the finished and running
    trials leave room in the budget."""

    return stop_reason is None and finished_runs + in_flight < n_trials


def out_of_time(elapsed_s: float, timeout_s: float | None, reserve_s: float) -> bool:
    """Whether new trials stop for the clock: the wall-clock limit less the time kept for
    the confirmation re-runs (``study.confirmation.reserve_seconds``) is reached."""

    return timeout_s is not None and elapsed_s >= timeout_s - reserve_s


def out_of_time_line(elapsed_s: float, timeout_s: float | None, reserve_s: float) -> str:
    """What the run says when ``out_of_time`` stops new trials."""

    if reserve_s and timeout_s is not None and elapsed_s < timeout_s:
        return (f"[budget] no new trials after {elapsed_s:.0f}s: the last {reserve_s:.0f}s of the "
                "wall-clock limit are kept for the confirmation re-runs; finishing running trials")
    return f"[budget] wall-clock limit reached after {elapsed_s:.0f}s; finishing running trials"


def after_trials(stop_reason: str | None, elapsed_s: float, timeout_s: float | None,
                 candidates: int) -> AfterTrials:
    """The front is re-run when the budget or the space ran out, or when the clock stopped
    new trials early enough to leave it time (the reserve); a run the clock stopped without
    that time says it skipped them (when the study confirms at all); an interrupted run
    does neither."""

    if stop_reason in ("budget", "exhausted"):
        return "confirm"
    if stop_reason == "timeout":
        if timeout_s is not None and elapsed_s < timeout_s:
            return "confirm"
        return "skip" if candidates > 0 else "none"
    return "none"
