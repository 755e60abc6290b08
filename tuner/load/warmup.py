"""The warm-up before a level: requests at its concurrency with prompts distinct from the
measured ones (measurement.md §4.4)."""

from __future__ import annotations

import time
from collections import Counter

from tuner.load.closed_loop import run_level
from tuner.load.dataset_draw import DatasetDraw
from tuner.load.load_spec import LoadSpec
from tuner.load.results import WarmupSummary
from tuner.load.workload import draft_requests, level_stream

__all__ = ["warm_up"]


async def warm_up(
    base_url: str,
    model: str,
    spec: LoadSpec,
    concurrency: int,
    ignore_eos: bool,
    budget_s: float,
    headers: dict[str, str] | None,
    dataset: DatasetDraw | None = None,
) -> WarmupSummary:
    n = spec.warmup_for(concurrency)
    # A separate seed stream (or the dataset's next entries, never the measured ones):
    # warming the prefix or suffix cache with the measured prompts would inflate the
    # level's numbers (measurement.md §4.4, §6).
    plan = dataset.take(n) if dataset is not None else [
        d.to_plan(ignore_eos=ignore_eos)
        for d in draft_requests(
            spec.workload, n, seed=spec.seed, stream=level_stream("warmup", concurrency)
        )
    ]
    t = time.monotonic()
    records = (
        await run_level(
            base_url, model, plan,
            concurrency=concurrency, api=spec.api, deadline_s=budget_s,
            request_timeout_s=spec.request_timeout_s, headers=headers,
            processes=spec.client_processes,
        )
        if plan
        else []
    )
    failed = [r for r in records if not r.ok]
    return WarmupSummary(
        requests=len(records),
        completed=len(records) - len(failed),
        failed=len(failed),
        failure_reasons=dict(Counter(r.error.type if r.error else "unknown" for r in failed)),
        duration_s=time.monotonic() - t,
    )
