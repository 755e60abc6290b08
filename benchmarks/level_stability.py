"""How much does one configuration's measurement move between fresh server starts, with
levels sized by request count (before issue 15) and by time and steady state (after)?

Target (issue 15): with the new defaults, the coefficient of variation across fresh
starts of output tok/s is <= 2 % at c=1 and <= 3 % at c=32 on an H200 (SmolLM2-135M,
FULL_AND_PIECEWISE, 128/128 tokens), and of median TPOT <= 3 %; <= 5 % at every level of
``search_spaces/smollm2-cpu.yaml`` on the CPU server.

What it does: starts the server ``--starts`` times, each time fresh (its own process group,
stopped before the next start), and on every start measures the same configuration twice
with the tuner's own load generator (:func:`tuner.load.sweep.run_sweep`): once with the
*before* load settings (``sizing: requests``, 3 requests per stream, warm-up max(2C, 4):
the defaults before issue 15, or the study's own request-count settings) and once with
the *after* settings (``sizing: steady`` with its defaults, or ``--after`` overrides). The
arm that runs first alternates from start to start, so a server's first-sweep warm-up
effects fall on both arms alike. It prints, per arm and level, each start's output tok/s
and median TPOT, their mean and CV (sample standard deviation / mean), and each arm's load
time; and writes all of it to ``--out`` as JSON (after every start). ``--repeats N`` runs the
after arm N times per start, so the spread within one server stands beside the spread
between starts; ``--server-cpus`` / ``--client-cpus`` pin the server and the load generator;
``--merge`` joins the JSON of several runs of one configuration.

Needs only the tuner package with httpx, pydantic and pyyaml (no Ray, no internet).

Usage, a study file (its server command, model, flags and env; the baseline's parameter
values unless ``--values``; its load section's levels and workload)::

    flock /tmp/realvllm.lock .venv/bin/python benchmarks/level_stability.py \\
        --study search_spaces/smollm2-cpu.yaml --starts 3 \\
        --out benchmarks/results/level_stability-cpu.json

or a server command after ``--`` (``{port}`` is replaced by a free port)::

    python benchmarks/level_stability.py --starts 5 --levels 1 32 --served-model-name smol \\
        --out level_stability-h200.json -- python3 -m vllm.entrypoints.openai.api_server \\
        --model /models/smollm2 --served-model-name smol --port {port} \\
        --gpu-memory-utilization 0.5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tuner.adapters.launcher import ServerProcess  # noqa: E402
from tuner.load.load_spec import LoadSpec, WorkloadClass, WorkloadSpec  # noqa: E402
from tuner.load.results import SweepResult  # noqa: E402
from tuner.load.sweep import run_sweep  # noqa: E402

ARMS = ("before", "after")
_REQUEST_FIELDS = ("requests_per_level", "requests_per_stream", "warmup_requests")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def parse_pairs(pairs: list[str]) -> dict[str, Any]:
    """``key=value`` words, values read as YAML scalars (``3``, ``1.5``, ``true``, ``NONE``)."""
    import yaml

    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"expected key=value, got {pair!r}")
        out[key] = yaml.safe_load(value)
    return out


def arm_specs(base: LoadSpec, levels: list[int], before: dict[str, Any],
              after: dict[str, Any]) -> dict[str, LoadSpec]:
    """The two load settings compared, on the same levels and workload."""
    common = base.model_dump(exclude={"sizing", "min_window_s", "stability_subwindows",
                                      "stability_max_ratio", *_REQUEST_FIELDS})
    common["concurrency"] = levels
    common["request_rates"] = []
    common["client_processes"] = 1
    old = {k: v for k, v in base.model_dump().items() if k in _REQUEST_FIELDS}
    if base.sizing != "requests":
        old = {"requests_per_stream": 3}          # the defaults before issue 15
    return {
        "before": LoadSpec.model_validate({**common, **old, "sizing": "requests", **before}),
        "after": LoadSpec.model_validate({**common, "sizing": "steady", **after}),
    }


def level_figures(result: SweepResult) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for lv in result.levels:
        flat = lv.metrics.flat()
        out[str(lv.concurrency)] = {
            "output_tok_s": flat["output_tok_s"],
            "output_tok_s_ci95": _num(flat.get("output_tok_s.ci95")),
            "tpot_ms_p50": _num(flat["tpot_ms.p50"]),
            "completed": lv.metrics.completed,
            "window_s": lv.metrics.window_s,
            "warmup_s": lv.warmup.duration_s,
            "stability_ratio": lv.metrics.stability_ratio,
            "unstable": lv.metrics.unstable,
            "stop_reason": lv.metrics.stop_reason,
            "failed": lv.metrics.failed,
            # The load generator's own lateness (tuner/load/loop_lag.py) against the TTFT it
            # would distort: a client-bound level measures the client, not the server.
            "ttft_ms_p50": _num(flat["ttft_ms.p50"]),
            "client_lag_ms_p99": _num(flat.get("client_lag_ms.p99")),
            "client_bound": lv.metrics.client_bound,
            "burst_requests": lv.metrics.burst_requests,
        }
    return out


def _num(x: Any) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def spread(values: list[float]) -> dict[str, Any]:
    """Mean, CV (sample std / mean) and the values themselves."""
    xs = [v for v in values if v is not None]
    mean = statistics.fmean(xs) if xs else None
    cv = statistics.stdev(xs) / mean if len(xs) > 1 and mean else None
    return {"values": xs, "mean": mean, "cv": cv}


def summarize(starts: list[dict[str, Any]], levels: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for arm in ARMS:
        per_level = {}
        for c in levels:
            rows = [s["arms"][arm]["levels"].get(str(c)) for s in starts]
            rows = [r for r in rows if r is not None]
            per_level[str(c)] = {
                "output_tok_s": spread([r["output_tok_s"] for r in rows]),
                "tpot_ms_p50": spread([r["tpot_ms_p50"] for r in rows]),
                "unstable_starts": sum(1 for r in rows if r["unstable"]),
                "client_bound_starts": sum(1 for r in rows if r.get("client_bound")),
                "client_lag_ms_p99": spread([r.get("client_lag_ms_p99") for r in rows]),
            }
        out[arm] = {"levels": per_level,
                    "load_s": spread([s["arms"][arm]["duration_s"] for s in starts])}
    b, a = out["before"]["load_s"]["mean"], out["after"]["load_s"]["mean"]
    out["load_time_ratio"] = a / b if a and b else None
    out["after_within_start_cv"] = {key: within_start(starts, levels, key)
                                    for key in ("output_tok_s", "tpot_ms_p50")}
    return out


def parse_cpus(text: str | None) -> set[int] | None:
    """A CPU list as taskset and sysfs write it (``0-6,8``); None for none."""
    if not text:
        return None
    cpus: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def gpu_snapshot() -> str | None:
    """SM clock, temperature and power of the GPUs now (a fast GPU's clocks move between
    starts without anyone touching them); None without nvidia-smi."""
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    done = subprocess.run([smi, "--query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw",
                           "--format=csv,noheader"], capture_output=True, text=True, timeout=30,
                          check=False)
    return done.stdout.strip() or None


async def one_start(i: int, argv: list[str], env: dict[str, str], port: int, served: str,
                    specs: dict[str, LoadSpec], ignore_eos: bool, log_dir: Path,
                    startup_timeout: float, repeats: int = 1,
                    server_cpus: set[int] | None = None,
                    client_cpus: set[int] | None = None) -> dict[str, Any]:
    server = ServerProcess(argv, env, log_dir / f"server-{i}.log", host="127.0.0.1",
                           port=port, served_model_name=served)
    began = time.monotonic()
    # The server inherits the affinity this thread has when it starts it; the load generator
    # (this thread's event loop) then moves to its own CPUs.
    if server_cpus:
        os.sched_setaffinity(0, server_cpus)
    server.start()
    if client_cpus:
        os.sched_setaffinity(0, client_cpus)
    try:
        await server.wait_ready(startup_timeout)
        startup_s = time.monotonic() - began
        order = list(ARMS) if i % 2 == 0 else list(reversed(ARMS))
        # Extra runs of the after arm on the same server: their spread is the within-start
        # noise, to set beside the spread between starts.
        order += ["after"] * (repeats - 1)
        arms: dict[str, Any] = {}
        for n, arm in enumerate(order):
            result = await run_sweep(server.base_url, served, specs[arm], ignore_eos=ignore_eos)
            record = {"duration_s": result.duration_s, "levels": level_figures(result),
                      "warnings": result.warnings, "gpu": gpu_snapshot()}
            if arm in arms:
                arms.setdefault("after_repeats", []).append(record)
            else:
                arms[arm] = record
            print(f"  start {i + 1} {arm + ('' if n < 2 else f'#{n}'):6s} {result.duration_s:6.1f}s  " + "  ".join(
                f"c={c}: {lv['output_tok_s']:8.1f} tok/s tpot p50 {lv['tpot_ms_p50'] or 0:7.2f} ms"
                + f" lag p99 {lv['client_lag_ms_p99'] or 0:.2f} ms (TTFT p50 {lv['ttft_ms_p50'] or 0:.1f})"
                + (" CLIENT-BOUND" if lv["client_bound"] else "")
                + (" UNSTABLE" if lv["unstable"] else "")
                for c, lv in record["levels"].items()), flush=True)
    finally:
        await server.stop(30.0)
    return {"start": i, "startup_s": startup_s, "order": order, "arms": arms}


def within_start(starts: list[dict[str, Any]], levels: list[int], key: str) -> dict[str, Any]:
    """Pooled within-start CV of the after arm (sqrt of the mean per-start sample variance
    over the grand mean) from starts that ran it more than once."""
    out: dict[str, Any] = {}
    for c in levels:
        variances, values = [], []
        for s in starts:
            runs = [s["arms"]["after"], *s["arms"].get("after_repeats", [])]
            xs = [r["levels"][str(c)][key] for r in runs if str(c) in r["levels"]]
            xs = [x for x in xs if x is not None]
            if len(xs) > 1:
                variances.append(statistics.variance(xs))
                values.extend(xs)
        out[str(c)] = (math.sqrt(statistics.fmean(variances)) / statistics.fmean(values)
                       if variances else None)
    return out


def study_command(path: str, values: dict[str, Any], port: int
                  ) -> tuple[list[str], dict[str, str], str, LoadSpec, bool]:
    """argv, env, served name, load section and ignore_eos of a study's configuration."""
    from tuner.commands.run import load_spec_file
    from tuner.study import space

    spec = load_spec_file(path)
    chosen = {**space.baseline_values(spec), **values}
    command = space.trial_command(spec, chosen, port=port)
    argv, env = list(command.argv), dict(command.launch_env)
    speculative = any(str(k).startswith("speculative_config") and v is not None
                      for k, v in space.settings_for(spec, chosen).items())
    served = spec.server.served_model_name or spec.server.model
    return (argv, dict(env), served, spec.load,
            spec.load.workload.resolve_ignore_eos(speculative=speculative))


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == ["--merge"]:
        return merge(args_in[1:])
    command: list[str] = []
    if "--" in args_in:
        cut = args_in.index("--")
        args_in, command = args_in[:cut], args_in[cut + 1:]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--study", help="study file: server command, baseline values, load section")
    p.add_argument("--values", nargs="*", default=[], help="parameter=value (with --study)")
    p.add_argument("--levels", nargs="*", type=int, help="concurrency levels")
    p.add_argument("--starts", type=int, default=5, help="fresh server starts")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--output-tokens", type=int, default=128)
    p.add_argument("--served-model-name", help="with a command after --")
    p.add_argument("--before", nargs="*", default=[], help="load.key=value for the old arm")
    p.add_argument("--after", nargs="*", default=[], help="load.key=value for the new arm")
    p.add_argument("--startup-timeout", type=float, default=900.0)
    p.add_argument("--repeats", type=int, default=1,
                   help="runs of the after arm per start (more than 1: within-start spread)")
    p.add_argument("--server-cpus", help="CPU list the server runs on (e.g. 0-13)")
    p.add_argument("--client-cpus", help="CPU list the load generator runs on (e.g. 15)")
    p.add_argument("--out", required=True, help="JSON file to write")
    args = p.parse_args(args_in)
    if bool(args.study) == bool(command):
        p.error("give either --study or a server command after --")
    port = free_port()
    if args.study:
        argv_, env, served, base, ignore_eos = study_command(
            args.study, parse_pairs(args.values), port)
    else:
        if not args.served_model_name:
            p.error("--served-model-name is needed with a server command")
        argv_ = [w.replace("{port}", str(port)) for w in command]
        env, served, ignore_eos = {}, args.served_model_name, True
        base = LoadSpec(workload=WorkloadSpec(classes=(WorkloadClass(
            name="chat", kind="open_ended", prompt_tokens=args.prompt_tokens,
            output_tokens=args.output_tokens),)))
    levels = args.levels or list(base.concurrency if args.study else (1, 32))
    specs = arm_specs(base, levels, parse_pairs(args.before), parse_pairs(args.after))
    full_env = {**os.environ, **env}
    load_before = os.getloadavg()[0]
    print(f"{args.starts} fresh starts of: {' '.join(argv_)}", flush=True)
    server_cpus, client_cpus = parse_cpus(args.server_cpus), parse_cpus(args.client_cpus)
    starts: list[dict[str, Any]] = []

    def write() -> dict[str, Any]:
        # After every start, so a run cut short by its time limit keeps what it finished.
        summary = summarize(starts, levels)
        report = {
            "argv": argv_, "env": env, "study": args.study, "levels": levels,
            "ignore_eos": ignore_eos, "repeats": args.repeats,
            "server_cpus": sorted(server_cpus or []), "client_cpus": sorted(client_cpus or []),
            "specs": {arm: s.model_dump(mode="json") for arm, s in specs.items()},
            "starts": starts, "summary": summary,
            "machine": {"host": platform.node(), "cpus": os.cpu_count(),
                        "python": platform.python_version(),
                        "loadavg_1m_before": load_before, "loadavg_1m_after": os.getloadavg()[0]},
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        return summary

    with tempfile.TemporaryDirectory(prefix="level-stability-") as tmp:
        for i in range(args.starts):
            starts.append(asyncio.run(one_start(
                i, argv_, full_env, port, served, specs, ignore_eos, Path(tmp),
                args.startup_timeout, args.repeats, server_cpus, client_cpus)))
            summary = write()
    print_summary(summary, levels)
    print(f"written to {args.out}")
    return 0


def merge(words: list[str]) -> int:
    """``--merge A.json B.json ... --out M.json``: the starts of several runs of the same
    configuration and settings as one run (a lease cut into calls, or two set-ups run
    start by start in turn so that a cut-short run still has both)."""
    if "--out" not in words or words.index("--out") != len(words) - 2:
        raise SystemExit("usage: level_stability.py --merge A.json [B.json ...] --out M.json")
    parts = [json.loads(Path(w).read_text()) for w in words[:-2]]
    if not parts:
        raise SystemExit("--merge needs at least one JSON file")
    first = parts[0]
    for path, part in zip(words[:-2], parts):
        for key in ("argv", "levels", "specs", "repeats", "server_cpus", "client_cpus"):
            # The port is chosen per run; everything else must be the same configuration.
            a, b = part.get(key), first.get(key)
            if key == "argv":
                a, b = [w for w in a if not w.isdigit()], [w for w in b if not w.isdigit()]
            if a != b:
                raise SystemExit(f"{path}: {key} differs from {words[0]}'s; not one configuration")
    starts = [dict(s, start=i) for i, s in enumerate(st for part in parts for st in part["starts"])]
    levels = first["levels"]
    summary = summarize(starts, levels)
    merged = {**first, "starts": starts, "summary": summary, "merged_from": words[:-2]}
    Path(words[-1]).write_text(json.dumps(merged, indent=2) + "\n", encoding="utf-8")
    print(f"{len(starts)} starts from {len(parts)} runs")
    print_summary(summary, levels)
    return 0


def print_summary(summary: dict[str, Any], levels: list[int]) -> None:
    def pct(x: float | None) -> str:
        return "   n/a" if x is None else f"{100 * x:5.1f}%"

    print("\narm     level   output tok/s (mean, CV)   median TPOT ms (mean, CV)   unstable"
          "   client-bound (lag p99 ms, mean)")
    for arm in ARMS:
        for c in levels:
            lv = summary[arm]["levels"][str(c)]
            o, t = lv["output_tok_s"], lv["tpot_ms_p50"]
            print(f"{arm:7s} c={c:<5d} {o['mean'] or 0:10.1f}  {pct(o['cv'])}      "
                  f"{t['mean'] or 0:10.2f}  {pct(t['cv'])}        {lv['unstable_starts']}"
                  f"          {lv.get('client_bound_starts', 0)} "
                  f"({(lv.get('client_lag_ms_p99') or {}).get('mean') or 0:.2f})")
    ls = summary
    print(f"load time per start: before {ls['before']['load_s']['mean']:.1f}s, after "
          f"{ls['after']['load_s']['mean']:.1f}s (x{ls['load_time_ratio'] or 0:.2f})")
    within = summary.get("after_within_start_cv", {}).get("output_tok_s", {})
    if any(v is not None for v in within.values()):
        print("after arm, within one start (repeats), output tok/s CV: " + ", ".join(
            f"c={c} {pct(v)}" for c, v in within.items()))


if __name__ == "__main__":
    sys.exit(main())
