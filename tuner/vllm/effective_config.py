"""Read back, from a vLLM server log, the configuration the server actually applied.

A trial asks for flags; vLLM may silently change them (a cudagraph mode downgraded per
attention backend, custom all-reduce switched off on PCIe, everything forced to NONE on
the CPU build, a leftover speculation setting). The log is the only authority on what
ran, so this module turns log text into an :class:`EffectiveConfig`, keeping for every
field the log line that established it (``evidence``).

Pure: text in, data out. Line formats are those of vLLM 0.26-0.33 (see
``reference/vllm-knobs.md`` sections 1-4 and 7, and the real H200 logs under
``tests/fixtures/vllm_logs``).

Conventions:
* ``None`` means "not seen in the log". A field that the log shows as *off* (e.g.
  ``speculative_config=None``) is ``None`` too, but then has an ``evidence`` entry: the
  verifier uses that to tell "seen off" from "not seen".
* ``evidence`` keys are field names; ``nccl_env.<NAME>`` keys hold one line per variable.
"""

from __future__ import annotations

import ast
import copy
import re
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tuner.vllm import parallel
from tuner.vllm.log_lines import (
    EVIDENCE_WIDTH,
    RAY_DEDUP_RE,
    LogLine,
    excerpt,
    excerpt_around_key,
    split_log_line,
    strip_ansi,
    text_lines,
)

__all__ = [
    "EVIDENCE_WIDTH",
    "CudagraphDowngrade",
    "EffectiveConfig",
    "EffectiveConfigScan",
    "LogLine",
    "excerpt",
    "excerpt_around_key",
    "parse_effective_config",
    "split_log_line",
    "strip_ansi",
    "text_lines",
]

# NCCL_DEBUG_SUBSYS=TUNING logs one line per collective call; distinct choices are few,
# so keep the first ones and drop the flood.
_MAX_NCCL_TUNING = 256


class CudagraphDowngrade(BaseModel):
    """One logged change of the cudagraph mode after the user's value was parsed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    from_mode: str | None
    to_mode: str
    line: str


class EffectiveConfig(BaseModel):
    """What the server ran with, as far as its log tells. See the module docstring."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    vllm_version: str | None = None
    non_default_args: dict[str, Any] | None = None
    # The raw `non-default args:` line, so a verifier can cite the exact key it compared.
    non_default_args_line: str | None = None
    model: str | None = None
    platform: str | None = Field(None, description="device_config of the engine: cuda, cpu, ...")
    dtype: str | None = None
    quantization: str | None = Field(None, description="engine config line, as printed: 'None', 'fp8'")
    kv_cache_dtype: str | None = Field(None, description="engine config line: auto, fp8, fp8_e4m3, ...")
    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None
    world_size: int | None = None
    distributed_backend: str | None = Field(None, description="nccl on GPU, gloo on CPU")
    ranks: list[dict[str, Any]] | None = Field(None, description="one per rank's assignment line: "
                                               "rank, tp_rank, world_size, process, pid (vllm.parallel)")
    allreduce: list[str] | None = Field(None, description="the TP all-reduce that ran, dispatch order: "
                                        "CPU_SHM or GLOO (CPU), the backends line (GPU), [] at TP 1")
    enforce_eager: bool | None = None
    disable_custom_all_reduce: bool | None = None
    compilation_mode: str | None = None
    cudagraph_mode_configured: str | None = Field(
        None, description="from the engine config line, printed before per-backend downgrades"
    )
    cudagraph_mode: str | None = Field(None, description="final mode after logged downgrades")
    cudagraph_downgrades: list[CudagraphDowngrade] | None = None
    cudagraph_capture_sizes: list[int] | None = None
    max_cudagraph_capture_size: int | None = None
    graphs_captured: list[str] | None = Field(
        None, description="labels of the capture bars, sorted, e.g. ['FULL', 'PIECEWISE']"
    )
    graph_capture_seconds: float | None = None
    graph_capture_gib: float | None = None
    graph_capture_skipped: bool | None = None
    speculative_method: str | None = None
    num_speculative_tokens: int | None = None
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    async_scheduling: bool | None = None
    custom_all_reduce_active: bool | None = None
    custom_all_reduce_reason: str | None = None
    allreduce_backends: list[str] | None = None
    attention_backend: str | None = None
    model_runner: str | None = None
    kv_cache_tokens: int | None = None
    kv_cache_device: str | None = Field(None, description="GPU or CPU")
    startup_seconds: dict[str, float] | None = None
    nccl_version: str | None = None
    nccl_debug_seen: bool | None = Field(None, description="any `NCCL INFO` line was logged")
    nccl_env: dict[str, str] | None = None
    nccl_tuning: list[str] | None = None
    nccl_transport: list[str] | None = Field(
        None, description="distinct transports from NCCL Channel lines: P2P/CUMEM, P2P/IPC, SHM"
    )
    ready: bool = False
    evidence: dict[str, str] = Field(default_factory=dict)
    warnings: list[str] = Field(default_factory=list, description="lines that failed to parse")


