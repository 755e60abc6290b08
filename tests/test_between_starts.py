"""The study's own noise between fresh starts (tuner.study.between_starts): the estimate, how
sure it is, what intervals and confirmations get from it, and - through the real study loop
on the simulator with known between-start spreads - that its interval covers the truth."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tuner.load.uncertainty import Z95, t95
from tuner.study.between_starts import (
    ASSUMED_CV,
    chi2_quantile,
    estimate_label,
    noise_tolerances,
    pooled_log_sd,
    study_noise,
)
from tuner.study.study_noise import fresh_starts, noise_of_study, with_study_noise
from tuner.study.trials import KIND_RUN, TrialRecord

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("p", "df", "expected"), [
    (0.025, 1, 0.000982), (0.975, 1, 5.0239), (0.025, 2, 0.05064), (0.975, 2, 7.3778),
    (0.025, 10, 3.2470), (0.975, 10, 20.4832), (0.5, 30, 29.3360)])
def test_chi_square_quantiles_match_the_tables(p: float, df: int, expected: float) -> None:
    assert chi2_quantile(p, df) == pytest.approx(expected, rel=2e-4)


def test_pooled_spread_by_hand() -> None:
    # ln 100, ln 110: deviations ±ln(1.1)/2; ln 50, 55, 60 around their mean; df = 1 + 2.
    a = [math.log(100), math.log(110)]
    b = [math.log(50), math.log(55), math.log(60)]
    squares = sum((x - sum(a) / 2) ** 2 for x in a) + sum((x - sum(b) / 3) ** 2 for x in b)
    sd, df, used = pooled_log_sd([[100, 110], [50, 55, 60], [70]])
    assert (df, used) == (3, 5)
    assert sd == pytest.approx(math.sqrt(squares / 3))
    found = estimate_label("x@c1", [[100, 110], [50, 55, 60], [70]])
    assert found is not None and found.groups == 2 and found.starts == 5
    assert found.low == pytest.approx(sd * math.sqrt(3 / chi2_quantile(0.995, 3)))
    assert found.high == pytest.approx(sd * math.sqrt(3 / chi2_quantile(0.005, 3)))
    assert found.half_width == pytest.approx(t95(3) * sd)
    assert estimate_label("x@c1", [[100], [70]]) is None


def test_two_starts_are_less_sure_than_ten() -> None:
    two = estimate_label("x", [[100, 103]])
    ten = estimate_label("x", [[100, 103, 98, 101, 102, 99, 100.5, 101.5, 98.5, 102.5]])
    assert two is not None and ten is not None
    assert two.high / two.low > 300 and ten.high / ten.low < 5
    # The same spread from one degree of freedom widens every value far more (t95(1) = 12.7).
    assert two.half_width / two.cv == pytest.approx(12.706) and ten.half_width / ten.cv < 2.3


def _record(number: int, params: dict, values: dict[str, float], *, ci: float = 0.0,
            floor: float | None = 0.0, early: bool = False) -> TrialRecord:
    levels = {"32": {"output_tok_s": values["output_tok_s@c32"], "output_tok_s.ci95": ci}}
    outcome = {"levels": levels, "noise_floor": floor, **({"early_stop": {"reason": "dominated"}} if early else {})}
    return TrialRecord(number=number, state="COMPLETE", kind=KIND_RUN, params=params, values=dict(values),
                       attrs={"outcome": outcome})


def test_estimate_from_trials_and_confirmation_reruns() -> None:
    label = "output_tok_s@c32"
    base = {"enforce_eager": True}
    fast = {"enforce_eager": False}
    records = [_record(0, base, {label: 1000.0}), _record(1, base, {label: 1010.0}),
               _record(2, fast, {label: 2000.0}),
               _record(3, fast, {label: 5000.0}, early=True)]     # an early stop's figure: no start
    confirmations = {2: {"trial": 2, "objectives": [{"label": label}],
                         "runs": [{"values": [1990.0], "feasible": True},
                                  {"values": [10.0], "feasible": False}]}}
    starts = fresh_starts(records, confirmations, [label])
    assert sorted(v[label] for _, v in starts) == [1000.0, 1010.0, 1990.0, 2000.0]
    noise = study_noise([label], starts)
    found = noise.measured[label]
    assert found.df == 2 and found.groups == 2
    expected = math.sqrt(((math.log(1010 / 1000) / 2) ** 2 * 2 + (math.log(2000 / 1990) / 2) ** 2 * 2) / 2)
    assert found.cv == pytest.approx(expected)
    assert noise.source(label) == "measured"


def test_intervals_carry_the_measured_noise_in_place_of_what_was_baked() -> None:
    label = "output_tok_s@c32"
    noise = study_noise([label], [({"a": 1}, {label: 100.0}), ({"a": 1}, {label: 101.0}),
                                  ({"a": 1}, {label: 99.5})])
    h = noise.half_width(label)
    # A record measured while the study still assumed 3 %: its run's own 5.0 is kept, the
    # baked 3 % is replaced by the measured noise.
    own = 5.0
    baked = Z95 * ASSUMED_CV * 1000.0
    record = _record(7, {"a": 2}, {label: 1000.0}, ci=math.hypot(own, baked), floor=ASSUMED_CV)
    (widened,) = with_study_noise([record], noise)
    assert widened.noise([label])[label] == pytest.approx(math.hypot(own, h * 1000.0))
    # An old record (no noise_floor stored) keeps what it was measured with.
    old = _record(8, {"a": 2}, {label: 1000.0}, ci=42.0, floor=None)
    assert with_study_noise([old], noise)[0].noise([label])[label] == pytest.approx(42.0)
    # Before any repeat the prior stands in, said as assumed; an override is used as given.
    assert study_noise([label], []).half_width(label) == pytest.approx(Z95 * ASSUMED_CV)
    assert "assumed" in study_noise([label], []).lines()[0]
    assert study_noise([label], [], override=0.12).half_width(label) == pytest.approx(Z95 * 0.12)


def test_own_intervals_wider_than_the_starts_moved_are_scaled_to_what_the_starts_show() -> None:
    """As on the CPU chat study: three starts of the defaults within a few per cent, each run's
    own interval (three bursty sub-windows) ±200 %; a slower configuration's own interval is
    scaled by the same ratio, so a 4x gap is no longer a tie."""
    label = "output_tok_s@c32"
    base, off = {"prefix": True}, {"prefix": False}
    floor = ASSUMED_CV                       # what the worker baked in while it measured

    def rec(number: int, params: dict, value: float, own: float) -> TrialRecord:
        return _record(number, params, {label: value}, ci=math.hypot(own * value, Z95 * floor * value), floor=floor)

    records = [rec(0, base, 25.5, 2.0), rec(1, base, 23.6, 2.2), rec(2, base, 25.3, 2.1), rec(4, base, 26.3, 2.1),
               rec(5, base, 24.8, 2.3), rec(3, off, 6.6, 3.0)]
    assert records[-1].own_noise([label])[label] == pytest.approx(3.0)
    noise = noise_of_study(records, {}, [label], override=None)
    half = noise.half_width(label)
    # Scaled by what even the upper end (99 %) of the starts' spread allows, not its estimate.
    scale = Z95 * noise.measured[label].high / 2.1
    assert noise.run_widths[label] == pytest.approx(2.1)
    assert noise.run_scale(label) == pytest.approx(scale) and 0 < scale < 0.8
    widened = {r.number: r.noise([label], noise)[label] for r in records}
    # Three starts would not have been enough here: their 99 % bound is too wide to prove it.
    assert noise_of_study(records[:3] + records[-1:], {}, [label], override=None).run_scale(label) > scale
    assert widened[0] == pytest.approx(math.hypot(2.0 * 25.5 * scale, half * 25.5))
    assert widened[3] == pytest.approx(math.hypot(3.0 * 6.6 * scale, half * 6.6))
    assert 25.5 - 6.6 > math.hypot(widened[0], widened[3])          # beyond noise now
    assert any("scaled by" in line for line in noise.lines())
    assert noise.as_dict()["labels"][label]["run_scale"] == pytest.approx(scale)
    # Identical starts (a deterministic server) bound nothing: no scaling.
    same = [rec(0, base, 25.0, 2.0), rec(1, base, 25.0, 2.0), rec(3, off, 6.6, 3.0)]
    assert noise_of_study(same, {}, [label], override=None).run_scale(label) == 1.0

    # Own intervals narrower than the starts' spread are used as they are ...
    calm = noise_of_study([rec(0, base, 100.0, 0.001), rec(1, base, 104.0, 0.001), rec(2, off, 50.0, 0.002)], {},
                          [label], override=None)
    assert calm.run_scale(label) == 1.0 and not any("scaled by" in line for line in calm.lines())
    # ... and so is everything under a fixed override, or before any configuration repeats.
    assert noise_of_study(records, {}, [label], override=0.05).run_scale(label) == 1.0
    assert noise_of_study(records[4:], {}, [label], override=None).run_scale(label) == 1.0
    # A record measured before the worker stored its floor has no known own part.
    assert _record(9, base, {label: 10.0}, ci=5.0, floor=None).own_noise([label]) == {}


def test_confirmation_tolerance_follows_the_noise() -> None:
    assert noise_tolerances([0.02, 0.05], 1) == pytest.approx([0.02 * math.sqrt(2), 0.05 * math.sqrt(2)])
    assert noise_tolerances([0.02], 4) == pytest.approx([0.02 * math.sqrt(1.25)])


# -- the real study loop on the simulator, with known between-start spreads -----------------

def _sim_run(spread: float, seed: int):
    from tuner.engine.samplers import make_sampler
    from tuner.sim.landscape import ground_truth
    from tuner.sim.study import run_study
    from tuner.study.spec import ExecutionSpec, SamplerSpec
    from tuner.study.study_file import parse_study

    data = json.loads((ROOT / "benchmarks/landscapes/smollm2-engine.json").read_text(encoding="utf-8"))
    path = ROOT / data["study_file"]
    spec = parse_study(path.read_text(encoding="utf-8"), str(path))
    spec = spec.model_copy(update={"sampler": SamplerSpec(), "execution": ExecutionSpec(),
                                   "load": spec.load.model_copy(update={"noise_floor": None, "noise_starts": 4})})
    truth = ground_truth(spec, data)

    def factory(s, sd):
        return make_sampler(s.model_copy(update={"sampler": SamplerSpec(name="random", seed=sd)}), budget=8)

    run = run_study(spec, truth, factory, n_trials=8, seed=seed, noise=spread)
    labels = [o.label for o in spec.objectives]
    starts = [(t.values, dict(zip(labels, t.measured))) for t in run.trials if t.measured is not None]
    return labels, study_noise(labels, starts), run


@pytest.mark.parametrize("spread", [0.005, 0.03, 0.12])
def test_the_estimate_covers_the_known_spread(spread: float) -> None:
    covered = {}
    for seed in range(20):
        labels, noise, run = _sim_run(spread, seed)
        # The study's own fresh starts of the baseline ran (the loop enqueued and ran them).
        assert sum(1 for t in run.trials if t.values == run.trials[0].values) >= 4
        for label in labels:
            found = noise.measured[label]
            covered.setdefault(label, []).append(found.low <= spread <= found.high)
    for label, hits in covered.items():
        assert sum(hits) >= 19, f"{label}: the 99 % interval covered {spread:.1%} in {sum(hits)} of 20 seeds"


def test_a_noisy_box_is_said_to_be_one_and_a_quiet_one_is_not() -> None:
    _, noisy, _ = _sim_run(0.12, 1)
    _, quiet, _ = _sim_run(0.005, 1)
    assert noisy.too_noisy() and not quiet.too_noisy()
    text = "\n".join(noisy.lines())
    assert "too noisy to tell configurations apart" in text and "max_level_seconds" in text
    assert "host-check" in text


def test_a_rerun_is_judged_by_its_trials_interval_and_noise_measured_without_it() -> None:
    from tuner.study.study_noise import confirmation_tolerances

    label = "output_tok_s@c32"
    base = {"a": 1}
    records = [_record(0, base, {label: 1000.0}, ci=0.0), _record(1, base, {label: 1001.0}, ci=0.0),
               _record(2, base, {label: 999.0}, ci=0.0), _record(5, {"a": 2}, {label: 2000.0}, ci=8.0)]
    # A fluke re-run of trial 5 must not widen the tolerance it is judged by.
    fluke = {5: {"trial": 5, "objectives": [{"label": label}], "runs": [{"values": [2600.0], "feasible": True}]}}
    (tol,) = confirmation_tolerances(records[3], records, fluke, [label], override=None, reruns=1)
    noise = study_noise([label], [(base, {label: v}) for v in (1000.0, 1001.0, 999.0)])
    own = 8.0 / 2000.0
    assert tol == pytest.approx(math.hypot(own, noise.half_width(label)) * math.sqrt(2))
    assert tol < 0.02 < 600 / 2000
    # Never below confirm.min_change: a difference must also be big enough to matter.
    (floored,) = confirmation_tolerances(records[3], records, fluke, [label], override=None, reruns=1,
                                         min_change=0.05)
    assert floored == 0.05


def test_a_worker_is_never_handed_a_floor_a_load_spec_refuses() -> None:
    from tuner.load.load_spec import LoadSpec

    wild = study_noise(["x@c1"], [({"a": 1}, {"x@c1": 100.0}), ({"a": 1}, {"x@c1": 140.0})])
    assert wild.half_width("x@c1") / Z95 > 1          # t95(1) x a 24 % spread
    LoadSpec(noise_floor=wild.floor())                # accepted: capped below 1
    assert wild.floor() < 1


def test_only_objectives_read_at_a_level_carry_the_between_start_noise() -> None:
    """startup_s is one reading and accuracy_drop has the quality gate's own interval: neither is
    said to be 'assumed 3 % between starts', and neither sets the worker's floor."""
    labels = ["output_tok_s@c32", "accuracy_drop", "startup_s", "max_rate@slo"]
    runs = [({"a": 1}, {"output_tok_s@c32": 100.0, "startup_s": 20.0}),
            ({"a": 1}, {"output_tok_s@c32": 101.0, "startup_s": 40.0})]
    noise = study_noise(labels, runs)
    lines = noise.lines()
    assert [line.split(":")[0] for line in lines] == ["output_tok_s@c32"]
    # startup_s moved by a factor of 2 between the starts: it must not widen every interval.
    assert noise.floor() == pytest.approx(noise.half_width("output_tok_s@c32") / Z95)
    assert set(noise.as_dict()["labels"]) == {"output_tok_s@c32"}
    assert study_noise(["accuracy_drop"], []).lines() == []
