"""Metrics from hand-built request records, with hand-computed expectations.

Times are binary fractions (0.25, 0.125 …) so window boundaries compare exactly.
"""

from __future__ import annotations

import math
import random
import statistics
from typing import Any

import numpy as np
import pytest

from tuner.load.metrics import (
    EXTRA_FLAT_KEYS,
    FLAT_KEYS,
    LevelMetrics,
    compute_level_metrics,
    summarize_repeats,
)
from tuner.load.records import RequestError, RequestRecord, token_timeline
from tuner.load.stats import P99_MIN_SAMPLES, Stat, percentile


def rec(
    dispatch: float,
    chunks: list[float],
    *,
    out: int | None = None,
    prompt: int | None = 100,
    index: int = 0,
    ok: bool = True,
    done: float | None = None,
    chunk_tokens: list[int] | None = None,
    chunk_chars: list[int] | None = None,
    error: str | None = None,
    scheduled: float | None = None,
    cls: str = "default",
    concurrency: int = 1,
) -> RequestRecord:
    return RequestRecord(
        index=index,
        class_name=cls,
        concurrency=concurrency,
        scheduled_s=dispatch if scheduled is None else scheduled,
        dispatch_s=dispatch,
        chunk_times_s=chunks,
        chunk_tokens=chunk_tokens,
        chunk_chars=chunk_chars if chunk_chars is not None else [4] * len(chunks),
        done_s=done if done is not None else (chunks[-1] if chunks else dispatch),
        prompt_tokens=prompt,
        output_tokens=len(chunks) if out is None else out,
        ok=ok,
        error=None if ok else RequestError(type=error or "timeout", message="it failed"),
        finish_reason="length" if ok else None,
        http_status=200,
    )


def test_single_request_with_a_three_token_speculative_chunk() -> None:
    # 4 chunks, the third carries 3 tokens: 6 tokens in total.
    r = rec(1.0, [1.5, 1.625, 1.75, 1.875], out=6, chunk_tokens=[1, 1, 3, 1])
    m = compute_level_metrics([r], concurrency=1)
    assert m.ttft_ms.mean == pytest.approx(500)
    assert m.e2el_ms.mean == pytest.approx(875)
    # TPOT spreads decode time over every token after the first: 0.375 s / 5.
    assert m.tpot_ms.mean == pytest.approx(75)
    # ITL counts chunk gaps, blind to the 3-token chunk: why specs compare on TPOT.
    assert m.itl_ms.n == 3 and m.itl_ms.mean == pytest.approx(125)
    assert m.output_tok_s_per_user == pytest.approx(6 / 0.875)
    assert m.completed == 1 and m.failed == 0
    assert m.total_output_tokens == 6 and m.total_prompt_tokens == 100


def test_requests_with_at_most_one_token_are_dropped_from_tpot_only() -> None:
    one = rec(0.0, [0.5], out=1, index=0)
    two = rec(0.0, [0.25, 0.75], out=2, index=1)
    m = compute_level_metrics([one, two], concurrency=2)
    assert m.tpot_ms.n == 1 and m.tpot_ms.mean == pytest.approx(500)
    assert m.ttft_ms.n == 2 and m.ttft_ms.mean == pytest.approx(375)
    assert m.e2el_ms.n == 2


def test_failures_are_excluded_from_latency_and_counted_by_reason() -> None:
    good = rec(0.0, [0.25, 0.5], out=2, index=0)
    timed_out = rec(0.0, [2.0, 9.0], out=None, ok=False, index=1, error="timeout", done=10.0)
    http = rec(0.0, [], ok=False, index=2, error="http_status", out=None)
    http2 = rec(0.0, [], ok=False, index=3, error="http_status", out=None)
    m = compute_level_metrics([good, timed_out, http, http2], concurrency=4, planned=5)
    assert m.completed == 1 and m.failed == 3 and m.issued == 4 and m.planned == 5
    assert m.failure_reasons == {"http_status": 2, "timeout": 1}
    assert m.failure_examples["timeout"] == "it failed"
    assert m.ttft_ms.n == 1 and m.ttft_ms.mean == pytest.approx(250)
    assert m.itl_ms.n == 1 and m.itl_ms.mean == pytest.approx(250)
    assert m.total_output_tokens == 2


