"""The probe's item model: one known-answer question asked through one API.

The questions themselves come from the item bank (:mod:`tuner.probe.bank`) or the user's
``probe.prompts_file`` (:mod:`tuner.probe.prompts_file`); :mod:`tuner.probe.checks` judges
the answers and :mod:`tuner.probe.known_score` turns them into a verdict. Pure: no I/O.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from tuner.probe.spec import Api

__all__ = ["Check", "ProbeItem"]

Check = Literal["number", "word", "line", "contains", "sentence", "mentions"]


class ProbeItem(BaseModel):
    """One request of the probe: a question asked through one API."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    family: str = Field(description="A bank family, or 'custom' (a prompts_file item).")
    api: Api
    prompt: str = Field(description="Exact text sent: chat user message or completion prompt.")
    expected: str
    check: Check
    distractors: tuple[str, ...] = ()
    history: tuple[tuple[str, str], ...] = Field(
        default=(),
        description="Earlier (role, content) chat turns before ``prompt`` (multi-turn items).",
    )
    stratum: str | None = Field(
        default=None,
        description="The bank stratum (family/wording or retrieval/length) the trial sampler "
        "draws one item of per trial; None for custom items.",
    )

    def messages(self) -> list[dict[str, str]]:
        """The chat messages of a chat item: the earlier turns, then the question."""
        turns = [{"role": role, "content": text} for role, text in self.history]
        return [*turns, {"role": "user", "content": self.prompt}]
