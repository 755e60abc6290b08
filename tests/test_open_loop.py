"""Open-loop rate levels: the arrival schedule, absolute-time launching, the in-flight
cap, the sweep's rate levels and the load: keys that configure them.

Timing assertions compare each record's send time with its own scheduled time, with
tolerances far above scheduling jitter (the test machine may be loaded): they catch a
launcher that waits for responses or drifts by sleeping per gap, not milliseconds."""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from tests.fake_server import Served
from tests.test_loadgen import SWEEP, plan_item
from tuner.errors import SpecError
from tuner.load.load_spec import LoadSpec, rate_level_name
from tuner.load.open_loop import rate_level_metrics, run_rate_level
from tuner.load.results import SweepResult
from tuner.load.sweep import run_sweep
from tuner.load.workload import arrival_schedule, draft_requests, rate_stream
from tuner.study.study_file import parse_study

# ---------------------------------------------------------------- the schedule


def test_schedule_is_seeded_and_reproducible() -> None:
    a = arrival_schedule(200, 4.0, seed=3, stream="measure-r4.0")
    assert a == arrival_schedule(200, 4.0, seed=3, stream="measure-r4.0")
    assert a != arrival_schedule(200, 4.0, seed=4, stream="measure-r4.0")
    assert a != arrival_schedule(200, 4.0, seed=3, stream="measure-r8.0")
    assert all(y >= x for x, y in zip(a, a[1:]))
    assert a[0] > 0


def test_schedule_holds_the_mean_rate_exactly() -> None:
    # vLLM rescales so the last arrival is due at n/rate: the mean rate is exact.
    for arrival, shape in (("poisson", 1.0), ("gamma", 0.25), ("gamma", 4.0)):
        times = arrival_schedule(500, 8.0, arrival=arrival, burstiness=shape, seed=1)
        assert len(times) == 500
        assert times[-1] == pytest.approx(500 / 8.0)
        gaps = [b - a for a, b in zip([0.0, *times], times)]
        assert statistics.fmean(gaps) == pytest.approx(1 / 8.0)


@pytest.mark.parametrize("shape", [0.25, 1.0, 4.0])
def test_gamma_burstiness_sets_the_gap_cv(shape: float) -> None:
    times = arrival_schedule(20_000, 10.0, arrival="gamma", burstiness=shape, seed=0)
    gaps = [b - a for a, b in zip([0.0, *times], times)]
    cv = statistics.pstdev(gaps) / statistics.fmean(gaps)
    assert cv == pytest.approx(1 / math.sqrt(shape), rel=0.06)


def test_poisson_ignores_burstiness_and_bad_inputs_raise() -> None:
    assert arrival_schedule(50, 2.0, arrival="poisson", seed=5) == arrival_schedule(
        50, 2.0, arrival="gamma", burstiness=1.0, seed=5)
    assert arrival_schedule(0, 2.0) == []
    for kwargs in ({"rate": 0.0}, {"rate": -1.0}, {"rate": math.inf},
                   {"rate": 1.0, "arrival": "uniform"},
                   {"rate": 1.0, "arrival": "gamma", "burstiness": 0.0}):
        with pytest.raises(ValueError):
            arrival_schedule(3, **kwargs)  # type: ignore[arg-type]


# ---------------------------------------------------------------- absolute-time launching


def _slow_plan(n: int, seconds: float) -> list:
    # Each response takes ~`seconds` (4 chunks): far longer than the gaps between sends.
    step = seconds / 4
    return [plan_item(i, {"chunks": [[step, 1]] * 4}) for i in range(n)]


def test_slow_server_does_not_delay_later_sends(served: Served) -> None:
    n = 12
    schedule = [0.1 * (i + 1) for i in range(n)]  # 10 req/s against 1.2 s responses
    run = asyncio.run(run_rate_level(
        served.base_url, "fake", _slow_plan(n, 1.2), schedule, api="completions",
        deadline_s=None, request_timeout_s=30, max_in_flight=1000))
    assert [r.index for r in run.records] == list(range(n))
    assert all(r.ok for r in run.records)
    assert [r.scheduled_s for r in run.records] == schedule
    # Sent on time, not after the previous response: a closed loop of one would send
    # request i at ~1.2 x i seconds.
    lags = [r.dispatch_s - r.scheduled_s for r in run.records]
    assert min(lags) >= 0
    assert max(lags) < 0.5
    assert run.cap_waits == 0
    # Many were in flight at once (the server saw them overlap).
    assert run.peak_in_flight >= 6
    assert served.state.max_in_flight >= 6
    m = rate_level_metrics(run, 10.0, cap=1000, planned=n)
    assert m.request_rate == 10.0 and m.cap_waits == 0 and m.completed == n
    assert m.client_queue_ms.n == n and m.client_queue_ms.max is not None
    assert m.client_queue_ms.max < 500


