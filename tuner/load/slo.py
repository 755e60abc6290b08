"""A latency SLO: the study file's ``slo:`` section, the per-request rule and a level's verdict.

The study file names each term as ``<metric>.<statistic>: <bound in ms>``, e.g.
``{ttft_ms.p99: 2000, tpot_ms.p99: 50, e2el_ms.p90: 8000}``. Two judgements use it:

* **Per request** (goodput, :mod:`tuner.load.goodput`), as ``vllm bench serve --goodput``
  judges it (``vllm/benchmarks/serve.py::calculate_metrics``): a completed request is good
  when its own TTFT, TPOT and E2EL are each at most the bound of every term on that
  metric; its TPOT is (E2EL − TTFT)/(output tokens − 1), and 0 for a request with at most
  one output token (vLLM's rule: it cannot miss a TPOT bound). A failed request is never
  good. The statistic does not enter this judgement: a bound is a bound per request.
* **Per level** (``level_verdict``): the SLO *holds* when every term's statistic over the
  level's completed requests (the level's own ``ttft_ms.p99`` …) is at most its bound, and
  failed requests, counted as requests that missed every bound, leave the percentile
  intact: at most (100 − q) % of the level's requests may fail for a ``pq`` term, none for
  a ``mean`` term.

Metrics: ``ttft_ms``, ``tpot_ms``, ``e2el_ms`` — the per-request latencies. ``itl_ms`` is
refused: it is pooled over chunks, so no request has one value to judge (vLLM's
``--goodput`` refuses it too), and with speculative decoding a chunk carries several tokens.

Pure: no I/O, no clocks.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

from tuner.load.records import RequestRecord
from tuner.load.stats import percentile
from tuner.load.uncertainty import mean_ci, quantile_ci, t95

__all__ = ["GOODPUT_KEYS", "SLO_METRICS", "SLO_STATS", "LevelSlo", "SloSpec", "SloTerm", "SloVerdict", "TermVerdict",
           "BLOCKS", "block_ci", "level_verdict", "records_verdict",
           "request_latencies", "request_meets", "term_ci", "term_samples"]

SLO_METRICS: tuple[str, ...] = ("ttft_ms", "tpot_ms", "e2el_ms")
SLO_STATS: tuple[str, ...] = ("mean", "p50", "p90", "p99")
_QUANTILE = {"p50": 50.0, "p90": 90.0, "p99": 99.0}

GOODPUT_KEYS: tuple[str, ...] = (
    "goodput_req_s", "goodput_tok_s", "slo_attained", "run_goodput_req_s", "slo_met",
    "slo_margin",
)
"""Flat metrics a level carries when the study has an SLO (objectives and limits name them)."""


class SloTerm(BaseModel):
    """One term: ``metric.stat`` at most ``bound_ms``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    metric: str
    stat: str
    bound_ms: float = Field(gt=0)

    @property
    def key(self) -> str:
        """The level metric the term reads (``ttft_ms.p99``)."""
        return f"{self.metric}.{self.stat}"


def _term(key: object, value: object) -> SloTerm:
    """One ``metric.stat: bound`` entry, or ValueError naming it and what is allowed."""
    where = str(key)     # the study file prints the section (slo) before it
    if not isinstance(key, str) or "." not in key:
        raise ValueError(
            f"{where}: {key!r} is not '<metric>.<statistic>'; allowed metrics: "
            f"{', '.join(SLO_METRICS)}; statistics: {', '.join(SLO_STATS)} "
            "(e.g. ttft_ms.p99: 2000)")
    metric, stat = key.split(".", 1)
    if metric not in SLO_METRICS:
        why = (" (ITL is pooled over chunks: no request has one ITL to judge; use tpot_ms)"
               if metric == "itl_ms" else "")
        raise ValueError(
            f"{where}: unknown metric {metric!r}{why}; allowed: {', '.join(SLO_METRICS)}")
    if stat not in SLO_STATS:
        raise ValueError(
            f"{where}: unknown statistic {stat!r} (the tuner computes these only); allowed: "
            f"{', '.join(SLO_STATS)}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where}: bound {value!r} is not a number; allowed: milliseconds > 0")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{where}: bound {value!r} is not allowed; allowed: finite milliseconds > 0")
    return SloTerm(metric=metric, stat=stat, bound_ms=float(value))


