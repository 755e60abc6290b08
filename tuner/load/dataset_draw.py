"""Requests drawn from a user's dataset for one sweep (pure).

One seeded order of the dataset's entries per study (the same for every trial), and one cursor
per sweep that every level, repeat and warm-up draws from in turn. So within a trial no entry
is sent twice until the file is used up (a repeated prompt would be served from the prefix
cache and flatter the level), and warm-up requests are never the measured ones. A sweep of
levels sized by request count draws the same requests at the same level in every trial; levels
sized by time draw as many as they send, so later levels of two trials may see different
(equally drawn) entries, which their noise estimate covers.

Which datasets a sweep can send today is :func:`unsupported`'s to say, before any server starts.
"""

from __future__ import annotations

import random

from tuner.load.dataset import Conversation, Dataset
from tuner.load.load_spec import Api
from tuner.load.workload import TOKENS_PER_WORD, RequestPlan

__all__ = ["DATASET_CLASS", "DatasetDraw", "unsupported"]

# The class name a dataset's requests carry into their records.
DATASET_CLASS = "dataset"


def unsupported(dataset: Dataset, api: Api) -> str | None:
    """Why this sweep cannot send ``dataset`` as the study asks, or None."""

    if dataset.timed:
        return ("format mooncake is a timed trace of lengths and prefix blocks: its entries are "
                "checked, but replaying it at its timestamps is not built yet (issue 33); use "
                "prompts, sharegpt or openai-chat")
    multi = [i for i, c in enumerate(dataset.conversations, start=1) if c.user_turns > 1]
    if multi:
        return (f"{len(multi)} of {len(dataset)} conversations have more than one user turn "
                f"(the first is entry {multi[0]}); sending later turns after the earlier replies "
                "is not built yet (issue 33): keep one user turn per entry")
    if api != "chat" and any(c.prompt is None for c in dataset.conversations):
        return (f"format {dataset.format} holds chat messages: it needs load.api: chat "
                "(load.api is completions)")
    return None


class DatasetDraw:
    """The cursor of one sweep over the study's seeded order of the dataset."""

    def __init__(self, dataset: Dataset, *, seed: int, output_tokens: int, ignore_eos: bool) -> None:
        problem = unsupported(dataset, "chat")
        if problem is not None:
            raise ValueError(problem)
        self._entries = dataset.conversations
        self._order = list(range(len(self._entries)))
        random.Random(f"tuner-dataset|{seed}").shuffle(self._order)
        self._output_tokens = output_tokens
        self._ignore_eos = ignore_eos
        self.drawn = 0

    @property
    def entries(self) -> int:
        return len(self._entries)

    def _plan(self, index: int) -> RequestPlan:
        entry = self._entries[self._order[self.drawn % len(self._order)]]
        self.drawn += 1
        return _to_plan(entry, index, output_tokens=self._output_tokens, ignore_eos=self._ignore_eos)

    def take(self, n: int) -> list[RequestPlan]:
        """The next ``n`` requests, as one level's plan (indices 0..n-1)."""

        if n < 0:
            raise ValueError(f"request count must be >= 0, got {n}")
        return [self._plan(i) for i in range(n)]

    def stream(self) -> DrawStream:
        """A stream drawing one request at a time (levels sized by time) from this cursor."""

        return DrawStream(self)

    def note(self) -> str | None:
        """A line for the sweep's notes once the file was used up, else None."""

        repeated = self.drawn - len(self._entries)
        if repeated <= 0:
            return None
        return (f"the dataset's {len(self._entries):,} entries were used up: {repeated:,} of "
                f"{self.drawn:,} requests repeat an earlier one, which the prefix cache may serve "
                "(a larger file, fewer or shorter levels avoid it)")


class DrawStream:
    """``next()`` like :class:`tuner.load.workload.PromptStream`, drawing from a shared cursor."""

    def __init__(self, draw: DatasetDraw) -> None:
        self._draw = draw
        self.issued = 0

    def next(self) -> RequestPlan:
        plan = self._draw._plan(self.issued)
        self.issued += 1
        return plan


def _to_plan(entry: Conversation, index: int, *, output_tokens: int, ignore_eos: bool) -> RequestPlan:
    if entry.prompt is not None:
        prompt, messages = entry.prompt, None
    else:
        # Everything up to the (only) user turn: the system messages and the question.
        last_user = max(i for i, m in enumerate(entry.messages) if m.role == "user")
        sent = entry.messages[: last_user + 1]
        prompt, messages = sent[-1].content, tuple((m.role, m.content) for m in sent)
    words = sum(len(text.split()) for text in ([prompt] if messages is None else [c for _, c in messages]))
    return RequestPlan(
        index=index, class_name=DATASET_CLASS, kind="dataset", prompt=prompt, messages=messages,
        max_tokens=entry.output_tokens or output_tokens, ignore_eos=ignore_eos,
        target_prompt_tokens=max(1, round(words * TOKENS_PER_WORD)),
    )