# ---------------------------------------------------------------------------------------
# Regexes, each for one documented line format

_NON_DEFAULT_RE = re.compile(r"non-default args: (\{.*\})\s*$")
# `<CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>` and friends are not python literals.
_ENUM_REPR_RE = re.compile(r"<(\w+)\.(\w+): [^<>]*>")
_PATH_REPR_RE = re.compile(r"\b(?:Posix|Windows)?Path\(('[^']*')\)")
_ENGINE_RE = re.compile(r"Initializing an? (?:V\d )?LLM engine \(v([^)]*)\) with config: ")
_BANNER_VERSION_RE = re.compile(
    r"(?:[\u2580-\u259f]\s+version|vLLM API server version) (\d[\w.+\-]*)"
)


def _to_bool(text: str) -> bool:
    return text == "True"


def _to_int_list(text: str) -> list[int]:
    return [int(x) for x in text.replace(" ", "").split(",") if x]


# Fields read off the engine config line: (field, regex, converter).
_ENGINE_FIELDS: tuple[tuple[str, re.Pattern[str], Callable[[str], Any]], ...] = (
    ("model", re.compile(r"\bmodel='([^']*)'"), str),  # the first key after 'with config: '
    ("dtype", re.compile(r", dtype=torch\.(\w+)"), str),
    ("tensor_parallel_size", re.compile(r", tensor_parallel_size=(\d+)"), int),
    ("pipeline_parallel_size", re.compile(r", pipeline_parallel_size=(\d+)"), int),
    ("disable_custom_all_reduce",
     re.compile(r", disable_custom_all_reduce=(True|False)\b"), _to_bool),
    ("enforce_eager", re.compile(r", enforce_eager=(True|False)\b"), _to_bool),
    ("quantization", re.compile(r", quantization=([\w\-]+)"), str),
    ("kv_cache_dtype", re.compile(r", kv_cache_dtype=([\w\-]+)"), str),
    ("platform", re.compile(r", device_config=(\w+)"), str),
    ("compilation_mode", re.compile(r"'mode': <CompilationMode\.(\w+): \d+>"), str),
    ("cudagraph_mode_configured", re.compile(r"'cudagraph_mode': <CUDAGraphMode\.(\w+)"), str),
    ("cudagraph_capture_sizes",
     re.compile(r"'cudagraph_capture_sizes': \[([\d,\s]*)\]"), _to_int_list),
    ("max_cudagraph_capture_size", re.compile(r"'max_cudagraph_capture_size': (\d+)"), int),
)
_SPEC_RE = re.compile(r", speculative_config=(None|SpeculativeConfig\(([^)]*)\))")
_SPEC_METHOD_RE = re.compile(r"method='([^']*)'")
_SPEC_K_RE = re.compile(r"num_spec_tokens=(\d+)")

