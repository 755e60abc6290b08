"""When the study loop stops starting trials and whether it re-runs the front afterwards
(tuner.study.stopping), on hand-made numbers; the loop itself: tests/test_study_loop.py."""

from __future__ import annotations

import pytest

from tuner.study.stopping import after_trials, may_start, out_of_time, out_of_time_line


def test_a_trial_starts_only_within_the_budget_and_before_any_stop() -> None:
    assert may_start(None, finished_runs=3, in_flight=1, n_trials=5)
    assert not may_start(None, finished_runs=3, in_flight=2, n_trials=5)     # the rest is running
    assert not may_start("timeout", finished_runs=0, in_flight=0, n_trials=5)


def test_the_clock_stops_new_trials_early_enough_for_the_confirmation_reserve() -> None:
    assert not out_of_time(1e9, None, 0.0)                       # no wall-clock limit
    assert not out_of_time(599.0, 600.0, 0.0)
    assert out_of_time(600.0, 600.0, 0.0)
    assert out_of_time(480.0, 600.0, 120.0)                      # the last 120 s are kept
    assert out_of_time_line(480.0, 600.0, 120.0).startswith(
        "[budget] no new trials after 480s: the last 120s of the wall-clock limit are kept")
    assert out_of_time_line(600.0, 600.0, 120.0) == (
        "[budget] wall-clock limit reached after 600s; finishing running trials")
    assert out_of_time_line(600.0, 600.0, 0.0) == out_of_time_line(600.0, 600.0, 120.0)


@pytest.mark.parametrize(("reason", "elapsed", "candidates", "after"), [
    ("budget", 10.0, 0, "confirm"),        # confirm_front itself does nothing without candidates
    ("exhausted", 10.0, 2, "confirm"),
    ("timeout", 500.0, 2, "confirm"),       # stopped by the reserve: the re-runs have their time
    ("timeout", 600.0, 2, "skip"),          # the limit itself: say so, re-run nothing
    ("timeout", 600.0, 0, "none"),
    ("interrupted", 10.0, 2, "none"),
    ("no_workers", 10.0, 2, "none"),
])
def test_the_front_is_re_run_when_the_budget_or_space_ran_out_or_the_reserve_left_time(
        reason: str, elapsed: float, candidates: int, after: str) -> None:
    assert after_trials(reason, elapsed, 600.0, candidates) == after
