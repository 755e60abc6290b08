"""max_rate@slo against the simulator's ground truth, for 10 configurations.

    PYTHONPATH=. .venv/bin/python benchmarks/slo_truth.py [search_spaces/glm5-8xpcie-slo.yaml]
        [--configs 10] [--seed 0]

For each configuration (a seeded sample of the study's space, points that start, apply
and pass the probe):

* **truth**: ``tuner.sim.slo_truth.true_max_rate`` — the rate where the SLO's statistics
  over 8 pooled levels of the study's size reach their bounds, bisected to 0.1 % on the
  simulator's open-loop model;
* **search**: the tuner's own search (``tuner.load.rate_search.RateSearch``, the study's
  ``load.rate_search``), each level measured as a trial measures it: one level of the
  study's size with the sweep's seed stream for that rate, statistics and verdict from the
  tuner's code (``tuner.sim.slo_truth.measure_level``), extended by fresh runs while its
  verdict is within noise, as a trial's; the first rate is the closed-loop request rate at
  the top concurrency level, as in a trial. The answer is the search's own
  (``MaxRateResult.max_rate``; ``answer`` says whether the verdicts or, their bracket
  being within noise, the boundary fit through the levels' margins gave it).

Pass: every search within 5 % of its truth in at most 7 rate levels. Rates are in the
study's clock (the served simulator's, 1/TUNER_SIM_TIME_SCALE times the model's).
Writes benchmarks/results/slo-truth.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner.load.rate_search import RateSearch  # noqa: E402
from tuner.sim.profile import load_profile  # noqa: E402
from tuner.sim.slo_truth import measure_level, model_clock, open_loop_point, true_max_rate  # noqa: E402
from tuner.sim.truth import Evaluator, enumerate_points  # noqa: E402
from tuner.study.study_file import parse_study  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
TOLERANCE = 0.05
MAX_LEVELS = 7


def _key(values: dict[str, Any]) -> str:
    return json.dumps(values, sort_keys=True)


def known_truths(path: str, served: Any, scale: float) -> dict[str, float | None]:
    """The truths (model clock) of an earlier run of the same study, SLO, search range and
    clock: they depend on nothing else (seeded bisection), and cost ~2.5 CPU minutes each."""
    earlier = json.loads(Path(path).read_text(encoding="utf-8"))
    now_search = served.load.rate_search.model_dump()
    same = (earlier.get("study") == served.name
            and earlier.get("slo") == (served.slo.model_dump() if served.slo else None)
            and earlier.get("clock_scale") == scale
            and all(earlier["rate_search"].get(k) == now_search[k] for k in ("low", "high")))
    if not same:
        raise SystemExit(f"--reuse-truths {path}: another study, SLO, search range or clock")
    return {_key(r["values"]): None if r["truth"] is None else r["truth"] * scale
            for r in earlier["rows"]}


def one(ev: Evaluator, spec: Any, values: dict[str, Any], scale: float,
        known: dict[str, float | None] | None = None) -> dict[str, Any] | None:
    point = open_loop_point(ev, values)
    if point is None:
        return None
    search_spec = spec.load.rate_search
    began = time.process_time()
    key = _key(values)
    if known is not None and key in known:
        truth = known[key]
    else:
        truth = true_max_rate(ev, point, spec.slo, low=search_spec.low, high=search_spec.high)
    truth_cpu = time.process_time() - began
    top = max(spec.load.concurrency)
    closed = ev.evaluate(values).levels[top].metrics
    hint = closed["output_tok_s"] / point.workload.output_tokens
    search = RateSearch(search_spec, hint=hint)
    while (rate := search.next_rate()) is not None:
        parts = 1
        verdict = measure_level(ev, point, rate, spec.slo)
        while search.needs_more(verdict.within_noise, parts):
            parts += 1
            verdict = measure_level(ev, point, rate, spec.slo, parts)
        search.observe(rate, verdict.met, verdict.margin, within_noise=verdict.within_noise,
                       parts=parts)
    result = search.result()
    found = result.max_rate
    error = None if truth is None or not found else (found - truth) / truth
    return {
        "values": values,
        "truth": None if truth is None else truth / scale,
        "found": None if found is None else found / scale,
        "status": result.status,
        "answer": result.answer,
        "fit": result.fit,
        "lower_bound": result.lower_bound,
        "error": error,
        "levels": result.levels,
        "parts": sum(p["parts"] for p in result.probes),
        "probes": [{**p, "rate": p["rate"] / scale} for p in result.probes],
        "bracket": [None if b is None else b / scale for b in result.bracket],
        "truth_cpu_s": round(truth_cpu, 2),
        "ok": (truth is None and result.status == "slo_unmet") or (
            error is not None and abs(error) <= TOLERANCE and result.levels <= MAX_LEVELS),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("study", nargs="?", default=str(ROOT / "search_spaces/glm5-8xpcie-slo.yaml"))
    ap.add_argument("--configs", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(RESULTS / "slo-truth.json"))
    ap.add_argument("--reuse-truths", metavar="JSON",
                    help="take each configuration's truth from an earlier run's JSON (same "
                         "study, SLO, search range and clock; checked) instead of bisecting it")
    args = ap.parse_args(argv)
    served = parse_study(Path(args.study).read_text(encoding="utf-8"), args.study)
    spec, scale = model_clock(served)
    known = known_truths(args.reuse_truths, served, scale) if args.reuse_truths else None
    profile = load_profile(str(spec.server.env.get("TUNER_SIM_PROFILE") or "glm5-8xpcie"))
    ev = Evaluator(spec, profile)
    points = enumerate_points(spec)
    random.Random(args.seed).shuffle(points)
    rows: list[dict[str, Any]] = []
    for values in points:
        if len(rows) >= args.configs:
            break
        row = one(ev, spec, values, scale, known)
        if row is None:
            continue
        rows.append(row)
        knobs = " ".join(f"{k}={v}" for k, v in values.items() if v is not None)
        err = "-" if row["error"] is None else f"{row['error']:+.1%}"
        truth = "-" if row["truth"] is None else f"{row['truth']:.3g}"
        found = "-" if row["found"] is None else f"{row['found']:.3g}"
        print(f"{'ok ' if row['ok'] else 'BAD'} truth {truth:>6} found {found:>6} ({err:>6}) "
              f"in {row['levels']} levels ({row['parts']} runs) [{row['status']}]  {knobs}",
              flush=True)
    ok = sum(r["ok"] for r in rows)
    errors = [abs(r["error"]) for r in rows if r["error"] is not None]
    summary = {
        "study": served.name, "slo": served.slo.model_dump() if served.slo else None,
        "rate_search": served.load.rate_search.model_dump(), "clock_scale": scale,
        "configs": len(rows), "ok": ok, "max_abs_error": max(errors, default=None),
        "max_levels": max((r["levels"] for r in rows), default=None),
        "mean_levels": sum(r["levels"] for r in rows) / len(rows) if rows else None,
        "load_average": os.getloadavg()[0], "truths_from": args.reuse_truths, "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")
    print(f"{ok}/{len(rows)} within {TOLERANCE:.0%} in <= {MAX_LEVELS} levels; max |error| "
          f"{summary['max_abs_error']:.1%}, levels max {summary['max_levels']} mean "
          f"{summary['mean_levels']:.1f}; {args.out}")
    return 0 if ok == len(rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
