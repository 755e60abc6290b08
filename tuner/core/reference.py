"""Reference agreement, pure part: the reference record, the request bodies, response
parsing, and the vLLM-style comparison of a trial with the reference.

Known answers (``tuner.core.known_answers``) catch a server that talks nonsense. They do
not catch one that is *slightly* wrong - a drafter that accepts a wrong token now and
then, a CUDA graph replayed with a stale buffer after 8 tokens, a batch-size dependent
reduction bug - because a small model gets many known answers wrong on a correct server
too, and a short answer leaves few tokens for a late bug to show in (measurement.md §5).
This layer compares every trial token by token with a reference recorded once per study
from a conservative configuration (eager, no speculation):

* **Decode path** (vLLM's ``tests/models/utils.py::check_logprobs_close``): greedy
  continuations of token-ID prompts must be equal up to their first divergence, and there
  each side's token must be in the other side's top-k logprobs (a near-tie flipped by
  different kernels, which is legitimate); comparison of that prompt stops there. Such a
  prompt is *close*; one whose divergent token is outside the other side's top-k is *far*.
  Garbage is far at its first token; a late bug is far where it starts.
* **Prefill path**: the reference continuation is teacher-forced (``prompt_logprobs`` on
  prompt + continuation) and at each continuation position the trial's top-1 token must
  agree with the reference's top-1, or the two be a near tie (each in the other's top-k).
  This survives divergence, so it keeps measuring where the decode comparison had to stop.
  Trials force the open prompts (``ReferenceSpec.forced_prompts``) at their highest
  concurrency level, batched with its decodes (where batch-dependent prefill numerics
  show); the reference forced one request at a time. The reference token's logprob gap
  |delta| is recorded.

Concurrency 1, where every request runs alone and costs its full decode time, sends a
chosen single-stream subset (:func:`single_stream_plan`); the whole set runs batched at
the higher level, where the statistical rules (accuracy, the 66 % exact rule) apply.

Token-ID prompts (obtained once from the reference server's ``/tokenize``) keep chat
templates and tokenization out of the comparison: both sides see exactly the same ids.
The HTTP side lives in ``tuner.adapters.reference_client``.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tuner.core.known_answers import ProbeItem, ProbeResult, jsonl_lines
from tuner.core.probe_spec import OPEN_PROMPTS, ProbeSpec, ReferenceSpec
from tuner.errors import SpecError

__all__ = [
    "REFERENCE_FORMAT",
    "ChatMessage",
    "CorrectnessResult",
    "DecodeComparison",
    "ForcedComparison",
    "ForcedStep",
    "Generation",
    "PromptScore",
    "Reference",
    "ReferenceAnswer",
    "ReferenceLevel",
    "ReferencePrompt",
    "ReferencePromptsError",
    "ReferenceResult",
    "ReferenceSource",
    "SingleStreamPlan",
    "combine",
    "compare_forced",
    "compare_generation",
    "forced_prompt_ids",
    "forced_request",
    "generation_request",
    "parse_forced",
    "parse_generation",
    "parse_reference_prompts_jsonl",
    "reference_sources",
    "score_reference",
    "shared_prompts",
    "single_stream_plan",
    "tokenize_request",
    "truncate_generation",
    "validate_reference",
    "with_reference_accuracy",
]

# Bumped when the stored layout changes; a stored reference of another format is
# re-recorded rather than misread.
REFERENCE_FORMAT = 1

Verdict = Literal["exact", "close", "far", "error"]
Source = Literal["known_answer", "open", "custom"]

# Comparisons of ratios of small integers (e.g. 11/16 >= 0.66) must not fail on rounding.
_EPS = 1e-9


# --------------------------------------------------------------------------- prompts


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


class ReferencePromptsError(SpecError):
    """A reference prompts file has bad lines; ``problems`` lists (line, message)."""

    def __init__(self, source: str, problems: list[tuple[int, str]]) -> None:
        self.source = source
        self.problems = problems
        shown = "\n".join(f"  line {line}: {msg}" for line, msg in problems[:50])
        more = f"\n  ... and {len(problems) - 50} more" if len(problems) > 50 else ""
        super().__init__(f"{source}: {len(problems)} invalid line(s)\n{shown}{more}")


class _RefLine(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    id: str | None = Field(default=None, min_length=1)
    prompt: str | None = Field(default=None, min_length=1)
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)


def parse_reference_prompts_jsonl(
    text: str, *, source: str = "reference prompts file"
) -> list[ReferenceSource]:
    """Parse ``reference.prompts_file``: one JSON object a line, blank lines ignored.

    Each line is ``{"prompt": "raw completion text"}`` or ``{"messages": [{"role": "user",
    "content": "..."}]}`` (the server's chat template is applied when the reference is
    tokenized), with an optional unique ``"id"`` (default ``ref-line<N>``). No expected
    answer: the reference configuration's own output is the expectation.

    Raises:
        ReferencePromptsError: listing every bad line, so one edit fixes all.
    """
    problems: list[tuple[int, str]] = []
    out: list[ReferenceSource] = []
    seen: dict[str, int] = {}
    for lineno, data, bad_json in jsonl_lines(text):
        if bad_json is not None:
            problems.append((lineno, bad_json))
            continue
        try:
            line = _RefLine.model_validate(data)
        except ValidationError as exc:
            problems.extend(
                (lineno, f"{'.'.join(str(p) for p in err['loc']) or '-'}: {err['msg']}")
                for err in exc.errors()
            )
            continue
        if (line.prompt is None) == (line.messages is None):
            problems.append((lineno, "needs exactly one of 'prompt' or 'messages'"))
            continue
        ident = line.id or f"ref-line{lineno}"
        if ident in seen:
            problems.append((lineno, f"id {ident!r} duplicates line {seen[ident]}"))
            continue
        seen[ident] = lineno
        out.append(
            ReferenceSource(
                id=ident,
                source="custom",
                prompt=line.prompt,
                messages=None if line.messages is None else tuple(line.messages),
            )
        )
    if not problems and not out:
        problems.append((0, "no prompts in file"))
    if problems:
        raise ReferencePromptsError(source, problems)
    return out


def _question_key(item: ProbeItem) -> str:
    # Item ids are "<question>-<api>" for generated and user items alike.
    return item.id.rsplit("-", 1)[0] if item.id.endswith(f"-{item.api}") else item.id


def _known_answer_sources(
    spec: ProbeSpec, items: Sequence[ProbeItem]
) -> list[tuple[ReferenceSource, ProbeItem]]:
    """The known-answer questions the reference reuses, each with the item it was made from."""
    chosen: dict[str, ProbeItem] = {}
    for item in items:
        key = _question_key(item)
        if key not in chosen or (item.api == "chat" and chosen[key].api != "chat"):
            chosen[key] = item
    questions = list(chosen.items())
    if spec.reference.known_answer_prompts is not None:
        questions = questions[: spec.reference.known_answer_prompts]
    out: list[tuple[ReferenceSource, ProbeItem]] = []
    for key, item in questions:
        if item.api == "chat":
            source = ReferenceSource(
                id=f"ka-{key}",
                source="known_answer",
                messages=(ChatMessage(role="user", content=item.prompt),),
            )
        else:
            source = ReferenceSource(id=f"ka-{key}", source="known_answer", prompt=item.prompt)
        out.append((source, item))
    return out


def shared_prompts(
    spec: ProbeSpec, items: Sequence[ProbeItem], reference: Reference
) -> dict[str, ReferencePrompt]:
    """Known-answer item id -> the reference prompt recorded from exactly that item.

    Such an item needs one request per level, not two: sent as the reference's token ids
    with top-k logprobs, its answer is judged as a known answer and compared with the
    reference. Only prompts whose recorded fingerprint matches the item's text are paired,
    so a stale or foreign reference never lends its ids to a different question.
    """
    recorded = {p.id: p for p in reference.prompts}
    out: dict[str, ReferencePrompt] = {}
    for source, item in _known_answer_sources(spec, items):
        prompt = recorded.get(source.id)
        if prompt is not None and prompt.fingerprint == source.fingerprint():
            out[item.id] = prompt
    return out


# Concurrency 1 is where a trial's requests run one at a time, so there every request costs
# its full decode time (about 60 ms a token on the CPU test server, 2-4 times the batched
# cost per token): the whole prompt set there was half the probe's time. The plan keeps the
# single-stream coverage the faults need - a long and a short prompt, both prompt forms,
# the longest continuation, a known answer through each API - and leaves the statistics
# (accuracy over every item, the 66 % exact rule over every prompt) to the batched level.
SINGLE_STREAM_LEVEL = 1


@dataclass(frozen=True)
class SingleStreamPlan:
    """What concurrency 1 sends under ``ProbeSpec.single_stream: subset``.

    ``items`` / ``prompts`` are the known-answer item ids and reference prompt ids sent
    there; None means everything (that layer does not run a higher level to carry the
    rest).
    """

    items: frozenset[str] | None
    prompts: frozenset[str] | None

    def asked_items(self) -> dict[int, frozenset[str]]:
        return {} if self.items is None else {SINGLE_STREAM_LEVEL: self.items}

    def asked_prompts(self) -> dict[int, frozenset[str]]:
        return {} if self.prompts is None else {SINGLE_STREAM_LEVEL: self.prompts}


def single_stream_plan(
    spec: ProbeSpec, items: Sequence[ProbeItem], reference: Reference
) -> SingleStreamPlan | None:
    """The requests a trial sends at concurrency 1, or None when it sends everything.

    Only with ``single_stream: subset`` and for a layer that runs at 1 *and* at a higher
    level (the whole set runs there). Chosen from the recorded reference, deterministic,
    in the reference's order on ties:

    1. the longest prompt (bugs past a prompt length) and the shortest;
    2. for each prompt form (chat template, raw text) none of those has: its prompt with
       the longest reference continuation;
    3. a prompt with the longest reference continuation of all, if none chosen has it (a
       divergence after a few tokens needs tokens to show in);
    4. known answers: the item each chosen known-answer prompt was made from (one request
       serves both layers), then for every API no chosen item uses, its item with the
       shortest prompt.

    On the default set that is the 600-token lookup, a raw-text open prompt with 16
    continuation tokens, and a short completions question; on smollm2-cpu.yaml's chat-only
    set, a copy question and the raw-text open prompt.
    """
    if spec.single_stream != "subset" or not reference.prompts:
        return None
    ka_levels, ref_levels = spec.concurrency, spec.reference.concurrency
    ka_sub = SINGLE_STREAM_LEVEL in ka_levels and len(ka_levels) > 1 and bool(items)
    ref_sub = SINGLE_STREAM_LEVEL in ref_levels and len(ref_levels) > 1
    if not (ka_sub or ref_sub):
        return None
    prompts = reference.prompts
    chosen: list[ReferencePrompt] = []

    def add(prompt: ReferencePrompt) -> None:
        if all(c.id != prompt.id for c in chosen):
            chosen.append(prompt)

    add(max(prompts, key=lambda p: len(p.prompt_ids)))
    add(min(prompts, key=lambda p: len(p.prompt_ids)))
    for form in ("chat", "text"):
        of_form = [p for p in prompts if p.form == form]
        if of_form and not any(c.form == form for c in chosen):
            add(max(of_form, key=lambda p: len(p.generation.tokens)))
    longest = max(len(p.generation.tokens) for p in prompts)
    if not any(len(c.generation.tokens) == longest for c in chosen):
        add(next(p for p in prompts if len(p.generation.tokens) == longest))

    chosen_ids = {c.id for c in chosen}
    prompt_of = {item.id: source.id for source, item in _known_answer_sources(spec, items)}
    item_ids = [item.id for item in items if prompt_of.get(item.id) in chosen_ids]
    by_id = {item.id: item for item in items}
    for api in dict.fromkeys(item.api for item in items):
        if not any(by_id[i].api == api for i in item_ids):
            of_api = [item for item in items if item.api == api]
            item_ids.append(min(of_api, key=lambda item: len(item.prompt)).id)
    # A chosen item that is also a recorded reference prompt brings that prompt along, so
    # its one request still serves both layers.
    recorded = {p.id for p in prompts}
    if ka_sub:
        chosen_ids |= {prompt_of[i] for i in item_ids if prompt_of.get(i) in recorded}
    return SingleStreamPlan(
        items=frozenset(item_ids) if ka_sub else None,
        prompts=frozenset(chosen_ids) if ref_sub else None,
    )


def forced_prompt_ids(reference: Reference, spec: ReferenceSpec) -> set[str]:
    """The prompts a trial teacher-forces (``spec.forced_prompts``): of those the reference
    forced, the open ones (not known-answer questions), or all when there are none."""
    if not spec.teacher_forced:
        return set()
    forced = [p for p in reference.prompts if p.forced is not None]
    if spec.forced_prompts == "open":
        open_ = [p for p in forced if p.source != "known_answer"]
        forced = open_ or forced
    return {p.id for p in forced}


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


def reference_sources(
    spec: ProbeSpec,
    items: Sequence[ProbeItem],
    custom: Sequence[ReferenceSource] = (),
) -> list[ReferenceSource]:
    """The reference prompt set: known-answer questions, built-in open prompts, custom ones.

    Each known-answer question is used once - in its chat form when it has one, because an
    instruct model's continuation of its own template is the realistic case and the chat
    items' prompt prefixes are then already in the server's prefix cache from the known-
    answer run. ``items`` are the known-answer items the probe sends (load_probe_items).
    """
    ref = spec.reference
    out = [source for source, _ in _known_answer_sources(spec, items)]
    for n, (form, text) in enumerate(OPEN_PROMPTS[: ref.open_prompts]):
        if form == "chat":
            msgs = (ChatMessage(role="user", content=text),)
            out.append(ReferenceSource(id=f"open{n}-chat", source="open", messages=msgs))
        else:
            out.append(ReferenceSource(id=f"open{n}-text", source="open", prompt=text))
    out.extend(custom)
    ids = [s.id for s in out]
    if len(set(ids)) != len(ids):
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        raise ValueError(f"reference prompt ids must be unique, repeated: {dupes}")
    return out


# ------------------------------------------------------------------ request bodies


def tokenize_request(source: ReferenceSource, model: str) -> dict[str, Any]:
    """Body for vLLM's ``/tokenize``: the chat template for messages, plain text otherwise
    (special tokens added exactly as ``/v1/completions`` would add them to that text)."""
    if source.messages is not None:
        return {
            "model": model,
            "messages": [m.model_dump() for m in source.messages],
            "add_generation_prompt": True,
        }
    return {"model": model, "prompt": source.prompt, "add_special_tokens": True}


def generation_request(model: str, prompt_ids: Sequence[int], ref: ReferenceSpec) -> dict[str, Any]:
    """Greedy continuation with top-k logprobs of a token-ID prompt.

    ``temperature: 0`` explicitly (``--generation-config auto`` would otherwise fill it from
    the model's generation_config.json, vllm-knobs.md §6); ``return_tokens_as_token_ids``
    so tokens and top-k keys are ids ("token_id:123"), not strings that several ids can
    decode to.
    """
    return {
        "model": model,
        "prompt": list(prompt_ids),
        "max_tokens": ref.max_tokens,
        "temperature": 0,
        "seed": 0,
        "logprobs": ref.top_k,
        "return_tokens_as_token_ids": True,
        "stream": False,
    }


def forced_request(
    model: str, prompt_ids: Sequence[int], continuation: Sequence[int], ref: ReferenceSpec
) -> dict[str, Any]:
    """Teacher-forcing: the prompt plus the reference continuation, scored by prefill only
    (``prompt_logprobs``; one throw-away generated token because vLLM needs max_tokens>=1)."""
    return {
        "model": model,
        "prompt": [*prompt_ids, *continuation],
        "max_tokens": 1,
        "temperature": 0,
        "seed": 0,
        "prompt_logprobs": ref.top_k,
        "stream": False,
    }


# ------------------------------------------------------------------------- records


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
        return _top_k(self.top, 1)[0] if self.top else None


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
                f"stored reference has format {self.format}, this tuner writes "
                f"{REFERENCE_FORMAT}"
            )
        if self.model != model:
            return f"stored reference is for model {self.model!r}, the study serves {model!r}"
        for name in ("max_tokens", "top_k", "teacher_forced", "forced_max_prompt_tokens"):
            if getattr(self, name) != getattr(ref, name):
                return (
                    f"reference.{name} changed ({getattr(self, name)} recorded, "
                    f"{getattr(ref, name)} now)"
                )
        recorded = [(p.id, p.fingerprint) for p in self.prompts]
        wanted = [(s.id, s.fingerprint()) for s in sources]
        if recorded != wanted:
            return "the reference prompt set changed since the reference was recorded"
        return None


# ------------------------------------------------------------------------- parsing


def _token_id(value: Any) -> int:
    if isinstance(value, str) and value.startswith("token_id:"):
        return int(value.removeprefix("token_id:"))
    raise ValueError(
        f"expected a token id like 'token_id:123', got {value!r} "
        "(server ignores return_tokens_as_token_ids?)"
    )


def _as_float(value: Any) -> float:
    # None is what vLLM sends for a position without logprobs; NaN stays NaN so the scorer
    # can report it as the server fault it is.
    if value is None:
        raise ValueError("missing logprob")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"logprob is {type(value).__name__}, not a number")
    return float(value)


def parse_generation(payload: Any) -> Generation:
    """A :class:`Generation` from a non-streaming ``/v1/completions`` body requested with
    ``logprobs`` and ``return_tokens_as_token_ids``.

    Raises:
        ValueError: the body lacks the OpenAI completion-logprobs shape or token ids.
    """
    try:
        choice = payload["choices"][0]
        lp = choice["logprobs"]
        if lp is None:
            raise ValueError("response has no logprobs")
        tokens = [_token_id(t) for t in lp["tokens"]]
        logprobs = [_as_float(v) for v in lp["token_logprobs"]]
        top_raw = lp["top_logprobs"]
        if top_raw is None or any(entry is None for entry in top_raw):
            raise ValueError("response has no top_logprobs for some position")
        top = [{_token_id(k): _as_float(v) for k, v in entry.items()} for entry in top_raw]
        text = choice.get("text") or ""
        finish = choice.get("finish_reason")
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        raise ValueError(f"malformed completion body ({type(exc).__name__}: {exc})") from exc
    try:
        return Generation(
            tokens=tokens,
            logprobs=logprobs,
            top=top,
            finish_reason=finish if isinstance(finish, str) else None,
            text=text if isinstance(text, str) else "",
        )
    except ValidationError as exc:
        raise ValueError(f"inconsistent logprobs: {exc.errors()[0]['msg']}") from exc


def parse_forced(
    payload: Any, prompt_len: int, continuation: Sequence[int], k: int
) -> list[ForcedStep]:
    """Teacher-forced steps for the ``continuation`` positions of a ``prompt_logprobs=k``
    response whose prompt was ``prompt_len`` ids of prompt followed by ``continuation``.

    vLLM returns one entry per prompt position (the first is null): ``{"<id>": {"logprob",
    "rank", "decoded_token"}}`` holding the top-k (ranks 1..k) and always the actual
    prompt token, whatever its rank. ``top`` keeps the ranks 1..k only, so an actual token
    far down the list is not mistaken for a top candidate.

    Raises:
        ValueError: wrong shape, or the actual token missing from a position.
    """
    try:
        plp = payload["choices"][0]["prompt_logprobs"]
        if not isinstance(plp, list):
            raise ValueError("response has no prompt_logprobs list")
        if len(plp) != prompt_len + len(continuation):
            raise ValueError(
                f"prompt_logprobs has {len(plp)} positions, expected "
                f"{prompt_len + len(continuation)}"
            )
        steps: list[ForcedStep] = []
        for j, token in enumerate(continuation):
            entry = plp[prompt_len + j]
            if not isinstance(entry, dict):
                raise ValueError(f"no prompt logprobs at continuation position {j}")
            actual: float | None = None
            top: dict[int, float] = {}
            for key, info in entry.items():
                tid = int(key)
                value = _as_float(info["logprob"])
                if tid == token:
                    actual = value
                rank = info.get("rank")
                if isinstance(rank, int) and 1 <= rank <= k:
                    top[tid] = value
            if actual is None:
                raise ValueError(f"actual token {token} missing at continuation position {j}")
            if not top:
                raise ValueError(f"no ranked top-{k} entries at continuation position {j}")
            steps.append(ForcedStep(token=token, logprob=actual, top=top))
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        raise ValueError(f"malformed prompt_logprobs body ({type(exc).__name__}: {exc})") from exc
    return steps


# ----------------------------------------------------------------------- comparison


def _top_k(top: Mapping[int, float], k: int) -> list[int]:
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


def _finite(values: Iterable[float]) -> bool:
    return all(not math.isnan(v) and v != math.inf for v in values)


class DecodeComparison(BaseModel):
    """check_logprobs_close for one prompt."""

    verdict: Verdict
    matched: int = Field(description="Positions equal before the divergence (or in total).")
    diverged_at: int | None = None
    reference_token: int | None = None
    trial_token: int | None = None
    reference_in_trial_top_k: bool | None = None
    trial_in_reference_top_k: bool | None = None
    gaps: list[float] = Field(
        default_factory=list, description="|delta logprob| of the chosen token, matched positions."
    )
    detail: str = ""


def compare_generation(reference: Generation, trial: Generation, k: int) -> DecodeComparison:
    """vLLM's ``check_logprobs_close`` for one prompt.

    Tokens are compared position by position; at the first mismatch the prompt is *close*
    when the reference token is in the trial's top-``k`` and the trial token in the
    reference's top-``k``, else *far*; later positions are not compared (the two texts
    legitimately go separate ways after a near-tie flip). Differences vLLM only warns about
    are failures here, because a server must not produce them: a trial that stops earlier
    or later without a divergent token (the shorter one ended without EOS), and NaN
    logprobs.
    """
    if not _finite(trial.logprobs) or not all(_finite(t.values()) for t in trial.top):
        return DecodeComparison(verdict="error", matched=0, detail="trial logprobs contain NaN")
    gaps: list[float] = []
    for idx, (ref_tok, got_tok) in enumerate(zip(reference.tokens, trial.tokens, strict=False)):
        if ref_tok == got_tok:
            gaps.append(abs(reference.logprobs[idx] - trial.logprobs[idx]))
            continue
        ref_in = ref_tok in _top_k(trial.top[idx], k)
        got_in = got_tok in _top_k(reference.top[idx], k)
        close = ref_in and got_in
        return DecodeComparison(
            verdict="close" if close else "far",
            matched=idx,
            diverged_at=idx,
            reference_token=ref_tok,
            trial_token=got_tok,
            reference_in_trial_top_k=ref_in,
            trial_in_reference_top_k=got_in,
            gaps=gaps,
            detail=(
                f"diverged at token {idx}: reference {ref_tok} "
                f"{'in' if ref_in else 'NOT in'} trial top-{k}, trial {got_tok} "
                f"{'in' if got_in else 'NOT in'} reference top-{k}"
            ),
        )
    n = min(len(reference.tokens), len(trial.tokens))
    if len(reference.tokens) != len(trial.tokens):
        return DecodeComparison(
            verdict="far",
            matched=n,
            diverged_at=n,
            gaps=gaps,
            detail=(
                f"same first {n} tokens, then the trial ended after {len(trial.tokens)} "
                f"tokens and the reference after {len(reference.tokens)}"
            ),
        )
    return DecodeComparison(verdict="exact", matched=n, gaps=gaps)


class ForcedComparison(BaseModel):
    positions: int
    top1_matches: int
    close_matches: int = Field(
        default=0,
        description="Positions whose top-1s agree or are a near tie (each in the other's top-k).",
    )
    gaps: list[float]
    first_mismatch: int | None = None


def compare_forced(
    reference: Sequence[ForcedStep], trial: Sequence[ForcedStep], k: int = 5
) -> ForcedComparison:
    """Top-1 agreement, near-tie closeness and reference-token |delta logprob| over
    teacher-forced positions.

    A position whose top-1 tokens differ is still *close* when the reference's top-1 is in
    the trial's top-``k`` and the trial's in the reference's: the near-tie flip vLLM's
    ``check_logprobs_close`` accepts at a decode divergence, judged here at every forced
    position (the continuation is forced, so one flip does not carry into the next).

    Raises:
        ValueError: the two were not forced on the same continuation (a caller bug).
    """
    if [s.token for s in reference] != [s.token for s in trial]:
        raise ValueError("teacher-forced steps are for different continuations")
    matches = close = 0
    first: int | None = None
    gaps: list[float] = []
    for j, (ref, got) in enumerate(zip(reference, trial, strict=True)):
        same = ref.top1 is not None and ref.top1 == got.top1 and not math.isnan(got.logprob)
        matches += same
        if same:
            close += 1
        elif (
            ref.top1 is not None
            and got.top1 is not None
            and not math.isnan(got.logprob)
            and _finite(got.top.values())
            and ref.top1 in _top_k(got.top, k)
            and got.top1 in _top_k(ref.top, k)
        ):
            close += 1
        if not same and first is None:
            first = j
        # NaN compares as an infinite gap: it must show up in max |delta|, not vanish.
        gaps.append(math.inf if math.isnan(got.logprob) else abs(ref.logprob - got.logprob))
    return ForcedComparison(
        positions=len(reference),
        top1_matches=matches,
        close_matches=close,
        gaps=gaps,
        first_mismatch=first,
    )


# -------------------------------------------------------------------------- scoring


class ReferenceAnswer(BaseModel):
    """What a trial server returned for one reference prompt at one concurrency level."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prompt_id: str
    concurrency: int
    kind: Literal["generate", "forced"]
    generation: Generation | None = None
    forced: list[ForcedStep] | None = None
    latency_s: float | None = None
    error: str | None = None


