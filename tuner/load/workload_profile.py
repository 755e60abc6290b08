"""What a study's workload is, described as a user would describe their traffic (issue 33):
prompt and output length distributions, turns per conversation, the share of prompt tokens
that repeat an earlier prefix (what a prefix cache could reuse) and, for a timed trace, its
arrival rate over time.

Pure: the study's workload spec and, for a dataset, its parsed entries in; a
:class:`WorkloadProfile` out (``to_dict`` is what ``workload.json`` holds; status and the
report read that file as plain JSON, tuner.views.workload_view).

How each figure is found:

- lengths: a mooncake line's ``input_length`` and ``output_length`` as given; text is
  estimated at :data:`~tuner.load.filler.TOKENS_PER_WORD` tokens a whitespace word (the
  estimate the dataset draw plans with: no server, so no tokenizer, when the study starts);
  a request's output is its ``output_tokens`` or the dataset's default, the ``max_tokens`` sent.
  Synthetic classes: their configured lengths over :data:`SYNTHETIC_REQUESTS` requests split
  by weight, each class's prompts spread evenly over ``prompt_tokens * (1 ± jitter)``.
- prefix repeat: prompt tokens in leading blocks the same as an earlier request's (a prefix
  cache reuses whole blocks of a shared prefix only). Mooncake: a block whose hash id, with
  the ids before it in its request, came in an earlier request (partial last blocks count
  their own tokens). Text: the same, over blocks of :data:`BLOCK_WORDS` words (about 16
  tokens, vLLM's default block) in file order; a chat turn's request is the conversation so
  far, and after each turn its reply (the dataset's assistant turn, standing in for the
  server's) joins what was seen, so a later turn repeats everything before its new message.
  Synthetic: ``prefix_tokens`` of every shared_prefix request but each group's first;
  open_ended and copy_heavy share none by design (each opens with its own drawn instruction).
"""

from __future__ import annotations

import math
import re
from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from tuner.load.dataset import Conversation, Dataset, Message, TraceRequest
from tuner.load.filler import TOKENS_PER_WORD
from tuner.load.load_spec import WorkloadClass, WorkloadSpec
from tuner.load.stats import percentile

__all__ = ["BLOCK_WORDS", "SYNTHETIC_REQUESTS", "Distribution", "TraceProfile", "WorkloadProfile",
           "profile_workload"]

# vLLM caches KV in blocks of 16 tokens by default: about 12 words at 1.3 tokens a word.
BLOCK_WORDS = 12
# Synthetic classes are described over this many requests (a level's worth or so): enough that
# every shared_prefix group's first request, the one the cache has not seen, weighs little.
SYNTHETIC_REQUESTS = 1000
# Histograms and the trace's rate figure are kept this coarse: workload.json stays small.
_MAX_BINS = 30
_MAX_BUCKETS = 60
_BUCKETS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 21600, 43200, 86400)
_UNIT = re.compile(r"\S+\s*")


