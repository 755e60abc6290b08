"""Whether a study's folder still says what was measured, and how status says it when not.

Three things can make the folder disagree with its own measurements:

- a damaged trial file (tuner.store.folder): a trial rebuilt from its files whose
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
  ``budget``, ``description``, ``execution`` (as ``spec_digest``) and ``server.port`` are
  not compared: how many trials, where they run and on which port (each GPU group's server
  listens on its own) is not what a trial measured.

A study created before that record was kept, or a folder copied without study.json, is
held to its trials' recorded commands instead (``command_changes``, tuner.study.
spec_guard): what the spec renders for a trial now must be what the trial ran.

Pure: the callers read the files.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from tuner.secrets import is_secret_name
from tuner.study.trials import KIND_DAMAGED, TrialRecord

__all__ = ["UNCHECKED", "saved_spec", "spec_changes", "spec_changed_text", "command_changes", "damaged_rows",
           "integrity_lines"]

UNCHECKED = ("budget", "description", "execution", "server.port")
_SHOWN_CHANGES = 8
_SHOWN_STRAY = 5
_VALUE_CHARS = 60
_ABSENT = object()    # a field one side does not have


def _canonical(data: Any) -> Any:
    """``data`` as JSON has it (tuples as lists, keys as strings), the form study.json
    keeps it in: a YAML mapping and its copy read back from JSON compare equal."""

    return json.loads(json.dumps(data, sort_keys=True, default=str))


def _measured(data: Any) -> Any:
    fields = _canonical(data)
    for dotted in UNCHECKED:
        *parents, leaf = dotted.split(".")
        node = fields
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
    return fields


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


def spec_changed_text(file: str, changes: Sequence[str], *,
                      measured_with: str = "the spec study.json recorded") -> str:
    """One line naming the edited spec.yaml and its changed fields."""

    shown = "; ".join(changes[:_SHOWN_CHANGES])
    more = f"; and {len(changes) - _SHOWN_CHANGES} more" if len(changes) > _SHOWN_CHANGES else ""
    return (f"{file} was edited after the study was created ({shown}{more}): its trials were measured "
            f"with {measured_with}, not with this one")


def _flags(argv: Sequence[str]) -> dict[str, list[str]]:
    """A command line as flag -> its words (``--flag=value`` too; the words before the
    first flag under ``(command)``)."""

    out: dict[str, list[str]] = {}
    key = "(command)"
    for word in argv:
        if word.startswith("--"):
            key, equals, inline = word.partition("=")
            out.setdefault(key, []).extend([inline] if equals else [])
        else:
            out.setdefault(key, []).append(word)
    return out


def command_changes(ran_argv: Sequence[str], ran_env: Mapping[str, str], argv: Sequence[str],
                    env: Mapping[str, str], *, ignore: Sequence[str] = ("--port",)) -> list[str]:
    """How a command rendered now (``argv``, the configuration's ``env``) differs from the
    one a trial ran, flag by flag and variable by variable; the interpreter (``argv[0]``)
    and the flags in ``ignore`` (each GPU group's own port) aside. The trial's environment
    also holds what the tuner adds to measure, so only the variables rendered now are
    compared."""

    before, after = _flags(ran_argv[1:]), _flags(argv[1:])
    out = []
    for flag in [*before, *(f for f in after if f not in before)]:
        if flag in ignore or before.get(flag) == after.get(flag):
            continue
        old = " ".join([flag, *before[flag]]) if flag in before else "(absent)"
        new = " ".join([flag, *after[flag]]) if flag in after else "(absent)"
        out.append(f"{old} -> {new}" if not is_secret_name(flag.lstrip("-")) else f"{flag}: (a secret; not shown)")
    for name, value in env.items():
        if ran_env.get(name) != value:
            out.append(f"{name}: (a secret; not shown)" if is_secret_name(name)
                       else f"{name}={ran_env.get(name, '(unset)')} -> {name}={value}")
    return out


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
                     + "; every other command refuses the study until spec.yaml is restored")
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