# Downgrades, in vLLM's own words (vllm-knobs.md section 1):
_DOWNGRADE_RES = (
    # config time: "Cudagraph mode X is not compatible with compilation mode Y.[ ]Overriding to Z."
    re.compile(r"Cudagraph mode (?P<src>\w+) is not compatible with compilation mode \w+\."
               r"\s*Overriding to (?P<dst>[A-Z_]+)"),
    # worker init, per attention backend:
    # "CUDAGraphMode.X is not supported with ...; setting cudagraph_mode=Y[ because ...]"
    re.compile(r"CUDAGraphMode\.(?P<src>\w+) is not\s+supported\b.*?"
               r"; setting cudagraph_mode=(?P<dst>[A-Z_]+)"),
    # pooling, encoder-decoder, DCP, empty splitting_ops. Capitalised on purpose: the
    # empty-splitting_ops message ends with a hint "consider manually setting
    # cudagraph_mode to FULL" that is not a change.
    re.compile(r"\b(?:Overriding|Setting) cudagraph_mode to (?P<dst>[A-Z_]+)"),
)
_CAPTURE_RE = re.compile(r"Capturing CUDA graphs \(([^)]*)\)")
_CAPTURE_DONE_RE = re.compile(r"Graph capturing finished in ([\d.]+) secs?, took ([\d.]+) GiB")
_CAPTURE_SKIP_RE = re.compile(r"\bSkipping CUDA graph capture\b")
_ASYNC_RE = re.compile(
    r"\bAsync(?:hronous)? scheduling (?:is (enabled|disabled)|not supported\b.*\bwill be disabled)"
)
_CUSTOM_AR_RE = re.compile(
    r"Custom allreduce is disabled (?P<why>due to an unsupported world size"
    r"|because it's not supported on more than two PCIe-only GPUs"
    r"|because your platform lacks GPU P2P capability)?"
)
_CUSTOM_AR_REASONS = {
    "due to an unsupported world size": "unsupported_world_size",
    "because it's not supported on more than two PCIe-only GPUs": "pcie_more_than_two_gpus",
    "because your platform lacks GPU P2P capability": "no_p2p",
}
_BACKENDS_RE = re.compile(
    r"Using \[([^\]]*)\] all-reduce backends \(in dispatch order\) for (?:group )?'([^']+)'"
)
_ATTENTION_RE = re.compile(
    r"\bUsing (?:AttentionBackendEnum\.([A-Z][A-Z0-9_]+) backend"
    r"|([A-Z][A-Z0-9_]+) attention backend)\b"
)
_RUNNER_RE = re.compile(r"\bUsing (V\d) Model Runner\b|\busing the (V\d) model runner instead\b")
_KV_RE = re.compile(r"\b(GPU|CPU) KV cache size: ([\d,]+) tokens")
_WORLD_RE = re.compile(r"\bworld_size=(\d+) rank=\d+ .*?\bbackend=(\w+)")
_STARTUP_RES = (
    (re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s"
                r"(?:econds)?(?: \(compilation: ([\d.]+) s\))?"), ("init_engine", "compilation")),
    (re.compile(r"torch\.compile took ([\d.]+) s in total"), ("torch_compile",)),
    (re.compile(r"Model loading took [\d.]+ GiB(?: memory)? and ([\d.]+) seconds"),
     ("model_loading",)),
)
_VLLM_NCCL_RE = re.compile(r"vLLM is using nccl==(\S+)")
_NCCL_VERSION_RE = re.compile(r"NCCL INFO NCCL version (\d[\w.]*)")
_NCCL_ENV_RE = re.compile(r"NCCL INFO (NCCL_\w+) set by environment to (.*?)\.?\s*$")
_NCCL_TUNING_RE = re.compile(r"NCCL INFO (\w+): (\d+) Bytes -> Algo (\w+) proto (\w+)")
_NCCL_CHANNEL_RE = re.compile(r"NCCL INFO Channel \d+/\d+ : .*? via (\S+)")