def _closed_loop_c2() -> list[RequestRecord]:
    """Two streams, three 1-second requests each, 4 one-token chunks every 0.25 s."""
    out = []
    for stream in range(2):
        for k in range(3):
            t = float(k)
            out.append(
                rec(t, [t + 0.25, t + 0.5, t + 0.75, t + 1.0], index=2 * k + stream,
                    concurrency=2)
            )
    return out


def test_steady_state_window_hand_computed() -> None:
    m = compute_level_metrics(_closed_loop_c2(), concurrency=2)
    # first dispatch 0, last dispatch (t_stop) 2; 15 % of the span = 0.3, but the first
    # wave of C=2 requests completes at 1.0, so t_warm = 1.0 and the window is [1, 2).
    assert not m.window_fallback and m.window_fallback_reason is None
    assert (m.window_start_s, m.window_end_s, m.window_s) == (1.0, 2.0, 1.0)
    # Chunks in [1, 2): the first wave's last chunk (1.0) x2 and 3 chunks x2 of the second
    # wave = 8 tokens: exactly the true steady rate of 2 streams x 4 tok/s.
    assert m.output_tok_s == pytest.approx(8.0)
    # Prompt tokens count at first-token time: the second wave's (1.25) x 100 x 2.
    assert m.total_tok_s == pytest.approx(208.0)
    # Requests ending in [1, 2): the first wave's two.
    assert m.request_per_s == pytest.approx(2.0)
    assert m.ramp_up_s == pytest.approx(1.0)
    assert m.drain_s == pytest.approx(1.0)  # last dispatch 2 → last done 3
    # vLLM's whole-run figure includes ramp and drain: 24 tokens / 3 s.
    assert m.run_duration_s == pytest.approx(3.0)
    assert m.run_output_tok_s == pytest.approx(8.0)


def test_window_uses_15_percent_when_the_first_wave_is_quick() -> None:
    # C=1, ten 0.5 s requests back to back: first completion at 0.5, 15 % of the 4.5 s
    # issuing span = 0.675 → t_warm = 0.675, window [0.675, 4.5).
    recs = [rec(0.5 * k, [0.5 * k + 0.25, 0.5 * k + 0.5], index=k) for k in range(10)]
    m = compute_level_metrics(recs, concurrency=1)
    assert m.window_start_s == pytest.approx(0.675)
    assert m.window_end_s == pytest.approx(4.5)
    # Chunk times in [0.675, 4.5): 0.75, 1.0, …, 4.25 → 15 tokens.
    assert m.output_tok_s == pytest.approx(15 / 3.825)


def test_window_fallback_when_every_request_starts_at_once() -> None:
    recs = [rec(0.0, [0.5, 1.0], index=i, concurrency=2) for i in range(2)]
    m = compute_level_metrics(recs, concurrency=2)
    assert m.window_fallback
    assert "no steady state" in (m.window_fallback_reason or "")
    # Whole-run fallback as vLLM: 4 tokens / 1 s, 2 requests / 1 s.
    assert m.output_tok_s == pytest.approx(4.0)
    assert m.request_per_s == pytest.approx(2.0)
    assert m.total_tok_s == pytest.approx(204.0)


def test_window_fallback_when_window_is_a_sliver_of_the_run() -> None:
    recs = [
        rec(0.0, [1.0], index=0),
        rec(1.0, [1.0625], index=1),
        rec(1.0625, [10.0], index=2),
    ]
    m = compute_level_metrics(recs, concurrency=1)
    assert m.window_fallback
    assert "under 10%" in (m.window_fallback_reason or "")
    assert m.output_tok_s == pytest.approx(3 / 10.0)


def test_window_fallback_when_too_few_chunks_in_window() -> None:
    recs = [
        rec(0.0, [1.0], index=0),
        rec(1.0, [1.5], index=1),
        rec(1.5, [1.625], index=2),
    ]
    m = compute_level_metrics(recs, concurrency=1)
    assert m.window_fallback
    assert "only 1 chunk arrivals" in (m.window_fallback_reason or "")


