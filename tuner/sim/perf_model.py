"""Pure performance model of a vLLM engine on a simulated machine (no I/O, no clocks).

Three pieces, all deterministic:
- `CostModel.step_ms(shape)`: time of one engine step (one forward over the scheduled tokens),
  built from the field-notes decomposition: launch overhead by execution regime (eager,
  compiled, piecewise graphs, full graphs) + GPU time (a roofline of weight streaming, where an
  MoE touches more experts as the batch grows, against per-token compute) + one all-reduce per
  layer half over the chosen backend and NCCL protocol/algorithm + CPU scheduling when async
  scheduling is off + drafting.
- `Scheduler` (scheduler.py, re-exported here): vLLM-V1-like continuous batching, driven by
  both the live engine and the estimator, so a server run and `estimate()` agree.
- `estimate()`: closed-loop clients at several concurrencies, simulated step by step.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tuner.sim.perf_config import PerfConfig, StepShape
from tuner.sim.profile import Profile
from tuner.sim.scheduler import Scheduled, Scheduler, SeqState, StepPlan

__all__ = ["CostModel", "LevelEstimate", "PerfConfig", "Scheduled", "Scheduler", "SeqState",
           "StepPlan", "StepShape", "Workload", "estimate", "simulate_closed_loop", "unit_hash"]

MODEL_DRAFTERS = frozenset({"mtp", "eagle", "eagle3", "draft_model", "medusa", "mlp_speculator",
                            "dflash", "dspark", "custom_class"})
NGRAM_METHODS = frozenset({"ngram", "ngram_gpu", "suffix"})


class CostModel:
    def __init__(self, profile: Profile, cfg: PerfConfig) -> None:
        self.profile = profile
        self.cfg = cfg
        perf = profile.perf
        # Per-GPU work shrinks with TP; pipeline stages run one after another for a step, so
        # PP does not shorten a step (a documented simplification: no micro-batch overlap).
        self._scale = perf.reference_tp / cfg.tp
        self._n_ar = profile.model.allreduces_per_step if cfg.tp > 1 else 0

    # -- execution regime -------------------------------------------------------------------
    def regime(self, shape: StepShape) -> str:
        cfg = self.cfg
        compiled = "compiled" if cfg.compile_mode != 0 else "eager"
        mode = cfg.cudagraph_mode
        if mode == "NONE" or shape.tokens > cfg.max_capture_size:
            return compiled
        decode_only = shape.prefill_tokens == 0 and shape.uniform_decode
        if decode_only and mode in ("FULL_AND_PIECEWISE", "FULL_DECODE_ONLY", "FULL"):
            return "full"
        if not decode_only and mode == "FULL":
            return "full"
        if mode in ("FULL_AND_PIECEWISE", "PIECEWISE"):
            return "piecewise"
        return compiled

    # -- all-reduce ---------------------------------------------------------------------------
    def nccl_call_us(self, nbytes: int) -> float:
        nccl = self.profile.nccl
        cfg = self.cfg
        n = cfg.tp
        if cfg.nccl_protos is None or nccl.default_proto in cfg.nccl_protos:
            candidates: Iterable[str] = (nccl.default_proto,)
        else:
            candidates = cfg.nccl_protos
        lat_f = nccl.algo_latency_factor.get(cfg.nccl_algo, 1.0)
        bw_f = nccl.algo_bw_factor.get(cfg.nccl_algo, 1.0)
        if cfg.nccl_p2p_disabled:
            lat_f *= nccl.shm_latency_factor
            bw_f *= nccl.shm_bw_factor
        if cfg.nccl_max_channels is not None:
            bw_f *= min(1.0, cfg.nccl_max_channels / nccl.default_channels)
        best = math.inf
        for proto in candidates:
            lat = (nccl.base_us[proto] + 2 * (n - 1) * nccl.hop_us[proto]) * lat_f
            bw = nccl.busbw_gbps[proto] * bw_f * 1e3  # bytes per microsecond
            best = min(best, lat + 2 * (n - 1) / n * nbytes / bw)
        return best

    def allreduce_call_us(self, tokens: int) -> float:
        nbytes = max(tokens, 1) * self.profile.model.hidden_size * self.cfg.activation_bytes
        ar = self.profile.allreduce
        for backend in self.cfg.allreduce_backends:
            wire = 2 * (self.cfg.tp - 1) / self.cfg.tp * nbytes / (ar.other_busbw_gbps * 1e3)
            if backend == "CUSTOM" and nbytes < ar.custom_max_bytes:
                return ar.custom_us + wire
            if backend in ("FLASHINFER", "FLASHINFER_PCIE_IPC") and nbytes < 64 * 2**20:
                return ar.flashinfer_us + wire
            if backend in ("SYMM_MEM", "NCCL_SYMM_MEM") and nbytes < ar.custom_max_bytes:
                return ar.symm_mem_us + wire
            if backend == "PYNCCL":
                return self.nccl_call_us(nbytes)
        return self.nccl_call_us(nbytes)

    # -- one step -----------------------------------------------------------------------------
    def step_ms(self, shape: StepShape) -> float:
        perf = self.profile.perf
        model = self.profile.model
        cfg = self.cfg
        tokens = shape.tokens
        if tokens == 0:
            return 0.0
        regime = self.regime(shape)
        seqs = shape.decode_seqs + shape.prefill_seqs
        if model.num_experts > 0:
            # Distinct experts touched: extra tokens of one sequence route similarly, so they
            # count only partly as independent draws.
            independent = seqs + perf.same_seq_token_weight * (tokens - seqs)
            miss = 1.0 - model.experts_per_token / model.num_experts
            used = 1.0 - miss ** independent
        else:
            used = 0.0
        weights_ms = (perf.dense_ms + perf.expert_ms * used) * self._scale * cfg.weights_factor
        compute_ms = perf.per_token_ms * tokens * self._scale
        attn_scale = self._scale if model.kv_sharded_by_tp else 1.0
        attn_ms = perf.attention_us_per_ctx_token * shape.context_tokens / 1e3 * attn_scale
        if cfg.kv_fp8:
            attn_ms /= perf.kv_fp8_speedup
        gpu_ms = max(weights_ms, compute_ms) + attn_ms
        ar_us = self.allreduce_call_us(tokens)
        if regime in ("eager", "compiled"):
            ar_us += perf.eager_allreduce_extra_us
        total = perf.overhead_ms[regime] + gpu_ms + self._n_ar * ar_us / 1e3
        if not cfg.async_scheduling:
            total += perf.sched_overhead_ms + perf.sched_per_seq_us * seqs / 1e3
        total += perf.verify_ms_per_draft_token * shape.draft_tokens
        if cfg.spec_method in NGRAM_METHODS:
            total += perf.ngram_lookup_us_per_seq * shape.decode_seqs / 1e3
        elif cfg.spec_method in MODEL_DRAFTERS and shape.decode_seqs:
            total += cfg.num_spec_tokens * perf.drafter_ms_per_token * (1 + shape.decode_seqs / 64)
        total += (cfg.pp - 1) * perf.pp_send_us / 1e3
        return total


# ------------------------------------------------------------------------------------------
# Closed-loop estimate
# ------------------------------------------------------------------------------------------


def unit_hash(*parts: int) -> float:
    """Deterministic uniform number in [0, 1) from integers (splitmix64 mixing)."""
    x = 0x9E3779B97F4A7C15
    for p in parts:
        x = (x ^ (p & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        x = (x ^ (x >> 31)) * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 29
    return (x >> 11) / float(1 << 53)


@dataclass(frozen=True)
class Workload:
    """Closed-loop client: `concurrency` streams, each sending requests back to back."""

    prompt_tokens: int = 100
    output_tokens: int = 128            # every request runs to this length (ignore_eos)
    requests_per_stream: int = 3
    ngram_hit_rate: float = 0.0         # share of steps where n-gram lookup finds a draft
    ngram_accept_prob: float = 0.0      # per-position acceptance of an n-gram draft
    output_jitter: float = 0.0          # +-fraction of output_tokens, deterministic per request

    def output_len(self, request_no: int) -> int:
        if not self.output_jitter:
            return self.output_tokens
        u = unit_hash(request_no, 11)
        return max(1, round(self.output_tokens * (1 + self.output_jitter * (2 * u - 1))))


@dataclass(frozen=True)
class LevelEstimate:
    concurrency: int
    output_tok_s: float
    mean_latency_s: float
    mean_ttft_s: float
    mean_tpot_s: float
    requests: int
    duration_s: float
    steady_output_tok_s: float          # tokens inside [first wave done, first stream done]
    mean_acceptance_length: float | None


def accepted_drafts(cfg: PerfConfig, profile: Profile, workload: Workload,
                    seq_id: int, step: int, drafts: int) -> int:
    """How many of `drafts` proposed tokens the target model accepts (deterministic)."""
    if cfg.spec_method in NGRAM_METHODS:
        probs: Sequence[float] = [workload.ngram_accept_prob] * drafts
    else:
        table = profile.perf.drafter_accept_prob
        probs = [table[min(i, len(table) - 1)] for i in range(drafts)]
    n = 0
    for pos, p in enumerate(probs):
        if unit_hash(seq_id, step, pos, 7) >= p:
            break
        n += 1
    return n


def simulate_closed_loop(profile: Profile, cfg: PerfConfig, workload: Workload,
                         concurrency: int) -> LevelEstimate:
    """One level of closed-loop clients, simulated step by step (see `_ClosedLoop`)."""
    return _ClosedLoop(profile, cfg, workload, concurrency).run()


class _ClosedLoop:
    """`concurrency` streams, each sending its next request as soon as the previous one
    finishes, until every stream has sent `workload.requests_per_stream`.

    Besides per-request latencies it records when the first wave (the first request of every
    stream) is done and when the first stream runs out of requests: between the two every
    stream is busy, so the throughput there is the level's steady state."""

    def __init__(self, profile: Profile, cfg: PerfConfig, workload: Workload, concurrency: int) -> None:
        self.profile = profile
        self.cfg = cfg
        self.workload = workload
        self.concurrency = concurrency
        self.cost = CostModel(profile, cfg)
        self.sched = Scheduler(cfg)
        self.k = cfg.num_spec_tokens if cfg.spec_method else 0
        self.step_no = 0
        self.now = 0.0
        self.next_id = 0
        self.arrival: dict[int, float] = {}
        self.first_token: dict[int, float] = {}
        self.owner: dict[int, int] = {}
        self.sent = [0] * concurrency
        self.latencies: list[float] = []
        self.ttfts: list[float] = []
        self.tpots: list[float] = []
        self.emissions: list[tuple[float, int]] = []
        self.total_out = 0
        self.accepted = self.draft_steps = 0
        self.first_wave_left = concurrency
        self.t_warm: float | None = None
        self.t_stop: float | None = None

    def run(self) -> LevelEstimate:
        for s in range(self.concurrency):
            self._submit(s)
        while self.sched.has_work():
            self._step()
        return self._estimate()

    def _draft(self, seq: SeqState) -> int:
        """Tokens drafted for `seq` this step: n-gram lookup finds a draft only on a share of
        steps (`ngram_hit_rate`); a draft model always proposes k."""
        k = self.k
        if not k:
            return 0
        if self.cfg.spec_method in NGRAM_METHODS:
            return k if unit_hash(seq.seq_id, self.step_no, 3) < self.workload.ngram_hit_rate else 0
        return k

    def _submit(self, stream: int) -> None:
        seq = SeqState(self.next_id, self.workload.prompt_tokens, self.workload.output_len(self.next_id))
        self.arrival[self.next_id] = self.now
        self.owner[self.next_id] = stream
        self.sent[stream] += 1
        self.next_id += 1
        self.sched.add(seq)

    def _step(self) -> None:
        plan = self.sched.schedule(self._draft)
        if not plan.entries:
            raise RuntimeError("scheduler cannot make progress (KV cache too small?)")
        self.now += self.cost.step_ms(plan.shape()) / 1e3
        self.step_no += 1
        for entry in plan.entries:
            seq = entry.seq
            emitted = min(self._tokens_out(entry), seq.max_output - seq.num_output)
            if emitted and seq.seq_id not in self.first_token:
                self.first_token[seq.seq_id] = self.now
            self.total_out += emitted
            if emitted:
                self.emissions.append((self.now, emitted))
            self.sched.commit(entry, emitted, False)
            if seq.finished:
                self._finish(seq)

    def _tokens_out(self, entry: Scheduled) -> int:
        """Tokens `entry` produces this step (before the request's length cap): the first one
        when its prefill completes, else one plus the accepted drafts."""
        if entry.prefill:
            return 1 if entry.completes_prefill else 0
        acc = accepted_drafts(self.cfg, self.profile, self.workload, entry.seq.seq_id, self.step_no,
                              entry.drafts)
        if entry.drafts:
            self.accepted += acc
            self.draft_steps += 1
        return acc + 1

    def _finish(self, seq: SeqState) -> None:
        now = self.now
        if seq.seq_id < self.concurrency:
            self.first_wave_left -= 1
            if self.first_wave_left == 0:
                self.t_warm = now
        lat = now - self.arrival[seq.seq_id]
        ttft = self.first_token[seq.seq_id] - self.arrival[seq.seq_id]
        self.latencies.append(lat)
        self.ttfts.append(ttft)
        if seq.max_output > 1:
            self.tpots.append((lat - ttft) / (seq.max_output - 1))
        stream = self.owner[seq.seq_id]
        if self.sent[stream] < self.workload.requests_per_stream:
            self._submit(stream)
        elif self.t_stop is None:
            self.t_stop = now

    def _estimate(self) -> LevelEstimate:
        now, total_out = self.now, self.total_out
        latencies, ttfts, tpots = self.latencies, self.ttfts, self.tpots
        t_warm, t_stop = self.t_warm, self.t_stop
        n = len(latencies)
        steady = total_out / now if now else 0.0
        if t_warm is not None and t_stop is not None and t_stop > t_warm:
            steady = sum(k for t, k in self.emissions if t_warm < t <= t_stop) / (t_stop - t_warm)
        return LevelEstimate(
            concurrency=self.concurrency,
            output_tok_s=total_out / now if now else 0.0,
            mean_latency_s=sum(latencies) / n,
            mean_ttft_s=sum(ttfts) / n,
            mean_tpot_s=sum(tpots) / len(tpots) if tpots else 0.0,
            requests=n,
            duration_s=now,
            steady_output_tok_s=steady,
            mean_acceptance_length=(1 + self.accepted / self.draft_steps) if self.draft_steps else None,
        )


def estimate(profile: Profile, cfg: PerfConfig, workload: Workload | None = None,
             concurrencies: Sequence[int] = (1, 2, 10, 64, 256)) -> dict[str, object]:
    """Closed-loop throughput/latency per concurrency, without any server.

    Returns {"levels": {c: LevelEstimate}, "output_tok_s": {c: float}, "tpot_c1_s": float|None,
    "single_stream_tok_s": float|None}. Units are simulated seconds (time scale 1).
    """
    wl = workload or Workload()
    levels = {c: simulate_closed_loop(profile, cfg, wl, c) for c in concurrencies}
    first = levels.get(1)
    return {
        "levels": levels,
        "output_tok_s": {c: lv.output_tok_s for c, lv in levels.items()},
        "tpot_c1_s": first.mean_tpot_s if first else None,
        "single_stream_tok_s": first.output_tok_s if first else None,
    }