def _transport_name(via: str) -> str:
    # "SHM/direct/direct" -> SHM; "P2P/CUMEM/read" -> P2P/CUMEM; "NET/IB/0" -> NET/IB
    parts = via.split("/")
    return parts[0] if parts[0] == "SHM" else "/".join(parts[:2])


def _parse_python_dict(text: str) -> dict[str, Any]:
    """Parse a python-repr dict without eval: enum reprs become their member name."""
    text = _PATH_REPR_RE.sub(r"\1", _ENUM_REPR_RE.sub(r"'\2'", text))
    value = ast.literal_eval(text)
    if not isinstance(value, dict):
        raise ValueError("not a dict")
    return value


# ---------------------------------------------------------------------------------------
# The scan

class _Scan:
    """Mutable accumulator for one pass over the log."""

    def __init__(self) -> None:
        self.f: dict[str, Any] = {}
        self.ev: dict[str, str] = {}
        self.warnings: list[str] = []
        self.captured: set[str] = set()
        self.downgrades: list[CudagraphDowngrade] = []
        self.nccl_tuning: dict[str, None] = {}  # ordered set
        self.transports: set[str] = set()
        self.nccl_env: dict[str, str] = {}
        self.startup: dict[str, float] = {}
        self.ar_reason_from_warning = False
        self.ranks: dict[int, dict[str, Any]] = {}     # vllm.parallel: by rank, by pid
        self.assigned: dict[int, int] = {}
        self.tp_tags: dict[int, tuple[int, str]] = {}

    def put(self, field: str, value: Any, line: str, m: re.Match[str] | None = None) -> None:
        self.f[field] = value
        self.ev[field] = excerpt(line, m.start(), m.end()) if m else excerpt(line)

    # -- handlers, one per line family ---------------------------------------------------

    def non_default_args(self, line: str) -> None:
        if not (m := _NON_DEFAULT_RE.search(line)):
            return
        try:
            self.put("non_default_args", _parse_python_dict(m.group(1)), line, m)
            self.f["non_default_args_line"] = line.rstrip("\r")
        except (ValueError, SyntaxError, MemoryError, RecursionError) as exc:
            self.warnings.append(
                f"non-default args not parsed ({type(exc).__name__}): {excerpt(line)}")

    def engine(self, line: str) -> None:
        if not (m := _ENGINE_RE.search(line)):
            return
        self.put("vllm_version", m.group(1), line, m)
        mode_match = None
        for field, regex, convert in _ENGINE_FIELDS:
            if fm := regex.search(line, m.end()):
                self.put(field, convert(fm.group(1)), line, fm)
                if field == "cudagraph_mode_configured":
                    mode_match = fm
        if sm := _SPEC_RE.search(line, m.end()):
            inner = sm.group(2) or ""
            method = _SPEC_METHOD_RE.search(inner)
            k = _SPEC_K_RE.search(inner)
            self.put("speculative_method", method.group(1) if method else None, line, sm)
            self.put("num_speculative_tokens", int(k.group(1)) if k else None, line, sm)
        if mode_match is not None:
            configured = mode_match.group(1)
            # The engine line already includes config-time downgrades logged before it.
            # When the latest such downgrade led to this very mode, keep its line as the
            # evidence: it says why, the config dump only says what.
            explained = (
                self.downgrades
                and self.downgrades[-1].to_mode == configured
                and self.f.get("cudagraph_mode") == configured
            )
            if not explained:
                self.put("cudagraph_mode", configured, line, mode_match)

    def banner(self, line: str) -> None:
        if "vllm_version" not in self.f and (m := _BANNER_VERSION_RE.search(line)):
            self.put("vllm_version", m.group(1), line, m)

    def downgrade(self, line: str) -> None:
        for regex in _DOWNGRADE_RES:
            if m := regex.search(line):
                src, dst = m.groupdict().get("src"), m.group("dst")
                last = self.downgrades[-1] if self.downgrades else None
                # Every TP worker logs the same warning: keep the first of a run.
                if last is None or (last.from_mode, last.to_mode) != (src, dst) \
                        or self.f.get("cudagraph_mode") != dst:
                    self.downgrades.append(
                        CudagraphDowngrade(from_mode=src, to_mode=dst, line=excerpt(line)))
                    self.put("cudagraph_mode", dst, line, m)
                return

    def capture(self, line: str) -> None:
        if not (m := _CAPTURE_RE.search(line)):
            return
        self.ev.setdefault("graphs_captured", excerpt(line, m.start(), m.end()))
        # tqdm joins its redraws with \r on one physical line: collect every label.
        self.captured.update(label.strip() for label in _CAPTURE_RE.findall(line))

    def capture_done(self, line: str) -> None:
        if m := _CAPTURE_DONE_RE.search(line):
            self.put("graph_capture_seconds", float(m.group(1)), line, m)
            self.put("graph_capture_gib", float(m.group(2)), line, m)
            self.startup["graph_capture"] = float(m.group(1))
            self.ev["startup_seconds.graph_capture"] = self.ev["graph_capture_seconds"]

    def capture_skipped(self, line: str) -> None:
        if m := _CAPTURE_SKIP_RE.search(line):
            self.put("graph_capture_skipped", True, line, m)

    def async_scheduling(self, line: str) -> None:
        if m := _ASYNC_RE.search(line):
            self.put("async_scheduling", m.group(1) == "enabled", line, m)

    def custom_ar(self, line: str) -> None:
        if m := _CUSTOM_AR_RE.search(line):
            self.put("custom_all_reduce_active", False, line, m)
            why = m.group("why") or ""
            self.f["custom_all_reduce_reason"] = _CUSTOM_AR_REASONS.get(why, "other")
            self.ar_reason_from_warning = True

    def backends(self, line: str) -> None:
        if not (m := _BACKENDS_RE.search(line)):
            return
        group = m.group(2)
        # Several groups (tp, ep, ...) log this; the TP group is the one the knobs act on.
        if self.f.get("allreduce_group", "").startswith("tp") and not group.startswith("tp"):
            return
        self.f["allreduce_group"] = group
        names = [n.strip().strip("'\"") for n in m.group(1).split(",") if n.strip()]
        self.put("allreduce_backends", names, line, m)

    def attention(self, line: str) -> None:
        if m := _ATTENTION_RE.search(line):
            self.put("attention_backend", m.group(1) or m.group(2), line, m)

    def runner(self, line: str) -> None:
        if m := _RUNNER_RE.search(line):
            self.put("model_runner", m.group(1) or m.group(2), line, m)

    def kv_cache(self, line: str) -> None:
        if m := _KV_RE.search(line):
            self.put("kv_cache_tokens", int(m.group(2).replace(",", "")), line, m)
            self.put("kv_cache_device", m.group(1), line, m)

    def world(self, line: str) -> None:
        if m := _WORLD_RE.search(line):
            self.put("world_size", int(m.group(1)), line, m)
            self.put("distributed_backend", m.group(2), line, m)
            if (found := parallel.world_rank(line)) is not None:
                self.ranks.setdefault(found["rank"], found)
                self.ev.setdefault("ranks", excerpt(line, m.start(), m.end()))

    def rank(self, line: str) -> None:
        if (found := parallel.assignment(line)) is not None:
            self.assigned.setdefault(*found)
            self.ev.setdefault("tp_assignment", excerpt(line))

    def tp_tag(self, line: str) -> None:
        if (found := parallel.tp_tag(line)) is not None:
            self.tp_tags.setdefault(found[0], found[1:])

    def shm_off(self, line: str) -> None:
        if (group := parallel.shm_off_group(line)) and group.startswith("tp"):
            self.put("allreduce", ["GLOO"], line)

    def startup_time(self, line: str) -> None:
        for regex, names in _STARTUP_RES:
            if m := regex.search(line):
                for name, value in zip(names, m.groups(), strict=True):
                    if value is not None:
                        self.startup[name] = float(value)
                        self.ev[f"startup_seconds.{name}"] = excerpt(line, m.start(), m.end())
                # The engine-init line sums up startup best; other lines only fill a gap.
                if "init_engine" in names or "startup_seconds" not in self.ev:
                    self.ev["startup_seconds"] = excerpt(line, m.start(), m.end())

    def vllm_nccl(self, line: str) -> None:
        if m := _VLLM_NCCL_RE.search(line):
            self.put("nccl_version", m.group(1), line, m)

    def nccl(self, line: str) -> None:
        if "nccl_debug_seen" not in self.f:
            self.put("nccl_debug_seen", True, line)
        if m := _NCCL_ENV_RE.search(line):
            name, value = m.group(1), m.group(2).strip()
            self.nccl_env[name] = value
            self.ev[f"nccl_env.{name}"] = excerpt(line, m.start(), m.end())
            self.ev.setdefault("nccl_env", excerpt(line, m.start(), m.end()))
        elif m := _NCCL_TUNING_RE.search(line):
            key = f"{m.group(1)}: {m.group(2)} Bytes -> Algo {m.group(3)} proto {m.group(4)}"
            if len(self.nccl_tuning) < _MAX_NCCL_TUNING:
                self.nccl_tuning.setdefault(key, None)
            self.ev.setdefault("nccl_tuning", excerpt(line, m.start(), m.end()))
        elif m := _NCCL_CHANNEL_RE.search(line):
            self.transports.add(_transport_name(m.group(1)))
            self.ev.setdefault("nccl_transport", excerpt(line, m.start(), m.end()))
        elif (m := _NCCL_VERSION_RE.search(line)) and "nccl_version" not in self.f:
            self.put("nccl_version", m.group(1).split("+")[0], line, m)

    def ready(self, line: str) -> None:
        self.put("ready", True, line)


