"""Deterministic synthetic prompts for the load generator.

Why synthetic: GPU hosts are often air-gapped, so no dataset download (measurement.md §3).
Why two content classes: n-gram/suffix speculation copies from the context, so it shines on
copy-heavy requests and looks bad on open-ended writing (§6); a tuner measuring only one
kind would crown or bury speculative configs by accident.

Every prompt is a function of (seed, stream, index) only. The stream names the purpose and
level (``measure-c16``, ``warmup-c16``), so warm-up prompts never coincide with measured
ones (no prefix- or suffix-cache inflation) and each level gets fresh prompts. Each prompt
starts with a randomly drawn instruction, so different prompts share almost no prefix.

Lengths are estimated at ~1.3 tokens per word. For exact lengths a caller supplies a token
counter (the server's ``/tokenize``) and runs the :class:`TokenFitter` search, which only
trims: drafts are generated longer than the target.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from tuner.load.filler import TOKENS_PER_WORD, sentence, shared_prefix_text
from tuner.load.load_spec import WorkloadClass, WorkloadKind, WorkloadSpec

__all__ = [
    "TOKENS_PER_WORD",
    "LengthModel",
    "PromptDraft",
    "PromptStream",
    "RequestDraft",
    "RequestPlan",
    "RequestStream",
    "TokenFitter",
    "allocate_classes",
    "arrival_schedule",
    "draft_requests",
    "fit_draft",
    "level_stream",
    "rate_stream",
]

# Drafts are generated this much longer than the estimate so the fitter can always trim
# down to the target instead of having to grow text (code tokenizes denser than prose).
_OVERSHOOT = 1.6

_UNIT_RE = re.compile(r"\S+\s*")


@dataclass(frozen=True, slots=True)
class PromptDraft:
    """A prompt as fixed head + trimmable body units + fixed tail.

    Units are words with their trailing whitespace, so any prefix of them joined is valid
    text; trimming never splits the instruction (head) or the closing line (tail).
    """

    head: str
    units: tuple[str, ...]
    tail: str

    def render(self, n_units: int) -> str:
        """The prompt with the first ``n_units`` body units."""
        body = "".join(self.units[:n_units]).rstrip()
        return f"{self.head}{body}{self.tail}"

    def estimate_tokens(self, n_units: int) -> float:
        words = len(self.head.split()) + len(self.tail.split()) + n_units
        return words * TOKENS_PER_WORD

    def units_for_estimate(self, target_tokens: int) -> int:
        """Largest unit count whose estimated length does not exceed the target."""
        fixed = (len(self.head.split()) + len(self.tail.split())) * TOKENS_PER_WORD
        n = math.floor((target_tokens - fixed) / TOKENS_PER_WORD)
        return max(0, min(len(self.units), n))


class TokenFitter:
    """Search for the most body units whose rendered prompt has <= target tokens.

    Driven from outside so the same pure search serves a sync counter and the async
    ``/tokenize`` client::

        while (n := fitter.next_probe()) is not None:
            fitter.observe(n, count_tokens(draft.render(n)))
        text = draft.render(fitter.result())

    Token count is assumed non-decreasing in the unit count (true up to tokenizer merges
    at the cut, which move it by a token at most). The search interpolates with the
    observed tokens-per-unit slope and falls back to bisection inside the bracket.
    """

    def __init__(self, draft: PromptDraft, target_tokens: int, *, max_probes: int = 12) -> None:
        if target_tokens < 1:
            raise ValueError(f"target_tokens must be >= 1, got {target_tokens}")
        if max_probes < 1:
            raise ValueError(f"max_probes must be >= 1, got {max_probes}")
        self._draft = draft
        self._target = target_tokens
        self._max_probes = max_probes
        self._n_max = len(draft.units)
        self._seen: dict[int, int] = {}
        self._lo: int | None = None  # most units known to fit
        self._hi: int | None = None  # fewest units known to overflow
        self._exact = False

    @property
    def probes(self) -> int:
        return len(self._seen)

    def observe(self, n_units: int, tokens: int) -> None:
        self._seen[n_units] = tokens
        if tokens <= self._target:
            if self._lo is None or n_units > self._lo:
                self._lo = n_units
            if tokens == self._target:
                self._exact = True
        elif self._hi is None or n_units < self._hi:
            self._hi = n_units

    def _done(self) -> bool:
        if self._exact or len(self._seen) >= self._max_probes:
            return True
        if self._lo == self._n_max or self._hi == 0:
            return True
        return self._lo is not None and self._hi is not None and self._hi - self._lo <= 1

    def _slope(self) -> float:
        # Tokens per unit from the two widest observations; the prior before that.
        if len(self._seen) >= 2:
            ns = sorted(self._seen)
            a, b = ns[0], ns[-1]
            slope = (self._seen[b] - self._seen[a]) / (b - a)
            if slope > 0:
                return slope
        return TOKENS_PER_WORD

    def next_probe(self) -> int | None:
        """The unit count to measure next, or None when the search is over."""
        if not self._seen:
            return self._draft.units_for_estimate(self._target)
        if self._done():
            return None
        lo = -1 if self._lo is None else self._lo
        hi = self._n_max + 1 if self._hi is None else self._hi
        anchor = self._lo if self._lo is not None else self._hi
        if anchor is None:  # unreachable: every observation sets lo or hi
            return None
        guess = anchor + round((self._target - self._seen[anchor]) / self._slope())
        if not lo < guess < hi or guess in self._seen:
            guess = (max(lo, 0) + min(hi, self._n_max)) // 2
            if guess in self._seen:
                # Bisection stalled at an edge of the open range; step inward by one.
                guess = lo + 1 if self._lo is None else hi - 1
        if guess in self._seen or not 0 <= guess <= self._n_max:
            return None
        return guess

    def result(self) -> int:
        """Best unit count: the largest that fits, else the smallest tried (over target)."""
        if self._lo is not None:
            return self._lo
        if self._seen:
            return min(self._seen)
        return self._draft.units_for_estimate(self._target)


def fit_draft(draft: PromptDraft, target_tokens: int, count_tokens: Callable[[str], int]) -> str:
    """Render ``draft`` trimmed to at most ``target_tokens`` as counted by ``count_tokens``."""
    fitter = TokenFitter(draft, target_tokens)
    while (n := fitter.next_probe()) is not None:
        fitter.observe(n, count_tokens(draft.render(n)))
    return draft.render(fitter.result())


class RequestPlan(BaseModel):
    """One request to send: what the load generator needs, nothing more."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    index: int = Field(ge=0, description="Position in the level's plan; carried into records.")
    class_name: str
    kind: WorkloadKind | Literal["dataset"]
    prompt: str
    messages: tuple[tuple[str, str], ...] | None = Field(
        default=None,
        description="(role, content) for the chat API, verbatim from a dataset; None: the "
                    "prompt is sent as one user message. In a later turn of a conversation the "
                    "assistant messages are replaced by the server's own replies when sent.")
    turn: int = Field(default=0, ge=0, description="Which user turn of its conversation.")
    turns: int = Field(default=1, ge=1, description="User turns in its conversation; a "
                       "conversation's plans are consecutive, turn 0 first.")
    think_s: float = Field(default=0.0, ge=0.0, description="Pause before sending this turn "
                           "after the previous reply ended (the user reading and typing).")
    max_tokens: int = Field(ge=1)
    ignore_eos: bool
    target_prompt_tokens: int = Field(ge=1, description="Jittered length the prompt aims at.")


