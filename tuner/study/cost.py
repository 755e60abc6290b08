"""The study file's ``cost:`` section: what one trial's hardware costs an hour, so that every
level also says what a million output tokens cost (``usd_per_mtok``, tuner.load.efficiency).

A price is per GPU-hour (``gpu_hour``: a cloud's on-demand or reserved rate, times the GPUs a
trial holds) or per node-hour (``node_hour``: what the machine one trial's server runs on costs
as a whole, the way a CPU box or a whole 8-GPU node is rented). It is the user's number, used
as given: the tuner measures tokens per second, not prices.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from tuner.load.efficiency import Holding
from tuner.study.spec_base import Strict

__all__ = ["CostSpec", "trial_holding"]


class CostSpec(Strict):
    gpu_hour: float | None = Field(None, gt=0, description="dollars per GPU-hour (x server.gpus_per_trial a trial)")
    node_hour: float | None = Field(None, gt=0, description="dollars per hour for the whole machine one trial's server "
                                    "runs on (a CPU box, or a node whose GPUs the trial takes)")

    @model_validator(mode="after")
    def _one_price(self) -> CostSpec:
        if (self.gpu_hour is None) == (self.node_hour is None):
            raise ValueError("give exactly one of gpu_hour (dollars per GPU-hour) or node_hour (dollars per hour "
                             "for the machine a trial runs on), e.g. cost: {gpu_hour: 2.49}")
        return self


def trial_holding(gpus: int, cost: CostSpec | None) -> Holding | None:
    """What one trial holds and costs an hour; None when there is nothing to derive (no GPUs
    and no price: a CPU study without a cost: section)."""
    if gpus == 0 and cost is None:
        return None
    price = None if cost is None else (cost.node_hour if cost.gpu_hour is None else cost.gpu_hour * gpus)
    return Holding(gpus=gpus, usd_per_hour=price)
