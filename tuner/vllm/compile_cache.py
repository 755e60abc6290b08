"""vLLM's torch.compile cache, seen from the tuner: what a server log says about it, and
which of a study's knobs decide whether two trials can share it.

vLLM keeps compiled graphs under ``$VLLM_CACHE_ROOT/torch_compile_cache`` (default
``~/.cache/vllm``): one directory per hash of the compile-relevant configuration
(``<hash10>/rank_<r>_<dp>/<prefix>`` for Inductor's artifacts) and, with AOT compilation
(``VLLM_USE_AOT_COMPILE``, on by default with torch >= 2.10: the 0.26 and 0.32 fixture logs
both save an artifact), ``torch_aot_compile/<sha256>/rank_<r>_<dp>/model`` for the whole
compiled forward. A server whose key was compiled before loads instead of compiling. CUDA
graphs are *not* cached: every process captures them again (the capture is tied to the
process's CUDA context and memory pool; vLLM has no on-disk format for them).

**The log** (:class:`CompileLogScan`). Format strings, vLLM source:

* miss: ``backends.py`` "Using cache directory: %s for vLLM's torch.compile", "Dynamo
  bytecode transform time: %.2f s", "Cache the graph of compile range %s for later use",
  "Compiling a graph for compile range %s takes %.2f s"; ``decorators.py`` (0.32:
  ``compilation/aot`` cache) "saved AOT compiled function to %s" (0.32 prefixes the
  compiled module, "[backbone] "); ``monitor.py`` "torch.compile took %.2f s in total";
  ``core.py`` "init engine (profile, create kv cache, warmup model) took %.2f s
  (compilation: %.2f s)".
* hit: ``backends.py`` "Directly load the compiled graph(s) for compile range %s from the
  cache, took %.3f s"; the AOT cache "Directly load AOT compilation from path %s"; a
  standalone AOT artifact also "reconstructed serializable fn from standalone compile
  artifacts. num_artifacts=%d num_submods=%d".
* a stale or broken entry: "Compiling model again due to a load failure from %s, reason: %s".

Real AOT hits (public 0.2x logs, ``decorators.py:303-311``) still print "Using cache
directory" and "Dynamo bytecode transform time" (1.1-2.9 s) before the Inductor load
(0.2-1.9 s); torch.compile takes 1.6-4.9 s in total where the miss took 9.7-14.8 s.

**The key** (:func:`compile_key`): a *prediction* from the asked values, so trials can be
grouped before they run; what vLLM really did is the record's ``cache_dir`` hash. vLLM's
key (``AotCompileCache._compute_hash_key``, ``VllmBackend``'s cache dir) hashes
``envs.compile_factors()`` (every vLLM env var except an ignore list), ``VllmConfig.
compute_hash()`` (model, cache, parallel, scheduler, device, load, attention, lora,
speculative, structured outputs, observability, compilation, kernel, kv-transfer and
additional config, each with its own factors), the traced source files and the forward's
identity (vLLM version). Which knob goes where is the knob table's ``compile_key`` column
(``tuner.vllm.knobs``); a target it does not know is counted as relevant (a false "same
key" would promise a hit that does not happen; a false "different key" only misses a
saving).
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from tuner.vllm.knob_values import ANY
from tuner.vllm.knobs import knob

__all__ = ["CompileLogScan", "CompileRecord", "compile_key", "compile_settings",
           "check_cache_dir", "expand_cache_dir", "STUDY_CACHE_DIR", "VLLM_DEFAULT", "study_cache_root"]

# execution.compile_cache_dir unset: the study's own cache, this folder of the study folder.
STUDY_CACHE_DIR = "vllm-cache"
# execution.compile_cache_dir: vllm-default leaves VLLM_CACHE_ROOT alone (vLLM's ~/.cache/vllm).
VLLM_DEFAULT = "vllm-default"

Cache = Literal["hit", "miss", "partial", "none"]

# (Name pid=N) prefixes vLLM (and Ray) put before a line; several may be nested.
_PREFIX_RE = re.compile(r"^\s*((?:\([\w.\-]+ pid=\d+\) ?)+)")
_MODULE_RE = r"(?:\[[\w.\-]+\] )?"        # 0.32: "[backbone] saved AOT compiled function ..."
_CACHE_DIR_RE = re.compile(r"Using cache directory: (.+?) for vLLM's torch\.compile")
_DYNAMO_RE = re.compile(r"Dynamo bytecode transform time: ([\d.]+) s")
_COMPILED_RE = re.compile(r"Compiling a graph for (?:compile range \(\d+, \d+\)|shape \S+|dynamic shape) "
                          r"takes ([\d.]+) s")
_LOADED_RE = re.compile(r"Directly load the compiled graph\(s\) for (?:compile range \(\d+, \d+\)|shape \S+|"
                        r"dynamic shape) from the cache, took ([\d.]+) s")
_AOT_SAVED_RE = re.compile(_MODULE_RE + r"saved AOT compiled function to (\S+)")
_AOT_LOADED_RE = re.compile(_MODULE_RE + r"Directly load AOT compilation from path (\S+)")
# The engine config line says whether torch.compile runs at all (no compile lines then
# mean "none"); with compilation on and no cache lines (the CPU build with
# VLLM_USE_AOT_COMPILE=0 prints only "Warming up model for the compilation...") the cache
# status is unknown, not "none".
_ENGINE_EAGER_RE = re.compile(r"Initializing a V1 LLM engine .*?\benforce_eager=(True|False)")
_ENGINE_MODE_RE = re.compile(r"Initializing a V1 LLM engine .*?'mode': <CompilationMode\.(\w+):")
_RELOAD_RE = re.compile(r"Compiling model again due to a load failure from (\S+), reason: (.*)$")
_TOTAL_RE = re.compile(_MODULE_RE + r"torch\.compile (?:took|takes) ([\d.]+) s in total")
_CAPTURE_RE = re.compile(r"Graph capturing finished in ([\d.]+) secs?")
_INIT_RE = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s"
                      r"(?: \(compilation: ([\d.]+) s\))?")


@dataclass
class CompileRecord:
    """What one server's log says about torch.compile and its cache.

    ``cache``: "hit" (every compiled graph and/or the AOT artifact was loaded), "miss"
    (compiled, nothing loaded), "partial" (some loaded, some compiled - e.g. the AOT
    artifact loaded but a graph range compiled, or a stale entry recompiled), "none" (the
    engine started without torch.compile: eager, or compilation off), None (unknown: the
    log stops before the engine was up, or a vLLM version whose lines are not known)."""

    cache: Cache | None = None
    compile_s: float | None = None            # vLLM's "compilation" / torch.compile total
    dynamo_s: float | None = None
    inductor_s: float | None = None           # compiling graphs (misses)
    load_s: float | None = None               # loading graphs from the cache (hits)
    cache_dir: str | None = None              # the first "Using cache directory"
    cache_hash: str | None = None             # its hash component (torch_compile_cache/<hash>/...)
    aot: Literal["loaded", "saved"] | None = None
    aot_path: str | None = None
    reload_reason: str | None = None          # "Compiling model again due to a load failure"
    graph_capture_s: float | None = None
    init_engine_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> CompileRecord | None:
        """None for None (an outcome written before compile records existed: unknown)."""

        if data is None:
            return None
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


def _split(line: str) -> tuple[str, str]:
    m = _PREFIX_RE.match(line)
    return (m.group(1).strip(), line[m.end():]) if m else ("", line)


@dataclass
class _Scan:
    """What ``CompileLogScan`` gathers line by line before it decides the cache status."""

    source: str | None = None      # the process whose times are read
    compiled: bool = False
    loaded: bool = False
    aot_saved: bool = False
    aot_loaded: bool = False
    reloaded: bool = False
    totals: list[float] = field(default_factory=list)
    dyn: list[float] = field(default_factory=list)
    ind: list[float] = field(default_factory=list)
    lod: list[float] = field(default_factory=list)
    init_compilation: float | None = None
    started: bool = False
    compiles: bool | None = None   # from the engine config line; None: not seen

    def mine(self, prefix: str) -> bool:
        """The line's process is the one whose times are read (the first to print one)."""

        if self.source is None:
            self.source = prefix
        return prefix == self.source


