"""Prometheus text exposition → snapshots, counter deltas and vLLM server-side metrics.

The load generator scrapes ``/metrics`` right before and right after each measured level
(warm-up outside), and the deltas give the server's own view of that level: tokens
generated (cross-checked against the client's usage sums), preemptions (a level meant
to be sub-saturated should have none, measurement.md §4.5) and the speculative-decoding
counters, from which acceptance is computed exactly as vLLM does (§6):

* acceptance_rate = accepted / draft_tokens
* mean_acceptance_length = 1 + accepted / drafts (the bonus token included)
* per-position rate i = accepted_per_pos[i] / drafts

A metric the server does not expose gives None, never 0: "no speculation configured" and
"``--disable-log-stats`` switched every ``vllm:*`` metric off" must not read as "nothing
accepted".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "SERVER_METRIC_KEYS",
    "MetricsSnapshot",
    "diff_snapshots",
    "parse_prometheus_text",
    "server_side_metrics",
]

LabelSet = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class MetricsSnapshot:
    """Samples by metric name, then by sorted label set. ``types`` from ``# TYPE`` lines."""

    samples: dict[str, dict[LabelSet, float]] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)

    def has(self, name: str) -> bool:
        return name in self.samples

    def total(self, name: str, **match: str) -> float | None:
        """Sum over every series of ``name`` whose labels include ``match``.

        None when the metric is absent (or no series matches), so absence is not zero.
        """
        series = self.samples.get(name)
        if series is None:
            return None
        values = [v for labels, v in series.items() if _matches(labels, match)]
        return math.fsum(values) if values else None

    def by_label(self, name: str, label: str, **match: str) -> dict[str, float] | None:
        """Sum of ``name`` grouped by the value of ``label`` (series without it skipped)."""
        series = self.samples.get(name)
        if series is None:
            return None
        out: dict[str, float] = {}
        for labels, v in series.items():
            if not _matches(labels, match):
                continue
            key = dict(labels).get(label)
            if key is not None:
                out[key] = out.get(key, 0.0) + v
        return out


def _matches(labels: LabelSet, match: dict[str, str]) -> bool:
    if not match:
        return True
    d = dict(labels)
    return all(d.get(k) == v for k, v in match.items())


def parse_prometheus_text(text: str) -> MetricsSnapshot:
    """Parse the Prometheus text format (0.0.4; OpenMetrics ``# EOF`` tolerated).

    Raises:
        ValueError: a sample line that cannot be parsed, with its line number.
    """
    samples: dict[str, dict[LabelSet, float]] = {}
    types: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 4 and parts[1] == "TYPE":
                types[parts[2]] = parts[3].strip()
            continue
        try:
            name, labels, value = _parse_sample(line)
        except ValueError as exc:
            raise ValueError(f"line {lineno}: {exc}: {raw!r}") from exc
        series = samples.setdefault(name, {})
        # The same series twice would be a broken exporter; keep the sum so nothing is lost.
        series[labels] = series.get(labels, 0.0) + value
    return MetricsSnapshot(samples, types)


def _parse_sample(line: str) -> tuple[str, LabelSet, float]:
    brace = line.find("{")
    space = line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        name = line[:brace]
        labels, end = _parse_labels(line, brace + 1)
        rest = line[end:].split()
    else:
        if space == -1:
            raise ValueError("sample has no value")
        name = line[:space]
        labels = ()
        rest = line[space:].split()
    if not name:
        raise ValueError("sample has no metric name")
    if not rest or len(rest) > 2:
        raise ValueError("expected a value and an optional timestamp after the name")
    return name, labels, float(rest[0])


def _parse_labels(line: str, i: int) -> tuple[LabelSet, int]:
    """Parse ``k="v",...}`` from ``line[i:]``; returns the labels and the index after ``}``."""
    labels: list[tuple[str, str]] = []
    n = len(line)
    while True:
        while i < n and line[i] in " ,":
            i += 1
        if i < n and line[i] == "}":
            return tuple(sorted(labels)), i + 1
        eq = line.find("=", i)
        if eq == -1:
            raise ValueError("label without '='")
        key = line[i:eq].strip()
        i = eq + 1
        if i >= n or line[i] != '"':
            raise ValueError(f"label {key!r} value is not quoted")
        i += 1
        chars: list[str] = []
        while True:
            if i >= n:
                raise ValueError(f"unterminated value of label {key!r}")
            c = line[i]
            if c == "\\" and i + 1 < n:
                nxt = line[i + 1]
                chars.append("\n" if nxt == "n" else nxt)
                i += 2
            elif c == '"':
                i += 1
                break
            else:
                chars.append(c)
                i += 1
        labels.append((key, "".join(chars)))


