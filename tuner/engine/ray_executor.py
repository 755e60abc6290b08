"""Run trials on Ray: one long-lived async actor per GPU group (``tuner.engine.execution.Executor``).

Each actor holds ``gpus_per_trial`` GPUs and ``cpus_per_trial`` CPUs as Ray resources
(declared on machines without GPUs), so Ray places at most one trial per group and as
many groups run at once as the cluster has. The driver never blocks on one trial: it
waits on all outstanding refs together (``ray.wait``), and

- a trial past its deadline is cancelled with ``ray.cancel``; on an async actor that is an
  ``asyncio.CancelledError`` inside ``run_trial``, whose handler stops the server before
  the ref resolves. The reason is sent first (``note_cancel``) because a cancel carries
  none. A worker that does not come back within the stop grace is killed and replaced;
- an actor that dies (worker process killed, node lost) fails its trial as
  ``worker_lost`` and is replaced; its server is stopped by the launcher's watchdog. A
  group is dispatched to only once its actor answered ``describe()``, so a replacement
  that Ray cannot place (its node is gone) waits instead of swallowing trials, and a group
  whose actor keeps dying at creation is retired.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import ray
from ray import ObjectRef
from ray.exceptions import (
    GetTimeoutError,
    NodeDiedError,
    ObjectLostError,
    RayActorError,
    RayError,
    RayTaskError,
    TaskCancelledError,
    WorkerCrashedError,
)

from tuner.engine import recovery
from tuner.engine.execution import Finished, NoWorkersLeft
from tuner.engine.worker import TrialWorker

__all__ = ["RayExecutor", "init_ray"]

logger = logging.getLogger(__name__)

SPARE_DISCARD_WAIT_S = 10.0  # at shutdown, for the workers to end their spare interpreters
NOTE_WAIT_S = 2.0  # how long the cancel reason may take to reach the actors
MAX_CREATION_FAILURES = 3  # actor deaths in a row before a group is given up


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
    # Ray starts its workers at nice 15 so that drivers keep priority, and every server a
    # trial worker starts would inherit it: on a busy host the server would then yield the
    # CPU to the load generator (nice 0) and the study would measure the scheduler. A
    # deployment's server runs at the default priority, so the trial workers do too.
    kwargs["_system_config"] = {"worker_niceness": 0}
    # "local", not None: with None, Ray joins whatever cluster the machine last started
    # (/tmp/ray/ray_current_cluster, or RAY_ADDRESS), e.g. someone else's `ray start`.
    # Joining a cluster is what --ray-address is for.
    with _loopback_only():
        ray.init(address="local", **kwargs)
    nodes = ray.nodes()  # type: ignore[no-untyped-call]  # (Ray's own annotations stop here)
    node = nodes[0].get("NodeManagerAddress") if nodes else None
    if node != LOOPBACK:
        logger.warning("the local Ray node runs on %s, not %s: its ports may be reachable from the "
                       "network", node, LOOPBACK)


LOOPBACK = "127.0.0.1"
# Ray's single-machine mode (the one it uses on macOS and Windows): the node's address is
# the loopback address, and Ray's gRPC servers (GCS, raylet, workers) then listen on it
# alone instead of on every interface. Read by every Ray process at import.
_SINGLE_MACHINE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


@contextlib.contextmanager
def _loopback_only() -> Iterator[None]:
    """While a local Ray starts: the processes it starts (GCS, raylet, agents, workers)
    inherit the single-machine switch through the environment, and this process - which
    imported Ray before - sees it through Ray's constant. Both are restored afterwards, so
    this process could still join a cluster later (its node address is fixed by then)."""

    from ray._private import ray_constants  # the module that read the switch at import

    previous_env = os.environ.get(_SINGLE_MACHINE_ENV)
    previous = ray_constants.ENABLE_RAY_CLUSTER
    os.environ[_SINGLE_MACHINE_ENV] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = previous
        if previous_env is None:
            os.environ.pop(_SINGLE_MACHINE_ENV, None)
        else:
            os.environ[_SINGLE_MACHINE_ENV] = previous_env


@dataclass
class _Running:
    group: int
    request: dict[str, Any]
    ref: Any
    started: float
    deadline: float
    cancelled_at: float | None = None
    cancel_reason: str | None = None


@dataclass
class _Group:
    index: int
    actor: Any
    ready_ref: Any | None  # describe() until the actor has answered once
    info: dict[str, Any] = field(default_factory=dict)
    deaths_in_a_row: int = 0
    retired: bool = False


class RayExecutor:
    def __init__(self, *, gpus_per_trial: int, cpus_per_trial: float, groups: int | None = None,
                 progress: Callable[[str], None] = lambda line: None,
                 server: dict[str, Any] | None = None,
                 accept: Callable[[dict[str, Any]], str | None] | None = None) -> None:
        """``server`` (the study's server section) makes each worker describe its node's
        environment; ``accept`` judges that description when the worker first answers and
        returns why the group must not run trials (None: it may). A refused group is
        retired; when none is left the study stops (NoWorkersLeft)."""

        self.gpus_per_trial = gpus_per_trial
        self.cpus_per_trial = cpus_per_trial
        self._requested_groups = groups
        self._groups: list[_Group] = []
        self._running: dict[int, _Running] = {}
        self.progress = progress
        self._server = server
        self._accept = accept

    @property
    def n_groups(self) -> int:
        return sum(1 for g in self._groups if not g.retired)

    def start(self) -> None:
        total_gpus = ray.cluster_resources().get("GPU", 0)  # type: ignore[no-untyped-call]
        possible = int(total_gpus // self.gpus_per_trial) if self.gpus_per_trial else 1
        if possible < 1:
            raise RuntimeError(
                f"the Ray cluster has {total_gpus:g} GPUs, fewer than server.gpus_per_trial="
                f"{self.gpus_per_trial}"
            )
        if self.gpus_per_trial:
            groups = min(self._requested_groups or possible, possible)
        else:
            groups = self._requested_groups or 1
        self._groups = [self._new_group(i) for i in range(groups)]
        logger.info("started %d trial worker(s)", groups)

    def _new_group(self, index: int, deaths_in_a_row: int = 0) -> _Group:
        remote_cls = ray.remote(TrialWorker)
        actor = remote_cls.options(
            num_gpus=self.gpus_per_trial,
            num_cpus=self.cpus_per_trial,
            max_restarts=0,
            max_concurrency=4,  # run_trial plus describe()/note_cancel() while a trial runs
        ).remote(index)
        # Ray types an actor's methods as the plain functions: .remote is added at run time.
        ready = actor.describe.remote(self._server)  # type: ignore[attr-defined]
        return _Group(index, actor, ready, deaths_in_a_row=deaths_in_a_row)

    # -- state ------------------------------------------------------------------

    def idle_groups(self) -> list[int]:
        return [g.index for g in self._groups
                if not g.retired and g.ready_ref is None and g.index not in self._running]

    def pending_groups(self) -> list[int]:
        """Groups whose actor has not answered yet (starting, or waiting for resources)."""

        return [g.index for g in self._groups if not g.retired and g.ready_ref is not None]

    def running(self) -> list[dict[str, Any]]:
        return [r.request for r in self._running.values()]

    def submit(self, group: int, request: dict[str, Any], *, deadline_s: float,
               method: str = "run_trial") -> None:
        """Start ``method`` (``run_trial``, or ``run_reference`` for the study's reference
        job) on the group's actor; deadlines, cancellation and a lost worker are handled
        alike for both."""

        ref = getattr(self._groups[group].actor, method).remote(request)
        now = time.monotonic()
        self._running[group] = _Running(group, request, ref, now, now + deadline_s)

    # -- waiting ----------------------------------------------------------------

    def poll(self, timeout_s: float, *, stop_grace_s: float) -> list[Finished]:
        """Wait up to ``timeout_s`` for trials or starting actors; enforce deadlines;
        return the trials that ended."""

        by_ref: dict[Any, Any] = {r.ref: r for r in self._running.values()}
        for g in self._groups:
            if g.ready_ref is not None and not g.retired:
                by_ref[g.ready_ref] = g
        if not by_ref:
            time.sleep(min(timeout_s, 0.05))
            return []
        refs = list(by_ref)
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout_s)
        if ready:  # collect everything already finished, not only the first
            more, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            ready = list(dict.fromkeys(ready + more))
        done: list[Finished] = []
        for ref in ready:
            item = by_ref[ref]
            if isinstance(item, _Group):
                self._on_actor_answer(item)
            else:
                del self._running[item.group]
                done.append(self._collect(item))
        done.extend(self._enforce_deadlines(stop_grace_s))
        return done

    def _on_actor_answer(self, group: _Group) -> None:
        ref, group.ready_ref = group.ready_ref, None
        try:
            group.info = ray.get(cast(ObjectRef[dict[str, Any]], ref), timeout=10)  # ready: returns at once
        except (RayActorError, WorkerCrashedError, NodeDiedError, ObjectLostError,
                GetTimeoutError) as exc:
            logger.warning("the trial worker of group %d died while starting: %s", group.index, exc)
            self._replace(group.index, died_starting=True)
            return
        group.deaths_in_a_row = 0
        info = group.info
        node = f" (node {info['node_id'][:12]})" if info.get("node_id") else ""
        refusal = self._accept(info) if self._accept is not None else None
        if refusal is not None:
            self._retire(group, f"[worker] group {group.index} on {info.get('host')}{node} refused: {refusal}",
                         f"every trial worker was refused: {refusal}")
            return
        self.progress(f"[worker] group {group.index} ready: pid {info.get('pid')} on {info.get('host')}{node}")
        niceness = info.get("niceness")
        if isinstance(niceness, int) and niceness > 0:
            self.progress(f"[worker] warning: group {group.index}'s servers run at nice {niceness} (the Ray "
                          f"cluster's worker niceness), below the load generator's priority: on a busy host "
                          f"they measure the scheduler; start the cluster with RAY_worker_niceness=0 "
                          f"(docs/ray-cluster.md)")

    def _retire(self, group: _Group, line: str, none_left: str) -> None:
        """Take ``group`` out of the study for good; NoWorkersLeft when it was the last."""

        try:
            ray.kill(group.actor, no_restart=True)
        except (RayError, ValueError):
            logger.debug("killing the actor of group %d failed", group.index, exc_info=True)
        group.retired = True
        self.progress(line)
        if self.n_groups == 0:
            raise NoWorkersLeft(none_left)

    def _enforce_deadlines(self, stop_grace_s: float) -> list[Finished]:
        now = time.monotonic()
        late = [r for r in self._running.values() if r.cancelled_at is None and now > r.deadline]
        if late:
            for run in late:
                logger.warning("trial %s passed its deadline; cancelling", run.request.get("number"))
            self._cancel(late, "trial_timeout")
        done = []
        for run in list(self._running.values()):
            if run.cancelled_at is not None and now - run.cancelled_at > stop_grace_s + 30:
                # The actor did not come back from cancellation: kill it (its watchdog
                # stops the server) and replace it.
                del self._running[run.group]
                self._replace(run.group)
                done.append(Finished(run.group, run.request, None, run.cancel_reason or "trial_timeout",
                                     "the trial was cancelled and its worker did not respond; "
                                     "the worker was replaced"))
        return done

    def _cancel(self, runs: list[_Running], reason: str) -> None:
        notes = []
        for run in runs:
            run.cancel_reason = reason
            run.cancelled_at = time.monotonic()
            number = int(run.request["number"])
            notes.append(self._groups[run.group].actor.note_cancel.remote(number, reason))
        # Best effort: a worker too busy to take the note still gets the cancel.
        ray.wait(notes, num_returns=len(notes), timeout=NOTE_WAIT_S)
        for run in runs:
            ray.cancel(run.ref)

    def _collect(self, run: _Running) -> Finished:
        number = run.request.get("number")
        try:
            result = ray.get(run.ref, timeout=60)  # ready: returns at once
            return Finished(run.group, run.request, result, None)
        except TaskCancelledError:
            reason = run.cancel_reason or "interrupted"
            return Finished(run.group, run.request, None, reason, f"trial cancelled by the tuner ({reason})")
        except (RayActorError, WorkerCrashedError, NodeDiedError, ObjectLostError,
                GetTimeoutError) as exc:
            info = self._groups[run.group].info
            where = f"pid {info.get('pid')} on {info.get('host')}" if info else "not yet described"
            self._replace(run.group)
            logger.warning("trial %s: worker of group %d lost: %s", number, run.group, exc)
            return Finished(run.group, run.request, None, "worker_lost",
                            f"the trial worker ({where}) was lost: {type(exc).__name__}")
        except RayTaskError as exc:  # run_trial turns every error into an outcome; a bug
            return Finished(run.group, run.request, None, "internal_error",
                            f"{type(exc).__name__}: {str(exc)[-2000:]}")

    def _replace(self, index: int, *, died_starting: bool = False) -> None:
        old = self._groups[index]
        try:
            ray.kill(old.actor, no_restart=True)
        except (RayError, ValueError):  # already gone; replacing it is what matters
            logger.debug("killing the actor of group %d failed", index, exc_info=True)
        deaths = old.deaths_in_a_row + 1 if died_starting else 0
        if deaths >= MAX_CREATION_FAILURES:
            self._retire(old, f"[worker] group {index} retired: its worker died {deaths} times while starting",
                         f"every trial worker died {MAX_CREATION_FAILURES} times while starting; see the "
                         "Ray logs (/tmp/ray/session_latest/logs)")
            return
        self._groups[index] = self._new_group(index, deaths)
        self.progress(f"[worker] group {index}: replacing its trial worker")

    # -- stopping ---------------------------------------------------------------

    def cancel_all(self, *, wait_s: float, reason: str = "interrupted") -> list[Finished]:
        """Cancel every running trial and wait (up to ``wait_s``) for the servers to stop."""

        if self._running:
            self._cancel(list(self._running.values()), reason)
        finished: list[Finished] = []
        deadline = time.monotonic() + wait_s
        while self._running and time.monotonic() < deadline:
            by_ref = {r.ref: r for r in self._running.values()}
            ready, _ = ray.wait(list(by_ref), num_returns=len(by_ref), timeout=0.5)
            for ref in ready:
                run = by_ref[ref]
                del self._running[run.group]
                finished.append(self._collect(run))
        finished.extend(self.abandon_all(reason, "the worker did not stop its trial in time"))
        return finished

    def abandon_all(self, reason: str, message: str) -> list[Finished]:
        """Forget the running trials now, killing their workers (stop-now path)."""

        out = []
        for run in list(self._running.values()):
            del self._running[run.group]
            try:
                ray.kill(self._groups[run.group].actor, no_restart=True)
            except (RayError, ValueError):
                logger.debug("killing the actor of group %d failed", run.group, exc_info=True)
            out.append(Finished(run.group, run.request, None, reason, message))
        return out

    def kill_now(self, reason: str, message: str) -> list[Finished]:
        """SIGKILL the server of every running job on this machine (each request names its
        folder, where the worker keeps the server's pid file) and abandon the jobs."""

        recovery.kill_servers_now([Path(r["trial_dir"]) / "server.pid" for r in self.running()])
        return self.abandon_all(reason, message)

    def shutdown(self) -> None:
        # Spares end with their worker anyway (end of their input); asked first, they are
        # gone before the run returns.
        with contextlib.suppress(RayError, ValueError):
            ray.wait([g.actor.discard_spare.remote() for g in self._groups], num_returns=len(self._groups),
                     timeout=SPARE_DISCARD_WAIT_S)
        for group in self._groups:
            try:
                ray.kill(group.actor, no_restart=True)
            except (RayError, ValueError):
                logger.debug("killing an actor at shutdown failed", exc_info=True)
        self._groups = []
