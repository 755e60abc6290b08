"""What one trial's probe sends (pure): a fresh seeded sample of the recorded pool that
covers every stratum, every prompt-length bucket and every decode batch size.

The reference records the whole pool once per study (:func:`tuner.probe.bank.build_pool`);
a trial sends, with its own seed:

* one known-answer item of every (family, wording) stratum - so every wording and family
  is asked in every trial, with different facts each time;
* one long-context prompt inside every prompt-length bucket (:func:`length_buckets`), the
  longest buckets first while ``prompt_token_budget`` lasts;
* ``open_prompts`` open prompts (teacher-forced) and every custom prompt of the study.

That sample runs at the top decode batch size (repeated to fill it when the top is larger
than the sample), then at every smaller batch size b of :func:`batch_sizes` with b prompts -
different items at each - and at batch size 1 the longest prompt and a multi-turn item,
alone. The prompts of a batch size go in waves of b, each wave one request holding b
prompts (:mod:`tuner.probe.trial`), so the server decodes them as one batch of exactly b
whatever the client's timing. Top first: a clear failure there ends the probe early.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tuner.probe.items import ProbeItem
from tuner.probe.record import Reference, ReferencePrompt
from tuner.probe.shapes import Coverage, batch_sizes, length_buckets
from tuner.probe.spec import ProbeSpec

__all__ = ["TrialPlan", "known_sample", "plan_trial"]


@dataclass(frozen=True)
class TrialPlan:
    """The requests of one probe run.

    ``levels`` are decode batch sizes in the order they run (top first); ``prompts[b]``
    the reference prompt ids sent at b (an id may repeat at the top level to fill the
    batch); ``forced`` the ids teacher-forced with the top level.
    """

    levels: tuple[int, ...]
    prompts: Mapping[int, tuple[str, ...]]
    forced: tuple[str, ...]
    coverage: Coverage
    seed: int = 0
    strata: Mapping[str, str] = field(default_factory=dict)

    @property
    def top(self) -> int:
        return max(self.levels)


def _by_stratum(
    reference: Reference, strata: Mapping[str, str]
) -> dict[str, list[ReferencePrompt]]:
    out: dict[str, list[ReferencePrompt]] = {}
    for p in reference.prompts:
        if p.source == "known_answer" and p.id in strata:
            out.setdefault(strata[p.id], []).append(p)
    return out


def _pick_lengths(
    rng: random.Random,
    candidates: Sequence[ReferencePrompt],
    buckets: Sequence[tuple[int, int]],
    budget: int,
) -> tuple[list[ReferencePrompt], int]:
    """One prompt per bucket (seeded), longest bucket first while the token budget lasts;
    returns the prompts and how many buckets got one."""
    chosen: list[ReferencePrompt] = []
    covered = 0
    spent = 0
    for lo, hi in sorted(buckets, key=lambda b: -b[0]):
        inside = [p for p in candidates if lo <= len(p.prompt_ids) < hi]
        if not inside:
            continue
        pick = rng.choice(inside)
        if chosen and spent + len(pick.prompt_ids) > budget:
            pick = min(inside, key=lambda p: len(p.prompt_ids))
            if spent + len(pick.prompt_ids) > budget:
                continue
        chosen.append(pick)
        spent += len(pick.prompt_ids)
        covered += 1
    return chosen, covered


def _sample(
    reference: Reference,
    spec: ProbeSpec,
    strata: Mapping[str, str],
    rng: random.Random,
    buckets: Sequence[tuple[int, int]],
) -> tuple[list[ReferencePrompt], int]:
    """The top level's distinct prompts and the number of length buckets covered."""
    groups = _by_stratum(reference, strata)
    sample = [
        rng.choice(groups[name]) for name in sorted(groups) if not name.startswith("retrieval/")
    ]
    retrieval = [p for name, ps in groups.items() if name.startswith("retrieval/") for p in ps]
    taken = {p.id for p in sample}
    # Every recorded prompt is a length candidate; the long-context items exist to fill
    # the long buckets, the short questions already sit in the short ones.
    pool = [p for p in reference.prompts if p.id not in taken and p.source != "open"]
    long_ones, covered = _pick_lengths(
        rng, retrieval or pool, buckets, spec.bank.prompt_token_budget
    )
    sample += [p for p in long_ones if p.id not in taken]
    lengths = {len(p.prompt_ids) for p in sample}
    covered = sum(any(lo <= n < hi for n in lengths) for lo, hi in buckets)
    open_ = [p for p in reference.prompts if p.source == "open"]
    sample += rng.sample(open_, min(spec.bank.open_prompts, len(open_)))
    sample += [p for p in reference.prompts if p.source == "custom"]
    unstratified = [
        p for p in reference.prompts if p.source == "known_answer" and p.id not in strata
    ]
    sample += unstratified
    return sample, covered


