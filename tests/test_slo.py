"""The SLO: study-file validation (tuner validate), vLLM's per-request goodput rule, the
level verdict, and goodput at a level."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tuner.commands.main import main as tuner_main
from tuner.load.goodput import level_slo
from tuner.load.metrics import compute_level_metrics
from tuner.load.records import RequestError, RequestRecord
from tuner.load.slo import SloSpec, level_verdict, request_latencies, request_meets

ROOT = Path(__file__).resolve().parents[1]
DEMO = (ROOT / "search_spaces" / "demo.yaml").read_text()


def study(slo: str = "", objectives: str | None = None, load_extra: str = "") -> str:
    text = DEMO
    if objectives is not None:
        a = text.index("objectives:\n")
        b = text.index("\nload:\n")
        text = text[:a] + objectives + text[b:]
    if load_extra:
        text = text.replace("load:\n", "load:\n" + load_extra, 1)
    return text + ("\n" + slo + "\n" if slo else "")


def validate(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    code = tuner_main(["validate", str(path)])
    out = capsys.readouterr()
    return code, out.out + out.err


# (what is wrong, the slo: line, words the error must contain: field, value, allowed)
BAD_SLO = [
    ("unknown metric", "slo: {ttfb_ms.p99: 2000}", ["slo", "ttfb_ms", "ttft_ms, tpot_ms, e2el_ms"]),
    ("itl refused", "slo: {itl_ms.p99: 20}", ["slo", "itl_ms", "pooled over chunks", "ttft_ms, tpot_ms, e2el_ms"]),
    ("bad percentile", "slo: {ttft_ms.p95: 2000}", ["slo", "ttft_ms.p95", "'p95'", "mean, p50, p90, p99"]),
    ("no statistic", "slo: {ttft_ms: 2000}", ["slo", "'ttft_ms'", "<metric>.<statistic>", "mean, p50, p90, p99"]),
    ("zero bound", "slo: {tpot_ms.p90: 0}", ["slo", "tpot_ms.p90", "bound 0", "milliseconds > 0"]),
    ("negative bound", "slo: {e2el_ms.p50: -5}", ["slo", "e2el_ms.p50", "bound -5", "milliseconds > 0"]),
    # The study-file reader refuses non-finite numbers anywhere, naming where (line, column).
    ("infinite bound", "slo: {e2el_ms.p50: .inf}", [".inf is not a finite number", "line", "column"]),
    ("text bound", "slo: {ttft_ms.p99: fast}", ["slo", "ttft_ms.p99", "'fast'", "milliseconds > 0"]),
    ("not a mapping", "slo: [ttft_ms.p99]", ["slo", "not a mapping", "<metric>.<statistic>: <ms>"]),
    ("empty", "slo: {}", ["slo", "empty", "ttft_ms.p99: 2000"]),
]


@pytest.mark.parametrize("what,slo,words", BAD_SLO, ids=[b[0] for b in BAD_SLO])
def test_validate_refuses_bad_slo(tmp_path: Path, capsys: pytest.CaptureFixture[str], what: str,
                                  slo: str, words: list[str]) -> None:
    code, text = validate(tmp_path, study(slo), capsys)
    assert code == 2, text
    assert "s.yaml" in text and "Traceback" not in text
    for w in words:  # the field (or where it is), the value and what is allowed
        assert w in text, (what, w, text)


BAD_NAMES = [
    ("max_rate without slo", "", "objectives:\n  - {metric: max_rate@slo, direction: maximize}\n",
     "", ["max_rate@slo", "needs an slo: section"]),
    ("goodput without slo", "", "objectives:\n  - {metric: goodput_req_s, concurrency: 16, direction: maximize}\n",
     "", ["goodput_req_s", "needs an slo: section"]),
    ("max_rate minimized", "slo: {ttft_ms.p90: 500}",
     "objectives:\n  - {metric: max_rate@slo, direction: minimize}\n", "", ["max_rate@slo", "only be maximized"]),
    ("max_rate at a level", "slo: {ttft_ms.p90: 500}",
     "objectives:\n  - {metric: max_rate@slo, concurrency: 16, direction: maximize}\n", "",
     ["max_rate@slo", "one value per trial"]),
    ("rate not measured", "", "objectives:\n  - {metric: ttft_ms.p90, rate: 3.0, direction: minimize}\n",
     "  request_rates: [2.0]\n", ["ttft_ms.p90", "rate 3.0", "request_rates is [2.0]"]),
    ("rate and concurrency", "",
     "objectives:\n  - {metric: ttft_ms.p90, rate: 2.0, concurrency: 16, direction: minimize}\n",
     "  request_rates: [2.0]\n", ["concurrency or rate, not both"]),
    ("search range", "slo: {ttft_ms.p90: 500}", "objectives:\n  - {metric: max_rate@slo, direction: maximize}\n",
     "  rate_search: {low: 4, high: 2}\n", ["rate_search", "high=2.0", "low=4.0"]),
]


@pytest.mark.parametrize("what,slo,objectives,load,words", BAD_NAMES, ids=[b[0] for b in BAD_NAMES])
def test_validate_refuses_bad_slo_metric_names(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               what: str, slo: str, objectives: str, load: str,
                                               words: list[str]) -> None:
    code, text = validate(tmp_path, study(slo, objectives, load), capsys)
    assert code == 2, text
    for w in words:
        assert w in text, (what, w, text)


NO_SLO = [
    ("objectives:\n  - {metric: max_rate@slo, direction: maximize}\n",
     "objectives: max_rate@slo needs an slo: section (the latency SLO the rate must meet), "
     "e.g. slo: {ttft_ms.p99: 2000}"),
    ("objectives:\n  - {metric: goodput_req_s, concurrency: 16, direction: maximize}\n",
     "objectives: goodput_req_s needs an slo: section (requests are good when they meet it), "
     "e.g. slo: {ttft_ms.p99: 2000}"),
]


@pytest.mark.parametrize("objectives,message", NO_SLO, ids=["max_rate", "goodput"])
def test_validate_says_an_slo_is_missing_in_one_exact_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           objectives: str, message: str) -> None:
    # The example is YAML the user can paste: single braces (the text once printed '{{...}}').
    code, text = validate(tmp_path, study("", objectives), capsys)
    assert code == 2
    assert text == f"error: {tmp_path / 's.yaml'}: {message}\n"


def test_validate_shows_slo_and_search(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    objectives = ("objectives:\n  - {metric: max_rate@slo, direction: maximize}\n"
                  "  - {metric: ttft_ms.p90, rate: 2.0, direction: minimize}\n"
                  "limits:\n  - {metric: goodput_req_s, concurrency: 16, min: 0.5}\n")
    code, text = validate(tmp_path, study("slo: {ttft_ms.p99: 2000, tpot_ms.p90: 50}", objectives,
                                          "  request_rates: [2.0]\n"), capsys)
    assert code == 0, text
    assert "slo: ttft_ms.p99<=2000 tpot_ms.p90<=50" in text
    assert "objectives: max_rate@slo (maximize), ttft_ms.p90@r2.0 (minimize)" in text
    assert "limits: goodput_req_s@c16>=0.5" in text
    assert "max_rate@slo: searched in [0.1, 100] requests/s to 5% in at most 7 rate levels" in text


def test_slo_round_trips_as_the_mapping_the_file_wrote() -> None:
    slo = SloSpec.model_validate({"ttft_ms.p99": 2000, "tpot_ms.p50": 40})
    assert slo.model_dump() == {"ttft_ms.p99": 2000.0, "tpot_ms.p50": 40.0}
    assert SloSpec.model_validate(slo.model_dump()) == slo
    # The tightest bound per metric is what one request must meet.
    both = SloSpec.model_validate({"ttft_ms.p99": 2000, "ttft_ms.p50": 500})
    assert both.bounds() == {"ttft_ms": 500.0}


# ---------------------------------------------------------------- per request (vLLM's rule)


def rec(i: int, ttft: float, e2el: float, tokens: int, *, ok: bool = True,
        dispatch: float = 0.0) -> RequestRecord:
    """A request dispatched at ``dispatch`` whose tokens arrive evenly from ttft to e2el (s)."""
    if not ok:
        return RequestRecord(index=i, class_name="a", concurrency=1, scheduled_s=dispatch,
                             dispatch_s=dispatch, done_s=dispatch + e2el, ok=False,
                             error=RequestError(type="timeout", message="t"))
    n = max(tokens, 1)
    times = [dispatch + ttft + (e2el - ttft) * k / max(n - 1, 1) for k in range(n)] if n > 1 \
        else [dispatch + ttft]
    return RequestRecord(index=i, class_name="a", concurrency=1, scheduled_s=dispatch,
                         dispatch_s=dispatch, chunk_times_s=times, chunk_tokens=[1] * len(times),
                         chunk_chars=[4] * len(times), done_s=times[-1] + 0.001,
                         prompt_tokens=10, output_tokens=tokens, ok=True)


def vllm_good(ttft_s: float, latency_s: float, output_len: int, goodput: dict[str, float]) -> bool:
    """vLLM's benchmarks/serve.py::calculate_metrics goodput rule, restated for the test."""
    tpot = (latency_s - ttft_s) / (output_len - 1) if output_len > 1 else 0.0
    values = {"ttft": ttft_s, "tpot": tpot, "e2el": latency_s}
    return all(goodput[k] / 1000 >= values[k] for k in goodput)


