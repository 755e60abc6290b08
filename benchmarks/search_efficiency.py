"""How many trials each sampler needs to find the Pareto front, side by side (issue 8).

    PYTHONPATH=. .venv/bin/python benchmarks/search_efficiency.py            # everything
    PYTHONPATH=. .venv/bin/python benchmarks/search_efficiency.py --quick    # 3 seeds, fewer variants

Each study is simulated without servers (tuner.sim.study): an in-memory Optuna study driven
by the tuner's own study loop and policy (tuner.engine.orchestrator.StudyLoop, tuner.study.policy)
through the in-process executor (tuner.sim.executor), every trial answered from the ground
truth of benchmarks/truth.py (simulator performance model at every point of the space) with
multiplicative lognormal measurement noise. For every (space, sampler, seed) it records the
true hypervolume of the feasible points evaluated so far after each finished trial; the
table gives the trials needed to reach 95 % of the true front's hypervolume (median over
seeds, 25th-75th percentile and worst seed; ">N" = not reached within the N-trial budget).

--early-stop compares studies with and without tuner.study.early_stop (same sampler, same
seeds, whole budget): study time saved, trials stopped, and stopped trials that would have
entered the front (must be 0) or are true front points (must be 0).

Writes benchmarks/results/search_efficiency.json (all figures), search_efficiency.png
(median HV vs trials per sampler, IQR shaded) and early_stop.png.

GP: optuna's GPSampler needs torch and scipy. They are not project dependencies; the
benchmark uses them when importable (e.g. `pip install --target /tmp/gp-site torch==2.13.0
scipy` and PYTHONPATH=.:/tmp/gp-site) and skips the GP row otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import optuna  # noqa: E402
import truth as truth_mod  # noqa: E402

from tuner.engine import samplers  # noqa: E402
from tuner.sim.ground_truth import GroundTruth  # noqa: E402
from tuner.sim.study import EarlyStopPolicy, StudyRun, run_study  # noqa: E402
from tuner.study import sampling  # noqa: E402
from tuner.study.spec import SamplerSpec, StudySpec  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
SPACES = {"glm5": "search_spaces/glm5-8xpcie.yaml", "glm5-large": "search_spaces/glm5-8xpcie-large.yaml"}
BUDGET = {"glm5": 100, "glm5-large": 150}
TARGET = 0.95


# ------------------------------------------------------------------------------- samplers


def _with(spec: StudySpec, name: str, seed: int, n_startup: int | None = None) -> StudySpec:
    return spec.model_copy(update={"sampler": SamplerSpec(name=name, seed=seed, n_startup_trials=n_startup)})


@dataclass(frozen=True)
class Default:
    """The orchestrator's sampler for a study's ``sampler.name`` (tuner.engine.samplers.make_sampler)."""

    name: str

    def __call__(self, spec: StudySpec, seed: int) -> optuna.samplers.BaseSampler:
        return samplers.make_sampler(_with(spec, self.name, seed))


@dataclass(frozen=True)
class TPE:
    """A TPESampler with explicit settings (picklable, for the process pool); with a design,
    its random start-up shrinks by the design's size as tuner/engine/samplers.py does."""

    settings: tuple[tuple[str, Any], ...] = ()
    design: str | None = None

    def __call__(self, spec: StudySpec, seed: int) -> optuna.samplers.BaseSampler:
        kwargs = dict(self.settings)
        if self.design:
            size = 1 + len(sampling.initial_design(spec, children=self.design == "all"))
            kwargs["n_startup_trials"] = max(0, kwargs.get("n_startup_trials", 10) - size)
        return optuna.samplers.TPESampler(seed=seed, **kwargs)


@dataclass(frozen=True)
class Local:
    """tuner/engine/samplers.py ParetoLocalSampler around a sampler variant."""

    inner: Any
    local: float = 0.5

    def __call__(self, spec: StudySpec, seed: int) -> optuna.samplers.BaseSampler:
        return samplers.ParetoLocalSampler(self.inner(spec, seed), spec, local=self.local, seed=seed)