def plan_trial(
    reference: Reference,
    spec: ProbeSpec,
    strata: Mapping[str, str],
    seed: int,
    *,
    capture_sizes: Sequence[int] = (),
    boundaries: Sequence[int] = (),
) -> TrialPlan:
    """The seeded plan of one trial's probe.

    ``strata`` maps a known-answer reference prompt id to its bank stratum (prompts not in
    it - the study's own known answers - are always sent). ``capture_sizes`` and
    ``boundaries`` are what the trial's server log reports (CUDA-graph capture sizes;
    compile range endpoints); empty where it reports none.
    """
    rng = random.Random(f"{spec.seed}:{seed}")
    longest = max((len(p.prompt_ids) for p in reference.prompts), default=16)
    buckets = length_buckets(longest, [*capture_sizes, *boundaries])
    sample, covered = _sample(reference, spec, strata, rng, buckets)
    top = max(*spec.concurrency, spec.bank.top_concurrency or 1)
    sizes = batch_sizes(top, capture_sizes, configured=spec.bank.batch_sizes)
    top = max(sizes)
    # Longest work first within a level, so its tail stays batched.
    sample.sort(key=lambda p: -(len(p.prompt_ids) + len(p.generation.tokens)))
    ids = [p.id for p in sample]
    prompts: dict[int, tuple[str, ...]] = {
        top: tuple(ids[i % len(ids)] for i in range(max(top, len(ids))))
    }
    rotation = ids[:]
    rng.shuffle(rotation)
    cursor = 0
    for b in sorted(sizes[:-1], reverse=True):
        if b == 1:
            multi = [p.id for p in sample if strata.get(p.id, "").startswith("multi_turn/")]
            prompts[1] = tuple(dict.fromkeys([ids[0], *multi[:1]]))
            continue
        prompts[b] = tuple(rotation[(cursor + i) % len(rotation)] for i in range(b))
        cursor += b
    forced = _forced(sample, spec)
    families = sorted({strata[p.id].split("/")[0] for p in sample if p.id in strata})
    coverage = Coverage(
        buckets=buckets,
        prompt_tokens=sorted({len(p.prompt_ids) for p in sample}),
        buckets_covered=covered,
        batch_sizes=sizes,
        strata=len({strata[p.id] for p in sample if p.id in strata}),
        families=families,
        requests=sum(len(v) for v in prompts.values()) + len(forced),
        reported_boundaries=sorted({*capture_sizes, *boundaries}),
    )
    order = (top, *sorted((b for b in prompts if b != top), reverse=True))
    return TrialPlan(
        levels=order,
        prompts=prompts,
        forced=forced,
        coverage=coverage,
        seed=seed,
        strata=dict(strata),
    )


def _forced(sample: Sequence[ReferencePrompt], spec: ProbeSpec) -> tuple[str, ...]:
    """Teacher-forced prompts among the sampled ones the reference forced: with
    ``forced_prompts: open`` (the default) the open (and custom) ones, or all when none is;
    with ``all`` every one."""
    ref = spec.reference
    if not ref.teacher_forced:
        return ()
    recorded = [p for p in sample if p.forced is not None]
    # 'open' (the default) forces the sampled open prompts, whose long continuations are
    # where a decode divergence cuts the decode comparison short (on the H200 they carried
    # the FULL-graph corruption, 41 positions); 'all' adds every known-answer prompt's
    # prefill, a cost a CPU trial feels.
    if ref.forced_prompts == "open":
        open_ = [p for p in recorded if p.source != "known_answer"]
        recorded = open_ or recorded
    return tuple(dict.fromkeys(p.id for p in recorded))


def known_sample(
    items: Sequence[ProbeItem], seed: int, *, longest_stratum: int = 512
) -> list[ProbeItem]:
    """The known-answer items asked without a reference (``tuner measure --probe``, or a
    study whose reference layer is off): one item of every (family, wording) stratum and
    the retrieval items up to ``longest_stratum`` tokens, seeded; items outside the bank
    (the study's own file) always."""
    rng = random.Random(seed)
    groups: dict[str, list[ProbeItem]] = {}
    for item in items:
        if item.stratum is not None:
            groups.setdefault(item.stratum, []).append(item)
    out = [item for item in items if item.stratum is None]
    for name in sorted(groups):
        family, _, rest = name.partition("/")
        if family == "retrieval":
            out += [i for i in groups[name] if rest.isdigit() and int(rest) <= longest_stratum]
        else:
            out.append(rng.choice(groups[name]))
    return out