def test_no_records() -> None:
    m = compute_level_metrics([], concurrency=4)
    assert m.completed == 0 and m.window_fallback and m.output_tok_s == 0.0
    flat = m.flat()
    assert math.isnan(flat["ttft_ms.p50"]) and flat["completed"] == 0.0


def test_token_timeline_exact_counts() -> None:
    r = rec(0.0, [0.25, 0.5, 0.75], out=5, chunk_tokens=[1, 3, 1])
    assert token_timeline(r) == [(0.25, 1.0), (0.5, 3.0), (0.75, 1.0)]


def test_token_timeline_spreads_usage_total_by_text_length() -> None:
    # Chat: empty role chunk, then a 3-token speculative chunk with 3x the text.
    r = rec(0.0, [0.25, 0.5, 0.75, 1.0], out=5, chunk_chars=[0, 5, 15, 5])
    assert token_timeline(r) == [(0.25, 0.0), (0.5, 1.0), (0.75, 3.0), (1.0, 1.0)]


def test_token_timeline_ignores_inconsistent_exact_counts() -> None:
    r = rec(0.0, [0.25, 0.5], out=4, chunk_tokens=[1, 1], chunk_chars=[1, 3])
    assert token_timeline(r) == [(0.25, 1.0), (0.5, 3.0)]


def test_token_timeline_even_without_text() -> None:
    r = rec(0.0, [0.25, 0.5], out=4, chunk_chars=[0, 0])
    assert token_timeline(r) == [(0.25, 2.0), (0.5, 2.0)]


def test_missing_usage_falls_back_to_counting_text_chunks() -> None:
    r = rec(0.0, [0.25, 0.5, 0.75], out=None, chunk_chars=[0, 2, 2]).model_copy(
        update={"output_tokens": None}
    )
    assert r.tokens_estimated and r.n_output_tokens() == 2
    m = compute_level_metrics([r], concurrency=1)
    assert m.tokens_estimated == 1 and m.total_output_tokens == 2


def test_client_queue_stat() -> None:
    recs = [rec(0.5, [1.0], scheduled=0.25, index=0), rec(1.0, [1.5], scheduled=1.0, index=1)]
    m = compute_level_metrics(recs, concurrency=1)
    assert m.client_queue_ms.mean == pytest.approx(125)
    assert m.client_queue_ms.max == pytest.approx(250)


def test_by_class_split() -> None:
    recs = [
        rec(0.0, [0.25, 0.5], cls="code", index=0),
        rec(0.0, [0.5, 1.5], cls="chat", index=1),
    ]
    m = compute_level_metrics(recs, concurrency=2)
    assert set(m.by_class) == {"chat", "code"}
    assert m.by_class["code"].tpot_ms.mean == pytest.approx(250)
    assert m.by_class["chat"].tpot_ms.mean == pytest.approx(1000)


def test_percentiles_match_numpy_linear() -> None:
    rng = random.Random(7)
    for n in (1, 2, 3, 10, 101, 1234):
        xs = [rng.expovariate(1.0) for _ in range(n)]
        s = Stat.of(xs)
        for q, got in ((50, s.p50), (90, s.p90), (95, s.p95), (99, s.p99)):
            assert got == pytest.approx(float(np.percentile(xs, q)))
        assert s.mean == pytest.approx(float(np.mean(xs)))
        assert s.std == pytest.approx(float(np.std(xs)))
        assert s.low_confidence_p99 is (n < P99_MIN_SAMPLES)


def test_percentile_small_hand_example() -> None:
    assert percentile([10.0, 20.0, 30.0, 40.0], 50) == 25.0
    assert percentile([10.0, 20.0, 30.0, 40.0], 90) == pytest.approx(37.0)
    with pytest.raises(ValueError, match="empty"):
        percentile([], 50)


def test_empty_stat() -> None:
    s = Stat.of([])
    assert s.n == 0 and s.mean is None and s.low_confidence_p99


