#!/usr/bin/env python3
"""Produce every GPU failure and startup scenario of issue 19 for real, on the GPU box, with
the tuner's own CLI, and keep their logs and outcomes as evidence.

    python3 scripts/gpu_scenarios.py search_spaces/smollm2-h200.yaml --out OUT [--only a,b,c,d]

From the study file only ``server`` is used (command, model, flags, env, GPUs per trial,
timeouts); each scenario is a small study of its own with the probe off and one short load
level, run by ``python -m tuner run`` (an argument vector, as a user would):

a. **busy GPU**: a python3 process holds ``--hold-gib`` GiB on GPU 0 with torch; the first
   trial (``execution.gpu_free_timeout: 10s``) must fail ``gpus_not_free`` naming it,
   without starting a server. The holder is stopped 3 s after the next trial has written
   its command.json (the step just before its wait for the GPU), so that trial shows the
   other half: it waits for the GPU, then starts.
b. **too little memory**: ``--enforce-eager --kv-cache-memory-bytes 50000000`` (a KV cache
   that cannot hold one 4,096-token request) must fail fast with a typed memory reason
   (``max_model_len_too_large``), vLLM's message in the outcome.
c. **rejected configuration**: ``speculative_config.method: mtp`` on a model without MTP
   layers must fail ``invalid_config`` with vLLM's own message.
d. **compile cache**: two trials that differ only in ``gpu_memory_utilization`` (outside
   vLLM's compile key) - the first compiles (miss), the second loads (hit); the startup
   drop is in both outcomes and in ``tuner status``. The study gets a torch.compile cache
   of its own, emptied first (``execution.compile_cache_dir``: ``<work>/vllm-cache``): the
   tuner passes it to every server as VLLM_CACHE_ROOT, over any VLLM_CACHE_ROOT this
   script's environment carries, so d1 compiles whatever ran on the box before (on
   2026-12-02 an inherited root holding the main study's cache made d1 a hit).

All of them run as one study (one Ray start, the tuner's own queue): a (the baseline), then
d1, d2, c, b in the order the tuner's compile-key grouping gives them. On an H200 with
SmolLM2-135M about 4 minutes (a: the 10 s wait; d1 ~90 s and d2 ~50 s to start; b and c
~20-40 s each to fail); ``--only`` runs a subset.

Output (``--out``, a few files so a device run can bring them back): ``summary.json`` (per
scenario: expected, got, reason, vLLM's message, startup breakdown, seconds),
``summary.txt`` (the same, readable, plus each study's ``tuner status``) and
``scenarios.tar.gz`` (every study folder - trial outcomes, server logs, startup and
compile-cache records - and the tuner's own output; compile caches left out). Processes:
every one started here carries a marker variable; whatever still has it at the end (a
holder, a server, a Ray worker) is killed and reported, so nothing is left behind.

``--dry-run`` runs the same scenarios against the built-in simulator with a stand-in
``nvidia-smi`` (for the test suite and for trying the script without a GPU).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner.adapters import proctree  # noqa: E402

MARKER_VAR = "TUNER_SCENARIO_RUN"
KV_BYTES = 50_000_000          # < 0.09 GiB: SmolLM2-135M needs ~94 MB for one 4,096-token request
GPU_FREE_TIMEOUT = "10s"      # the busy trial's bounded wait
RELEASE_DELAY_S = 3.0         # the holder goes this long after the next trial began waiting
STUDY_TIMEOUT_S = 420
CACHE_DIR = "vllm-cache"       # the scenario study's torch.compile cache, in the work folder

# Holds GiB of GPU 0 until killed (scenario a).
HOLDER = """
import sys, time
import torch
held = torch.empty(int(float(sys.argv[1]) * 2**30), dtype=torch.uint8, device="cuda:0")
torch.cuda.synchronize()
print("holding", held.numel() >> 20, "MiB", flush=True)
time.sleep(900)
"""
DRY_HOLDER = "import time\nprint('holding', flush=True)\ntime.sleep(900)\n"

# Dry run: an nvidia-smi that lists the holder (pid file) while it lives.
FAKE_SMI = """#!{python}
import os, sys
pid = open({pidfile!r}).read().strip() if os.path.exists({pidfile!r}) else ""
alive = pid and os.path.exists("/proc/" + pid)
uuid = "GPU-00000000-0000-4000-8000-000000000000"
if any(a.startswith("--query-compute-apps") for a in sys.argv):
    sys.stdout.write(f"{{uuid}}, {{pid}}, 20996, python3\\n" if alive else "")
