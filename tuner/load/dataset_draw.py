"""Requests drawn from a user's dataset for one sweep (pure).

One seeded order of the dataset's entries per study (the same for every trial), and one cursor
per sweep that every level, repeat and warm-up draws from in turn. So within a trial no entry
is sent twice until the file is used up (a repeated prompt would be served from the prefix
cache and flatter the level), and warm-up requests are never the measured ones. A sweep of
levels sized by request count draws the same requests at the same level in every trial; levels
sized by time draw as many as they send, so later levels of two trials may see different
(equally drawn) entries, which their noise estimate covers.

A conversation of several user turns is drawn whole, as consecutive plans (turn 0 first) that
the closed loop sends one after the other on one stream (tuner.load.streams): turn k carries the
dataset's messages up to its user message, and the server's own replies take the place of the
dataset's assistant messages when it is sent. A level sized by request count takes whole
conversations until it has at least its count of requests.

Which datasets a sweep can send today is :func:`unsupported`'s to say, before any server starts.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from tuner.load.dataset import Conversation, Dataset, TraceRequest
from tuner.load.filler import TOKENS_PER_WORD
from tuner.load.load_spec import Api
from tuner.load.trace_prompts import TraceText
from tuner.load.workload import RequestPlan

__all__ = ["DATASET_CLASS", "DatasetDraw", "unsupported"]

# The class name a dataset's requests carry into their records.
DATASET_CLASS = "dataset"


def unsupported(dataset: Dataset, api: Api, *, open_loop: bool = False) -> str | None:
    """Why this sweep cannot send ``dataset`` as the study asks, or None. ``open_loop``: the
    study has rate levels (request_rates or a max-rate search)."""

    if api != "chat" and any(c.prompt is None for c in dataset.conversations):
        return (f"format {dataset.format} holds chat messages: it needs load.api: chat "
                "(load.api is completions)")
    multi = [i for i, c in enumerate(dataset.conversations, start=1) if c.user_turns > 1]
    if multi and open_loop:
        return (f"{len(multi)} of {len(dataset)} conversations have more than one user turn "
                f"(the first is entry {multi[0]}): a conversation's turns wait for each other's "
                "replies, so they are measured in concurrency levels only; leave out "
                "load.request_rates and max_rate@slo objectives and limits, or keep one user turn "
                "per entry")
    return None


class DatasetDraw:
    """The cursor of one sweep over the study's seeded order of the dataset."""

    def __init__(self, dataset: Dataset, *, seed: int, output_tokens: int, ignore_eos: bool,
                 think_s: float = 0.0, trace_text: TraceText | None = None) -> None:
        if dataset.timed and trace_text is None:
            raise ValueError("a trace of lengths needs its TraceText to make prompts")
        self._trace_text = trace_text
        self._trace = dataset.trace
        self._entries: Sequence[Conversation | TraceRequest] = dataset.conversations or dataset.trace
        self._order = list(range(len(self._entries)))
        random.Random(f"tuner-dataset|{seed}").shuffle(self._order)
        self._output_tokens = output_tokens
        self._ignore_eos = ignore_eos
        self._think_s = think_s
        self.drawn = 0          # requests (turns) drawn
        self.drawn_entries = 0

    @property
    def entries(self) -> int:
        return len(self._entries)

    def _group(self, index: int) -> list[RequestPlan]:
        """The next entry's requests (one, or a conversation's turns), from plan index ``index``."""
        entry = self._entries[self._order[self.drawn_entries % len(self._order)]]
        self.drawn_entries += 1
        if isinstance(entry, TraceRequest):
            assert self._trace_text is not None
            self.drawn += 1
            return [RequestPlan(
                index=index, class_name=DATASET_CLASS, kind="dataset", prompt=self._trace_text.prompt(entry),
                max_tokens=entry.output_length, ignore_eos=self._ignore_eos,
                target_prompt_tokens=entry.input_length)]
        plans = _to_plans(entry, index, output_tokens=self._output_tokens,
                          ignore_eos=self._ignore_eos, think_s=self._think_s)
        self.drawn += len(plans)
        return plans

    @property
    def trace(self) -> tuple[TraceRequest, ...]:
        """The timed dataset's requests in trace order (empty for an untimed one)."""
        return self._trace

    def replay(self, selected: Sequence[TraceRequest], *, run: int) -> list[RequestPlan]:
        """The trace level's plan: ``selected`` in trace order, outside the cursor. Its blocks
        are words of their own (``run`` numbers the level's repeats): equal ids within the replay
        still give identical blocks, but none is one an earlier level sent, whose prefix the
        server's cache would serve (a production server has not seen the trace's prompts before)."""

        assert self._trace_text is not None
        text = self._trace_text.reseeded(f"{self._trace_text.seed}|trace|{run}")
        return [RequestPlan(index=i, class_name=DATASET_CLASS, kind="dataset", prompt=text.prompt(entry),
                            max_tokens=entry.output_length, ignore_eos=self._ignore_eos,
                            target_prompt_tokens=entry.input_length)
                for i, entry in enumerate(selected)]

    def take(self, n: int) -> list[RequestPlan]:
        """At least ``n`` requests as one level's plan (indices from 0): whole entries, so
        exactly ``n`` unless a conversation of several turns ends past it."""

        if n < 0:
            raise ValueError(f"request count must be >= 0, got {n}")
        plan: list[RequestPlan] = []
        while len(plan) < n:
            plan.extend(self._group(len(plan)))
        return plan

    def stream(self) -> DrawStream:
        """A stream drawing one request at a time (levels sized by time) from this cursor."""

        return DrawStream(self)

    def note(self) -> str | None:
        """A line for the sweep's notes once the file was used up, else None."""

        repeated = self.drawn_entries - len(self._entries)
        if repeated <= 0:
            return None
        return (f"the dataset's {len(self._entries):,} entries were used up: {repeated:,} of "
                f"{self.drawn_entries:,} entries sent repeat an earlier one, which the prefix cache "
                "may serve (a larger file, fewer or shorter levels avoid it)")


