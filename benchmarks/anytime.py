"""Anytime quality of the search on every landscape: how much of the true front's hypervolume a
study has found after k measured trials (issue 17).

    PYTHONPATH=. .venv/bin/python benchmarks/anytime.py                  # everything
    PYTHONPATH=. .venv/bin/python benchmarks/anytime.py --landscapes smollm2-engine --seeds 5

Landscapes: the simulator's spaces (ground truth from benchmarks/truth.py: the simulator's
performance model at every allowed point) and the real ones (benchmarks/landscapes/*.json:
every allowed point of a grid study measured by the tuner on the real vLLM CPU build, read by
tuner.sim.landscape). Every study is replayed through the orchestrator's ask / suggest / tell
logic (tuner.sim.study: baseline first, repeats told again and not counted, forbidden points
told infeasible) with multiplicative lognormal measurement noise, one GPU group, no early
stop, until the budget or until every allowed point is known.

Samplers: "default" (what a study file without a sampler: section runs,
tuner.engine.samplers.make_sampler), "tpe + local (previous default)" (ParetoLocalSampler
around univariate TPE after 10 start-up trials: the default before issue 17), "random"
(Optuna's RandomSampler) and "grid, file order" (every allowed point once, in the order of
the study file's nested loops: the fixed-order sweep a grid tool runs).

For each (landscape, sampler) over the seeds: hypervolume (true values of the truly feasible
points measured so far, over the true front's) after k = 4, 8, 16, 32, 64 finished trials
(median, 25th and 75th percentile; a study that ran out of points keeps its last value) and
the trials to 95 % of it. The issue's targets, checked per landscape: median trials to 95 %
at most half of random's, and the median HV at k = 8 at least random's at k = 16.

Writes benchmarks/results/anytime.json and docs/anytime.png.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import optuna  # noqa: E402

from tuner.engine import samplers  # noqa: E402
from tuner.sim.ground_truth import GroundTruth  # noqa: E402
from tuner.sim.landscape import ground_truth  # noqa: E402
from tuner.sim.study import EarlyStopPolicy, run_study  # noqa: E402
from tuner.study.spec import ExecutionSpec, SamplerSpec, StudySpec  # noqa: E402
from tuner.study.study_file import parse_study  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
LANDSCAPES = ROOT / "benchmarks" / "landscapes"
SIM_SPACES = {"glm5": "search_spaces/glm5-8xpcie.yaml", "glm5-large": "search_spaces/glm5-8xpcie-large.yaml"}
KS = (4, 8, 16, 32, 64)
TARGET = 0.95
# Trials per simulated study on the simulator's spaces (real landscapes: all their points).
SIM_BUDGET = 100
RANDOM_FACTOR = 4          # random and the grid run longer so that their median is a number


# ------------------------------------------------------------------------------- landscapes


def landscape_names() -> list[str]:
    return [*SIM_SPACES, *sorted(p.stem for p in LANDSCAPES.glob("*.json"))]


_CACHE: dict[str, tuple[StudySpec, GroundTruth, str]] = {}


def load(name: str) -> tuple[StudySpec, GroundTruth, str]:
    """(spec, ground truth, kind) of a landscape: 'simulator' or 'real'."""

    if name not in _CACHE:
        if name in SIM_SPACES:
            import truth as truth_mod

            path = ROOT / SIM_SPACES[name]
            _CACHE[name] = (truth_mod.load_spec(path), truth_mod.build(path, jobs=1), "simulator")
        else:
            data = json.loads((LANDSCAPES / f"{name}.json").read_text(encoding="utf-8"))
            path = ROOT / data["study_file"]
            measured = parse_study(path.read_text(encoding="utf-8"), str(path))
            # The grid study that measured it, replayed as a user would run the space: the
            # sampler and early stop of a study file that does not set them.
            spec = measured.model_copy(update={"sampler": SamplerSpec(), "execution": ExecutionSpec()})
            _CACHE[name] = (spec, ground_truth(spec, data), "real")
    return _CACHE[name]


# ------------------------------------------------------------------------------- samplers


@dataclass(frozen=True)
class Sampler:
    name: str
    grid: str | None = None      # None, or "file" (the study file's order)
    long: bool = False           # runs RANDOM_FACTOR x the budget on the simulator's spaces

    def make(self, spec: StudySpec, seed: int, budget: int) -> optuna.samplers.BaseSampler:
        if self.name == "default":
            return samplers.make_sampler(_seeded(spec, seed, "auto"), budget=budget)
        if self.name == "tpe + local (previous default)":
            return samplers.make_sampler(_seeded(spec, seed, "tpe"), budget=budget)
        return optuna.samplers.RandomSampler(seed=seed)


def _seeded(spec: StudySpec, seed: int, name: str) -> StudySpec:
    return spec.model_copy(update={"sampler": SamplerSpec(name=name, seed=seed)})


SAMPLERS = [Sampler("default"), Sampler("tpe + local (previous default)"),
            Sampler("random", long=True), Sampler("grid, file order", grid="file", long=True)]


# ------------------------------------------------------------------------------- one study


@dataclass(frozen=True)
class Job:
    landscape: str
    sampler: Sampler
    seed: int
    noise: float
    early_stop: bool | None = None     # None: the anytime study; else the early-stop study's arm


# What the tuner does (tuner/engine/worker.py + study.early_stop): infeasible while starting / at
# verification / after the probe / on a missed limit, objective levels first, dominated exact
# or on a bound, and inside a level on its window so far.
EARLY_STOP = EarlyStopPolicy(reorder=True, streaming_verify=True, inside=True)
_EVALUATORS: dict[str, Any] = {}


def _verdict(name: str) -> Any:
    """When a not-applied knob shows in the simulated server's log (simulator spaces only:
    a real landscape's verdicts came after the whole start, which its startup_s includes)."""

    if load(name)[2] != "simulator":
        return None
    if name not in _EVALUATORS:
        from tuner.sim.profile import load_profile
        from tuner.sim.truth import Evaluator

        _EVALUATORS[name] = Evaluator(load(name)[0], load_profile("glm5-8xpcie"))
    return _EVALUATORS[name].startup_verdict