# (marker, handler): a handler runs only on lines containing its marker, a cheap `in`
# test that keeps a 50 MB log of stats and progress lines fast.
_HANDLERS: tuple[tuple[str, Callable[[_Scan, str], None]], ...] = (
    ("non-default args:", _Scan.non_default_args),
    ("LLM engine (v", _Scan.engine),
    ("version ", _Scan.banner),
    ("ompatible with compilation mode", _Scan.downgrade),
    ("setting cudagraph_mode=", _Scan.downgrade),
    ("cudagraph_mode to ", _Scan.downgrade),
    ("Capturing CUDA graphs", _Scan.capture),
    ("Graph capturing finished", _Scan.capture_done),
    ("Skipping CUDA graph capture", _Scan.capture_skipped),
    ("scheduling", _Scan.async_scheduling),
    ("Custom allreduce is disabled", _Scan.custom_ar),
    ("all-reduce backends", _Scan.backends),
    ("ttention", _Scan.attention),
    ("odel runner", _Scan.runner),
    ("odel Runner", _Scan.runner),
    ("KV cache size:", _Scan.kv_cache),
    ("world_size=", _Scan.world),
    (parallel.RANK_MARKER, _Scan.rank),
    (parallel.TP_TAG_MARKER, _Scan.tp_tag),
    (parallel.SHM_OFF_MARKER, _Scan.shm_off),
    (" took ", _Scan.startup_time),
    ("using nccl==", _Scan.vllm_nccl),
    ("NCCL INFO", _Scan.nccl),
    ("Application startup complete", _Scan.ready),
)