def default_factory(name: str) -> Default:
    return Default(name)


def tpe_factory(design: str | None = None, **kwargs: Any) -> TPE:
    return TPE(tuple(sorted(kwargs.items())), design)




def random_factory(spec: StudySpec, seed: int) -> optuna.samplers.BaseSampler:
    return optuna.samplers.RandomSampler(seed=seed)


def gp_factory(spec: StudySpec, seed: int) -> optuna.samplers.BaseSampler:
    return optuna.samplers.GPSampler(seed=seed, n_startup_trials=10)


def gp_available() -> bool:
    try:
        import scipy  # noqa: F401
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass(frozen=True)
class Variant:
    name: str
    factory: Any
    grid: bool = False
    design: str | None = None       # None, "top" (one knob at a time) or "all" (children too)
    workers: int = 1
    budget_factor: int = 1          # cheap baselines run longer so their median is a number
    note: str = ""


MV = {"multivariate": True, "group": True, "constant_liar": True}


def variants(names: list[str] | None) -> list[Variant]:
    out = [
        Variant("random", random_factory, budget_factor=4, note="RandomSampler"),
        Variant("grid (shuffled)", random_factory, grid=True, budget_factor=4,
                note="every point once, random order"),
        Variant("default", default_factory("auto"),
                note="what a study without a sampler: section runs (tuner.engine.samplers.make_sampler, "
                     "'auto'): initial design, then the largest expected improvement (tuner.study.planner)"),
        Variant("tpe + local (previous default)", default_factory("tpe"),
                note="`sampler: {name: tpe}`: ParetoLocalSampler(univariate TPE, constant_liar), local share 0.5, "
                     "after 10 random start-up trials"),
        Variant("tpe multivariate (old default)", tpe_factory(**MV),
                note="the earlier default: multivariate, group, constant_liar, 10 random start-up"),
        Variant("nsga2", default_factory("nsga2"), note="tuner.engine.samplers.make_sampler population"),
        Variant("tpe independent", tpe_factory(constant_liar=True), note="univariate TPE, 10 start-up"),
        Variant("tpe + OFAT design", tpe_factory(design="top", **MV), design="top",
                note="baseline, one knob at a time (tuner/study/sampling.initial_design), then multivariate TPE"),
        Variant("tpe multivariate + local", Local(tpe_factory(**MV)),
                note="ParetoLocalSampler around the old multivariate TPE"),
        Variant("default, 2 workers", default_factory("tpe"), workers=2),
        Variant("default, 4 workers", default_factory("tpe"), workers=4),
        Variant("tpe multivariate, 4 workers", tpe_factory(**MV), workers=4),
    ]
    if gp_available():
        out.append(Variant("gp", gp_factory, note="optuna GPSampler (torch, CPU), 10 start-up"))
    if names:
        wanted = set(names)
        unknown = wanted - {v.name for v in out}
        if unknown:
            raise SystemExit(f"unknown sampler variant(s): {sorted(unknown)}")
        out = [v for v in out if v.name in wanted]
    return out


# ------------------------------------------------------------------------------- jobs

_TRUTHS: dict[str, tuple[StudySpec, GroundTruth]] = {}


def _truth(space: str) -> tuple[StudySpec, GroundTruth]:
    if space not in _TRUTHS:
        path = ROOT / SPACES[space]
        _TRUTHS[space] = (truth_mod.load_spec(path), truth_mod.build(path, jobs=1))
    return _TRUTHS[space]


_EVALUATORS: dict[str, Any] = {}


def _evaluator(space: str) -> Any:
    """For when a not-applied knob shows in the log (resolve only, no simulation)."""

    if space not in _EVALUATORS:
        from tuner.sim.profile import load_profile
        from tuner.sim.truth import Evaluator

        _EVALUATORS[space] = Evaluator(_truth(space)[0], load_profile("glm5-8xpcie"))
    return _EVALUATORS[space]