@pytest.mark.parametrize("ttft,e2el,tokens", [
    (0.2, 1.0, 21), (0.6, 1.0, 21), (0.2, 4.0, 21), (0.2, 1.9, 2), (0.3, 0.3, 1),
    (0.5, 0.5, 1), (0.49, 2.5, 50), (0.1, 3.1, 31),
])
def test_request_rule_matches_vllm(ttft: float, e2el: float, tokens: int) -> None:
    slo = SloSpec.model_validate({"ttft_ms.p99": 500, "tpot_ms.p90": 60, "e2el_ms.p50": 3000})
    goodput = {"ttft": 500, "tpot": 60, "e2el": 3000}
    r = rec(0, ttft, e2el, tokens)
    assert request_meets(r, slo.bounds()) == vllm_good(ttft, e2el, tokens, goodput)


def test_one_token_requests_have_tpot_zero_and_failures_are_never_good() -> None:
    one = rec(0, 0.3, 0.3, 1)
    assert request_latencies(one)["tpot_ms"] == 0.0
    assert request_meets(one, {"tpot_ms": 0.001})
    assert not request_meets(rec(1, 0.1, 0.2, 5, ok=False), {"ttft_ms": 1e9})


# ---------------------------------------------------------------- a level's verdict


def test_verdict_reads_each_term_at_its_statistic_and_reports_the_margin() -> None:
    slo = SloSpec.model_validate({"ttft_ms.p99": 2000, "tpot_ms.p90": 50})
    ok = level_verdict({"ttft_ms.p99": 1000.0, "tpot_ms.p90": 45.0, "completed": 100, "failed": 0}, slo)
    assert ok.met and ok.margin == pytest.approx(0.9) and ok.reason is None
    bad = level_verdict({"ttft_ms.p99": 2500.0, "tpot_ms.p90": 45.0, "completed": 100, "failed": 0}, slo)
    assert not bad.met and bad.margin == pytest.approx(1.25) and "ttft_ms.p99=2500 > 2000" in bad.reason
    none = level_verdict({"ttft_ms.p99": math.nan, "tpot_ms.p90": 45.0, "completed": 0, "failed": 0}, slo)
    assert not none.met and "no sample" in none.reason


