"""Build (or load from cache) the simulator ground truth of a study's search space.

    PYTHONPATH=. .venv/bin/python benchmarks/truth.py search_spaces/glm5-8xpcie.yaml [--jobs 2]

Writes benchmarks/results/truth-<study>.json: every point's simulated outcome (status,
applied, probe, per-level metrics and times), the true Pareto front, the hypervolume
reference point and the true hypervolume. The cache is keyed by a fingerprint of the study
file and of every source file the result depends on, so a change to the simulator or the
calibration rebuilds it. A point's "applied" verdict is the worker's own verification of
the simulated server's startup log (``tuner.sim.truth_verify``).

``--restamp N`` is for a change that moves code without changing what it computes (a module
split, a renamed helper): it re-evaluates a seeded sample of N cached points (0: all of
them) with today's sources and, only if every one comes out identical to the cached row,
stamps the cache with today's fingerprint; otherwise it names the first differing point and
leaves the cache stale, so the next run rebuilds it.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import random
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner.adapters.artifacts import atomic_write_text  # noqa: E402
from tuner.sim import ground_truth  # noqa: E402
from tuner.sim import truth as st  # noqa: E402
from tuner.sim.profile import load_profile  # noqa: E402
from tuner.study.spec import StudySpec  # noqa: E402
from tuner.study.study_file import parse_study  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
# Modules whose code decides a point's outcome, by name (their files move between packages).
SOURCES = ["tuner.sim.perf_model", "tuner.sim.perf_config", "tuner.sim.scheduler", "tuner.sim.events",
           "tuner.sim.effective", "tuner.sim.comm", "tuner.sim.model", "tuner.sim.args",
           "tuner.sim.tokenizer", "tuner.sim.lossy", "tuner.load.workload", "tuner.load.filler", "tuner.vllm.knobs",
           "tuner.vllm.knob_values",
           "tuner.sim.cache",
           "tuner.sim.profile", "tuner.vllm.compile_cache", "tuner.study.space",
           # "applied" is the worker's verification of the simulated startup log
           "tuner.sim.truth_verify", "tuner.sim.dry_log", "tuner.sim.__main__", "tuner.sim.logs",
           "tuner.vllm.effective_config", "tuner.vllm.verify", "tuner.vllm.log_lines", "tuner.vllm.parallel"]


def load_spec(path: str | Path) -> StudySpec:
    return parse_study(Path(path).read_text(encoding="utf-8"), str(path))


# Sections of a study file that cannot change any point's outcome: a new sampler or budget
# must not cost a rebuild (7 minutes for glm5-8xpcie, 45 for the large space on one core).
NOT_IN_TRUTH = {"name", "description", "sampler", "budget", "confirm", "execution", "starting_points"}


def fingerprint(spec_path: Path, profile: str) -> str:
    h = hashlib.sha256()
    spec = load_spec(spec_path).model_dump(mode="json", exclude=NOT_IN_TRUTH)
    h.update(json.dumps(spec, sort_keys=True).encode())
    h.update(profile.encode())
    h.update(f"eval-version {st.EVAL_VERSION}".encode())
    h.update((ROOT / "tuner/sim/profiles" / f"{profile}.yaml").read_bytes())
    for name in SOURCES:
        found = importlib.util.find_spec(name)
        if found is None or found.origin is None:
            raise SystemExit(f"benchmarks/truth.py: module {name} not found (moved? update SOURCES)")
        h.update(Path(found.origin).read_bytes())
    return h.hexdigest()[:16]


def _shard(args: tuple[str, str, list[dict[str, Any]], int]) -> list[dict[str, Any]]:
    spec_path, profile, points, shard = args
    spec = load_spec(spec_path)
    ev = st.Evaluator(spec, load_profile(profile))
    out = []
    began = time.monotonic()
    for i, values in enumerate(points):
        out.append(ev.evaluate(values).to_json())
        if (i + 1) % 200 == 0 or i + 1 == len(points):
            print(f"  [shard {shard}] {i + 1}/{len(points)} points, {time.monotonic() - began:.0f}s",
                  flush=True)
    return out


def build(spec_path: str | Path, *, profile: str = "glm5-8xpcie", jobs: int = 2,
          force: bool = False) -> ground_truth.GroundTruth:
    path = Path(spec_path)
    spec = load_spec(path)
    cache = RESULTS / f"truth-{spec.name}.json"
    fp = fingerprint(path, profile)
    if cache.exists() and not force:
        data = json.loads(cache.read_text())
        if data.get("fingerprint") == fp:
            # Front, reference and hypervolume are cheap: recompute them with today's rule.
            stored = ground_truth.GroundTruth.from_json(data["truth"])
            return ground_truth.GroundTruth.build(spec, stored.points)
        print(f"[truth] {cache.name} is stale (sources changed): rebuilding", flush=True)
    points = st.enumerate_points(spec)
    print(f"[truth] {spec.name}: {len(points)} points, {jobs} process(es)", flush=True)
    began = time.monotonic()
    size = -(-len(points) // jobs)
    # Contiguous shards: neighbours in enumeration order share simulations (memoised).
    shards = [(str(path), profile, points[i * size:(i + 1) * size], i) for i in range(jobs)]
    if jobs == 1:
        rows = _shard(shards[0])
    else:
        with ProcessPoolExecutor(jobs) as pool:
            rows = [row for part in pool.map(_shard, shards) for row in part]
    truth = ground_truth.GroundTruth.build(spec, [st.PointTruth.from_json(r) for r in rows])
    RESULTS.mkdir(parents=True, exist_ok=True)
    atomic_write_text(cache, json.dumps({"fingerprint": fp, "profile": profile, "truth": truth.to_json()},
                                        separators=(",", ":")))
    print(f"[truth] built in {time.monotonic() - began:.0f}s -> {cache}", flush=True)
    return truth


def restamp(spec_path: str | Path, *, profile: str, sample: int, seed: int = 0) -> tuple[int, str | None]:
    """(points re-evaluated, first difference or None); writes today's fingerprint only on None."""

    path = Path(spec_path)
    spec = load_spec(path)
    cache = RESULTS / f"truth-{spec.name}.json"
    data = json.loads(cache.read_text())
    if data.get("profile", profile) != profile:
        return 0, f"{cache.name} was built for profile {data.get('profile')}, not {profile}"
    rows = data["truth"]["points"]
    picked = rows if sample <= 0 or sample >= len(rows) else random.Random(seed).sample(rows, sample)
    ev = st.Evaluator(spec, load_profile(profile))
    for i, row in enumerate(picked, 1):
        now = ev.evaluate(row["values"]).to_json()
        if json.loads(json.dumps(now)) != row:
            return i, f"{row['values']}: cached {json.dumps(row)[:300]} ... today {json.dumps(now)[:300]}"
        if i % 100 == 0:
            print(f"  [restamp] {i}/{len(picked)} identical", flush=True)
    data["fingerprint"] = fingerprint(path, profile)
    atomic_write_text(cache, json.dumps(data, separators=(",", ":")))
    return len(picked), None