def test_flat_has_exactly_the_stable_keys() -> None:
    m = compute_level_metrics(_closed_loop_c2(), concurrency=2)
    flat = m.flat()
    # The original keys first and unchanged; later additions only after them.
    assert tuple(flat) == FLAT_KEYS + EXTRA_FLAT_KEYS
    assert {
        "output_tok_s", "total_tok_s", "request_per_s", "output_tok_s_per_user",
        "ttft_ms.mean", "ttft_ms.p50", "ttft_ms.p90", "ttft_ms.p99",
        "tpot_ms.mean", "itl_ms.p99", "e2el_ms.p90", "failed", "completed",
    } <= set(flat)
    assert all(isinstance(v, float) for v in flat.values())
    assert flat["output_tok_s"] == pytest.approx(8.0)
    assert flat["ttft_ms.mean"] == pytest.approx(250)
    assert flat["completed"] == 6.0


def test_records_and_metrics_round_trip_through_json() -> None:
    recs = _closed_loop_c2() + [rec(0.0, [], ok=False, out=None, index=9, error="http_status")]
    for r in recs:
        assert RequestRecord.model_validate_json(r.model_dump_json()) == r
    m = compute_level_metrics(recs, concurrency=2)
    dumped: dict[str, Any] = m.model_dump(mode="json")
    assert LevelMetrics.model_validate(dumped) == m


def test_stability_sub_windows_hand_computed() -> None:
    m = compute_level_metrics(_closed_loop_c2(), concurrency=2)
    # Window [1, 2) is short: 3 sub-windows of 1/3 s. Tokens: [1, 1.333) holds the first
    # wave's last chunks (1.0 x2) and the second wave's 1.25 x2 = 4; [1.333, 1.667) holds
    # 1.5 x2 = 2; [1.667, 2) holds 1.75 x2 = 2.
    assert m.subwindow_s == pytest.approx(1 / 3)
    assert m.subwindow_output_tok_s == pytest.approx([12.0, 6.0, 6.0])
    assert m.stability_ratio == pytest.approx(2.0)
    assert m.unstable is True
    assert m.flat()["stability_ratio"] == pytest.approx(2.0)


def _back_to_back(n: int, gap: float, slow_after: int | None = None) -> list[RequestRecord]:
    """One stream, n requests of 10 one-token chunks ``gap`` apart (2*gap after slow_after)."""
    out, t = [], 0.0
    for i in range(n):
        g = gap * 2 if slow_after is not None and i >= slow_after else gap
        chunks = [round(t + g * (j + 1), 9) for j in range(10)]
        out.append(rec(t, chunks, index=i))
        t = chunks[-1]
    return out


def test_stability_steady_stream_is_stable() -> None:
    m = compute_level_metrics(_back_to_back(20, 0.1), concurrency=1)
    # Window [max(0.15 x 19, 1.0), 19) = [2.85, 19): 16.15 s, so 3 sub-windows (>= 5 s
    # each) of 5.3833 s holding chunks 2.9..8.2 (54), 8.3..13.6 (54), 13.7..18.9 (53).
    assert (m.window_start_s, m.window_end_s) == pytest.approx((2.85, 19.0))
    assert len(m.subwindow_output_tok_s) == 3
    width = 16.15 / 3
    assert m.subwindow_output_tok_s == pytest.approx([54 / width, 54 / width, 53 / width])
    assert m.stability_ratio == pytest.approx(54 / 53)
    assert m.unstable is False


def test_stability_flags_a_drifting_level() -> None:
    m = compute_level_metrics(_back_to_back(40, 0.1, slow_after=20), concurrency=1)
    # Halfway through, tokens come half as fast: the first and last sub-windows differ 2x.
    assert len(m.subwindow_output_tok_s) == 5
    assert m.stability_ratio == pytest.approx(2.0, rel=0.05)
    assert m.unstable is True


def test_stability_not_assessed_without_a_window() -> None:
    rs = [rec(0.0, [0.5, 1.0], index=i, concurrency=2) for i in range(2)]
    m = compute_level_metrics(rs, concurrency=2)
    assert m.window_fallback
    assert m.subwindow_output_tok_s == [] and m.stability_ratio is None and m.unstable is None
    assert math.isnan(m.flat()["stability_ratio"])


