"""The simulator's model of an open-loop level: requests arriving at given times.

The same engine as :func:`tuner.sim.perf_model.simulate_closed_loop` (the pure
``Scheduler`` and ``CostModel`` the served simulator runs), driven by an arrival schedule
instead of closed-loop streams: each request joins the engine at the first step that
starts at or after its arrival (a request arriving mid-step waits for the next, as in
vLLM), and an idle engine waits for the next arrival. Per request it returns vLLM's
latencies (TTFT, TPOT, E2EL from the arrival), which is what the tuner's client measures
against the served simulator.

Pure: no I/O, no clocks (simulated seconds, time scale 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tuner.sim.perf_config import PerfConfig
from tuner.sim.perf_model import (
    NGRAM_METHODS,
    CostModel,
    Scheduler,
    SeqState,
    Workload,
    accepted_drafts,
    unit_hash,
)
from tuner.sim.profile import Profile

__all__ = ["OpenLoopRun", "simulate_open_loop"]


@dataclass(frozen=True)
class OpenLoopRun:
    """Per request, in arrival order (simulated seconds)."""

    ttft_s: tuple[float, ...]
    e2el_s: tuple[float, ...]
    output_tokens: tuple[int, ...]
    duration_s: float               # first arrival -> last request done

    def tpot_s(self) -> tuple[float, ...]:
        """vLLM's TPOT per request: (E2EL - TTFT)/(n - 1); 0 with at most one token."""
        return tuple((e - t) / (n - 1) if n > 1 else 0.0
                     for t, e, n in zip(self.ttft_s, self.e2el_s, self.output_tokens, strict=True))


def simulate_open_loop(profile: Profile, cfg: PerfConfig, workload: Workload,
                       arrivals: Sequence[float]) -> OpenLoopRun:
    """Serve one request per arrival time (non-decreasing, seconds) and time each.

    Request ``i`` has ``workload.prompt_tokens`` prompt tokens and
    ``workload.output_len(i)`` output tokens; speculative drafting and acceptance are
    drawn as in the closed-loop model.
    """
    if any(b < a for a, b in zip(arrivals, arrivals[1:])):
        raise ValueError("arrivals must be non-decreasing")
    n = len(arrivals)
    cost = CostModel(profile, cfg)
    sched = Scheduler(cfg)
    k = cfg.num_spec_tokens if cfg.spec_method else 0
    step_no = 0

    def draft_fn(seq: SeqState) -> int:
        if not k:
            return 0
        if cfg.spec_method in NGRAM_METHODS:
            return k if unit_hash(seq.seq_id, step_no, 3) < workload.ngram_hit_rate else 0
        return k

    first: list[float | None] = [None] * n
    done: list[float | None] = [None] * n
    lengths = [workload.output_len(i) for i in range(n)]
    now = arrivals[0] if n else 0.0
    nxt = 0
    while nxt < n or sched.has_work():
        while nxt < n and arrivals[nxt] <= now:
            sched.add(SeqState(nxt, workload.prompt_tokens, lengths[nxt]))
            nxt += 1
        if not sched.has_work():
            now = arrivals[nxt]
            continue
        plan = sched.schedule(draft_fn)
        if not plan.entries:
            raise RuntimeError("scheduler cannot make progress (KV cache too small?)")
        now += cost.step_ms(plan.shape()) / 1e3
        step_no += 1
        for entry in plan.entries:
            seq = entry.seq
            if entry.prefill:
                emitted = 1 if entry.completes_prefill else 0
            else:
                emitted = accepted_drafts(cfg, profile, workload, seq.seq_id, step_no,
                                          entry.drafts) + 1
            emitted = min(emitted, seq.max_output - seq.num_output)
            if emitted and first[seq.seq_id] is None:
                first[seq.seq_id] = now
            sched.commit(entry, emitted, False)
            if seq.finished:
                done[seq.seq_id] = now
    ttft = tuple(float(f) - a for f, a in zip(first, arrivals, strict=True))  # type: ignore[arg-type]
    e2el = tuple(float(d) - a for d, a in zip(done, arrivals, strict=True))  # type: ignore[arg-type]
    start = arrivals[0] if n else 0.0
    return OpenLoopRun(ttft, e2el, tuple(lengths), (max(done) - start) if n else 0.0)  # type: ignore[type-var,operator]