def summary(spec: StudySpec, truth: ground_truth.GroundTruth) -> str:
    n = len(truth.points)
    failed = sum(p.failed for p in truth.points)
    not_applied = sum(1 for p in truth.points if not p.failed and not p.applied)
    probe = sum(1 for p in truth.points if not p.failed and p.applied and not p.probe_passed)
    lines = [f"{truth.spec_name}: {n} points: {failed} fail at startup, {not_applied} not applied, "
             f"{probe} fail the probe, {n - failed - not_applied - probe} measurable and verified",
             f"true front ({len(truth.front)} points), reference "
             f"{tuple(round(r, 2) for r in truth.reference)}, hypervolume {truth.hypervolume:.1f}:"]
    for i in truth.front:
        p = truth.points[i]
        vals = ground_truth.measure(spec, p).objectives or ()
        lines.append("  " + "  ".join(f"{l}={v:.4g}" for l, v in zip(truth.labels, vals)) + "  "
                     + " ".join(f"{k}={v}" for k, v in p.values.items()))
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("spec", nargs="+")
    ap.add_argument("--profile", default="glm5-8xpcie")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--restamp", type=int, metavar="N", default=None,
                    help="re-evaluate N cached points (0: all); restamp the cache if all identical")
    args = ap.parse_args()
    for path in args.spec:
        if args.restamp is not None:
            checked, diff = restamp(path, profile=args.profile, sample=args.restamp)
            print(f"[restamp] {path}: {checked} point(s) re-evaluated: "
                  + ("identical, fingerprint updated" if diff is None else f"DIFFERENT at {diff}"))
            if diff is not None:
                return 1
            continue
        truth = build(path, profile=args.profile, jobs=args.jobs, force=args.force)
        print(summary(load_spec(path), truth))
    return 0


if __name__ == "__main__":
    sys.exit(main())
