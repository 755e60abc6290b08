"""Does the bank probe stay quiet on correct real servers, and what does numerics look like?

Issue 14's real-CPU figures, on the vLLM CPU build with SmolLM2-135M
(``search_spaces/smollm2-cpu.yaml``'s probe section, fitted to its load and max_model_len
as ``tuner run`` fits it):

1. for each dtype in ``--dtypes`` (float32, bfloat16): start an eager server of that dtype,
   record the reference exactly as a study does (the bank's pool batched, the reference's
   own known answers, then its self-check: a trial's probe against itself, batch 1 vs N
   under the numerics rule) and say whether it is trusted;
2. on the same server, as a trial of its own configuration, run ``--runs`` trial probes,
   each with its own sample seed (1..runs): every failure is a false alarm;
3. with ``--cross N``: N probes of this server against the references recorded before it
   (bf16 trials in a float32 study), to show what the rule says about them;
4. prints per run the verdict, the near-tie divergences and their largest gap (the
   reference-vs-reference variation the thresholds are set from), corrupt positions, the
   lowest top-k overlap, the probe's seconds and coverage; writes
   ``benchmarks/results/probe_false_alarms-<time>.json``.

Run it under ``flock /tmp/realvllm.lock`` (one real server at a time on a shared machine)::

    PYTHONPATH=. .venv/bin/python benchmarks/probe_false_alarms.py --runs 20 --dtypes float32 bfloat16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import vllm_server  # noqa: E402
from vllm_server import SERVED, VllmServer, available  # noqa: E402

from tuner.probe.client import load_probe_items  # noqa: E402
from tuner.probe.recording import load_reference_sources, record_reference  # noqa: E402
from tuner.probe.spec import ProbeSpec, fit_to_study  # noqa: E402
from tuner.probe.trial import reference_known_answers, run_trial_probe  # noqa: E402
from tuner.probe.verdict import CorrectnessResult, validate_reference  # noqa: E402


def _spec(path: Path) -> ProbeSpec:
    study = yaml.safe_load(path.read_text())
    spec = ProbeSpec.model_validate(study.get("probe") or {})
    levels = (study.get("load") or {}).get("concurrency") or [1]
    limit = ((study.get("server") or {}).get("flags") or {}).get("max_model_len")
    return fit_to_study(spec, top_concurrency=max(levels), max_model_len=limit)


def _figures(result: CorrectnessResult) -> dict[str, Any]:
    ref = result.reference
    rows = ref.scores if ref else []
    near = [r.gap for r in rows if r.verdict == "close" and r.gap is not None]
    overlaps = [lvl.top_k_overlap for lvl in (ref.levels if ref else []) if lvl.top_k_overlap]
    return {
        "passed": result.passed,
        "reason": result.reason,
        "probe_s": round(result.probe_seconds or 0.0, 2),
        "near_ties": len(near),
        "near_tie_gap_max": max(near, default=None),
        "corrupt": sum(lvl.corrupt for lvl in ref.levels) if ref else None,
        "forced_worst_gap": max((r.forced_worst_gap or 0.0 for r in rows), default=None),
        "overlap_min": min(overlaps, default=None),
        "kl_median_max": max(
            (lvl.kl_median for lvl in (ref.levels if ref else []) if lvl.kl_median is not None),
            default=None,
        ),
        "levels": [lvl.model_dump() for lvl in (ref.levels if ref else [])],
        "far": [r.detail for r in rows if r.verdict == "far"][:5],
        "known_accuracy": result.known_answers.accuracy,
        "coverage": result.coverage.model_dump() if result.coverage else None,
    }


def _server(dtype: str) -> VllmServer:
    log = Path(tempfile.gettempdir()) / f"probe_false_alarms-{dtype}-{os.getpid()}.log"
    return VllmServer(log, ["--dtype", dtype])


async def _record(url: str, spec: ProbeSpec) -> tuple[Any, dict[str, Any]]:
    items = load_probe_items(spec)
    sources = load_reference_sources(spec, items=items)
    began = time.perf_counter()
    reference = await record_reference(url, SERVED, spec, sources=sources)
    known = reference_known_answers(spec, items, reference)
    reference = reference.model_copy(update={"known_answers_accuracy": known.accuracy})
    check = await run_trial_probe(url, SERVED, spec, reference=reference, items=items)
    verdict = validate_reference(known, reference=reference, self_check=check)
    return reference, {
        "record_s": round(time.perf_counter() - began, 1),
        "prompts": len(reference.prompts),
        "known_accuracy": known.accuracy,
        "self_check": _figures(check),
        "trusted": verdict is None,
        "why_not": verdict,
    }


def _runs(url: str, spec: ProbeSpec, reference: Any, runs: int, label: str) -> list[dict]:
    out = []
    for seed in range(1, runs + 1):
        result = asyncio.run(
            run_trial_probe(url, SERVED, spec, reference=reference, sample_seed=seed)
        )
        fig = _figures(result)
        out.append(fig)
        print(
            f"  {label} seed {seed:2d}: {'pass' if fig['passed'] else 'FAIL'} "
            f"{fig['probe_s']:5.1f}s near ties {fig['near_ties']:2d} "
            f"(max gap {fig['near_tie_gap_max'] or 0:.3f}) corrupt {fig['corrupt']} "
            f"overlap>={fig['overlap_min'] or 0:.2f} kl<={fig['kl_median_max'] or 0:.4f}"
            + ("" if fig["passed"] else f"  {fig['reason'][:200]}"),
            flush=True,
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", type=Path, default=ROOT / "search_spaces" / "smollm2-cpu.yaml")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--cross", type=int, default=0, help="runs of the other dtype's server")
    args = parser.parse_args()
    missing = available()
    if missing:
        print(f"skipped: {missing}")
        return 0
    vllm_server.BASE_FLAGS = ["--enforce-eager", "--max-model-len", "2048"]
    spec = _spec(args.spec)
    out: dict[str, Any] = {"spec": str(args.spec), "runs": args.runs,
                           "load_before": os.getloadavg()[0], "dtypes": {}}
    references: dict[str, Any] = {}
    for dtype in args.dtypes:
        print(f"== {dtype} server", flush=True)
        with _server(dtype) as server:
            reference, info = asyncio.run(_record(server.url, spec))
            references[dtype] = reference
            print(f"  recorded {info['prompts']} prompts in {info['record_s']}s, known "
                  f"{info['known_accuracy']:.2f}, self-check: {info['self_check']['reason'][:160]}"
                  f" -> trusted: {info['trusted']}", flush=True)
            # The same server as a trial of its own configuration: every failure is a false
            # alarm (a fresh server per run would add only its startup to the wait).
            info["runs"] = _runs(server.url, spec, reference, args.runs, dtype)
            for other, other_ref in references.items():
                if other != dtype and args.cross:
                    info[f"vs_{other}_reference"] = _runs(
                        server.url, spec, other_ref, args.cross, f"{dtype} vs {other} reference")
        alarms = sum(not r["passed"] for r in info["runs"])
        print(f"  {dtype}: {alarms} false alarm(s) in {args.runs} runs; probe "
              f"{min(r['probe_s'] for r in info['runs']):.1f}-"
              f"{max(r['probe_s'] for r in info['runs']):.1f}s", flush=True)
        out["dtypes"][dtype] = info
    out["load_after"] = os.getloadavg()[0]
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = ROOT / "benchmarks" / "results" / f"probe_false_alarms-{stamp}.json"
    path.write_text(json.dumps(out, indent=1, default=str))
    print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