@dataclass
class Job:
    space: str
    variant: Variant
    seed: int
    noise: float
    n_trials: int
    policy: EarlyStopPolicy | None = None
    stop_at_full: bool = True
    tag: str = ""
    compile_cache: bool = True      # servers share vLLM's torch.compile cache (tuner.sim.study)


def _summarise(run: StudyRun, truth: GroundTruth, spec: StudySpec) -> dict[str, Any]:
    curve = [h / truth.hypervolume for h in run.hv_curve(truth)]
    t95 = next((i + 1 for i, h in enumerate(curve) if h >= TARGET - 1e-12), None)
    strict = [h / truth.strict_hypervolume for h in run.hv_curve(truth, strict=True)]
    t95_strict = next((i + 1 for i, h in enumerate(strict) if h >= TARGET - 1e-12), None)
    seconds = [t.seconds for t in run.trials]
    hours95 = sum(seconds[:t95]) / 3600 if t95 else None
    stopped = [t for t in run.trials if t.stopped]
    return {
        "curve": [round(h, 4) for h in curve],
        "trial_hours": [round(x / 3600, 4) for x in seconds],
        "t95": t95,
        "t95_strict": t95_strict,
        "hours_to_95": None if hours95 is None else round(hours95, 3),
        "trials": len(run.trials),
        "proposals": run.proposals,
        "forbidden": run.forbidden,
        "duplicates": run.duplicates,
        "failed": sum(t.failed for t in run.trials),
        "infeasible": sum(1 for t in run.trials if not t.failed and not t.truly_feasible),
        "study_hours": round(sum(seconds) / 3600, 3),
        "makespan_hours": round(run.makespan / 3600, 3),
        "final_hv": round(curve[-1] if curve else 0.0, 4),
        "reported_front_hv": round(run.reported_front_hv(truth, [o.direction for o in spec.objectives])
                                   / truth.hypervolume, 4),
        "stopped": {r: sum(1 for t in stopped if t.stopped == r) for r in sorted({t.stopped for t in stopped})},
        "stopped_after": {a: sum(1 for t in stopped if t.stopped_after == a)
                          for a in sorted({t.stopped_after for t in stopped if t.stopped_after})},
        "wrong_stops": sum(1 for t in stopped if t.would_enter_front),
        "true_front_stopped": sum(1 for t in stopped if t.true_front),
        "compile_hits": run.compile_hits,
        "compile_misses": sum(1 for t in run.trials if t.compile == "miss"),
        "compile_saved_hours": round(run.compile_saved_seconds / 3600, 4),
    }


def run_job(job: Job) -> dict[str, Any]:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    import warnings

    warnings.filterwarnings("ignore")
    spec, truth = _truth(job.space)
    v = job.variant
    initial = sampling.initial_design(spec, budget=job.n_trials, children=v.design == "all") if v.design else ()
    verdict = None
    if job.policy is not None and job.policy.streaming_verify:
        verdict = _evaluator(job.space).startup_verdict
    began = time.monotonic()
    run = run_study(spec, truth, v.factory, n_trials=job.n_trials, seed=job.seed, noise=job.noise,
                    workers=v.workers, policy=job.policy, grid=v.grid, initial=initial,
                    stop_at_full=job.stop_at_full, verdict=verdict,
                    compile_cache=job.compile_cache)
    out = _summarise(run, truth, spec)
    out.update(space=job.space, variant=v.name, seed=job.seed, tag=job.tag,
               wall_s=round(time.monotonic() - began, 1))
    return out


# ------------------------------------------------------------------------------- stats


def _pct(values: list[float], q: float) -> float:
    vals = sorted(values)
    pos = (len(vals) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(vals) - 1)
    return vals[lo] + (vals[hi] - vals[lo]) * (pos - lo)


