"""Which energy source a trial can use, or the one line saying why there is none.

The choice, in order:

1. An explicit powercap root (the simulator's ``TUNER_SIM_POWERCAP_DIR``, a test's
   directory): its RAPL-format counters, whatever else the machine has. The simulator's
   GPUs are not real, so NVML must not be asked about them.
2. A trial with GPUs: NVML over exactly those GPUs. The CPU packages' RAPL counters are not
   a stand-in: they measure the host, not the GPUs that do the serving.
3. A trial without GPUs (a CPU build): RAPL under /sys/class/powercap.

``validate`` and preflight refuse energy objectives with :func:`energy_unavailable`'s
reason; a study without energy objectives records the reason once and goes on.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tuner.energy.nvml import POWER_PERIOD_S, open_nvml
from tuner.energy.rapl import DEFAULT_POWERCAP_ROOT, RAPL_UPDATE_S, open_rapl
from tuner.energy.source import EnergySource, NoEnergySource

__all__ = ["SIM_POWERCAP_DIR_ENV", "SIM_WRITE_PERIOD_S", "detect_energy_source", "energy_unavailable"]

# Where the simulator keeps its RAPL-format counters (tuner.sim.power writes them), and how
# often it writes them: how stale a reading of them may be (NVML's own counter: ~100 ms).
SIM_POWERCAP_DIR_ENV = "TUNER_SIM_POWERCAP_DIR"
SIM_WRITE_PERIOD_S = 0.1


def detect_energy_source(gpus: Sequence[int | str], *, powercap_root: Path | None = None,
                         powercap_update_s: float = RAPL_UPDATE_S, nvml: Any | None = None,
                         power_period_s: float = POWER_PERIOD_S) -> EnergySource | NoEnergySource:
    """The source for a trial on ``gpus`` (indices or UUIDs; empty: a CPU build), opened
    and read once, or the reason there is none. The caller closes a source it got.

    ``powercap_update_s``: how stale the powercap counter may be (hardware RAPL: 1 ms; the
    simulator writes its counter at 20 Hz, :data:`tuner.sim.power.WRITE_PERIOD_S`).
    ``nvml``: a stand-in for the ``pynvml`` module (tests).
    """
    if powercap_root is not None:
        return open_rapl(powercap_root, powercap_update_s)
    if gpus:
        return open_nvml(gpus, power_period_s, nvml)
    return open_rapl(DEFAULT_POWERCAP_ROOT, powercap_update_s)


def energy_unavailable(gpus: Sequence[int | str], *, powercap_root: Path | None = None,
                       nvml: Any | None = None) -> str | None:
    """Why energy cannot be measured for a trial on ``gpus`` (one line), or None when it
    can; the source it opened to find out is closed again."""
    found = detect_energy_source(gpus, powercap_root=powercap_root, nvml=nvml)
    if isinstance(found, NoEnergySource):
        return found.reason
    found.close()
    return None