def test_a_blocked_event_loop_does_not_shift_later_arrivals(served: Served) -> None:
    # The client itself stalls for 0.6 s right after the first send: the sends due during
    # the stall go out late, but the ones after it are back on their own times (absolute
    # schedule, no drift from sleeping per gap).
    n = 10
    schedule = [0.1 * (i + 1) for i in range(n)]
    plan = [plan_item(i) for i in range(n)]

    async def go():
        async def stall() -> None:
            await asyncio.sleep(0.12)
            time.sleep(0.6)  # noqa: ASYNC251 - on purpose: blocks the loop, as a slow client would

        task = asyncio.create_task(stall())
        run = await run_rate_level(served.base_url, "fake", plan, schedule, api="completions",
                                   deadline_s=None, request_timeout_s=30, max_in_flight=100)
        await task
        return run

    run = asyncio.run(go())
    by_index = {r.index: r for r in run.records}
    # Due 1.0 s: after the 0.72 s stall ended; a drifting launcher would send it near
    # 0.72 + 8 x 0.1 = 1.5 s.
    last = by_index[n - 1]
    assert last.dispatch_s - last.scheduled_s < 0.35
    late = [r for r in run.records if 0.12 < r.scheduled_s < 0.7]
    assert late and all(r.dispatch_s >= 0.7 for r in late)
    assert all(r.dispatch_s >= r.scheduled_s for r in run.records)


# quiethost: the cap's waits are counted from sends 50 ms apart; beside a vLLM server a
# starved client sent one late enough to find a slot free (CI rehearsal: 5 waits, not 6).
@pytest.mark.quiethost
def test_cap_binds_and_the_wait_is_recorded(served: Served) -> None:
    n = 8
    schedule = [0.05 * (i + 1) for i in range(n)]  # all due within 0.4 s
    run = asyncio.run(run_rate_level(
        served.base_url, "fake", _slow_plan(n, 1.0), schedule, api="completions",
        deadline_s=None, request_timeout_s=30, max_in_flight=2))
    assert len(run.records) == n and all(r.ok for r in run.records)
    assert run.peak_in_flight == 2
    assert served.state.max_in_flight <= 2
    assert run.cap_waits == n - 2
    queue = [r.dispatch_s - r.scheduled_s for r in run.records]
    # Two at a time, ~1 s each: the last pair waits ~3 s beyond its due time.
    assert max(queue) > 1.5
    assert all(q < 0.5 for q in queue[:2])
    m = rate_level_metrics(run, 20.0, cap=2, planned=n)
    assert m.cap_waits == n - 2 and m.peak_in_flight == 2
    assert m.client_queue_ms.p90 is not None and m.client_queue_ms.p90 > 1000
    assert m.concurrency == 2


def test_deadline_stops_sending(served: Served) -> None:
    schedule = [0.05, 0.1, 5.0, 6.0]
    run = asyncio.run(run_rate_level(
        served.base_url, "fake", [plan_item(i) for i in range(4)], schedule,
        api="completions", deadline_s=1.0, request_timeout_s=10, max_in_flight=10))
    assert [r.index for r in run.records] == [0, 1]


def test_schedule_must_match_the_plan() -> None:
    with pytest.raises(ValueError, match="schedule"):
        asyncio.run(run_rate_level("http://127.0.0.1:9", "m", [plan_item(0)], [0.1, 0.2],
                                   api="completions", deadline_s=None, request_timeout_s=1,
                                   max_in_flight=1))
    with pytest.raises(ValueError, match="non-decreasing"):
        asyncio.run(run_rate_level("http://127.0.0.1:9", "m", [plan_item(0), plan_item(1)],
                                   [0.2, 0.1], api="completions", deadline_s=None,
                                   request_timeout_s=1, max_in_flight=1))


