"""Early stop inside a level (tuner.study.early_stop rule 4): the bound, the guard, the load
generator's view of the window so far, and - in simulated studies - that it never stops a
trial that would have reached the front."""

from __future__ import annotations

import math

import pytest

from tuner.load.metrics import compute_level_metrics
from tuner.load.records import RequestRecord
from tuner.study.early_stop import INSIDE_MARGIN, Target, inside_bound
from tuner.study.sweep_guard import SweepGuard, sweep_plan

THR = Target("output_tok_s", 64, "maximize")
TPOT = Target("tpot_ms.mean", 1, "minimize")
FRONT = [(330.0, 13.7), (287.0, 11.1)]


def test_inside_bound_exact_partial_unsteady_and_too_early() -> None:
    # Complete window (last dispatch): the rate is already an upper bound.
    assert inside_bound(250.0, window_s=1.0, first_wave_s=30.0, stable=False, exact=True) == 250.0
    # Half the first wave's time into the window, steady: the rate plus the margin.
    assert inside_bound(250.0, window_s=15.0, first_wave_s=30.0, stable=True) == pytest.approx(
        250.0 * (1 + INSIDE_MARGIN))
    assert inside_bound(250.0, window_s=14.9, first_wave_s=30.0, stable=True) == math.inf   # too early
    assert inside_bound(250.0, window_s=20.0, first_wave_s=30.0, stable=False) == math.inf  # drifting
    assert inside_bound(None, window_s=20.0, first_wave_s=30.0, stable=True, exact=True) == math.inf
    assert inside_bound(250.0, window_s=20.0, first_wave_s=0.0, stable=True) == math.inf    # no first wave


def _guard(targets=(THR, TPOT), **plan_kw) -> SweepGuard:
    guard = SweepGuard(sweep_plan(list(targets), [], [1, 4, 16, 64], FRONT, [], **plan_kw))
    assert not guard.after_level({1: {"tpot_ms.mean": 20.0}}, [64, 4, 16])   # c1 measured first
    return guard


def test_guard_stops_inside_the_throughput_level_only_when_dominated() -> None:
    view = {"output_tok_s": 300.0, "window_s": 10.0, "first_wave_s": 30.0, "stable": True, "exact": True,
            "completed": 150, "planned": 192}
    g = _guard()
    assert g.inside_level(64, view, [4, 16])
    assert g.record["reason"] == "dominated_exact" and g.record["after"] == "c64 at last dispatch"
    assert g.record["bounds"] == [300.0, 20.0] and g.record["dominated_by"] == [330.0, 13.7]
    assert g.record["skipped_levels"] == [64, 4, 16]
    # Rule 4a: the level's output tok/s is measured, and recorded for the tell.
    assert g.record["measured"]["64"]["output_tok_s"] == 300.0
    assert g.record["measured"]["64"]["output_tok_s.ci95"] == 0.0      # no sub-windows in view
    # A level sized by time judges its window with the window's own noise, and keeps it.
    g = _guard()
    assert g.inside_level(64, {**view, "output_tok_s": 290.0, "output_tok_s_ci95": 12.0}, [4, 16])
    assert g.record["measured"]["64"]["output_tok_s.ci95"] == 12.0
    # With a limit on the level the trial is stopped instead (the limit is not measured).
    limit = {"label": "ttft_ms.p90@c64<=9000", "metric": "ttft_ms.p90", "level": 64,
             "max": 9000.0, "min": None}
    g = SweepGuard(sweep_plan([THR, TPOT], [limit], [1, 4, 16, 64], FRONT, []))
    assert not g.after_level({1: {"tpot_ms.mean": 20.0}}, [64, 4, 16])
    assert g.inside_level(64, view, [4, 16]) and g.record["reason"] == "dominated_inside"
    assert g.record["inside"]["exact"] is True
    # Not yet complete: 300 * 1.25 = 375 could still beat the front point at 330.
    g = _guard()
    assert not g.inside_level(64, {**view, "exact": False, "window_s": 20.0}, [4, 16]) and g.record is None
    # ... while 250 * 1.25 = 312.5 cannot: a steady window half a first wave long is enough.
    assert g.inside_level(64, {**view, "output_tok_s": 250.0, "exact": False, "window_s": 20.0}, [4, 16])
    # A trial whose TPOT beats the front is never stopped, however slow.
    g = SweepGuard(sweep_plan([THR, TPOT], [], [1, 4, 16, 64], FRONT, []))
    assert not g.after_level({1: {"tpot_ms.mean": 10.0}}, [64, 4, 16])
    assert not g.inside_level(64, {**view, "output_tok_s": 10.0}, [4, 16])


