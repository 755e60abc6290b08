"""The study file's ``probe:`` section: what the known-answer correctness probe asks and
how strictly it judges.

The probe exists because a server can be fast and wrong at the same time (field notes,
trap 1: a weight-layout bug produced fluent nonsense that was first taken for a speed
problem). Every trial runs it after startup; a trial that fails it is infeasible,
whatever its throughput.

Pure data: no I/O here. ``prompts_file`` is only a path; reading and validating the file
is done by :func:`tuner.probe.client.load_probe_items`, which the orchestrator
calls once before any server starts.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

__all__ = [
    "BANK_FAMILIES",
    "OPEN_PROMPTS",
    "Api",
    "BankSpec",
    "ProbeSpec",
    "ProbeMode",
    "ReferenceSpec",
    "fit_to_study",
    "mode_text",
    "resolve_mode",
]

# What the probe judges: "full" known answers and reference agreement; "reference_only" the
# reference agreement alone (dummy weights: random weights answer no question right, but are
# deterministic, so a trial can still be held to the reference); "auto" picks one from the
# server's load format (tuner.probe.spec.resolve_mode).
ProbeMode = Literal["auto", "full", "reference_only"]
Api = Literal["chat", "completions"]

# How a built-in open prompt is asked: as a chat turn, or as raw text to continue.
OpenForm = Literal["chat", "text"]

# Built-in open-ended prompts of the reference-agreement check: ("chat" | "text", prompt).
# Known-answer questions get short answers; these get long continuations, so a bug that
# only shows after a few decoded tokens (spec-decode rejection, KV-cache paging, graph
# replay at a later sequence length) still has positions to show up in. Mixed chat and
# raw-text, prose and code, because drafters and kernels behave differently on each.
OPEN_PROMPTS: tuple[tuple[OpenForm, str], ...] = (
    ("chat", "Write a short paragraph about why the sky is blue."),
    ("text", "The history of the printing press begins in"),
    ("chat", "Explain in a few sentences how a bicycle works."),
    ("text", 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'),
    ("chat", "List five fruits and describe each one in one sentence."),
    ("text", "Once upon a time, in a small village by the sea,"),
    ("chat", "Describe the water cycle to a ten-year-old."),
    ("text", "The three most important rules of writing clear code are"),
    ("chat", "Tell me about Paris."),
    ("chat", "Give me three tips for sleeping better."),
    ("text", "Dear hiring manager,\n\nI am writing to apply for the position of"),
    ("chat", "Summarize the plot of Cinderella in one paragraph."),
)

# The item bank's families (tuner.probe.bank), in the order the sampler deals them.
BANK_FAMILIES: tuple[str, ...] = (
    "fact", "arithmetic", "copy", "translation", "code", "multi_turn", "retrieval",
)  # fmt: skip


def _levels(value: tuple[int, ...]) -> tuple[int, ...]:
    if any(level < 1 for level in value):
        raise ValueError(f"concurrency levels must be >= 1: {list(value)}")
    if len(set(value)) != len(value):
        raise ValueError(f"concurrency levels must not repeat: {list(value)}")
    # Sorted so the lowest level (the consistency baseline) always runs first.
    return tuple(sorted(value))


# Concurrency levels of the probe and of its reference layer: >= 1, distinct, ascending.
Levels = Annotated[tuple[int, ...], AfterValidator(_levels)]


class BankSpec(BaseModel):
    """Where the probe's questions come from (issue 14): the item bank, sampled afresh per
    trial, and the shapes those samples must cover.

    The reference records a pool of ``per_stratum`` items of every (family, wording)
    stratum plus one long-context item per grid length up to ``max_prompt_tokens``
    (:func:`tuner.probe.bank.build_pool`); each trial sends one item of every stratum,
    drawn with the trial's seed, one long-context item per prompt-length bucket within
    ``prompt_token_budget``, and some open prompts, at every decode batch size of its plan
    (:mod:`tuner.probe.shapes`). The bank is the probe's only generated source of
    questions: the fixed template questions it replaced missed prompt-dependent
    corruption (issue 37 retired them; ``ProbeSpec`` refuses their keys).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    families: tuple[str, ...] = Field(default=BANK_FAMILIES, min_length=1)
    per_stratum: int = Field(
        default=3,
        ge=1,
        le=20,
        description="Items of each (family, wording) stratum the reference records; a trial "
        "draws one of them per stratum.",
    )
    max_prompt_tokens: int = Field(
        default=1900,
        ge=64,
        le=1_000_000,
        description="Longest long-context prompt (tokens, approximately); the orchestrator "
        "caps it below the server's max_model_len.",
    )
    prompt_token_budget: int = Field(
        default=4096,
        ge=0,
        description="Prompt tokens of long-context items a trial may send (prefill cost); "
        "buckets are covered from the longest down while the budget lasts.",
    )
    open_prompts: int = Field(
        default=2, ge=0, description="Open prompts (teacher-forced) a trial sends."
    )
    batch_sizes: tuple[int, ...] | None = Field(
        default=None,
        description="Decode batch sizes a trial's probe runs at; None: 1, the capture sizes "
        "the server reports (else powers of two) up to the top concurrency, and the top.",
    )
    top_concurrency: int | None = Field(
        default=None,
        ge=1,
        description="The trial's top load concurrency (set by the orchestrator from load:), "
        "so the probe runs the decode batch size the load runs at.",
    )

    @field_validator("families")
    @classmethod
    def _known_families(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [f for f in value if f not in BANK_FAMILIES]
        if unknown:
            raise ValueError(f"unknown bank families {unknown}; known: {list(BANK_FAMILIES)}")
        if len(set(value)) != len(value):
            raise ValueError(f"bank families must not repeat: {list(value)}")
        return value

    @field_validator("batch_sizes")
    @classmethod
    def _valid_batches(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if value is not None and (not value or any(b < 1 for b in value)):
            raise ValueError(f"batch_sizes must be >= 1: {list(value)}")
        return None if value is None else tuple(sorted(set(value)))


class ReferenceSpec(BaseModel):
    """The reference-agreement layer of the probe (measurement.md §5, steps 1-3).

    Once per study a conservative reference configuration (eager, no speculation) records
    greedy continuations with top-k logprobs and teacher-forced prompt logprobs for a fixed
    set of token-ID prompts; every trial repeats the same requests and is compared with
    vLLM's own ``check_logprobs_close`` rule. Known answers catch "the model says nonsense";
    this catches "the model says something slightly different from what it should", which
    is what a kernel, graph or drafter bug looks like on a small model that gets many known
    answers wrong anyway.

    Pass rule: :mod:`tuner.probe.plan_score`, over every request of the trial's seeded
    plan (a near-tie divergence is numerics, a confident one corruption);
    ``min_exact_fraction`` of the top level's prompts identical only when the study sets it.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = True
    values: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "Parameter values (by the study's parameter names) that replace the baseline's "
            "for the reference configuration, e.g. {nccl_proto: Simple}; checked against the "
            "study's parameters before anything starts."
        ),
    )
    conservative: bool = Field(
        default=True,
        description=(
            "Make the reference configuration conservative on top of those values: "
            "enforce_eager on, no speculative_config and no compilation_config (fixed flags "
            "included), so it shares no graph, compiler or drafter path with the trials."
        ),
    )
    known_answer_prompts: int | None = Field(
        default=None,
        ge=0,
        description=(
            "How many known-answer questions are reused as reference prompts (each once, "
            "in its chat form when the probe asks through chat); None = all of them."
        ),
    )
    prompts_file: str | None = Field(
        default=None,
        description=(
            'Optional JSONL of extra reference prompts: {"prompt": text} (raw completion) '
            'or {"messages": [...]} (chat), optional "id"; no expected answer needed.'
        ),
    )
    # 16 tokens leave room for a late divergence (a graph replayed wrong after 8 tokens)
    # while keeping the per-trial cost near a tenth of a CPU-server trial.
    max_tokens: int = Field(default=16, ge=1, le=1024)
    top_k: int = Field(
        default=5, ge=1, le=20, description="Logprobs per position (vLLM's --max-logprobs is 20)."
    )
    concurrency: Levels = Field(
        default=(1, 8),
        min_length=1,
        description=(
            "The prompt set runs once per level; the lowest is compared most strictly. "
            "Inside a probe section, unset means the probe's own levels, so the known-answer "
            "requests can serve both layers at once."
        ),
    )
    min_close_fraction: float = Field(default=1.0, ge=0.0, le=1.0)
    # Unset is None, not a default value: the spec is saved to spec.yaml with every field
    # written out and loaded back for the run, so "did the study set it" must survive that
    # round trip (model_fields_set does not).
    min_exact_fraction: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description=(
            "Fraction of the top level's prompts that must be identical. Unset: no exact rule "
            "(how many near ties flip depends on dtype, batch and kernels, not on correctness: "
            "full CUDA graphs on an H200 leave 60 % of bfloat16 answers identical to eager at "
            "batch 32, every divergence a near tie)."
        ),
    )
    teacher_forced: bool = True
    forced_prompts: Literal["open", "all"] = Field(
        default="open",
        description=(
            "Which recorded prompts a trial teacher-forces (at its highest level). 'open': "
            "the prompts that are not known-answer questions (built-in open prompts and your "
            "own), whose long continuations are where a decode divergence cuts the decode "
            "comparison short - a known answer's few tokens are compared in full by the "
            "decode path at every level; forcing costs a full prefill per prompt "
            "(prompt_logprobs bypasses the prefix cache), about 3 s for the 12 known answers "
            "on the CPU test server. Falls back to all when no open prompt is forced. "
            "'all': every recorded prompt short enough to force."
        ),
    )
    forced_max_prompt_tokens: int = Field(
        default=256,
        ge=1,
        description=(
            "Prompts longer than this are not teacher-forced: prompt_logprobs bypasses the "
            "prefix cache, so every long prompt costs a full prefill per trial (about 5 s "
            "for the 390-token lookup on the CPU test server), while the decode comparison "
            "of the same prompt, served from the cache the known answers warmed, already "
            "checks what its prefill produced."
        ),
    )
    min_prompt_top1: float = Field(
        default=0.98,
        ge=0.0,
        le=1.0,
        description=(
            "Teacher-forced positions that must agree: the trial's top-1 equals the "
            "reference's, or the two differ by a near tie (each top-1 in the other side's "
            "top_k, vLLM's closeness rule applied per forced position). Plain top-1 agreement "
            "is recorded as forced_top1."
        ),
    )
    near_tie_nats: float = Field(
        default=1.0,
        gt=0.0,
        description=(
            "The numerics rule (tuner.probe.numerics): where a trial's token differs from the "
            "reference's, the reference's own logprob gap between its token and the trial's "
            "decides. Up to this many nats it is a near tie (numerics: batch size, dtype, "
            "kernels flip it); more is a confident token replaced, i.e. corruption. Measured "
            "reference-vs-reference flips stay at or below 0.375 nats (fp32 vs bf16, batch 1 "
            "vs N; benchmarks/probe_calibration.py), corruption starts at about 0.75."
        ),
    )
    outside_top_k_by_bound: bool = Field(
        default=False,
        description="A trial token outside the reference's top-k is corruption (False), or is "
        "judged by the lower bound on its gap like any other (True: a near tie when the "
        "reference's k-th token lies within near_tie_nats of its own). Set for lossy trials "
        "(tuner.study.quality_plan.loosened_probe sets it).",
    )
    max_corrupt: int = Field(
        default=0,
        ge=0,
        description="Corrupt positions (decode divergences and teacher-forced positions "
        "judged corruption) tolerated per trial.",
    )
    min_top_k_overlap: float = Field(
        default=0.4,
        ge=0.0,
        le=1.0,
        description="Mean top-k overlap (shared tokens / k) over compared positions, per level; "
        "numerics keeps most of the top-k, corruption replaces it.",
    )
    max_kl_median: float | None = Field(
        default=None,
        gt=0.0,
        description="Per level, the median top-k KL(reference || trial) over compared "
        "positions must stay at or below this (nats): near-tie flips are numerics, but a "
        "trial whose whole distribution moved further than the reference moves against "
        "itself (batch 1 vs N) computes a different model. None: not gated.",
    )
    early_exit: int = Field(
        default=3,
        ge=1,
        description="Corrupt prompts after which the probe stops sending (a clear failure).",
    )
    max_gap_median: float | None = Field(
        default=None, gt=0.0, description="Gate on the median reference-token |delta logprob|."
    )
    max_gap: float | None = Field(
        default=None, gt=0.0, description="Gate on the largest reference-token |delta logprob|."
    )

    @model_validator(mode="before")
    @classmethod
    def _retired_open_prompts(cls, data: Any, info: ValidationInfo) -> Any:
        # The template probe's count of open prompts (issue 37): the reference records every
        # built-in one and each trial draws bank.open_prompts of them, so it did nothing. A
        # saved spec.yaml holds it and is read without it; a study file is told to remove it.
        if not isinstance(data, dict):
            return data
        return _without_retired(data, _RETIRED_REFERENCE, "template probe", info)

    @model_validator(mode="after")
    def _prompts_file_not_blank(self) -> ReferenceSpec:
        # Every built-in open prompt is recorded, so an enabled reference always has prompts.
        if self.prompts_file is not None and not self.prompts_file.strip():
            raise ValueError("reference.prompts_file must be a path or omitted, not empty")
        return self


# The retired template questions' keys, and what replaced each.
_RETIRED = {
    "items": "a trial asks one item of every bank stratum: probe.bank.families, probe.bank.per_stratum",
    "families": "the bank's families are probe.bank.families",
    "lookup_prompt_tokens": "the bank's retrieval items reach probe.bank.max_prompt_tokens",
}


# A retired template probe's key that was not a question's (issue 37), and what replaced it.
_RETIRED_PROBE = {
    "single_stream": "a trial's seeded bank plan chooses what each decode batch size sends: "
    "probe.bank.batch_sizes",
}
_RETIRED_REFERENCE = {
    "open_prompts": "the reference records every built-in open prompt and each trial draws "
    "probe.bank.open_prompts of them",
}


def _without_retired(data: dict[str, Any], retired: dict[str, str], what: str,
                     info: ValidationInfo) -> dict[str, Any]:
    """``data`` without the ``retired`` keys: dropped from a saved spec.yaml (context "saved"),
    which holds every field its version wrote; refused, saying what replaced it, in a study file."""

    if not (info.context or {}).get("saved"):
        for key, instead in retired.items():
            if key in data:
                raise ValueError(f"{key}: {_shown(data[key])}: a key of the retired {what} (issue 37); "
                                 f"remove it ({instead})")
    return {k: v for k, v in data.items() if k not in retired}


def _shown(value: Any) -> str:
    """A study file's value as YAML writes it (false, not False)."""
    return str(value).lower() if isinstance(value, bool) else repr(value)


class ProbeSpec(BaseModel):
    """Configuration of the correctness probe: known answers, then reference agreement.

    A trial passes only when both layers pass (the reference layer is configured in
    ``reference``; see :class:`ReferenceSpec`). Known-answer pass rule, applied separately
    to each concurrency level (each level is one full run of the item set, all APIs pooled;
    n = requests at that level):

    * without ``reference_accuracy``: accuracy >= ``min_accuracy``. This is also the bar
      the reference configuration itself must clear before it is trusted
      (:func:`tuner.probe.verdict.validate_reference`); lower it for a weak model;
    * with ``reference_accuracy`` (the score of the study's reference configuration under
      the same probe spec): accuracy >= reference - tolerance(n), where the tolerance is
      the one-sided ``confidence`` bound of a two-proportion comparison (see
      :func:`tuner.probe.known_score.accuracy_tolerance`). The absolute floor is then not
      applied, because a weak model's own correct server may score below it;
    * answers at each higher concurrency level must be identical to those at the lowest
      level for at least ``min_consistency`` of the items (greedy decoding: a batch-
      dependent bug shows up as changed answers even when both are wrong).

    A trial's bank plan asks every sent item at its top decode batch size and a few of
    them at the lower ones. Their accuracy is recorded but not gated - a few items give no
    power, and are not comparable with the reference's pooled accuracy; the accuracy rule
    applies at the level that asks every item. They are held to consistency instead: at
    most as many of them may change answer as ``min_consistency`` tolerates over the whole
    item set, and never all of them, so a bug at a small batch size that changes them
    fails.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = True
    mode: ProbeMode = Field(
        default="auto",
        description=(
            "'full': known answers and reference agreement. 'reference_only': the reference "
            "agreement alone, known answers not judged - what dummy weights (load_format: "
            "dummy: real kernels, random weights) allow. 'auto': reference_only when the "
            "study's server loads dummy weights, else full."
        ),
    )
    api: Literal["both", "chat", "completions"] = Field(
        default="both", description="The endpoints each prompts_file question is asked through."
    )
    concurrency: Levels = Field(
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
    prompts_file: str | None = Field(
        default=None,
        description=(
            "JSONL of {prompt, expected, check, api?, id?} replacing the item bank's questions."
        ),
    )
    seed: int = 0
    request_timeout_s: float = Field(default=60.0, gt=0.0)
    reference: ReferenceSpec = Field(default_factory=ReferenceSpec)
    bank: BankSpec = Field(default_factory=BankSpec)

    @model_validator(mode="before")
    @classmethod
    def _reference_levels_follow(cls, data: Any) -> Any:
        # The reference layer runs at the probe's levels unless told otherwise: at a level
        # both layers share, each known-answer request also carries the logprobs the
        # reference comparison needs, so a question is asked once per level, not twice.
        if not isinstance(data, dict):
            return data
        levels = data.get("concurrency", cls.model_fields["concurrency"].default)
        ref = data.get("reference")
        if ref is None:
            return {**data, "reference": {"concurrency": levels}}
        if isinstance(ref, dict) and "concurrency" not in ref:
            return {**data, "reference": {**ref, "concurrency": levels}}
        if isinstance(ref, ReferenceSpec) and "concurrency" not in ref.model_fields_set:
            kept = ref.model_dump(exclude_unset=True)
            return {**data, "reference": {**kept, "concurrency": levels}}
        return data

    @model_validator(mode="before")
    @classmethod
    def _retired_template_keys(cls, data: Any, info: ValidationInfo) -> Any:
        # The template questions' keys (issue 37: the item bank replaced them). A spec.yaml
        # saved before holds them (every field is written out) and is read without them
        # (context "saved"); a study file that sets one is told what replaced it.
        if not isinstance(data, dict):
            return data
        bank = data.get("bank")
        if isinstance(bank, dict) and "enabled" in bank:
            if bank["enabled"] is not True:
                raise ValueError(
                    f"bank.enabled: {_shown(bank['enabled'])}: the fixed template questions were retired "
                    "(issue 37) and the item bank is the probe's only generated source; remove the key, "
                    "give your own questions in probe.prompts_file, or turn the probe off (probe.enabled: false)"
                )
            data = {**data, "bank": {k: v for k, v in bank.items() if k != "enabled"}}
        data = _without_retired(data, _RETIRED, "template questions", info)
        return _without_retired(data, _RETIRED_PROBE, "template probe", info)

    @model_validator(mode="after")
    def _prompts_file_not_blank(self) -> ProbeSpec:
        if self.prompts_file is not None and not self.prompts_file.strip():
            raise ValueError("prompts_file must be a path or omitted, not an empty string")
        if self.enabled and self.mode == "reference_only" and not self.reference.enabled:
            raise ValueError(
                "mode reference_only needs the reference comparison (it is the only check), "
                "but reference.enabled is false; turn the reference on, or the probe off"
            )
        return self

    @property
    def reference_only(self) -> bool:
        """Known answers are not judged, only the agreement with the reference (an
        unresolved ``auto`` counts as full: nothing says the weights are dummy)."""
        return self.mode == "reference_only"

    def generated_tokens(self) -> int:
        """Tokens each reference request generates and compares: one request serves both
        layers, so the longer of ``reference.max_tokens`` and the known answers'
        ``max_tokens`` (the answer's text is judged whole)."""
        return max(self.max_tokens, self.reference.max_tokens)

    @property
    def apis(self) -> tuple[Api, ...]:
        """The endpoints each question is asked through, in a fixed order."""
        if self.api == "both":
            return ("chat", "completions")
        return (self.api,)


DUMMY_TEXT = "reference-only (dummy weights: known answers not judged)"
REFERENCE_ONLY_TEXT = "reference-only (known answers not judged)"


def resolve_mode(probe: ProbeSpec, *, dummy_weights: bool) -> ProbeSpec:
    """``probe`` with ``mode`` resolved for a study whose server loads dummy weights
    (``dummy_weights``) or real ones: ``auto`` becomes ``reference_only`` or ``full``.

    Raises:
        ValueError: one line naming the field - ``full`` asked on dummy weights (every known
            answer would fail), or reference-only with the reference layer off.
    """
    if not probe.enabled:
        return probe
    if probe.mode == "full" and dummy_weights:
        raise ValueError(
            "probe.mode: full judges known answers, which dummy weights (load_format: dummy) "
            "cannot answer; use auto or reference_only"
        )
    mode = probe.mode
    if mode == "auto":
        mode = "reference_only" if dummy_weights else "full"
    if mode == "reference_only" and not probe.reference.enabled:
        raise ValueError(
            f"probe.mode: {probe.mode} on dummy weights (load_format: dummy) leaves the reference "
            "comparison as the only check, but probe.reference.enabled is false; turn the "
            "reference on, or the probe off (probe.enabled: false)"
        )
    return probe if mode == probe.mode else probe.model_copy(update={"mode": mode})


def mode_text(probe: ProbeSpec, *, dummy_weights: bool) -> str | None:
    """What status and report say of a resolved reference-only probe; None for a full one."""
    if not (probe.enabled and probe.reference_only):
        return None
    return DUMMY_TEXT if dummy_weights else REFERENCE_ONLY_TEXT


def fit_to_study(
    probe: ProbeSpec, *, top_concurrency: int | None, max_model_len: int | None
) -> ProbeSpec:
    """``probe`` fitted to the study it judges: the bank's top decode batch size is the
    load's top concurrency (the batch the trial will serve at), and its longest prompt
    stays inside the server's ``max_model_len`` with room for the generated tokens."""
    bank = probe.bank
    update: dict[str, Any] = {}
    if top_concurrency is not None and bank.top_concurrency is None:
        update["top_concurrency"] = top_concurrency
    if max_model_len is not None:
        room = max_model_len - probe.generated_tokens() - 16
        if room < bank.max_prompt_tokens:
            update["max_prompt_tokens"] = max(64, room)
    if not update:
        return probe
    return probe.model_copy(update={"bank": bank.model_copy(update=update)})
