"""Samples an energy source beside a level, from a background thread.

A thread rather than an asyncio task: reading sysfs or NVML blocks (a few microseconds to
a millisecond), and the load generator's event loop must not be held up by it, nor the
samples delayed by a busy loop (:mod:`tuner.load.loop_lag`). Every ``period_s`` the thread
reads the source and stamps the reading with ``time.monotonic()`` (the clock the level's
request records are measured on); the series runs from just before the level to just
after it (:meth:`EnergySampler.stop` takes a last sample), so the steady window is inside
it. 50 ms: twenty readings a second cost nothing measurable, and the interpolation at the
window's ends (:mod:`tuner.energy.series`) is then far finer than the counters' own
refresh (NVML ~100 ms).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType

from tuner.energy.source import EnergySource

__all__ = ["DEFAULT_PERIOD_S", "EnergySampler"]

DEFAULT_PERIOD_S = 0.05


class EnergySampler:
    """``(t, joules)`` samples of ``source`` every ``period_s`` between start and stop.

    Usable as a context manager (``with EnergySampler(src) as s: ...; s.series``). A
    reading that fails (OSError, or the source's own error) is skipped and counted in
    ``failed_reads``: the interpolation spans the gap. The source is not closed here; its
    owner closes it.
    """

    def __init__(self, source: EnergySource, period_s: float = DEFAULT_PERIOD_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if period_s <= 0:
            raise ValueError(f"period_s must be > 0, got {period_s}")
        self.source = source
        self.period_s = period_s
        self.clock = clock
        self._samples: list[tuple[float, float]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.failed_reads = 0
        self.last_error: str | None = None

    def _sample(self) -> None:
        before = self.clock()
        try:
            joules = self.source.read()
        except Exception as exc:  # any source's failure is one lost sample
            self.failed_reads += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            return
        # Stamped at the middle of the read: an NVML call can take a millisecond.
        t = (before + self.clock()) / 2
        with self._lock:
            self._samples.append((t, joules))

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self._sample()

    def start(self) -> None:
        """Take a first sample now, then one every ``period_s`` from a thread."""
        if self._thread is not None:
            raise RuntimeError("the sampler is already running")
        self._stop.clear()
        self._sample()
        self._thread = threading.Thread(target=self._run, name="energy-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> list[tuple[float, float]]:
        """Stop the thread (joined before returning), take a last sample, return the series."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self._sample()
        return self.series

    @property
    def series(self) -> list[tuple[float, float]]:
        """The samples so far (a copy), in time order."""
        with self._lock:
            return list(self._samples)

    def __enter__(self) -> EnergySampler:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