else:
    sys.stdout.write(f"0, {{uuid}}, {{21003 if alive else 1}}, 143771\\n")
"""


# -- the scenario studies (pure) ---------------------------------------------------------


def _base(study: dict[str, Any], name: str, *, dry_run: bool) -> dict[str, Any]:
    server = dict(study["server"])
    server["flags"] = dict(server.get("flags") or {})
    # A cache root of the study file's own would win over execution.compile_cache_dir
    # (render_command leaves a configured VLLM_CACHE_ROOT alone): scenario d needs its own.
    server["env"] = {k: v for k, v in (server.get("env") or {}).items() if k != "VLLM_CACHE_ROOT"}
    server["startup_timeout"] = server.get("startup_timeout", "10m")
    if dry_run:
        server["command"] = ["{python}", "-m", "tuner.sim"]
        server["gpus_per_trial"] = 0
        server["env"].setdefault("TUNER_SIM_PROFILE", "tiny-cpu")
        server["env"].setdefault("TUNER_SIM_TIME_SCALE", 0.02)
        server["env"].setdefault("TUNER_SIM_STARTUP_SCALE", 0.05)
    return {
        "name": name,
        "description": f"issue 19 GPU scenario study, made by scripts/gpu_scenarios.py from {study.get('name')}",
        "server": server,
        "objectives": [{"metric": "output_tok_s", "concurrency": 1, "direction": "maximize"}],
        # One short level: the scenarios are about starting servers, not about speed.
        # noise_starts 1: each scenario's configuration once, in the order the scenarios need.
        "load": {"api": "completions", "concurrency": [1], "requests_per_stream": 4, "min_requests": 4,
                 "noise_starts": 1,
                 "warmup_requests": 1, "max_level_seconds": 30, "request_timeout_s": 60,
                 "workload": {"classes": [{"name": "short", "kind": "open_ended", "weight": 1,
                                           "prompt_tokens": 64, "output_tokens": 32}]}},
        "probe": {"enabled": False},
        "budget": {"n_trials": 1, "trial_timeout": "8m"},
        "execution": {"early_stop": False},
        "confirm": {"candidates": 0},
    }


# Each configuration of the study: its scenario, its parameter values (unlisted ones take
# their defaults) and what it must show.
CONFIGS = {
    "a": ("a", {"enforce_eager": True},
          "failed gpus_not_free in prepare after the bounded wait, naming the holder; no server started"),
    "d1": ("d", {},
           "completed; torch.compile cache miss (compiles); after a: waited for the GPU, then started"),
    "d2": ("d", {"gpu_memory_utilization": 0.45},
           "completed; torch.compile cache hit (same compile key as d1), startup below d1's"),
    "c": ("c", {"spec_method": "mtp", "spec_k": 1},
          "failed invalid_config (signature unsupported_speculative_method) with vLLM's message"),
    "b": ("b", {"enforce_eager": True, "kv_cache_memory_bytes": KV_BYTES},
          "failed fast with a memory reason (max_model_len_too_large) and vLLM's message"),
}
WHAT = {"a": "busy GPU", "b": "too little GPU memory", "c": "rejected configuration",
        "d": "compile cache shared by two trials"}


def scenario_study(study: dict[str, Any], selected: set[str], *, dry_run: bool,
                   cache_dir: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The study that runs the selected scenarios: its dict and, by configuration name in
    the order they are listed (the baseline first), each one's full parameter values.
    ``cache_dir`` (absolute, empty): the study's torch.compile cache (scenario d)."""

    names = [n for n in ("a", "d1", "d2", "c", "b") if CONFIGS[n][0] in selected]
    spec = _base(study, f"{study['name']}-scenarios", dry_run=dry_run)
    util = spec["server"]["flags"].pop("gpu_memory_utilization", 0.5)
    for key in ("enforce_eager", "kv_cache_memory_bytes", "speculative_config"):
        spec["server"]["flags"].pop(key, None)
    spec["parameters"] = [
        {"name": "gpu_memory_utilization", "flag": "gpu_memory_utilization", "kind": "categorical",
         "values": sorted({float(util), 0.45}, reverse=True), "default": float(util)},
        {"name": "enforce_eager", "flag": "enforce_eager", "kind": "bool", "default": False},
        {"name": "kv_cache_memory_bytes", "flag": "kv_cache_memory_bytes", "kind": "categorical",
         "values": [None, KV_BYTES]},
        {"name": "spec_method", "flag": "speculative_config.method", "kind": "categorical",
         "values": [None, "mtp"]},
        {"name": "spec_k", "flag": "speculative_config.num_speculative_tokens", "kind": "int",
         "low": 1, "high": 1, "when": {"spec_method": "mtp"}},
    ]
    # Every value spelled out: a starting point's unlisted parameters take the baseline's.
    defaults = {"gpu_memory_utilization": float(util), "enforce_eager": False, "kv_cache_memory_bytes": None,
                "spec_method": None}
    points = {n: {**defaults, **CONFIGS[n][1]} for n in names}
    spec["baseline"] = points[names[0]]
    spec["starting_points"] = [points[n] for n in names[1:]]
    spec["budget"]["n_trials"] = len(points)
    # Bounds the busy trial's wait (a) and covers the holder's release before the next one.
    spec["execution"]["gpu_free_timeout"] = GPU_FREE_TIMEOUT
    spec["execution"]["compile_cache_dir"] = cache_dir
    return spec, points