def budget_of(name: str, sampler: Sampler) -> int:
    spec, truth, kind = load(name)
    if kind == "real":
        return len(truth.points)
    return SIM_BUDGET * (RANDOM_FACTOR if sampler.long else 1)


def run_job(job: Job) -> dict[str, Any]:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore")
    spec, truth, _ = load(job.landscape)
    budget = budget_of(job.landscape, job.sampler)
    began = time.monotonic()
    if job.early_stop is not None:
        return _early_stop_job(job, spec, truth, budget, began)
    if job.sampler.grid == "file":
        # A sweep in the study file's order: every point enqueued up front, so nothing
        # is left to the sampler.
        from tuner.study.sampling import grid_points

        initial = grid_points(spec)
        run = run_study(spec, truth, lambda s, seed: optuna.samplers.RandomSampler(seed=seed),
                        n_trials=budget, seed=job.seed, noise=job.noise, initial=initial)
    else:
        run = run_study(spec, truth, lambda s, seed: job.sampler.make(s, seed, budget),
                        n_trials=budget, seed=job.seed, noise=job.noise)
    curve = [h / truth.hypervolume for h in run.hv_curve(truth)]
    t95 = next((i + 1 for i, h in enumerate(curve) if h >= TARGET - 1e-12), None)
    return {"landscape": job.landscape, "sampler": job.sampler.name, "seed": job.seed,
            "curve": [round(h, 4) for h in curve], "t95": t95, "trials": len(run.trials),
            "proposals": run.proposals, "duplicates": run.duplicates, "forbidden": run.forbidden,
            "repeats_while_unmeasured": _repeats_while_unmeasured(run, len(truth.points)),
            "wall_s": round(time.monotonic() - began, 2)}


