"""How often does the correctness probe catch prompt-dependent corruption on the simulator?

Issue 14's simulator fault modes (``TUNER_SIM_FAULTS``):

* ``garbage_when_prompt_in`` - corrupt only prompts whose length is inside one bucket;
* ``garbage_when_batch_eq`` - corrupt only while the decode batch holds exactly N requests
  (here the trial's top load concurrency, 16, which the retired template probe's [1, 8] never ran);
* ``garbage_for_wording`` - corrupt only one wording of a fact ("Which city is the capital
  of ...?"; the retired template asked "What is the capital of X? Answer with one word.");
* ``garbage_on_turn`` - corrupt only the second (and later) turn of a chat.

For each, and for a correct server, the bank probe runs ``--runs`` times (sample seed
1..runs) against a reference recorded once from an eager simulator, exactly as a study
records it. Prints the catch count per fault and the false alarms; writes
``benchmarks/results/probe_faults_sim-bank-<time>.json``. (The template probe it was compared
with, ``probe_faults_sim-template-*.json``, was retired by issue 37; run this script on a
checkout of an earlier commit, e.g. 0d466fd with ``--mode template``, to measure it again.)

Usage::

    PYTHONPATH=. .venv/bin/python benchmarks/probe_faults_sim.py --runs 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.test_probe_sim import MODEL, SimProc  # noqa: E402
from tuner.probe.client import load_probe_items  # noqa: E402
from tuner.probe.recording import load_reference_sources, record_reference  # noqa: E402
from tuner.probe.spec import ProbeSpec, fit_to_study  # noqa: E402
from tuner.probe.trial import reference_known_answers, run_trial_probe  # noqa: E402
from tuner.probe.verdict import validate_reference  # noqa: E402

# The study the probe judges: a load whose top concurrency is 16, a 4096-token context.
TOP_CONCURRENCY = 16
MAX_MODEL_LEN = 4096
FAULTS: dict[str, dict[str, Any] | None] = {
    "correct": None,
    "prompt_bucket_512_1024": {"fault": "garbage_when_prompt_in", "low": 512, "high": 1024},
    "batch_eq_16": {"fault": "garbage_when_batch_eq", "batch": TOP_CONCURRENCY},
    "wording_which_city": {"fault": "garbage_for_wording", "pattern": "^which city"},
    "second_turn": {"fault": "garbage_on_turn", "turn": 2},
}


def _record_bank(url: str, spec: ProbeSpec) -> tuple[ProbeSpec, Any]:
    items = load_probe_items(spec)
    reference = asyncio.run(
        record_reference(url, MODEL, spec, sources=load_reference_sources(spec, items=items))
    )
    known = reference_known_answers(spec, items, reference)
    reference = reference.model_copy(update={"known_answers_accuracy": known.accuracy})
    check = asyncio.run(run_trial_probe(url, MODEL, spec, reference=reference, items=items))
    problem = validate_reference(known, reference=reference, self_check=check)
    assert problem is None, problem
    return spec, reference


def _probe(url: str, spec: ProbeSpec, reference: Any, seed: int) -> Any:
    return asyncio.run(
        run_trial_probe(url, MODEL, spec, reference=reference, sample_seed=seed)
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="probe_faults_sim-"))
    spec = fit_to_study(
        ProbeSpec(min_accuracy=0.5),
        top_concurrency=TOP_CONCURRENCY,
        max_model_len=MAX_MODEL_LEN,
    )
    sim = SimProc(logs, argv=("--enforce-eager",))
    try:
        spec, reference = _record_bank(sim.url, spec)
    finally:
        sim.stop()
    out: dict[str, Any] = {"mode": "bank", "runs": args.runs, "faults": {}}
    for name, fault in FAULTS.items():
        # Simulated steps at a tenth of real time: slow enough next to HTTP that a level's
        # requests overlap in the engine as they do on a real server (at 0.01 they mostly
        # run one after another, and no batch ever fills).
        server = SimProc(logs, faults=[fault] if fault else None, time_scale=0.1)
        began = time.perf_counter()
        try:
            results = [_probe(server.url, spec, reference, s) for s in range(1, args.runs + 1)]
        finally:
            server.stop()
        failed = sum(not r.passed for r in results)
        caught = failed if fault else args.runs - failed
        word = "caught" if fault else "passed"
        print(f"{name:24s} {word} {caught:2d}/{args.runs}  ({time.perf_counter() - began:.0f}s)"
              f"  e.g. {results[0].reason[:150]}", flush=True)
        out["faults"][name] = {
            "fault": fault, word: caught,
            "reasons": [r.reason[:300] for r in results],
            "probe_s": [round(r.probe_seconds or 0.0, 2) for r in results],
        }
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = ROOT / "benchmarks" / "results" / f"probe_faults_sim-bank-{stamp}.json"
    path.write_text(json.dumps(out, indent=1))
    print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
