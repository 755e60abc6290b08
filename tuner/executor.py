"""Run trials on Ray: one long-lived async actor per GPU group.

Each actor holds ``gpus_per_trial`` GPUs and ``cpus_per_trial`` CPUs as Ray resources
(declared on machines without GPUs), so Ray places at most one trial per group and as
many groups run at once as the cluster has. The driver never blocks on one trial: it
waits on all outstanding refs together, cancels a trial past its deadline (the actor's
``finally`` stops the server) and replaces an actor that died.
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import ActorDiedError, GetTimeoutError, RayActorError, TaskCancelledError

from tuner.worker import TrialWorker

__all__ = ["RayExecutor", "Finished", "init_ray"]

logger = logging.getLogger(__name__)


def init_ray(*, address: str | None, gpus_needed: int, cpus_needed: float) -> None:
    """Join a cluster, or start a local one declaring GPUs when the machine has none.

    On a CPU-only machine the GPUs are declared resources: Ray then schedules trials
    exactly as it would on a GPU box, which is what the simulator and CPU tests need.
    """

    if ray.is_initialized():
        return
    kwargs: dict[str, Any] = {
        "include_dashboard": False,
        "log_to_driver": False,
        "logging_level": logging.WARNING,
        "configure_logging": True,
    }
    if address:
        ray.init(address=address, **kwargs)
        return
    if shutil.which("nvidia-smi") is None and gpus_needed:
        kwargs["num_gpus"] = gpus_needed
    kwargs["num_cpus"] = max(2, int(cpus_needed + 0.999) + 1)
    ray.init(**kwargs)


@dataclass
class Finished:
    group: int
    request: dict[str, Any]
    result: dict[str, Any] | None
    error: str | None  # reason id when the actor could not return a result
    message: str = ""


@dataclass
class _Running:
    group: int
    request: dict[str, Any]
    ref: Any
    started: float
    deadline: float
    cancelled_at: float | None = None


class RayExecutor:
    def __init__(self, *, gpus_per_trial: int, cpus_per_trial: float, groups: int | None = None) -> None:
        self.gpus_per_trial = gpus_per_trial
        self.cpus_per_trial = cpus_per_trial
        self._requested_groups = groups
        self._actors: list[Any] = []
        self._running: dict[int, _Running] = {}

    @property
    def n_groups(self) -> int:
        return len(self._actors)

    def start(self) -> None:
        total_gpus = ray.cluster_resources().get("GPU", 0)
        possible = int(total_gpus // self.gpus_per_trial) if self.gpus_per_trial else 1
        if possible < 1:
            raise RuntimeError(
                f"the Ray cluster has {total_gpus:g} GPUs, fewer than server.gpus_per_trial="
                f"{self.gpus_per_trial}"
            )
        groups = min(self._requested_groups or possible, possible) if self.gpus_per_trial else (self._requested_groups or 1)
        self._actors = [self._new_actor(i) for i in range(groups)]
        logger.info("started %d trial worker(s)", groups)

    def _new_actor(self, group: int) -> Any:
        remote_cls = ray.remote(TrialWorker)
        return remote_cls.options(
            num_gpus=self.gpus_per_trial,
            num_cpus=self.cpus_per_trial,
            max_restarts=0,
            max_concurrency=4,  # run_trial plus describe() while a trial runs
        ).remote(group)

    def idle_groups(self) -> list[int]:
        return [g for g in range(len(self._actors)) if g not in self._running]

    def submit(self, group: int, request: dict[str, Any], *, deadline_s: float) -> None:
        ref = self._actors[group].run_trial.remote(request)
        now = time.monotonic()
        self._running[group] = _Running(group, request, ref, now, now + deadline_s)

    def running(self) -> list[dict[str, Any]]:
        return [r.request for r in self._running.values()]

    def poll(self, timeout_s: float, *, stop_grace_s: float) -> list[Finished]:
        """Wait up to ``timeout_s`` for trials; enforce deadlines; return those that ended."""

        if not self._running:
            time.sleep(min(timeout_s, 0.05))
            return []
        by_ref = {r.ref: r for r in self._running.values()}
        ready, _ = ray.wait(list(by_ref), num_returns=1, timeout=timeout_s)
        # Collect everything already finished, not only the first.
        if ready:
            more, _ = ray.wait(list(by_ref), num_returns=len(by_ref), timeout=0)
            ready = list(dict.fromkeys(ready + more))
        done: list[Finished] = []
        for ref in ready:
            run = by_ref[ref]
            del self._running[run.group]
            done.append(self._collect(run))
        now = time.monotonic()
        for run in list(self._running.values()):
            if run.cancelled_at is None and now > run.deadline:
                logger.warning("trial %s passed its deadline; cancelling", run.request.get("number"))
                ray.cancel(run.ref)
                run.cancelled_at = now
            elif run.cancelled_at is not None and now - run.cancelled_at > stop_grace_s + 30:
                # The actor did not come back from cancellation: kill and replace it.
                del self._running[run.group]
                self._replace(run.group)
                done.append(Finished(run.group, run.request, None, "trial_timeout",
                                     "trial deadline passed and its worker did not respond"))
        return done

    def _collect(self, run: _Running) -> Finished:
        try:
            result = ray.get(run.ref, timeout=60)
            return Finished(run.group, run.request, result, None)
        except TaskCancelledError:
            reason = "trial_timeout" if run.cancelled_at is not None and time.monotonic() > run.deadline else "interrupted"
            return Finished(run.group, run.request, None, reason, "trial cancelled")
        except (ActorDiedError, RayActorError) as exc:
            self._replace(run.group)
            return Finished(run.group, run.request, None, "worker_lost", f"trial worker died: {type(exc).__name__}")
        except GetTimeoutError:
            self._replace(run.group)
            return Finished(run.group, run.request, None, "worker_lost", "trial worker did not answer")

    def _replace(self, group: int) -> None:
        try:
            ray.kill(self._actors[group], no_restart=True)
        except Exception:  # the actor may already be gone; replacing it is what matters
            logger.debug("killing actor of group %d failed", group, exc_info=True)
        self._actors[group] = self._new_actor(group)

    def cancel_all(self, *, wait_s: float) -> list[Finished]:
        """Cancel every running trial and wait for the workers to stop their servers."""

        for run in self._running.values():
            ray.cancel(run.ref)
            run.cancelled_at = time.monotonic()
        finished: list[Finished] = []
        deadline = time.monotonic() + wait_s
        while self._running and time.monotonic() < deadline:
            by_ref = {r.ref: r for r in self._running.values()}
            ready, _ = ray.wait(list(by_ref), num_returns=len(by_ref), timeout=0.5)
            for ref in ready:
                run = by_ref[ref]
                del self._running[run.group]
                item = self._collect(run)
                if item.error == "trial_timeout":
                    item.error = "interrupted"
                finished.append(item)
        for run in list(self._running.values()):
            del self._running[run.group]
            finished.append(Finished(run.group, run.request, None, "interrupted", "stopped by the user"))
        return finished

    def shutdown(self) -> None:
        for actor in self._actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:
                logger.debug("killing an actor at shutdown failed", exc_info=True)
        self._actors = []