class DrawStream:
    """``next_group()`` like :class:`tuner.load.workload.PromptStream`'s: the next entry's
    requests (a conversation's turns, in order), drawn from the shared cursor."""

    def __init__(self, draw: DatasetDraw) -> None:
        self._draw = draw
        self.issued = 0

    def next_group(self) -> list[RequestPlan]:
        plans = self._draw._group(self.issued)
        self.issued += len(plans)
        return plans


def _to_plans(entry: Conversation, index: int, *, output_tokens: int, ignore_eos: bool,
              think_s: float) -> list[RequestPlan]:
    max_tokens = entry.output_tokens or output_tokens
    if entry.prompt is not None:
        return [RequestPlan(index=index, class_name=DATASET_CLASS, kind="dataset", prompt=entry.prompt,
                            max_tokens=max_tokens, ignore_eos=ignore_eos,
                            target_prompt_tokens=_estimate([entry.prompt]))]
    users = [i for i, m in enumerate(entry.messages) if m.role == "user"]
    plans = []
    for turn, at in enumerate(users):
        # Everything up to this user message: system messages, earlier turns and replies.
        sent = tuple((m.role, m.content) for m in entry.messages[: at + 1])
        plans.append(RequestPlan(
            index=index + turn, class_name=DATASET_CLASS, kind="dataset", prompt=sent[-1][1],
            messages=sent, max_tokens=max_tokens, ignore_eos=ignore_eos,
            target_prompt_tokens=_estimate([c for _, c in sent]), turn=turn, turns=len(users),
            think_s=think_s if turn else 0.0))
    return plans


def _estimate(texts: list[str]) -> int:
    return max(1, round(sum(len(t.split()) for t in texts) * TOKENS_PER_WORD))