class CompileLogScan:
    """The compile record of a log read a line at a time (see CompileRecord.cache): ``feed``
    each line as the log grows, ``record()`` whenever the record of the lines so far is wanted.

    Tensor-parallel workers each print the compile lines: times are taken from the process
    that printed the first one (rank 0 prints first), directories from the first line."""

    def __init__(self) -> None:
        self._rec = CompileRecord()
        self._scan = _Scan()

    def feed(self, line: str) -> None:
        # splitlines, as over a whole text: a progress bar's \r parts are lines of their own.
        for raw in line.splitlines():
            prefix, rest = _split(raw)
            _read_line(self._rec, self._scan, prefix, rest)

    def record(self) -> CompileRecord:
        scan = self._scan
        rec = replace(self._rec)  # feeding goes on: the totals are set on a copy
        rec.dynamo_s = round(sum(scan.dyn), 3) if scan.dyn else None
        rec.inductor_s = round(sum(scan.ind), 3) if scan.ind else None
        rec.load_s = round(sum(scan.lod), 3) if scan.lod else None
        rec.compile_s = scan.init_compilation if scan.init_compilation is not None else (
            round(sum(scan.totals), 3) if scan.totals else None)
        rec.aot = "loaded" if scan.aot_loaded else ("saved" if scan.aot_saved else None)
        rec.cache = _cache_status(scan, rec)
        return rec