@dataclass(frozen=True, slots=True)
class Distribution:
    """Integer lengths summarised: percentiles (linear, as numpy) and a histogram of
    ``counts`` over integer bins ``[edges[i], edges[i+1])``."""

    count: int
    mean: float
    min: int
    p50: float
    p90: float
    max: int
    edges: tuple[int, ...]
    counts: tuple[int, ...]

    @classmethod
    def of(cls, values: Sequence[int]) -> Distribution:
        if not values:
            raise ValueError("a distribution of no values")
        xs = sorted(values)
        low, high = xs[0], xs[-1]
        width = math.ceil((high - low + 1) / _MAX_BINS)
        bins = math.ceil((high - low + 1) / width)
        counts = [0] * bins
        for x in xs:
            counts[(x - low) // width] += 1
        return cls(count=len(xs), mean=math.fsum(xs) / len(xs), min=low, p50=percentile(xs, 50),
                   p90=percentile(xs, 90), max=high, edges=tuple(low + i * width for i in range(bins + 1)),
                   counts=tuple(counts))


@dataclass(frozen=True, slots=True)
class TraceProfile:
    """A timed trace's arrivals: ``rates[i]`` requests/s in ``[i, i+1) * bucket_s`` from its first
    request; the last bucket ends at the last request (and holds it)."""

    requests: int
    duration_s: float          # first request to last
    mean_rate: float | None    # requests / duration; None when every request has one timestamp
    bucket_s: float
    rates: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class WorkloadProfile:
    source: str                # "dataset" or "synthetic"
    description: str           # the file and its format, or the classes
    entries: int               # conversations, prompts or trace lines (synthetic: requests)
    requests: int              # requests sent for them (a conversation's user turns each)
    prompt_tokens: Distribution
    output_tokens: Distribution
    turns: Distribution        # user turns per entry
    multi_turn: int            # entries of more than one turn
    prefix_repeat_share: float
    prefix_method: str         # how prefix_repeat_share was found, for the reader
    length_method: str         # how prompt lengths were found
    trace: TraceProfile | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def profile_workload(workload: WorkloadSpec, dataset: Dataset | None = None, *,
                     synthetic_requests: int = SYNTHETIC_REQUESTS,
                     block_words: int = BLOCK_WORDS) -> WorkloadProfile:
    """The profile of ``workload``: its dataset's entries (``dataset``, parsed from the file
    ``workload.dataset`` names) or its synthetic classes."""

    source = workload.dataset
    if source is None:
        return _synthetic(workload.classes, synthetic_requests)
    if dataset is None:
        raise ValueError("a workload with a dataset is profiled from the dataset's entries")
    how = "detected" if dataset.detected else "as named"
    description = f"{source.path}, format {dataset.format} ({how})"
    if dataset.timed:
        return _trace(dataset.trace, description, source.block_tokens)
    return _conversations(dataset.conversations, description, source.output_tokens, block_words)


# --- datasets ---------------------------------------------------------------------------------


class _Seen:
    """Block prefixes seen so far, as a tree: a node per (parent node, block), so a block
    counts as seen only with every block before it in its request. Node 0 is the root."""

    def __init__(self) -> None:
        self._nodes: dict[tuple[int, Hashable], int] = {}

    def leading(self, blocks: Sequence[Hashable], node: int = 0) -> int:
        """How many leading blocks of ``blocks``, below ``node``, an earlier request had."""
        found = 0
        for block in blocks:
            child = self._nodes.get((node, block))
            if child is None:
                break
            node, found = child, found + 1
        return found

    def add(self, blocks: Sequence[Hashable], node: int = 0) -> int:
        """``blocks`` seen below ``node``; the node of the last one."""
        for block in blocks:
            node = self._nodes.setdefault((node, block), len(self._nodes) + 1)
        return node


def _trace(trace: Sequence[TraceRequest], description: str, block_tokens: int) -> WorkloadProfile:
    seen = _Seen()
    repeated = total = 0
    for request in trace:
        hit = seen.leading(request.hash_ids)
        repeated += min(hit * block_tokens, request.input_length)
        total += request.input_length
        seen.add(request.hash_ids)
    ones = Distribution.of([1] * len(trace))
    return WorkloadProfile(
        source="dataset", description=description, entries=len(trace), requests=len(trace),
        prompt_tokens=Distribution.of([r.input_length for r in trace]),
        output_tokens=Distribution.of([r.output_length for r in trace]), turns=ones, multi_turn=0,
        prefix_repeat_share=repeated / total,
        prefix_method=f"from hash ids, blocks of {block_tokens} tokens",
        length_method="as the trace gives them",
        trace=_arrivals([r.timestamp_ms / 1000.0 for r in trace]))


def _arrivals(times_s: Sequence[float]) -> TraceProfile:
    start = times_s[0]
    duration = times_s[-1] - start
    bucket = next((float(b) for b in _BUCKETS_S if duration / b <= _MAX_BUCKETS),
                  math.ceil(duration / _MAX_BUCKETS))
    buckets = max(1, math.ceil(duration / bucket))
    counts = [0] * buckets
    for t in times_s:
        counts[min(int((t - start) // bucket), buckets - 1)] += 1
    # The last bucket ends with the trace: a part-filled bucket would read as a lull.
    last = duration - (buckets - 1) * bucket
    widths = [bucket] * (buckets - 1) + [last if last > 0 else bucket]
    return TraceProfile(requests=len(times_s), duration_s=duration,
                        mean_rate=len(times_s) / duration if duration > 0 else None, bucket_s=bucket,
                        rates=tuple(c / w for c, w in zip(counts, widths, strict=True)))


def _conversations(entries: Sequence[Conversation], description: str, default_output: int,
                   block_words: int) -> WorkloadProfile:
    text = _Text(block_words)
    outputs: list[int] = []
    for entry in entries:
        text.entry(entry)
        outputs += [entry.output_tokens or default_output] * entry.user_turns
    turns = [e.user_turns for e in entries]
    return WorkloadProfile(
        source="dataset", description=description, entries=len(entries), requests=len(outputs),
        prompt_tokens=Distribution.of(text.prompts), output_tokens=Distribution.of(outputs),
        turns=Distribution.of(turns), multi_turn=sum(1 for t in turns if t > 1),
        prefix_repeat_share=text.repeated_words / text.total_words if text.total_words else 0.0,
        prefix_method=(f"text in blocks of {block_words} words, about {round(block_words * TOKENS_PER_WORD)} tokens"
                       + ("; a turn resends the conversation so far" if any(t > 1 for t in turns) else "")),
        length_method=f"estimated at {TOKENS_PER_WORD:g} tokens a word", trace=None)


def _units(message: Message | str) -> list[str]:
    """The words of a prompt or message with their trailing whitespace; a message's first word
    carries its role, so the same words said by another role are not the same prefix."""
    if isinstance(message, str):
        return _UNIT.findall(message)
    words: list[str] = _UNIT.findall(message.content)
    return [f"{message.role}:{words[0]}", *words[1:]] if words else []


class _Text:
    """The text requests of a dataset in file order against what earlier ones sent, in blocks
    of ``size`` words (a block is kept as its hash: equal text, equal hash; a collision of two
    64-bit hashes is not worth the memory of keeping the words)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.seen = _Seen()
        self.prompts: list[int] = []           # tokens, estimated
        self.repeated_words = self.total_words = 0

    def entry(self, entry: Conversation) -> None:
        """Each request of ``entry``. A chat's turn k is turn k-1's text, its reply (the
        dataset's assistant message) and the new message: what turn k-1 and its reply left in
        the tree is added once, before turn k is looked up from where it ended, so a
        conversation costs its length, not its length times its turns."""
        if entry.prompt is not None:
            prompt = _units(entry.prompt)
            self._request(prompt, 0, 0)
            self.seen.add(self._blocks(prompt, 0))
            return
        units: list[str] = []                  # the conversation so far
        node = done = 0                        # its first ``done`` blocks are in the tree, below node
        asked = False
        for message in entry.messages:
            if message.role == "user" and asked:
                # the turn before and its reply: the server has them before this turn is sent
                node = self.seen.add(self._blocks(units, done), node)
                done = len(units) // self.size
            units.extend(_units(message))
            if message.role == "user":
                self._request(units, node, done)
                asked = True
        self.seen.add(self._blocks(units, done), node)

    def _blocks(self, units: Sequence[str], start: int) -> list[int]:
        size = self.size
        return [hash(tuple(units[i:i + size])) for i in range(start * size, len(units) - size + 1, size)]

    def _request(self, units: list[str], node: int, done: int) -> None:
        hit = done + self.seen.leading(self._blocks(units, done), node)
        self.repeated_words += hit * self.size
        self.total_words += len(units)
        self.prompts.append(max(1, round(len(units) * TOKENS_PER_WORD)))


# --- synthetic classes ------------------------------------------------------------------------


def _synthetic(classes: Sequence[WorkloadClass], n: int) -> WorkloadProfile:
    counts = _split(classes, n)
    prompts: list[int] = []
    outputs: list[int] = []
    repeated = 0
    for wc, k in zip(classes, counts, strict=True):
        j = wc.prompt_tokens_jitter
        prompts += [max(1, round(wc.prompt_tokens * (1 - j + 2 * j * (i + 0.5) / k))) for i in range(k)]
        outputs += [wc.output_tokens] * k
        if wc.kind == "shared_prefix" and wc.prefix_tokens is not None:
            repeated += max(0, k - wc.groups) * wc.prefix_tokens
    names = ", ".join(f"{wc.name} ({wc.kind}, weight {wc.weight:g})" for wc in classes)
    return WorkloadProfile(
        source="synthetic", description=names, entries=n, requests=n,
        prompt_tokens=Distribution.of(prompts), output_tokens=Distribution.of(outputs),
        turns=Distribution.of([1] * n), multi_turn=0, prefix_repeat_share=repeated / sum(prompts),
        prefix_method=("a shared_prefix group's prefix_tokens after its first request"
                       if any(wc.kind == "shared_prefix" for wc in classes)
                       else "open_ended and copy_heavy prompts share none by design"),
        length_method="prompt_tokens within its jitter", trace=None)


def _split(classes: Sequence[WorkloadClass], n: int) -> list[int]:
    """``n`` requests split by weight, largest remainder first (as a level allocates them)."""
    total = math.fsum(c.weight for c in classes)
    quotas = [c.weight / total * n for c in classes]
    counts = [math.floor(q) for q in quotas]
    for i in sorted(range(len(classes)), key=lambda i: (-(quotas[i] - counts[i]), i))[: n - sum(counts)]:
        counts[i] += 1
    return counts
