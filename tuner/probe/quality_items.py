"""The quality gate's questions and the reference's answers to them (pure).

A study with a ``quality:`` budget holds its lossy trials (an fp8 KV cache, fp8 weights) to
the reference's accuracy on the *same* known-answer questions: a paired comparison
(tuner.probe.quality_stats) needs both servers' outcome on each item. The items come from the
probe's item bank (tuner.probe.bank.build_pool) with a seed of their own, so they are other
questions than the ones every trial's corruption probe samples, and in an order that deals
the bank's families (and each family's wordings) in turn: every look of the sequential test
(its first ``items``, then twice as many ...) is spread over all of them, never a block of
one family.

The reference answers all of them once (``quality_reference.json`` in the study folder, one
line per item: id, prompt hash, right or wrong); a trial answers a prefix of the same list,
look by look. The prompt hash makes a stored record unusable for another item list (another
seed, another bank) instead of pairing different questions.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from tuner.probe.bank import build_pool
from tuner.probe.items import ProbeItem
from tuner.probe.spec import ProbeSpec

__all__ = [
    "QualityAnswer",
    "QualityReference",
    "prompt_hash",
    "quality_items",
    "quality_seed",
]

# Items drawn per (family, wording) stratum, whatever the count asked: the list must not
# depend on it (a trial's first look is a prefix of the reference's list). About 970
# distinct questions after duplicates (a few strata have only a handful: three function
# names, sixteen first names): more than any sensible max_items.
_PER_STRATUM = 64
ID_PREFIX = "q-"


def quality_seed(probe_seed: int) -> int:
    """The bank seed of the quality items: derived from the probe's (the study's probe seed),
    so the items are fixed for a study, and other than the corruption probe's pool."""

    digest = hashlib.sha256(f"quality:{probe_seed}".encode()).hexdigest()
    return int(digest[:12], 16)


def prompt_hash(item: ProbeItem) -> str:
    """A short fingerprint of what is sent for ``item`` (its API and text or messages)."""

    sent: object = item.messages() if item.api == "chat" else item.prompt
    text = json.dumps({"api": item.api, "sent": sent}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _dealt(items: Sequence[ProbeItem]) -> list[ProbeItem]:
    """``items`` reordered: one of each family in turn, each family's own strata in turn."""

    families: dict[str, dict[str, list[ProbeItem]]] = {}
    for item in items:
        families.setdefault(item.family, {}).setdefault(item.stratum or item.family, []).append(item)
    queues: list[list[ProbeItem]] = []
    for strata in families.values():
        queue: list[ProbeItem] = []
        columns = list(strata.values())
        for n in range(max(len(c) for c in columns)):
            queue += [c[n] for c in columns if n < len(c)]
        queues.append(queue)
    out: list[ProbeItem] = []
    for n in range(max((len(q) for q in queues), default=0)):
        out += [q[n] for q in queues if n < len(q)]
    return out


def quality_items(probe: ProbeSpec, count: int) -> list[ProbeItem]:
    """The first ``count`` quality items of the study whose probe section is ``probe``
    (deterministic in ``probe.seed``, from ``probe.bank``'s families; fewer when the bank
    has fewer distinct questions). Ids are the bank's with a ``q-`` prefix; asked through
    chat, as the bank's items are."""

    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    bank = probe.bank
    pool = build_pool(quality_seed(probe.seed), bank.families, _PER_STRATUM,
                      max_prompt_tokens=bank.max_prompt_tokens)
    seen: set[str] = set()
    unique: list[ProbeItem] = []
    for item in pool:
        key = prompt_hash(item)
        if key not in seen:
            seen.add(key)
            unique.append(item.model_copy(update={"id": ID_PREFIX + item.id}))
    return _dealt(unique)[:count]


class QualityAnswer(BaseModel):
    """One quality item as a server answered it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    prompt_hash: str
    right: bool
    error: str | None = Field(default=None, description="why no usable answer came back (judged wrong)")


class QualityReference(BaseModel):
    """``quality_reference.json``: the reference configuration's answers to every quality
    item of the study, in the order trials ask them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    seed: int = Field(description="the probe seed the items were drawn with")
    answers: list[QualityAnswer]
    seconds: float | None = Field(default=None, description="what answering them took")
    label: str | None = Field(default=None, description="the reference configuration")

    @property
    def accuracy(self) -> float:
        return sum(a.right for a in self.answers) / len(self.answers) if self.answers else 0.0

    def mismatch(self, items: Sequence[ProbeItem]) -> str | None:
        """Why this record cannot pair with ``items`` (the study's quality items now), or None."""

        if len(self.answers) != len(items):
            return f"it holds {len(self.answers)} items, the study asks {len(items)}"
        for answer, item in zip(self.answers, items, strict=True):
            if answer.id != item.id or answer.prompt_hash != prompt_hash(item):
                return f"item {item.id} differs from the recorded {answer.id}"
        return None