def _scaled(records: list[RequestRecord], f: float) -> list[RequestRecord]:
    return [r.model_copy(update={
        "dispatch_s": r.dispatch_s * f, "scheduled_s": r.scheduled_s * f, "done_s": r.done_s * f,
        "chunk_times_s": [t * f for t in r.chunk_times_s]}) for r in records]


def test_repeats_median_and_spread_hand_computed() -> None:
    base = _closed_loop_c2()  # 8 tok/s; time x2 halves it, x0.5 doubles it
    runs = [compute_level_metrics(_scaled(base, f), concurrency=2) for f in (2.0, 1.0, 0.5)]
    assert [r.output_tok_s for r in runs] == pytest.approx([4.0, 8.0, 16.0])
    m = summarize_repeats(runs)
    rs = m.repeats
    assert rs is not None and rs.n == 3 and rs.representative == 1
    assert m.output_tok_s == pytest.approx(8.0)  # detailed fields: the median run's
    flat = m.flat()
    assert flat["output_tok_s"] == pytest.approx(8.0)
    assert flat["ttft_ms.mean"] == pytest.approx(250)  # median of 500, 250, 125
    assert flat["completed"] == 18.0 and flat["failed"] == 0.0  # totals
    assert flat["repeats"] == 3.0
    # Coefficient of variation: sample std of (4, 8, 16) over their mean 28/3.
    assert flat["output_tok_s_cv"] == pytest.approx(statistics.stdev([4, 8, 16]) / (28 / 3))
    assert rs.min["output_tok_s"] == pytest.approx(4.0)
    assert rs.max["output_tok_s"] == pytest.approx(16.0)
    assert tuple(flat) == FLAT_KEYS + EXTRA_FLAT_KEYS
    # One run: returned unchanged.
    assert summarize_repeats(runs[:1]) is runs[0]
    again = LevelMetrics.model_validate_json(m.model_dump_json())
    assert again.repeats == rs


def test_burst_requests_leave_tpot_and_the_client_lag_rule() -> None:
    """A reply read mostly in one go gives no TPOT sample (it would read ~0 ms); a reply
    in few chunks at distinct times (speculation: several tokens a chunk) still does. The
    client-bound rule compares the loop's p99 lateness with half the median TTFT."""

    steady = rec(0.0, [0.1, 0.2, 0.3, 0.4], out=4, index=0)
    spec = rec(0.0, [0.1, 0.2], out=6, chunk_tokens=[3, 3], index=1)
    one_read = rec(0.0, [0.5, 0.5, 0.5, 0.5], out=4, index=2)       # every gap zero
    lone_chunk = rec(0.0, [0.3], out=5, chunk_tokens=[5], index=4)  # all tokens in one chunk
    # Some steps written back to back land in one read: the reply's span still holds.
    bunched = rec(0.0, [0.5, 0.5, 0.5, 0.6], out=4, index=3)
    m = compute_level_metrics([steady, spec, one_read, bunched, lone_chunk], concurrency=1)
    assert m.burst_requests == 2
    assert m.tpot_ms.n == 3 and m.tpot_ms.min == pytest.approx(20.0)  # spec: 100 ms / 5
    assert m.tpot_ms.p50 == pytest.approx(100 / 3)                   # bunched: 100 ms / 3
    assert m.client_bound is None and math.isnan(m.flat()["client_bound"])

    ttft_p50 = m.ttft_ms.p50 or 0
    calm = compute_level_metrics([steady], concurrency=1, client_lag_ms=[0.2] * 50)
    assert calm.client_bound is False and calm.flat()["unstable"] != 1.0
    late = compute_level_metrics([steady], concurrency=1,
                                 client_lag_ms=[0.2] * 40 + [0.6 * ttft_p50] * 10)
    assert late.client_bound is True and late.flat()["unstable"] == 1.0
    assert late.flat()["client_lag_ms.p99"] == pytest.approx(0.6 * ttft_p50)

    # With repeats, a stall in any repeat flags the level, as any failure shows.
    both = summarize_repeats([calm, late.model_copy(update={"output_tok_s": calm.output_tok_s + 1})])
    flat = both.flat()
    assert flat["client_bound"] == 1.0 and flat["unstable"] == 1.0