def test_guard_never_stops_inside_a_level_it_cannot_bound() -> None:
    view = {"output_tok_s": 10.0, "window_s": 10.0, "first_wave_s": 30.0, "stable": True, "exact": True}
    # Levels without an objective, and latency objectives, are not bounded inside the level.
    assert not _guard().inside_level(16, view, [4])
    assert not _guard().inside_level(1, view, [64])
    both = (THR, Target("tpot_ms.mean", 64, "minimize"))
    assert not _guard(both).inside_level(64, view, [4, 16])
    # Switched off in the plan, or no plan at all.
    assert not _guard(inside_margin=None).inside_level(64, view, [4, 16])
    assert not SweepGuard(None).inside_level(64, view, [4, 16])


def test_guard_stops_inside_the_last_level_too() -> None:
    # The real landscapes measure their throughput objective last (levels 1, 4): the drain
    # of a dominated trial's last level is what rule 4 saves there. Rule 4a: told completed,
    # with the level's own figure; nothing after it is skipped.
    view = {"output_tok_s": 300.0, "window_s": 10.0, "first_wave_s": 30.0, "stable": True, "exact": True,
            "completed": 150, "planned": 192}
    g = _guard()
    assert g.inside_level(64, view, [])
    assert g.record["reason"] == "dominated_exact" and g.record["skipped_levels"] == [64]
    assert g.record["measured"]["64"]["output_tok_s"] == 300.0
    assert g.record["measured"]["64"]["output_tok_s.ci95"] == 0.0      # no sub-windows in view
    # A level sized by time judges its window with the window's own noise, and keeps it.
    g = _guard()
    assert g.inside_level(64, {**view, "output_tok_s": 290.0, "output_tok_s_ci95": 12.0}, [4, 16])
    assert g.record["measured"]["64"]["output_tok_s.ci95"] == 12.0
    # Rule 4b in the last level: stopped on the window so far, never on the front.
    g = _guard()
    assert g.inside_level(64, {**view, "output_tok_s": 250.0, "exact": False, "window_s": 20.0}, [])
    assert g.record["reason"] == "dominated_inside"
    # A last level that could still reach the front runs to its end: 300 * 1.25 > 330.
    g = _guard()
    assert not g.inside_level(64, {**view, "exact": False, "window_s": 20.0}, []) and g.record is None


# -- the load generator's window ----------------------------------------------------------------


def _record(i: int, dispatch: float, times: list[float], *, ok: bool = True) -> RequestRecord:
    return RequestRecord(index=i, class_name="t", concurrency=2, scheduled_s=dispatch, dispatch_s=dispatch,
                         chunk_times_s=times, chunk_tokens=[1] * len(times), chunk_chars=[4] * len(times),
                         done_s=times[-1] if times else dispatch, prompt_tokens=8,
                         output_tokens=len(times), ok=ok, finish_reason="length", http_status=200)


def _live(times: list[float], *, usage: bool = True):
    from tuner.load.protocol import StreamState

    st = StreamState(chat=False)
    st.times = list(times)
    st.cumulative = list(range(1, len(times) + 1)) if usage else []
    st.per_chunk_usage = usage
    return st


def test_window_opens_after_the_first_wave_and_counts_in_flight_tokens() -> None:
    from tuner.load.live_window import InsideWindow

    w = InsideWindow(concurrency=2, planned=6)
    tick = [0.1 * k for k in range(1, 11)]                      # 10 tokens, one every 0.1 s
    w.add(0, _record(0, 0.0, tick))                             # done at 1.0
    assert w.view(1.5, {}) is None                              # first wave not done
    w.add(1, _record(1, 0.0, [t + 0.2 for t in tick]))          # done at 1.2: window opens
    assert w.opened == pytest.approx(1.2) and w.view(1.2, {}) is None
    # Two streams in flight since 1.0 and 1.2, one token every 0.1 s.
    live = {2: (1.0, _live([1.0 + 0.1 * k for k in range(1, 9)]), 10),
            3: (1.2, _live([1.2 + 0.1 * k for k in range(1, 7)]), 10)}
    v = w.view(1.8, live)
    assert v is not None and not v["exact"]
    assert v["window_s"] == pytest.approx(0.6) and v["first_wave_s"] == pytest.approx(1.2)
    # Tokens in [1.2, 1.8), as tuner.load.window counts them (half-open, from the opening):
    # the first wave's last token at 1.2, 6 from stream 2 (1.2 .. 1.7), 5 from stream 3.
    assert v["output_tok_s"] == pytest.approx(12 / 0.6)
    # An in-flight request without per-chunk usage: its tokens are unknown, no view.
    assert w.view(1.8, {**live, 4: (1.3, _live([1.4], usage=False), 10)}) is None