def test_failures_count_against_the_percentile() -> None:
    slo = SloSpec.model_validate({"ttft_ms.p90": 2000})
    flat = {"ttft_ms.p90": 100.0, "completed": 95, "failed": 5}
    assert level_verdict(flat, slo).met              # 5 % failed: p90 still within
    flat = {"ttft_ms.p90": 100.0, "completed": 85, "failed": 15}
    v = level_verdict(flat, slo)
    assert not v.met and "15 of 100 requests failed" in v.reason
    mean = SloSpec.model_validate({"ttft_ms.mean": 2000})
    assert not level_verdict({"ttft_ms.mean": 1.0, "completed": 99, "failed": 1}, mean).met


def test_within_noise_when_the_interval_spans_the_bound() -> None:
    slo = SloSpec.model_validate({"ttft_ms.p90": 1000})
    near = level_verdict({"ttft_ms.p90": 950.0, "ttft_ms.p90.ci95": 80.0, "completed": 50, "failed": 0}, slo)
    far = level_verdict({"ttft_ms.p90": 500.0, "ttft_ms.p90.ci95": 80.0, "completed": 50, "failed": 0}, slo)
    assert near.met and near.within_noise
    assert far.met and not far.within_noise


# ---------------------------------------------------------------- goodput at a level


def test_goodput_counts_good_requests_in_the_window_and_over_the_run() -> None:
    slo = SloSpec.model_validate({"ttft_ms.p90": 500, "tpot_ms.p90": 100})
    records = []
    for i in range(40):
        slow = i % 4 == 0                       # every 4th request misses the TTFT bound
        records.append(rec(i, 0.8 if slow else 0.2, 2.0, 21, dispatch=i * 0.5))
    records.append(rec(40, 0.1, 0.2, 5, ok=False, dispatch=20.0))
    metrics = compute_level_metrics(records, concurrency=4)
    got = level_slo(records, metrics, slo)
    assert got.good == 30 and got.measured == 41
    assert got.slo_attained == pytest.approx(30 / 41)
    # vLLM's request_goodput: good requests over the whole run.
    assert got.run_goodput_req_s == pytest.approx(30 / metrics.run_duration_s)
    # In the steady window: the good share of the completions counted by request_per_s.
    start, end = metrics.window_start_s, metrics.window_end_s
    finished = [r for r in records if r.ok and start <= r.end_s < end]
    good = [r for r in finished if r.index % 4]
    assert got.goodput_req_s == pytest.approx(len(good) / (end - start))
    assert got.goodput_req_s < metrics.request_per_s
    assert 0 < got.goodput_tok_s < metrics.output_tok_s
    # The verdict reads the level's statistics: p90 TTFT is a slow request's, 800 ms.
    assert not got.met and got.margin == pytest.approx(0.8 / 0.5, rel=0.01)
    flat = metrics.model_copy(update={"slo": got}).flat()
    assert flat["slo_met"] == 0.0 and flat["goodput_req_s"] == got.goodput_req_s
    assert flat["slo_attained"] == pytest.approx(30 / 41)


def test_a_saved_slo_study_validates_again() -> None:
    # results/NAME/spec.yaml is the validated spec dumped with every field (defaults too):
    # reading it back must give the same study (tuner report / status / resume read it).
    import yaml

    from tuner.study.study_file import parse_study

    for name in ("glm5-8xpcie-slo.yaml", "smollm2-cpu-slo.yaml"):
        spec = parse_study((ROOT / "search_spaces" / name).read_text())
        again = parse_study(yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False))
        assert again == spec
    objectives = ("objectives:\n  - {metric: max_rate@slo, direction: maximize}\n"
                  "  - {metric: ttft_ms.p90, rate: 2.0, direction: minimize}\n")
    spec = parse_study(study("slo: {ttft_ms.p90: 900}", objectives, "  request_rates: [2.0]\n"))
    assert parse_study(yaml.safe_dump(spec.model_dump(mode="json"))) == spec
