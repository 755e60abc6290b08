"""Energy sampled beside one level's measured run, and put on the level's metrics.

``LevelMeter(source)`` is entered around the run that sends the level's requests: the
sampler (a thread, tuner.energy.sampler) takes its first reading before the first request
and its last after the last reply, so the steady window lies inside the series. ``attach``
then puts the series on the level's time base (its start, the origin its request records
are measured from) and adds the window's energy to the metrics (tuner.load.level_energy).
Without a source it does nothing, so the levels are measured the same either way. A counter
that stopped answering during the level (tuner.energy.sampler) costs the level its energy
figure, never its measurement, and the sweep's notes say so (``notes``, ``level``).
"""

from __future__ import annotations

from types import TracebackType

from tuner.energy.sampler import EnergySampler
from tuner.energy.series import shifted
from tuner.energy.source import EnergySource
from tuner.load.level_energy import level_energy
from tuner.load.metrics import LevelMetrics

__all__ = ["LevelMeter"]


class LevelMeter:
    """Samples ``source`` while the level runs (None: no energy source, nothing sampled)."""

    def __init__(self, source: EnergySource | None, notes: list[str] | None = None, level: str = "") -> None:
        self.source = source
        self._notes, self._level = notes, level
        self._sampler = None if source is None else EnergySampler(source)
        self._series: list[tuple[float, float]] = []
        self.origin: float | None = None

    def __enter__(self) -> LevelMeter:
        if self._sampler is not None:
            self._sampler.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._sampler is not None:
            self._series = self._sampler.stop()
            if self._sampler.hung and self._notes is not None:
                self._notes.append(f"{self._level}: energy not measured: {self._sampler.last_error}")

    def started(self, origin: float) -> None:
        """The level's time base (``run_level``'s ``on_start``): its records' zero on the
        sampler's clock (time.monotonic)."""
        self.origin = origin

    def attach(self, metrics: LevelMetrics, origin: float | None = None) -> LevelMetrics:
        """``metrics`` with the energy of its window, the series put on the level's time base
        (``origin``, else what :meth:`started` was told). Unchanged without a source, a time
        base or a covered window."""
        origin = self.origin if origin is None else origin
        if self.source is None or not self._series or origin is None:
            return metrics
        found = level_energy(
            shifted(self._series, origin), source=self.source.name, resolution=self.source.resolution,
            window_start_s=metrics.window_start_s, window_end_s=metrics.window_end_s,
            subwindow_output_tok_s=metrics.subwindow_output_tok_s, subwindow_s=metrics.subwindow_s,
            output_tok_s=metrics.output_tok_s, total_output_tokens=metrics.total_output_tokens,
            completed=metrics.completed)
        return metrics if found is None else metrics.model_copy(update={"energy": found})
