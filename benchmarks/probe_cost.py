"""What does the correctness probe cost on the real vLLM CPU server, and what share of a
trial is that?

Target (issue #5): the probe costs under a tenth of a trial's time on the CPU server.

What it does, like a study does it (``search_spaces/smollm2-cpu.yaml`` by default; its
``probe:`` and ``load:`` sections, parsed as ``tuner run`` parses them):

1. starts the real server (``.venv-vllm``, SmolLM2-135M, ``--enforce-eager --dtype float32
   --max-model-len 2048`` - the study's baseline and reference configuration; own process
   group, always stopped) and records the reference from it as the reference job does
   (the bank's pool, the reference's own known answers judged from its record);
2. stops it and starts a fresh server of the same configuration - a trial, whose prefix
   cache is cold as a trial's is - timing its startup (process start to ``/v1/models``
   answering), runs a trial's probe (``run_trial_probe``, the seeded bank plan with the
   study's ``probe:`` section fitted to it as a study fits it) against the reference once
   (the realistic figure), then the study's load sweep with the tuner's own load generator (warm-up and
   every concurrency level, as a trial runs it); then ``--repeats`` - 1 more probe runs
   (warm prefix cache: a lower bound, for the noise);
3. prints per probe run the known-answer and reference seconds and the verdict, then the
   trial: ``startup_s + probe_s + load_s = trial_s`` and the probe's share, all measured in
   this run; and the same share against the real trials stored under
   ``results/examples/<study>/trials`` (their startup and load, this run's probe), which
   include what a trial also does (verification, metrics scraping, stopping);
4. writes everything to ``benchmarks/results/probe_cost-<time>.json``, with the 1-minute
   load average before and after (the machine is shared: say so when quoting figures).

The trial is the reference configuration itself, so every probe run must pass: a failure
here is a false alarm of the probe.

Usage::

    PYTHONPATH=. .venv/bin/python benchmarks/probe_cost.py [--spec FILE] [--repeats N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from vllm_server import SERVED, VllmServer, available  # noqa: E402

from tuner.engine.referencing import study_probe  # noqa: E402
from tuner.load.sweep import run_sweep  # noqa: E402
from tuner.probe.client import load_probe_items  # noqa: E402
from tuner.probe.recording import load_reference_sources, record_reference  # noqa: E402
from tuner.probe.spec import ProbeSpec  # noqa: E402
from tuner.probe.trial import reference_known_answers, run_trial_probe  # noqa: E402
from tuner.probe.verdict import with_reference_accuracy  # noqa: E402
from tuner.study.spec import StudySpec  # noqa: E402
from tuner.study.study_file import parse_study  # noqa: E402


def _load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


async def _record(url: str, spec: ProbeSpec) -> tuple[Any, dict[str, Any]]:
    items = load_probe_items(spec)
    sources = load_reference_sources(spec, items=items)
    reference = await record_reference(url, SERVED, spec, sources=sources)
    known = reference_known_answers(spec, items, reference)
    reference = reference.model_copy(update={"known_answers_accuracy": known.accuracy})
    return reference, {
        "reference_known_accuracy": known.accuracy,
        "record_s": round(reference.record_seconds or 0.0, 2),
        "prompts": len(reference.prompts),
    }


async def _probe(url: str, spec: ProbeSpec, reference: Any, n: int) -> dict[str, Any]:
    result = await run_trial_probe(url, SERVED, spec, reference=reference, sample_seed=n)
    run = {
        "run": n,
        "known_answers_s": round(result.known_answers_seconds or 0.0, 2),
        "reference_s": None
        if result.reference_seconds is None
        else round(result.reference_seconds, 2),
        "probe_s": round(result.probe_seconds or 0.0, 2),
        "passed": result.passed,
        "reason": result.reason,
        # Where the time goes: per level, requests and generated tokens of each layer.
        "known_levels": {
            str(level): {
                "requests": len(recs),
                "completion_tokens": sum(r.completion_tokens or 0 for r in recs),
                "latency_sum_s": round(sum(r.latency_s or 0.0 for r in recs), 2),
            }
            # The levels the trial's plan ran (its decode batch sizes).
            for level in sorted({r.concurrency for r in result.known_answers.records})
            for recs in [[r for r in result.known_answers.records if r.concurrency == level]]
        },
        "reference_levels": [
            {
                "concurrency": lvl.concurrency,
                "prompts": lvl.prompts,
                "exact": lvl.exact,
                "close": lvl.close,
                "forced_positions": lvl.forced_positions,
                "forced_top1": lvl.forced_top1,
                "forced_close": lvl.forced_close,
            }
            for lvl in (result.reference.levels if result.reference else [])
        ],
    }
    print(json.dumps(run), flush=True)
    return run


async def _trial(
    url: str, study: StudySpec, spec: ProbeSpec, reference: Any, repeats: int
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    runs = [await _probe(url, spec, reference, 0)]
    load = study.load
    began = time.monotonic()
    # The baseline runs no drafter, so 'auto' resolves as the orchestrator resolves it.
    sweep = await run_sweep(
        url, SERVED, load, ignore_eos=load.workload.resolve_ignore_eos(speculative=False)
    )
    load_s = time.monotonic() - began
    levels = {
        str(level.concurrency): {
            "output_tok_s": round(level.metrics.flat().get("output_tok_s", float("nan")), 2),
            "requests": len(level.records),
        }
        for level in sweep.levels
    }
    print(json.dumps({"load_s": round(load_s, 2), "levels": levels}), flush=True)
    for n in range(1, repeats):
        runs.append(await _probe(url, spec, reference, n))
    return runs, {"load_s": round(load_s, 2), "levels": levels}


def _stored_trials(name: str) -> list[dict[str, Any]]:
    """startup_s, probe_s, load_s, trial_s of the completed real trials kept for the study."""
    out = []
    for path in sorted((ROOT / "results" / "examples" / name / "trials").glob("*/outcome.json")):
        data = json.loads(path.read_text())
        if all(isinstance(data.get(k), (int, float)) for k in ("startup_s", "probe_s", "trial_s")):
            out.append({"trial": path.parent.name,
                        **{k: round(data[k], 2) for k in ("startup_s", "probe_s", "trial_s")}})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", type=Path, default=ROOT / "search_spaces" / "smollm2-cpu.yaml")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--label", default="", help="stored with the figures (e.g. before/after)")
    args = parser.parse_args()
    missing = available()
    if missing:
        print(f"skipped: {missing}")
        return 0
    study = parse_study(args.spec.read_text(), str(args.spec))
    spec = study_probe(study, study.probe)
    load_before = _load_average()
    print(f"load average before: {load_before}", flush=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    logs = ROOT / "benchmarks" / "results" / f"probe_cost-{stamp}"
    with VllmServer(logs / "reference-server.log") as server:
        reference, recorded = asyncio.run(_record(server.url, spec))
    print(json.dumps({"reference": recorded}), flush=True)
    trial_spec = with_reference_accuracy(spec, reference)
    began = time.monotonic()
    with VllmServer(logs / "trial-server.log") as server:
        startup_s = time.monotonic() - began
        runs, load = asyncio.run(_trial(server.url, study, trial_spec, reference, args.repeats))
    load_after = _load_average()
    probe_s = runs[0]["probe_s"]
    trial_s = startup_s + probe_s + load["load_s"]
    measured = {
        "startup_s": round(startup_s, 2),
        "probe_s": probe_s,
        "load_s": load["load_s"],
        "trial_s": round(trial_s, 2),
        "probe_share": round(probe_s / trial_s, 4),
    }
    print(
        f"trial (measured here): startup {startup_s:.1f} s + probe {probe_s:.1f} s + load "
        f"{load['load_s']:.1f} s = {trial_s:.1f} s; probe share {probe_s / trial_s:.1%}"
    )
    stored = _stored_trials(study.name)
    against_stored = None
    if stored:
        # A stored trial's time without its (older, costlier) probe, plus this run's probe.
        rest = statistics.median(t["trial_s"] - t["probe_s"] for t in stored)
        against_stored = {
            "trials": stored,
            "median_trial_without_probe_s": round(rest, 2),
            "probe_share": round(probe_s / (rest + probe_s), 4),
        }
        print(
            f"against the {len(stored)} stored real trials of {study.name} (median "
            f"{rest:.1f} s without their probe): probe share {probe_s / (rest + probe_s):.1%}"
        )
    print(f"load average after: {load_after}")
    out = {
        "label": args.label,
        "spec": str(args.spec),
        "when": stamp,
        "note": "2-core machine shared with other work: figures are noisy",
        "load_average_1_5_15": {"before": load_before, "after": load_after},
        "reference": recorded,
        "trial": measured,
        "load": load,
        "against_stored_trials": against_stored,
        "runs": runs,
    }
    path = ROOT / "benchmarks" / "results" / f"probe_cost-{stamp}.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"written {path}")
    return 0 if all(r["passed"] for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
