"""Request plans as the sweep builds them, for tests of the workload's pure pieces."""

from __future__ import annotations

from collections.abc import Callable

from tuner.load.load_spec import WorkloadSpec
from tuner.load.workload import RequestPlan, draft_requests, fit_draft


def build_plan(workload: WorkloadSpec, n: int, *, seed: int, stream: str, ignore_eos: bool,
               count_tokens: Callable[[str], int] | None = None) -> list[RequestPlan]:
    """``n`` requests of one stream: drafts, fitted to exact lengths when ``count_tokens`` is
    given (what the sweep does through the server's /tokenize), else as drafted."""
    return [d.to_plan(ignore_eos=ignore_eos,
                      prompt=None if count_tokens is None else fit_draft(d.draft, d.target_prompt_tokens, count_tokens))
            for d in draft_requests(workload, n, seed=seed, stream=stream)]
