"""The max_rate@slo search's decisions (tuner.load.rate_search), on synthetic latency curves:
bracketing, narrowing to the stated precision in a bounded number of levels, and the
edges (missed at the lowest rate, met at the highest, noise near the boundary)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest
from pydantic import ValidationError

from tuner.load.rate_search import RateSearch, RateSearchSpec, boundary_fit, round_rate

Curve = Callable[[float], float]       # rate -> latency / bound (margin); <= 1 meets


def mm1(capacity: float, base: float) -> Curve:
    """An M/M/1-shaped latency (base / (1 - rate/capacity)), queue blow-up beyond capacity."""
    return lambda r: base / (1 - r / capacity) if r < capacity else 50 * base * r / capacity


def run(spec: RateSearchSpec, curve: Curve, hint: float | None = None) -> RateSearch:
    search = RateSearch(spec, hint=hint)
    while (rate := search.next_rate()) is not None:
        margin = curve(rate)
        search.observe(rate, margin <= 1, margin)
    return search


def test_spec_checks_its_range() -> None:
    with pytest.raises(ValidationError, match="high=1.0 must be above low=2.0"):
        RateSearchSpec(low=2, high=1)
    with pytest.raises(ValidationError, match="start=50.0 is outside"):
        RateSearchSpec(low=1, high=10, start=50)
    with pytest.raises(ValidationError):
        RateSearchSpec(precision=0)


@pytest.mark.parametrize("seed", range(10))
def test_finds_the_boundary_within_precision_in_bounded_levels(seed: int) -> None:
    rng = random.Random(seed)
    capacity = 10 ** rng.uniform(-0.5, 1.5)
    base = rng.uniform(0.05, 0.8)              # latency at zero load, as a share of the bound
    truth = capacity * (1 - base)
    spec = RateSearchSpec(low=0.1, high=100, precision=0.05, max_levels=7)
    search = run(spec, mm1(capacity, base), hint=capacity * rng.uniform(0.7, 1.3))
    result = search.result()
    assert result.status == "found"
    assert result.levels <= 7
    lo, hi = result.bracket
    assert lo is not None and hi is not None and lo <= truth < hi
    assert hi / lo - 1 <= 0.05 + 1e-9
    assert result.max_rate == lo and abs(result.max_rate - truth) / truth <= 0.05
    assert not result.lower_bound and not result.non_monotonic


def test_every_probe_is_recorded_in_order() -> None:
    search = run(RateSearchSpec(low=0.1, high=100), mm1(4.0, 0.3), hint=4.0)
    result = search.result()
    assert [p["rate"] for p in result.probes] == [p.rate for p in search.probes]
    assert result.probes[0]["rate"] == 4.0 and result.probes[0]["met"] is False
    assert all(p["margin"] is not None for p in result.probes)
    assert result.levels == len(result.probes)


def test_without_a_hint_it_starts_in_the_geometric_middle() -> None:
    search = RateSearch(RateSearchSpec(low=0.1, high=1000))
    assert search.next_rate() == round_rate(math.sqrt(0.1 * 1000))


def test_missed_at_the_lowest_rate_is_slo_unmet() -> None:
    spec = RateSearchSpec(low=0.5, high=50, max_levels=7)
    search = run(spec, lambda r: 3.0, hint=20)          # the SLO fails at any rate
    result = search.result()
    assert result.status == "slo_unmet" and result.max_rate == 0.0
    assert result.probes[-1]["rate"] == 0.5 and result.probes[-1]["met"] is False
    assert result.levels <= 7


def test_the_last_level_goes_to_the_lowest_rate_when_nothing_met() -> None:
    # Margin near 1 shrinks slowly: without the last-level rule the search would end
    # without knowing whether the SLO can be met at all.
    spec = RateSearchSpec(low=0.01, high=100, max_levels=3)
    search = run(spec, lambda r: 1.05, hint=50)
    assert search.probes[-1].rate == 0.01
    assert search.result().status == "slo_unmet"


def test_met_at_the_highest_rate_is_a_lower_bound() -> None:
    spec = RateSearchSpec(low=0.1, high=20, max_levels=7)
    search = run(spec, lambda r: 0.3, hint=2.0)
    result = search.result()
    assert result.status == "lower_bound" and result.lower_bound
    assert result.max_rate == 20 and result.bracket == (20, None)


def test_level_budget_spent_keeps_the_bracket_and_says_so() -> None:
    spec = RateSearchSpec(low=0.1, high=100, precision=0.001, max_levels=4)
    result = run(spec, mm1(5.0, 0.5), hint=5.0).result()
    assert result.status == "levels" and result.levels == 4
    lo, hi = result.bracket
    assert lo is not None and hi is not None and lo <= 2.5 < hi
    assert result.max_rate == lo and result.precision > 0.001


def test_noise_near_the_boundary_never_credits_a_rate_above_a_miss() -> None:
    # True boundary at 4.0; within 10 % of it the verdict is a coin flip, the noise of a
    # p99 from a short level. Whatever the flips, the answer is a rate that met, below
    # the lowest rate that missed, within the noisy band, and found in <= 7 levels.
    for seed in range(40):
        rng = random.Random(seed)

        def noisy(r: float, rng: random.Random = rng) -> float:
            if abs(r / 4.0 - 1) < 0.10:
                return rng.choice([0.97, 1.03])
            return r / 4.0

        result = run(RateSearchSpec(low=0.1, high=100, max_levels=7), noisy, hint=6.0).result()
        lo, hi = result.bracket
        misses = [p["rate"] for p in result.probes if not p["met"]]
        assert lo is not None and lo == result.max_rate
        assert all(lo < m for m in misses)
        assert 4.0 * 0.9 * 0.95 <= lo <= 4.0 * 1.1
        assert result.levels <= 7


def test_a_met_rate_above_a_missed_one_is_recorded_as_non_monotonic() -> None:
    search = RateSearch(RateSearchSpec(low=0.1, high=100))
    search.observe(4.0, False, 1.02)
    search.observe(4.4, True, 0.98)       # noise: met above a miss
    search.observe(3.0, True, 0.7)
    result = search.result()
    assert result.bracket == (3.0, 4.0)     # the miss at 4.0 bounds the answer
    assert result.max_rate == 3.0
    assert result.non_monotonic == [(4.0, 4.4)]


def test_configured_levels_are_free_verdicts() -> None:
    search = RateSearch(RateSearchSpec(low=0.1, high=100, max_levels=3))
    search.observe(2.0, True, 0.6, reused=True)
    search.observe(8.0, False, 3.0, reused=True)
    assert search.measured == 0
    nxt = search.next_rate()
    assert nxt is not None and 2.0 < nxt < 8.0      # narrowing at once, no bracketing


def test_optimistic_is_the_lowest_miss_or_the_highest_rate() -> None:
    search = RateSearch(RateSearchSpec(low=0.1, high=50))
    assert search.optimistic() == 50
    search.observe(10.0, True, 0.5)
    assert search.optimistic() == 50
    search.observe(20.0, False, 2.0)
    assert search.optimistic() == 20.0


def test_ended_by_the_caller() -> None:
    search = RateSearch(RateSearchSpec(low=0.1, high=50))
    search.observe(10.0, True, 0.5)
    search.ended = "budget"
    assert search.next_rate() is None
    result = search.result()
    assert result.status == "budget" and result.max_rate == 10.0 and result.lower_bound


def power(truth: float, k: float) -> Curve:
    """Latency growing as rate**k (TPOT with batch size), at the bound at ``truth``."""
    return lambda r: (r / truth) ** k


def wall(knee: float, base: float, steep: float) -> Curve:
    """Flat until a knee, then a quadratic wall (TTFT before and after saturation)."""
    return lambda r: 100.0 if r > 3 * knee else base + steep * max(0.0, r - knee) ** 2


def boundary(curve: Curve) -> float:
    lo, hi = 0.1, 100.0
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if curve(mid) <= 1 else (lo, mid)
    return lo


@pytest.mark.parametrize("shape", ["mm1", "power", "wall"])
def test_levels_on_many_curve_shapes(shape: str) -> None:
    # The narrowing (module docstring, step 3) on 150 random curves of each shape, the
    # first rate up to 3x off: within 5 % in <= 7 levels, ~5 on average (bisection after
    # the same bracketing takes 6.7).
    rng = random.Random(1)
    levels = []
    for _ in range(150):
        if shape == "mm1":
            capacity = 10 ** rng.uniform(-0.5, 1.5)
            curve, hint = mm1(capacity, rng.uniform(0.05, 0.8)), capacity * rng.uniform(0.7, 1.3)
        elif shape == "power":
            truth = 10 ** rng.uniform(-0.5, 1.5)
            curve, hint = power(truth, rng.uniform(0.7, 2.5)), truth * rng.uniform(0.5, 3)
        else:
            knee = 10 ** rng.uniform(-0.5, 1.2)
            curve = wall(knee, rng.uniform(0.2, 0.9), rng.uniform(0.05, 2) / knee ** 2)
            hint = knee * rng.uniform(1, 3)
        truth = boundary(curve)
        if not 0.2 < truth < 90:
            continue
        result = run(RateSearchSpec(low=0.1, high=100), curve, hint=hint).result()
        assert result.levels <= 7
        assert abs(result.max_rate - truth) / truth <= 0.05
        levels.append(result.levels)
    assert sum(levels) / len(levels) < 5.6


# -- the boundary fit (verdicts within noise) ------------------------------------------------

def test_boundary_fit_finds_the_crossing_of_a_power_law() -> None:
    # margin = (rate/4)**0.8: log margin is a line in log rate, crossing 1 at 4.0.
    points = [(r, (r / 4.0) ** 0.8, 1) for r in (3.5, 3.8, 4.3, 4.6)]
    fit = boundary_fit(points)
    assert fit is not None
    assert fit.rate == pytest.approx(4.0) and fit.slope == pytest.approx(0.8)
    assert fit.levels == 4 and fit.runs == 4


def test_boundary_fit_leaves_out_margins_off_the_boundary() -> None:
    near = [(r, (r / 4.0) ** 0.8, 1) for r in (3.6, 4.4)]
    # A blown-up queue (x20) and an idle level (x0.1) lie on other parts of the curve.
    fit = boundary_fit(near + [(9.0, 20.0, 1), (0.5, 0.1, 1)])
    assert fit is not None and fit.rate == pytest.approx(4.0) and fit.levels == 2


def test_boundary_fit_weighs_a_level_by_its_runs() -> None:
    # Three runs pooled at one rate weigh as three levels there.
    pooled = boundary_fit([(3.6, 0.9, 3), (4.4, 1.1, 1), (4.0, 1.05, 1)])
    copies = boundary_fit([(3.6, 0.9, 1)] * 3 + [(4.4, 1.1, 1), (4.0, 1.05, 1)])
    single = boundary_fit([(3.6, 0.9, 1), (4.4, 1.1, 1), (4.0, 1.05, 1)])
    assert pooled is not None and copies is not None and single is not None
    assert pooled.rate == pytest.approx(copies.rate) and pooled.runs == 5
    assert pooled.rate > single.rate        # the heavier met level pulls the crossing up


def test_boundary_fit_needs_two_rates_and_a_rising_line() -> None:
    assert boundary_fit([(4.0, 0.95, 3)]) is None
    assert boundary_fit([(4.0, 0.95, 1), (4.0, 1.05, 1)]) is None       # one rate twice
    assert boundary_fit([(3.0, 1.05, 1), (5.0, 0.95, 1)]) is None       # falling
    assert boundary_fit([(3.0, 0.99, 1), (5.0, 1.0, 1)]) is None        # too flat to place it
    assert boundary_fit([(3.0, 3.0, 1), (5.0, 5.0, 1)]) is None         # out of the band


def noisy_search(*probes: tuple[float, bool, float, bool, int]) -> RateSearch:
    search = RateSearch(RateSearchSpec(low=0.1, high=100))
    for rate, met, margin, near, parts in probes:
        search.observe(rate, met, margin, within_noise=near, parts=parts)
    return search


def test_a_bracket_within_noise_takes_the_fit_between_the_clear_verdicts() -> None:
    # Clear verdicts: met at 6.0, missed at 12.0. The bracket 7.0-7.3 is within noise on
    # both ends; the margins say the SLO's statistic reaches its bound at ~7.5.
    search = noisy_search((12.0, False, 1.4, False, 1), (6.0, True, 0.85, False, 1),
                          (7.3, False, 1.01, True, 3), (7.0, True, 0.97, True, 3),
                          (7.9, False, 1.05, True, 3))
    result = search.result()
    assert result.bracket == (7.0, 7.3)
    assert result.answer == "fit" and result.fit is not None
    assert result.max_rate == round_rate(result.fit["rate"])
    assert 7.3 < result.max_rate < 12.0
    assert search.optimistic() == 12.0      # the answer may pass the miss within noise


def test_clear_verdicts_keep_the_verdicts_answer() -> None:
    # The same margins with clear verdicts: the highest met below the lowest missed.
    search = noisy_search((12.0, False, 1.4, False, 1), (6.0, True, 0.85, False, 1),
                          (7.3, False, 1.01, False, 3), (7.0, True, 0.97, False, 3),
                          (7.9, False, 1.05, False, 3))
    result = search.result()
    assert result.answer == "verdicts" and result.max_rate == 7.0
    assert search.optimistic() == 7.3


def test_a_fit_beyond_a_clear_verdict_is_not_taken() -> None:
    # Flat margins below a wall: the line crosses 1 at ~7.48, above the clear miss at 7.4
    # (its margin 1.5 is off the fit's band): the verdicts answer.
    search = noisy_search((7.4, False, 1.5, False, 1), (7.0, True, 0.97, True, 3),
                          (7.2, False, 1.001, True, 3), (6.0, True, 0.95, False, 1))
    result = search.result()
    assert result.fit is not None and result.fit["rate"] > 7.4
    assert result.answer == "verdicts" and result.max_rate == 7.0


def test_clear_verdicts_that_disagree_keep_the_verdicts_answer() -> None:
    # A clear meet above a clear miss: nothing bounds a fit, so none is used.
    search = noisy_search((7.0, False, 1.1, False, 1), (8.0, True, 0.95, False, 1),
                          (6.5, True, 0.98, True, 3), (6.8, False, 1.01, True, 3))
    result = search.result()
    assert result.answer == "verdicts" and result.max_rate == 6.5
    assert search.optimistic() == 6.8


def test_levels_left_after_a_noisy_bracket_go_to_the_fit() -> None:
    # The bracket 7.0-7.3 is within the 5 % precision but both ends are within noise:
    # instead of stopping, the search measures where the margins' line crosses 1 ...
    search = noisy_search((12.0, False, 1.4, False, 1), (6.0, True, 0.85, False, 1),
                          (7.3, False, 1.01, True, 3), (7.0, True, 0.97, True, 3))
    fit = boundary_fit([(p.rate, p.margin, p.parts) for p in search.probes])
    assert fit is not None
    nxt = search.next_rate()
    assert nxt == round_rate(fit.rate) and 6.0 < nxt < 12.0
    # ... then beside it when that rate was measured already ...
    search.observe(nxt, nxt < fit.rate, fit.rate / nxt, within_noise=True, parts=3)
    beside = search.next_rate()
    assert beside is not None and beside != nxt and abs(beside / nxt - 1) < 0.05
    # ... until max_levels (7 by default): the answer is then the fit's, status found.
    while (rate := search.next_rate()) is not None:
        search.observe(rate, True, 0.99, within_noise=True, parts=3)
    result = search.result()
    assert result.levels == 7 and result.status == "found" and result.answer == "fit"


def test_a_clear_bracket_stops_at_the_precision() -> None:
    search = noisy_search((12.0, False, 1.4, False, 1), (6.0, True, 0.85, False, 1),
                          (7.3, False, 1.01, False, 1), (7.0, True, 0.97, False, 1))
    assert search.next_rate() is None
    result = search.result()
    assert result.status == "found" and result.levels == 4 and result.max_rate == 7.0


def test_the_status_line_says_when_the_answer_is_the_fit() -> None:
    from tuner.load.max_rate_text import max_rate_text
    noisy = noisy_search((12.0, False, 1.4, False, 1), (6.0, True, 0.85, False, 1),
                         (7.3, False, 1.01, True, 3), (7.0, True, 0.97, True, 3))
    noisy.ended = "budget"
    text = max_rate_text(noisy.result().model_dump(mode="json"))
    assert "margins of 4 levels (8 runs) cross 1" in text, text
    clear = noisy_search((12.0, False, 1.4, False, 1), (7.0, True, 0.97, False, 1))
    assert "cross 1" not in max_rate_text(clear.result().model_dump(mode="json"))


def test_a_met_above_every_miss_sends_the_last_level_to_the_fit_not_the_lowest_rate() -> None:
    # benchmarks/slo_truth.py, cudagraph_mode=NONE on another set of arrivals (truth 0.471
    # in the model's clock): met at 0.491 within noise, then misses at and below it. No
    # rate met below the lowest miss, but one met: the SLO can be met, the verdicts near
    # the boundary disagree. The last level used to go to the lowest allowed rate (0.05,
    # answer 0.05: -89 %); it goes where the margins' line crosses 1, below the lowest
    # clear miss, and the answer is the fit's.
    search = RateSearch(RateSearchSpec(low=0.05, high=20, max_levels=7))
    for rate, met, margin, near, parts in ((0.983, False, 1.896, False, 1),
                                           (0.491, True, 0.998, True, 3),
                                           (0.545, False, 1.181, False, 2),
                                           (0.515, False, 1.067, False, 3),
                                           (0.493, False, 1.064, True, 3),
                                           (0.483, False, 1.1, False, 3)):
        search.observe(rate, met, margin, within_noise=near, parts=parts)
    assert search.bracket() == (None, 0.483)
    nxt = search.next_rate()
    assert nxt is not None and 0.4 < nxt < 0.483
    search.observe(nxt, True, 0.922, parts=2)
    assert search.next_rate() is None
    result = search.result()
    assert result.answer == "fit" and result.max_rate is not None
    assert 0.44 < result.max_rate < 0.483 and result.status == "levels"
    assert (0.483, 0.491) in result.non_monotonic


def test_a_fit_below_a_clear_meet_answers_that_meet() -> None:
    # benchmarks/slo_truth.py, PIECEWISE + n-gram k=2 on another set of arrivals (truth
    # ~1.05): met clearly at 1.05 above a miss within noise at 1.0. The verdicts' answer,
    # the highest met below the lowest miss, is 0.954 (-9.5 %) and contradicts the clear
    # meet; the fit (which crosses below 1.05) is raised to it.
    search = noisy_search((1.48, False, 1.343, False, 1), (1.0, False, 1.016, True, 3),
                          (0.87, True, 0.747, False, 1), (0.954, True, 0.876, False, 3),
                          (1.06, False, 1.029, True, 3), (1.05, True, 0.93, False, 3),
                          (1.07, False, 1.094, True, 3))
    result = search.result()
    assert result.bracket == (0.954, 1.0)
    assert result.fit is not None and round_rate(result.fit["rate"]) <= 1.05
    assert result.answer == "fit" and result.max_rate == 1.05
    assert search.optimistic() == 1.48      # no clear miss below it


def test_a_fit_below_a_clear_meet_that_is_the_bracket_low_keeps_the_verdicts() -> None:
    # The clear meet is the verdicts' own answer: nothing for the fit to change.
    search = noisy_search((12.0, False, 1.4, False, 1), (7.0, True, 0.98, False, 2),
                          (7.3, False, 1.1, True, 3), (6.0, True, 0.97, True, 3))
    result = search.result()
    assert result.fit is not None and result.fit["rate"] < 7.0
    assert result.answer == "verdicts" and result.max_rate == 7.0
