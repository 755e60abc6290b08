"""Where a vLLM server's startup time goes, read from its log: the per-trial breakdown that
``tuner status`` and the report show, plus the KV-cache size and graph-capture figures the
log states.

**Phases** (:data:`PHASES`, in the order a server goes through them). Each one ends at a log
line vLLM prints (0.26 on an H200, 0.32 on the CPU build, the simulator); its length is the
difference between the timestamps of consecutive end lines:

============== ============================================ ===============================
phase          ends at                                      what it is
============== ============================================ ===============================
imports        the first logger line (launcher clock)       Python imports of the API
                                                            server process, argument parsing
api_config     the API server's last line before the        engine arguments, model config
               engine process logs
engine_spawn   ``Initializing a V1 LLM engine``             the EngineCore process starts
                                                            and imports torch/vLLM again
weights        ``Model loading took`` (else ``Loading       device and distributed init,
               weights took``)                              weight loading
compile        ``torch.compile took .. s in total`` (CPU:   Dynamo + Inductor, or loading
               ``Warming up done.``)                        them from the compile cache
kv_cache       ``GPU KV cache size: N tokens``              profiling run, KV-cache sizing
                                                            and allocation
graph_capture  ``Graph capturing finished in``              CUDA graph capture
warmup         ``init engine (...) took``                   kernel warm-up after capture
api_start      ``Starting vLLM server on``                  the API server takes the engine
serve          first ``/health`` 200 (launcher clock)       uvicorn start, readiness poll
============== ============================================ ===============================

A phase whose end line never appears (eager: no compile, no capture; CPU: no capture) is
left out and its time falls into the next phase that has one. vLLM's timestamps have a
resolution of one second, so a phase is exact to about a second; the first and last phases
come from the launcher's own clock (``first_line_s`` and ``ready_s``, 0.1 s polling) and
the phases add up to the measured startup. Where vLLM states a duration itself (weights,
torch.compile, graph capture, init engine) that figure is kept as well, at its precision.

A start that fails or is cut short has the phases up to the last end line seen
(``reached``) and ``tail_s``, the seconds from there to the last log line.

Pure: text in, record out (no clock, no file); :class:`StartupScan` takes the text a line
at a time as the log grows.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from tuner.vllm.compile_cache import CompileRecord

__all__ = ["PHASES", "PHASE_LABELS", "StartupRecord", "StartupScan", "summary_text", "figures_text",
           "median_phases", "has_log_stamp", "study_startup_lines"]

PHASES: tuple[str, ...] = ("imports", "api_config", "engine_spawn", "weights", "compile", "kv_cache",
                           "graph_capture", "warmup", "api_start", "serve")
PHASE_LABELS: dict[str, str] = {
    "imports": "imports", "api_config": "config", "engine_spawn": "engine process",
    "weights": "weights", "compile": "compile", "kv_cache": "KV cache", "graph_capture": "graphs",
    "warmup": "warm-up", "api_start": "API", "serve": "ready",
}

# The logger header vLLM puts before every record: level, then "MM-DD HH:MM:SS" (optionally
# with fractions), then "[file.py:line]". Tagged lines carry "(Proc pid=N) " before it.
_STAMP_RE = re.compile(r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(\.\d+)? \[[^\]]*\] ?")

# End lines of the phases measured from log timestamps; alternatives in order of preference
# (the first one present in the log is used).
_ENDS: dict[str, tuple[re.Pattern[str], ...]] = {
    "engine_spawn": (re.compile(r"Initializing a V1 LLM engine"),),
    "weights": (re.compile(r"Model loading took"), re.compile(r"Loading weights took")),
    "compile": (re.compile(r"torch\.compile (?:took|takes) [\d.]+ s in total"),
                re.compile(r"Warming up done\.")),
    "kv_cache": (re.compile(r"\b[A-Z]+ KV cache size: [\d,]+ tokens"),),
    "graph_capture": (re.compile(r"Graph capturing finished in"),),
    "warmup": (re.compile(r"init engine \(profile, create kv cache, warmup model\) took"),),
    "api_start": (re.compile(r"Starting vLLM server on"),),
}
_LOGGED = ("engine_spawn", "weights", "compile", "kv_cache", "graph_capture", "warmup", "api_start")

_MODEL_LOADING_RE = re.compile(r"Model loading took ([\d.]+) GiB(?: memory)? and ([\d.]+) seconds")
_LOADING_WEIGHTS_RE = re.compile(r"Loading weights took ([\d.]+) seconds")
_KV_TOKENS_RE = re.compile(r"\b[A-Z]+ KV cache size: ([\d,]+) tokens")
_KV_GIB_RE = re.compile(r"Available KV cache memory: ([\d.]+) GiB|Explicitly set \(([\d.]+)/[\d.]+\) GiB for KV cache")
_CONCURRENCY_RE = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")
_CAPTURE_RE = re.compile(r"Graph capturing finished in ([\d.]+) secs?(?:, took ([\d.]+) GiB)?")


@dataclass
class StartupRecord:
    """One server start, broken down (see the module docstring). Seconds throughout."""

    phases: dict[str, float] = field(default_factory=dict)   # PHASES order; absent: no end line
    reached: str | None = None       # the last phase whose end was seen
    complete: bool = False           # the API server said it serves (api_start reached)
    tail_s: float | None = None      # after ``reached``, to the last log line (failed/cut starts)
    total_s: float | None = None     # spawn -> first /health 200 (the launcher's figure)
    first_line_s: float | None = None
    weights_s: float | None = None   # vLLM's own figures from here on
    weights_gib: float | None = None
    compile_cache: str | None = None  # CompileRecord.cache: hit, miss, partial, none, None
    compile_s: float | None = None
    kv_cache_tokens: int | None = None
    kv_cache_gib: float | None = None
    max_concurrency: float | None = None
    max_concurrency_tokens: int | None = None
    graph_capture_s: float | None = None
    graph_capture_gib: float | None = None
    init_engine_s: float | None = None
    overlapped_s: float | None = None  # imports a spare did before the trial (prestart), in "imports"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        if data["overlapped_s"] is None:   # no spare: the record as it was before spares existed
            del data["overlapped_s"]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> StartupRecord | None:
        if not isinstance(data, Mapping):
            return None
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


def has_log_stamp(text: str) -> bool:
    """Whether ``text`` holds a vLLM logger line (the launcher stamps the arrival of the
    first one: the end of the ``imports`` phase)."""

    return _STAMP_RE.search(text) is not None


def _stamp(line: str) -> float | None:
    """Seconds of the line's logger timestamp on an arbitrary fixed year (only differences
    are used); None for lines without one (tracebacks, tqdm bars, uvicorn)."""

    m = _STAMP_RE.search(line)
    if m is None:
        return None
    month, day, hour, minute, second = (int(g) for g in m.groups()[:5])
    if not (1 <= month <= 12 and 1 <= day <= _MONTH_DAYS[month - 1]):
        return None
    # Only differences are used: a fixed leap year (02-29 parses), no time zone.
    days = sum(_MONTH_DAYS[: month - 1]) + day - 1
    return days * 86400.0 + hour * 3600 + minute * 60 + second + (float(m.group(6)) if m.group(6) else 0.0)


_MONTH_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


# The figures vLLM states, each taken from its first line in the log.
_FIGURES: tuple[re.Pattern[str], ...] = (_MODEL_LOADING_RE, _LOADING_WEIGHTS_RE, _KV_TOKENS_RE, _KV_GIB_RE,
                                         _CONCURRENCY_RE, _CAPTURE_RE)


@dataclass
class _Hit:
    """Where an end pattern first matched: its stamped line's index and time, and the time
    of the stamped line before it (the API server's last line, for ``api_config``)."""

    index: int
    when: float
    before: float | None


class StartupScan:
    """The breakdown of a log read a line at a time: ``feed`` each line as the log grows,
    ``record()`` whenever the breakdown of the lines so far is wanted. Memory stays small
    on any log: per line only the first and last timestamps, the first line of each end
    pattern and of each figure are kept."""

    def __init__(self) -> None:
        self._count = 0                       # stamped lines so far
        self._first: float | None = None      # the first stamped line's time
        self._last: float | None = None       # the latest stamped line's time
        self._hits: dict[tuple[str, int], _Hit] = {}
        self._figures: dict[re.Pattern[str], re.Match[str]] = {}

    def feed(self, line: str) -> None:
        # splitlines, as over a whole text: a progress bar's \r parts are lines of their own.
        for raw in line.splitlines():
            self._line(raw)

    def _line(self, raw: str) -> None:
        for pattern in _FIGURES:
            if pattern not in self._figures and (m := pattern.search(raw)) is not None:
                self._figures[pattern] = m
        when = _stamp(raw)
        if when is None:
            return
        before = self._last
        if self._first is None:
            self._first = when
        for phase in _LOGGED:
            for i, pattern in enumerate(_ENDS[phase]):
                if (phase, i) not in self._hits and pattern.search(raw):
                    self._hits[phase, i] = _Hit(self._count, when, before)
        self._count += 1
        self._last = when

    def _ends(self) -> list[tuple[str, float]]:
        """(phase, time) of each phase end present, in phase order."""

        ends: list[tuple[str, float]] = []
        for phase in _LOGGED:
            chosen = next((hit for i in range(len(_ENDS[phase])) if (hit := self._hits.get((phase, i)))), None)
            if chosen is None:
                continue
            if phase == "engine_spawn" and chosen.index > 0 and chosen.before is not None:
                # The API server's part ends at its last line before the engine process logs.
                ends.append(("api_config", chosen.before))
            ends.append((phase, chosen.when))
        return ends

    def _fill_figures(self, rec: StartupRecord) -> None:
        found = self._figures
        if m := found.get(_MODEL_LOADING_RE):
            rec.weights_gib, rec.weights_s = float(m.group(1)), float(m.group(2))
        elif m := found.get(_LOADING_WEIGHTS_RE):
            rec.weights_s = float(m.group(1))
        if m := found.get(_KV_TOKENS_RE):
            rec.kv_cache_tokens = int(m.group(1).replace(",", ""))
        if m := found.get(_KV_GIB_RE):
            rec.kv_cache_gib = float(m.group(1) or m.group(2))
        if m := found.get(_CONCURRENCY_RE):
            rec.max_concurrency_tokens = int(m.group(1).replace(",", ""))
            rec.max_concurrency = float(m.group(2))
        if m := found.get(_CAPTURE_RE):
            rec.graph_capture_s = float(m.group(1))
            rec.graph_capture_gib = float(m.group(2)) if m.group(2) else None

    def record(self, *, compiled: CompileRecord, first_line_s: float | None = None,
               ready_s: float | None = None, overlapped_s: float | None = None) -> StartupRecord:
        """The startup record so far. ``first_line_s``: seconds from spawning the server to the
        arrival of its first logger line (the launcher's clock); ``ready_s``: seconds from
        spawning to the first ``/health`` 200, None when it never came; ``compiled``: the same
        log's compile record, whose cache status and seconds the record carries;
        ``overlapped_s``: the imports a spare interpreter did before it was released (counted
        in ``first_line_s`` and ``ready_s`` already)."""

        rec = StartupRecord(total_s=ready_s, first_line_s=first_line_s, overlapped_s=overlapped_s)
        self._fill_figures(rec)
        rec.compile_cache, rec.compile_s, rec.init_engine_s = compiled.cache, compiled.compile_s, compiled.init_engine_s
        if first_line_s is not None:
            rec.phases["imports"] = round(max(0.0, first_line_s), 3)
            rec.reached = "imports"
        if self._first is None or self._last is None:
            return rec
        start = previous = self._first
        for phase, when in self._ends():
            rec.phases[phase] = round(max(0.0, when - previous), 3)
            rec.reached, previous = phase, max(previous, when)
        rec.complete = rec.reached == "api_start"
        logged = previous - start
        if rec.complete and ready_s is not None and first_line_s is not None:
            serve = ready_s - first_line_s - logged
            if serve < 0:
                # vLLM stamps whole seconds: what they overstate comes off the longest logged
                # phase, so the phases still add up to the measured start.
                longest = max(_LOGGED, key=lambda p: rec.phases.get(p, -1.0))
                rec.phases[longest] = round(max(0.0, rec.phases[longest] + serve), 3)
            rec.phases["serve"] = round(max(0.0, serve), 3)
            rec.reached = "serve"
        else:
            rec.tail_s = round(max(0.0, self._last - previous), 3)
        return rec


def _secs(value: float) -> str:
    # Phases read from log timestamps are whole seconds: no decimals pretending otherwise.
    if value == int(value) or value >= 100:
        return f"{value:.0f}"
    return f"{value:.1f}"


def _typed(rec: StartupRecord | Mapping[str, Any]) -> StartupRecord:
    """A record as parsed, or as JSON (a trial's startup.json, a re-run's, a status row)."""

    if isinstance(rec, StartupRecord):
        return rec
    return StartupRecord.from_json(rec) or StartupRecord()


def summary_text(record: StartupRecord | Mapping[str, Any]) -> str:
    """One line: ``startup 87s = imports 20 + config 0.0 + engine process 15 + ... (compile
    cache miss)``; a failed start says how far it got."""

    rec = _typed(record)
    phases = rec.phases or {}
    parts = [f"{PHASE_LABELS.get(p, p)} {_secs(phases[p])}" for p in PHASES if phases.get(p) is not None]
    total = rec.total_s
    if total is None:
        head = "startup (never ready): "
    elif rec.complete:
        head = f"startup {_secs(total)}s = "
    else:
        head = f"start stopped after {_secs(total)}s (never ready): "
    text = head + " + ".join(parts) if parts else head + "no timestamped log lines"
    cache = rec.compile_cache
    if cache not in (None, "none"):
        text += f" (torch.compile cache {cache})"
    if rec.overlapped_s:
        text += f"; {_secs(rec.overlapped_s)} s of the imports done ahead by a spare interpreter"
    if not rec.complete and rec.reached and rec.tail_s is not None:
        text += f"; log ends {_secs(rec.tail_s)}s after {PHASE_LABELS.get(rec.reached, rec.reached)}"
    return text


def figures_text(record: StartupRecord | Mapping[str, Any]) -> str | None:
    """``KV cache 3,226,544 tokens (69.23 GiB, 787.73x at 4,096 tokens), graph capture 3 s
    (0.39 GiB)``, or None when the log states neither."""

    rec = _typed(record)
    parts = []
    if rec.kv_cache_tokens is not None:
        extra = []
        if rec.kv_cache_gib is not None:
            extra.append(f"{rec.kv_cache_gib:.2f} GiB")
        if rec.max_concurrency is not None and rec.max_concurrency_tokens:
            extra.append(f"{rec.max_concurrency:.2f}x at {rec.max_concurrency_tokens:,} tokens")
        parts.append(f"KV cache {rec.kv_cache_tokens:,} tokens" + (f" ({', '.join(extra)})" if extra else ""))
    if rec.graph_capture_s is not None:
        gib = rec.graph_capture_gib
        parts.append(f"graph capture {rec.graph_capture_s:g} s" + (f" ({gib:.2f} GiB)" if gib is not None else ""))
    return ", ".join(parts) or None


def median_phases(records: Sequence[StartupRecord | Mapping[str, Any]]) -> dict[str, float]:
    """Median seconds per phase over completed starts (a phase a start did not have counts
    as 0 there, so the medians of compiled and eager trials are comparable), plus
    ``total``: the median startup."""

    done = [r for r in map(_typed, records) if r.complete and r.total_s is not None]
    if not done:
        return {}

    def median(values: list[float]) -> float:
        ordered = sorted(values)
        mid = len(ordered) // 2
        return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2

    out = {p: round(median([float((r.phases or {}).get(p) or 0.0) for r in done]), 3)
           for p in PHASES if any((r.phases or {}).get(p) is not None for r in done)}
    out["total"] = round(median([float(r.total_s) for r in done if r.total_s is not None]), 3)
    return out


def study_startup_lines(summary: dict[str, Any]) -> list[str]:
    """``startup: median 87s over 6 servers (62% of trial time), compile cache 2 hit / 4 miss``
    and the median phases."""
    med = summary["median"]
    share = f", {summary['share']:.0%} of trial time" if summary.get("share") is not None else ""
    caches = summary.get("compile_cache") or {}
    cache = (", torch.compile cache " + " / ".join(f"{n} {k}" for k, n in sorted(caches.items()))
             if caches else "")
    phases = " + ".join(f"{PHASE_LABELS[p]} {med[p]:.1f}" for p in PHASES if p in med)
    spare = (f"; {summary['prestarted']} from a spare interpreter ({summary['ahead_s']:.0f} s of imports "
             "done ahead, not in trial time)" if summary.get("prestarted") else "")
    return [f"  startup: median {med['total']:.1f}s over {summary['trials']} server(s){share}{cache}{spare}",
            f"    median phases (s): {phases}"]
