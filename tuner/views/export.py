"""Turn a chosen trial into something that starts the server exactly as it was measured.

Every format comes from ``trial_command`` (the renderer the trial runner used), so the
exported flags and environment are the measured ones; the formats themselves (quoting,
what each can carry) are ``tuner.views.export_formats``. Secrets (``tuner.secrets``) are
exported as references (``${HF_TOKEN}``, ``${API_KEY}``), never as values: the command is
rendered from the study's public server section, where every secret value is its
reference already.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from tuner import __version__
from tuner.load.max_rate_text import max_rate_text
from tuner.secrets import MARK, as_reference, public_server, secret_slots
from tuner.study.confirmation import blocks_export
from tuner.study.environment import summary as environment_summary
from tuner.study.noise import noisy_front, plus_minus, tie_text, unstable_text
from tuner.study.pareto import Filter, pick_point
from tuner.study.simulated import simulated_label
from tuner.study.space import trial_command
from tuner.study.spec import StudySpec
from tuner.study.trials import TrialRecord, noisy_points, record_points
from tuner.views.export_formats import (
    FORMATS,
    Exported,
    ExportFormatError,
    env_text,
    json_text,
    shell_text,
    systemd_text,
    yaml_text,
)
from tuner.views.quality_view import quality_header
from tuner.vllm.knobs import PYTHON_PLACEHOLDER, argument_words, mismatch_text

__all__ = ["choose_record", "ExportError", "render_export", "FORMATS"]


class ExportError(Exception):
    """The requested point cannot be exported (message says why and what to do)."""


def choose_record(
    records: list[TrialRecord],
    labels: list[str],
    directions: list[str],
    *,
    trial: int | None,
    pick: str | None,
    filters: list[Filter],
    force: bool,
    confirmations: dict[int, dict[str, Any]] | None = None,
) -> TrialRecord:
    """The trial to export: ``trial`` itself, or the ``pick`` among feasible trials.

    A point whose confirmation re-run failed or came back worse than its tolerance
    (``confirm/``) is left out of picks and refused by number, unless ``force``.
    """

    confirmations = confirmations or {}
    by_number = {r.number: r for r in records}
    if trial is not None:
        record = by_number.get(trial)
        if record is None:
            raise ExportError(f"trial {trial} does not exist in this study")
        if record.kind != "run" or record.state != "COMPLETE":
            raise ExportError(f"trial {trial} did not complete ({record.outcome}); nothing to export")
        if not record.feasible and not force:
            raise ExportError(
                f"trial {trial} is not a valid configuration ({record.outcome}: "
                f"{_why(record)}); use --force to export it anyway"
            )
        blocked = blocks_export(confirmations.get(trial))
        if blocked and not force:
            raise ExportError(f"trial {trial} did not reproduce ({blocked}); use --force to export it anyway")
        return record
    points = [p for p in record_points(records, labels)
              if force or not blocks_export(confirmations.get(p.number))]
    point = pick_point(points, labels, directions,
                       policy=pick or "knee", filters=filters, include_infeasible=force)
    if point is None:
        raise ExportError("no feasible trial matches the pick" + (" and filters" if filters else ""))
    return by_number[point.number]


def _why(record: TrialRecord) -> str:
    if record.outcome == "probe_failed":
        return str(record.summary.probe_reason or "correctness probe failed")
    if record.outcome == "quality_failed":
        quality = record.summary.quality
        return quality.summary() if quality is not None else "accuracy drop not shown within the budget"
    if record.outcome == "not_applied":
        bad = record.summary.mismatches
        return "; ".join(mismatch_text(m) for m in bad) or "not applied"
    if record.outcome == "limit_missed":
        return ", ".join(k for k, v in record.constraints.items() if k.startswith("limit:") and v > 0)
    return record.outcome


def noise_notes(records: list[TrialRecord], labels: list[str], directions: list[str],
                record: TrialRecord) -> list[str]:
    """The ties noise leaves around an exported point (tuner.study.noise), as sentences."""

    noisy = noisy_points(records, labels)
    if not any(p.number == record.number for p in noisy):
        return []
    _, ties = noisy_front(noisy, directions, labels)
    return [tie_text(t) for t in ties if record.number in t.trials]


def _slo_lines(spec: StudySpec, record: TrialRecord) -> list[str]:
    """Header lines on the study's SLO and the trial's max_rate@slo search (none without an
    SLO): what the exported configuration was measured to serve."""

    if spec.slo is None:
        return []
    lines = [f"  slo: {spec.slo.text()}"]
    searched = record.summary.max_rate
    if searched:
        lines.append(f"  {max_rate_text(searched)}")
    return lines


def _value_lines(record: TrialRecord) -> list[str]:
    """``  label = value ± noise`` per objective, and a loud line for an unstable trial."""

    measured = record.measured_values()
    noise = record.noise(list(measured))
    lines = [f"  {k} = {plus_minus(float(v), noise.get(k), ' ± ')}"
             + (" (95 %)" if noise.get(k) is not None else "") for k, v in measured.items()]
    lines += [f"  {k}: not measured (the trial stopped before it)" for k in record.values if k not in measured]
    if record.unstable_levels:
        lines.append("  UNSTABLE: " + unstable_text(record.unstable_levels, record.client_bound_levels)
                     + "; these numbers are not the server's steady figures")
    return lines


def exported_command(spec: StudySpec, study_name: str, record: TrialRecord,
                     notes: list[str] | None = None, agreement: str | None = None,
                     environment: Mapping[str, Any] | None = None, dry_run_of: str | None = None) -> Exported:
    """The trial's command for export: rendered from the public server section, secret
    references marked, the metadata every format shows (``notes``: ties noise leaves
    around it, :func:`noise_notes`; ``agreement``: how far its answers moved from the
    reference's, ``StudyPaths.probe_agreement`` - a passing probe allows numerics, and the
    person deploying it should see how much; ``environment``: what it was measured with,
    tuner.study.environment - the same flags on another vLLM are another measurement). A trial
    with lossy values also names them and the accuracy drop its quality gate measured
    (tuner.views.quality_view.quality_header; ``quality`` in the metadata). A study the
    simulator served says so first (tuner.study.simulated; ``dry_run_of``: the study file
    its dry run stood in for)."""

    public = spec.model_copy(update={"server": public_server(spec.server)})
    # 'python' rather than this machine's interpreter path: the export is for another box.
    # The configuration's own environment, all of it: what the tuner adds only to measure
    # (NCCL_DEBUG, VLLM_CACHE_ROOT) is the render's measurement_env, never part of this.
    command = trial_command(public, record.params, python="python")
    refs = sorted({slot.ref for slot in secret_slots(public.server)}, key=len, reverse=True)

    def mark(word: str) -> str:
        for ref in refs:
            word = word.replace(as_reference(ref), MARK + ref + MARK)
        return word

    env = {k: mark(v) for k, v in command.env.items()}
    for name in spec.server.secret_env:
        env.setdefault(name, MARK + name + MARK)   # passed through where the study ran
    config: dict[str, Any] = {}
    config_argv: list[str] = []
    for key, value in command.args.items():
        words = [mark(w) for w in argument_words(key, value)]
        if any(MARK in w for w in words):
            config_argv += words       # vLLM cannot read a variable from its config file
        else:
            config[key.replace("_", "-")] = value
    title = f"tuner study {study_name}, trial {record.number}"
    header = [f"tuner export: study {study_name}, trial {record.number} ({record.outcome})"]
    simulated = simulated_label(spec.server.command, spec.server.env, dry_run_of)
    if simulated:
        header.append(f"  {simulated}")
    header += _value_lines(record) + _slo_lines(spec, record) + [f"  {n}" for n in notes or []]
    quality = record.summary.quality
    if quality is not None:
        # What the lossy choices cost in accuracy, beside what they bought in speed above.
        header.append(f"  {quality_header(quality)}")
    if agreement:
        header.append(f"  probe: {agreement}")
    if environment:
        header.append(f"  measured with: {environment_summary(environment)}")
    header.append(f"  tuner {__version__}, {time.strftime('%Y-%m-%d %H:%M:%S')}")
    meta = {
        "study": study_name,
        "trial": record.number,
        "outcome": record.outcome,
        "objectives": record.measured_values(),
        "noise": record.noise(list(record.measured_values())),
        "unstable_levels": record.unstable_levels,
        "ties": list(notes or []),
        "probe_agreement": agreement,
        "environment": None if environment is None else dict(environment),
        "simulated": simulated,
        "params": record.params,
        "slo": None if spec.slo is None else spec.slo.model_dump(mode="json"),
        "max_rate": record.summary.max_rate,
        "quality": None if quality is None else quality.model_dump(mode="json"),
        "tuner_version": __version__,
        "exported_unix": int(time.time()),
    }
    prefix = ["python" if w == PYTHON_PLACEHOLDER else w for w in spec.server.command]
    return Exported(argv=[mark(w) for w in command.argv], env=env, header=header, study=study_name,
                    title=title, prefix=prefix, config=config, config_argv=config_argv, meta=meta)


_WRITERS = {"shell": shell_text, "env": env_text, "json": json_text, "systemd": systemd_text, "yaml": yaml_text}


def render_export(spec: StudySpec, study_name: str, record: TrialRecord, fmt: str,
                  notes: list[str] | None = None, agreement: str | None = None,
                  environment: Mapping[str, Any] | None = None, dry_run_of: str | None = None) -> str:
    """The trial in format ``fmt``; ExportError when the format cannot carry it.
    ``notes`` (ties noise leaves around it, :func:`noise_notes`), ``agreement`` (its
    answers against the reference's) and ``environment`` (what it was measured with) go
    into the metadata; ``dry_run_of``: see :func:`exported_command`."""

    writer = _WRITERS.get(fmt)
    if writer is None:
        raise ExportError(f"unknown format {fmt!r}; formats: {', '.join(FORMATS)}")
    try:
        return writer(exported_command(spec, study_name, record, notes, agreement, environment, dry_run_of))
    except ExportFormatError as exc:
        raise ExportError(f"{fmt}: {exc}") from None


def summary(record: TrialRecord) -> dict[str, Any]:
    return {"trial": record.number, "values": record.measured_values(), "outcome": record.outcome}