class EffectiveConfigScan:
    """:func:`parse_effective_config` a line at a time: ``feed`` each line as the log grows
    (a line reader's lines, without their newline), ``config()`` whenever the configuration
    the lines so far establish is wanted (a partial log gives a partial configuration)."""

    def __init__(self) -> None:
        self._scan = _Scan()

    def feed(self, line: str) -> None:
        line = strip_ansi(line)
        if "across cluster]" in line:
            line = RAY_DEDUP_RE.sub("", line)
        for marker, handler in _HANDLERS:
            if marker in line:
                handler(self._scan, line)

    def config(self) -> EffectiveConfig:
        # _finish derives fields in place: on a copy, so that feeding can go on.
        return _finish(copy.deepcopy(self._scan))


def parse_effective_config(log_text: str) -> EffectiveConfig:
    """Parse a whole vLLM server log (any mix of API server, engine and worker lines)."""
    scan = EffectiveConfigScan()
    for line in log_text.split("\n"):
        scan.feed(line)
    return scan.config()


def _finish(scan: _Scan) -> EffectiveConfig:
    f, ev = scan.f, scan.ev
    f.pop("allreduce_group", None)
    if scan.captured:
        f["graphs_captured"] = sorted(scan.captured)
    if scan.downgrades:
        f["cudagraph_downgrades"] = scan.downgrades
    if f.get("enforce_eager") and f.get("cudagraph_mode") is None:
        f["cudagraph_mode"] = "NONE"  # --enforce-eager implies no graphs
        ev["cudagraph_mode"] = ev["enforce_eager"]
    if scan.nccl_env:
        f["nccl_env"] = scan.nccl_env
    if scan.nccl_tuning:
        f["nccl_tuning"] = list(scan.nccl_tuning)
    if scan.transports:
        f["nccl_transport"] = sorted(scan.transports)
    if scan.startup:
        f["startup_seconds"] = scan.startup
    if scan.ranks:
        f["ranks"] = parallel.merge_ranks(scan.ranks, scan.assigned, scan.tp_tags)
    parallel.derive_allreduce(f, ev)
    ev.pop("tp_assignment", None)
    _derive_speculation(f, ev)
    _derive_custom_ar(f, ev, scan)
    if f.get("platform") is None and "kv_cache_device" in f:
        f["platform"] = "cpu" if f["kv_cache_device"] == "CPU" else "cuda"
        ev["platform"] = ev["kv_cache_device"]
    return EffectiveConfig(**f, evidence=ev, warnings=scan.warnings)


