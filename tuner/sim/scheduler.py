"""A small vLLM-V1-like continuous-batching scheduler (pure: no clocks, no I/O).

Token budget per step (max_num_batched_tokens), max_num_seqs, chunked prefill, KV blocks with
recompute preemption, and a prefix cache keyed by prompt block hashes. The live engine and
perf_model.estimate() both drive it, so a served run and an estimate schedule alike.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from tuner.sim.perf_config import PerfConfig, StepShape

# ------------------------------------------------------------------------------------------


@dataclass(eq=False)
class SeqState:
    seq_id: int
    prompt_len: int
    max_output: int                       # the most tokens this sequence may emit
    block_hashes: tuple[int, ...] = ()    # prefix-cache keys of the prompt's full blocks
    read_cache: bool = True
    num_computed: int = 0
    num_output: int = 0
    prefill_target: int = 0
    blocks: int = 0
    cached_tokens: int = 0
    running: bool = False
    finished: bool = False

    @property
    def prefilling(self) -> bool:
        return self.num_computed < self.prefill_target


@dataclass
class Scheduled:
    seq: SeqState
    num_tokens: int
    drafts: int
    prefill: bool

    @property
    def completes_prefill(self) -> bool:
        return self.prefill and self.seq.num_computed + self.num_tokens >= self.seq.prefill_target


@dataclass
class StepPlan:
    entries: list[Scheduled] = field(default_factory=list)
    preempted: list[SeqState] = field(default_factory=list)

    def shape(self) -> StepShape:

        decode = [e for e in self.entries if not e.prefill]
        prefill = [e for e in self.entries if e.prefill]
        drafts = {e.drafts for e in decode}
        return StepShape(
            decode_seqs=len(decode),
            draft_tokens=sum(e.drafts for e in decode),
            prefill_tokens=sum(e.num_tokens for e in prefill),
            prefill_seqs=len(prefill),
            context_tokens=sum(e.seq.num_computed for e in decode),
            uniform_decode=not prefill and len(drafts) <= 1,
        )


class Scheduler:
    """Continuous batching in the shape of vLLM's V1 scheduler (simplified, documented)."""

    def __init__(self, cfg: PerfConfig) -> None:
        self.cfg = cfg
        self.total_blocks = max(1, cfg.kv_capacity_tokens // cfg.block_size)
        self.free_blocks = self.total_blocks
        self.waiting: deque[SeqState] = deque()
        self.running: list[SeqState] = []
        self.num_preemptions = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self._cache: OrderedDict[int, None] = OrderedDict()

    def add(self, seq: SeqState) -> None:
        self.waiting.append(seq)

    @property
    def kv_usage(self) -> float:
        return 1.0 - self.free_blocks / self.total_blocks

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.cfg.block_size)

    def _release(self, seq: SeqState) -> None:
        self.free_blocks += seq.blocks
        seq.blocks = 0

    def _preempt(self, seq: SeqState) -> None:
        # Recompute preemption: the KV is dropped and the sequence re-prefills prompt+output.
        self.running.remove(seq)
        self._release(seq)
        seq.running = False
        seq.num_computed = 0
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def abort(self, seq: SeqState) -> None:
        if seq in self.running:
            self.running.remove(seq)
            self._release(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.finished = True

    def _prefix_hit(self, seq: SeqState) -> int:
        if not (self.cfg.enable_prefix_caching and seq.block_hashes):
            return 0
        self.prefix_queries += seq.prompt_len
        if not seq.read_cache:
            return 0
        hit = 0
        for h in seq.block_hashes:
            if h not in self._cache:
                break
            self._cache.move_to_end(h)
            hit += 1
        # At least one token must be computed to produce logits, as in vLLM.
        tokens = min(hit * self.cfg.block_size, seq.prefill_target - 1)
        self.prefix_hits += max(tokens, 0)
        return max(tokens, 0)

    def schedule(self, draft_fn: Callable[[SeqState], int]) -> StepPlan:
        plan = StepPlan()
        budget = self.cfg.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            if seq.prefilling:
                n, drafts = min(seq.prefill_target - seq.num_computed, budget), 0
            else:
                remaining = seq.max_output - seq.num_output
                drafts = max(0, min(draft_fn(seq), remaining - 1, budget - 1))
                n = 1 + drafts
            need = self._blocks_for(seq.num_computed + n) - seq.blocks
            while need > self.free_blocks and self.running[-1] is not seq:
                plan.preempted.append(self.running[-1])
                self._preempt(self.running[-1])
            if need > self.free_blocks:
                plan.preempted.append(seq)
                self._preempt(seq)
                continue
            self.free_blocks -= need
            seq.blocks += need
            plan.entries.append(Scheduled(seq, n, drafts, seq.prefilling))
            budget -= n
            i += 1
        while (self.waiting and not plan.preempted and budget > 0
               and len(self.running) < self.cfg.max_num_seqs):
            seq = self.waiting[0]
            seq.prefill_target = seq.prompt_len + seq.num_output
            cached = self._prefix_hit(seq)
            n = min(seq.prefill_target - cached, budget)
            need = self._blocks_for(cached + n)
            if need > self.free_blocks:
                break
            self.waiting.popleft()
            seq.num_computed = cached
            seq.cached_tokens = cached
            seq.blocks = need
            self.free_blocks -= need
            seq.running = True
            self.running.append(seq)
            plan.entries.append(Scheduled(seq, n, 0, True))
            budget -= n
        return plan

    def commit(self, entry: Scheduled, emitted: int, finished: bool) -> None:
        """Record what one scheduled sequence produced in the step just run."""
        seq = entry.seq
        if entry.prefill:
            seq.num_computed += entry.num_tokens
        else:
            seq.num_computed += emitted
        seq.num_output += emitted
        if finished or seq.num_output >= seq.max_output:
            seq.finished = True
            if seq in self.running:
                self.running.remove(seq)
            self._release(seq)
            if self.cfg.enable_prefix_caching:
                for h in seq.block_hashes:
                    self._cache[h] = None
                    self._cache.move_to_end(h)
                while len(self._cache) > self.total_blocks:
                    self._cache.popitem(last=False)