def test_complete_window_is_the_levels_own_and_bounds_its_output_rate() -> None:
    from tuner.load.live_window import InsideWindow

    tick = [0.1 * k for k in range(1, 11)]
    records = [_record(0, 0.0, tick), _record(1, 0.0, [t + 0.2 for t in tick]),
               _record(2, 1.0, [1.0 + t for t in tick]), _record(3, 1.2, [1.2 + t for t in tick])]
    w = InsideWindow(concurrency=2, planned=6)
    for i, r in enumerate(records):
        w.add(i, r)
    # Last dispatch at 2.2 (positions 4 and 5 still in flight, 3 and 2 tokens so far).
    live = {4: (2.0, _live([2.1, 2.2, 2.3]), 10), 5: (2.2, _live([2.3, 2.4]), 10)}
    v = w.view(2.5, live, last_dispatch=2.2, done_tokens=40)
    assert v is not None and v["exact"]
    # The level's own figure once its in-flight requests finish as they started.
    rest = [_record(4, 2.0, [2.0 + t for t in tick]), _record(5, 2.2, [2.2 + t for t in tick])]
    final = compute_level_metrics(records + rest, concurrency=2, planned=6)
    assert not final.window_fallback
    assert v["window_s"] == pytest.approx(final.window_s)
    assert v["output_tok_s"] == pytest.approx(final.output_tok_s)
    # Should one of them fail, the level counts fewer tokens: the view stays an upper bound.
    failed = compute_level_metrics(records + [rest[0], _record(5, 2.2, [2.3, 2.4], ok=False)],
                                   concurrency=2, planned=6)
    assert failed.output_tok_s <= v["output_tok_s"]


# -- against ground truth -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def truth3():
    """The small study with three requests per stream: the top level then has a steady
    window (one round) between its first wave and its drain."""

    from tests.sim_studies import SMALL_STUDY, build_ground_truth
    from tuner.sim.profile import load_profile
    from tuner.study.study_file import parse_study

    text = SMALL_STUDY.replace("requests_per_stream: 2", "requests_per_stream: 3")
    assert text != SMALL_STUDY
    spec = parse_study(text, "es-inside")
    return spec, build_ground_truth(spec, load_profile("glm5-8xpcie"))


def test_inside_a_level_never_stops_a_front_point_in_simulated_studies(truth3) -> None:
    import optuna

    from tuner.engine.samplers import make_sampler
    from tuner.sim.study import EarlyStopPolicy, run_study

    spec, truth = truth3
    without = EarlyStopPolicy(streaming_verify=False)
    with_inside = EarlyStopPolicy(inside=True)
    inside = wrong = true_front = 0
    extra = []
    for seed in range(2):
        for factory in (lambda s, seed: optuna.samplers.RandomSampler(seed=seed),
                        lambda s, seed: make_sampler(s.model_copy(update={
                            "sampler": s.sampler.model_copy(update={"seed": seed})}))):
            on = run_study(spec, truth, factory, n_trials=16, seed=seed, noise=0.05, policy=with_inside)
            base = run_study(spec, truth, factory, n_trials=16, seed=seed, noise=0.05, policy=without)
            inside += sum(1 for t in on.trials if t.stopped_after and "c16" in t.stopped_after
                          and (t.stopped == "dominated_inside" or "last dispatch" in t.stopped_after))
            wrong += sum(1 for t in on.trials if t.would_enter_front)
            true_front += sum(1 for t in on.trials if t.true_front)
            extra.append(base.total_seconds - on.total_seconds)
    assert inside > 0, "rule 4 never fired: the test would prove nothing"
    assert wrong == 0
    assert true_front == 0
    assert sum(extra) > 0
