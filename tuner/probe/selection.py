"""Which prompts the reference records and which requests a trial sends (pure): the
reference prompt set, known-answer items that share a request with a reference prompt, and
the teacher-forced prompts.
"""

from __future__ import annotations

from collections.abc import Sequence

from tuner.probe.checks import check_answer
from tuner.probe.items import ProbeItem
from tuner.probe.record import ChatMessage, Reference, ReferencePrompt, ReferenceSource
from tuner.probe.spec import OPEN_PROMPTS, ProbeSpec, ReferenceSpec
from tuner.probe.wire import apply_stop

__all__ = [
    "bank_tokens",
    "prompt_strata",
    "reference_correct",
    "forced_prompt_ids",
    "item_source",
    "reference_sources",
    "shared_prompts",
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