def test_connect_errors_are_records_not_exceptions() -> None:
    run = asyncio.run(run_rate_level(
        "http://127.0.0.1:9", "m", [plan_item(0), plan_item(1)], [0.01, 0.02],
        api="completions", deadline_s=None, request_timeout_s=5, max_in_flight=4))
    assert [r.ok for r in run.records] == [False, False]
    assert {r.error.type for r in run.records if r.error} <= {"connect_error", "timeout"}


# ---------------------------------------------------------------- the sweep


def test_sweep_measures_rate_levels_after_the_concurrency_levels(served: Served,
                                                                   tmp_path: Path) -> None:
    spec = SWEEP.model_copy(update={
        "concurrency": (1,), "request_rates": (5.0, 20.0), "rate_duration_s": 1.0,
        "min_requests": 4, "seed": 7,
    })
    result = asyncio.run(run_sweep(served.base_url, "fake", spec, ignore_eos=True,
                                   deadline_s=60))
    assert [lv.concurrency for lv in result.levels] == [1]
    assert [lv.request_rate for lv in result.rate_levels] == [5.0, 20.0]
    assert result.skipped_rates == [] and result.stopped_rates == []
    for lv, n in zip(result.rate_levels, (5, 20)):
        rate = lv.request_rate
        assert rate is not None
        assert len(lv.records) == n == spec.requests_for_rate(rate)
        assert lv.metrics.request_rate == rate and lv.metrics.completed == n
        assert lv.metrics.failed == 0 and lv.metrics.cap_waits == 0
        assert lv.concurrency == spec.max_in_flight and lv.warmup.requests == 0
        expected = arrival_schedule(n, rate, seed=7, stream=rate_stream("measure", rate))
        assert [r.scheduled_s for r in lv.records] == expected
        assert all(r.dispatch_s >= r.scheduled_s for r in lv.records)
        assert lv.token_agreement.agree is True
        drafts = draft_requests(spec.workload, n, seed=7, stream=rate_stream("measure", rate))
        assert [r.prompt_tokens for r in lv.records] == [d.target_prompt_tokens for d in drafts]
    # Prompts of rate levels are their own: nothing the concurrency level sent is repeated.
    prompts = [b["prompt"] for b in served.state.bodies]
    assert len(set(prompts)) == len(prompts)
    # No synchronized first wave in open loop: the window opens after the first request
    # (with the cap as first wave it would wait for every request and fall back).
    fast = result.rate_levels[1].metrics
    assert not fast.window_fallback and fast.output_tok_s > 0
    assert {rate_level_name(lv.request_rate or 0.0) for lv in result.rate_levels} == {"r5.0", "r20.0"}
    assert {lv.concurrency for lv in result.levels} == {1}
    assert SweepResult.model_validate_json(result.to_json()) == result
    assert "records" not in result.summary()["rate_levels"][0]


def test_sweep_without_rates_has_no_rate_levels(served: Served) -> None:
    spec = SWEEP.model_copy(update={"concurrency": (1,), "warmup_requests": 0})
    result = asyncio.run(run_sweep(served.base_url, "fake", spec, ignore_eos=True,
                                   deadline_s=None))
    assert result.rate_levels == [] and result.skipped_rates == []
    assert len(served.state.bodies) == 3


def test_rate_levels_follow_an_early_stop_and_the_budget(served: Served) -> None:
    spec = SWEEP.model_copy(update={"request_rates": (5.0,), "rate_duration_s": 1.0})
    stopped = asyncio.run(run_sweep(served.base_url, "fake", spec, ignore_eos=True,
                                    deadline_s=None, after_level=lambda m, rest: True))
    assert stopped.stopped_levels == [2] and stopped.stopped_rates == [5.0]
    assert stopped.rate_levels == []
    spent = asyncio.run(run_sweep(served.base_url, "fake", spec, ignore_eos=True,
                                  deadline_s=0.0))
    assert spent.skipped_rates == [5.0] and spent.rate_levels == []
    assert any("rate levels [5.0] skipped" in w for w in spent.warnings)


def test_level_names() -> None:
    assert rate_level_name(2) == "r2.0"
    assert rate_level_name(0.5) == "r0.5"
    assert rate_stream("measure", 8) == "measure-r8.0"


