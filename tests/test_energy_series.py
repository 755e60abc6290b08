"""The energy arithmetic by hand: interpolation over a window, counter wrap, joules per
token with its interval, the idle draw (tuner.energy.series, tuner.energy.per_token)."""

from __future__ import annotations

import math

import pytest

from tuner.energy.per_token import CounterResolution, idle_draw, joules_per_token, window_joules_per_token
from tuner.energy.series import counter_delta, energy_at, energy_between, mean_watts, shifted
from tuner.load.window import WindowRates

NO_RESOLUTION = CounterResolution(0.0, 0.0)


def test_energy_is_interpolated_linearly_between_samples() -> None:
    series = [(0.0, 0.0), (1.0, 10.0), (3.0, 50.0)]
    assert energy_at(series, 2.0) == pytest.approx(30.0)
    assert energy_at(series, 3.0) == 50.0
    assert energy_between(series, 0.5, 2.0) == pytest.approx(25.0)
    assert mean_watts(series, 1.0, 3.0) == pytest.approx(20.0)


def test_a_window_outside_the_samples_is_refused_not_extrapolated() -> None:
    series = [(1.0, 0.0), (2.0, 10.0)]
    with pytest.raises(ValueError, match="outside the sampled span"):
        energy_between(series, 0.5, 1.5)
    with pytest.raises(ValueError, match="no energy samples"):
        energy_at([], 0.0)
    with pytest.raises(ValueError, match="before its start"):
        energy_between(series, 1.8, 1.2)


def test_shifted_moves_the_time_base_to_the_level_start() -> None:
    assert shifted([(100.5, 1.0), (101.0, 2.0)], 100.0) == [(0.5, 1.0), (1.0, 2.0)]


def test_counter_delta_across_a_wrap_and_a_reset() -> None:
    assert counter_delta(100, 250, 1000) == 150
    # RAPL wrapped past max_energy_range_uj=1000: 900 -> 1000 -> 0 -> 50
    assert counter_delta(900, 50, 1000) == 150
    # no known range (NVML): a smaller reading is a reset, counted from zero
    assert counter_delta(5000, 30, None) == 30


def test_joules_per_token_and_its_interval_by_hand() -> None:
    # 100 W throughout; window [2, 8] in 3 sub-windows of 2 s (200 J each) holding
    # 100, 200 and 100 tokens: 2, 1 and 2 J/token; in all 600 J / 400 tokens.
    series = [(float(t), 100.0 * t) for t in range(11)]
    res = CounterResolution(quantum_j=0.001, update_s=0.1)
    got = joules_per_token(series, 2.0, 8.0, [100, 200, 100], res)
    assert got is not None
    assert got.joules == pytest.approx(600.0)
    assert got.joules_per_token == pytest.approx(1.5)
    assert got.mean_watts == pytest.approx(100.0)
    assert got.subwindow_joules_per_token == pytest.approx([2.0, 1.0, 2.0])
    # spread: sd of (2, 1, 2) = 0.57735, / sqrt(3) = 0.33333, x t95(2 df) 4.303 = 1.43433
    # counter: each end 0.001 J + 100 W x 0.1 s = 10.001 J, both ends over 400 tokens
    assert got.resolution_j_per_token == pytest.approx(2 * 10.001 / 400)
    assert got.ci95 == pytest.approx(4.303 * math.sqrt(1 / 3) / math.sqrt(3) + 2 * 10.001 / 400, rel=1e-4)
    assert got.n == 3


def test_sub_windows_without_tokens_and_a_window_without_any() -> None:
    series = [(0.0, 0.0), (4.0, 400.0)]
    one = joules_per_token(series, 0.0, 4.0, [0, 100], NO_RESOLUTION)
    assert one is not None and one.joules_per_token == pytest.approx(4.0)
    assert one.ci95 is None and one.n == 1          # one sub-window with tokens: no spread
    assert joules_per_token(series, 0.0, 4.0, [0, 0], NO_RESOLUTION) is None


def test_window_joules_per_token_uses_the_throughputs_sub_windows() -> None:
    series = [(float(t), 50.0 * t) for t in range(0, 21)]
    rates = WindowRates(output_tok_s=25.0, window_start_s=4.0, window_end_s=16.0, window_s=12.0,
                        window_fallback=False, window_fallback_reason=None, subwindow_s=4.0,
                        subwindow_output_tok_s=[20.0, 25.0, 30.0])
    got = window_joules_per_token(series, rates, NO_RESOLUTION)
    assert got is not None
    assert got.joules_per_token == pytest.approx(600.0 / 300.0)    # 50 W / 25 tok/s
    assert got.subwindow_joules_per_token == pytest.approx([2.5, 2.0, 200 / 120])
    # a level that fell back to its whole run: one window, no spread
    fallback = WindowRates(output_tok_s=25.0, window_start_s=1.0, window_end_s=9.0, window_s=8.0)
    whole = window_joules_per_token(series, fallback, NO_RESOLUTION)
    assert whole is not None and whole.joules_per_token == pytest.approx(2.0) and whole.ci95 is None
    assert window_joules_per_token(series, WindowRates(), NO_RESOLUTION) is None


def test_idle_draw_is_the_mean_power_with_its_spread() -> None:
    # 10 s at 60 W, then 10 s at 80 W: five parts of 4 s read 60, 60, 70, 80, 80 W
    series = [(0.0, 0.0), (10.0, 600.0), (20.0, 1400.0)]
    got = idle_draw(series, 0.0, 20.0, CounterResolution(0.0, 0.5))
    assert got.watts == pytest.approx(70.0)
    assert got.seconds == 20.0 and got.n == 5
    sd = math.sqrt((2 * 10**2 + 0 + 2 * 10**2) / 4)
    assert got.ci95 == pytest.approx(2.776 * sd / math.sqrt(5) + 2 * 70 * 0.5 / 20)
