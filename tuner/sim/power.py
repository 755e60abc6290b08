"""The simulated hardware's power, written as a RAPL-format energy counter.

With ``TUNER_SIM_POWERCAP_DIR=DIR`` the simulator keeps a powercap tree there, one package
zone per device it serves on (the TP x PP GPUs of a CUDA profile, the CPU packages of a CPU
one): ``DIR/intel-rapl:N/{name, energy_uj, max_energy_range_uj}``, the files
:mod:`tuner.energy.rapl` reads from /sys/class/powercap. So the tuner's whole energy path
runs against it without a GPU.

Each device draws ``idle_w + (busy_w - idle_w) * utilisation`` (the profile's ``power``),
utilisation being the share of time the engine has work (a request waiting or running):
from the first step after work arrives until nothing is left. The counter is exact at the
moment it is written, every ``WRITE_PERIOD_S`` (10 Hz): a task in the engine's event loop,
which knows when the engine has work without locks, computes it, and a thread writes the
files.

Power is drawn in *simulated* time: at ``TUNER_SIM_TIME_SCALE`` s, one wall second is
1/s simulated seconds, so the counter advances ``P / s`` joules per wall second. Throughput
at scale s is 1/s times the modelled hardware's too, so joules per token come out as the
profile's hardware would spend, whatever the scale.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path

from tuner.adapters.artifacts import make_private_dir, open_private
from tuner.energy.detect import SIM_POWERCAP_DIR_ENV, SIM_WRITE_PERIOD_S
from tuner.sim.profile import PowerSpec

__all__ = ["POWERCAP_DIR_ENV", "RANGE_UJ", "WRITE_PERIOD_S", "BusyClock", "PowercapDir", "energy_j",
           "write_counters"]

# The variable and how often the counter is written (a reader sees a value at most this
# stale): named in tuner.energy.detect, which the tuner's worker reads them with. 10 Hz is
# NVML's own counter's refresh, and a file write per device every 100 ms.
POWERCAP_DIR_ENV = SIM_POWERCAP_DIR_ENV
WRITE_PERIOD_S = SIM_WRITE_PERIOD_S
# A real package zone's max_energy_range_uj (2^38 - 1 scaled: 262 kJ), so the counter
# wraps as a real one does, after ~6 minutes of 700 W.
RANGE_UJ = 262_143_328_850


class BusyClock:
    """Seconds the engine had work, on the clock the caller passes."""

    def __init__(self) -> None:
        self._total = 0.0
        self._since: float | None = None

    def work(self, now: float) -> None:
        """Work arrived (no effect while already busy)."""
        if self._since is None:
            self._since = now

    def idle(self, now: float) -> None:
        """Nothing is left to do."""
        if self._since is not None:
            self._total += now - self._since
            self._since = None

    def seconds(self, now: float) -> float:
        """Busy seconds up to ``now``, the stretch in progress included."""
        return self._total + (now - self._since if self._since is not None else 0.0)


def energy_j(spec: PowerSpec, wall_s: float, busy_s: float, time_scale: float) -> float:
    """Joules one device drew in ``wall_s`` wall seconds of which the engine was busy
    ``busy_s``, counted in simulated seconds (wall / ``time_scale``)."""
    return (spec.idle_w * wall_s + (spec.busy_w - spec.idle_w) * busy_s) / time_scale


class PowercapDir:
    """A powercap tree of ``zones`` package zones under ``root``, each counter at zero.

    It lives in the study's folder, so it is owner-only like the rest of it (0700 folders,
    0600 files), whatever the umask."""

    def __init__(self, root: Path, zones: int) -> None:
        self.paths = [root / f"intel-rapl:{i}" for i in range(zones)]
        for i, path in enumerate(self.paths):
            make_private_dir(path)
            _write(path / "name", f"package-{i}\n")
            _write(path / "max_energy_range_uj", f"{RANGE_UJ}\n")
        self.write(0.0)

    def write(self, joules: float) -> None:
        """Every zone's counter to ``joules`` (wrapped as RAPL wraps). Replaced, not
        rewritten in place, so a reader never sees half a number."""
        text = f"{int(joules * 1e6) % RANGE_UJ}\n"
        for path in self.paths:
            tmp = path / ".energy_uj.tmp"
            _write(tmp, text)
            os.replace(tmp, path / "energy_uj")


def _write(path: Path, text: str) -> None:
    """``text`` into an owner-only file (no fsync: a counter 10 times a second is not kept)."""
    with open_private(path, "w") as fh:
        fh.write(text)


async def write_counters(root: Path, zones: int, spec: PowerSpec, busy: BusyClock, time_scale: float,
                         clock: Callable[[], float] = time.monotonic,
                         period_s: float = WRITE_PERIOD_S) -> None:
    """Keep the counters of ``zones`` devices under ``root`` current until cancelled."""
    tree = PowercapDir(root, zones)
    start = clock()
    while True:
        await asyncio.sleep(period_s)
        now = clock()
        # The files are written from a thread: a write per device (8 on a TP-8 profile) on a
        # busy host must not hold up the event loop that streams the simulated tokens.
        await asyncio.to_thread(tree.write, energy_j(spec, now - start, busy.seconds(now), time_scale))