def _read_line(rec: CompileRecord, scan: _Scan, prefix: str, line: str) -> None:
    """One log line (its process ``prefix`` split off) into the record and the scan."""

    if (m := _CACHE_DIR_RE.search(line)) is not None:
        if rec.cache_dir is None:
            rec.cache_dir = m.group(1)
            h = re.search(r"torch_compile_cache[/\\]([0-9a-f]+)[/\\]", rec.cache_dir)
            rec.cache_hash = h.group(1) if h else None
        scan.mine(prefix)
    elif (m := _DYNAMO_RE.search(line)) is not None:
        if scan.mine(prefix):
            scan.dyn.append(float(m.group(1)))
    elif (m := _COMPILED_RE.search(line)) is not None:
        scan.compiled = True
        if scan.mine(prefix):
            scan.ind.append(float(m.group(1)))
    elif (m := _LOADED_RE.search(line)) is not None:
        scan.loaded = True
        if scan.mine(prefix):
            scan.lod.append(float(m.group(1)))
    elif (m := _AOT_SAVED_RE.search(line)) is not None:
        scan.aot_saved = True
        rec.aot_path = rec.aot_path or m.group(1)
    elif (m := _AOT_LOADED_RE.search(line)) is not None:
        scan.aot_loaded = True
        rec.aot_path = rec.aot_path or m.group(1)
    elif (m := _RELOAD_RE.search(line)) is not None:
        scan.reloaded = True
        rec.reload_reason = rec.reload_reason or m.group(2).strip()
    elif (m := _TOTAL_RE.search(line)) is not None:
        if scan.mine(prefix):
            scan.totals.append(float(m.group(1)))
    elif (m := _CAPTURE_RE.search(line)) is not None:
        if rec.graph_capture_s is None:
            rec.graph_capture_s = float(m.group(1))
    elif "Initializing a V1 LLM engine" in line:
        eager = _ENGINE_EAGER_RE.search(line)
        mode = _ENGINE_MODE_RE.search(line)
        scan.compiles = not ((eager and eager.group(1) == "True") or (mode and mode.group(1) == "NONE"))
    elif (m := _INIT_RE.search(line)) is not None:
        scan.started = True
        if rec.init_engine_s is None:
            rec.init_engine_s = float(m.group(1))
            scan.init_compilation = float(m.group(2)) if m.group(2) else None


def _cache_status(scan: _Scan, rec: CompileRecord) -> Cache | None:
    """CompileRecord.cache from what the whole log showed."""

    hit = scan.loaded or scan.aot_loaded
    miss = scan.compiled or scan.aot_saved or scan.reloaded
    if hit and miss:
        return "partial"
    if hit:
        return "hit"
    if miss:
        return "miss"
    if scan.started and rec.cache_dir is None and not scan.totals and scan.compiles is not True:
        return "none"
    return None


