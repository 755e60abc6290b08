"""Turn a chosen trial into something that starts the server exactly as it was measured.

Every format comes from ``trial_command`` (the renderer the trial runner used), so the
exported flags and environment are the measured ones. Secret variables are exported as
references (``$HF_TOKEN``), never as values.
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import replace
from typing import Any

from tuner import __version__
from tuner.load.max_rate_text import max_rate_text
from tuner.adapters.artifacts import is_secret_name
from tuner.study.noise import NoisyPoint, noisy_front, plus_minus, tie_text
from tuner.study.pareto import Filter, pick_point
import yaml

from tuner.study.confirmation import blocks_export
from tuner.vllm.knobs import PYTHON_PLACEHOLDER, RenderedCommand, mismatch_text, shell_line
from tuner.study.spec import StudySpec
from tuner.study.space import trial_command
from tuner.study.trials import TrialRecord, record_points

__all__ = ["choose_record", "ExportError", "render_export", "FORMATS"]

FORMATS = ("shell", "env", "json", "systemd", "yaml")

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
        return str(record.attrs.get("outcome", {}).get("probe_reason") or "correctness probe failed")
    if record.outcome == "not_applied":
        bad = record.attrs.get("outcome", {}).get("mismatches", [])
        return "; ".join(mismatch_text(m) for m in bad) or "not applied"
    if record.outcome == "limit_missed":
        return ", ".join(k for k, v in record.constraints.items() if k.startswith("limit:") and v > 0)
    return record.outcome


def _command(spec: StudySpec, record: TrialRecord) -> RenderedCommand:
    # 'python' rather than this machine's interpreter path: the export is for another box.
    # The configuration's own environment, all of it: what the tuner adds only to measure
    # (NCCL_DEBUG, VLLM_CACHE_ROOT) is the render's measurement_env, never part of this.
    command = trial_command(spec, record.params, python="python")
    env = dict(command.env)
    for name in spec.server.secret_env:
        env.setdefault(name, "")
    return replace(command, env=env)


def _slo_lines(spec: StudySpec, record: TrialRecord) -> list[str]:
    """Comment lines on the study's SLO and the trial's max_rate@slo search (none without an
    SLO): what the exported configuration was measured to serve."""

    if spec.slo is None:
        return []
    lines = [f"#   slo: {spec.slo.text()}"]
    searched = record.attrs.get("outcome", {}).get("max_rate")
    if searched:
        lines.append(f"#   {max_rate_text(searched)}")
    return lines


def noise_notes(records: list[TrialRecord], labels: list[str], directions: list[str],
                record: TrialRecord) -> list[str]:
    """The ties noise leaves around an exported point (tuner.study.noise), as sentences."""

    noisy = [NoisyPoint(p.number, tuple(p.values), tuple(
        next(r for r in records if r.number == p.number).noise(labels).values()))
        for p in record_points(records, labels)]
    if not any(p.number == record.number for p in noisy):
        return []
    _, ties = noisy_front(noisy, directions, labels)
    return [tie_text(t) for t in ties if record.number in t.trials]


def _value_lines(record: TrialRecord) -> list[str]:
    """``#   label = value ± noise`` per objective, and a loud line for an unstable trial."""

    noise = record.noise(list(record.values))
    lines = [f"#   {k} = {plus_minus(float(v), noise.get(k), ' ± ')}"
             + (" (95 %)" if noise.get(k) is not None else "") for k, v in record.values.items()]
    if record.unstable_levels:
        lines.append("#   UNSTABLE: level(s) " + ", ".join(f"c={c}" for c in record.unstable_levels)
                     + " never met the stability rule; these numbers moved while measured")
    return lines