def _stats(values: Sequence[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return float(median(values)), float(max(values))


class PromptScore(BaseModel):
    """The measured agreement of one prompt at one level (stored with the trial)."""

    id: str
    source: str
    concurrency: int
    verdict: Verdict
    reference_tokens: int
    trial_tokens: int | None = None
    matched: int = 0
    diverged_at: int | None = None
    reference_in_trial_top_k: bool | None = None
    trial_in_reference_top_k: bool | None = None
    decode_gap_median: float | None = None
    decode_gap_max: float | None = None
    forced_positions: int | None = None
    forced_top1: float | None = None
    forced_close: float | None = None
    forced_gap_median: float | None = None
    forced_gap_max: float | None = None
    trial_text: str | None = Field(default=None, description="Truncated, for reading failures.")
    detail: str = ""
    error: str | None = None
    latency_s: float | None = None


class ReferenceLevel(BaseModel):
    concurrency: int
    prompts: int
    exact: int
    close: int
    far: int
    errors: int
    exact_fraction: float
    close_fraction: float = Field(description="(exact + close) / prompts")
    decode_gap_median: float | None = None
    decode_gap_max: float | None = None
    forced_positions: int | None = None
    forced_top1: float | None = None
    forced_close: float | None = Field(
        default=None, description="Forced positions agreeing or a near tie (the gated figure)."
    )
    forced_gap_median: float | None = None
    forced_gap_max: float | None = None
    passed: bool
    subset: bool = Field(
        default=False, description="Only some prompts were asked here (ProbeSpec.single_stream)."
    )


class ReferenceResult(BaseModel):
    """Outcome of the reference-agreement check; JSON-serialisable."""

    passed: bool
    reason: str
    levels: list[ReferenceLevel]
    scores: list[PromptScore]
    thresholds: dict[str, float | None]


def _preview(text: str | None, limit: int = 120) -> str | None:
    if text is None:
        return None
    return text if len(text) <= limit else text[:limit] + "…"


def _score_generation(
    prompt: ReferencePrompt, level: int, ans: ReferenceAnswer | None, k: int
) -> tuple[PromptScore, list[float]]:
    """One prompt's decode comparison as a stored row, plus its matched-position gaps."""
    row = PromptScore(
        id=prompt.id,
        source=prompt.source,
        concurrency=level,
        verdict="error",
        reference_tokens=len(prompt.generation.tokens),
        latency_s=None if ans is None else ans.latency_s,
    )
    if ans is None or ans.error is not None or ans.generation is None:
        row.error = row.detail = (
            "no answer recorded" if ans is None else (ans.error or "no generation")
        )
        return row, []
    cmp = compare_generation(prompt.generation, ans.generation, k)
    row.verdict = cmp.verdict
    row.trial_tokens = len(ans.generation.tokens)
    row.matched = cmp.matched
    row.diverged_at = cmp.diverged_at
    row.reference_in_trial_top_k = cmp.reference_in_trial_top_k
    row.trial_in_reference_top_k = cmp.trial_in_reference_top_k
    row.decode_gap_median, row.decode_gap_max = _stats(cmp.gaps)
    row.detail = cmp.detail
    if cmp.verdict != "exact":
        row.trial_text = _preview(ans.generation.text)
    if cmp.verdict == "error":
        row.error = cmp.detail
    return row, cmp.gaps


def _score_forced(
    prompt: ReferencePrompt, ans: ReferenceAnswer | None, row: PromptScore, k: int
) -> tuple[int, int, int, list[float], str | None]:
    """(positions, top-1 matches, close positions, gaps, error) of one teacher-forced
    prompt; fills ``row``.

    A missing or failed answer counts every position as a mismatch: a server that cannot
    answer the teacher-forced request must not pass on the positions it skipped.
    """
    assert prompt.forced is not None
    positions = len(prompt.forced)
    row.forced_positions = positions
    if ans is None or ans.error is not None or ans.forced is None:
        row.forced_top1 = row.forced_close = 0.0
        why = "no answer recorded" if ans is None else (ans.error or "no steps")
        return positions, 0, 0, [], f"{prompt.id}: {why}"
    fc = compare_forced(prompt.forced, ans.forced, k)
    row.forced_top1 = fc.top1_matches / positions if positions else None
    row.forced_close = fc.close_matches / positions if positions else None
    row.forced_gap_median, row.forced_gap_max = _stats(fc.gaps)
    return positions, fc.top1_matches, fc.close_matches, fc.gaps, None


def score_reference(
    reference: Reference,
    answers: Iterable[ReferenceAnswer],
    spec: ReferenceSpec,
    *,
    asked: Mapping[int, Collection[str]] | None = None,
) -> ReferenceResult:
    """Compare a trial's answers with the reference and apply :class:`ReferenceSpec`'s rule.

    A missing answer or a request error counts as not close. Teacher-forced answers are
    expected at the highest level only, for :func:`forced_prompt_ids`.

    ``asked`` maps a level to the ids of the only prompts sent there (a single-stream
    subset, :func:`single_stream_plan`); a level not in it sent every prompt. The exact
    rule is held at the lowest level that sent every prompt.

    Raises:
        ValueError: answers for unknown prompts, unexpected levels or duplicates (caller bugs).
    """
    by_id = {p.id: p for p in reference.prompts}
    levels = spec.concurrency
    subsets = {level: set(ids) for level, ids in (asked or {}).items()}
    for level, ids in subsets.items():
        if level not in levels or not ids or not ids <= by_id.keys():
            raise ValueError(f"bad prompt subset at concurrency {level}: {sorted(ids)[:5]}")
    forced_ids = forced_prompt_ids(reference, spec)
    full_levels = [lvl for lvl in levels if lvl not in subsets or subsets[lvl] >= by_id.keys()]
    exact_level = full_levels[0] if full_levels else levels[0]
    got: dict[tuple[str, int, str], ReferenceAnswer] = {}
    for ans in answers:
        if ans.prompt_id not in by_id:
            raise ValueError(f"answer for unknown reference prompt {ans.prompt_id!r}")
        if ans.concurrency not in levels:
            raise ValueError(f"answer at unexpected concurrency {ans.concurrency}")
        if ans.concurrency in subsets and ans.prompt_id not in subsets[ans.concurrency]:
            raise ValueError(f"answer for {ans.prompt_id!r}, not asked at {ans.concurrency}")
        key = (ans.prompt_id, ans.concurrency, ans.kind)
        if key in got:
            raise ValueError(f"two {ans.kind} answers for {ans.prompt_id!r} at {ans.concurrency}")
        got[key] = ans

    # A reference recorded with fewer logprobs than asked cannot show a deeper top-k.
    k = min(spec.top_k, reference.top_k)
    scores: list[PromptScore] = []
    results: list[ReferenceLevel] = []
    failures: list[str] = []
    for level in levels:
        forced_here = level == levels[-1]
        rows: list[PromptScore] = []
        decode_gaps: list[float] = []
        forced_gaps: list[float] = []
        forced_pos = forced_hits = forced_close_hits = 0
        forced_errors: list[str] = []
        for prompt in reference.prompts:
            if level in subsets and prompt.id not in subsets[level]:
                continue
            row, gaps = _score_generation(prompt, level, got.get((prompt.id, level, "generate")), k)
            decode_gaps.extend(gaps)
            if forced_here and prompt.id in forced_ids:
                fans = got.get((prompt.id, level, "forced"))
                pos, hits, close_hits, fgaps, err = _score_forced(prompt, fans, row, k)
                forced_pos += pos
                forced_hits += hits
                forced_close_hits += close_hits
                forced_gaps.extend(fgaps)
                if err is not None:
                    forced_errors.append(err)
            rows.append(row)

        n = len(rows)
        exact = sum(r.verdict == "exact" for r in rows)
        close = sum(r.verdict == "close" for r in rows)
        far = sum(r.verdict == "far" for r in rows)
        errors = sum(r.verdict == "error" for r in rows)
        close_fraction = (exact + close) / n if n else 1.0
        exact_fraction = exact / n if n else 1.0
        fmed, fmax = _stats(forced_gaps)
        forced_top1 = forced_hits / forced_pos if forced_here and forced_pos else None
        forced_close = forced_close_hits / forced_pos if forced_here and forced_pos else None
        level_failures: list[str] = []
        if close_fraction < spec.min_close_fraction - _EPS:
            bad = [r for r in rows if r.verdict in ("far", "error")]
            shown = "; ".join(f"{r.id}: {r.detail}" for r in bad[:3])
            level_failures.append(
                f"{far + errors}/{n} prompts not close at concurrency {level} "
                f"(close {close_fraction:.2f} < {spec.min_close_fraction:.2f}): {shown}"
            )
        # Exact equality is demanded at one level only, the lowest that sent every prompt: a
        # different batch legitimately changes low-order bits and so near-tie choices
        # (vllm-knobs.md §6), and on a few chosen prompts the fraction means nothing (the
        # long continuations a single-stream subset favours are where near ties flip).
        if level == exact_level and exact_fraction < spec.min_exact_fraction - _EPS:
            level_failures.append(
                f"only {exact}/{n} prompts identical at concurrency {level} "
                f"({exact_fraction:.2f} < {spec.min_exact_fraction:.2f})"
            )
        if forced_close is not None and forced_close < spec.min_prompt_top1 - _EPS:
            extra = f"; errors: {'; '.join(forced_errors[:3])}" if forced_errors else ""
            level_failures.append(
                f"teacher-forced agreement {forced_close:.3f} < {spec.min_prompt_top1:.3f} "
                f"over {forced_pos} positions (top-1 equal or a near tie; top-1 equal "
                f"{forced_top1:.3f}){extra}"
            )
        if forced_top1 is not None and fmed is not None:
            if spec.max_gap_median is not None and fmed > spec.max_gap_median:
                level_failures.append(
                    f"median reference-token |delta logprob| {fmed:.4f} > {spec.max_gap_median}"
                )
            if spec.max_gap is not None and fmax is not None and fmax > spec.max_gap:
                level_failures.append(
                    f"max reference-token |delta logprob| {fmax:.4f} > {spec.max_gap}"
                )
        dmed, dmax = _stats(decode_gaps)
        results.append(
            ReferenceLevel(
                concurrency=level,
                prompts=n,
                exact=exact,
                close=close,
                far=far,
                errors=errors,
                exact_fraction=exact_fraction,
                close_fraction=close_fraction,
                decode_gap_median=dmed,
                decode_gap_max=dmax,
                forced_positions=forced_pos if forced_top1 is not None else None,
                forced_top1=forced_top1,
                forced_close=forced_close,
                forced_gap_median=fmed,
                forced_gap_max=fmax,
                passed=not level_failures,
                subset=level not in full_levels,
            )
        )
        failures.extend(level_failures)
        scores.extend(rows)
    return ReferenceResult(
        passed=not failures,
        reason="; ".join(failures) if failures else "ok",
        levels=results,
        scores=scores,
        thresholds={
            "min_close_fraction": spec.min_close_fraction,
            "min_exact_fraction": spec.min_exact_fraction,
            "min_prompt_top1": spec.min_prompt_top1 if spec.teacher_forced else None,
            "max_gap_median": spec.max_gap_median,
            "max_gap": spec.max_gap,
            "top_k": float(k),
        },
    )


# ------------------------------------------------------------- combined verdict


class CorrectnessResult(BaseModel):
    """Both probe layers of one trial (trials/NNNN/probe.json); ``passed`` needs both."""

    passed: bool
    reason: str
    probe_seconds: float | None = Field(
        default=None, description="Wall time of the whole probe, both layers (its cost)."
    )
    known_answers: ProbeResult
    reference: ReferenceResult | None = None
    reference_note: str | None = Field(
        default=None, description="Why the reference layer did not run, when it did not."
    )
    known_answers_seconds: float | None = None
    reference_seconds: float | None = None

    @property
    def skipped(self) -> bool:
        return self.known_answers.skipped

    def summary(self) -> dict[str, float | None]:
        """Flat headline numbers for the trial outcome, status lines and Optuna attributes
        (the full per-prompt detail stays in probe.json). Fractions are the worst level."""
        out: dict[str, float | None] = {
            "probe_s": self.probe_seconds,
            "known_accuracy": None if self.known_answers.skipped else self.known_answers.accuracy,
            "reference_close": None,
            "reference_exact_c1": None,
            "reference_forced_top1": None,
            "reference_forced_gap_max": None,
        }
        if self.reference is not None and self.reference.levels:
            levels = self.reference.levels
            out["reference_close"] = min(lvl.close_fraction for lvl in levels)
            out["reference_exact_c1"] = levels[0].exact_fraction
            forced = [lvl for lvl in levels if lvl.forced_top1 is not None]
            if forced:
                out["reference_forced_top1"] = forced[0].forced_top1
                out["reference_forced_gap_max"] = forced[0].forced_gap_max
        return out


def combine(
    known: ProbeResult,
    reference: ReferenceResult | None,
    *,
    reference_note: str | None = None,
    probe_seconds: float | None = None,
    known_answers_seconds: float | None = None,
    reference_seconds: float | None = None,
) -> CorrectnessResult:
    """One verdict: failed when either layer failed, with each layer's reason prefixed."""
    reasons: list[str] = []
    if not known.passed:
        reasons.append(f"known answers: {known.reason}")
    if reference is not None and not reference.passed:
        reasons.append(f"reference: {reference.reason}")
    passed = not reasons
    if passed:
        reason = "ok" if reference_note is None else f"ok ({reference_note})"
        if known.skipped:
            reason = known.reason
    else:
        reason = "; ".join(reasons)
    return CorrectnessResult(
        passed=passed,
        reason=reason,
        probe_seconds=probe_seconds,
        known_answers=known,
        reference=reference,
        reference_note=reference_note,
        known_answers_seconds=known_answers_seconds,
        reference_seconds=reference_seconds,
    )


# ------------------------------------------------------------ trusting a reference


def validate_reference(
    known_answers: ProbeResult,
    *,
    reference: Reference | None = None,
    self_check: ReferenceResult | None = None,
) -> str | None:
    """Why the reference configuration must not be trusted, or None when it can be.

    Field notes, trap 1: the reference must not share a broken path with the trials, and
    nothing proves that but checking it. ``known_answers`` is the known-answer probe run
    on the reference server *without* ``reference_accuracy`` (so the absolute
    ``min_accuracy`` floor and the consistency rule apply); ``reference`` its recording;
    ``self_check`` the recording's requests repeated against the same server and scored
    against it (a reference that does not agree with itself cannot judge anyone).

    The returned text is meant to stop the study, so it says what to do.
    """
    problems: list[str] = []
    if known_answers.skipped:
        problems.append("the known-answer probe is disabled, so the reference cannot be checked")
    elif not known_answers.passed:
        problems.append(
            f"its known-answer probe failed ({known_answers.reason}). Either the reference "
            "configuration is broken too, or the model is weaker than probe.min_accuracy "
            f"assumes (it scored {known_answers.accuracy:.2f}); if the latter, lower "
            "probe.min_accuracy: trials are then judged against this reference's accuracy"
        )
    elif known_answers.errors:
        problems.append(
            f"{len(known_answers.errors)} known-answer request(s) failed on it, e.g. "
            f"{known_answers.errors[0].detail}"
        )
    if reference is not None:
        empty = [p.id for p in reference.prompts if not p.generation.tokens]
        if empty:
            problems.append(f"it produced no tokens for {len(empty)} prompt(s): {empty[:5]}")
        nan = [
            p.id
            for p in reference.prompts
            if not _finite(p.generation.logprobs)
            or not all(_finite(t.values()) for t in p.generation.top)
            or not _finite(s.logprob for s in p.forced or [])
        ]
        if nan:
            problems.append(f"its logprobs contain NaN for {nan[:5]}")
        odd = [
            f"{p.id}={p.generation.finish_reason!r}"
            for p in reference.prompts
            if p.generation.finish_reason not in ("stop", "length")
        ]
        if odd:
            problems.append(f"unexpected finish reasons: {', '.join(odd[:5])}")
    if self_check is not None and not self_check.passed:
        problems.append(
            f"it does not agree with itself ({self_check.reason}); a nondeterministic "
            "reference would fail correct trials - use a more conservative reference "
            "configuration (eager, no speculation, no async scheduling)"
        )
    if not problems:
        return None
    return "the reference configuration cannot be trusted: " + "; ".join(problems)


def with_reference_accuracy(spec: ProbeSpec, source: ProbeResult | Reference) -> ProbeSpec:
    """``spec`` with ``reference_accuracy`` set from the reference server's known-answer
    run (its pooled accuracy over all levels: the best estimate of the configuration's
    true accuracy). ``source`` is that run's result, or - on resume - the stored
    :class:`Reference`, which keeps the same number. A value the study file sets
    explicitly is kept."""
    if spec.reference_accuracy is not None:
        return spec
    if isinstance(source, Reference):
        accuracy = source.known_answers_accuracy
    else:
        accuracy = None if source.skipped else source.accuracy
    if accuracy is None:
        return spec
    return spec.model_copy(update={"reference_accuracy": accuracy})