def _early_stop_job(job: Job, spec: StudySpec, truth: GroundTruth, budget: int, began: float) -> dict[str, Any]:
    """One arm of the early-stop study: the whole budget, early stop on or off, the torch.compile
    cache shared by the study's servers (simulator spaces; the real landscapes' starts are what
    they measured)."""

    run = run_study(spec, truth, lambda s, seed: job.sampler.make(s, seed, budget), n_trials=budget,
                    seed=job.seed, noise=job.noise, policy=EARLY_STOP if job.early_stop else None,
                    verdict=_verdict(job.landscape) if job.early_stop else None, compile_cache=True)
    curve = [h / truth.hypervolume for h in run.hv_curve(truth)]
    stopped = [t for t in run.trials if t.stopped]
    return {"landscape": job.landscape, "sampler": job.sampler.name, "seed": job.seed, "early_stop": job.early_stop,
            "seconds": run.total_seconds, "ceiling_seconds": _ceiling(run, truth, spec),
            "trials": len(run.trials), "final_hv": curve[-1] if curve else 0.0,
            "t95": next((i + 1 for i, h in enumerate(curve) if h >= TARGET - 1e-12), None),
            "stopped": {r: sum(1 for t in stopped if t.stopped == r) for r in sorted({t.stopped for t in stopped})},
            "wrong_stops": sum(1 for t in stopped if t.would_enter_front),
            "true_front_stopped": sum(1 for t in stopped if t.true_front),
            "wall_s": round(time.monotonic() - began, 2)}


def _ceiling(run: Any, truth: GroundTruth, spec: StudySpec) -> float:
    """Seconds the most any rule inside a trial could save in this (no early stop) run: every
    trial that did not join the study's front when it finished, stopped the moment its server
    was up (its start, compile-cache hit included, and its stop are all it would cost). No
    sound rule gets there - dominance is only known once objectives are measured - so the
    share this makes of the study's time bounds what early stopping can save."""

    directions = [o.direction for o in spec.objectives]
    front: list[tuple[float, ...]] = []
    saved = 0.0
    for t in run.trials:
        point = truth.get(t.values)
        if t.feasible and t.measured is not None:
            if not any(_dominates(f, t.measured, directions) for f in front):
                front = [f for f in front if not _dominates(t.measured, f, directions)] + [t.measured]
                continue
        saved += max(0.0, t.seconds - (point.startup_s - t.compile_saved_s) - point.stop_s)
    return saved


def _dominates(a: Any, b: Any, directions: list[str]) -> bool:
    signed = [(x, y) if d == "minimize" else (-x, -y) for x, y, d in zip(a, b, directions)]
    return all(x <= y for x, y in signed) and any(x < y for x, y in signed)