@dataclass(frozen=True, slots=True)
class RequestDraft:
    """A planned request whose prompt length is not fixed yet."""

    index: int
    workload_class: WorkloadClass
    draft: PromptDraft
    target_prompt_tokens: int

    def to_plan(self, *, ignore_eos: bool, prompt: str | None = None) -> RequestPlan:
        """Finish the request; without ``prompt`` the estimated-length rendering is used."""
        if prompt is None:
            prompt = self.draft.render(self.draft.units_for_estimate(self.target_prompt_tokens))
        return RequestPlan(
            index=self.index,
            class_name=self.workload_class.name,
            kind=self.workload_class.kind,
            prompt=prompt,
            max_tokens=self.workload_class.output_tokens,
            ignore_eos=ignore_eos,
            target_prompt_tokens=self.target_prompt_tokens,
        )


def level_stream(purpose: str, concurrency: int) -> str:
    """Seed-stream name of one level's prompts, e.g. ``measure-c16`` or ``warmup-c16``."""
    return f"{purpose}-c{concurrency}"


def rate_stream(purpose: str, rate: float) -> str:
    """Seed-stream name of one open-loop level, e.g. ``measure-r2.0``."""
    return f"{purpose}-r{float(rate)}"


def arrival_schedule(
    n: int, rate: float, *, arrival: str = "poisson", burstiness: float = 1.0,
    seed: int = 0, stream: str = "",
) -> list[float]:
    """Absolute send times (seconds from the level start) of ``n`` open-loop requests.

    As vLLM's bench (``serve.py::get_request``): gaps are Gamma(shape=burstiness,
    scale=1/(rate x burstiness)) — Poisson at shape 1, CV = 1/sqrt(shape) — and the
    cumulative times are rescaled so the last request is due at exactly ``n/rate``, which
    closes the seed-to-seed gap in the achieved rate (measurement.md §2). The first gap
    counts too, so the first request is due after one gap, not at 0. Seeded by
    ``seed``/``stream`` only: the same level gets the same schedule every trial.
    """
    if n < 0:
        raise ValueError(f"request count must be >= 0, got {n}")
    if not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"rate must be a finite number > 0, got {rate!r}")
    if arrival not in ("poisson", "gamma"):
        raise ValueError(f"arrival must be 'poisson' or 'gamma', got {arrival!r}")
    shape = 1.0 if arrival == "poisson" else burstiness
    if not (math.isfinite(shape) and shape > 0):
        raise ValueError(f"burstiness must be a finite number > 0, got {burstiness!r}")
    if n == 0:
        return []
    rng = random.Random(f"tuner-arrival|{seed}|{stream}")
    scale = 1.0 / (rate * shape)
    times: list[float] = []
    t = 0.0
    for _ in range(n):
        t += rng.gammavariate(shape, scale)
        times.append(t)
    target = n / rate
    if times[-1] > 0:
        factor = target / times[-1]
        times = [x * factor for x in times]
    else:  # every gap underflowed to 0 (absurdly small shape): spread evenly instead
        times = [target * (i + 1) / n for i in range(n)]
    return times