def t95_stats(rows: list[dict[str, Any]], budget: int) -> dict[str, Any]:
    """Median and spread of trials-to-95 %; a seed that never got there counts as +inf."""

    vals = [r["t95"] if r["t95"] is not None else math.inf for r in rows]
    reached = sum(1 for v in vals if math.isfinite(v))
    return {"median": _pct(vals, 0.5), "p25": _pct(vals, 0.25), "p75": _pct(vals, 0.75),
            "worst": max(vals), "best": min(vals), "reached": reached, "seeds": len(vals), "budget": budget}


def fmt_trials(v: float, budget: int) -> str:
    return f">{budget}" if not math.isfinite(v) else f"{v:.0f}" if float(v).is_integer() else f"{v:.1f}"


def median_curve(rows: list[dict[str, Any]], budget: int) -> tuple[list[float], list[float], list[float]]:
    """Per trial count: median, 25th and 75th percentile of normalised HV (a run that stopped
    early at 100 % stays at its last value)."""

    med, lo, hi = [], [], []
    for i in range(budget):
        vals = [r["curve"][min(i, len(r["curve"]) - 1)] if r["curve"] else 0.0 for r in rows]
        med.append(_pct(vals, 0.5))
        lo.append(_pct(vals, 0.25))
        hi.append(_pct(vals, 0.75))
    return med, lo, hi


# ------------------------------------------------------------------------------- output


KEY_LINES = {"default": ("black", "-", 2.4), "tpe multivariate (old default)": ("tab:red", "--", 2.0),
             "random": ("tab:gray", ":", 1.8)}


