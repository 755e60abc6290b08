"""A worker's spare interpreter across its trials (``execution.startup.prestart``).

The order, per trial: :meth:`SpareSlot.take` hands the spare to the server about to start when
it may run it (else discards it and says why); right after that server is launched,
:meth:`SpareSlot.start_next` starts the next trial's spare, so its imports overlap this
server's start; before the first load level :meth:`SpareSlot.settle` waits until those
imports are done, so a spare never competes with a measurement for the host's CPUs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection, Mapping
from typing import Any

from tuner.adapters.launcher import TAG_VAR
from tuner.adapters.spare import Spare, spare_target

__all__ = ["SpareSlot", "SETTLE_TIMEOUT_S", "SPARE_TAG_SUFFIX"]

logger = logging.getLogger(__name__)

SPARE_TAG_SUFFIX = ":spare"
SETTLE_TIMEOUT_S = 300.0  # imports that take longer are abandoned before a level measures


class SpareSlot:
    """At most one spare per worker; every method is safe to call with none."""

    def __init__(self) -> None:
        self.spare: Spare | None = None
        self.off: str | None = None   # why no more spares are started in this worker

    def take(self, argv: list[str], env: Mapping[str, str], *, relayed: bool) -> tuple[Spare | None, dict[str, Any]]:
        """(the spare this server may become or None, what the trial records about it)."""

        spare, self.spare = self.spare, None
        if spare is None:
            return None, {"used": False, "reason": self.off or "no spare was ready (the first server of this worker)"}
        target = spare_target(argv)
        status = spare.status() or {}
        if status.get("cuda_initialized"):
            self.off = "the spare's imports initialised CUDA (it left at once); servers start cold"
        reason = ("the server's output goes through the secrets relay" if relayed
                  else "the server command is not [PYTHON, -m, MODULE]" if target is None
                  else spare.refusal(target[0], target[1], env))
        if reason is not None:
            spare.discard()
            return None, {"used": False, "reason": reason}
        return spare, {"used": True, "import_s": status.get("import_s"), "imported": status.get("imported"),
                       "failed_imports": sorted(status.get("failed") or {})}

    def start_next(self, argv: list[str], env: Mapping[str, str], *, relayed: bool,
                   searched: Collection[str] = ()) -> None:
        """Start the next server's spare (one like this server, without the ``searched``
        variables, which the next trial sets at release) unless spares cannot serve."""

        target = spare_target(argv)
        if self.off is not None or relayed or target is None:
            return
        self.discard()
        # Its own tag until released: the stop of the server now starting, which ends every
        # process with the group's tag, must not take the next server's interpreter with it.
        # (It ends itself when the worker goes: end of its input.)
        own = {k: v for k, v in env.items() if k not in searched}
        own[TAG_VAR] = f"{env.get(TAG_VAR, '')}{SPARE_TAG_SUFFIX}"
        spare = Spare(python=target[0], module=target[1], env=own, ignored=(TAG_VAR,))
        try:
            spare.spawn()
        except OSError as exc:
            self.off = f"the spare could not be started: {exc}"
            logger.warning("prestart off: %s", self.off)
            return
        self.spare = spare

    async def settle(self, timeout_s: float = SETTLE_TIMEOUT_S) -> dict[str, Any] | None:
        """Wait until the spare's imports are done (or it died); a spare still importing after
        ``timeout_s`` is discarded. Returns what the trial records (None: no spare)."""

        spare = self.spare
        if spare is None:
            return None
        began = time.monotonic()
        while spare.alive() and spare.status() is None:
            if time.monotonic() - began >= timeout_s:
                break
            await asyncio.sleep(0.1)
        waited = round(time.monotonic() - began, 3)
        if spare.status() is None:
            code = spare.process.poll() if spare.process is not None else None
            why = (f"it exited with code {code} before its imports were done" if code is not None
                   else "its imports were not done before the load")
            self.discard()
            return {"waited_s": waited, "discarded": why}
        return {"waited_s": waited}

    def discard(self) -> None:
        spare, self.spare = self.spare, None
        if spare is not None:
            spare.discard()



def imports_ahead(note: dict[str, Any] | None) -> float | None:
    """Seconds of imports a spare did before it became the trial's server; None: no spare."""

    if not note or not note.get("used") or note.get("import_s") is None:
        return None
    return float(note["import_s"])


def startup_seconds(waited: float, note: dict[str, Any] | None) -> tuple[float, float | None]:
    """(startup_s, start_wait_s) of a start the trial waited ``waited`` seconds for: a spare's
    imports count in the start (a deployment pays them) but not in the wait."""

    ahead = imports_ahead(note)
    return (waited, None) if ahead is None else (waited + ahead, waited)


def note_settled(note: dict[str, Any] | None, settled: dict[str, Any] | None) -> None:
    """Add how long the trial waited for the next spare's imports to ``note``."""

    if note is not None and settled is not None:
        note["next_spare"] = settled
