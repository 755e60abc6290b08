"""Levels sized by time and steady state (load.sizing: steady): the pure tracker on made-up
token streams, and whole sweeps against the in-test streaming server (tests/fake_server.py)."""

from __future__ import annotations

import asyncio
import random

import pytest

from tests.fake_server import Served
from tuner.load.load_spec import LoadSpec, WorkloadClass, WorkloadSpec
from tuner.load.metrics import compute_level_metrics
from tuner.load.records import RequestRecord
from tuner.load.steady import SteadyRule, SteadyTracker
from tuner.load.sweep import run_sweep
from tuner.load.window import SteadyWindow

RULE = SteadyRule(min_window_s=2.0, min_requests=4, subwindows=4, max_ratio=1.10,
                  max_level_s=60.0, bin_s=0.01)


def _req(pos: int, start: float, n: int, gap: float) -> RequestRecord:
    """A request dispatched at ``start`` whose ``n`` tokens arrive ``gap`` apart."""
    times = [start + gap * (k + 1) for k in range(n)]
    return RequestRecord(index=pos, class_name="c", concurrency=1, scheduled_s=start,
                         dispatch_s=start, chunk_times_s=times, chunk_tokens=[1] * n,
                         chunk_chars=[3] * n, done_s=times[-1], prompt_tokens=5,
                         output_tokens=n, ok=True)


def _feed(tracker: SteadyTracker, gaps: list[float], n: int = 10) -> list[RequestRecord]:
    """One stream, request after request, request i's tokens ``gaps[i]`` apart."""
    t, out = 0.0, []
    for pos, gap in enumerate(gaps):
        r = _req(pos, t, n, gap)
        tracker.add(pos, r)
        out.append(r)
        t = r.done_s
    return out


def test_tracker_waits_for_the_window_then_stops_on_a_steady_rate() -> None:
    tr = SteadyTracker(RULE, concurrency=1)
    assert tr.check(5.0) is None                       # no first wave yet
    recs = _feed(tr, [0.05] * 12)                      # 20 tok/s, 0.5 s a request, 6 s
    assert tr.opened_s == pytest.approx(0.5)
    early = tr.check(1.5)
    assert early is not None and not early.enough      # window not long enough after opening
    check = tr.check(recs[-1].done_s)
    assert check is not None and check.enough and check.stable
    assert check.window_s >= RULE.min_window_s and check.completions >= 4
    assert check.output_tok_s == pytest.approx(20.0, rel=0.02)
    assert tr.done(check, recs[-1].done_s)


def test_a_slow_ramp_moves_the_window_past_it() -> None:
    # Requests get faster for 4 s (a warm-up ramp), then hold 20 tok/s.
    gaps = [0.2, 0.15, 0.1, 0.08, 0.06] + [0.05] * 16
    tr = SteadyTracker(RULE, concurrency=1)
    recs = _feed(tr, gaps)
    ends = [r.done_s for r in recs]
    # Judged right after the ramp, the window still holds part of it: unsteady.
    during = tr.check(ends[5])
    assert during is not None and during.enough and not during.stable
    # The first stable judgement comes once the window has slid past the ramp.
    stop = next(t for t in ends if (c := tr.check(t)) is not None and c.enough and c.stable)
    check = tr.check(stop)
    assert check is not None and check.start_s >= ends[4] - 0.01
    assert check.output_tok_s == pytest.approx(20.0, rel=0.03)