def plot_curves(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spaces = list(results["spaces"])
    fig, axes = plt.subplots(1, len(spaces), figsize=(7.5 * len(spaces), 5.5), squeeze=False)
    others = plt.get_cmap("tab10")
    for ax, space in zip(axes[0], spaces):
        info = results["spaces"][space]
        rows = sorted(info["samplers"].items(), key=lambda kv: kv[1]["t95"]["median"])
        k = 0
        for name, row in rows:
            med, lo, hi = row["curve_median"], row["curve_p25"], row["curve_p75"]
            xs = list(range(1, len(med) + 1))
            label = f"{name} ({fmt_trials(row['t95']['median'], row.get('budget', info['budget']))})"
            if name in KEY_LINES:
                color, style, width = KEY_LINES[name]
                ax.plot(xs, med, color=color, linestyle=style, linewidth=width, label=label, zorder=3)
                if name != "random":
                    ax.fill_between(xs, lo, hi, color=color, alpha=0.12, zorder=1)
            else:
                ax.plot(xs, med, color=others(k % 10), linewidth=1.0, alpha=0.85, label=label, zorder=2)
                k += 1
        ax.axhline(TARGET, color="black", linestyle="--", linewidth=0.7)
        ax.set_title(f"{space}: {info['points']} points, true front {info['front_points']} points "
                     f"({info.get('seeds', results['seeds'])} seeds, noise "
                     f"{info.get('noise_sigma', results['noise_sigma'])})", fontsize=10)
        ax.set_xlabel("finished trials (baseline = 1)")
        ax.set_ylabel("hypervolume found / true hypervolume (median over seeds)")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right", title="median trials to 95 %  (shaded: 25-75 %)",
                  title_fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_early_stop(es: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spaces = list(es)
    fig, axes = plt.subplots(1, len(spaces), figsize=(7 * len(spaces), 5), squeeze=False)
    for ax, space in zip(axes[0], spaces):
        for label, key in (("full sweep", "off"), ("early stop (all rules)", "all")):
            runs = es[space]["runs"].get(key, [])
            for run in runs:
                hours = [0.0]
                for s in run["trial_hours"]:
                    hours.append(hours[-1] + s)
                ax.step(hours[1:], run["curve"], where="post", alpha=0.35,
                        color="tab:blue" if key == "off" else "tab:orange",
                        label=label if run is runs[0] else None)
        ax.axhline(TARGET, color="black", linestyle="--", linewidth=0.8)
        ax.set_title(f"{space}: HV vs study time, {es[space]['sampler']}")
        ax.set_xlabel("study time (hours, one GPU group; torch.compile cache shared)"
                      if es[space].get("compile_cache") else "study time (hours, one GPU group)")
        ax.set_ylabel("hypervolume found / true hypervolume")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _pool_map(jobs: list[Job], n: int) -> list[dict[str, Any]]:
    out = []
    began = time.monotonic()
    if n <= 1:
        it = map(run_job, jobs)
    else:
        pool = ProcessPoolExecutor(n)
        it = pool.map(run_job, jobs)
    for i, row in enumerate(it, 1):
        out.append(row)
        print(f"  [{i}/{len(jobs)} {time.monotonic() - began:.0f}s] {row['space']} {row['variant']} "
              f"seed {row['seed']}{' ' + row['tag'] if row['tag'] else ''}: t95={row['t95']} "
              f"trials={row['trials']} hv={row['final_hv']} ({row['wall_s']}s)", flush=True)
    if n > 1:
        pool.shutdown()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spaces", default=",".join(SPACES))
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--noise", type=float, default=0.03, help="lognormal sigma of measurements")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--samplers", default="", help="variant names separated by ; (default all)")
    ap.add_argument("--early-stop", action="store_true", help="also measure tuner.study.early_stop")
    ap.add_argument("--early-stop-only", action="store_true")
    ap.add_argument("--no-compile-cache", dest="compile_cache", action="store_false",
                    help="every server start compiles (default: the servers share vLLM's torch.compile "
                         "cache, and the early-stop study also reports what the cache saves)")
    ap.add_argument("--early-stop-sampler", default="default")
    ap.add_argument("--policies", default="", help="early-stop policies separated by ; (default all)")
    ap.add_argument("--quick", action="store_true", help="3 seeds, main samplers only")
    ap.add_argument("--out", default=str(RESULTS / "search_efficiency.json"))
    ap.add_argument("--plot-only", action="store_true", help="redraw the PNGs and tables from the JSON")
    args = ap.parse_args()
    if args.plot_only:
        results = json.loads(Path(args.out).read_text())
        print_table(results, list(results["spaces"]))
        if "early_stop" in results:
            print_early_stop(results["early_stop"])
        plot_curves(results, RESULTS / "search_efficiency.png")
        if "early_stop" in results:
            plot_early_stop(results["early_stop"], RESULTS / "early_stop.png")
        return 0
    if args.quick:
        args.seeds = min(args.seeds, 3)
        args.samplers = args.samplers or "random;tpe multivariate (old default);default"
    spaces = [s for s in args.spaces.split(",") if s]
    chosen = variants([s.strip() for s in args.samplers.split(";") if s.strip()] or None)
    for space in spaces:      # build / load ground truth once, before forking
        spec, truth = _truth(space)
        print(f"[truth] {space}: {len(truth.points)} points, front {len(truth.front)}, "
              f"HV {truth.hypervolume:.2f}, reference {tuple(round(r, 2) for r in truth.reference)}")
    out_path = Path(args.out)
    results: dict[str, Any] = json.loads(out_path.read_text()) if out_path.exists() else {}
    results.setdefault("spaces", {})
    results.update(target=TARGET, noise_sigma=args.noise, seeds=args.seeds)

    if not args.early_stop_only:
        jobs = [Job(space, v, seed, args.noise, BUDGET[space] * v.budget_factor)
                for space in spaces for v in chosen for seed in range(args.seeds)]
        # Slow samplers first so the pool stays busy at the end.
        jobs.sort(key=lambda j: (j.variant.name != "gp", j.variant.workers == 1))
        print(f"[run] {len(jobs)} simulated studies on {args.jobs} process(es)", flush=True)
        rows = _pool_map(jobs, args.jobs)
        for space in spaces:
            spec, truth = _truth(space)
            info = results["spaces"].setdefault(space, {})
            info.update(points=len(truth.points), front_points=len(truth.front), seeds=args.seeds,
                        noise_sigma=args.noise,
                        true_hv=truth.hypervolume, reference=list(truth.reference), budget=BUDGET[space],
                        strict_reference=list(truth.strict_reference),
                        file=SPACES[space])
            samplers = info.setdefault("samplers", {})
            for v in chosen:
                mine = [r for r in rows if r["space"] == space and r["variant"] == v.name]
                budget = BUDGET[space] * v.budget_factor
                med, lo, hi = median_curve(mine, BUDGET[space])
                hours = [r["hours_to_95"] for r in mine if r["hours_to_95"] is not None]
                samplers[v.name] = {
                    "note": v.note, "workers": v.workers,
                    "budget": budget,
                    "t95": t95_stats(mine, budget),
                    "t95_strict": t95_stats([{"t95": r["t95_strict"]} for r in mine], budget),
                    "hours_to_95_median": round(statistics.median(hours), 2) if len(hours) * 2 > len(mine) else None,
                    "final_hv_median": statistics.median(r["final_hv"] for r in mine),
                    "reported_front_hv_median": statistics.median(r["reported_front_hv"] for r in mine),
                    "infeasible_per_run_median": statistics.median(r["infeasible"] for r in mine),
                    "duplicates_per_run_median": statistics.median(r["duplicates"] for r in mine),
                    "curve_median": med, "curve_p25": lo, "curve_p75": hi,
                    "per_seed": [{k: r[k] for k in ("seed", "t95", "trials", "final_hv", "infeasible",
                                                    "duplicates", "proposals", "study_hours")} for r in mine],
                }
        print_table(results, spaces)
        plot_curves(results, RESULTS / "search_efficiency.png")

    if args.early_stop or args.early_stop_only:
        results["early_stop"] = early_stop_study(spaces, args)
        print_early_stop(results["early_stop"])
        plot_early_stop(results["early_stop"], RESULTS / "early_stop.png")

    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(results, indent=1, default=float))
    print(f"[out] {out_path}")
    return 0


