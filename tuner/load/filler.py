"""Filler prose for synthetic prompts (pure): the sentences that pad a prompt's notes, and the
system prompt every request of a shared_prefix group begins with (tuner.load.workload).

Seeded text only: a function of the random generator it is handed, never of the clock.
"""

from __future__ import annotations

import functools
import random

__all__ = ["TOKENS_PER_WORD", "sentence", "shared_prefix_text"]

# English prose is ~1.3 tokens per whitespace word for BPE tokenizers; it only has to be
# close, because the exact fit (when enabled) corrects it with the server's tokenizer.
TOKENS_PER_WORD = 1.3

_ADJECTIVES = (
    "quiet", "bright", "ancient", "narrow", "restless", "hollow", "golden", "distant",
    "careful", "brittle", "patient", "crowded", "silver", "windy", "tired", "curious",
    "gentle", "heavy", "sudden", "familiar",
)
_NOUNS = (
    "harbour", "garden", "engine", "market", "valley", "library", "lantern", "river",
    "station", "orchard", "window", "village", "bridge", "tower", "forest", "kitchen",
    "workshop", "meadow", "archive", "corridor",
)
_VERBS = (
    "watched", "crossed", "remembered", "followed", "repaired", "painted", "measured",
    "carried", "described", "visited", "ignored", "guarded", "studied", "opened",
)
_PREPOSITIONS = ("near", "beyond", "beside", "under", "behind", "across", "inside", "above")
def sentence(rng: random.Random) -> str:
    """One seeded sentence of filler (about 11 words)."""
    c = rng.choice
    return (
        f"The {c(_ADJECTIVES)} {c(_NOUNS)} {c(_VERBS)} the {c(_ADJECTIVES)} {c(_NOUNS)} "
        f"{c(_PREPOSITIONS)} the {c(_NOUNS)}."
    )


_ROLES = (
    "the support desk of a regional railway", "a hospital's patient-information service",
    "an online bookshop", "a city's building-permit office", "a bank's card helpline",
    "a university's admissions office", "a travel insurer", "a software vendor's licensing team",
)
_POLICY_OPENERS = (
    "Always", "Never", "When in doubt,", "Before answering,", "If the user asks about pricing,",
    "For any complaint,", "Where a rule is unclear,", "At the end of each answer,",
)


@functools.lru_cache(maxsize=256)
def shared_prefix_text(seed: int, class_name: str, group: int, prefix_tokens: int) -> str:
    """The system prompt every request of one shared_prefix group begins with, byte for byte.

    A function of (seed, class, group, length) only, not of the stream: like a deployment's
    real system prompt it is the same in every level and every trial, so the server's prefix
    cache sees the reuse the class describes. Its length is estimated (~1.3 tokens a word): exact
    fitting trims the question after it, never the prefix, which must stay identical.
    """

    rng = random.Random(f"tuner-shared-prefix|{seed}|{class_name}|{group}")
    # The group number comes first: prompts of different groups part within the server's
    # first cache block (16 tokens), so a group's reuse is the only reuse there is.
    head = (f"Policy set {group}. System: you are the assistant of {rng.choice(_ROLES)}. "
            "Follow every rule below.\n")
    want = max(0, round(prefix_tokens / TOKENS_PER_WORD) - len(head.split()))
    rules: list[str] = []
    words: list[str] = []
    while len(words) < want:
        rule = f"{len(rules) + 1}. {rng.choice(_POLICY_OPENERS)} {sentence(rng).lower()}"
        rules.append(rule)
        words.extend(rule.split())
    body = " ".join(words[:want])
    return f"{head}{body}\n\n"