class SloSpec(BaseModel):
    """The study's SLO. Written (and dumped) as a mapping ``{ttft_ms.p99: 2000, ...}``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    terms: tuple[SloTerm, ...] = Field(min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _from_mapping(cls, data: object) -> object:
        if isinstance(data, Mapping) and set(data) != {"terms"}:
            if not data:
                raise ValueError(
                    "empty; give at least one term such as ttft_ms.p99: 2000 "
                    f"(metrics {', '.join(SLO_METRICS)}; statistics {', '.join(SLO_STATS)})")
            return {"terms": [_term(k, v) for k, v in data.items()]}
        if not isinstance(data, Mapping):
            raise ValueError(
                f"{data!r} is not a mapping; allowed: '<metric>.<statistic>: <ms>' "
                "entries, e.g. {ttft_ms.p99: 2000, tpot_ms.p99: 50}")
        return data

    @model_serializer
    def _as_mapping(self) -> dict[str, float]:
        return {t.key: t.bound_ms for t in self.terms}

    def bounds(self) -> dict[str, float]:
        """Per metric, the bound a request must meet: the tightest of its terms."""
        out: dict[str, float] = {}
        for t in self.terms:
            out[t.metric] = min(out.get(t.metric, math.inf), t.bound_ms)
        return out

    def text(self) -> str:
        """``ttft_ms.p99<=2000 tpot_ms.p99<=50`` (status lines, reports)."""
        return " ".join(f"{t.key}<={t.bound_ms:g}" for t in self.terms)


def request_latencies(record: RequestRecord) -> dict[str, float] | None:
    """A completed request's TTFT, TPOT and E2EL in ms (vLLM's definitions; TPOT is 0 with
    at most one output token); None for a request that failed or carried no content."""
    if not record.ok or not record.chunk_times_s:
        return None
    ttft = record.chunk_times_s[0] - record.dispatch_s
    e2el = record.chunk_times_s[-1] - record.dispatch_s
    n = record.n_output_tokens()
    tpot = (e2el - ttft) / (n - 1) if n > 1 else 0.0
    return {"ttft_ms": ttft * 1000, "tpot_ms": tpot * 1000, "e2el_ms": e2el * 1000}


def request_meets(record: RequestRecord, bounds: Mapping[str, float]) -> bool:
    """Whether one request is within every bound (``SloSpec.bounds()``)."""
    lat = request_latencies(record)
    return lat is not None and all(lat[m] <= b for m, b in bounds.items())


@dataclass(frozen=True, slots=True)
class TermVerdict:
    """One term at one level."""

    key: str
    bound_ms: float
    value_ms: float | None          # the level's statistic (None: no sample)
    ci95_ms: float | None           # its 95 % half-width, when the level measured one
    met: bool
    within_noise: bool              # the bound lies inside the value's 95 % interval

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "bound_ms": self.bound_ms, "value_ms": self.value_ms,
                "ci95_ms": self.ci95_ms, "met": self.met, "within_noise": self.within_noise}


@dataclass(frozen=True, slots=True)
class SloVerdict:
    """Whether the SLO holds at one level, and by how much."""

    met: bool
    margin: float | None            # max over terms of value / bound (> 1: missed); None: no value
    terms: tuple[TermVerdict, ...]
    failed: int
    issued: int
    reason: str | None              # why it was missed, in words

    @property
    def within_noise(self) -> bool:
        """A term's verdict could flip on a re-measurement (its interval spans its bound)."""
        return any(t.within_noise for t in self.terms)

    def as_dict(self) -> dict[str, Any]:
        return {"met": self.met, "margin": self.margin, "failed": self.failed,
                "issued": self.issued, "reason": self.reason, "within_noise": self.within_noise,
                "terms": [t.as_dict() for t in self.terms]}


def _finite(x: Any) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def level_verdict(flat: Mapping[str, Any], slo: SloSpec) -> SloVerdict:
    """The SLO's verdict on a level from its flat metrics (``LevelMetrics.flat()``: the
    statistics, ``completed``, ``failed`` and, where measured, ``<key>.ci95``)."""
    failed = int(_finite(flat.get("failed")) or 0)
    completed = int(_finite(flat.get("completed")) or 0)
    issued = failed + completed
    terms: list[TermVerdict] = []
    reasons: list[str] = []
    ratios: list[float] = []
    for t in slo.terms:
        value = _finite(flat.get(t.key))
        ci = _finite(flat.get(f"{t.key}.ci95"))
        met = value is not None and value <= t.bound_ms
        if value is None:
            reasons.append(f"{t.key}: no sample")
        else:
            ratios.append(value / t.bound_ms)
            if not met:
                reasons.append(f"{t.key}={value:.4g} > {t.bound_ms:g}")
        allowed = 0.0 if t.stat == "mean" else 1.0 - _QUANTILE[t.stat] / 100.0
        if issued and failed / issued > allowed + 1e-12:
            # Failed requests missed every bound: past the percentile's share, the
            # statistic over all requests would be a failure's (unbounded).
            met = False
            reasons.append(f"{t.key}: {failed} of {issued} requests failed")
        near = value is not None and ci is not None and ci > 0 and abs(value - t.bound_ms) <= ci
        terms.append(TermVerdict(t.key, t.bound_ms, value, ci, met, near))
    met = all(t.met for t in terms)
    return SloVerdict(met=met, margin=max(ratios) if ratios else None, terms=tuple(terms),
                      failed=failed, issued=issued, reason=None if met else "; ".join(reasons))