def print_table(results: dict[str, Any], spaces: list[str]) -> None:
    for space in spaces:
        info = results["spaces"][space]
        budget = info["budget"]
        print(f"\n{space} ({info['file']}): {info['points']} points, true front {info['front_points']} "
              f"points, budget {budget} trials, {info.get('seeds', results['seeds'])} seeds, "
              f"noise sigma {info.get('noise_sigma', results['noise_sigma'])}")
        print(f"  {'sampler':<28} {'median':>7} {'p25-p75':>11} {'worst':>6} {'reached':>8} "
              f"{'hours':>6} {'HV@end':>7} {'infeas':>6} {'strict':>7}")
        for name, row in sorted(info["samplers"].items(), key=lambda kv: (kv[1]["t95"]["median"], kv[0])):
            t = row["t95"]
            budget = row.get("budget", info["budget"])
            spread = f"{fmt_trials(t['p25'], budget)}-{fmt_trials(t['p75'], budget)}"
            hours = "" if row["hours_to_95_median"] is None else f"{row['hours_to_95_median']:.1f}"
            print(f"  {name:<28} {fmt_trials(t['median'], budget):>7} {spread:>11} "
                  f"{fmt_trials(t['worst'], budget):>6} {t['reached']:>3}/{t['seeds']:<4} {hours:>6} "
                  f"{row['final_hv_median']:>7.3f} {row['infeasible_per_run_median']:>6} "
                  f"{fmt_trials(row['t95_strict']['median'], budget):>7}")
        print("  median / p25-p75 / worst: trials to 95 % of the true hypervolume over seeds (baseline = trial 1);"
              " reached: seeds that got there; hours: median study time to get there (one GPU group);"
              " HV@end: median share at the budget; infeas: trials run on infeasible points;"
              " strict: median trials to 95 % with the strict (10 %) reference")