# ---------------------------------------------------------------- the load: keys


def test_rate_keys_defaults_and_counts() -> None:
    spec = LoadSpec()
    assert spec.request_rates == () and spec.arrival == "poisson"
    assert spec.burstiness == 1.0 and spec.rate_duration_s == 60 and spec.max_in_flight == 1024
    spec = LoadSpec(request_rates=[2, 8.0], arrival="gamma", burstiness=0.5,
                    rate_duration_s=30, min_requests=8)
    assert spec.request_rates == (2.0, 8.0)
    assert spec.requests_for_rate(2.0) == 60 and spec.requests_for_rate(0.1) == 8


@pytest.mark.parametrize(
    ("update", "field", "needle"),
    [
        ({"request_rates": [-1.0]}, "request_rates", "request_rates[0]=-1.0"),
        ({"request_rates": [0]}, "request_rates", "finite numbers > 0"),
        ({"request_rates": [4.0, 2.0]}, "request_rates", "strictly ascending"),
        ({"request_rates": ["fast"]}, "request_rates", "not a number"),
        ({"arrival": "uniform"}, "arrival", "poisson"),
        ({"arrival": "gamma", "burstiness": 0}, "burstiness", "burstiness=0"),
        ({"arrival": "gamma", "burstiness": -2.0}, "burstiness", "> 0"),
        ({"burstiness": 0.5}, "burstiness", "arrival: gamma"),
        ({"rate_duration_s": 0}, "rate_duration_s", "rate_duration_s=0"),
        ({"max_in_flight": 0}, "max_in_flight", "max_in_flight=0"),
    ],
)
def test_bad_rate_keys_are_rejected(update: dict, field: str, needle: str) -> None:
    with pytest.raises(ValidationError) as info:
        LoadSpec(**update)
    text = str(info.value)
    assert needle in text
    assert field in text


_DEMO = Path(__file__).resolve().parents[1] / "search_spaces" / "demo.yaml"


@pytest.mark.parametrize(
    ("keys", "needles"),
    [
        ("  request_rates: [2.0, -1.0]\n", ("load.request_rates", "-1.0", "> 0")),
        ("  request_rates: [2.0]\n  arrival: uniform\n", ("load.arrival", "'uniform'", "poisson")),
        ("  request_rates: [2.0]\n  arrival: gamma\n  burstiness: 0\n",
         ("load.burstiness", "burstiness=0", "> 0")),
    ],
)
def test_study_file_error_names_field_value_and_allowed(keys: str, needles: tuple) -> None:
    base = _DEMO.read_text()
    assert "\nload:\n" in base
    good = parse_study(base.replace("\nload:\n", "\nload:\n  request_rates: [2.0, 8.0]\n", 1))
    assert good.load.request_rates == (2.0, 8.0)
    with pytest.raises(SpecError) as info:
        parse_study(base.replace("\nload:\n", "\nload:\n" + keys, 1), "s.yaml")
    text = str(info.value)
    for needle in needles:
        assert needle in text, text


def test_first_wave_override_opens_the_window_after_one_request() -> None:
    from tuner.load.metrics import compute_level_metrics
    from tuner.load.records import RequestRecord

    records = [
        RequestRecord(index=i, class_name="t", concurrency=10, scheduled_s=0.1 * i,
                      dispatch_s=0.1 * i, chunk_times_s=[0.1 * i + 0.01 * k for k in (1, 2, 3, 4)],
                      chunk_tokens=[1, 1, 1, 1], chunk_chars=[4] * 4, done_s=0.1 * i + 0.05,
                      prompt_tokens=8, output_tokens=4, ok=True)
        for i in range(20)
    ]
    # As a closed loop of 10 the window waits for the first 10 to finish ...
    closed = compute_level_metrics(records, concurrency=10)
    assert closed.window_start_s == pytest.approx(0.95)
    # ... open loop has no first wave: it opens at max(15 % of the span, first done).
    opened = compute_level_metrics(records, concurrency=10, first_wave=1)
    assert opened.window_start_s == pytest.approx(0.15 * 1.9)
    assert not opened.window_fallback and opened.concurrency == 10
    assert opened.output_tok_s == pytest.approx(40.0, rel=0.15)
