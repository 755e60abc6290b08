"""The simulator's deterministic fake "language model" (pure: text/ids in, token plans out).

Greedy output is a function of the prompt only. A few checkable prompt families are answered
correctly (arithmetic, repeat-a-line, number words to digits, capitals, key/value lookup) so a
correctness probe can tell a healthy configuration from a broken one; copy-heavy prompts get
outputs that copy spans of the prompt (so real n-gram speculation finds matches); anything
else gets pseudo-natural prose of a natural length. Broken configurations are simulated by
`garble`, which keeps the shape of the text but changes its content. A lossy configuration
(fp8 KV cache or weights, tuner.sim.lossy) answers a few known-answer prompts with a
plausible wrong answer (`wrong_answer`), its first differing token the reference's near-tie
runner-up, so only the answer changes, never the numerics.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from tuner.sim.lossy import answers_wrong
from tuner.sim.perf_model import unit_hash
from tuner.sim.tokenizer import EOS_ID, Tokenizer

WORDS = (
    "the of and to in is was for that with as on by at from it this which be are or an "
    "have not had has were but their one all its been more when there other into time only "
    "new some could these two may first then do any like my now over such our man me even "
    "most made after also did many before must through back years where much your way well "
    "down should because each just those people how too little state good very make world "
    "still own see men work long get here between both life being under never day same "
    "another know while last might us great old year off come since against go came right "
    "used take three states himself few house use during without again place american around "
    "however home small found thought went say part once general high upon school every "
    "does got united left number course war until always away something fact though water "
    "less public put think almost hand enough far took head yet government system better set "
    "told nothing night end why called didn find look asked later point knew city next "
    "program business give group toward young days let room president side social given "
    "present several order national possible rather second face per among form important "
    "often things looked early white case large become large need big four within felt "
    "along children saw best church ever least power development light thing family "
    "interest want members mind country area others done turned although open service "
    "certain kind problem began different door thus help means sense whole matter perhaps "
    "itself york times law human line above name example action company hands local show "
    "whether five history gave today either act feet across taken past quite anything seen "
    "having death week experience body word half really field am car words already "
    "information tell together college shall money period held keep sure probably free "
    "seems political real cannot behind miss question air office making brought whose "
    "special heard major problems ago became federal moment study available known result "
    "street economic boy position reason change south board individual job areas society"
).split()
WORDS = tuple(dict.fromkeys(WORDS))
PUNCT = tuple(".,;:!?'\"()[]{}-+*/=<>%$#@&_|\\~`^")
CAPITALS = {
    "france": "Paris", "germany": "Berlin", "italy": "Rome", "spain": "Madrid",
    "portugal": "Lisbon", "united kingdom": "London", "england": "London", "ireland": "Dublin",
    "netherlands": "Amsterdam", "belgium": "Brussels", "switzerland": "Bern",
    "austria": "Vienna", "poland": "Warsaw", "sweden": "Stockholm", "norway": "Oslo",
    "denmark": "Copenhagen", "finland": "Helsinki", "greece": "Athens", "turkey": "Ankara",
    "russia": "Moscow", "ukraine": "Kyiv", "egypt": "Cairo", "kenya": "Nairobi",
    "nigeria": "Abuja", "south africa": "Pretoria", "morocco": "Rabat", "japan": "Tokyo",
    "china": "Beijing", "india": "New Delhi", "south korea": "Seoul", "thailand": "Bangkok",
    "vietnam": "Hanoi", "indonesia": "Jakarta", "australia": "Canberra",
    "new zealand": "Wellington", "canada": "Ottawa", "united states": "Washington, D.C.",
    "usa": "Washington, D.C.", "mexico": "Mexico City", "brazil": "Brasilia",
    "argentina": "Buenos Aires", "chile": "Santiago", "peru": "Lima", "colombia": "Bogota",
    "cuba": "Havana", "iran": "Tehran", "iraq": "Baghdad", "saudi arabia": "Riyadh",
    "israel": "Jerusalem", "pakistan": "Islamabad", "czech republic": "Prague",
    "hungary": "Budapest",
}
UNITS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen "
         "fourteen fifteen sixteen seventeen eighteen nineteen").split()
TENS = "twenty thirty forty fifty sixty seventy eighty ninety".split()
SCALES = {"thousand": 10**3, "million": 10**6, "billion": 10**9}
COPY_WORDS = re.compile(r"\b(repeat|rewrite|copy|edit|rephrase|proofread|correct|fix|paraphrase"
                        r"|reformat|summari[sz]e|revise)\b", re.I)
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def _canonical_pieces() -> list[str]:
    base = list(WORDS) + UNITS + TENS + list(SCALES) + ["hundred", "and", "key", "value",
                                                       "What", "is", "capital"]
    for country, city in CAPITALS.items():
        base += country.split() + city.replace(",", " ,").replace(".", " .").split()
    out: list[str] = []
    for w in base:
        for form in (w, w.capitalize()):
            out += [form, " " + form]
    out += [str(n) for n in range(1000)] + [" " + str(n) for n in range(1000)]
    out += list(PUNCT) + [" " + p for p in PUNCT] + ["\n", " "]
    return out


TOKENIZER = Tokenizer(_canonical_pieces())
WORD_IDS = tuple(TOKENIZER.canonical_id(" " + w) or 0 for w in WORDS)


def _h(*parts: int) -> int:
    return int(unit_hash(*parts) * (1 << 53))


def text_hash(ids: Sequence[int]) -> int:
    h = 1469598103934665603
    for i in ids:
        h = ((h ^ i) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def chat_prompt(messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> str:
    """ChatML as in SmolLM2-Instruct's template (a default system turn if none is given)."""
    parts = []
    if not messages or messages[0].get("role") != "system":
        parts.append(f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>\n")
    for m in messages:
        parts.append(f"<|im_start|>{m.get('role', 'user')}\n{m.get('content', '')}<|im_end|>\n")
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
    return "".join(parts)


# ------------------------------------------------------------------------------ families
def words_to_int(text: str) -> int | None:
    """'four hundred and twelve' -> 412; handles hyphens, 'and', 'a hundred', millions."""
    tokens = [t for t in re.split(r"[\s\-,]+", text.lower().strip()) if t and t != "and"]
    if not tokens:
        return None
    total = current = 0
    for tok in tokens:
        if tok in ("a", "an") and current == 0:
            current = 1
        elif tok in UNITS:
            current += UNITS.index(tok)
        elif tok in TENS:
            current += 20 + 10 * TENS.index(tok)
        elif tok == "hundred":
            current = max(current, 1) * 100
        elif tok in SCALES:
            total += max(current, 1) * SCALES[tok]
            current = 0
        else:
            return None
    return total + current


def _user_text(prompt: str) -> str:
    if "<|im_start|>user" in prompt:
        tail = prompt.rsplit("<|im_start|>user", 1)[1]
        return tail.split("<|im_end|>", 1)[0].lstrip("\n")
    return prompt


def last_user_text(prompt: str) -> str:
    """The last user message of a ChatML prompt (the whole text for a raw prompt)."""
    return _user_text(prompt)


def user_turns(prompt: str) -> int:
    """How many user turns a ChatML prompt holds (0 for raw text)."""
    return prompt.count("<|im_start|>user")


def family_answer(prompt: str) -> tuple[str, str] | None:
    """(family, answer) for the checkable prompt families, else None."""
    text = _user_text(prompt)
    m = re.search(r"value of key\s+([^\s?]+)", text, re.I)
    if m:
        table = dict(re.findall(r"key\s+(\S+)\s*[=:]\s*([^\s,;]+)", text, re.I))
        if m.group(1) in table:
            return "kv_lookup", table[m.group(1)]
    m = re.search(r"repeat (?:the following|this)[^\n]*\n+([^\n]+)", text, re.I)
    if m:
        return "repeat", m.group(1).strip()
    m = re.search(r"in digits[^:\n]*:\s*([a-z][a-z\s\-,]*[a-z])", text, re.I)
    if m:
        value = words_to_int(m.group(1))
        if value is not None:
            return "number_words", str(value)
    m = re.search(r"what is\s+(-?\d+)\s*([-+*x\u00d7])\s*(-?\d+)", text, re.I)
    if m:
        a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
        value = a + b if op == "+" else a - b if op == "-" else a * b
        return "arithmetic", str(value)
    m = re.search(r"capital of\s+(?:the\s+)?([a-z][a-z .']*?)\s*\?", text, re.I)
    if m and m.group(1).strip().lower() in CAPITALS:
        return "capital", CAPITALS[m.group(1).strip().lower()]
    return _bank_answer(prompt, text)


# The probe bank's other wordings (tuner.probe.bank): a small model answers them too.
_OPS = (
    (r"what is\s+(\d+)\s+plus\s+(\d+)", lambda a, b: a + b),
    (r"add\s+(\d+)\s+and\s+(\d+)", lambda a, b: a + b),
    (r"subtract\s+(\d+)\s+from\s+(\d+)", lambda a, b: b - a),
    (r"compute\s+(\d+)\s+times\s+(\d+)", lambda a, b: a * b),
    (r"x = (\d+)\s+y = (\d+)\s+print\(x \+ y\)", lambda a, b: a + b),
)


# What the fake model knows of French and Spanish (the probe bank's translation family).
_WORDS_FR_ES = {
    "cat": ("chat", "gato"), "dog": ("chien", "perro"), "house": ("maison", "casa"),
    "water": ("eau", "agua"), "book": ("livre", "libro"), "apple": ("pomme", "manzana"),
    "bread": ("pain", "pan"), "sun": ("soleil", "sol"), "moon": ("lune", "luna"),
    "red": ("rouge", "rojo"), "green": ("vert", "verde"), "friend": ("ami", "amigo"),
    "school": ("école", "escuela"), "cheese": ("fromage", "queso"), "milk": ("lait", "leche"),
    "city": ("ville", "ciudad"), "hello": ("bonjour", "hola"), "thank you": ("merci", "gracias"),
    "black": ("noir", "negro"), "white": ("blanc", "blanco"), "sea": ("mer", "mar"),
    "tree": ("arbre", "árbol"), "flower": ("fleur", "flor"), "king": ("roi", "rey"),
}


def _bank_answer(prompt: str, text: str) -> tuple[str, str] | None:
    m = re.search(r"'([a-z ]+)'.*?\b(french|spanish)\b|\b(french|spanish) word for '([a-z ]+)'",
                  text, re.I)
    if m:
        word = (m.group(1) or m.group(4)).lower()
        lang = (m.group(2) or m.group(3)).lower()
        if word in _WORDS_FR_ES:
            return "translation", _WORDS_FR_ES[word][0 if lang == "french" else 1]
    m = re.search(r"python function called (\w+)", text, re.I)
    if m:
        return "code", f"def {m.group(1)}(a, b):"
    m = re.search(r"what about (?:the\s+)?([a-z][a-z .']*?)\s*\?", text, re.I)
    if m and "capital" in prompt.lower() and m.group(1).strip().lower() in CAPITALS:
        return "capital", CAPITALS[m.group(1).strip().lower()]
    for pattern, op in _OPS:
        m = re.search(pattern, text, re.I)
        if m:
            return "arithmetic", str(op(int(m.group(1)), int(m.group(2))))
    if "capital" in text.lower():
        low = text.lower()
        for country in sorted(CAPITALS, key=len, reverse=True):
            if re.search(rf"\b{re.escape(country)}\b", low):
                return "capital", CAPITALS[country]
    m = re.search(r"password for (.+?)\?", text, re.I)
    if m:
        found = re.search(rf"password for {re.escape(m.group(1))} is (\w+)", text, re.I)
        if found:
            return "kv_lookup", found.group(1)
    if re.search(r"what is my name", text, re.I):
        found = re.search(r"my name is (\w+)", prompt, re.I)
        if found:
            return "recall", found.group(1)
    return None


def _prose(seed: int, n: int, lead_space: bool) -> list[str]:
    """Deterministic pseudo-natural text: sentences of 6-16 words from WORDS."""
    out: list[str] = []
    i = 0
    while len(out) < n:
        length = 6 + _h(seed, i, 1) % 11
        for j in range(length):
            w = WORDS[_h(seed, i, j, 2) % len(WORDS)]
            if j == 0:
                w = w.capitalize()
            out.append(w if not out and not lead_space else " " + w)
            if j == length // 2 and _h(seed, i, 3) % 3 == 0:
                out.append(",")
        out.append(".")
        i += 1
    return out[:n]


def _copy_output(seed: int, passage: list[str], limit: int) -> list[str]:
    """Copy the passage in spans with small edits, like a rewrite/edit task's answer."""
    out: list[str] = []
    pos = i = 0
    while pos < len(passage) and len(out) < limit:
        span = 10 + _h(seed, i, 4) % 30
        out += passage[pos:pos + span]
        pos += span + _h(seed, i, 5) % 3
        if _h(seed, i, 6) % 2:
            out += [" " + WORDS[_h(seed, i, 7) % len(WORDS)]]
        i += 1
    return out[:limit]


def _repeated_span(ids: Sequence[int], n: int = 8) -> bool:
    seen: set[tuple[int, ...]] = set()
    for i in range(len(ids) - n + 1):
        key = tuple(ids[i:i + n])
        if key in seen:
            return True
        seen.add(key)
    return False


# ------------------------------------------------------------------------------ lossy answers
_OTHER_NAMES = ("Alice", "Bruno", "Chloe", "Daniel", "Elena", "Farid", "Grace", "Hugo")


def wrong_answer(family: str, answer: str, prompt: str) -> str:
    """A plausible wrong answer to a known-answer prompt (what a lossy configuration says
    when it gets the item wrong): another number, capital, word, name or function; never
    the right one, never garbage. Deterministic in the prompt."""
    h = int.from_bytes(hashlib.blake2b(prompt.encode("utf-8"), digest_size=8).digest(), "big")
    if re.fullmatch(r"-?\d+", answer):
        value = int(answer)
        step = 1 + h % 9
        return str(value - step if value - step >= 0 and h % 2 else value + step)
    if family == "capital":
        cities = sorted({c for c in CAPITALS.values() if c != answer})
        return cities[h % len(cities)]
    if family == "code":
        return "def solve(a, b):"
    if family == "translation":
        words = sorted({w for pair in _WORDS_FR_ES.values() for w in pair if w != answer})
        return words[h % len(words)]
    if family == "recall":
        names = [n for n in _OTHER_NAMES if n != answer]
        return names[h % len(names)]
    if family == "repeat":
        words = answer.split(" ")
        i = h % len(words)
        core = words[i].strip(".,;:!?")
        new = next(w for k in range(len(WORDS)) if (w := WORDS[(h + k) % len(WORDS)]) != core.lower())
        words[i] = words[i].replace(core, new.capitalize() if core[:1].isupper() else new, 1) if core else new
        return " ".join(words)
    others = [w for w in WORDS if w != answer.lower()]
    return others[h % len(others)]


def _first_difference(a: Sequence[str], b: Sequence[str]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def natural_output(prompt: str, prompt_ids: Sequence[int], lossy_drop: float = 0.0
                   ) -> tuple[str, list[str], dict[int, str]]:
    """(family, greedy output pieces without EOS, near-tie runner-ups by position).

    A known-answer prompt's runner-up at the first token where the right and the wrong
    answer differ is the other answer's token: the item is a near tie there, and a lossy
    configuration (``lossy_drop`` > 0, tuner.sim.lossy) that flips it picks the wrong one."""
    seed = text_hash(prompt_ids)
    lead = bool(prompt) and not prompt[-1].isspace()
    found = family_answer(prompt)
    if found:
        family, answer = found
        right = TOKENIZER.pieces((" " if lead else "") + answer)
        wrong = TOKENIZER.pieces((" " if lead else "") + wrong_answer(family, answer, prompt))
        if answers_wrong(prompt, lossy_drop):
            right, wrong = wrong, right
        at = _first_difference(right, wrong)
        alts = {at: wrong[at]} if at is not None and at < len(right) and at < len(wrong) else {}
        return family, right, alts
    user = _user_text(prompt)
    body = user.split("\n", 1)[1] if "\n" in user.strip() else user.split(":", 1)[-1]
    passage = TOKENIZER.pieces(body.strip("\n"))
    if (COPY_WORDS.search(user) and len(passage) >= 30) or _repeated_span(prompt_ids):
        if not COPY_WORDS.search(user):
            passage = TOKENIZER.pieces(user)
        return "copy", _copy_output(seed, passage, 400), {}
    return "open", _prose(seed, 20 + seed % 181, lead), {}


# ------------------------------------------------------------------------------ plans
DUMMY_SALT = 0xD0_11_11_E5  # dummy weights' answers: other words than the real model's
@dataclass
class Plan:
    """Every token a request will emit, decided up front (greedy, or seeded sampling)."""

    ids: list[int]
    pieces: list[str]
    finish_reason: str          # "stop" (EOS is the last token) or "length"
    family: str
    ctx: int                    # per-request hash for logprob distributions
    garbled_from: int | None = None
    greedy: list[int] = field(default_factory=list)   # top-1 token per position (pre-sampling)
    alts: dict[int, int] = field(default_factory=dict)  # near-tie runner-up per position

    def garble(self, start: int, salt: int) -> None:
        """From `start` on, replace content with fluent-looking wrong tokens (same shape)."""
        if self.garbled_from is not None and self.garbled_from <= start:
            return
        self.garbled_from = start
        # Garbage has no near ties: its logprobs stay those of a broken configuration.
        self.alts = {i: alt for i, alt in self.alts.items() if i < start}
        for i in range(start, len(self.ids)):
            if self.ids[i] == EOS_ID:
                continue
            p = self.pieces[i]
            core = p.lstrip(" ")
            lead = p[: len(p) - len(core)]
            h = _h(salt, self.ctx, i, 9)
            if core.isdigit():
                new = str((int(core) + 1 + h % 97) % (10 ** max(len(core), 2)))
            elif core.isalpha():
                new = WORDS[h % len(WORDS)]
                new = new.capitalize() if core[:1].isupper() else new
                if new.lower() == core.lower():
                    new = WORDS[(h + 1) % len(WORDS)]
            else:
                continue
            self.pieces[i] = lead + new
            self.ids[i] = self.greedy[i] = TOKENIZER.piece_id(lead + new)


def plan_output(prompt: str, prompt_ids: Sequence[int], *, max_tokens: int, ignore_eos: bool,
                temperature: float = 0.0, seed: int = 0, dummy: bool = False,
                lossy_drop: float = 0.0) -> Plan:
    """Every token of a request's answer. ``dummy``: the server loads random weights
    (``--load-format dummy``): deterministic words that answer nothing, as vLLM's dummy
    weights do (docs/probe.md, dummy weights). ``lossy_drop``: the configuration's true
    accuracy drop (tuner.sim.lossy; 0 for a lossless one)."""
    family, pieces, alt_pieces = natural_output(prompt, prompt_ids, lossy_drop)
    ctx = text_hash(prompt_ids)
    if dummy:
        lead = bool(prompt) and not prompt[-1].isspace()
        family, pieces = "dummy", _prose(ctx ^ DUMMY_SALT, max(1, len(pieces)), lead)
        alt_pieces = {}
    if ignore_eos:
        if len(pieces) < max_tokens:
            pieces = pieces + _prose(ctx ^ 0x5EED, max_tokens - len(pieces), True)
        pieces = pieces[:max_tokens]
        ids = [TOKENIZER.piece_id(p) for p in pieces]
        finish = "length"
    else:
        ids = [TOKENIZER.piece_id(p) for p in pieces] + [EOS_ID]
        pieces = pieces + [""]
        finish = "stop" if len(ids) <= max_tokens else "length"
        ids, pieces = ids[:max_tokens], pieces[:max_tokens]
    plan = Plan(ids, pieces, finish, family, ctx, greedy=list(ids),
                alts={i: TOKENIZER.piece_id(p) for i, p in alt_pieces.items() if i < len(ids)})
    if temperature > 0:
        for i, tok in enumerate(ids):
            if tok == EOS_ID:
                continue
            cands = top_candidates(ctx, i, tok, 5, 0)
            weights = [math.exp(lp / temperature) for _, lp in cands]
            r = unit_hash(seed, ctx, i, 13) * sum(weights)
            drawn = cands[-1][0]   # where rounding leaves r above 0 after the last weight
            for (cid, _), w in zip(cands, weights):
                r -= w
                if r <= 0:
                    drawn = cid
                    break
            if drawn != tok:
                plan.ids[i] = drawn
                plan.pieces[i] = TOKENIZER.piece(drawn)
    return plan


# ------------------------------------------------------------------------------ logprobs
def _noise(salt: int, *parts: int) -> float:
    # Different kernels/fusions per configuration change low-order bits only (< 1e-3 nats).
    return (unit_hash(salt, *parts) - 0.5) * 2e-3


# Dummy weights' logprobs: vLLM's random weights (uniform in +-1e-3) make every logit about
# equal, so each token gets log(1/vocabulary) (SmolLM2's 49,152 tokens: -10.8027) and the
# top-k differ by one float32 step (docs/probe.md, dummy weights).
DUMMY_LOGPROB = -10.802672
DUMMY_STEP = 9.5367431640625e-07


# A near tie's runner-up (Plan.alts) sits this many nats below the top token, at most: fp8
# flips real tokens up to ~1.4 nats below (KV cache) and beyond 2 (weights); the simulator
# keeps its lossy flips under 2 nats, where a loosened corruption rule calls them numerics.
NEAR_TIE_MAX_NATS = 1.5


def top_candidates(ctx: int, pos: int, chosen: int, k: int, salt: int, *,
                   flat: bool = False, alt: int | None = None) -> list[tuple[int, float]]:
    """Deterministic top-k (id, logprob) with `chosen` first; gaps >= 0.6 nats, so tiny
    numeric noise never changes the ranking. ``flat``: dummy weights, all about equal.
    ``alt``: a near-tie runner-up, second at 0.2 to NEAR_TIE_MAX_NATS below `chosen`."""
    if flat:
        ids = [chosen] + [w for w in dict.fromkeys(WORD_IDS[_h(ctx, pos, j, 22) % len(WORD_IDS)]
                                                  for j in range(1, 4 * max(k, 1))) if w != chosen]
        return [(tid, DUMMY_LOGPROB - DUMMY_STEP * rank) for rank, tid in enumerate(ids[:max(k, 1)])]
    lp1 = -(0.02 + 0.6 * unit_hash(ctx, pos, 21) ** 2)
    out = [(chosen, lp1 + _noise(salt, ctx, pos, 0))]
    used = {chosen}
    if alt is not None and alt != chosen and k > 1:
        gap = 0.2 + (NEAR_TIE_MAX_NATS - 0.2) * unit_hash(ctx, pos, 24)
        out.append((alt, lp1 - gap + _noise(salt, ctx, pos, 1)))
        used.add(alt)
    j = 1
    while len(out) < max(k, 1):
        cand = WORD_IDS[_h(ctx, pos, j, 22) % len(WORD_IDS)]
        j += 1
        if cand in used:
            continue
        used.add(cand)
        rank = len(out)
        lp = lp1 - (0.6 + 1.1 * rank + 0.4 * unit_hash(ctx, pos, rank, 23))
        out.append((cand, lp + _noise(salt, ctx, pos, rank)))
    return out[:max(k, 1)]


def prompt_logprobs(prompt_ids: Sequence[int], k: int, salt: int, corrupt: bool, *, flat: bool = False
                    ) -> list[dict[int, tuple[float, int]] | None]:
    """Per prompt position: {token_id: (logprob, rank)} incl. the actual token; first None.
    ``flat``: dummy weights (:func:`top_candidates`)."""
    out: list[dict[int, tuple[float, int]] | None] = [None]
    h = 1469598103934665603 ^ (0xBAD if corrupt else 0)
    for j in range(1, len(prompt_ids)):
        h = ((h ^ prompt_ids[j - 1]) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
        actual = prompt_ids[j]
        predicted = WORD_IDS[_h(h, 31) % len(WORD_IDS)]
        cands = top_candidates(h, j, predicted, max(k, 1), salt, flat=flat)
        entry = {cid: (lp, r + 1) for r, (cid, lp) in enumerate(cands[:max(k, 0)] or cands[:1])}
        if actual not in entry:
            lp = DUMMY_LOGPROB - DUMMY_STEP * 2 if flat else -(2.0 + 6.0 * unit_hash(h, j, 32)) + _noise(salt, h, j, 99)
            entry[actual] = (lp, 2 + _h(h, j, 33) % 500)
        out.append(entry)
    return out


# ------------------------------------------------------------------------------ n-gram drafts
class NgramIndex:
    """Prompt-lookup drafting like vLLM's ngram proposer: match the longest suffix n-gram
    (prompt_lookup_max down to _min) earlier in prompt+output and propose what followed."""

    def __init__(self, tokens: Sequence[int], n_min: int, n_max: int) -> None:
        self.tokens: list[int] = []
        self.n_min, self.n_max = n_min, n_max
        self.maps: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(n_min, n_max + 1)}
        self.extend(tokens)

    def extend(self, new: Sequence[int]) -> None:
        for tok in new:
            end = len(self.tokens)
            for n, table in self.maps.items():
                if end >= n:
                    table[tuple(self.tokens[end - n:end])] = end  # continuation starts at `end`
            self.tokens.append(tok)

    def propose(self, k: int) -> list[int]:
        size = len(self.tokens)
        for n in range(self.n_max, self.n_min - 1, -1):
            if size < n:
                continue
            start = self.maps[n].get(tuple(self.tokens[size - n:]))
            if start is not None:
                return self.tokens[start:start + k]
        return []


def count_accepted(draft: Sequence[int], truth: Sequence[int]) -> int:
    n = 0
    for d, t in zip(draft, truth):
        if d != t:
            break
        n += 1
    return n