# ------------------------------------------------------------------------------- early stop


# "all" is what the tuner does (tuner/engine/worker.py + study.sweep_guard.SweepGuard): infeasible
# while starting / at verification / after the probe / on a missed limit, objective levels
# first, dominated exact or on a bound, and inside a level on its window so far. The others
# take it apart.
POLICIES: dict[str, EarlyStopPolicy | None] = {
    "off": None,
    "infeasible at verify": EarlyStopPolicy(dominated=False, reorder=False),
    "infeasible while starting": EarlyStopPolicy(dominated=False, reorder=False, streaming_verify=True),
    "+ bound (1,4,16,64)": EarlyStopPolicy(reorder=False),
    "+ objectives first": EarlyStopPolicy(reorder=True),
    "all but inside a level": EarlyStopPolicy(reorder=True, streaming_verify=True),
    "all, inside a level only at the last dispatch (4a)": EarlyStopPolicy(
        reorder=True, streaming_verify=True, inside=True, inside_margin=math.inf),
    "all, 4b margin 15 %": EarlyStopPolicy(reorder=True, streaming_verify=True, inside=True, inside_margin=0.15),
    "all": EarlyStopPolicy(reorder=True, streaming_verify=True, inside=True),
}


def early_stop_study(spaces: list[str], args: argparse.Namespace) -> dict[str, Any]:
    v = next(x for x in variants(None) if x.name == args.early_stop_sampler)
    rnd = variants(["random"])[0]
    chosen = {k: v for k, v in POLICIES.items() if not args.policies or k in args.policies.split(";")}
    chosen.setdefault("off", None)
    jobs = []
    for space in spaces:
        for seed in range(args.seeds):
            for name, policy in chosen.items():
                jobs.append(Job(space, v, seed, args.noise, BUDGET[space], policy=policy, stop_at_full=False,
                                tag=name, compile_cache=args.compile_cache))
            if args.compile_cache:
                # What the compile cache itself saves: the same studies with every start compiling.
                for name in ("off", "all"):
                    if name in chosen:
                        jobs.append(Job(space, v, seed, args.noise, BUDGET[space], policy=POLICIES[name],
                                        stop_at_full=False, tag=f"{name}, no compile cache",
                                        compile_cache=False))
            # Random search stresses the rule: many more poor and unusual points.
            for name in ("off", "all") if not args.policies else ():
                jobs.append(Job(space, rnd, seed, args.noise, BUDGET[space], policy=POLICIES[name],
                                stop_at_full=False, tag=f"random: {name}", compile_cache=args.compile_cache))
    print(f"[early stop] {len(jobs)} simulated studies", flush=True)
    rows = _pool_map(jobs, args.jobs)
    out: dict[str, Any] = {}
    for space in spaces:
        budget = BUDGET[space]
        tags = [*chosen] + ([] if args.policies else ["random: off", "random: all"])
        tags += [f"{n}, no compile cache" for n in ("off", "all") if args.compile_cache and n in chosen]
        mine = {tag: [r for r in rows if r["space"] == space and r["tag"] == tag] for tag in tags}

        def hours(rows: list[dict[str, Any]]) -> float:
            return sum(r["study_hours"] for r in rows)

        def med(rows: list[dict[str, Any]], key: str) -> float | None:
            vals = [r[key] for r in rows if r[key] is not None]
            return statistics.median(vals) if len(vals) * 2 > len(rows) else None

        policies = {}
        for tag, rs in mine.items():
            off = (mine["random: off"] if tag.startswith("random") else
                   mine["off, no compile cache"] if tag.endswith("no compile cache") else mine["off"])
            by_seed = {r["seed"]: r["study_hours"] for r in off}
            per_seed = [round(1 - r["study_hours"] / by_seed[r["seed"]], 4) for r in rs if by_seed.get(r["seed"])]
            policies[tag] = {
                "study_hours_median": statistics.median(r["study_hours"] for r in rs),
                "time_saved": round(1 - hours(rs) / hours(off), 4),
                "time_saved_per_seed": per_seed,
                "compile_hits": sum(r.get("compile_hits", 0) for r in rs),
                "compile_misses": sum(r.get("compile_misses", 0) for r in rs),
                "compile_saved_hours": round(sum(r.get("compile_saved_hours", 0.0) for r in rs), 3),
                "t95": t95_stats(rs, budget),
                "hours_to_95_median": med(rs, "hours_to_95"),
                "final_hv_median": statistics.median(r["final_hv"] for r in rs),
                "stopped": _sum_dicts(r["stopped"] for r in rs),
                "stopped_after": _sum_dicts(r["stopped_after"] for r in rs),
                "wrong_stops": sum(r["wrong_stops"] for r in rs),
                "true_front_stopped": sum(r["true_front_stopped"] for r in rs),
            }
        cache_effect = {}
        for name in ("off", "all"):
            with_cache, without = mine.get(name), mine.get(f"{name}, no compile cache")
            if with_cache and without:
                cache_effect[name] = round(1 - hours(with_cache) / hours(without), 4)
        out[space] = {
            "sampler": v.name, "budget": budget, "seeds": args.seeds, "policies": policies,
            "compile_cache": bool(args.compile_cache),
            # study time the compile cache saves against every start compiling (same policy)
            "compile_cache_saved": cache_effect,
            "runs": {key: [{"curve": r["curve"], "trial_hours": r["trial_hours"]} for r in mine[key]]
                     for key in ("off", "all") if key in mine},
        }
    return out


