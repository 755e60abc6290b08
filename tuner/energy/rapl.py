"""RAPL energy counters through Linux powercap sysfs (CPU builds; the simulator's stand-in).

Each top-level zone ``<root>/intel-rapl:N`` is one CPU package (socket) and holds
``energy_uj`` (microjoules, wrapping to zero past ``max_energy_range_uj``) and ``name``
(``package-N``). Its subzones ``intel-rapl:N:M`` (core, uncore, dram) are parts of the
package, so only package zones are summed: adding the subzones would count their energy
twice. A top-level ``psys`` zone (the whole platform, on some laptops) contains the
packages and is left out for the same reason; AMD CPUs expose their package counters under
the same ``intel-rapl`` names.

The root is a parameter, so tests and the simulator (``TUNER_SIM_POWERCAP_DIR``,
:mod:`tuner.sim.power`) can point it at a directory of their own.
"""

from __future__ import annotations

import re
from pathlib import Path

from tuner.energy.per_token import CounterResolution
from tuner.energy.series import counter_delta
from tuner.energy.source import NoEnergySource

__all__ = ["DEFAULT_POWERCAP_ROOT", "RAPL_UPDATE_S", "RaplSource", "open_rapl", "package_zones"]

DEFAULT_POWERCAP_ROOT = Path("/sys/class/powercap")
# Intel documents the RAPL energy status as updated about every millisecond.
RAPL_UPDATE_S = 0.001
# energy_uj counts microjoules.
_QUANTUM_J = 1e-6
_PACKAGE_ZONE = re.compile(r"intel-rapl:\d+")


def package_zones(root: Path) -> list[Path]:
    """The package zones under ``root`` (top-level ``intel-rapl:N`` named ``package-*``),
    in zone order; raises OSError when ``root`` cannot be listed."""
    zones = []
    for path in root.iterdir():
        if not _PACKAGE_ZONE.fullmatch(path.name):
            continue     # a subzone (intel-rapl:N:M), the control type, another driver's zone
        try:
            name = (path / "name").read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError):
            continue
        if name.startswith("package"):
            zones.append(path)
    return sorted(zones, key=lambda p: int(p.name.rpartition(":")[2]))


class RaplSource:
    """The summed package counters of ``zones``, in joules since the source was opened."""

    def __init__(self, zones: list[Path], update_s: float = RAPL_UPDATE_S) -> None:
        if not zones:
            raise ValueError("no RAPL package zone given")
        self.zones = list(zones)
        self._resolution = CounterResolution(_QUANTUM_J, update_s)
        self._ranges = [self._read_uj(z / "max_energy_range_uj") for z in self.zones]
        self._last = [self._read_uj(z / "energy_uj") for z in self.zones]
        self._total_uj = 0

    @staticmethod
    def _read_uj(path: Path) -> int:
        try:
            return int(path.read_text(encoding="ascii").strip())
        except ValueError as exc:
            raise OSError(f"{path}: not a counter ({exc})") from exc

    @property
    def name(self) -> str:
        # A many-socket host (or the simulator's eight GPUs) would make one status line a list.
        names = [z.name for z in self.zones]
        shown = ", ".join(names) if len(names) <= 2 else f"{names[0]} ... {names[-1]}, {len(names)} packages"
        return f"RAPL package counters ({shown} under {self.zones[0].parent})"

    @property
    def resolution(self) -> CounterResolution:
        return self._resolution

    def read(self) -> float:
        for i, zone in enumerate(self.zones):
            now = self._read_uj(zone / "energy_uj")
            self._total_uj += int(counter_delta(self._last[i], now, self._ranges[i]))
            self._last[i] = now
        return self._total_uj * _QUANTUM_J

    def close(self) -> None:
        return None


def open_rapl(root: Path = DEFAULT_POWERCAP_ROOT,
              update_s: float = RAPL_UPDATE_S) -> RaplSource | NoEnergySource:
    """The RAPL package counters under ``root``, read once to be sure they can be, or the
    reason there are none."""
    try:
        zones = package_zones(root)
    except FileNotFoundError:
        return NoEnergySource(f"no RAPL counters: {root} does not exist (not exposed on this machine)")
    except OSError as exc:
        return NoEnergySource(f"no RAPL counters: {root} cannot be listed ({exc.strerror or exc})")
    if not zones:
        return NoEnergySource(f"no RAPL counters under {root} (no intel-rapl package zone: not exposed "
                              "on this machine, or not readable)")
    try:
        return RaplSource(zones, update_s)
    except PermissionError:
        # Kernels since late 2020 (the PLATYPUS side channel) let only root read energy_uj.
        return NoEnergySource(f"RAPL counters under {root} are not readable by this user (energy_uj is "
                              "root-only on current kernels)")
    except OSError as exc:
        return NoEnergySource(f"RAPL counters under {root} cannot be read ({exc})")
