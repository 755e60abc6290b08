"""The probe's item bank (pure): hundreds of chat questions with checkable answers, in many
natural wordings, across families - not one template.

Why a bank: corruption is often prompt-dependent (issue 14, landscape.md §5): one wording
of a fact answered right and a near-identical one wrong, only the second turn of a chat,
only prompts in one length bucket. A probe of a dozen templated questions covers a handful
of prompts and shapes; a configuration must never be judged on one fixed wording.

Each item belongs to a *stratum* - (family, wording) - and the trial sampler
(:mod:`tuner.probe.sample`) draws one item of every stratum per trial, seeded by the trial,
so every wording and every family is asked in every trial, with fresh contents each time.
The study's reference records a *pool*: ``per_stratum`` items of each stratum
(:func:`build_pool`), generated here offline from the tables below (no downloads).

Families (check rules in :mod:`tuner.probe.checks`):

=========== ============================================================ ==========
family      what                                                          check
=========== ============================================================ ==========
fact        capitals of 36 countries, 6 wordings ("Which city is the      mentions
            capital of Peru?", "I'm travelling to Peru...")
arithmetic  +, - and x in 4 wordings ("Add 15 and 27.")                    number
copy        repeat a generated sentence, 2 wordings                        line
translation 24 English words into French or Spanish, 3 wordings           mentions
code        "what does this print" and "write a function", 2 wordings     number /
                                                                          contains
multi_turn  an answer that depends on an earlier turn (2nd and 3rd turn)  mentions
retrieval   a fact hidden in filler prose of a target token length        mentions
            (a fine geometric grid up to the model's context)
=========== ============================================================ ==========

Open prompts (natural text of varied length, no expected answer) are
:data:`tuner.probe.spec.OPEN_PROMPTS`: the reference's own continuation is their
expectation, and they are what teacher forcing runs on.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import NamedTuple

from tuner.probe.items import Check, ProbeItem
from tuner.probe.spec import BANK_FAMILIES

__all__ = [
    "BANK_FAMILIES",
    "RETRIEVAL_CHARS_PER_TOKEN",
    "build_pool",
    "retrieval_lengths",
    "strata",
]


_CAPITALS: tuple[tuple[str, str], ...] = (
    ("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"),
    ("Japan", "Tokyo"), ("China", "Beijing"), ("Russia", "Moscow"), ("Egypt", "Cairo"),
    ("Canada", "Ottawa"), ("Greece", "Athens"), ("Portugal", "Lisbon"), ("Peru", "Lima"),
    ("Austria", "Vienna"), ("Poland", "Warsaw"), ("Sweden", "Stockholm"), ("Norway", "Oslo"),
    ("Ireland", "Dublin"), ("Hungary", "Budapest"), ("Thailand", "Bangkok"),
    ("Kenya", "Nairobi"), ("Argentina", "Buenos Aires"), ("Cuba", "Havana"),
    ("Turkey", "Ankara"), ("Iran", "Tehran"), ("Denmark", "Copenhagen"),
    ("Finland", "Helsinki"), ("Belgium", "Brussels"), ("South Korea", "Seoul"),
    ("Vietnam", "Hanoi"), ("Indonesia", "Jakarta"), ("Chile", "Santiago"),
    ("Colombia", "Bogota"), ("Mexico", "Mexico City"), ("Australia", "Canberra"),
    ("United Kingdom", "London"), ("Netherlands", "Amsterdam"),
)  # fmt: skip

_FACT_WORDINGS: tuple[str, ...] = (
    "What is the capital of {c}?",
    "Which city is the capital of {c}?",
    "Can you tell me what the capital city of {c} is?",
    "{c}'s capital is which city?",
    "I'm travelling to {c} next month. What is its capital?",
    "Name the capital of {c}.",
)

_ARITHMETIC_WORDINGS: tuple[tuple[str, str], ...] = (
    ("+", "What is {a} plus {b}?"),
    ("+", "Add {a} and {b}."),
    ("-", "What do you get if you subtract {b} from {a}?"),
    ("*", "Compute {a} times {b}."),
)

_COPY_WORDINGS: tuple[str, ...] = (
    "Repeat this sentence exactly, with nothing else:\n{line}",
    "Please copy the following line word for word:\n{line}",
)
_SUBJECTS = (
    "The old sailor",
    "A small child",
    "My neighbour",
    "The tired doctor",
    "Our teacher",
    "The young painter",
    "A quiet librarian",
    "The baker",
)
_VERBS = ("carried", "painted", "found", "borrowed", "repaired", "counted", "hid", "sold")
_OBJECTS = (
    "a blue umbrella",
    "seven green apples",
    "the broken clock",
    "a wooden boat",
    "three silver coins",
    "the yellow kite",
    "an empty basket",
    "two paper lanterns",
)
_PLACES = (
    "near the river",
    "before sunrise",
    "in the garden",
    "at the market",
    "after the storm",
    "behind the library",
    "on a cold morning",
    "by the harbour",
)

_TRANSLATIONS: tuple[tuple[str, str, str], ...] = (
    ("cat", "chat", "gato"), ("dog", "chien", "perro"), ("house", "maison", "casa"),
    ("water", "eau", "agua"), ("book", "livre", "libro"), ("apple", "pomme", "manzana"),
    ("bread", "pain", "pan"), ("sun", "soleil", "sol"), ("moon", "lune", "luna"),
    ("red", "rouge", "rojo"), ("green", "vert", "verde"), ("friend", "ami", "amigo"),
    ("school", "école", "escuela"), ("cheese", "fromage", "queso"), ("milk", "lait", "leche"),
    ("city", "ville", "ciudad"), ("hello", "bonjour", "hola"), ("thank you", "merci", "gracias"),
    ("black", "noir", "negro"), ("white", "blanc", "blanco"), ("sea", "mer", "mar"),
    ("tree", "arbre", "árbol"), ("flower", "fleur", "flor"), ("king", "roi", "rey"),
)  # fmt: skip
_TRANSLATION_WORDINGS: tuple[str, ...] = (
    "How do you say '{w}' in {lang}?",
    "Translate the word '{w}' into {lang}.",
    "What is the {lang} word for '{w}'?",
)

_FUNCTION_NAMES = (
    ("add", "sum", "+"),
    ("multiply", "product", "*"),
    ("subtract", "difference", "-"),
)

_NAMES = (
    "Alice",
    "Bruno",
    "Chloe",
    "Daniel",
    "Elena",
    "Farid",
    "Grace",
    "Hugo",
    "Ingrid",
    "Jonas",
    "Keiko",
    "Liam",
    "Maya",
    "Nora",
    "Oscar",
    "Priya",
)
_PETS = ("cat", "dog", "parrot", "rabbit", "hamster", "turtle")

# Filler prose for the long-context family: plain sentences the answer is hidden among.
_FILLER = (
    "The morning train left the station a few minutes late.",
    "Several children were playing football in the park across the street.",
    "A light rain began to fall just after lunch.",
    "The museum opened a new exhibition about ancient maps.",
    "Most of the shops on the main road close early on Sundays.",
    "A farmer was selling fresh strawberries at the corner of the square.",
    "The river was higher than usual after the long winter.",
    "Two cyclists stopped to drink water under an old oak tree.",
    "The library keeps its rarest books in a cool room downstairs.",
    "Someone had left a bicycle leaning against the bakery window.",
    "The concert in the town hall sold out within a week.",
    "Fishing boats returned to the harbour before the evening wind.",
    "A new bridge was built over the valley last summer.",
    "The cafe near the school serves soup every Thursday.",
    "Snow covered the mountain tops until the end of April.",
    "The teacher asked everyone to bring a notebook and a pencil.",
)
_SECRETS = (
    "lantern",
    "pepper",
    "violet",
    "harbor",
    "falcon",
    "marble",
    "cactus",
    "walnut",
    "copper",
    "meadow",
    "tiger",
    "candle",
    "planet",
    "ribbon",
    "saddle",
    "anchor",
)
_THINGS = (
    "the blue door",
    "the garden shed",
    "the old safe",
    "the attic",
    "the boat house",
    "the wine cellar",
    "the back gate",
    "the tool box",
)
# Characters per token of the filler prose under a small model's BPE tokenizer (about 4.5
# for SmolLM2); only a target: the reference tokenizes every prompt, and the trial sampler
# buckets by the recorded token count.
RETRIEVAL_CHARS_PER_TOKEN = 4.5


class _Q(NamedTuple):
    messages: tuple[tuple[str, str], ...]
    expected: str
    check: Check
    distractors: tuple[str, ...] = ()


def _fact(rng: random.Random, wording: int) -> _Q:
    country, city = rng.choice(_CAPITALS)
    others = tuple(c for _, c in _CAPITALS if c != city)
    text = _FACT_WORDINGS[wording].format(c=country)
    return _Q((("user", text),), city, "mentions", others)


def _arithmetic(rng: random.Random, wording: int) -> _Q:
    op, template = _ARITHMETIC_WORDINGS[wording]
    if op == "*":
        a, b = rng.randint(2, 12), rng.randint(2, 9)
        value = a * b
    elif op == "-":
        a = rng.randint(30, 99)
        b = rng.randint(2, a - 10)
        value = a - b
    else:
        a, b = rng.randint(10, 60), rng.randint(10, 60)
        value = a + b
    return _Q((("user", template.format(a=a, b=b)),), str(value), "number")


def _copy(rng: random.Random, wording: int) -> _Q:
    line = (
        f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} "
        f"{rng.choice(_PLACES)}."
    )
    return _Q((("user", _COPY_WORDINGS[wording].format(line=line)),), line, "line")


def _translation(rng: random.Random, wording: int) -> _Q:
    word, french, spanish = rng.choice(_TRANSLATIONS)
    lang, answer = rng.choice((("French", french), ("Spanish", spanish)))
    text = _TRANSLATION_WORDINGS[wording].format(w=word, lang=lang)
    return _Q((("user", text),), answer, "mentions")


def _code(rng: random.Random, wording: int) -> _Q:
    if wording == 0:
        a, b = rng.randint(2, 30), rng.randint(2, 30)
        text = f"What does this Python code print?\n\nx = {a}\ny = {b}\nprint(x + y)"
        return _Q((("user", text),), str(a + b), "number")
    name, noun, _ = rng.choice(_FUNCTION_NAMES)
    text = f"Write a Python function called {name} that returns the {noun} of two numbers."
    return _Q((("user", text),), f"def {name}", "contains")


def _multi_turn(rng: random.Random, wording: int) -> _Q:
    if wording == 0:
        name = rng.choice(_NAMES)
        return _Q(
            (
                ("user", f"Hi, my name is {name}."),
                ("assistant", f"Nice to meet you, {name}! How can I help you today?"),
                ("user", "What is my name?"),
            ),
            name,
            "mentions",
            tuple(n for n in _NAMES if n != name),
        )
    if wording == 1:
        (c1, city1), (c2, city2) = rng.sample(_CAPITALS, 2)
        return _Q(
            (
                ("user", f"What is the capital of {c1}?"),
                ("assistant", f"The capital of {c1} is {city1}."),
                ("user", f"And what about {c2}?"),
            ),
            city2,
            "mentions",
            (city1,),
        )
    pet, other = rng.sample(_PETS, 2)
    name = rng.choice(_NAMES)
    return _Q(
        (
            ("user", f"I have a {pet} called {name}."),
            ("assistant", f"{name} sounds like a lovely {pet}!"),
            ("user", f"I also have a {other}, but it has no name yet."),
            ("assistant", f"Maybe you will find the perfect name for your {other} soon."),
            ("user", f"What is the name of my {pet}?"),
        ),
        name,
        "mentions",
    )


def retrieval_lengths(max_prompt_tokens: int, *, low: int = 48, per_octave: int = 3) -> list[int]:
    """Target prompt lengths of the long-context family: a geometric grid from ``low`` to
    ``max_prompt_tokens`` with ``per_octave`` points per doubling, so every length bucket
    a trial's server reports (or the default octaves) holds a recorded prompt."""
    if max_prompt_tokens < low:
        return [max_prompt_tokens]
    n = max(1, math.floor(per_octave * math.log2(max_prompt_tokens / low) + 1e-9))
    grid = {round(low * 2 ** (i / per_octave)) for i in range(n + 1)}
    # The longest point is the limit itself: bugs past a context length show at the top.
    if max_prompt_tokens / max(grid) > 2 ** (0.5 / per_octave):
        grid.add(max_prompt_tokens)
    return sorted(grid)