def _derive_speculation(f: dict[str, Any], ev: dict[str, str]) -> None:
    if "speculative_method" in ev and f.get("speculative_method") is None:
        # `speculative_config=None`: every speculation field is seen, and off.
        for key in ("prompt_lookup_min", "prompt_lookup_max"):
            ev[key] = ev["speculative_method"]
        return
    # prompt_lookup_* are not in the engine line's SpeculativeConfig repr; the parsed
    # CLI value is the best record of them.
    spec = (f.get("non_default_args") or {}).get("speculative_config")
    if not isinstance(spec, dict):
        return
    line = f["non_default_args_line"]
    for key in ("prompt_lookup_min", "prompt_lookup_max"):
        if isinstance(spec.get(key), int):
            f[key] = spec[key]
            ev[key] = excerpt_around_key(line, f"speculative_config.{key}") or excerpt(line)


def _derive_custom_ar(f: dict[str, Any], ev: dict[str, str], scan: _Scan) -> None:
    if scan.ar_reason_from_warning:
        return  # vLLM's own warning is the most specific account
    backends = f.get("allreduce_backends")
    if backends is not None:
        f["custom_all_reduce_active"] = "CUSTOM" in backends
        f["custom_all_reduce_reason"] = (
            None if "CUSTOM" in backends else "not_in_allreduce_backends")
        ev["custom_all_reduce_active"] = ev["allreduce_backends"]
    elif f.get("disable_custom_all_reduce"):
        f["custom_all_reduce_active"] = False
        f["custom_all_reduce_reason"] = "disable_custom_all_reduce=True"
        ev["custom_all_reduce_active"] = ev["disable_custom_all_reduce"]