# -- judging what happened (pure) ---------------------------------------------------------


def _trial_summary(outcome: dict[str, Any] | None) -> dict[str, Any]:
    if outcome is None:
        return {"status": "missing"}
    startup = outcome.get("startup") or {}
    return {
        "status": outcome.get("status"), "reason": outcome.get("reason"), "phase": outcome.get("phase"),
        "message": outcome.get("message"), "signature": (outcome.get("signature") or {}).get("reason"),
        "gpu_wait_s": outcome.get("gpu_wait_s"), "startup_s": outcome.get("startup_s"),
        "trial_s": outcome.get("trial_s"), "compile_cache": startup.get("compile_cache"),
        "startup": startup or None,
    }


MEMORY_REASONS = ("max_model_len_too_large", "no_kv_cache_memory", "gpu_memory_insufficient", "cuda_oom")


def judge(name: str, got: dict[str, Any], others: dict[str, dict[str, Any]]) -> bool:
    """Did configuration ``name`` show what its scenario must show?"""

    if name == "a":
        message = got.get("message") or ""
        return (got.get("reason") == "gpus_not_free" and got.get("phase") == "prepare"
                and ("pid " in message or "MiB on GPU" in message))
    if name == "d1":
        return got.get("status") == "completed" and got.get("compile_cache") == "miss"
    if name == "d2":
        first = others.get("d1") or {}
        return (got.get("status") == "completed" and got.get("compile_cache") == "hit"
                and None not in (got.get("startup_s"), first.get("startup_s"))
                and got["startup_s"] < first["startup_s"])
    if name == "c":
        return got.get("reason") == "invalid_config" and "Unsupported speculative method" in (got.get("message") or "")
    if name == "b":
        return got.get("reason") in MEMORY_REASONS and got.get("phase") == "start"
    raise KeyError(name)


