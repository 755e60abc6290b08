"""How steady a host's own CPUs are: the figures of `tuner host-check` (pure).

At low concurrency a small model's token is host-side Python (API server, scheduler, kernel
launches), so its speed is the speed of the CPU the engine core happens to run on. A host
whose CPUs change speed by themselves (a VM beside busy neighbours, a laptop's turbo) sets a
floor under every between-start comparison that no load setting removes. The probe times a
fixed piece of CPU work back to back on a few CPUs (tuner.adapters.host_probe); this module
turns those times into the spread of their 1-s and 5-s means, their correlation between CPUs
(near 1: the whole host changes speed; near 0: each CPU has its own neighbours) and a
verdict against a study's ``load.noise_floor``.
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass

__all__ = ["CpuSteadiness", "HostSteadiness", "MIN_SECONDS", "buckets", "check_text", "summarize"]

# Two 5-s means at least, or the spread over 5 s has no meaning.
MIN_SECONDS = 10.0
# Steal above this share of CPU time is a hypervisor taking CPUs away: said on its own line.
STEAL_NOTICE = 0.01


def buckets(series_ms: list[float], width_s: float) -> list[float]:
    """Means of consecutive ``width_s`` stretches of back-to-back run times (ms); a run
    belongs to the stretch it started in, and a last stretch cut short by the end of the
    probe (its runs add up to under 80 % of ``width_s``) is dropped. Counting runs instead
    would drop a full stretch whose runs were slow: the very thing measured."""

    out: dict[int, list[float]] = {}
    clock_ms = 0.0
    for t in series_ms:
        out.setdefault(int(clock_ms / 1e3 / width_s), []).append(t)
        clock_ms += t
    keys = sorted(out)
    if len(keys) > 1 and math.fsum(out[keys[-1]]) < 0.8 * width_s * 1e3:
        keys = keys[:-1]
    return [statistics.fmean(out[k]) for k in keys]


def _cv(values: list[float]) -> float | None:
    return statistics.stdev(values) / statistics.fmean(values) if len(values) > 1 else None


@dataclass(frozen=True)
class CpuSteadiness:
    cpu: int
    runs: int
    mean_ms: float
    cv_1s: float | None
    cv_5s: float | None
    slowest_5s_ms: float
    fastest_5s_ms: float


@dataclass(frozen=True)
class HostSteadiness:
    cpus: tuple[CpuSteadiness, ...]
    correlation_5s: tuple[tuple[int, int, float], ...]
    steal_fraction: float | None

    @property
    def worst_cv_5s(self) -> float | None:
        """The largest CV of 5-s means over the CPUs probed: the floor to plan with."""
        cvs = [c.cv_5s for c in self.cpus if c.cv_5s is not None]
        return max(cvs) if cvs else None

    def to_dict(self) -> dict[str, object]:
        return {
            "cpus": [c.__dict__ for c in self.cpus],
            "correlation_5s": [{"cpus": [a, b], "r": r} for a, b, r in self.correlation_5s],
            "steal_fraction": self.steal_fraction,
            "worst_cv_5s": self.worst_cv_5s,
        }

    def render(self) -> str:
        lines = ["cpu   runs  mean ms  CV of 1-s means  CV of 5-s means  5-s means (ms)"]
        for c in self.cpus:
            lines.append(f"{c.cpu:>3}  {c.runs:5d}  {c.mean_ms:7.2f}  {_pct(c.cv_1s):>15}  {_pct(c.cv_5s):>15}"
                         f"  {c.fastest_5s_ms:.1f}-{c.slowest_5s_ms:.1f}"
                         f" (x{c.slowest_5s_ms / c.fastest_5s_ms:.2f})")
        if self.correlation_5s:
            lines.append("correlation of the 5-s means between CPUs: " + ", ".join(
                f"{a}-{b} {r:+.2f}" for a, b, r in self.correlation_5s))
        if self.steal_fraction is not None:
            lines.append(f"steal: {100 * self.steal_fraction:.2f} % of CPU time")
        return "\n".join(lines)

    def verdict(self, noise_floor: float | None) -> list[str]:
        """What the figures mean for a study with this ``load.noise_floor`` (None: no study)."""

        out: list[str] = []
        worst = self.worst_cv_5s
        if self.steal_fraction is not None and self.steal_fraction > STEAL_NOTICE:
            out.append(f"the hypervisor took {100 * self.steal_fraction:.1f} % of the CPU time (steal): "
                       "another guest runs on these CPUs")
        if worst is None:
            # Runs so slow (a CPU busy with other work) that no CPU finished two 5-s stretches.
            slowest = max(c.slowest_5s_ms for c in self.cpus) if self.cpus else 0.0
            out.append(f"too short to judge: no CPU finished two full 5-s stretches (a stretch's runs "
                       f"averaged up to {slowest:.0f} ms, so the CPU was busy with other work); probe "
                       f"longer with --seconds on an otherwise idle box")
            return out
        if len(self.cpus) == 1:
            shape = " (one CPU probed)"
        elif not self.correlation_5s:
            shape = " (too short a probe to tell whether the CPUs move together)"
        elif max(r for _, _, r in self.correlation_5s) < 0.5:
            shape = ", each CPU on its own (neighbours on the physical host, not its clock)"
        elif min(r for _, _, r in self.correlation_5s) >= 0.5:
            shape = ", the CPUs together (the host's clock or power)"
        else:
            # Some pairs move together, others against each other: neither one cause alone.
            shape = ", some CPUs together and others not (neighbours on the physical host)"
        out.append(f"the CPUs' own speed varies by a CV of {100 * worst:.1f} % over 5-s stretches{shape}: "
                   f"at low concurrency, where a small model's speed is the CPU's, expect fresh starts "
                   f"of one configuration to differ by about that much")
        if noise_floor is not None:
            if noise_floor < worst:
                out.append(f"load.noise_floor {noise_floor:g} is below it: differences the host makes on "
                           f"its own can rank configurations; set load.noise_floor to at least "
                           f"{worst:.2f} (docs/measurement.md)")
            else:
                out.append(f"load.noise_floor {noise_floor:g} covers it")
        return out


def check_text(entry: dict[str, object]) -> str:
    """One line for a study's recorded host check (an entry of host-check.json), as `tuner
    status` and the report show it."""

    worst, floor, at = entry.get("worst_cv_5s"), entry.get("noise_floor"), entry.get("at", "?")
    if not isinstance(worst, (int, float)):
        return f"host check {at}: too short to judge"
    verdict = ""
    if isinstance(floor, (int, float)):
        verdict = (f"; load.noise_floor {floor:g} is BELOW it, set at least {worst:.2f}" if floor < worst
                   else f"; load.noise_floor {floor:g} covers it")
    return f"host check {at}: the CPUs' own speed varied by {100 * worst:.1f} % over 5-s stretches{verdict}"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f} %"


def summarize(per_cpu: dict[int, list[float]], steal_fraction: float | None) -> HostSteadiness:
    """The figures of a probe: back-to-back run times (ms) per CPU, and the steal share."""

    rows: list[CpuSteadiness] = []
    fives: dict[int, list[float]] = {}
    for cpu in sorted(per_cpu):
        series = per_cpu[cpu]
        if not series:
            raise ValueError(f"CPU {cpu}: no run finished")
        five = buckets(series, 5.0)
        fives[cpu] = five
        rows.append(CpuSteadiness(cpu=cpu, runs=len(series), mean_ms=statistics.fmean(series),
                                  cv_1s=_cv(buckets(series, 1.0)), cv_5s=_cv(five),
                                  slowest_5s_ms=max(five), fastest_5s_ms=min(five)))
    correlation: list[tuple[int, int, float]] = []
    for a, b in itertools.combinations(sorted(fives), 2):
        n = min(len(fives[a]), len(fives[b]))
        xs, ys = fives[a][:n], fives[b][:n]
        if n > 2 and statistics.pstdev(xs) > 0 and statistics.pstdev(ys) > 0:
            correlation.append((a, b, statistics.correlation(xs, ys)))
    return HostSteadiness(tuple(rows), tuple(correlation), steal_fraction)
