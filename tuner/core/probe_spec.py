"""The study file's ``probe:`` section: what the known-answer correctness probe asks and
how strictly it judges.

The probe exists because a server can be fast and wrong at the same time (field notes,
trap 1: a weight-layout bug produced fluent nonsense that was first taken for a speed
problem). Every trial runs it after startup; a trial that fails it is infeasible,
whatever its throughput.

Pure data: no I/O here. ``prompts_file`` is only a path; reading and validating the file
is done by :func:`tuner.adapters.probe_client.load_probe_items`, which the orchestrator
calls once before any server starts.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["ALL_FAMILIES", "Api", "Family", "ProbeSpec"]

Family = Literal["arithmetic", "copy", "number_words", "capital", "lookup"]
Api = Literal["chat", "completions"]

# Canonical order. Question slots are dealt round-robin in this order (see
# known_answers.build_items), so lookup comes first: with the default 12 questions it then
# gets three slots, one for each default lookup prompt length.
ALL_FAMILIES: tuple[Family, ...] = ("lookup", "arithmetic", "copy", "number_words", "capital")


class ProbeSpec(BaseModel):
    """Configuration of the known-answer correctness probe.

    Pass rule, applied separately to each concurrency level (each level is one full run
    of the item set, all APIs pooled; n = requests at that level):

    * without ``reference_accuracy``: accuracy >= ``min_accuracy``;
    * with ``reference_accuracy`` (the score of the study's reference configuration under
      the same probe spec): accuracy >= reference - tolerance(n), where the tolerance is
      the one-sided ``confidence`` bound of a two-proportion comparison (see
      :func:`tuner.core.known_answers.accuracy_tolerance`). The absolute floor is then not
      applied, because a weak model's own correct server may score below it;
    * answers at each higher concurrency level must be identical to those at the lowest
      level for at least ``min_consistency`` of the items (greedy decoding: a batch-
      dependent bug shows up as changed answers even when both are wrong).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = True
    items: int = Field(
        default=24,
        ge=1,
        le=2000,
        description=(
            "Requests per concurrency level. With api='both' every question is asked through "
            "both endpoints, so 24 means 12 questions x 2 APIs (an odd count is rounded up)."
        ),
    )
    families: tuple[Family, ...] = Field(default=ALL_FAMILIES, min_length=1)
    api: Literal["both", "chat", "completions"] = "both"
    concurrency: tuple[int, ...] = Field(
        default=(1, 8),
        min_length=1,
        description="The item set is run once at each level; batch-dependent bugs exist.",
    )
    max_tokens: int = Field(default=32, ge=1, le=4096)
    min_accuracy: float = Field(default=0.8, ge=0.0, le=1.0)
    reference_accuracy: float | None = Field(default=None, ge=0.0, le=1.0)
    confidence: float = Field(
        default=0.95,
        gt=0.5,
        lt=1.0,
        description="One-sided confidence of the tolerance used with reference_accuracy.",
    )
    min_consistency: float = Field(default=0.9, ge=0.0, le=1.0)
    lookup_prompt_tokens: tuple[int, ...] = Field(
        default=(300, 600, 1000),
        min_length=1,
        description=(
            "Approximate prompt lengths of the key/value lookup questions, cycled; some "
            "server bugs only appear past a prompt length."
        ),
    )
    prompts_file: str | None = Field(
        default=None,
        description=(
            "JSONL of {prompt, expected, check, api?, id?} replacing the generated set "
            "(items, families, seed and lookup_prompt_tokens then do not apply)."
        ),
    )
    seed: int = 0
    request_timeout_s: float = Field(default=60.0, gt=0.0)

    @field_validator("families")
    @classmethod
    def _unique_families(cls, value: tuple[Family, ...]) -> tuple[Family, ...]:
        if len(set(value)) != len(value):
            raise ValueError(f"families must not repeat: {list(value)}")
        return value

    @field_validator("concurrency")
    @classmethod
    def _valid_concurrency(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if any(level < 1 for level in value):
            raise ValueError(f"concurrency levels must be >= 1: {list(value)}")
        if len(set(value)) != len(value):
            raise ValueError(f"concurrency levels must not repeat: {list(value)}")
        # Sorted so the lowest level (the consistency baseline) always runs first.
        return tuple(sorted(value))

    @field_validator("lookup_prompt_tokens")
    @classmethod
    def _valid_lookup_lengths(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if any(not 50 <= n <= 100_000 for n in value):
            raise ValueError(f"lookup_prompt_tokens must each be in [50, 100000]: {list(value)}")
        return value

    @model_validator(mode="after")
    def _prompts_file_not_blank(self) -> ProbeSpec:
        if self.prompts_file is not None and not self.prompts_file.strip():
            raise ValueError("prompts_file must be a path or omitted, not an empty string")
        return self

    @property
    def apis(self) -> tuple[Api, ...]:
        """The endpoints each question is asked through, in a fixed order."""
        if self.api == "both":
            return ("chat", "completions")
        return (self.api,)
