"""The reference record (pure models): the prompts before tokenization, the reference's greedy
continuations and teacher-forced steps, and the stored ``reference.json``.

Token-ID prompts (obtained once from the reference server's ``/tokenize``) keep chat
templates and tokenization out of the comparison: both sides see exactly the same ids.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tuner.probe.spec import ProbeSpec

__all__ = [
    "REFERENCE_FORMAT",
    "ChatMessage",
    "ForcedStep",
    "Generation",
    "Reference",
    "ReferencePrompt",
    "ReferenceSource",
    "Source",
    "finite",
    "top_k_ids",
    "truncate_generation",
]


# Bumped when the stored layout changes; a stored reference of another format is
# re-recorded rather than misread.
REFERENCE_FORMAT = 2


Source = Literal["known_answer", "open", "custom"]


class ChatMessage(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    role: Literal["system", "user", "assistant"]
    content: str


class ReferenceSource(BaseModel):
    """One reference prompt before tokenization: chat messages or raw completion text."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    source: Source
    messages: tuple[ChatMessage, ...] | None = None
    prompt: str | None = None

    @model_validator(mode="after")
    def _one_form(self) -> ReferenceSource:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("a reference prompt has exactly one of messages or prompt")
        return self

    def fingerprint(self) -> str:
        """Stable digest of what is tokenized; a changed prompt set invalidates a reference."""
        body = json.dumps(
            {
                "id": self.id,
                "messages": None
                if self.messages is None
                else [m.model_dump() for m in self.messages],
                "prompt": self.prompt,
            },
            sort_keys=True,
        )
        return hashlib.sha256(body.encode()).hexdigest()[:16]

    def preview(self, limit: int = 160) -> str:
        text = self.prompt if self.messages is None else self.messages[-1].content
        assert text is not None
        if len(text) <= limit:
            return text
        return f"{text[:100]} …[{len(text)} chars]… {text[-40:]}"


def top_k_ids(top: Mapping[int, float], k: int) -> list[int]:
    """The k most likely ids of a top-logprobs entry.

    vLLM lists the sampled token plus the top-k, so an entry has k or k+1 items; sorting by
    logprob and cutting at k gives the true top-k either way. NaN sorts last.
    """
    return [
        tid
        for tid, _ in sorted(
            top.items(), key=lambda kv: (-kv[1] if not math.isnan(kv[1]) else math.inf, kv[0])
        )[:k]
    ]


def finite(values: Iterable[float]) -> bool:
    return all(not math.isnan(v) and v != math.inf for v in values)


class Generation(BaseModel):
    """One greedy continuation: per position the chosen token, its logprob and the top-k."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tokens: list[int]
    logprobs: list[float]
    top: list[dict[int, float]] = Field(description="per position: token id -> logprob")
    finish_reason: str | None = None
    text: str = ""

    @model_validator(mode="after")
    def _aligned(self) -> Generation:
        if not len(self.tokens) == len(self.logprobs) == len(self.top):
            raise ValueError("tokens, logprobs and top must have one entry per position")
        return self


class ForcedStep(BaseModel):
    """Teacher-forced position: the continuation token there, its logprob, the top-k."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    token: int
    logprob: float
    top: dict[int, float]

    @property
    def top1(self) -> int | None:
        return top_k_ids(self.top, 1)[0] if self.top else None


class ReferencePrompt(BaseModel):
    """One recorded prompt: its source, the ids sent, and the reference's answers."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    source: Source
    form: Literal["chat", "text"] | None = Field(
        default=None,
        description="Chat template or raw text; None in references recorded before it was kept.",
    )
    fingerprint: str
    preview: str
    prompt_ids: list[int]
    generation: Generation
    forced: list[ForcedStep] | None = Field(
        default=None, description="None when not teacher-forced (too long, or disabled)."
    )


class Reference(BaseModel):
    """The study's reference record (results/<study>/reference.json)."""

    model_config = ConfigDict(extra="forbid")

    format: int = REFERENCE_FORMAT
    model: str
    label: str = Field(default="", description="Which configuration recorded it (for humans).")
    max_tokens: int
    top_k: int
    teacher_forced: bool
    forced_max_prompt_tokens: int
    prompts: list[ReferencePrompt]
    known_answers_accuracy: float | None = Field(
        default=None, description="Pooled known-answer accuracy of the reference server."
    )
    recorded_unix: float | None = None
    record_seconds: float | None = None
    mode: Literal["full", "reference_only"] = Field(
        default="full",
        description="The probe mode it was recorded for; reference_only: dummy weights, "
        "known answers not judged (and no accuracy to hold trials to).",
    )

    def mismatch(
        self, spec: ProbeSpec, sources: Sequence[ReferenceSource], model: str
    ) -> str | None:
        """Why this stored reference cannot judge trials of ``spec`` (None: it can).

        Called on resume: a study whose probe settings or prompt set changed since the
        reference was recorded must record a new one, not compare against a stale one.
        """
        ref = spec.reference
        if self.format != REFERENCE_FORMAT:
            return (
                f"stored reference has format {self.format}, this tuner writes {REFERENCE_FORMAT}"
            )
        if self.model != model:
            return f"stored reference is for model {self.model!r}, the study serves {model!r}"
        if self.max_tokens != spec.generated_tokens():
            return (
                f"reference.max_tokens changed ({self.max_tokens} recorded, "
                f"{spec.generated_tokens()} now)"
            )
        for name in ("top_k", "teacher_forced", "forced_max_prompt_tokens"):
            if getattr(self, name) != getattr(ref, name):
                return (
                    f"reference.{name} changed ({getattr(self, name)} recorded, "
                    f"{getattr(ref, name)} now)"
                )
        mode = "reference_only" if spec.reference_only else "full"
        if self.mode != mode:
            # Dummy weights and real ones answer differently: a record of one cannot
            # judge the other, and a reference-only record holds no known-answer accuracy.
            return f"stored reference was recorded for probe mode {self.mode}, the study now runs {mode}"
        recorded = [(p.id, p.fingerprint) for p in self.prompts]
        wanted = [(s.id, s.fingerprint()) for s in sources]
        if recorded != wanted:
            return "the reference prompt set changed since the reference was recorded"
        return None


def truncate_generation(generation: Generation, n: int) -> Generation:
    """The first ``n`` positions of a greedy continuation, as if ``max_tokens`` had been n.

    Greedy decoding is causal: a continuation asked for more tokens starts with exactly the
    one asked for fewer, which ends with finish reason "length" when it was cut.
    """
    if len(generation.tokens) <= n:
        return generation
    return Generation(
        tokens=generation.tokens[:n],
        logprobs=generation.logprobs[:n],
        top=generation.top[:n],
        finish_reason="length",
        text=generation.text,
    )
