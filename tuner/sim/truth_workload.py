"""Workload calibration for the ground truth (``tuner.sim.truth``): the load a level really
sends, as one ``Workload`` for ``simulate_closed_loop``.

Why: ``simulate_closed_loop`` takes one prompt length, one output length and n-gram
hit/acceptance rates, while the load generator sends a mix of classes. The requests each
level really sends are rebuilt (``draft_requests`` + ``fit_draft`` with the simulator's
tokenizer, as ``/tokenize`` fitting does), each one's output is planned by the simulator's
model (``plan_output``: ``ignore_eos`` pads to ``max_tokens``; natural stopping, used for
speculative trials when ``ignore_eos: auto``, ends at the model's EOS), and n-gram drafting
is replayed over the real tokens with ``NgramIndex`` for the trial's (k, prompt_lookup_min,
prompt_lookup_max). A level's workload gets the mean prompt and output length (output
spread -> ``output_jitter``), the share of decode steps that found a draft
(``ngram_hit_rate``) and the per-position acceptance that reproduces the replayed mean
accepted tokens per draft (``ngram_accept_prob``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from tuner.load.load_spec import LoadSpec
from tuner.load.workload import draft_requests, fit_draft, level_stream
from tuner.sim.model import TOKENIZER, NgramIndex, chat_prompt, count_accepted, plan_output
from tuner.sim.perf_model import Workload

__all__ = ["LevelRequest", "calibrate_workload", "level_requests"]


@dataclass(frozen=True)
class LevelRequest:
    """One measured request: its class, prompt tokens and the output the simulator plans."""

    cls: str
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]


def level_requests(load: LoadSpec, concurrency: int, ignore_eos: bool) -> list[LevelRequest]:
    """The measured requests of one level, as the load generator builds and the sim answers them."""

    chat = load.api == "chat"

    def encode(text: str) -> list[int]:
        if chat:
            text = chat_prompt([{"role": "user", "content": text}])
        return TOKENIZER.encode(text)

    out = []
    drafts = draft_requests(load.workload, load.requests_for(concurrency), seed=load.seed,
                            stream=level_stream("measure", concurrency))
    for d in drafts:
        if load.fit_prompt_tokens:
            prompt = fit_draft(d.draft, d.target_prompt_tokens, lambda t: len(encode(t)))
        else:
            prompt = d.to_plan(ignore_eos=ignore_eos).prompt
        text = chat_prompt([{"role": "user", "content": prompt}]) if chat else prompt
        ids = TOKENIZER.encode(text)
        plan = plan_output(text, ids, max_tokens=d.workload_class.output_tokens, ignore_eos=ignore_eos,
                           temperature=0.0)
        out.append(LevelRequest(d.workload_class.name, tuple(ids), tuple(plan.ids)))
    return out


@dataclass(frozen=True)
class _NgramStats:
    steps: int
    hit_steps: int
    accepted: int


def _replay_ngram(req: LevelRequest, k: int, lo: int, hi: int) -> _NgramStats:
    """Decode one request as the simulator's engine drafts with prompt lookup."""

    ids = req.output_ids
    total = len(ids)
    index = NgramIndex(req.prompt_ids, lo, hi)
    emitted = min(1, total)                 # prefill emits the first token, undrafted
    index.extend(ids[:emitted])
    steps = hits = accepted = 0
    while emitted < total:
        draft = index.propose(k)
        drafts = max(0, min(len(draft), total - emitted - 1))
        acc = count_accepted(draft[:drafts], ids[emitted:emitted + drafts + 1])
        steps += 1
        if drafts:
            hits += 1
            accepted += acc
        n = min(acc + 1, total - emitted)
        index.extend(ids[emitted:emitted + n])
        emitted += n
    return _NgramStats(steps, hits, accepted)


def _accept_prob(mean_accepted: float, k: int) -> float:
    """p with sum_{i=1..k} p^i == mean_accepted (geometric acceptance, as the model draws)."""

    if mean_accepted <= 0:
        return 0.0
    if mean_accepted >= k:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(mid ** i for i in range(1, k + 1)) < mean_accepted:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def calibrate_workload(reqs: Sequence[LevelRequest], per_stream: int, ngram: tuple[int, int, int] | None) -> Workload:
    prompts = [len(r.prompt_ids) for r in reqs]
    outputs = [len(r.output_ids) for r in reqs]
    mean_out = statistics.fmean(outputs)
    spread = statistics.pstdev(outputs) if len(outputs) > 1 else 0.0
    # A uniform draw on mean*(1 +- j) has standard deviation mean*j/sqrt(3).
    jitter = min(0.95, math.sqrt(3) * spread / mean_out) if mean_out else 0.0
    hit = acc_p = 0.0
    if ngram is not None:
        k, lo, hi = ngram
        stats = [_replay_ngram(r, k, lo, hi) for r in reqs]
        steps = sum(s.steps for s in stats)
        hits = sum(s.hit_steps for s in stats)
        hit = hits / steps if steps else 0.0
        acc_p = _accept_prob(sum(s.accepted for s in stats) / hits, k) if hits else 0.0
    return Workload(prompt_tokens=max(1, round(statistics.fmean(prompts))),
                    output_tokens=max(1, round(mean_out)), requests_per_stream=per_stream,
                    ngram_hit_rate=hit, ngram_accept_prob=acc_p, output_jitter=round(jitter, 4))