def diff_snapshots(
    before: MetricsSnapshot, after: MetricsSnapshot
) -> tuple[MetricsSnapshot, list[str]]:
    """Per-series ``after − before`` and the names of metrics that went backwards.

    A series missing from ``before`` counts from 0 (a counter created during the window).
    A decrease means a counter reset (server restart), and then, as Prometheus' ``rate()``
    does, the ``after`` value is taken as the increase. Gauges are diffed too; callers only
    read counters and histogram parts from the result.
    """
    out: dict[str, dict[LabelSet, float]] = {}
    resets: set[str] = set()
    for name, series in after.samples.items():
        old = before.samples.get(name, {})
        diffed: dict[LabelSet, float] = {}
        for labels, v in series.items():
            d = v - old.get(labels, 0.0)
            if d < 0 and after.types.get(_family(name, after.types), "") != "gauge":
                resets.add(name)
                d = v
            diffed[labels] = d
        out[name] = diffed
    return MetricsSnapshot(out, dict(after.types)), sorted(resets)


def _family(name: str, types: dict[str, str]) -> str:
    # Histogram and counter samples carry suffixes the # TYPE line does not.
    for suffix in ("_bucket", "_sum", "_count", "_total", "_created"):
        if name.endswith(suffix) and name[: -len(suffix)] in types:
            return name[: -len(suffix)]
    return name


_GEN = "vllm:generation_tokens_total"
_PROMPT = "vllm:prompt_tokens_total"
_PREEMPT = "vllm:num_preemptions_total"
_SUCCESS = "vllm:request_success_total"
_PC_QUERIES = "vllm:prefix_cache_queries_total"
_PC_HITS = "vllm:prefix_cache_hits_total"
_DRAFTS = "vllm:spec_decode_num_drafts_total"
_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
_ACCEPTED_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
_HISTOGRAMS = {
    "ttft_mean_ms": "vllm:time_to_first_token_seconds",
    "itl_mean_ms": "vllm:inter_token_latency_seconds",
    "tpot_mean_ms": "vllm:request_time_per_output_token_seconds",
    "e2el_mean_ms": "vllm:e2e_request_latency_seconds",
    "queue_time_mean_ms": "vllm:request_queue_time_seconds",
    "prefill_time_mean_ms": "vllm:request_prefill_time_seconds",
    "decode_time_mean_ms": "vllm:request_decode_time_seconds",
}

SERVER_METRIC_KEYS: tuple[str, ...] = (
    "generation_tokens",
    "prompt_tokens",
    "preemptions",
    "requests_succeeded",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "prefix_cache_hit_rate",
    "spec_drafts",
    "spec_draft_tokens",
    "spec_accepted_tokens",
    "spec_acceptance_rate",
    "spec_mean_acceptance_length",
    "spec_acceptance_rate_per_position",
    *_HISTOGRAMS,
    "counter_resets",
)
"""Keys of :func:`server_side_metrics`' result, always all present."""


def _position_key(p: str) -> tuple[bool, int, str]:
    return (not p.isdigit(), int(p) if p.isdigit() else 0, p)


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0:
        return None
    return num / den


def server_side_metrics(before: MetricsSnapshot, after: MetricsSnapshot) -> dict[str, Any]:
    """vLLM's own account of what happened between two scrapes.

    Returns a dict with exactly :data:`SERVER_METRIC_KEYS`. Counter deltas are floats (or
    None when the server does not expose the metric); ``spec_acceptance_rate_per_position``
    is a list ordered by position; histogram means are in milliseconds (None when no
    observation fell between the scrapes); ``counter_resets`` lists metrics that went
    backwards (the server restarted in between, so the deltas are suspect).
    """
    delta, resets = diff_snapshots(before, after)
    out: dict[str, Any] = {
        "generation_tokens": delta.total(_GEN),
        "prompt_tokens": delta.total(_PROMPT),
        "preemptions": delta.total(_PREEMPT),
        "requests_succeeded": delta.total(_SUCCESS),
        "prefix_cache_queries": delta.total(_PC_QUERIES),
        "prefix_cache_hits": delta.total(_PC_HITS),
    }
    out["prefix_cache_hit_rate"] = _ratio(out["prefix_cache_hits"], out["prefix_cache_queries"])

    drafts = delta.total(_DRAFTS)
    draft_tokens = delta.total(_DRAFT_TOKENS)
    accepted = delta.total(_ACCEPTED)
    out["spec_drafts"] = drafts
    out["spec_draft_tokens"] = draft_tokens
    out["spec_accepted_tokens"] = accepted
    out["spec_acceptance_rate"] = _ratio(accepted, draft_tokens)
    ratio = _ratio(accepted, drafts)
    out["spec_mean_acceptance_length"] = None if ratio is None else 1.0 + ratio
    per_pos = delta.by_label(_ACCEPTED_POS, "position")
    if per_pos and drafts is not None and drafts > 0:
        # Numeric order: "10" after "2".
        positions = sorted(per_pos, key=_position_key)
        out["spec_acceptance_rate_per_position"] = [per_pos[p] / drafts for p in positions]
    else:
        out["spec_acceptance_rate_per_position"] = None

    for key, base in _HISTOGRAMS.items():
        mean_s = _ratio(delta.total(f"{base}_sum"), delta.total(f"{base}_count"))
        out[key] = None if mean_s is None else mean_s * 1000
    out["counter_resets"] = resets
    return out
