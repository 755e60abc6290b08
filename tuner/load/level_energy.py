"""A level's energy: joules per output token and per request over the same steady window its
throughput is counted in (issue 40; docs/measurement.md, "Energy").

The sampled counter (tuner.energy) is put on the level's time base (seconds since the level
started, like its request records) and cut at the window and sub-windows the throughput
uses (``LevelMetrics.window_start_s``/``window_end_s``, ``subwindow_output_tok_s``), so
energy and tokens are counted over exactly the same seconds. ``joules_per_request`` is the
per-token figure times the level's mean output tokens per completed request (the same
relative interval). ``watts`` is the window's mean draw, shown beside them; the idle draw
the worker measures once is in the trial's outcome, never subtracted (a served token pays
for the idle GPU too).

Pure: a series and a level's fields in, a record out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from tuner.energy.per_token import CounterResolution, window_joules_per_token
from tuner.energy.series import EnergySeries
from tuner.load.window import WindowRates

__all__ = ["ENERGY_KEYS", "LevelEnergy", "level_energy"]

ENERGY_KEYS: tuple[str, ...] = ("joules_per_token", "joules_per_request", "watts")
"""Flat metrics a level carries when its energy was measured (each with ``.ci95``, ``.n``)."""


class LevelEnergy(BaseModel):
    """The energy of one level's steady window."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: str = Field(description="what was read (e.g. 'NVML energy counter, GPUs 0,1')")
    window_s: float = Field(description="seconds of the steady window the energy is counted over")
    joules: float
    output_tokens: float
    watts: float = Field(description="mean draw over the window")
    joules_per_token: float
    ci95: float | None = Field(description="95 % half-width of joules_per_token (sub-window spread plus "
                               "the counter's resolution); None: one window, no spread")
    n: int = Field(description="sub-windows the spread rests on")
    tokens_per_request: float | None = Field(description="mean output tokens of a completed request")

    def flat(self) -> dict[str, float]:
        """The flat keys (NaN where unknown); intervals before any noise floor."""
        ci = math.nan if self.ci95 is None else self.ci95
        per_request = math.nan if self.tokens_per_request is None else self.tokens_per_request
        return {"joules_per_token": self.joules_per_token, "joules_per_token.ci95": ci,
                "joules_per_token.n": float(self.n),
                "joules_per_request": self.joules_per_token * per_request,
                "joules_per_request.ci95": ci * per_request, "joules_per_request.n": float(self.n),
                "watts": self.watts, "watts.ci95": math.nan, "watts.n": float(self.n)}


def level_energy(series: EnergySeries, *, source: str, resolution: CounterResolution,
                 window_start_s: float | None, window_end_s: float | None,
                 subwindow_output_tok_s: Sequence[float], subwindow_s: float | None,
                 output_tok_s: float, total_output_tokens: int, completed: int) -> LevelEnergy | None:
    """The level's energy over its window, ``series`` on the level's time base; None when
    the window holds no tokens or the series does not cover it (the sampler started late or
    failed: a partial figure would be wrong, not noisy)."""
    rates = WindowRates(output_tok_s=output_tok_s, window_start_s=window_start_s, window_end_s=window_end_s,
                        subwindow_s=subwindow_s, subwindow_output_tok_s=list(subwindow_output_tok_s))
    try:
        found = window_joules_per_token(series, rates, resolution)
    except ValueError:
        return None
    if found is None:
        return None
    return LevelEnergy(
        source=source, window_s=found.window_end_s - found.window_start_s, joules=found.joules,
        output_tokens=found.output_tokens, watts=found.mean_watts, joules_per_token=found.joules_per_token,
        ci95=found.ci95, n=found.n,
        tokens_per_request=total_output_tokens / completed if completed else None)
