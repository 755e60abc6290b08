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

Every reading is the thread's, never the caller's: a source that stops answering (a GPU
whose driver is wedged, an NFS-mounted sysfs) holds the level up for at most
``START_WAIT_S`` at its start and ``STOP_WAIT_S`` at its end, then the level goes on
without the readings it did not give: its window is not covered, so it carries no energy
figure (tuner.load.level_energy) rather than a hang until the trial's deadline.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType

from tuner.energy.source import EnergySource

__all__ = ["DEFAULT_PERIOD_S", "START_WAIT_S", "STOP_WAIT_S", "EnergySampler"]

DEFAULT_PERIOD_S = 0.05
# How long start waits for the first reading and stop for the thread's last: a reading
# takes microseconds (sysfs) to a millisecond (NVML), so these are only ever reached by a
# source that hangs.
START_WAIT_S = 1.0
STOP_WAIT_S = 2.0


class EnergySampler:
    """``(t, joules)`` samples of ``source`` every ``period_s`` between start and stop.

    Usable as a context manager (``with EnergySampler(src) as s: ...; s.series``). A
    reading that fails (OSError, or the source's own error) is skipped and counted in
    ``failed_reads``: the interpolation spans the gap. A reading that does not return is
    waited for only so long (module doc); ``hung`` then says so and the series ends before
    it. The source is not closed here; its owner closes it.
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
        self._first = threading.Event()
        self.failed_reads = 0
        self.last_error: str | None = None
        self.hung = False

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
        self._sample()
        self._first.set()
        while not self._stop.wait(self.period_s):
            self._sample()
        self._sample()      # the last reading, after the level's last reply

    def start(self) -> None:
        """Start the thread, which reads at once and then every ``period_s``; returns once
        the first reading is in (or ``START_WAIT_S`` passed), so it precedes the level."""
        if self._thread is not None:
            raise RuntimeError("the sampler is already running")
        self._stop.clear()
        self._first.clear()
        self._thread = threading.Thread(target=self._run, name="energy-sampler", daemon=True)
        self._thread.start()
        if not self._first.wait(START_WAIT_S):
            self._note_hung(f"the first reading did not return in {START_WAIT_S:g} s")

    def stop(self) -> list[tuple[float, float]]:
        """Stop the thread (it takes a last reading, waited for up to ``STOP_WAIT_S``) and
        return the series."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(STOP_WAIT_S)
            if self._thread.is_alive():
                # Left to finish on its own (a daemon): whatever it reads later is not used.
                self._note_hung(f"a reading did not return in {STOP_WAIT_S:g} s")
            self._thread = None
        return self.series

    def _note_hung(self, what: str) -> None:
        if not self.hung:       # the first hang is the cause; stop then waits on the same read
            self.hung = True
            self.last_error = f"{self.source.name}: {what}"

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
