"""Goodput of a level: the throughput of the requests that met every SLO term.

Per request the rule is vLLM's (``tuner.load.slo.request_meets``: TTFT, TPOT and E2EL each
within its bound; TPOT 0 with at most one output token; a failed request is never good).
From it, per level (closed or open loop):

* ``slo_attained``: good / measured requests (failed ones count, as requests not served
  within the SLO);
* ``goodput_req_s``: good requests finishing inside the level's steady-state window, per
  second of window — ``request_per_s`` counted over good requests only (whole run when the
  window fell back);
* ``goodput_tok_s``: output tokens of good requests arriving inside the window, per second
  — ``output_tok_s`` over good requests only;
* ``run_goodput_req_s``: good / the whole run (the level's start → last request done),
  which is ``vllm bench serve``'s ``request_goodput`` (its ``dur_s`` includes an open-loop
  run's first gap, the ramp-up and the drain): the figure to compare with vLLM's, as
  ``run_output_tok_s`` is for throughput;
* ``slo_met`` (1/0) and ``slo_margin`` (max over terms of value/bound): the level's
  verdict (``tuner.load.slo.records_verdict``), with each term's 95 % interval.

With ``repeats`` (or a rate level extended while its verdict was within noise) the window
figures are those of the representative repeat (the one whose detailed metrics the level
shows); ``slo_attained`` and the verdict pool every repeat's requests (a p90 over all of
them, not the median of the repeats' p90s, which the level's own ``ttft_ms.p90`` is).

Pure: no I/O, no clocks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from tuner.load.metrics import LevelMetrics
from tuner.load.records import RequestRecord, token_timeline
from tuner.load.slo import LevelSlo, SloSpec, records_verdict, request_meets

__all__ = ["level_slo"]

def _representative(records: Sequence[RequestRecord], metrics: LevelMetrics) -> list[RequestRecord]:
    rep = metrics.repeats.representative if metrics.repeats is not None else 0
    return [r for r in records if r.repeat == rep]


def level_slo(records: Sequence[RequestRecord], metrics: LevelMetrics, slo: SloSpec) -> LevelSlo:
    """Goodput and verdict of one level from its records and metrics.

    Args:
        records: the level's measured records (every repeat; failed ones included).
        metrics: the level's metrics (window, repeats).
        slo: the study's SLO.
    """
    bounds = slo.bounds()
    # Counts over the measured requests (a level sized by time also has warm-up and drain
    # requests: latencies are taken over its measure requests, tuner.load.metrics); the
    # window figures over every request finishing inside the window, as request_per_s.
    measured = [r for r in records if r.phase == "measure"]
    good_all = sum(1 for r in measured if request_meets(r, bounds))
    run = _representative(records, metrics)
    good = [r for r in run if request_meets(r, bounds)]
    good_measured = sum(1 for r in run if r.phase == "measure" and request_meets(r, bounds))
    start, end = metrics.window_start_s, metrics.window_end_s
    if (not metrics.window_fallback and start is not None and end is not None and end > start):
        seconds = end - start
        finished = sum(1 for r in good if (e := r.end_s) is not None and start <= e < end)
        tokens = math.fsum(k for r in good for t, k in token_timeline(r) if start <= t < end)
    else:
        seconds = metrics.run_duration_s or 0.0
        finished = good_measured
        tokens = float(sum(r.n_output_tokens() for r in good if r.phase == "measure"))
    # vLLM's dur_s runs from the benchmark's start (before an open-loop run's first gap) to
    # the last completion: records are timed from the level's start, so that is the last
    # done_s. A level sized by time has no such run (warm-up first): its measured run.
    run_s = (max((r.done_s for r in run), default=0.0) if metrics.sizing == "requests"
             else metrics.run_duration_s)
    verdict = records_verdict(measured, slo)
    return LevelSlo(
        slo=slo.model_dump(),
        good=good_all,
        measured=len(measured),
        slo_attained=good_all / len(measured) if measured else None,
        goodput_req_s=finished / seconds if seconds > 0 else 0.0,
        goodput_tok_s=tokens / seconds if seconds > 0 else 0.0,
        run_goodput_req_s=good_measured / run_s if run_s else None,
        met=verdict.met,
        margin=verdict.margin,
        within_noise=verdict.within_noise,
        reason=verdict.reason,
        terms=[t.as_dict() for t in verdict.terms],
    )
