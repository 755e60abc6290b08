"""What does the correctness probe cost on the real vLLM CPU server?

Target (issue #5): the probe costs at most a tenth of a trial. On this machine a trial of
``search_spaces/smollm2-cpu.yaml`` is about 90 s (startup ~35 s, load ~21 s), so the probe
should stay under ~9 s.

What it does, like a study does it:

1. starts the real server (``.venv-vllm``, SmolLM2-135M, ``--enforce-eager --dtype float32
   --max-model-len 2048``, own process group, always stopped), runs the known-answer probe
   on it and records the reference with the study's probe spec (the ``probe:`` section of
   the study file plus defaults) - the reference job;
2. stops it and starts a fresh server of the same configuration - a trial, whose prefix
   cache is cold as a trial's is - and runs ``run_correctness`` against the reference
   ``--repeats`` times (the first is the realistic figure, later ones run warm);
3. prints ``known_answers_seconds``, ``reference_seconds`` and the total per run, the
   verdicts, and writes them to ``benchmarks/results/probe_cost-<time>.json``.

The trial is the reference configuration itself, so every run must pass: a failure here
is a false alarm of the probe. Figures from a machine shared with other work are noisy;
say so when quoting them.

Usage::

    PYTHONPATH=. .venv/bin/python benchmarks/probe_cost.py [--spec FILE] [--repeats N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from vllm_server import SERVED, VllmServer, available  # noqa: E402

from tuner.adapters.probe_client import load_probe_items, run_probe  # noqa: E402
from tuner.adapters.reference_client import (  # noqa: E402
    load_reference_sources,
    record_reference,
    run_correctness,
)
from tuner.core.probe_spec import ProbeSpec  # noqa: E402
from tuner.core.reference import with_reference_accuracy  # noqa: E402


def _spec(path: Path) -> ProbeSpec:
    raw = yaml.safe_load(path.read_text()) or {}
    return ProbeSpec.model_validate(raw.get("probe") or {})


async def _record(url: str, spec: ProbeSpec) -> tuple[Any, dict[str, Any]]:
    items = load_probe_items(spec)
    sources = load_reference_sources(spec, items=items)
    began = time.perf_counter()
    known = await run_probe(url, SERVED, spec, items=items)
    known_s = time.perf_counter() - began
    reference = await record_reference(url, SERVED, spec, sources=sources, known_answers=known)
    return reference, {
        "reference_known_answers_s": round(known_s, 2),
        "reference_known_accuracy": known.accuracy,
        "record_s": round(reference.record_seconds or 0.0, 2),
        "prompts": len(reference.prompts),
    }


async def _trials(url: str, spec: ProbeSpec, reference: Any, repeats: int) -> list[dict[str, Any]]:
    trial_spec = with_reference_accuracy(spec, reference)
    items = load_probe_items(trial_spec)
    runs = []
    for n in range(repeats):
        result = await run_correctness(url, SERVED, trial_spec, reference=reference, items=items)
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
                for level in trial_spec.concurrency
                for recs in [[r for r in result.known_answers.records if r.concurrency == level]]
            },
            "reference_levels": [
                {
                    "concurrency": lvl.concurrency,
                    "exact": lvl.exact,
                    "close": lvl.close,
                    "prompts": lvl.prompts,
                    "forced_top1": lvl.forced_top1,
                }
                for lvl in (result.reference.levels if result.reference else [])
            ],
        }
        print(json.dumps(run), flush=True)
        runs.append(run)
    return runs


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
    spec = _spec(args.spec)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    logs = ROOT / "benchmarks" / "results" / f"probe_cost-{stamp}"
    with VllmServer(logs / "reference-server.log") as server:
        reference, recorded = asyncio.run(_record(server.url, spec))
    print(json.dumps({"reference": recorded}), flush=True)
    with VllmServer(logs / "trial-server.log") as server:
        runs = asyncio.run(_trials(server.url, spec, reference, args.repeats))
    out = {
        "label": args.label,
        "spec": str(args.spec),
        "when": stamp,
        "note": "2-core machine shared with other work: figures are noisy",
        "reference": recorded,
        "runs": runs,
    }
    path = ROOT / "benchmarks" / "results" / f"probe_cost-{stamp}.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"written {path}")
    return 0 if all(r["passed"] for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