def _retrieval(rng: random.Random, target_tokens: int) -> _Q:
    thing = rng.choice(_THINGS)
    secret = rng.choice(_SECRETS)
    needle = f"The password for {thing} is {secret}."
    question = f"What is the password for {thing}? Answer with one word."
    budget = max(0, round(target_tokens * RETRIEVAL_CHARS_PER_TOKEN) - len(needle) - 60)
    sentences: list[str] = []
    while sum(len(s) + 1 for s in sentences) < budget:
        sentences.append(rng.choice(_FILLER))
    # Anywhere but the very end: the answer must come from inside the context.
    sentences.insert(rng.randint(0, max(0, len(sentences) - 1)), needle)
    text = " ".join(sentences) + "\n\n" + question
    others = tuple(s for s in _SECRETS if s != secret)
    return _Q((("user", text),), secret, "mentions", others)


_GENERATORS: dict[str, tuple[int, Callable[[random.Random, int], _Q]]] = {
    "fact": (len(_FACT_WORDINGS), _fact),
    "arithmetic": (len(_ARITHMETIC_WORDINGS), _arithmetic),
    "copy": (len(_COPY_WORDINGS), _copy),
    "translation": (len(_TRANSLATION_WORDINGS), _translation),
    "code": (2, _code),
    "multi_turn": (3, _multi_turn),
}


