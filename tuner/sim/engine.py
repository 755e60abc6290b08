"""The simulator's continuous-batching engine loop (asyncio; the only place that sleeps).

Each step: the pure Scheduler picks sequences, drafts are proposed from real token content
(n-gram) or a seeded per-position draw (model drafters), the pure CostModel gives the step's
simulated duration, the loop sleeps that long times TUNER_SIM_TIME_SCALE, then every scheduled
sequence emits its tokens as ONE chunk (several tokens when drafts were accepted, as in vLLM).
All latency metrics are wall-clock seconds of this process (so they agree with what a client
measures); with a time scale below 1 everything is proportionally faster.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from tuner.sim.effective import Effective
from tuner.sim.faults import ActiveFaults
from tuner.sim.logs import LogWriter, spec_line, stats_line
from tuner.sim.model import TOKENIZER, NgramIndex, Plan, count_accepted, last_user_text, top_candidates, user_turns
from tuner.sim.noise import StepNoise
from tuner.sim.perf_model import NGRAM_METHODS, CostModel, Scheduled, Scheduler, SeqState, unit_hash
from tuner.sim.power import BusyClock

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


@dataclass
class Chunk:
    ids: list[int]
    pieces: list[str]
    logprobs: list[tuple[float, list[tuple[int, float]]]] | None
    finish_reason: str | None


@dataclass(eq=False)
class GenRequest:
    req_id: str
    prompt_ids: list[int]
    plan: Plan
    logprobs: int | None = None          # top-k alternatives wanted per output token
    read_cache: bool = True              # prompt_logprobs requests skip prefix-cache reads
    index: int = 0                       # choice index in the HTTP response
    queue: asyncio.Queue[Chunk | None] = field(default_factory=asyncio.Queue)
    arrival: float = 0.0
    first_token: float | None = None
    emitted: int = 0
    finished: bool = False
    finish_reason: str | None = None
    seq: SeqState | None = None
    ngram: NgramIndex | None = None
    pending_draft: list[int] = field(default_factory=list)
    drafter_accept: int = 0


class Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0
        self.n = 0

    def observe(self, value: float) -> None:
        self.n += 1
        self.total += value
        for i, b in enumerate(self.buckets):
            if value <= b:
                self.counts[i] += 1
                return
        self.counts[-1] += 1


@dataclass
class Counters:
    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: dict[str, int] = field(default_factory=lambda: {"stop": 0, "length": 0, "abort": 0})
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))


class Engine:
    def __init__(self, eff: Effective, faults: ActiveFaults, time_scale: float,
                 log: LogWriter | None = None, clock=time.monotonic,
                 noise_seed: int | None = None) -> None:
        self.eff = eff
        self.faults = faults
        self.scale = time_scale
        self.log = log
        self.clock = clock
        self.cost = CostModel(eff.profile, eff.perf)
        self.sched = Scheduler(eff.perf)
        self.counters = Counters()
        self.k = eff.spec.num_spec_tokens if eff.spec else 0
        self.counters.accepted_per_pos = [0] * self.k
        self._by_seq: dict[int, GenRequest] = {}
        self._ids = itertools.count()
        self._wake = asyncio.Event()
        self._t: float | None = None
        self._step = 0
        self.dead = False
        spec = eff.profile.noise
        # A fresh seed per server start unless the profile fixes one (or the caller does).
        seed = spec.seed if spec.seed is not None else noise_seed
        self.noise = StepNoise(spec, seed if seed is not None else random.SystemRandom().randrange(2**31))
        self._first_request: float | None = None
        # When the engine has work: the utilisation its simulated power follows (power.py).
        self.busy = BusyClock()

    # -- requests --------------------------------------------------------------------------
    def submit(self, req: GenRequest) -> None:
        req.arrival = self.clock()
        if self._first_request is None:
            self._first_request = req.arrival
        plan = req.plan
        salt = self.eff.numerics_salt
        # Static corruption: a broken configuration or an injected fault.
        if self.eff.corruption or "garbage" in self.faults:
            plan.garble(0, salt)
        if self.prompt_corrupt(req.prompt_ids):
            plan.garble(0, salt)
        diverge = self.faults.get("diverge_after_tokens")
        if diverge and diverge.tokens is not None:
            plan.garble(diverge.tokens, salt)
        seq_id = next(self._ids)
        hashes = tuple(itertools.accumulate(
            (hash(tuple(req.prompt_ids[i:i + self.eff.perf.block_size]))
             for i in range(0, len(req.prompt_ids) - self.eff.perf.block_size + 1,
                            self.eff.perf.block_size)),
            lambda a, b: hash((a, b))))
        req.seq = SeqState(seq_id, len(req.prompt_ids), max(1, len(plan.ids)), hashes,
                           read_cache=req.read_cache)
        if self.eff.spec and self.eff.spec.method in NGRAM_METHODS:
            req.ngram = NgramIndex(req.prompt_ids, self.eff.spec.prompt_lookup_min,
                                   self.eff.spec.prompt_lookup_max)
        self._by_seq[seq_id] = req
        self.sched.add(req.seq)
        self._wake.set()

    def prompt_corrupt(self, prompt_ids: Sequence[int]) -> bool:
        """Whether a fault that depends on the prompt alone corrupts this request (its
        prefill too: the server's prompt logprobs follow the same answer)."""
        if self.eff.corruption or "garbage" in self.faults:
            return True
        n = len(prompt_ids)
        limit = self.faults.get("garbage_when_prompt_gt")
        if limit and limit.tokens is not None and n > limit.tokens:
            return True
        bucket = self.faults.get("garbage_when_prompt_in")
        if bucket and bucket.low is not None and bucket.high is not None \
                and bucket.low <= n < bucket.high:
            return True
        wording = self.faults.get("garbage_for_wording")
        turn = self.faults.get("garbage_on_turn")
        if wording is None and turn is None:
            return False
        text = TOKENIZER.decode(list(prompt_ids), skip_special_tokens=False)
        if wording and wording.pattern and re.search(wording.pattern, last_user_text(text),
                                                     re.IGNORECASE):
            return True
        return bool(turn and turn.turn and user_turns(text) >= turn.turn)

    def finish(self, req: GenRequest, reason: str) -> None:
        """End a request early: client disconnect ('abort') or a stop string ('stop')."""
        if req.finished or req.seq is None:
            return
        self.sched.abort(req.seq)
        self._close(req, reason)

    def _close(self, req: GenRequest, reason: str) -> None:
        req.finished = True
        req.finish_reason = reason
        self.counters.finished[reason] = self.counters.finished.get(reason, 0) + 1
        if req.first_token is not None and reason != "abort":
            self.counters.e2e.observe(self.clock() - req.arrival)
        self._by_seq.pop(req.seq.seq_id if req.seq else -1, None)

    # -- drafting --------------------------------------------------------------------------
    def _draft(self, seq: SeqState) -> int:
        req = self._by_seq[seq.seq_id]
        spec = self.eff.spec
        if not spec or seq.num_output == 0:
            return 0
        if req.ngram is not None:
            req.pending_draft = req.ngram.propose(self.k)
            return len(req.pending_draft)
        # Model drafters (MTP, EAGLE, draft model): acceptance per position from the profile,
        # seeded per (request, position) so runs are reproducible.
        table = self.eff.profile.perf.drafter_accept_prob
        acc = 0
        for pos in range(self.k):
            if unit_hash(req.plan.ctx, seq.num_output, pos, 41) >= table[min(pos, len(table) - 1)]:
                break
            acc += 1
        req.drafter_accept = acc
        return self.k

    # -- the loop --------------------------------------------------------------------------
    async def _sleep_step(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        # Deadline scheduling keeps the average step length exact despite sleep overshoot;
        # after idling or falling far behind we restart from now instead of bursting.
        if self._t is None or now - self._t > 0.05:
            self._t = now
        self._t += seconds
        await asyncio.sleep(max(0.0, self._t - now))

    async def run(self) -> None:
        while True:
            if not self.sched.has_work():
                self.busy.idle(self.clock())
                self._wake.clear()
                await self._wake.wait()
                self.busy.work(self.clock())
                self._t = None
                continue
            plan = self.sched.schedule(self._draft)
            if not plan.entries:
                await asyncio.sleep(0.005)
                continue
            running = len(self.sched.running)
            step_s = self.cost.step_ms(plan.shape()) / 1e3 * self.scale
            if self.noise.active:
                step_s *= self.noise.factor(self.clock() - (self._first_request or self.clock()))
            await self._sleep_step(step_s)
            self._step += 1
            batch_fault = self.faults.get("garbage_when_batch_gt")
            small_fault = self.faults.get("garbage_when_batch_lt")
            exact_fault = self.faults.get("garbage_when_batch_eq")
            for entry in plan.entries:
                req = self._by_seq.get(entry.seq.seq_id)
                if req is None or req.finished:
                    continue   # aborted while the step ran
                if batch_fault and batch_fault.batch is not None and running > batch_fault.batch:
                    req.plan.garble(req.emitted, self.eff.numerics_salt)
                # A kernel path taken only for small batches (batch size 1 with batch=2).
                if small_fault and small_fault.batch is not None and running < small_fault.batch:
                    req.plan.garble(req.emitted, self.eff.numerics_salt)
                # A kernel or captured graph wrong for one decode batch size only.
                if exact_fault and running == exact_fault.batch and not entry.prefill:
                    req.plan.garble(req.emitted, self.eff.numerics_salt)
                self._emit(req, entry)

    def _emit(self, req: GenRequest, entry: Scheduled) -> None:
        plan = req.plan
        if entry.prefill:
            n = 1 if entry.completes_prefill else 0
            acc = 0
        else:
            truth = plan.ids[req.emitted:req.emitted + entry.drafts + 1]
            if req.ngram is not None:
                acc = count_accepted(req.pending_draft[:entry.drafts], truth)
            else:
                acc = min(req.drafter_accept, entry.drafts)
            if entry.drafts:
                c = self.counters
                c.drafts += 1
                c.draft_tokens += entry.drafts
                c.accepted += acc
                for i in range(acc):
                    c.accepted_per_pos[i] += 1
            n = acc + 1
        n = min(n, len(plan.ids) - req.emitted)
        if n <= 0:
            self.sched.commit(entry, 0, False)
            return
        start = req.emitted
        ids = plan.ids[start:start + n]
        req.emitted += n
        if req.first_token is None:
            req.first_token = self.clock()
            self.counters.ttft.observe(req.first_token - req.arrival)
            self.counters.prompt_tokens += len(req.prompt_ids)
        self.counters.generation_tokens += n
        if req.ngram is not None:
            req.ngram.extend(ids)
        done = req.emitted >= len(plan.ids)
        self.sched.commit(entry, n, done)
        lps = None
        if req.logprobs is not None:
            lps = []
            for i in range(start, start + n):
                cands = top_candidates(plan.ctx, i, plan.greedy[i], max(req.logprobs, 5),
                                       self.eff.numerics_salt, flat=plan.family == "dummy",
                                       alt=plan.alts.get(i))
                chosen = next((lp for cid, lp in cands if cid == plan.ids[i]), cands[-1][1] - 1)
                lps.append((chosen, cands[:req.logprobs]))
        reason = plan.finish_reason if done else None
        req.queue.put_nowait(Chunk(ids, plan.pieces[start:start + n], lps, reason))
        if done:
            self._close(req, plan.finish_reason)

    # -- stats -----------------------------------------------------------------------------
    async def stats_loop(self) -> None:
        """vLLM's periodic 'Engine 000: ...' lines every VLLM_LOG_STATS_INTERVAL (time-scaled)."""
        if self.log is None or self.eff.disable_log_stats:
            return
        interval = max(self.eff.log_stats_interval_s * self.scale, 0.05)
        c = self.counters
        last = (c.prompt_tokens, c.generation_tokens, c.drafts, c.draft_tokens, c.accepted,
                list(c.accepted_per_pos), self.sched.prefix_queries, self.sched.prefix_hits)
        idle_logged = True
        while True:
            await asyncio.sleep(interval)
            now = (c.prompt_tokens, c.generation_tokens, c.drafts, c.draft_tokens, c.accepted,
                   list(c.accepted_per_pos), self.sched.prefix_queries, self.sched.prefix_hits)
            active = now[:2] != last[:2] or self.sched.has_work()
            if not active and idle_logged:
                last = now
                continue
            idle_logged = not active
            queries = now[6] - last[6]
            self.log.api("INFO", "loggers.py:310", stats_line(
                (now[0] - last[0]) / interval, (now[1] - last[1]) / interval,
                len(self.sched.running), len(self.sched.waiting), self.sched.kv_usage,
                (now[7] - last[7]) / queries if queries else 0.0))
            if self.eff.spec and now[2] != last[2]:
                per_pos = [a - b for a, b in zip(now[5], last[5])]
                self.log.api("INFO", "metrics.py:121", spec_line(
                    now[2] - last[2], now[3] - last[3], now[4] - last[4], per_pos, interval))
            last = now

    # -- metrics ---------------------------------------------------------------------------
    def prometheus(self, model_name: str) -> str:
        if self.eff.disable_log_stats:
            # --disable-log-stats creates no PrometheusStatLogger: no vllm:* series at all.
            return '# HELP python_info Python platform information\n# TYPE python_info gauge\n' \
                   'python_info{implementation="CPython"} 1.0\n'
        c = self.counters
        lab = f'engine="0",model_name="{model_name}"'
        out: list[str] = []

        def metric(name: str, kind: str, help_: str, samples: float | list[tuple[str, float]]) -> None:
            """One series; ``samples`` a number: its one sample, with the engine's labels only."""
            out.append(f"# HELP vllm:{name} {help_}")
            out.append(f"# TYPE vllm:{name} {kind}")
            for suffix_labels, value in samples if isinstance(samples, list) else [(f"{name}{{{lab}}}", samples)]:
                out.append(f"vllm:{suffix_labels} {float(value)}")

        metric("num_requests_running", "gauge", "Number of requests in model execution batches.",
               len(self.sched.running))
        metric("num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
               len(self.sched.waiting))
        metric("kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", self.sched.kv_usage)
        metric("prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of queried tokens.",
               self.sched.prefix_queries)
        metric("prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.",
               self.sched.prefix_hits)
        metric("num_preemptions_total", "counter", "Cumulative number of preemption from the engine.",
               self.sched.num_preemptions)
        metric("prompt_tokens_total", "counter", "Number of prefill tokens processed.", c.prompt_tokens)
        metric("generation_tokens_total", "counter", "Number of generation tokens processed.", c.generation_tokens)
        metric("request_success_total", "counter", "Count of successfully processed requests.",
               [(f'request_success_total{{{lab},finished_reason="{r}"}}', n)
                for r, n in c.finished.items()])
        for name, hist, help_ in (("time_to_first_token_seconds", c.ttft,
                                   "Histogram of time to first token in seconds."),
                                  ("e2e_request_latency_seconds", c.e2e,
                                   "Histogram of e2e request latency in seconds.")):
            samples = []
            cum = 0
            for b, n in zip(hist.buckets, hist.counts):
                cum += n
                samples.append((f'{name}_bucket{{{lab},le="{b}"}}', cum))
            samples.append((f'{name}_bucket{{{lab},le="+Inf"}}', hist.n))
            samples.append((f"{name}_count{{{lab}}}", hist.n))
            samples.append((f"{name}_sum{{{lab}}}", hist.total))
            metric(name, "histogram", help_, samples)
        if self.eff.spec:
            metric("spec_decode_num_drafts_total", "counter", "Number of spec decoding drafts.", c.drafts)
            metric("spec_decode_num_draft_tokens_total", "counter", "Number of draft tokens.", c.draft_tokens)
            metric("spec_decode_num_accepted_tokens_total", "counter", "Number of accepted tokens.", c.accepted)
            metric("spec_decode_num_accepted_tokens_per_pos_total", "counter",
                   "Accepted tokens per draft position.",
                   [(f'spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{i}"}}', n)
                    for i, n in enumerate(c.accepted_per_pos)])
        return "\n".join(out) + "\n"
