"""The probe's verdict (pure): both layers combined into one result per trial, and whether
the reference configuration itself can be trusted.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from tuner.probe.known_score import ProbeResult
from tuner.probe.record import Reference, finite
from tuner.probe.reference_score import ReferenceResult
from tuner.probe.shapes import Coverage
from tuner.probe.spec import ProbeSpec

__all__ = ["CorrectnessResult", "combine", "validate_reference", "with_reference_accuracy"]


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
    coverage: Coverage | None = Field(
        default=None,
        description="The shapes this run covered (bank probe): prompt lengths and buckets, "
        "decode batch sizes, strata, compared positions.",
    )
    sample_seed: int | None = Field(default=None, description="The bank sample's seed.")
    mode: Literal["full", "reference_only"] = Field(
        default="full",
        description="reference_only: the known answers were not judged (dummy weights), "
        "the reference agreement alone decided.",
    )

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
    reference_only: bool = False,
) -> CorrectnessResult:
    """One verdict: failed when either layer failed, with each layer's reason prefixed.
    ``reference_only``: the known answers were not judged (``known`` is
    :meth:`ProbeResult.not_judged`), which a passing verdict says."""
    reasons: list[str] = []
    if not known.passed:
        reasons.append(f"known answers: {known.reason}")
    if reference is not None and not reference.passed:
        reasons.append(f"reference: {reference.reason}")
    passed = not reasons
    if passed:
        mode_note = "reference-only: known answers not judged" if reference_only else None
        notes = [n for n in (reference_note, mode_note) if n]
        reason = f"ok ({'; '.join(notes)})" if notes else "ok"
        if known.skipped and not reference_only:
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
        mode="reference_only" if reference_only else "full",
    )


# ------------------------------------------------------------ trusting a reference


def validate_reference(
    known_answers: ProbeResult,
    *,
    reference: Reference | None = None,
    self_check: ReferenceResult | CorrectnessResult | None = None,
    reference_only: bool = False,
) -> str | None:
    """Why the reference configuration must not be trusted, or None when it can be.

    Field notes, trap 1: the reference must not share a broken path with the trials, and
    nothing proves that but checking it. ``known_answers`` is the known-answer probe run
    on the reference server *without* ``reference_accuracy`` (so the absolute
    ``min_accuracy`` floor and the consistency rule apply); ``reference`` its recording;
    ``self_check`` the recording's requests repeated against the same server and scored
    against it (a reference that does not agree with itself cannot judge anyone).

    With ``reference_only`` (dummy weights: ``ProbeSpec.mode``) its known answers are not
    judged: the rest - output, NaN, finish reasons, agreement with itself - still is.

    The returned text is meant to stop the study, so it says what to do.
    """
    problems: list[str] = []
    if reference_only:
        pass  # dummy weights answer no question right: nothing to hold them to
    elif known_answers.skipped:
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
            if not finite(p.generation.logprobs)
            or not all(finite(t.values()) for t in p.generation.top)
            or not finite(s.logprob for s in p.forced or [])
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