def strata(families: Sequence[str]) -> list[str]:
    """The (family, wording) strata of the chosen families, e.g. ``fact/w3``; the retrieval
    family's strata are its lengths and are not listed here."""
    return [
        f"{family}/w{w}"
        for family in families
        if family in _GENERATORS
        for w in range(_GENERATORS[family][0])
    ]


def _item(ident: str, family: str, stratum: str, q: _Q) -> ProbeItem:
    *history, (role, last) = q.messages
    assert role == "user"
    return ProbeItem(
        id=ident,
        family=family,
        api="chat",
        prompt=last,
        history=tuple(history),
        expected=q.expected,
        check=q.check,
        distractors=q.distractors,
        stratum=stratum,
    )


def build_pool(
    seed: int,
    families: Sequence[str],
    per_stratum: int,
    *,
    max_prompt_tokens: int,
) -> list[ProbeItem]:
    """The items the study's reference records: ``per_stratum`` items of every (family,
    wording) stratum, and one retrieval item per grid length up to ``max_prompt_tokens``
    (:func:`retrieval_lengths`) - deterministic in ``seed``. Ids are ``b-<family>-w<w>-<n>``
    and ``b-retrieval-<tokens>``; a question drawn twice within a stratum is drawn again."""
    rng = random.Random(seed)
    out: list[ProbeItem] = []
    for family in families:
        if family == "retrieval":
            for target in retrieval_lengths(max_prompt_tokens):
                q = _retrieval(rng, target)
                out.append(_item(f"b-retrieval-{target}", family, f"retrieval/{target}", q))
            continue
        if family not in _GENERATORS:
            raise ValueError(f"unknown bank family {family!r}")
        wordings, make = _GENERATORS[family]
        for w in range(wordings):
            seen: set[tuple[tuple[str, str], ...]] = set()
            for n in range(per_stratum):
                q = make(rng, w)
                for _ in range(20):
                    if q.messages not in seen:
                        break
                    q = make(rng, w)
                seen.add(q.messages)
                out.append(_item(f"b-{family}-w{w}-{n}", family, f"{family}/w{w}", q))
    return out