def render_export(spec: StudySpec, study_name: str, record: TrialRecord, fmt: str,
                  notes: list[str] | None = None) -> str:
    """The exported configuration in ``fmt``; ``notes``: ties noise leaves around it
    (:func:`noise_notes`), carried in the metadata."""
    command = _command(spec, record)
    secrets = tuple(n for n in command.env if is_secret_name(n) or n in spec.server.secret_env)
    meta = {
        "study": study_name,
        "trial": record.number,
        "outcome": record.outcome,
        "objectives": record.values,
        "noise": record.noise(list(record.values)),
        "unstable_levels": record.unstable_levels,
        "ties": list(notes or []),
        "params": record.params,
        "slo": None if spec.slo is None else spec.slo.model_dump(mode="json"),
        "max_rate": record.attrs.get("outcome", {}).get("max_rate"),
        "tuner_version": __version__,
        "exported_unix": int(time.time()),
    }
    if fmt == "shell":
        header = [f"# tuner export: study {study_name}, trial {record.number} ({record.outcome})"]
        header += _value_lines(record) + _slo_lines(spec, record) + [f"#   {n}" for n in notes or []]
        header.append(f"#   tuner {__version__}, {time.strftime('%Y-%m-%d %H:%M:%S')}")
        return "\n".join(header) + "\n" + shell_line(command, redact=secrets) + "\n"
    if fmt == "env":
        lines = [f"# tuner export: study {study_name}, trial {record.number}"]
        for name, value in command.env.items():
            lines.append(f"{name}=${{{name}}}" if name in secrets else f"{name}={shlex.quote(value)}")
        return "\n".join(lines) + "\n"
    if fmt == "json":
        env = {k: (f"${{{k}}}" if k in secrets else v) for k, v in command.env.items()}
        return json.dumps({"argv": command.argv, "env": env, **meta}, indent=2) + "\n"
    if fmt == "systemd":
        return _systemd_unit(study_name, record, command, secrets, _slo_lines(spec, record))
    if fmt == "yaml":
        return _config_yaml(spec, study_name, record, command, secrets)
    raise ExportError(f"unknown format {fmt!r}; formats: {', '.join(FORMATS)}")


def _config_yaml(spec: StudySpec, study: str, record: TrialRecord, command: RenderedCommand,
                 secrets: tuple[str, ...]) -> str:
    """A vLLM ``--config`` file: engine arguments only (vLLM reads no environment from it)."""

    mapping = {key.replace("_", "-"): value for key, value in command.args.items()}
    prefix = ["python" if w == PYTHON_PLACEHOLDER else w for w in spec.server.command]
    env_words = [f'{n}="${{{n}}}"' if n in secrets else f"{n}={shlex.quote(v)}" for n, v in command.env.items()]
    lines = [
        f"# tuner export: study {study}, trial {record.number} ({record.outcome})",
        *_value_lines(record),
        *_slo_lines(spec, record),
        f"#   tuner {__version__}, {time.strftime('%Y-%m-%d %H:%M:%S')}",
        "# Start with (the environment is part of the measured configuration):",
        "#   " + " ".join(env_words + [shlex.quote(w) for w in prefix] + ["--config", "THIS_FILE.yaml"]),
    ]
    return "\n".join(lines) + "\n" + yaml.safe_dump(mapping, sort_keys=False, default_flow_style=False)


def _systemd_word(word: str) -> str:
    """Quote one ExecStart/Environment word for systemd (not a shell: its own rules).

    systemd expands ``%`` specifiers and ``$VAR`` in ExecStart, so both are doubled;
    words with spaces or quotes are double-quoted with C-style escapes.
    """

    word = word.replace("%", "%%").replace("$", "$$")
    if word and not any(c in word for c in " \t\"'\\;"):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _systemd_unit(study: str, record: TrialRecord, command: RenderedCommand, secrets: tuple[str, ...],
                  slo_lines: list[str] | None = None) -> str:
    lines = [
        f"# tuner export: study {study}, trial {record.number} ({record.outcome})",
        *_value_lines(record),
        *(slo_lines or []),
        f"#   tuner {__version__}, {time.strftime('%Y-%m-%d %H:%M:%S')}",
        "[Unit]",
        f"Description=vLLM server (tuner study {study}, trial {record.number})",
        "After=network-online.target",
        "Wants=network-online.target",
        "",
        "[Service]",
        "Type=simple",
    ]
    for name, value in command.env.items():
        if name not in secrets:
            lines.append(f"Environment={_systemd_word(f'{name}={value}')}")
    if secrets:
        lines.append(f"# {', '.join(secrets)}: put them in the file below (NAME=value lines, mode 0600)")
        lines.append(f"EnvironmentFile=/etc/vllm/{study}.secrets")
    argv = list(command.argv)
    if argv and "/" not in argv[0]:
        argv = ["/usr/bin/env", *argv]  # ExecStart needs an absolute path or a PATH lookup
    lines += [
        "ExecStart=" + " ".join(_systemd_word(a) for a in argv),
        "Restart=on-failure",
        "RestartSec=10",
        # vLLM handles SIGTERM; its workers share the group, which control-group kill covers.
        "KillMode=control-group",
        "TimeoutStopSec=60",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ]
    return "\n".join(lines)


def summary(record: TrialRecord) -> dict[str, Any]:
    return {"trial": record.number, "values": record.values, "outcome": record.outcome}