def early_stop_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per landscape: study time saved by early stopping (same sampler, seeds and budget),
    per seed, and what it cost (stops that would have entered the front, true front points
    stopped before their objectives were measured, final hypervolume)."""

    off = {r["seed"]: r for r in rows if not r["early_stop"]}
    on = {r["seed"]: r for r in rows if r["early_stop"]}
    seeds = sorted(set(off) & set(on))
    per_seed = [round(1 - on[s]["seconds"] / off[s]["seconds"], 4) for s in seeds]
    return {"seeds": len(seeds),
            "time_saved": round(1 - sum(on[s]["seconds"] for s in seeds) / sum(off[s]["seconds"] for s in seeds), 4),
            "ceiling": round(sum(off[s]["ceiling_seconds"] for s in seeds) / sum(off[s]["seconds"] for s in seeds), 4),
            "time_saved_per_seed": per_seed,
            "ceiling_per_seed": [round(off[s]["ceiling_seconds"] / off[s]["seconds"], 4) for s in seeds],
            "wrong_stops": sum(on[s]["wrong_stops"] for s in seeds),
            "true_front_stopped": sum(on[s]["true_front_stopped"] for s in seeds),
            "final_hv_median": {"off": statistics.median(off[s]["final_hv"] for s in seeds),
                                "on": statistics.median(on[s]["final_hv"] for s in seeds)},
            "stopped": {k: sum(on[s]["stopped"].get(k, 0) for s in seeds)
                        for k in sorted({k for s in seeds for k in on[s]["stopped"]})}}


def print_early_stop(results: dict[str, Any]) -> None:
    print("\nearly stop (default sampler, whole budget, same seeds with and without):")
    for name, e in results["early_stop"].items():
        seeds = e["time_saved_per_seed"]
        print(f"  {name:<16} saved {100 * e['time_saved']:5.1f}% (ceiling {100 * e['ceiling']:.1f}%)  per seed "
              + " ".join(f"{100 * v:.1f}" for v in seeds)
              + f"  | wrong stops {e['wrong_stops']}, true front points stopped {e['true_front_stopped']}, "
              f"final HV {e['final_hv_median']['off']:.3f} -> {e['final_hv_median']['on']:.3f}  {e['stopped']}")
        if e.get("ceiling_per_seed"):
            # The ceiling per seed: where a seed's saving stands against what any rule inside
            # a trial could save in that study (_ceiling).
            print(f"  {'':<16} ceiling per seed " + " ".join(f"{100 * v:.1f}" for v in e["ceiling_per_seed"]))
    print("  saved: study time saved (whole budget, same seeds); ceiling: every trial that did not join the"
          " front stopped the moment its server was up (startup, stop and stops while starting aside)")


def _repeats_while_unmeasured(run: Any, size: int) -> int:
    """Proposals that repeated a known point although unknown allowed points remained:
    every told duplicate, since a study only stops asking once all points are known
    (tuner.sim.study stops after a long run of rejected proposals, or at the budget)."""

    return run.duplicates if len(run.trials) < size else 0


# ------------------------------------------------------------------------------- stats


def pct(values: list[float], q: float) -> float:
    vals = sorted(values)
    pos = (len(vals) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(vals) - 1)
    if math.isinf(vals[lo]) or math.isinf(vals[hi]):
        return vals[hi] if pos - lo > 0 else vals[lo]
    return vals[lo] + (vals[hi] - vals[lo]) * (pos - lo)


def hv_at(row: dict[str, Any], k: int) -> float:
    curve = row["curve"]
    return curve[min(k, len(curve)) - 1] if curve else 0.0


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    t95 = [r["t95"] if r["t95"] is not None else math.inf for r in rows]
    hv = {str(k): {"median": pct([hv_at(r, k) for r in rows], 0.5), "p25": pct([hv_at(r, k) for r in rows], 0.25),
                   "p75": pct([hv_at(r, k) for r in rows], 0.75)} for k in KS}
    longest = max(len(r["curve"]) for r in rows)
    curve = [pct([r["curve"][min(i, len(r["curve"]) - 1)] for r in rows], 0.5) for i in range(longest)]
    return {"seeds": len(rows), "t95": {"median": pct(t95, 0.5), "p25": pct(t95, 0.25), "p75": pct(t95, 0.75),
                                        "reached": sum(math.isfinite(v) for v in t95)},
            "hv_at": hv, "curve_median": curve,
            "duplicates_median": statistics.median(r["duplicates"] for r in rows),
            "repeats_while_unmeasured": sum(r["repeats_while_unmeasured"] for r in rows),
            "per_seed": [{"seed": r["seed"], "t95": r["t95"], "trials": r["trials"],
                          **{f"hv@{k}": hv_at(r, k) for k in KS}} for r in rows]}


MAX_FRONT_FOR_FEWEST = 16     # 2^16 subsets of the front: still well under a second


def fewest_trials(name: str) -> int | None:
    """The fewest trials after which any study that runs the baseline first can hold 95 % of the
    true hypervolume: the baseline, plus the smallest set of true front points that reaches it
    together with the baseline (a dominated point never adds area its dominator lacks, so the
    smallest set is among the front's subsets). A sampler that knew the answer would need this
    many; a target below it cannot be met by any sampler. None for fronts too large to enumerate."""

    from itertools import combinations

    from tuner.sim.ground_truth import measure
    from tuner.study import space

    spec, truth, _ = load(name)
    if not truth.front or len(truth.front) > MAX_FRONT_FOR_FEWEST:
        return None
    values = {i: measure(spec, truth.points[i]).objectives for i in truth.front}
    try:
        base = measure(spec, truth.get(space.baseline_values(spec)))
        start = [base.objectives] if base.feasible and base.objectives is not None else []
    except KeyError:                         # the baseline is not an allowed point of this space
        start = []
    goal = TARGET * truth.hypervolume - 1e-12
    for size in range(len(truth.front) + 1):
        if any(truth.hv_of([*start, *(values[i] for i in chosen)]) >= goal
               for chosen in combinations(truth.front, size)):
            return size + 1
    return None


def verdict(info: dict[str, Any], fewest: int | None = None) -> dict[str, Any]:
    """The issue's two targets for one landscape, and whether the first can be met at all: the
    target asks the default's median for half of random's, which no sampler can beat `fewest`."""

    d, r = info["samplers"]["default"], info["samplers"]["random"]
    ratio = d["t95"]["median"] / r["t95"]["median"] if math.isfinite(r["t95"]["median"]) else 0.0
    target = 0.5 * r["t95"]["median"]
    return {"t95_ratio_vs_random": round(ratio, 3), "t95_ok": ratio <= 0.5,
            "t95_target": target, "t95_fewest_possible": fewest,
            "t95_target_needs_oracle": fewest is not None and target <= fewest,
            "hv8_default": d["hv_at"]["8"]["median"], "hv16_random": r["hv_at"]["16"]["median"],
            "hv8_ok": d["hv_at"]["8"]["median"] >= r["hv_at"]["16"]["median"] - 1e-12}


# ------------------------------------------------------------------------------- output


def fmt(v: float) -> str:
    return ">budget" if not math.isfinite(v) else f"{v:.0f}" if float(v).is_integer() else f"{v:.1f}"


def print_table(results: dict[str, Any]) -> None:
    for name, info in results["landscapes"].items():
        print(f"\n{name} ({info['kind']}, {info['points']} points, true front {info['front_points']}, "
              f"{info['seeds']} seeds, noise {results['noise']})")
        print(f"  {'sampler':<32} {'t95 med':>7} {'p25-p75':>11} " + " ".join(f"{'HV@' + str(k):>11}" for k in KS)
              + f" {'dups':>5}")
        for sname, s in info["samplers"].items():
            t = s["t95"]
            hv = " ".join(f"{s['hv_at'][str(k)]['median']:>5.2f}({s['hv_at'][str(k)]['p25']:.2f})" for k in KS)
            print(f"  {sname:<32} {fmt(t['median']):>7} {fmt(t['p25']) + '-' + fmt(t['p75']):>11} {hv}"
                  f" {s['duplicates_median']:>5}")
        v = info["verdict"]
        print(f"  default vs random: trials to 95 % {v['t95_ratio_vs_random']:.2f}x "
              f"({'ok' if v['t95_ok'] else 'MISSED'}, target <= 0.5x); HV@8 {v['hv8_default']:.3f} vs random's "
              f"HV@16 {v['hv16_random']:.3f} ({'ok' if v['hv8_ok'] else 'MISSED'})")
        if v.get("t95_fewest_possible") is not None:
            print(f"  fewest trials to 95 % any sampler can need (baseline first, knowing the answer): "
                  f"{v['t95_fewest_possible']}; the target (<= {fmt(v['t95_target'])})"
                  + (" asks for that in half the seeds" if v["t95_target_needs_oracle"] else " leaves room"))
    print("\n  HV@k: median (25th percentile) share of the true hypervolume after k finished trials; "
          "dups: median repeats proposed (told again, not run)")


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["landscapes"])
    fig, axes = plt.subplots(1, len(names), figsize=(4.6 * len(names), 4.2), squeeze=False)
    styles = {"default": ("black", "-", 2.2), "tpe + local (previous default)": ("tab:red", "--", 1.5),
              "random": ("tab:gray", ":", 1.8), "grid, file order": ("tab:blue", "-.", 1.3)}
    for ax, name in zip(axes[0], names):
        info = results["landscapes"][name]
        limit = min(64, max(len(s["curve_median"]) for s in info["samplers"].values()))
        for sname, s in info["samplers"].items():
            color, style, width = styles.get(sname, ("tab:green", "-", 1.0))
            med = s["curve_median"][:limit]
            ax.plot(range(1, len(med) + 1), med, color=color, linestyle=style, linewidth=width,
                    label=f"{sname} ({fmt(s['t95']['median'])})")
        ax.axhline(TARGET, color="black", linewidth=0.6, linestyle="--")
        ax.set_title(f"{name} ({info['kind']}): {info['points']} points", fontsize=9)
        ax.set_xlabel("finished trials (baseline = 1)")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6.5, loc="lower right", title="median trials to 95 %", title_fontsize=6.5)
    axes[0][0].set_ylabel("hypervolume found / true (median over seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--landscapes", default=",".join(landscape_names()))
    ap.add_argument("--samplers", default="", help="sampler names separated by ; (default all)")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--real-seeds", type=int, default=50, help="seeds on the real landscapes (cheap)")
    ap.add_argument("--noise", type=float, default=0.03, help="lognormal sigma of a measurement")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--early-stop", action="store_true",
                    help="also the early-stop study: default sampler with and without tuner.study.early_stop")
    ap.add_argument("--early-stop-only", action="store_true")
    ap.add_argument("--out", type=Path, default=RESULTS / "anytime.json")
    ap.add_argument("--plot", type=Path, default=ROOT / "docs" / "anytime.png")
    args = ap.parse_args()
    names = [n for n in args.landscapes.split(",") if n]
    chosen = [s for s in SAMPLERS if not args.samplers or s.name in args.samplers.split(";")]
    for name in names:      # ground truths built or loaded once, before forking
        spec, truth, kind = load(name)
        print(f"[landscape] {name} ({kind}): {len(truth.points)} points, front {len(truth.front)}", flush=True)
    def seeds(n: str) -> range:
        return range(args.real_seeds if load(n)[2] == "real" else args.seeds)

    jobs = [] if args.early_stop_only else [Job(n, s, seed, args.noise) for n in names for s in chosen
                                            for seed in seeds(n)]
    if args.early_stop or args.early_stop_only:
        jobs += [Job(n, SAMPLERS[0], seed, args.noise, early_stop=on) for n in names for seed in seeds(n)
                 for on in (False, True)]
    began = time.monotonic()
    rows = []
    with ProcessPoolExecutor(args.jobs) as pool:
        for i, row in enumerate(pool.map(run_job, jobs, chunksize=4), 1):
            rows.append(row)
            if i % 25 == 0 or i == len(jobs):
                print(f"  [{i}/{len(jobs)} {time.monotonic() - began:.0f}s]", flush=True)
    results: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    results.update(noise=args.noise, target=TARGET, ks=list(KS))
    results.setdefault("landscapes", {})
    if args.early_stop or args.early_stop_only:
        results["early_stop"] = {n: early_stop_summary([r for r in rows if r["landscape"] == n and "early_stop" in r])
                                 for n in names}
    for name in [] if args.early_stop_only else names:
        spec, truth, kind = load(name)
        info = {"kind": kind, "points": len(truth.points), "front_points": len(truth.front),
                "seeds": args.real_seeds if kind == "real" else args.seeds,
                "samplers": {s.name: summarise([r for r in rows if r["landscape"] == name and r["sampler"] == s.name
                                            and "early_stop" not in r]) for s in chosen}}
        if {"default", "random"} <= set(info["samplers"]):
            info["verdict"] = verdict(info, fewest_trials(name))
        results["landscapes"][name] = info
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1, default=float) + "\n", encoding="utf-8")
    if not args.early_stop_only and all("verdict" in i for i in results["landscapes"].values()):
        print_table(results)
        plot(results, args.plot)
    if "early_stop" in results:
        print_early_stop(results)
    print(f"[out] {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
