"""What every level of one sweep shares (the server, the budget, the notes, the request
source), the plan a level sends and the server's view of it after the level: used by the
closed-loop levels (tuner.load.sweep) and the open-loop ones (tuner.load.open_levels)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from tuner.energy.source import EnergySource
from tuner.load.dataset_draw import DatasetDraw
from tuner.load.efficiency import Holding
from tuner.load.goodput import level_slo
from tuner.load.load_spec import LoadSpec
from tuner.load.prometheus import MetricsSnapshot, server_side_metrics
from tuner.load.records import RequestRecord
from tuner.load.results import LevelResult, TokenAgreement, agreement_of
from tuner.load.server_calls import fit_plan, scrape_metrics
from tuner.load.slo import SloSpec
from tuner.load.workload import LengthModel, RequestPlan, draft_requests

__all__ = ["SweepContext", "fitted_plan", "server_view"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SweepContext:
    """What every level of one sweep shares."""

    aux: httpx.AsyncClient  # for /tokenize and /metrics
    base_url: str
    model: str
    spec: LoadSpec
    ignore_eos: bool
    can_fit: bool
    budget: Callable[[], float | None]  # seconds a level may issue now; None = spent
    headers: dict[str, str] | None
    notes: list[str]  # appended to
    lengths: LengthModel | None = None  # sizing: steady, calibrated through /tokenize
    slo: SloSpec | None = None  # judged at every level
    dataset: DatasetDraw | None = None  # requests from the user's file instead of synthetic ones
    holding: Holding | None = None  # what the server holds and costs: per-GPU and per-dollar figures
    energy: EnergySource | None = None  # sampled beside every closed-loop level (tuner.load.level_meter)

    def judged(self, level: LevelResult | None) -> LevelResult | None:
        """``level`` with its goodput and SLO verdict, and what it holds (unchanged without
        either)."""
        if level is None or (self.slo is None and self.holding is None):
            return level
        update: dict[str, Any] = {"holding": self.holding}
        if self.slo is not None:
            update["slo"] = level_slo(level.records, level.metrics, self.slo)
        return level.model_copy(update={"metrics": level.metrics.model_copy(update=update)})


async def fitted_plan(sw: SweepContext, n: int, stream: str, level: str) -> tuple[list[RequestPlan], bool]:
    """``n`` requests of ``stream``, fitted to exact lengths through the server's /tokenize
    when it can; (plan, fitted). A failed fit is noted under ``level``'s name. A dataset's
    requests are its verbatim text: nothing to fit."""
    spec, ignore_eos = sw.spec, sw.ignore_eos
    if sw.dataset is not None:
        return sw.dataset.take(n), False
    drafts = draft_requests(spec.workload, n, seed=spec.seed, stream=stream)
    plan = None
    if sw.can_fit:
        plan = await fit_plan(
            sw.aux, sw.base_url, sw.model, drafts, ignore_eos=ignore_eos, api=spec.api
        )
        if plan is None:
            sw.notes.append(f"{level}: /tokenize failed while fitting; prompt lengths estimated")
    if plan is None:
        return [d.to_plan(ignore_eos=ignore_eos) for d in drafts], False
    return plan, True


async def server_view(
    sw: SweepContext, before: MetricsSnapshot | None, records: Sequence[RequestRecord], label: str
) -> tuple[dict[str, Any] | None, TokenAgreement]:
    """Scrape after a level: server-side deltas since ``before`` and the token agreement."""
    aux, base_url = sw.aux, sw.base_url
    after = await scrape_metrics(aux, base_url)
    server = server_side_metrics(before, after) if before and after else None
    agreement = agreement_of(records, server)
    if agreement.agree is False and before is not None:
        # vLLM records stats just after handing tokens out; one late scrape rules out a
        # race before a disagreement is reported.
        await asyncio.sleep(1.0)
        late = await scrape_metrics(aux, base_url)
        if late is not None:
            server = server_side_metrics(before, late)
            agreement = agreement_of(records, server)
    if agreement.agree is False:
        logger.warning(
            "%s: client/server token counts disagree: %d vs %s",
            label, agreement.client_output_tokens, agreement.server_generation_tokens,
        )
    return server, agreement