def test_jitter_above_the_rule_never_stabilises_and_times_out() -> None:
    # Throughput jumps between 10 and 30 tok/s every second (seeded), for 12 s: no window
    # inside the level is long enough to average that to within 10 %.
    rule = SteadyRule(min_window_s=2.0, min_requests=2, subwindows=4, max_ratio=1.10,
                      max_level_s=12.0, bin_s=0.01)
    rng = random.Random(3)
    rates = [rng.uniform(10, 30) for _ in range(13)]
    t, times = 0.0, []
    while t < 12.0:
        t += 1 / rates[int(t)]
        times.append(t)
    tr = SteadyTracker(rule, concurrency=1)
    checks = []
    for pos in range(len(times) // 10):
        chunk = times[pos * 10:(pos + 1) * 10]
        start = times[pos * 10 - 1] if pos else 0.0
        r = RequestRecord(index=pos, class_name="c", concurrency=1, scheduled_s=start,
                          dispatch_s=start, chunk_times_s=chunk, chunk_tokens=[1] * 10,
                          chunk_chars=[3] * 10, done_s=chunk[-1], output_tokens=10, ok=True)
        tr.add(pos, r)
        checks.append(tr.check(r.done_s))
    assert any(c is not None and c.enough for c in checks)
    assert not any(c is not None and c.enough and c.stable for c in checks)
    assert tr.done(tr.check(12.0), 12.0)              # only the time limit ends it


def test_failures_end_a_level_early() -> None:
    tr = SteadyTracker(RULE, concurrency=2)
    bad = RequestRecord(index=0, class_name="c", concurrency=2, scheduled_s=0, dispatch_s=0,
                        done_s=0.01, ok=False)
    for pos in range(4):
        tr.add(pos, bad)
    assert tr.done(None, 0.1)


def test_steady_metrics_latencies_from_the_window_throughput_from_every_token() -> None:
    recs = _feed(SteadyTracker(RULE, 1), [0.05] * 12)
    phased = [r.model_copy(update={"phase": "warmup" if r.dispatch_s < 1.0 else "measure"})
              for r in recs]
    m = compute_level_metrics(phased, concurrency=1,
                              steady=SteadyWindow(1.0, 5.0, 4, 1.10, "stable"))
    assert m.sizing == "steady" and m.stop_reason == "stable" and not m.unstable
    assert m.completed == 10 and m.output_tok_s == pytest.approx(20.0, rel=0.02)
    assert m.subwindow_output_tok_s and len(m.subwindow_output_tok_s) == 4
    flat = m.flat()
    assert flat["unstable"] == 0.0 and flat["output_tok_s.n"] == 4
    assert flat["output_tok_s.ci95"] < 1.0           # a steady stream: a narrow interval
    assert flat["tpot_ms.p50.n"] == 10 and flat["tpot_ms.mean.ci95"] >= 0
    late = compute_level_metrics(phased, concurrency=1,
                                 steady=SteadyWindow(1.0, 5.0, 4, 1.10, "max_level_seconds"))
    assert late.unstable and late.flat()["unstable"] == 1.0


SPEC = LoadSpec(
    concurrency=[1, 3],
    min_window_s=0.4,
    stability_subwindows=4,
    stability_max_ratio=1.5,
    min_requests=4,
    max_level_seconds=10,
    request_timeout_s=10,
    workload=WorkloadSpec(classes=[
        WorkloadClass(name="chat", kind="open_ended", prompt_tokens=40, output_tokens=8),
        WorkloadClass(name="edit", kind="copy_heavy", prompt_tokens=60, output_tokens=8),
    ]),
)


def test_steady_sweep_against_a_streaming_server(served: Served) -> None:
    result = asyncio.run(run_sweep(served.base_url, "fake", SPEC, ignore_eos=True))
    assert [lv.concurrency for lv in result.levels] == [1, 3]
    for lv in result.levels:
        m = lv.metrics
        # The in-test server shares this process's CPU: on a loaded machine its pace can
        # wander past the rule, so either ending is accepted, told apart by the flag.
        assert m.sizing == "steady" and m.stop_reason in ("stable", "max_level_seconds")
        assert m.unstable is (m.stop_reason != "stable")
        assert m.window_s is not None and m.window_s >= 0.4 - 1e-9
        assert (m.window_completions or 0) >= max(4, lv.concurrency)
        assert m.failed == 0 and m.completed >= 1
        phases = {r.phase for r in lv.records}
        assert {"warmup", "measure"} <= phases
        # Warm-up prompts and measured prompts come from different seed streams.
        assert lv.warmup.requests >= lv.concurrency and lv.prompts_fitted
        # Every token the server generated was counted by the client, cancelled drains too.
        assert lv.token_agreement.agree is True
        flat = m.flat()
        assert flat["output_tok_s.ci95"] >= 0 and flat["output_tok_s.n"] == 4
    assert served.state.in_flight == 0


def test_steady_level_respects_the_sweep_budget(served: Served) -> None:
    spec = SPEC.model_copy(update={"concurrency": (2,), "min_window_s": 30.0,
                                   "max_level_seconds": 40.0})
    result = asyncio.run(run_sweep(served.base_url, "fake", spec, ignore_eos=True,
                                   deadline_s=4.0))
    (lv,) = result.levels
    assert lv.metrics.stop_reason == "max_level_seconds" and lv.metrics.unstable
    assert lv.deadline_hit and result.duration_s < 15


def test_steady_sizing_rejects_request_count_fields() -> None:
    with pytest.raises(ValueError, match="load.requests_per_stream sizes levels by request"):
        LoadSpec(sizing="steady", requests_per_stream=4)
    with pytest.raises(ValueError, match="client_processes=2 needs load.sizing: requests"):
        LoadSpec(client_processes=2)
    with pytest.raises(ValueError, match="min_window_s=50.0 is longer than"):
        LoadSpec(min_window_s=50, max_level_seconds=20)
    # A study file from before load.sizing keeps its request-count meaning.
    assert LoadSpec(requests_per_stream=4).sizing == "requests"
    assert LoadSpec().sizing == "steady"