def term_samples(records: Iterable[RequestRecord]) -> dict[str, list[float]]:
    """Per SLO metric, the completed requests' values in ms as the level statistics take
    them (tuner.load.metrics): TPOT only of requests with more than one output token."""
    out: dict[str, list[float]] = {m: [] for m in SLO_METRICS}
    for r in records:
        lat = request_latencies(r)
        if lat is None:
            continue
        out["ttft_ms"].append(lat["ttft_ms"])
        out["e2el_ms"].append(lat["e2el_ms"])
        if r.n_output_tokens() > 1:
            out["tpot_ms"].append(lat["tpot_ms"])
    return out


BLOCKS = 5
"""Consecutive blocks a run's requests are cut into for the batch-means interval."""


def _stat(sorted_values: Sequence[float], stat: str) -> float:
    if stat == "mean":
        return math.fsum(sorted_values) / len(sorted_values)
    return percentile(sorted_values, _QUANTILE[stat])


def block_ci(runs: Sequence[Sequence[float]], stat: str, blocks: int = BLOCKS) -> float | None:
    """Batch-means 95 % half-width of a statistic: each run's values (in dispatch order) cut
    into ``blocks`` consecutive blocks, the statistic per block, Student's t over all blocks.

    Why not only the order-statistic interval: requests of an open-loop level are not
    independent — a burst of arrivals slows every request it shares the engine with, so
    latencies come in correlated runs, and an interval that treats them as independent is
    far too narrow (on the simulator a p90 TPOT moved 65 -> 107 ms between neighbouring
    rates whose order-statistic intervals were +-3 ms; the blocks' spread was +-15-25 ms).
    The load generator's rate intervals rest on sub-windows for the same reason. None
    below 4 values per block."""
    values: list[float] = []
    for run in runs:
        n = len(run)
        if n < 4 * blocks:
            continue
        values += [_stat(sorted(run[i * n // blocks:(i + 1) * n // blocks]), stat)
                   for i in range(blocks)]
    if len(values) < 2:
        return None
    mean = math.fsum(values) / len(values)
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))
    return t95(len(values) - 1) * sd / math.sqrt(len(values))


def term_ci(runs: Sequence[Sequence[float]], stat: str) -> tuple[float, float | None] | None:
    """(statistic over the pooled runs, its 95 % half-width): the wider of the
    order-statistic (percentiles) or Student's t (means) interval and the batch-means one
    (``block_ci``). None without a value."""
    pooled = sorted(v for run in runs for v in run)
    if not pooled:
        return None
    value = _stat(pooled, stat)
    if stat == "mean":
        ci = mean_ci(pooled)
    else:
        band = quantile_ci(pooled, _QUANTILE[stat] / 100)
        ci = None if band is None else max(value - band[0], band[1] - value)
    blocked = block_ci(runs, stat)
    if blocked is not None and (ci is None or blocked > ci):
        ci = blocked
    return value, ci


def records_verdict(records: Iterable[RequestRecord], slo: SloSpec) -> SloVerdict:
    """The SLO's verdict on requests pooled from one or more runs of a level (its repeats, or
    the parts of a rate level extended while its verdict was within noise): each term's
    statistic over all of them, with its 95 % interval (``term_ci``)."""
    records = list(records)
    failed = sum(1 for r in records if not r.ok)
    flat: dict[str, float] = {"failed": float(failed), "completed": float(len(records) - failed)}
    runs: dict[int, list[RequestRecord]] = {}
    for r in sorted(records, key=lambda r: (r.repeat, r.dispatch_s)):
        runs.setdefault(r.repeat, []).append(r)
    per_run = [term_samples(rs) for rs in runs.values()]
    for t in slo.terms:
        found = term_ci([samples[t.metric] for samples in per_run], t.stat)
        if found is None:
            continue
        flat[t.key], ci = found
        if ci is not None:
            flat[f"{t.key}.ci95"] = ci
    return level_verdict(flat, slo)


class LevelSlo(BaseModel):
    """A level's goodput and SLO verdict (``LevelMetrics.slo``; computed by :func:`tuner.load.goodput.level_slo`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    slo: dict[str, float] = Field(description="The SLO judged against ({ttft_ms.p99: 2000, ...}).")
    good: int = Field(description="Measured requests within every bound (all repeats).")
    measured: int = Field(description="Measured requests, failed ones included (all repeats).")
    slo_attained: float | None
    goodput_req_s: float
    goodput_tok_s: float
    run_goodput_req_s: float | None
    met: bool
    margin: float | None
    within_noise: bool = Field(description="A term's 95 % interval spans its bound.")
    reason: str | None
    terms: list[dict[str, object]]

    def flat(self) -> dict[str, float]:
        nan = math.nan
        return {
            "goodput_req_s": self.goodput_req_s,
            "goodput_tok_s": self.goodput_tok_s,
            "slo_attained": nan if self.slo_attained is None else self.slo_attained,
            "run_goodput_req_s": nan if self.run_goodput_req_s is None else self.run_goodput_req_s,
            "slo_met": 1.0 if self.met else 0.0,
            "slo_margin": nan if self.margin is None else self.margin,
        }
