"""Injected measurement noise (the profile's ``noise:`` section): a step-time factor.

Pure: the engine passes the time since its first request and, once, the seed (a fresh one
per server start unless the profile fixes it), so a test can reproduce every draw.
"""

from __future__ import annotations

import random

from tuner.sim.profile import NoiseSpec

__all__ = ["StepNoise"]


class StepNoise:
    """Multiplies a step's duration: warm-up ramp x per-period jitter x per-start speed."""

    def __init__(self, spec: NoiseSpec, seed: int) -> None:
        self.spec = spec
        self.seed = seed
        rng = random.Random(f"tuner-sim-start|{seed}")
        s = spec.start_spread
        # A faster start divides step times: speed 1.2 makes every step 1/1.2 as long.
        self.start_factor = 1.0 / rng.uniform(1 - s, 1 + s) if s > 0 else 1.0
        self._period = -1
        self._jitter = 1.0

    @property
    def active(self) -> bool:
        s = self.spec
        return (s.throughput_jitter > 0 or (s.warmup_ramp_s > 0 and s.warmup_slowdown > 0)
                or s.start_spread > 0)

    def factor(self, since_first_request_s: float) -> float:
        s = self.spec
        t = max(0.0, since_first_request_s)
        out = self.start_factor
        if s.warmup_ramp_s > 0 and t < s.warmup_ramp_s:
            out *= 1.0 + s.warmup_slowdown * (1.0 - t / s.warmup_ramp_s)
        if s.throughput_jitter > 0:
            period = int(t / s.jitter_period_s)
            if period != self._period:
                rng = random.Random(f"tuner-sim-jitter|{self.seed}|{period}")
                j = s.throughput_jitter
                self._period, self._jitter = period, rng.uniform(1 - j, 1 + j)
            out *= self._jitter
        return out