def allocate_classes(
    classes: Sequence[WorkloadClass], n: int, rng: random.Random
) -> list[WorkloadClass]:
    """Exactly weight-proportional class assignment (largest remainder), then shuffled.

    Drawing each request's class at random would let a 10-request level miss a class
    entirely; exact proportions keep levels comparable.
    """
    total = sum(c.weight for c in classes)
    quotas = [c.weight / total * n for c in classes]
    counts = [math.floor(q) for q in quotas]
    by_remainder = sorted(range(len(classes)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in by_remainder[: n - sum(counts)]:
        counts[i] += 1
    out = [c for c, k in zip(classes, counts, strict=True) for _ in range(k)]
    rng.shuffle(out)
    return out


def _draft(wc: WorkloadClass, index: int, seed: int, stream: str) -> RequestDraft:
    # One RNG per request: request i's prompt does not depend on how many follow it.
    rng = random.Random(f"tuner-prompt|{seed}|{stream}|{index}")
    jitter = wc.prompt_tokens_jitter
    target = max(1, round(wc.prompt_tokens * rng.uniform(1 - jitter, 1 + jitter)))
    if wc.kind == "shared_prefix":
        assert wc.prefix_tokens is not None  # WorkloadClass requires it for this kind
        prefix = shared_prefix_text(seed, wc.name, rng.randrange(wc.groups), wc.prefix_tokens)
        # The question is drafted for more than the room the estimated prefix leaves: where
        # the tokenizer counts the prefix shorter than estimated, the question makes up for it
        # (fitting only trims).
        question = _open_ended(rng, max(1, target - wc.prefix_tokens // 2))
        return RequestDraft(index, wc, PromptDraft(prefix + question.head, question.units, question.tail), target)
    builder = _open_ended if wc.kind == "open_ended" else _copy_heavy
    return RequestDraft(index, wc, builder(rng, target), target)


def draft_requests(workload: WorkloadSpec, n: int, *, seed: int, stream: str) -> list[RequestDraft]:
    """``n`` request drafts for one stream (see module docstring for determinism)."""
    if n < 0:
        raise ValueError(f"request count must be >= 0, got {n}")
    mix = allocate_classes(workload.classes, n, random.Random(f"tuner-mix|{seed}|{stream}"))
    return [_draft(wc, index, seed, stream) for index, wc in enumerate(mix)]


class LengthModel:
    """Prompt tokens as the server counts them, per workload class: ``scale`` x the
    ~1.3 tokens/word estimate + ``offset`` (the chat template's tokens, for one).

    Levels sized by time do not know in advance how many prompts they will send, and
    fitting each one with ``/tokenize`` (3-4 calls a prompt) while a fast server is being
    measured would load its API process. So the lengths are calibrated once per sweep
    (:func:`tuner.load.server_calls.calibrate_lengths`) and every prompt is cut by the
    model: the same prompts for every trial of a study, close to the stated lengths.
    """

    def __init__(self, by_class: dict[str, tuple[float, float]]) -> None:
        self.by_class = dict(by_class)

    def units_for(self, draft: PromptDraft, class_name: str, target_tokens: int) -> int:
        scale, offset = self.by_class.get(class_name, (1.0, 0.0))
        if scale <= 0:
            return draft.units_for_estimate(target_tokens)
        return draft.units_for_estimate(max(1, round((target_tokens - offset) / scale)))

    @staticmethod
    def fit(points: Sequence[tuple[float, int]]) -> tuple[float, float]:
        """(scale, offset) by least squares over (estimated, counted) token pairs."""
        if not points:
            return 1.0, 0.0
        n = len(points)
        mx = math.fsum(x for x, _ in points) / n
        my = math.fsum(y for _, y in points) / n
        sxx = math.fsum((x - mx) ** 2 for x, _ in points)
        if sxx <= 0:
            return (my / mx if mx > 0 else 1.0), 0.0
        scale = math.fsum((x - mx) * (y - my) for x, y in points) / sxx
        if scale <= 0:
            return (my / mx if mx > 0 else 1.0), 0.0
        return scale, my - scale * mx


class RequestStream(Protocol):
    """Where a level sized by time takes its next requests: one, or a conversation's turns."""

    def next_group(self) -> list[RequestPlan]: ...


class PromptStream:
    """The requests of one seed stream, drawn one at a time (levels sized by time).

    Classes are allocated in exact proportions per block of :attr:`BLOCK` requests, so
    any prefix of the stream is mixed as the study asks; request i's prompt depends only on
    (seed, stream, i), as in :func:`draft_requests`.
    """

    BLOCK = 64

    def __init__(self, workload: WorkloadSpec, *, seed: int, stream: str, ignore_eos: bool,
                 lengths: LengthModel | None = None) -> None:
        self.workload, self.seed, self.stream = workload, seed, stream
        self.ignore_eos, self.lengths = ignore_eos, lengths
        self._block: list[WorkloadClass] = []
        self.issued = 0

    def next(self) -> RequestPlan:
        index = self.issued
        k = index % self.BLOCK
        if k == 0:
            rng = random.Random(f"tuner-mix|{self.seed}|{self.stream}|b{index // self.BLOCK}")
            self._block = allocate_classes(self.workload.classes, self.BLOCK, rng)
        self.issued += 1
        d = _draft(self._block[k], index, self.seed, self.stream)
        prompt = None
        if self.lengths is not None:
            units = self.lengths.units_for(d.draft, d.workload_class.name, d.target_prompt_tokens)
            prompt = d.draft.render(units)
        return d.to_plan(ignore_eos=self.ignore_eos, prompt=prompt)

    def next_group(self) -> list[RequestPlan]:
        """The next request, as the one-request group a steady level's stream sends
        (tuner.load.dataset_draw.DrawStream's are whole conversations)."""
        return [self.next()]


# --- content ------------------------------------------------------------------------------

_SUBJECTS = (
    "a lighthouse keeper", "a retired astronaut", "a young botanist", "a clockmaker",
    "a ship's cat", "a mountain guide", "a street musician", "a cartographer",
    "a night-shift nurse", "a beekeeper", "a chess prodigy", "a lost robot",
    "a village baker", "an old ferryman", "a glassblower", "a radio operator",
)
_SITUATIONS = (
    "finds a map that redraws itself", "must deliver a letter before dawn",
    "hears a song nobody else can hear", "inherits a house full of locked doors",
    "wakes up one day in the wrong century", "is asked to keep an impossible secret",
    "discovers that the tide has stopped", "meets a stranger who knows their name",
    "has one week to repair a broken bridge", "receives a package with no sender",
)
_TOPICS = (
    "how vaccines train the immune system", "why the sky is blue at noon and red at dusk",
    "how compound interest works", "what causes ocean tides", "how a compiler works",
    "why bread rises", "how public-key cryptography works", "what inflation is",
    "how bees communicate", "how a refrigerator moves heat", "why leaves change colour",
    "how GPS finds a position", "what a hash table is", "how earthquakes are measured",
    "how photosynthesis stores energy", "how noise-cancelling headphones work",
)
_AUDIENCES = (
    "a ten-year-old", "a first-year student", "a busy manager", "a curious grandparent",
    "an engineer from another field", "someone who is new to the topic",
)
_OPEN_TEMPLATES = (
    "Write a short story about {subject} who {situation}.",
    "Explain {topic} to {audience}.",
    "Write a persuasive letter from {subject} to the town council about {topic}.",
    "Describe, step by step, {topic}, for {audience}.",
    "Write a poem in free verse about {subject} who {situation}.",
    "Compare two different ways to understand {topic}, for {audience}.",
    "Write a diary entry by {subject} who {situation}.",
    "Give a balanced summary of {topic} and list three common misconceptions.",
)
_CLOSERS = (
    "Use the notes above only where they help.",
    "Keep the answer clear and well organised.",
    "Write in plain, vivid language.",
)


def _units(text: str) -> tuple[str, ...]:
    return tuple(_UNIT_RE.findall(text))


def _body_words(target_tokens: int, fixed_text: str) -> int:
    fixed = len(fixed_text.split())
    return math.ceil((target_tokens / TOKENS_PER_WORD - fixed) * _OVERSHOOT) + 8


def _open_ended(rng: random.Random, target_tokens: int) -> PromptDraft:
    instruction = rng.choice(_OPEN_TEMPLATES).format(
        subject=rng.choice(_SUBJECTS),
        situation=rng.choice(_SITUATIONS),
        topic=rng.choice(_TOPICS),
        audience=rng.choice(_AUDIENCES),
    )
    head = f"{instruction}\n\nBackground notes: "
    tail = f"\n\n{rng.choice(_CLOSERS)}\n"
    want = _body_words(target_tokens, head + tail)
    sentences: list[str] = []
    words = 0
    while words < want:
        s = sentence(rng)
        sentences.append(s)
        words += len(s.split())
    return PromptDraft(head, _units(" ".join(sentences)), tail)


_IDENT_PARTS = (
    "count", "total", "item", "value", "index", "buffer", "record", "price", "weight",
    "limit", "offset", "score", "name", "node", "batch", "queue", "entry", "result",
)
_CITIES = ("Oslo", "Lima", "Porto", "Kyoto", "Dakar", "Perth", "Quito", "Riga", "Tunis", "Hanoi")
_COLOURS = ("red", "blue", "green", "amber", "violet", "grey", "white", "black")
_GOODS = ("lantern", "kettle", "compass", "blanket", "ladder", "teapot", "anchor", "violin")


def _ident(rng: random.Random) -> str:
    return f"{rng.choice(_IDENT_PARTS)}_{rng.choice(_IDENT_PARTS)}"


def _code_lines(rng: random.Random, want_words: int, func: str) -> list[str]:
    args = sorted({_ident(rng) for _ in range(3)})
    lines = [f"def {func}({', '.join(args)}):"]
    local = list(args)
    words = 2 + len(args)
    while words < want_words:
        var = _ident(rng)
        a, b = rng.choice(local), rng.choice(local)
        form = rng.randrange(4)
        if form == 0:
            line = f"    {var} = {a} + {b} * {rng.randint(2, 99)}"
        elif form == 1:
            line = (
                f"    if {a} > {rng.randint(0, 999)}:\n        {var} = {b} - {a}\n"
                f"    else:\n        {var} = {a}"
            )
        elif form == 2:
            line = f"    {var} = [{a} for _ in range({rng.randint(2, 16)})]"
        else:
            line = f"    {var} = min({a}, {b}) // {rng.randint(1, 9)}"
        lines.append(line)
        local.append(var)
        words += len(line.split())
    lines.append(f"    return {local[-1]}")
    return lines


def _copy_heavy(rng: random.Random, target_tokens: int) -> PromptDraft:
    if rng.random() < 0.5:
        func = f"{rng.choice(_IDENT_PARTS)}_{rng.choice(('update', 'merge', 'scan', 'apply'))}"
        new_func = f"{func}_v{rng.randint(2, 9)}"
        head = (
            f"Repeat the following Python code exactly, but rename the function `{func}` "
            f"to `{new_func}`. Output only the code.\n\n```python\n"
        )
        tail = "\n```\n"
        body = "\n".join(_code_lines(rng, _body_words(target_tokens, head + tail), func))
    else:
        old, new = rng.sample(_CITIES, 2)
        head = (
            f"Copy the inventory list below line by line, unchanged except that every "
            f"mention of {old} becomes {new}.\n\n"
        )
        tail = "\n\nThe corrected list:\n"
        want = _body_words(target_tokens, head + tail)
        lines: list[str] = []
        words = 0
        while words < want:
            line = (
                f"Item {len(lines) + 1}: the {rng.choice(_COLOURS)} {rng.choice(_GOODS)} costs "
                f"{rng.randint(3, 250)} coins and ships from {rng.choice(_CITIES)}."
            )
            lines.append(line)
            words += len(line.split())
        body = "\n".join(lines)
    return PromptDraft(head, _units(body), tail)
