"""Which prompts the reference records and which requests a trial sends (pure): the
reference prompt set, known-answer items that share a request with a reference prompt, the
single-stream subset at concurrency 1, and the teacher-forced prompts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tuner.probe.checks import check_answer
from tuner.probe.items import ProbeItem
from tuner.probe.record import ChatMessage, Reference, ReferencePrompt, ReferenceSource
from tuner.probe.spec import OPEN_PROMPTS, ProbeSpec, ReferenceSpec
from tuner.probe.wire import apply_stop

__all__ = [
    "SINGLE_STREAM_LEVEL",
    "SingleStreamPlan",
    "bank_tokens",
    "prompt_strata",
    "reference_correct",
    "forced_prompt_ids",
    "item_source",
    "reference_sources",
    "shared_prompts",
    "single_stream_plan",
]


def _question_key(item: ProbeItem) -> str:
    # Item ids are "<question>-<api>" for generated and user items alike.
    return item.id.rsplit("-", 1)[0] if item.id.endswith(f"-{item.api}") else item.id


def _known_answer_sources(
    spec: ProbeSpec, items: Sequence[ProbeItem]
) -> list[tuple[ReferenceSource, ProbeItem]]:
    """The known-answer questions the reference reuses, each with the item it was made from."""
    chosen: dict[str, ProbeItem] = {}
    for item in items:
        key = _question_key(item)
        if key not in chosen or (item.api == "chat" and chosen[key].api != "chat"):
            chosen[key] = item
    questions = list(chosen.items())
    if spec.reference.known_answer_prompts is not None:
        questions = questions[: spec.reference.known_answer_prompts]
    return [(item_source(item, f"ka-{key}"), item) for key, item in questions]


def item_source(item: ProbeItem, source_id: str) -> ReferenceSource:
    """A known-answer item as a reference prompt: its chat messages, or its text."""
    if item.api == "chat":
        messages = tuple(ChatMessage.model_validate(m) for m in item.messages())
        return ReferenceSource(id=source_id, source="known_answer", messages=messages)
    return ReferenceSource(id=source_id, source="known_answer", prompt=item.prompt)


def shared_prompts(
    spec: ProbeSpec, items: Sequence[ProbeItem], reference: Reference
) -> dict[str, ReferencePrompt]:
    """Known-answer item id -> the reference prompt recorded from exactly that item.

    Such an item needs one request per level, not two: sent as the reference's token ids
    with top-k logprobs, its answer is judged as a known answer and compared with the
    reference. Only prompts whose recorded fingerprint matches the item's text are paired,
    so a stale or foreign reference never lends its ids to a different question.
    """
    recorded = {p.id: p for p in reference.prompts}
    out: dict[str, ReferencePrompt] = {}
    for source, item in _known_answer_sources(spec, items):
        prompt = recorded.get(source.id)
        if prompt is not None and prompt.fingerprint == source.fingerprint():
            out[item.id] = prompt
    return out


# Concurrency 1 is where a trial's requests run one at a time, so there every request costs
# its full decode time (about 60 ms a token on the CPU test server, 2-4 times the batched
# cost per token): the whole prompt set there was half the probe's time. The plan keeps the
# single-stream coverage the faults need - a long and a short prompt, both prompt forms,
# the longest continuation, a known answer through each API - and leaves the statistics
# (accuracy over every item, the 66 % exact rule over every prompt) to the batched level.
SINGLE_STREAM_LEVEL = 1


@dataclass(frozen=True)
class SingleStreamPlan:
    """What concurrency 1 sends under ``ProbeSpec.single_stream: subset``.

    ``items`` / ``prompts`` are the known-answer item ids and reference prompt ids sent
    there; None means everything (that layer does not run a higher level to carry the
    rest).
    """

    items: frozenset[str] | None
    prompts: frozenset[str] | None

    def asked_items(self) -> dict[int, frozenset[str]]:
        return {} if self.items is None else {SINGLE_STREAM_LEVEL: self.items}

    def asked_prompts(self) -> dict[int, frozenset[str]]:
        return {} if self.prompts is None else {SINGLE_STREAM_LEVEL: self.prompts}


def single_stream_plan(
    spec: ProbeSpec, items: Sequence[ProbeItem], reference: Reference
) -> SingleStreamPlan | None:
    """The requests a trial sends at concurrency 1, or None when it sends everything.

    Only with ``single_stream: subset`` and for a layer that runs at 1 *and* at a higher
    level (the whole set runs there). Chosen from the recorded reference, deterministic,
    in the reference's order on ties:

    1. the longest prompt (bugs past a prompt length) and the shortest;
    2. for each prompt form (chat template, raw text) none of those has: its prompt with
       the longest reference continuation;
    3. a prompt with the longest reference continuation of all, if none chosen has it (a
       divergence after a few tokens needs tokens to show in);
    4. known answers: the item each chosen known-answer prompt was made from (one request
       serves both layers), then for every API no chosen item uses, its item with the
       shortest prompt.

    On the default set that is the 600-token lookup, a raw-text open prompt with 16
    continuation tokens, and a short completions question; on smollm2-cpu.yaml's chat-only
    set, a copy question and the raw-text open prompt.
    """
    if spec.single_stream != "subset" or not reference.prompts:
        return None
    ka_levels, ref_levels = spec.concurrency, spec.reference.concurrency
    ka_sub = SINGLE_STREAM_LEVEL in ka_levels and len(ka_levels) > 1 and bool(items)
    ref_sub = SINGLE_STREAM_LEVEL in ref_levels and len(ref_levels) > 1
    if not (ka_sub or ref_sub):
        return None
    prompts = reference.prompts
    chosen: list[ReferencePrompt] = []

    def add(prompt: ReferencePrompt) -> None:
        if all(c.id != prompt.id for c in chosen):
            chosen.append(prompt)

    add(max(prompts, key=lambda p: len(p.prompt_ids)))
    add(min(prompts, key=lambda p: len(p.prompt_ids)))
    for form in ("chat", "text"):
        of_form = [p for p in prompts if p.form == form]
        if of_form and not any(c.form == form for c in chosen):
            add(max(of_form, key=lambda p: len(p.generation.tokens)))
    longest = max(len(p.generation.tokens) for p in prompts)
    if not any(len(c.generation.tokens) == longest for c in chosen):
        add(next(p for p in prompts if len(p.generation.tokens) == longest))

    chosen_ids = {c.id for c in chosen}
    prompt_of = {item.id: source.id for source, item in _known_answer_sources(spec, items)}
    item_ids = [item.id for item in items if prompt_of.get(item.id) in chosen_ids]
    by_id = {item.id: item for item in items}
    for api in dict.fromkeys(item.api for item in items):
        if not any(by_id[i].api == api for i in item_ids):
            of_api = [item for item in items if item.api == api]
            item_ids.append(min(of_api, key=lambda item: len(item.prompt)).id)
    # A chosen item that is also a recorded reference prompt brings that prompt along, so
    # its one request still serves both layers.
    recorded = {p.id for p in prompts}
    if ka_sub:
        chosen_ids |= {prompt_of[i] for i in item_ids if prompt_of.get(i) in recorded}
    return SingleStreamPlan(
        items=frozenset(item_ids) if ka_sub else None,
        prompts=frozenset(chosen_ids) if ref_sub else None,
    )


def forced_prompt_ids(reference: Reference, spec: ReferenceSpec) -> set[str]:
    """The prompts a trial teacher-forces (``spec.forced_prompts``): of those the reference
    forced, the open ones (not known-answer questions), or all when there are none."""
    if not spec.teacher_forced:
        return set()
    forced = [p for p in reference.prompts if p.forced is not None]
    if spec.forced_prompts == "open":
        open_ = [p for p in forced if p.source != "known_answer"]
        forced = open_ or forced
    return {p.id for p in forced}


def reference_sources(
    spec: ProbeSpec,
    items: Sequence[ProbeItem],
    custom: Sequence[ReferenceSource] = (),
) -> list[ReferenceSource]:
    """The reference prompt set: known-answer questions, built-in open prompts, custom ones.

    Each known-answer question is used once - in its chat form when it has one, because an
    instruct model's continuation of its own template is the realistic case and the chat
    items' prompt prefixes are then already in the server's prefix cache from the known-
    answer run. ``items`` are the known-answer items the probe sends (load_probe_items).
    """
    out = [source for source, _ in _known_answer_sources(spec, items)]
    # The reference records every open prompt; each trial draws a few (bank.open_prompts).
    for n, (form, text) in enumerate(OPEN_PROMPTS):
        if form == "chat":
            msgs = (ChatMessage(role="user", content=text),)
            out.append(ReferenceSource(id=f"open{n}-chat", source="open", messages=msgs))
        else:
            out.append(ReferenceSource(id=f"open{n}-text", source="open", prompt=text))
    out.extend(custom)
    ids = [s.id for s in out]
    if len(set(ids)) != len(ids):
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        raise ValueError(f"reference prompt ids must be unique, repeated: {dupes}")
    return out


def bank_tokens(spec: ProbeSpec) -> int:
    """Tokens generated per reference request (:meth:`ProbeSpec.generated_tokens`)."""
    return spec.generated_tokens()


def prompt_strata(spec: ProbeSpec, items: Sequence[ProbeItem]) -> dict[str, str]:
    """Reference prompt id -> the bank stratum of the item it was made from."""
    return {
        source.id: item.stratum
        for source, item in _known_answer_sources(spec, items)
        if item.stratum is not None
    }


def reference_correct(
    spec: ProbeSpec, items: Sequence[ProbeItem], reference: Reference
) -> dict[str, bool]:
    """Item id -> whether the reference's own recorded answer to it is right, for every item
    whose question the reference recorded: the baseline a trial's answers to the same items
    are held to."""
    out: dict[str, bool] = {}
    for item_id, prompt in shared_prompts(spec, items, reference).items():
        item = next(i for i in items if i.id == item_id)
        text, _ = apply_stop(item, prompt.generation.text, prompt.generation.finish_reason)
        out[item_id] = check_answer(item.check, item.expected, text, item.distractors)
    return out