# ------------------------------------------------------------------------------ the key

def _eager(asked: Mapping[str, Any]) -> bool:
    if knob("enforce_eager").values.canonical(asked.get("enforce_eager")) is True:
        return True
    mode = knob("compilation_config.mode")
    return any(mode.values.canonical(asked[t]) == "NONE"
               for t in (mode.target, *mode.aliases) if t in asked)


def compile_settings(asked: Mapping[str, Any]) -> dict[str, Any]:
    """The compile-relevant part of a trial's asked settings (flat target -> value), each
    value in its knob's canonical spelling: vLLM hashes the resolved configuration, where
    cudagraph mode ``2`` and ``"full"`` are both FULL."""

    out: dict[str, Any] = {}
    for target, value in sorted(asked.items()):
        k = knob(target)
        if value is None or not k.compile_key:
            continue
        canonical = None if k.values is ANY else k.values.canonical(value)
        out[target] = value if canonical is None else canonical
    return out


def compile_key(asked: Mapping[str, Any]) -> str | None:
    """A short hash of the compile-relevant asked settings; None when the trial compiles
    nothing (eager, compilation mode NONE). Equal keys: the second trial should load."""

    if _eager(asked):
        return None
    text = json.dumps(compile_settings(asked), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------ cache dir


def check_cache_dir(value: str | None) -> str | None:
    """``execution.compile_cache_dir`` as the study file gives it: absolute, or starting with
    ``~`` or a ``$VARIABLE`` that :func:`expand_cache_dir` resolves where the study runs.

    A relative path is refused: every server starts in its own working directory (and a
    multi-node study on other hosts), so a relative path would name a different directory
    per trial and nothing would be shared."""

    if value is None:
        return None
    text = str(value).strip()
    if text == VLLM_DEFAULT:
        return text
    if not text:
        raise ValueError(f"compile_cache_dir is empty; leave it out for the study's own cache or "
                         f"write {VLLM_DEFAULT} for vLLM's default")
    if not text.startswith(("/", "~", "$")):
        raise ValueError(_relative(value))
    return text


def expand_cache_dir(value: str, environ: Mapping[str, str], home: str) -> str:
    """``value`` with ``~`` and ``$VARS`` expanded from ``environ`` and ``home`` (the
    caller's, at the edge where the study is run); must then be absolute."""

    text = value.strip()
    if text == VLLM_DEFAULT:
        return text
    if text == "~" or text.startswith("~/"):
        text = home + text[1:]

    def var(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        return environ.get(name, m.group(0))

    expanded = _VAR_RE.sub(var, text)
    if "$" in expanded:
        raise ValueError(f"compile_cache_dir {value!r}: unset variable in {expanded!r}")
    if not posixpath.isabs(expanded):
        raise ValueError(_relative(value))
    return posixpath.normpath(expanded)


_VAR_RE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def study_cache_root(setting: str | None, study_root: str, tuner_env: Mapping[str, str]) -> str | None:
    """The cache root (VLLM_CACHE_ROOT) a study's servers get; None: leave it to them.

    ``setting`` is ``execution.compile_cache_dir`` as expanded where the study runs: an
    absolute path is used as it is; ``vllm-default`` means vLLM's own default; unset means
    the study's own ``<study folder>/vllm-cache`` - unless the tuner runs with
    VLLM_CACHE_ROOT in its environment ``tuner_env`` (the servers inherit that choice). A
    study-level cache makes every compile-cache hit one the study earned itself (a trial
    whose key an earlier trial of it compiled), so hits are attributable and a study's
    startup figures do not depend on what ran on the node before it; the study's trials, its
    confirmation re-runs and a resumed run still share it."""

    if setting == VLLM_DEFAULT:
        return None
    if setting:
        return setting
    if tuner_env.get("VLLM_CACHE_ROOT"):
        return None
    return posixpath.join(study_root, STUDY_CACHE_DIR)


def _relative(value: str) -> str:
    return (f"compile_cache_dir {value!r} is relative; give an absolute path (or ~/...): each "
            "server runs in its own directory, so a relative one would not be shared between trials")
