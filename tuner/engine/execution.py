"""What the study loop needs from whatever runs its trials: the ``Executor`` protocol.

Two implementations: ``tuner.engine.ray_executor.RayExecutor`` (one long-lived actor per GPU group, a
real server per trial) and ``tuner.sim.executor.SimExecutor`` (the simulator's performance
model evaluated in-process, on simulated time: the benchmarks and the fast tests drive the
real loop and policy through it). The loop hands an executor a request as JSON-ready data
(``TrialRequest.model_dump(mode="json")``, the same bytes a Ray worker receives) and gets
back ``Finished`` items.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tuner.adapters.artifacts import StudyPaths
from tuner.study.outcome import TrialRequest
from tuner.study.spec import StudySpec

__all__ = ["Executor", "Finished", "NoWorkersLeft", "JobHost"]


class NoWorkersLeft(RuntimeError):
    """Every GPU group's worker kept dying: no trial can run."""


@dataclass
class Finished:
    """A job that ended: ``result`` is what its worker returned (a ``TrialOutcome`` as JSON,
    or the reference job's payload), or None with ``error`` (a reason id: ``worker_lost``,
    ``trial_timeout``, ``interrupted``, ...) when the worker could not return one."""

    group: int
    request: dict[str, Any]
    result: dict[str, Any] | None
    error: str | None
    message: str = ""


class Executor(Protocol):
    """Runs one job per GPU group at a time; the loop polls it for jobs that ended."""

    @property
    def n_groups(self) -> int:
        """GPU groups that can still run jobs."""
        ...

    def idle_groups(self) -> list[int]:
        """Groups ready for a job now."""
        ...

    def pending_groups(self) -> list[int]:
        """Groups whose worker is still starting (or waits for resources)."""
        ...

    def running(self) -> list[dict[str, Any]]:
        """The requests of the running jobs."""
        ...

    def submit(self, group: int, request: dict[str, Any], *, deadline_s: float,
               method: str = "run_trial") -> None:
        """Start ``method`` (``run_trial``, ``run_reference``) for ``request`` on ``group``;
        past ``deadline_s`` seconds the job is cancelled (``trial_timeout``)."""
        ...

    def poll(self, timeout_s: float, *, stop_grace_s: float) -> list[Finished]:
        """Wait up to ``timeout_s`` for jobs to end; the ones that did."""
        ...

    def cancel_all(self, *, wait_s: float, reason: str = "interrupted") -> list[Finished]:
        """Cancel every running job (servers stopped gracefully), waiting up to ``wait_s``."""
        ...

    def abandon_all(self, reason: str, message: str) -> list[Finished]:
        """Forget the running jobs now, their workers killed (the stop-now path)."""
        ...

    def kill_now(self, reason: str, message: str) -> list[Finished]:
        """Kill every running job's server at once (SIGKILL) and abandon the jobs."""
        ...


@dataclass
class JobHost:
    """What a job run beside the trial loop (the reference job, confirmation re-runs) needs
    from the study run that hosts it - and nothing else of it.

    ``request(number, values, group, folder)``: the TrialRequest (as the study's trials get
    it, probe and reference included, no early stop) for re-running ``values`` in
    ``folder``. ``interrupted()``: the first Ctrl-C came (stop gracefully).
    ``kill_now()``: the second one came (servers killed at once, jobs abandoned).
    """

    spec: StudySpec
    name: str
    paths: StudyPaths
    executor: Executor
    progress: Callable[[str], None]
    interrupted: Callable[[], bool]
    kill_now: Callable[[], list[Finished]]
    request: Callable[[int, dict[str, Any], int, Path], TrialRequest]
    run: str = ""   # the run's id (TrialRequest.run)
