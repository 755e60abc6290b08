"""Whether a study's folder still says what was measured, and how status says it when not.

Three things can make the folder disagree with its own measurements:

- a damaged trial file (tuner.study.folder): a trial rebuilt from its files whose
  outcome.json or command.json cannot be read is a ``KIND_DAMAGED`` trial, named, never a
  silent gap (``damaged_rows``);
- a numbered folder in ``trials/`` that is not one of the study's trials
  (tuner.study.trial_folders), left out and named;
- an edited ``spec.yaml``. The study records in study.json what its spec.yaml held when
  it was created (``saved_spec``: the fields and their digest); a reader compares the file
  with that record (``spec_changes``). The record is of the file's own data, not of the
  spec model: a newer tuner that adds a field with a default reads the same file as an
  older one did, and must not take that for an edit (the model-based ``spec_digest`` of
  every committed example study differs from what it recorded, for that reason alone).
  ``budget``, ``description`` and ``execution`` are not compared (as ``spec_digest``):
  how many trials and where they run is not what a trial measured.

Pure: the callers read the files.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from tuner.secrets import is_secret_name
from tuner.study.trials import KIND_DAMAGED, TrialRecord

__all__ = ["UNCHECKED", "saved_spec", "spec_changes", "spec_changed_text", "damaged_rows", "integrity_lines"]

UNCHECKED = ("budget", "description", "execution")
_SHOWN_CHANGES = 8
_SHOWN_STRAY = 5
_VALUE_CHARS = 60
_ABSENT = object()    # a field one side does not have


def _canonical(data: Any) -> Any:
    """``data`` as JSON has it (tuples as lists, keys as strings), the form study.json
    keeps it in: a YAML mapping and its copy read back from JSON compare equal."""

    return json.loads(json.dumps(data, sort_keys=True, default=str))


def _measured(data: Any) -> Any:
    if not isinstance(data, Mapping):
        return _canonical(data)
    return _canonical({k: v for k, v in data.items() if k not in UNCHECKED})


def _digest(fields: Any) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def saved_spec(data: Any) -> dict[str, Any]:
    """What study.json records of a spec.yaml whose loaded YAML is ``data``."""

    fields = _measured(data)
    return {"digest": _digest(fields), "fields": fields}


def spec_changes(record: Any, data: Any) -> list[str] | None:
    """How spec.yaml (loaded as ``data``) differs from study.json's ``record``
    (``saved_spec``), one ``field: old -> new`` per change; None when there is no record
    to compare with (a study created before the record was kept)."""

    if not isinstance(record, Mapping) or "digest" not in record:
        return None
    now = _measured(data)
    if _digest(now) == record["digest"]:
        return []
    changes: list[str] = []
    _differences("", record.get("fields"), now, changes)
    # A record whose fields were lost (or edited) and no longer match its own digest:
    # the digest still says the file changed.
    return changes or [f"the spec's digest {record['digest']} -> {_digest(now)}"]


def _differences(path: str, old: Any, new: Any, out: list[str]) -> None:
    if old == new:
        return
    if isinstance(old, dict) and isinstance(new, dict):
        for key in [*old, *(k for k in new if k not in old)]:
            _differences(f"{path}.{key}" if path else str(key), old.get(key, _ABSENT), new.get(key, _ABSENT), out)
        return
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new)):
            _differences(f"{path}[{i}]", a, b, out)
        return
    hidden = any(is_secret_name(part) for part in path.replace("[", ".").split("."))
    out.append(f"{path}: " + ("(a secret's value; not shown)" if hidden else f"{_shown(old)} -> {_shown(new)}"))


def _shown(value: Any) -> str:
    if value is _ABSENT:
        return "(absent)"
    text = json.dumps(value, default=str)
    return text if len(text) <= _VALUE_CHARS else text[:_VALUE_CHARS - 3] + "..."


def spec_changed_text(file: str, changes: Sequence[str]) -> str:
    """One line naming the edited spec.yaml and its changed fields."""

    shown = "; ".join(changes[:_SHOWN_CHANGES])
    more = f"; and {len(changes) - _SHOWN_CHANGES} more" if len(changes) > _SHOWN_CHANGES else ""
    return (f"{file} was edited after the study was created ({shown}{more}): its trials were measured "
            "with the spec study.json recorded, not with this one")


def damaged_rows(records: Sequence[TrialRecord]) -> list[dict[str, Any]]:
    """Each damaged trial: its number, the file, what is wrong with it, where it was set
    aside and the trial that measures its configuration again (None: not yet, or never)."""

    again = {r.attrs.get("remeasure_of"): r.number for r in records if r.attrs.get("remeasure_of") is not None}
    rows = []
    for r in records:
        if r.kind != KIND_DAMAGED:
            continue
        damage = r.attrs.get("damaged") or {}
        rows.append({"trial": r.number, "file": damage.get("file"), "reason": damage.get("reason"),
                     "kept_as": damage.get("kept_as"), "params": damage.get("values"),
                     "remeasured_as": again.get(r.number)})
    return rows


def integrity_lines(status: Mapping[str, Any]) -> list[str]:
    """Status lines, loud, for an edited spec.yaml, damaged trial files and stray folders."""

    lines = []
    if status.get("spec_changes"):
        lines.append("  !! " + spec_changed_text("spec.yaml", status["spec_changes"])
                     + "; export, report and resume refuse the study until it is restored")
    for row in status.get("damaged") or []:
        line = f"  !! trial {row['trial']} not counted: {row['file']} {row['reason']}"
        if row.get("kept_as") is None:
            line += f"; `tuner resume {status['study']}` sets it aside and measures the configuration again"
        elif row.get("remeasured_as") is not None:
            line += f"; set aside as {row['kept_as']}, measured again as trial {row['remeasured_as']}"
        else:
            line += f"; set aside as {row['kept_as']}" + ("" if row.get("params") is not None
                                                          else ", its configuration unknown")
        lines.append(line)
    stray = status.get("stray_folders") or []
    if stray:
        shown = "; ".join(f"{s['folder']}: {s['reason']}" for s in stray[:_SHOWN_STRAY])
        more = f"; and {len(stray) - _SHOWN_STRAY} more" if len(stray) > _SHOWN_STRAY else ""
        lines.append(f"  !! not read as trials: {shown}{more}")
    return lines
