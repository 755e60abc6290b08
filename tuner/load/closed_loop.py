"""One closed-loop level: C streams, each sending its next request as soon as its previous
one finished, in this event loop or sharded over client processes."""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Callable, Sequence
from typing import Any

from tuner.load.load_spec import Api
from tuner.load.loop_lag import LoopLagMonitor
from tuner.load.records import RequestRecord
from tuner.load.request import LevelContext
from tuner.load.shards import run_sharded
from tuner.load.streams import run_streams
from tuner.load.workload import RequestPlan

__all__ = ["run_level"]

logger = logging.getLogger(__name__)


async def run_level(
    base_url: str,
    model: str,
    plan: Sequence[RequestPlan],
    *,
    concurrency: int,
    api: Api,
    deadline_s: float | None,
    request_timeout_s: float,
    headers: dict[str, str] | None = None,
    continuous_usage: bool = True,
    processes: int = 1,
    checkpoint: Callable[[dict[str, Any]], bool] | None = None,
    lag: LoopLagMonitor | None = None,
    on_start: Callable[[float], None] | None = None,
) -> list[RequestRecord]:
    """Run ``plan`` in a closed loop of ``concurrency`` streams.

    Args:
        base_url: server root, e.g. ``http://127.0.0.1:8000`` (a trailing ``/v1`` is
            accepted).
        model: served model name sent in every request.
        plan: requests in issue order.
        concurrency: number of concurrent streams C.
        api: ``completions`` or ``chat``.
        deadline_s: no request is issued later than this many seconds after the level
            starts (None: no limit). In-flight requests still finish, each bounded by
            ``request_timeout_s``.
        request_timeout_s: total time allowed per request, stream included.
        headers: extra HTTP headers (e.g. an API key).
        continuous_usage: ask for per-chunk usage (exact tokens per chunk on vLLM).
        processes: client processes to shard the streams over (:mod:`tuner.load.shards`);
            1 runs every stream in this event loop.
        checkpoint: early stop inside the level (one client process only; ignored when
            sharded): called with the steady-state window so far
            (:meth:`tuner.load.live_window.InsideWindow.view`); True ends the level and
            raises :class:`tuner.load.streams.LevelHalted` with the finished records.
        lag: collects how late the event loop(s) running the streams woke: this one, or
            each client shard's.
        on_start: told the level's time base (the ``time.monotonic()`` value its records
            are relative to) once it is fixed: for shards, after every shard is ready. What
            is sampled beside the level (its energy) is put on the records' time by it.

    Returns:
        One record per issued request, in issue order.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if request_timeout_s <= 0:
        raise ValueError(f"request_timeout_s must be > 0, got {request_timeout_s}")
    if processes < 1:
        raise ValueError(f"processes must be >= 1, got {processes}")
    lv = LevelContext.create(
        base_url, model, api, concurrency=concurrency,
        request_timeout_s=request_timeout_s, headers=headers, continuous_usage=continuous_usage,
    )
    if processes > 1 and concurrency > 1:
        records = await run_sharded(lv, plan, deadline_s=deadline_s,
                                    processes=min(processes, concurrency), lag=lag, on_start=on_start)
    else:
        if on_start is not None:
            on_start(lv.t0)
        counter = itertools.count()
        # Watched only when the caller reads the samples: an unread monitor is a wake-up
        # every 5 ms for nothing.
        async with lag if lag is not None else contextlib.nullcontext():
            by_pos = await run_streams(lv, plan, concurrency, counter.__next__, deadline_s,
                                       checkpoint)
        records = [by_pos[i] for i in sorted(by_pos)]
    if len(records) < len(plan):
        logger.info(
            "c=%d: deadline %.1fs reached after %d of %d requests",
            concurrency, deadline_s or 0.0, len(records), len(plan),
        )
    return records
