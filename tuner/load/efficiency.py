"""What a level's throughput is worth per GPU and per dollar: the efficiency metrics read at
every load level beside the speed figures (issue 40; docs/study-file.md, "Cost").

* ``output_tok_s_per_gpu``: the level's steady-state ``output_tok_s`` divided by the GPUs the
  trial's server holds (``server.gpus_per_trial``), so that a tensor-parallel-4 server and a
  tensor-parallel-8 one compare per GPU rather than per server.
* ``usd_per_mtok``: dollars per million output tokens, from the price of what the trial
  holds for an hour (``cost.gpu_hour`` x its GPUs, or ``cost.node_hour``) and the level's
  throughput: price per second / tokens per second x 10^6.

Both follow from ``output_tok_s`` by a constant (its GPUs, its price), so their 95 %
half-widths are ``output_tok_s``'s, scaled: the same relative width per GPU, and for the
price (a reciprocal) the first-order width price x ci / tok_s^2 - a reciprocal's interval is
not symmetric, but at the few-per-cent widths a trial's throughput carries the difference is
well below the printed digits. Their ``.n`` is ``output_tok_s.n``: they rest on the same
samples.

Pure: a level's flat metrics in, the derived keys out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["EFFICIENCY_KEYS", "Holding", "efficiency_flat"]

EFFICIENCY_KEYS: tuple[str, ...] = ("output_tok_s_per_gpu", "usd_per_mtok")
"""Flat metrics a level carries when the trial's request says what it holds (each with
``.ci95`` and ``.n``); ``usd_per_mtok`` only with a price."""


class Holding(BaseModel):
    """What one trial's server holds while it is measured, and what that costs."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    gpus: int = Field(ge=0, description="GPUs the trial's server holds (server.gpus_per_trial); 0 on a CPU build")
    usd_per_hour: float | None = Field(
        default=None, gt=0, description="what holding them costs an hour (the study's cost: section); None: no price")


def efficiency_flat(flat: Mapping[str, float], holding: Holding) -> dict[str, float]:
    """The efficiency keys for one level's flat metrics (``output_tok_s`` and its ``.ci95``/
    ``.n``, intervals already final); NaN where a figure cannot be had: no GPUs for a
    per-GPU figure, no price for a cost, no throughput for either."""

    tok = flat.get("output_tok_s", math.nan)
    ci = flat.get("output_tok_s.ci95", math.nan)
    n = flat.get("output_tok_s.n", math.nan)
    nan = math.nan
    out = {key: nan for key in EFFICIENCY_KEYS for key in (key, f"{key}.ci95", f"{key}.n")}
    measured = math.isfinite(tok) and tok > 0
    if holding.gpus > 0 and math.isfinite(tok):
        out.update({"output_tok_s_per_gpu": tok / holding.gpus, "output_tok_s_per_gpu.ci95": ci / holding.gpus,
                    "output_tok_s_per_gpu.n": n})
    if holding.usd_per_hour is not None and measured:
        usd_per_s = holding.usd_per_hour / 3600.0
        out.update({"usd_per_mtok": usd_per_s / tok * 1e6, "usd_per_mtok.ci95": usd_per_s * ci / (tok * tok) * 1e6,
                    "usd_per_mtok.n": n})
    return out
