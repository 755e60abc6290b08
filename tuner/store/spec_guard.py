"""An edited spec.yaml is never read as the spec a study was measured with.

Every command that reads a study's saved spec (``store.open_existing``, ``folder.
open_for_reading``) holds it to what study.json recorded when the study was created
(``saved_spec``, compared by ``tuner.study.integrity.spec_changes``). A study without that
record (created by an earlier tuner, or a folder copied without study.json) is held to its
trials instead: what the spec renders for each trial's configuration now must be the
command that trial ran (its command.json). ``export`` checks the exported trial that way
too, whatever the study's age: the command it prints is the one that was measured.

Reads files; the comparisons are ``tuner.study.integrity``'s.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from tuner.adapters.artifacts import StudyPaths
from tuner.errors import StudyError
from tuner.secrets import public_spec
from tuner.study.integrity import command_changes, spec_changed_text, spec_changes
from tuner.study.safe_yaml import YamlInputError, load_bounded
from tuner.study.space import trial_command
from tuner.study.spec import StudySpec

__all__ = ["check_saved_spec", "trial_command_changes", "check_measured_command"]

logger = logging.getLogger(__name__)


def check_saved_spec(paths: StudyPaths, meta: dict[str, Any] | None, text: str, spec: StudySpec, *,
                     digest_matches: bool, refuse: bool) -> list[str]:
    """How spec.yaml (``text``, parsed as ``spec``) differs from what the study measured
    with, one change a line (empty: it does not).

    ``meta``: study.json (None: the folder has none); ``digest_matches``: its
    ``spec_digest`` is that of ``spec``, which settles an old study without a
    ``saved_spec`` record. ``refuse``: raise instead of returning changes. Without
    ``refuse`` (``tuner status``, which shows an edited study and says so) only the record
    is compared: the trials' commands are for the commands that use them.

    Raises:
        StudyError: with ``refuse``, one line naming spec.yaml, the changes and the ways on.
    """

    record = (meta or {}).get("saved_spec")
    if record is not None:
        try:
            changes = spec_changes(record, load_bounded(text)) or []
        except YamlInputError:
            changes = []        # parsed as ``spec`` already: cannot happen
    elif not refuse or (meta is not None and digest_matches):
        changes = []
    else:
        changes = _recorded_commands_changes(paths, spec)
        if not changes:
            logger.debug("%s has no saved_spec record; checked against the trials' commands", paths.root)
    if changes and refuse:
        measured_with = "the spec study.json recorded" if record is not None else "what their command.json says"
        raise StudyError(
            f"{spec_changed_text(str(paths.spec_yaml), changes, measured_with=measured_with)}. Nothing was read "
            "further: put the recorded "
            "values back in spec.yaml (`tuner status` still shows the study), or run the edited file as a new "
            "study (`tuner run FILE --study NEW_NAME`)")
    return changes


def _recorded_commands_changes(paths: StudyPaths, spec: StudySpec) -> list[str]:
    """The first trial whose recorded command the spec no longer renders, as changes."""

    for number in paths.trial_folders().numbers:
        changes = trial_command_changes(paths, spec, number)
        if changes:
            return [f"trial {number}'s command: " + "; ".join(changes)]
    return []


def trial_command_changes(paths: StudyPaths, spec: StudySpec, number: int) -> list[str]:
    """How the command ``spec`` renders for trial ``number``'s configuration differs from
    the one the trial ran (its command.json); empty when it does not, or when the trial
    has no readable command (a damaged file is named by the rebuild, tuner.store.folder)."""

    try:
        ran = json.loads((paths.trial_dir(number) / "command.json").read_text(encoding="utf-8"))
        values, argv, env = ran["values"], list(ran["argv"]), dict(ran.get("env") or {})
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        return []
    if not isinstance(values, dict):
        return []
    try:
        now = trial_command(public_spec(spec), values, python="python")
    except (KeyError, ValueError, TypeError) as exc:
        return [f"its configuration no longer renders ({type(exc).__name__}: {exc})"]
    return command_changes(argv, env, now.argv, now.env)


def check_measured_command(paths: StudyPaths, spec: StudySpec, number: int) -> None:
    """Refuse to export trial ``number`` when the spec would give another command than
    the one the trial ran.

    Raises:
        StudyError: one line naming the trial's command.json and each difference.
    """

    changes = trial_command_changes(paths, spec, number)
    if changes:
        raise StudyError(
            f"trial {number} was measured with another command than {paths.spec_yaml} gives now "
            f"({'; '.join(changes)}; the measured one is in {paths.trial_dir(number) / 'command.json'}): "
            "spec.yaml was edited after the study ran. Nothing was exported; put the recorded values back")
