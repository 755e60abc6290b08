"""Which energy counter a trial's levels are sampled from, opened once the server is up.

A real server: NVML over the GPUs Ray gave this worker (``CUDA_VISIBLE_DEVICES``), or RAPL
on a CPU build (tuner.energy.detect). The simulator plays the hardware: started with
``TUNER_SIM_POWERCAP_DIR`` it writes RAPL-format counters for the devices it models, and
the worker reads those instead, so the whole energy path runs without a GPU. The directory
is in the study's folder, one per worker process, not per trial: a spare interpreter started
for the next trial (execution.startup.prestart) must see the environment that trial's server
will get.

Where nothing can be read, the trial's levels carry no energy figures, and the first trial
of the worker says why in its warnings (an energy objective is refused before the study
starts, at validate; this is the note for a study that did not ask).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tuner.adapters.artifacts import StudyPaths
from tuner.energy.detect import SIM_POWERCAP_DIR_ENV, SIM_WRITE_PERIOD_S, detect_energy_source, energy_unavailable
from tuner.energy.per_token import IdleDraw, idle_draw
from tuner.energy.sampler import EnergySampler
from tuner.energy.source import EnergySource, NoEnergySource
from tuner.load.level_energy import ENERGY_KEYS
from tuner.study.simulated import is_simulator
from tuner.study.spec import StudySpec

__all__ = ["TrialEnergy", "energy_refusal", "simulator_energy_env", "worker_energy_refusal"]

# The idle interval: five parts of 0.6 s (its interval's spread, tuner.energy.per_token) are
# ten of NVML's ~100 ms counter refreshes each; 3 s once per worker is nothing against a trial.
IDLE_S = 3.0
SETTLE_S = 0.5

_noted = False
_idle: dict[str, IdleDraw] = {}


def energy_refusal(spec: StudySpec) -> str | None:
    """Why the study's energy objectives or limits cannot be measured on this machine (one
    line naming the first of them), or None: it names none, serves the simulator, or a
    counter can be read (NVML over its first GPUs, RAPL on a CPU build)."""
    named: list[tuple[str, str]] = [(f"objectives[{i}]", o.metric) for i, o in enumerate(spec.objectives)]
    named += [(f"limits[{i}]", lim.metric) for i, lim in enumerate(spec.limits)]
    for where, metric in named:
        if metric in ENERGY_KEYS and not is_simulator(spec.server.command):
            reason = energy_unavailable(list(range(spec.server.gpus_per_trial)))
            if reason is not None:
                return (f"{where}.metric: {metric} needs an energy counter, and none can be read on this "
                        f"machine: {reason}")
    return None


def worker_energy_refusal(command: Sequence[str], gpus: str | None) -> str | None:
    """Why this worker could not read its trials' energy (one line), or None: it can, or its
    servers are the simulator, which writes counters of its own. On a Ray cluster a node
    where this is not None gets no trial of a study that names an energy objective or limit
    (validate and run check only the driver's machine there)."""
    if is_simulator(command):
        return None
    return energy_unavailable(_gpu_list(gpus))


def _gpu_list(gpus: str | None) -> list[str]:
    """The worker's GPUs as ``CUDA_VISIBLE_DEVICES`` names them (indices or UUIDs)."""
    return [g for g in (gpus or "").split(",") if g.strip()]


def _powercap_dir(trial_dir: str | Path) -> Path:
    """Where this worker's simulator writes its counters: in the study's folder (beside its
    vllm-cache, gone with it), one folder per worker process, the same for all its trials.

    A job's folder sits at some depth in the study's (trials/0007, confirm/0007-1,
    reference): the study's is the nearest above it holding study.json."""
    here = Path(trial_dir).resolve()
    study = next((p for p in here.parents if StudyPaths(p).study_json.is_file()), here.parent)
    return study / "sim-powercap" / str(os.getpid())


def simulator_energy_env(argv: Sequence[str], trial_dir: str | Path) -> dict[str, str]:
    """The environment the simulator writes its counters by; nothing for a real server."""
    return {SIM_POWERCAP_DIR_ENV: str(_powercap_dir(trial_dir))} if is_simulator(argv) else {}


class TrialEnergy:
    """The trial's energy source (``source``; None: none), and the note on why there is none.

    ``record()`` is what the trial's outcome keeps: the source, and - in a study that names an
    energy objective or limit - the idle draw, measured once per worker process (the first
    trial with a source: ``IDLE_S`` seconds with the server up and no request in flight, after
    ``SETTLE_S`` for the probe's last kernels to finish) and repeated in every later outcome
    of that worker. Other studies do not spend those seconds; their levels still carry energy.
    """

    def __init__(self, argv: Sequence[str], gpus: str | None, trial_dir: str | Path) -> None:
        global _noted
        if is_simulator(argv):
            found = detect_energy_source([], powercap_root=_powercap_dir(trial_dir),
                                         powercap_update_s=SIM_WRITE_PERIOD_S)
        else:
            found = detect_energy_source(_gpu_list(gpus))
        self.source: EnergySource | None = None if isinstance(found, NoEnergySource) else found
        # What status says it read: the simulator's counters are its model, not this machine's.
        self.label = None if self.source is None else (
            f"the simulator's modelled power ({self.source.name})" if is_simulator(argv) else self.source.name)
        self.notes: list[str] = []
        self.reason = found.reason if isinstance(found, NoEnergySource) else None
        if isinstance(found, NoEnergySource) and not _noted:
            _noted = True
            self.notes.append(f"energy not measured: {found.reason}")

    async def record(self, *, measure_idle: bool) -> dict[str, Any]:
        """The outcome's energy record, measuring the idle draw first if this worker has not
        and ``measure_idle`` (the study names an energy objective or limit)."""
        if self.source is None:
            return {"unavailable": self.reason}
        idle = _idle.get(self.source.name)
        if idle is None and not measure_idle:
            return {"source": self.label}
        if idle is None:
            await asyncio.sleep(SETTLE_S)
            with EnergySampler(self.source) as sampler:
                began = time.monotonic()
                await asyncio.sleep(IDLE_S)
                ended = time.monotonic()
            try:
                idle = _idle[self.source.name] = idle_draw(sampler.series, began, ended, self.source.resolution)
            except ValueError:      # the counter could not be read through the interval
                return {"source": self.label}
        return {"source": self.label, "idle_w": idle.watts, "idle_ci95": idle.ci95, "idle_s": idle.seconds}

    def __enter__(self) -> TrialEnergy:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.source is not None:
            self.source.close()
