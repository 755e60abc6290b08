"""The quality gate of a lossy trial on simulated time (``tuner.sim.executor``), without a server.

The real gate (``tuner.engine.quality_run.quality_gate``) asks the study's quality items
look by look, pairs the answers with the reference's and lets ``judge`` decide. Here the
answers are computed instead of asked, and everything after that is the real gate's own
code: ``quality_items``, ``look_sizes``, ``paired_counts``, ``judge`` and ``gate_record``
(``tuner.probe.quality_items``, ``tuner.probe.quality_stats``, ``tuner.engine.quality_run``), so
the record, its interval and its verdict are what a worker would store for those answers.

* The reference's answers (``simulated_reference``): the simulated model's own answer to
  each of the study's quality items (``tuner.sim.model.plan_output``, greedy, at the probe's
  ``max_tokens``), judged by the item's check rule - what the reference job records against
  the served simulator (about 0.84 of the bank right). Computed once per study, as the
  reference job answers once.
* A trial's answers follow the simulator's lossy model (``tuner.sim.lossy``): each item
  flips with probability the point's true drop (``PointTruth.lossy_drop``), and only an item
  the reference answers right can turn wrong, never the other way; so the accuracy the
  trial loses is the drop times the reference's accuracy, as on the served simulator. The
  served simulator picks the flipped items by a hash of the prompt (the same items in every
  trial of the configuration); here each trial draws its own, from the executor's seed and
  the trial's number, so a rerun of the simulated study gives the same records while a
  repeated configuration shows the gate's sampling spread. A real fp8 server also churns a
  few items both ways, which widens its interval and costs it more looks than here.
* Its time: :data:`ITEM_S` per item asked, up to the deciding look.

No I/O and no clock of its own; its randomness comes from its seeds.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any, Final

from tuner.engine.quality_run import gate_record
from tuner.probe.checks import check_answer
from tuner.probe.quality_items import quality_items
from tuner.probe.quality_stats import QualityRecord, judge, look_sizes, paired_counts
from tuner.probe.spec import ProbeSpec
from tuner.probe.wire import apply_stop
from tuner.sim.model import TOKENIZER, chat_prompt, plan_output
from tuner.sim.truth import PointTruth
from tuner.study.quality_plan import QualityPlan, quality_plan
from tuner.study.spec import StudySpec

__all__ = ["ITEM_S", "gate_plan", "simulate_gate", "simulated_reference", "true_record"]

# Seconds per quality item asked: the vLLM CPU build answered 200 items in 26 s (bfloat16,
# one look) and 400 in 113 s (fp8 KV cache, two looks), 800 in 92 s with both
# (results/examples/smollm2-cpu-lossy, each record's probe_s): 0.13 s an item at its fastest.
# On a GPU the items go much faster (an H100 answers a batch of short greedy answers in well
# under a second); no GPU gate has been timed yet, so the measured figure is kept: an upper
# bound there, and a SimExecutor argument (quality_item_s) to change it.
ITEM_S: Final = 0.13

Reference = Sequence[tuple[str, bool]]   # (item id, answered right), in the items' order


def gate_plan(spec: StudySpec, request: Mapping[str, Any]) -> QualityPlan | None:
    """The quality gate a trial runs, None for none: the request's plan as the orchestrator
    built it (``quality_plan``: a lossy trial of a study with ``quality:``), else, for a
    request written without one, the same decision made from the study and its values."""

    if "quality" in request:
        raw = request["quality"]
        return None if raw is None else QualityPlan.model_validate(raw)
    return quality_plan(spec, dict(request["values"]), None)


def simulated_reference(probe: ProbeSpec, count: int) -> list[tuple[str, bool]]:
    """The simulated (lossless) server's answers to the study's first ``count`` quality items,
    each sent as the real gate sends it (``tuner.probe.wire.request_for``: chat messages, or a
    completion prompt cut at its stop strings) and judged by its check rule."""

    out = []
    for item in quality_items(probe, count):
        text = chat_prompt(item.messages()) if item.api == "chat" else item.prompt
        plan = plan_output(text, TOKENIZER.encode(text), max_tokens=probe.max_tokens, ignore_eos=False)
        answer = "".join(plan.pieces)
        if item.api != "chat":
            answer = apply_stop(item, answer, None)[0]
        out.append((item.id, check_answer(item.check, item.expected, answer, item.distractors)))
    return out


def _accuracy(reference: Reference) -> float:
    return sum(right for _, right in reference) / len(reference) if reference else 0.0


def simulate_gate(plan: QualityPlan, reference: Reference, drop: float, *, seed: int, number: int,
                  item_s: float = ITEM_S) -> QualityRecord:
    """The record of trial ``number``'s gate with true flip rate ``drop`` against
    ``reference`` (``simulated_reference`` of ``max_items``): the first ``items`` paired items
    judged, then twice as many ... up to all of them, stopping at the first look ``judge``
    decides (undecided at the last is a fail), as the real gate does."""

    quality = plan.spec
    rng = random.Random(f"{seed}|{number}|quality")
    # One draw per item, in item order: a look's answers are a prefix of the next look's.
    trial = [(item, right and not rng.random() < drop) for item, right in reference]
    sizes = look_sizes(min(quality.items, len(reference)), len(reference))
    for look, size in enumerate(sizes):
        counts = paired_counts(dict(reference[:size]), dict(trial[:size]))
        if judge(counts, quality.max_accuracy_drop, quality.confidence, look, len(sizes)) != "more":
            break
    return gate_record(counts, plan, looks=look + 1, planned=len(sizes), probe_s=counts.n * item_s)


def true_record(spec: StudySpec, truth: PointTruth, reference: Reference) -> QualityRecord | None:
    """What only the simulator knows: the record a gate with no sampling error would give
    ``truth`` against ``reference`` (its expected drop, the flip rate times the reference's
    accuracy, with a zero-width interval: pass iff within the budget); None where no gate
    runs (no ``quality:``, a lossless point, a failed start or probe)."""

    plan = None if truth.failed or not truth.probe_passed else quality_plan(spec, truth.values, None)
    if plan is None:
        return None
    quality = plan.spec
    accuracy = _accuracy(reference)
    drop = truth.lossy_drop * accuracy
    return QualityRecord(
        items=len(reference), reference_accuracy=accuracy, trial_accuracy=accuracy - drop, drop=drop,
        drop_low=drop, drop_high=drop, confidence=quality.confidence, budget=quality.max_accuracy_drop,
        verdict="pass" if drop <= quality.max_accuracy_drop else "fail", decided_at_cap=False,
        looks=len(look_sizes(min(quality.items, len(reference)), len(reference))), probe_s=0.0,
        lossy=dict(plan.lossy))
