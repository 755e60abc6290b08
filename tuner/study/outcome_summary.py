"""The typed parts of a trial's stored record: what the storage keeps of a worker's outcome
(``OutcomeSummary``) and why a trial failed (``Failure``).

The orchestrator stores both as JSON user attributes (``outcome`` and ``failure``), so
``optuna-dashboard`` and any script can read them; ``TrialRecord`` turns them back into
these types once, and every reader (the policy, status, report, export, pareto.json) reads
the fields instead of picking the dictionaries apart.

Versioned on disk: the summary carries ``version`` (``SUMMARY_VERSION``). A summary without
it was stored before the field existed (version 1, the committed example studies' Optuna
attributes): the same fields, some missing in older ones, each read as "unknown" (None or
empty). ``probe_agreement`` is the one field whose absence differs from None (stored None:
no reference was compared; absent: recorded before the line was kept, read back from the
trial's probe.json), so the summary says which (``agreement_stored``).

Pure: no Optuna, no pydantic models of the spec (``tuner status`` imports this).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from tuner.vllm.compile_cache import CompileRecord
from tuner.vllm.startup import StartupRecord

if TYPE_CHECKING:
    from tuner.probe.quality_stats import QualityRecord

__all__ = ["SUMMARY_VERSION", "OutcomeSummary", "Failure", "read_quality"]

# 2: the summary names its version. 1: no "version" key (written before it existed).
SUMMARY_VERSION = 2
# Fields of OutcomeSummary that are not stored under their own name.
_NOT_STORED = ("version", "agreement_stored")


def _number(value: Any) -> float | None:
    """A stored number as written (an int stays an int: views print what was stored)."""

    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _flag(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _mapping(value: Any) -> dict[str, Any] | None:
    return dict(value) if isinstance(value, Mapping) else None


def read_quality(value: Any) -> QualityRecord | None:
    """A trial's quality-gate record (``outcome.quality``) as stored, or as the worker holds
    it; None for a lossless trial and for one that does not read as a record (a view shows
    the trial without it rather than failing on it).

    pydantic is imported only here, when a record is there to read: ``tuner status`` of a
    study without lossy values stays free of it (tests/test_status_fast.py)."""

    if value is None:
        return None
    from pydantic import ValidationError

    from tuner.probe.quality_stats import QualityRecord

    if isinstance(value, QualityRecord):
        return value
    if not isinstance(value, Mapping):
        return None
    try:
        return QualityRecord.model_validate(dict(value))
    except ValidationError:
        return None


def _table(value: Any) -> dict[str, dict[str, Any]]:
    """level key -> metrics (or server-side readings), entries that are not tables left out."""

    if not isinstance(value, Mapping):
        return {}
    return {str(k): dict(v) for k, v in value.items() if isinstance(v, Mapping)}


@dataclass(frozen=True)
class Failure:
    """Why a trial was told FAIL (or told without running): ``reason`` is the one word
    status counts by (``server_exited``, ``interrupted``, ``forbidden``, ``duplicate``...)."""

    reason: str
    message: str | None = None
    phase: str | None = None
    log_excerpt: str | None = None

    @classmethod
    def from_attr(cls, raw: Any) -> Failure | None:
        """The stored ``failure`` attribute; None when there is none."""

        if not isinstance(raw, Mapping) or not raw:
            return None
        return cls(reason=str(raw.get("reason") or "unknown"), message=_text(raw.get("message")),
                   phase=_text(raw.get("phase")), log_excerpt=_text(raw.get("log_excerpt")))

    def as_attr(self) -> dict[str, Any]:
        """As stored (and shown by ``tuner status --json``): reason, message and phase
        always, the log excerpt when there is one (a failed start's)."""

        out: dict[str, Any] = {"reason": self.reason, "message": self.message, "phase": self.phase}
        if self.log_excerpt is not None:
            out["log_excerpt"] = self.log_excerpt
        return out


@dataclass(frozen=True)
class OutcomeSummary:
    """The part of a worker's outcome (``tuner.study.outcome.TrialOutcome``) kept in the
    storage; the full outcome is the trial folder's outcome.json.

    Verification: ``applied`` (None: not checked) and the ``mismatches`` (asked vs got,
    ``tuner.vllm.verify.Check`` as JSON). Probe verdict: ``probe_passed`` (None: no probe),
    ``probe_reason``, ``probe_coverage``, ``probe_agreement``. Startup: ``startup`` (seconds
    by phase, KV cache, graph capture) and ``compile`` (the torch.compile cache's hit or
    miss), each None when unknown. Quality: ``quality``, the quality gate's record of a trial
    with lossy values (tuner.probe.quality_stats); None for a lossless one."""

    version: int = SUMMARY_VERSION
    status: str | None = None
    host: str | None = None
    startup_s: float | None = None
    probe_s: float | None = None
    load_s: float | None = None
    trial_s: float | None = None
    applied: bool | None = None
    mismatches: list[dict[str, Any]] = field(default_factory=list)
    probe_passed: bool | None = None
    probe_reason: str | None = None
    probe_coverage: str | None = None
    probe_agreement: str | None = None
    agreement_stored: bool = True
    levels: dict[str, dict[str, Any]] = field(default_factory=dict)
    rate_levels: dict[str, dict[str, Any]] = field(default_factory=dict)
    max_rate: dict[str, Any] | None = None
    server_side: dict[str, dict[str, Any]] = field(default_factory=dict)
    started_unix: float | None = None
    finished_unix: float | None = None
    detected_unix: float | None = None
    warnings: list[str] = field(default_factory=list)
    stop: dict[str, Any] = field(default_factory=dict)
    early_stop: dict[str, Any] | None = None
    compile: CompileRecord | None = None
    startup: StartupRecord | None = None
    signature: dict[str, Any] | None = None
    gpu_wait_s: float | None = None
    noise_floor: float | None = None
    quality: QualityRecord | None = None
    energy: dict[str, Any] | None = None

    @classmethod
    def from_attr(cls, raw: Any) -> OutcomeSummary:
        """The stored ``outcome`` attribute, of any version; an empty summary (nothing known)
        for a trial without one (forbidden, duplicate, still running)."""

        if not isinstance(raw, Mapping):
            return cls(version=0, agreement_stored=False)
        version = raw.get("version")
        mismatches = raw.get("mismatches")
        warnings = raw.get("warnings")
        return cls(
            version=version if isinstance(version, int) else 1,
            status=_text(raw.get("status")), host=_text(raw.get("host")),
            startup_s=_number(raw.get("startup_s")), probe_s=_number(raw.get("probe_s")),
            load_s=_number(raw.get("load_s")), trial_s=_number(raw.get("trial_s")),
            applied=_flag(raw.get("applied")),
            mismatches=[dict(m) for m in mismatches if isinstance(m, Mapping)]
            if isinstance(mismatches, list) else [],
            probe_passed=_flag(raw.get("probe_passed")), probe_reason=_text(raw.get("probe_reason")),
            probe_coverage=_text(raw.get("probe_coverage")),
            probe_agreement=_text(raw.get("probe_agreement")),
            agreement_stored="probe_agreement" in raw,
            levels=_table(raw.get("levels")), rate_levels=_table(raw.get("rate_levels")),
            max_rate=_mapping(raw.get("max_rate")), server_side=_table(raw.get("server_side")),
            started_unix=_number(raw.get("started_unix")), finished_unix=_number(raw.get("finished_unix")),
            detected_unix=_number(raw.get("detected_unix")),
            warnings=[str(w) for w in warnings] if isinstance(warnings, list) else [],
            stop=_mapping(raw.get("stop")) or {}, early_stop=_mapping(raw.get("early_stop")),
            compile=CompileRecord.from_json(_mapping(raw.get("compile"))),
            startup=StartupRecord.from_json(_mapping(raw.get("startup"))),
            signature=_mapping(raw.get("signature")), gpu_wait_s=_number(raw.get("gpu_wait_s")),
            noise_floor=_number(raw.get("noise_floor")), quality=read_quality(raw.get("quality")),
            energy=_mapping(raw.get("energy")),
        )

    def as_attr(self) -> dict[str, Any]:
        """The ``outcome`` user attribute as stored (this version); without
        ``probe_agreement`` when it was never stored (read from a version 1 summary that
        lacked it: unknown is not "no reference compared")."""

        out: dict[str, Any] = {"version": SUMMARY_VERSION}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name not in _NOT_STORED:
                if f.name == "quality" and value is not None:
                    value = value.model_dump(mode="json")
                out[f.name] = value.to_json() if isinstance(value, (CompileRecord, StartupRecord)) else value
        if not self.agreement_stored:
            del out["probe_agreement"]
        if self.quality is None:
            del out["quality"]   # only a lossy trial of a quality study has one
        if self.energy is None:
            del out["energy"]    # only a trial that ran its load has one
        return out

    @property
    def compile_cache(self) -> str | None:
        """"hit", "miss", "partial", "none" or None (unknown)."""

        return None if self.compile is None else self.compile.cache