# -- running (I/O) ------------------------------------------------------------------------


class Runner:
    def __init__(self, work: Path, python: str, marker: str, *, dry_run: bool) -> None:
        self.work, self.python, self.marker, self.dry_run = work, python, marker, dry_run
        self.results = work / "results"
        self.env = dict(os.environ, **{MARKER_VAR: marker, "PYTHONUNBUFFERED": "1"})
        self.env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)

    def tuner(self, *args: str, log: Path, timeout: float = STUDY_TIMEOUT_S) -> int:
        with open(log, "w") as out:
            try:
                return subprocess.run([self.python, "-m", "tuner", *args], cwd=ROOT, env=self.env,
                                      stdout=out, stderr=subprocess.STDOUT, timeout=timeout,
                                      check=False).returncode
            except subprocess.TimeoutExpired:
                out.write(f"\n[gpu_scenarios] tuner {' '.join(args)} killed after {timeout:.0f}s\n")
                return 124

    def run_study(self, spec: dict[str, Any], *, release_holder: Any = None) -> dict[str, Any]:
        """``tuner run`` the study; ``release_holder`` is called once, ``RELEASE_DELAY_S`` after
        the second trial wrote its command.json (the busy-GPU holder's release: that trial
        is then waiting for the GPU). Timed from the first trial's outcome instead, a loaded
        machine (CI) took over 3 s to get the next trial that far, and it never waited."""

        name = spec["name"]
        path = self.work / "studies" / f"{name}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        waiting = self.results / name / "trials" / "0001" / "command.json"
        began = time.monotonic()
        with open(self.work / f"{name}.run.log", "w") as out:
            proc = subprocess.Popen([self.python, "-m", "tuner", "run", str(path), "--results", str(self.results)],
                                    cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT)
            seen: float | None = None
            while proc.poll() is None and time.monotonic() - began < STUDY_TIMEOUT_S:
                if release_holder is not None and seen is None and waiting.exists():
                    seen = time.monotonic()
                if release_holder is not None and seen is not None and time.monotonic() - seen >= RELEASE_DELAY_S:
                    release_holder()
                    release_holder = None
                time.sleep(0.2)
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)   # the tuner stops its servers on Ctrl-C
                try:
                    proc.wait(timeout=90)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                out.write(f"\n[gpu_scenarios] tuner run stopped after {STUDY_TIMEOUT_S}s\n")
        if release_holder is not None:
            release_holder()
        wall = time.monotonic() - began
        self.tuner("status", name, "--results", str(self.results), log=self.work / f"{name}.status.txt", timeout=120)
        trials, values = {}, {}
        for outcome in sorted((self.results / name / "trials").glob("*/outcome.json")):
            with contextlib.suppress(OSError, ValueError):
                trials[int(outcome.parent.name)] = json.loads(outcome.read_text())
                values[int(outcome.parent.name)] = json.loads(
                    (outcome.parent / "command.json").read_text()).get("values", {})
        return {"rc": proc.returncode, "wall_s": round(wall, 1), "trials": trials, "values": values}

    def smi_snapshot(self, label: str) -> None:
        smi = shutil.which("nvidia-smi", path=self.env.get("PATH"))
        if smi is None:
            return
        for query in ("--query-compute-apps=gpu_uuid,pid,used_memory,process_name",
                      "--query-gpu=index,uuid,memory.used,memory.total"):
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                out = subprocess.run([smi, query, "--format=csv,noheader,nounits"], capture_output=True,
                                     text=True, timeout=30, env=self.env, check=False)
                with open(self.work / f"nvidia-smi-{label}.txt", "a") as f:
                    f.write(f"$ nvidia-smi {query}\n{out.stdout}{out.stderr}\n")

    def leftovers(self, grace_s: float = 15.0) -> list[int]:
        """Kill whatever still carries this run's marker (after a grace for Ray to exit)."""

        deadline = time.monotonic() + grace_s
        mine = {os.getpid()}
        left = [p for p in proctree.pids_with_env(MARKER_VAR, self.marker) if p not in mine]
        while left and time.monotonic() < deadline:
            time.sleep(0.5)
            left = [p for p in proctree.pids_with_env(MARKER_VAR, self.marker) if p not in mine]
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        return left