def _sum_dicts(items: Any) -> dict[str, int]:
    total: dict[str, int] = {}
    for d in items:
        for k, v in d.items():
            total[k] = total.get(k, 0) + v
    return total


def print_early_stop(es: dict[str, Any]) -> None:
    for space, r in es.items():
        b = r["budget"]
        print(f"\nearly stop on {space}: sampler {r['sampler']}, {b} trials per study, {r['seeds']} seeds")
        print(f"  {'policy':<28} {'saved':>6} {'hours':>6} {'t95':>5} {'h to 95':>7} {'HV@end':>6} "
              f"{'wrong':>5} {'front':>5}  stopped (all seeds)")
        for tag, p in r["policies"].items():
            h95 = "" if p["hours_to_95_median"] is None else f"{p['hours_to_95_median']:.1f}"
            seeds = p.get("time_saved_per_seed") or []
            spread = (f" per seed {100 * min(seeds):.1f}-{100 * max(seeds):.1f}% median "
                      f"{100 * statistics.median(seeds):.1f}%") if seeds and any(seeds) else ""
            hits = (f" compile hits {p['compile_hits']}/{p['compile_hits'] + p['compile_misses']}"
                    if "compile_hits" in p else "")
            print(f"  {tag:<28} {100 * p['time_saved']:>5.1f}% {p['study_hours_median']:>6.1f} "
                  f"{fmt_trials(p['t95']['median'], b):>5} {h95:>7} {p['final_hv_median']:>6.3f} "
                  f"{p['wrong_stops']:>5} {p['true_front_stopped']:>5}  {p['stopped']}{spread}{hits}")
        if r.get("compile_cache_saved"):
            print("  the compile cache itself saves " + ", ".join(
                f"{100 * v:.1f}% ({k})" for k, v in r["compile_cache_saved"].items()) +
                " of study time against every start compiling")
        print("  saved: study time saved vs no early stop (same sampler, seeds, budget); hours: median"
              " study time; wrong: stopped trials whose full measurement would have entered the front;"
              " front: true front points stopped before their objectives were measured")


if __name__ == "__main__":
    if os.environ.get("OMP_NUM_THREADS") is None:
        os.environ["OMP_NUM_THREADS"] = "1"   # GP/torch: one thread per process on 2 cores
    sys.exit(main())
