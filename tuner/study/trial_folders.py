"""Which entries of a study's ``trials/`` folder are that study's trials.

A trial's folder is named by its number, four digits at least (``trials/0007``), and holds
what its worker wrote (``command.json`` first, ``outcome.json`` last). Anything else with a
number for a name is not one of the study's trials: a ``mkdir trials/5000000``, a backup
named ``20261206``, a hand-made ``trials/7``. Read as trials, such a folder made the
rebuild of a study from its files create one placeholder per number up to it (5.4 GB and
no answer in 120 s for ``5000000``), so it is named as stray and left out.

Trial numbers run without gaps in the storage, but not every number has a folder: a
proposal that never ran (a duplicate, a forbidden point) has none. A run stops after
``policy.EXHAUSTED_AFTER`` (100) such proposals in a row, so a run leaves no longer gap
than that; ``MAX_GAP`` allows ten runs of them back to back (an exhausted study resumed
again and again) before a folder counts as too far beyond the one before it. That also
bounds what a rebuild allocates: at most ``MAX_GAP`` placeholders per trial folder.

Pure, and light: `tuner status` lists the folder through it without importing the policy
(and with it pydantic), so the bound is written out here; a test holds it to the policy's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["MAX_GAP", "TRIAL_FILES", "DAMAGED_SUFFIX", "Stray", "TrialFolders", "looks_numbered", "sort_out"]

MAX_GAP = 1000
# A trial folder holds at least one of these, or one of them set aside as damaged by a
# resume (tuner.store.folder): ``outcome.json.damaged-20261207T031500``.
TRIAL_FILES = ("command.json", "outcome.json")
DAMAGED_SUFFIX = ".damaged-"
_NUMBERED = re.compile(r"[0-9]+")


def looks_numbered(name: str) -> bool:
    """An entry whose name is a number (ASCII digits only: ``int`` would also read other
    scripts' digits), so a person could take it for a trial."""

    return _NUMBERED.fullmatch(name) is not None


@dataclass(frozen=True)
class Stray:
    """A numbered entry of ``trials/`` that is not one of the study's trials, and why."""

    name: str
    reason: str

    def as_dict(self) -> dict[str, str]:
        return {"folder": f"trials/{self.name}", "reason": self.reason}


@dataclass
class TrialFolders:
    numbers: list[int] = field(default_factory=list)    # the study's trial folders, ascending
    stray: list[Stray] = field(default_factory=list)    # in name order


def sort_out(entries: Iterable[tuple[str, bool]]) -> TrialFolders:
    """The study's trial folders among ``entries``: (name, holds trial files) for each
    numbered folder in ``trials/`` (``looks_numbered``); the rest as stray, each with its
    reason."""

    out = TrialFolders()
    candidates: list[tuple[int, str]] = []
    for name, holds_files in entries:
        number = int(name)
        if name != f"{number:04d}":
            out.stray.append(Stray(name, f"named like no trial folder (trial {number}'s would be {number:04d})"))
        elif not holds_files:
            out.stray.append(Stray(name, "holds no trial files (" + " or ".join(TRIAL_FILES) + ")"))
        else:
            candidates.append((number, name))
    previous = -1
    for number, name in sorted(candidates):
        if number - previous - 1 > MAX_GAP:
            past = f"trial {previous}'s folder" if previous >= 0 else "the start, with no trial folder"
            out.stray.append(Stray(name, f"{number - previous - 1:,} numbers past {past}; a study leaves "
                                         f"at most {MAX_GAP:,} numbers in a row without a folder"))
            continue
        out.numbers.append(number)
        previous = number
    out.stray.sort(key=lambda s: (len(s.name), s.name))
    return out