class Holder:
    """A process holding ``gib`` GiB on GPU 0 (a stand-in in a dry run) until ``release``."""

    def __init__(self, runner: Runner, gib: float, python: str) -> None:
        self.pidfile = runner.work / "holder.pid"
        code = DRY_HOLDER if runner.dry_run else HOLDER
        self.proc = subprocess.Popen([python, "-c", code, str(gib)], env=runner.env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.pid = self.proc.pid
        self.pidfile.write_text(str(self.pid))
        first = self.proc.stdout.readline() if self.proc.stdout else ""
        if not first.startswith("holding"):
            self.release()
            raise RuntimeError(f"the GPU holder did not start: {first}")
        self.released_at: float | None = None

    def release(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
            self.released_at = time.time()
        self.pidfile.unlink(missing_ok=True)


def _fake_nvidia_smi(runner: Runner) -> None:
    folder = runner.work / "fake-bin"
    folder.mkdir(exist_ok=True)
    smi = folder / "nvidia-smi"
    smi.write_text(FAKE_SMI.format(python=sys.executable, pidfile=str(runner.work / "holder.pid")))
    smi.chmod(0o755)
    runner.env["PATH"] = f"{folder}{os.pathsep}{runner.env.get('PATH', '')}"


def run_scenarios(study: dict[str, Any], selected: set[str], runner: Runner, *, hold_gib: float,
                  holder_python: str) -> dict[str, Any]:
    summary: dict[str, Any] = {"study": study.get("name"), "dry_run": runner.dry_run, "scenarios": {}}
    began = time.monotonic()
    cache = (runner.work / CACHE_DIR).resolve()
    shutil.rmtree(cache, ignore_errors=True)     # a --work folder reused: d1 must still compile
    cache.mkdir(parents=True)
    spec, points = scenario_study(study, selected, dry_run=runner.dry_run, cache_dir=str(cache))
    holder = None
    runner.smi_snapshot("before")
    try:
        if "a" in selected:
            holder = Holder(runner, hold_gib, holder_python)
            time.sleep(1.0)    # let nvidia-smi see it
            runner.smi_snapshot("held")
        result = runner.run_study(spec, release_holder=holder.release if holder else None)
    finally:
        if holder is not None:
            holder.release()
    runner.smi_snapshot("after")
    summary["study_run"] = {"name": spec["name"], "rc": result["rc"], "wall_s": result["wall_s"]}
    by_config = match_trials(points, result["trials"], result["values"])
    summary["run_order"] = [name for _, name in sorted((g["trial"], n) for n, g in by_config.items())]
    for name in points:
        scenario, values, expected = CONFIGS[name]
        got = by_config.get(name, {"status": "missing"})
        if name == "a" and holder is not None:
            got["holder_pid"] = holder.pid
        summary["scenarios"][name] = {"what": WHAT[scenario], "values": values, "expected": expected,
                                      "got": got, "ok": judge(name, got, by_config)}
    first, second = (by_config.get(n, {}).get("startup_s") for n in ("d1", "d2"))
    if first is not None and second is not None:
        summary["startup_drop_s"] = round(first - second, 1)
    summary["wall_s"] = round(time.monotonic() - began, 1)
    summary["leftover_pids"] = runner.leftovers()
    summary["ok"] = all(s["ok"] for s in summary["scenarios"].values()) and not summary["leftover_pids"]
    return summary


def match_trials(points: dict[str, dict[str, Any]], trials: dict[int, dict[str, Any]],
                 values: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Each configuration's trial, found by the values in its command.json (a parameter a
    trial does not list, being inactive, counts as unset)."""

    found: dict[str, Any] = {}
    for number in sorted(trials):
        have = values.get(number, {})
        for name, point in points.items():
            if name not in found and all(have.get(k) == v for k, v in point.items()):
                found[name] = _trial_summary(trials[number]) | {"trial": number}
                break
    return found


def _s(value: Any) -> str:
    return "-" if value is None else f"{float(value):.1f}s"


def _write_outputs(out: Path, work: Path, summary: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    lines = [f"GPU scenarios ({'dry run, simulator' if summary['dry_run'] else 'real'}): "
             f"{'all as expected' if summary['ok'] else 'NOT all as expected'}, {summary['wall_s']}s"]
    for key, item in summary["scenarios"].items():
        got = item["got"]
        lines.append(f"[{key}] {item['what']}: {'ok' if item['ok'] else 'UNEXPECTED'}")
        lines.append(f"    expected: {item['expected']}")
        lines.append(f"    got: trial {got.get('trial')} {got.get('status')} {got.get('reason') or ''} "
                     f"(phase {got.get('phase')}), startup {_s(got.get('startup_s'))}, compile cache "
                     f"{got.get('compile_cache')}, waited for the GPU {_s(got.get('gpu_wait_s'))}")
        if got.get("message"):
            lines.append(f"    message: {got['message']}")
    if "startup_drop_s" in summary:
        lines.append(f"startup drop on the compile-cache hit: {summary['startup_drop_s']}s")
    lines.append(f"leftover processes killed: {summary['leftover_pids'] or 'none'}")
    for status in sorted(work.glob("*.status.txt")):
        lines += ["", f"== {status.name}", status.read_text()]
    (out / "summary.txt").write_text("\n".join(lines) + "\n")
    with tarfile.open(out / "scenarios.tar.gz", "w:gz") as tar:
        tar.add(work, arcname="gpu-scenarios",
                filter=lambda info: None if f"/{CACHE_DIR}" in info.name or "/fake-bin" in info.name else info)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("study", type=Path, help="the GPU study file (its server section is used)")
    parser.add_argument("--out", type=Path, required=True, help="folder for summary.json/.txt and scenarios.tar.gz")
    parser.add_argument("--only", default="a,b,c,d", help="scenarios to run, e.g. a,d (default: all)")
    parser.add_argument("--work", type=Path, help="keep the studies here (default: a temporary folder)")
    parser.add_argument("--hold-gib", type=float, default=20.0, help="GiB the busy-GPU holder takes")
    parser.add_argument("--python", default=sys.executable, help="interpreter that runs the tuner")
    parser.add_argument("--holder-python", default="python3", help="interpreter with torch for the holder")
    parser.add_argument("--dry-run", action="store_true", help="simulator and a stand-in nvidia-smi")
    args = parser.parse_args(argv)
    selected = {s.strip() for s in args.only.split(",") if s.strip()}
    if not selected or not selected <= {"a", "b", "c", "d"}:
        parser.error(f"--only: choose from a, b, c, d (got {args.only!r})")
    study = yaml.safe_load(args.study.read_text())
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu-scenarios-"))
    work.mkdir(parents=True, exist_ok=True)
    runner = Runner(work, args.python, uuid.uuid4().hex[:16], dry_run=args.dry_run)
    if args.dry_run:
        _fake_nvidia_smi(runner)
    holder_python = sys.executable if args.dry_run else args.holder_python
    try:
        summary = run_scenarios(study, selected, runner, hold_gib=args.hold_gib, holder_python=holder_python)
    finally:
        left = runner.leftovers(grace_s=0.0)
        if left:
            print(f"[gpu_scenarios] killed leftover processes: {left}", file=sys.stderr)
    _write_outputs(args.out, work, summary)
    print((args.out / "summary.txt").read_text().split("\n== ")[0])
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
