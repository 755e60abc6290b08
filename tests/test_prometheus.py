"""Prometheus text parsing, snapshot diffs and vLLM server-side metrics."""

from __future__ import annotations

import math

import pytest

from tuner.load.prometheus import (
    SERVER_METRIC_KEYS,
    diff_snapshots,
    parse_prometheus_text,
    server_side_metrics,
)

# Shaped like vLLM's /metrics (prometheus_client): HELP/TYPE lines, _created samples,
# two engines (data parallel), per-position spec counters, histograms with +Inf buckets.
BEFORE = r"""
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 1234.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 1000.0
vllm:prompt_tokens_total{engine="1",model_name="m"} 500.0
# HELP vllm:prompt_tokens_created Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_created gauge
vllm:prompt_tokens_created{engine="0",model_name="m"} 1.7e+09
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 2000.0
vllm:generation_tokens_total{engine="1",model_name="m"} 1000.0
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 2.0
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 10.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 5.0
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 100.0
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 400.0
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 200.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 80.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 60.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 40.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="3"} 20.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 5.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 15.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 15.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 3.0
"""

AFTER = r"""
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 0.0
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 1600.0
vllm:prompt_tokens_total{engine="1",model_name="m"} 700.0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 2600.0
vllm:generation_tokens_total{engine="1",model_name="m"} 1400.0
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 2.0
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 18.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 5.0
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 150.0
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 600.0
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 320.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 125.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 95.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 65.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="3"} 35.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 9.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 25.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 25.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 5.5
"""


def test_parse_labels_values_and_types() -> None:
    snap = parse_prometheus_text(BEFORE)
    assert snap.types["vllm:time_to_first_token_seconds"] == "histogram"
    assert snap.total("vllm:prompt_tokens_total") == 1500.0
    assert snap.total("vllm:prompt_tokens_total", engine="1") == 500.0
    assert snap.total("vllm:request_success_total", finished_reason="stop") == 5.0
    assert snap.total("vllm:prompt_tokens_created") == pytest.approx(1.7e9)
    assert snap.total("vllm:time_to_first_token_seconds_bucket", le="+Inf") == 15.0
    assert snap.by_label("vllm:spec_decode_num_accepted_tokens_per_pos_total", "position") == {
        "0": 80.0, "1": 60.0, "2": 40.0, "3": 20.0,
    }


def test_absent_metric_is_none_not_zero() -> None:
    snap = parse_prometheus_text(BEFORE)
    assert snap.total("vllm:does_not_exist") is None
    assert snap.total("vllm:prompt_tokens_total", engine="7") is None
    assert snap.by_label("vllm:nope", "position") is None


def test_escapes_special_values_and_timestamps() -> None:
    text = (
        'm{path="C:\\\\dir",quote="say \\"hi\\"",nl="a\\nb",comma="x,y}"} 1\n'
        "inf_metric +Inf\n"
        "neg -Inf\n"
        "nan_metric NaN\n"
        "with_ts 4.5 1700000000000\n"
        "   \n"
        "# EOF\n"
    )
    snap = parse_prometheus_text(text)
    ((labels, value),) = snap.samples["m"].items()
    assert dict(labels) == {"path": "C:\\dir", "quote": 'say "hi"', "nl": "a\nb", "comma": "x,y}"}
    assert value == 1.0
    assert snap.total("inf_metric") == math.inf
    assert snap.total("neg") == -math.inf
    assert math.isnan(snap.total("nan_metric") or 0.0)
    assert snap.total("with_ts") == 4.5


@pytest.mark.parametrize(
    "bad",
    ["metric_without_value", 'm{a="1" 3', 'm{a=1} 3', "m 1 2 3", "m notanumber"],
)
def test_malformed_lines_raise_with_line_number(bad: str) -> None:
    with pytest.raises(ValueError, match="line 2"):
        parse_prometheus_text("ok 1\n" + bad + "\n")


def test_diff_counts_new_series_from_zero_and_flags_resets() -> None:
    before = parse_prometheus_text("c_total{a=\"x\"} 10\ng 5\n# TYPE g gauge\n")
    after = parse_prometheus_text(
        "# TYPE g gauge\nc_total{a=\"x\"} 4\nc_total{a=\"y\"} 3\ng 1\n"
    )
    delta, resets = diff_snapshots(before, after)
    assert delta.total("c_total", a="x") == 4.0  # reset: the after value is the increase
    assert delta.total("c_total", a="y") == 3.0  # created in between: counted from 0
    assert delta.total("g") == -4.0  # gauges may go down without being a reset
    assert resets == ["c_total"]


def test_server_side_metrics_hand_computed() -> None:
    s = server_side_metrics(parse_prometheus_text(BEFORE), parse_prometheus_text(AFTER))
    assert tuple(s) == SERVER_METRIC_KEYS
    assert s["generation_tokens"] == 1000.0  # 600 + 400 over both engines
    assert s["prompt_tokens"] == 800.0
    assert s["preemptions"] == 0.0
    assert s["requests_succeeded"] == 8.0
    assert s["spec_drafts"] == 50.0
    assert s["spec_draft_tokens"] == 200.0
    assert s["spec_accepted_tokens"] == 120.0
    assert s["spec_acceptance_rate"] == pytest.approx(0.6)
    assert s["spec_mean_acceptance_length"] == pytest.approx(1 + 120 / 50)
    assert s["spec_acceptance_rate_per_position"] == pytest.approx([0.9, 0.7, 0.5, 0.3])
    assert s["ttft_mean_ms"] == pytest.approx(2.5 / 10 * 1000)
    assert s["itl_mean_ms"] is None  # histogram not exposed
    assert s["prefix_cache_hit_rate"] is None
    assert s["counter_resets"] == []


def test_no_speculation_gives_none_not_zero() -> None:
    text = "vllm:generation_tokens_total 10\n"
    s = server_side_metrics(parse_prometheus_text(text), parse_prometheus_text(text))
    assert s["generation_tokens"] == 0.0
    for key in ("spec_drafts", "spec_acceptance_rate", "spec_mean_acceptance_length",
                "spec_acceptance_rate_per_position", "preemptions"):
        assert s[key] is None


def test_zero_drafts_in_window_gives_no_rates() -> None:
    text = (
        "vllm:spec_decode_num_drafts_total 5\nvllm:spec_decode_num_draft_tokens_total 20\n"
        "vllm:spec_decode_num_accepted_tokens_total 9\n"
    )
    s = server_side_metrics(parse_prometheus_text(text), parse_prometheus_text(text))
    assert s["spec_drafts"] == 0.0
    assert s["spec_acceptance_rate"] is None and s["spec_mean_acceptance_length"] is None


def test_positions_sort_numerically() -> None:
    lines = [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}} {i}'
             for i in (10, 2, 0, 1)]
    after = parse_prometheus_text("vllm:spec_decode_num_drafts_total 100\n" + "\n".join(lines))
    s = server_side_metrics(parse_prometheus_text(""), after)
    assert s["spec_acceptance_rate_per_position"] == pytest.approx([0.0, 0.01, 0.02, 0.10])


def test_metrics_disabled_everything_none() -> None:
    empty = parse_prometheus_text("# only python metrics\npython_info 1\n")
    s = server_side_metrics(empty, empty)
    assert all(s[k] is None for k in SERVER_METRIC_KEYS if k != "counter_resets")
