"""What an energy source is, and what stands in for one where nothing can be read.

A source reads one cumulative energy figure in joules for everything it covers (all GPUs
of the trial's group, all CPU packages): never decreasing, counter wrap-around and units
already undone, so the sampler and the pure arithmetic see one plain counter. Its zero is
arbitrary (when it was opened); only differences mean anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from tuner.energy.per_token import CounterResolution

__all__ = ["EnergySource", "NoEnergySource"]


@runtime_checkable
class EnergySource(Protocol):
    """A readable energy counter (RAPL, NVML, the simulator's powercap directory)."""

    @property
    def name(self) -> str:
        """What is read, in words, for the study's notes (e.g. 'NVML energy counter, GPUs 0,1')."""
        ...

    @property
    def resolution(self) -> CounterResolution:
        """How exactly one reading is known (the per-token interval's counter term)."""
        ...

    def read(self) -> float:
        """Joules since the source was opened (never decreasing). Called from the sampler's
        thread only, one call at a time; raises OSError when the counter cannot be read."""
        ...

    def close(self) -> None:
        """Stop whatever the source runs (a power-sampling thread, an NVML session)."""
        ...


@dataclass(frozen=True, slots=True)
class NoEnergySource:
    """Nothing can be read here; ``reason`` is the one line a study or ``validate`` shows."""

    reason: str
