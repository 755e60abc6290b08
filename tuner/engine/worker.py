"""Run one trial end to end on the GPU group this worker owns.

start server -> wait until ready -> read back the applied configuration -> correctness
probe -> load sweep -> stop the whole process group -> confirm the GPUs are free.
The server is stopped on every path out, including cancellation from the driver: Ray
delivers ``ray.cancel`` to an async actor as ``asyncio.CancelledError`` inside
``run_trial``, and the stop below is shielded and re-awaited until it has finished even if
a second cancellation arrives while it runs.

``TrialWorker`` is a plain class so it can be tested without Ray; the Ray executor wraps
it as an async actor that holds the trial's GPUs and CPUs as Ray resources.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
import time
import traceback
from pathlib import Path
from typing import Any

from tuner.adapters import gpu
from tuner.adapters.artifacts import atomic_write_json, make_private_dir
from tuner.adapters.environment import current_environment
from tuner.adapters.launcher import ServerProcess
from tuner.engine.leftovers import clear_leftovers
from tuner.engine.prestart import SpareSlot, imports_ahead, note_settled, startup_seconds
from tuner.engine.quality_run import quality_gate, record_quality_reference
from tuner.engine.trial_energy import TrialEnergy, simulator_energy_env, worker_energy_refusal
from tuner.errors import ArtifactWriteError, GpusNotFree, ServerDied, TrialCancelled, TrialError, TrialTimeout
from tuner.load.record_files import write_records_jsonl
from tuner.load.results import level_key
from tuner.load.sweep import run_sweep
from tuner.probe.agreement import agreement_line
from tuner.probe.client import load_probe_items
from tuner.probe.known_score import ProbeResult
from tuner.probe.recording import ReferenceRecordError, load_reference_sources, record_reference
from tuner.probe.spec import ProbeSpec, mode_text
from tuner.probe.trial import reference_known_answers, run_trial_probe
from tuner.probe.verdict import validate_reference
from tuner.secrets import API_KEY_ENV, Redactor, api_key, bearer
from tuner.study.outcome import TrialOutcome, TrialRequest
from tuner.study.quality_plan import loosened_probe
from tuner.study.server_spec import ServerSpec
from tuner.study.sweep_guard import SweepGuard
from tuner.study.trial_metrics import ACCURACY_DROP, trial_metric_value
from tuner.study.weights import DUMMY
from tuner.vllm.log_digest import LogDigest
from tuner.vllm.verify import verify

__all__ = ["TrialWorker"]

STARTUP_LOG_POLL_S = 1.0  # how often a starting server's log is checked for a downgrade

logger = logging.getLogger(__name__)


def _default_priority() -> int:
    """This process's niceness (its servers inherit it), back to 0 where allowed: Ray runs
    workers at nice 15 unless RAY_worker_niceness=0, and only root may undo that."""
    with contextlib.suppress(OSError):
        if os.getpriority(os.PRIO_PROCESS, 0) > 0:
            os.setpriority(os.PRIO_PROCESS, 0, 0)
    return os.getpriority(os.PRIO_PROCESS, 0)


class TrialWorker:
    """Owns one GPU group; runs one trial at a time."""

    def __init__(self, group_index: int = 0) -> None:
        self.group_index = group_index
        self._server: ServerProcess | None = None
        self._began: float | None = None
        self._cancel_reasons: dict[int, str] = {}
        # What a reference job recorded, by request number, for run_reference to return
        # (run_trial's result is the outcome alone).
        self._jobs: dict[int, dict[str, Any]] = {}
        self._redactor = Redactor()
        self._headers: dict[str, str] = {}
        self._spares = SpareSlot()
        self.niceness = _default_priority()

    def describe(self, server: dict[str, Any] | None = None) -> dict[str, Any]:
        """Who this worker is (group, host, pid, Ray node, GPUs); with the study's ``server``
        section also its node's environment (tuner.study.environment), which a study on a
        Ray cluster compares with the one it pinned before this group gets a trial."""

        node = None
        with contextlib.suppress(ImportError, RuntimeError, AttributeError):
            import ray

            if ray.is_initialized():
                node = ray.get_runtime_context().get_node_id()
        info: dict[str, Any] = {
            "group": self.group_index,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "node_id": node,
            "gpus": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            "niceness": self.niceness,
        }
        if server is not None:
            try:
                info["environment"] = current_environment(ServerSpec.model_validate(server), cluster=True)
            except Exception as exc:
                info["environment"] = None
                info["environment_error"] = f"{type(exc).__name__}: {exc}"
            info["energy_unavailable"] = worker_energy_refusal(server.get("command") or [], info["gpus"])
        return info

    def discard_spare(self) -> None:
        """End the spare interpreter (execution.startup.prestart) before the worker goes."""
        self._spares.discard()

    def note_cancel(self, number: int, reason: str) -> None:
        """Why the driver is about to cancel trial ``number`` (ray.cancel carries no reason)."""

        self._cancel_reasons[number] = reason

    def server_tag(self, request: TrialRequest) -> str:
        """The tag every process of this group's servers carries (see launcher.TAG_VAR): the
        run's id in it keeps another run of a study of the same name on this host (another
        results folder or storage) from taking this run's servers for its own leftovers."""

        return f"{request.study}:{request.run}:{self.group_index}"

    async def run_trial(self, request_data: dict[str, Any]) -> dict[str, Any]:
        request = TrialRequest.model_validate(request_data)
        # Everything this job writes or returns goes through the redactor: the study's own
        # secrets and those passed through from this node's environment become ${REF}.
        # The API key every request to the server carries (readiness, probe, load), as the
        # server reads it: the study's, else VLLM_API_KEY from the environment it inherits.
        key = api_key(request.api_key_ref, request.secrets, {**os.environ, **request.env})
        self._headers = bearer(key)
        self._redactor = Redactor({**request.secrets,
                                   **{name: os.environ.get(name) for name in request.secret_env},
                                   request.api_key_ref or API_KEY_ENV: key})
        outcome = TrialOutcome(
            number=request.number, status="failed", host=socket.gethostname(),
            started_unix=time.time(),
        )
        began = self._began = time.monotonic()
        phase = "prepare"
        trial_dir = Path(request.trial_dir)
        cancelled = False
        try:
            async with asyncio.timeout(request.deadline_s):
                phase = "prepare"
                await self._prepare(request, trial_dir, outcome)
                # Early stop (study.early_stop): a trial that can no longer reach the front
                # skips what is left; the orchestrator tells it as stopped, never on the front.
                guard = SweepGuard(request.early_stop)
                phase = "start"
                waited = await self._start(request, trial_dir, guard, outcome)
                outcome.startup_s, outcome.start_wait_s = startup_seconds(waited, outcome.prestart)
                phase = "verify"
                self._verify(request, trial_dir, outcome)
                # Judged whether or not the probe runs: a knob not applied stops the trial
                # before any load too (stop_after("probe") has no verdict on it to give).
                applied_stop = guard.stop_after("verify", applied=outcome.applied)
                phase = "probe"
                if request.probe.enabled and not applied_stop:
                    await self._watch(self._probe(request, trial_dir, outcome))
                phase = "load"
                note_settled(outcome.prestart, await self._spares.settle())
                if not guard.stop_after("probe", probe_passed=outcome.probe_passed):
                    await self._watch(self._load(request, trial_dir, outcome, guard))
                outcome.early_stop = guard.record
                phase = "stop"
                outcome.status = "completed"
        except TimeoutError:
            err = TrialTimeout(f"trial exceeded its {request.deadline_s:.0f}s deadline in phase {phase}")
            self._fail(outcome, err, phase)
        except TrialError as err:
            self._fail(outcome, err, phase)
        except asyncio.CancelledError:
            # The driver cancelled (deadline backstop, Ctrl-C). Stop the server first, write
            # the outcome, then let the cancellation propagate so Ray reports it as such.
            cancelled = True
            current = asyncio.current_task()
            if current is not None:
                current.uncancel()
            reason = self._cancel_reasons.pop(request.number, None) or (
                "trial_timeout" if time.monotonic() - began >= request.deadline_s else "interrupted")
            self._fail(outcome, TrialCancelled(
                f"cancelled by the tuner ({reason}) in phase {phase}", reason=reason), phase)
        except Exception as exc:  # the actor boundary: any bug becomes a failed trial, not a lost study
            outcome.status = "failed"
            outcome.reason = "internal_error"
            outcome.message = f"{type(exc).__name__}: {exc}"
            outcome.phase = phase
            outcome.detected_unix = time.time()
            outcome.log_excerpt = traceback.format_exc()[-4000:]
        cancelled = await self._stop(request, outcome) or cancelled
        self._write_outcome(trial_dir, outcome, began)
        if cancelled:
            raise asyncio.CancelledError(f"trial {request.number} cancelled")
        return self._redactor.mapping(outcome.model_dump(mode="json"))

    async def run_reference(self, request_data: dict[str, Any]) -> dict[str, Any]:
        """The study's reference job: start the reference configuration like a trial,
        verify it, run the known-answer probe, record the reference and check it against
        itself, stop the server. No load is measured.

        Returns ``{"outcome": ..., "reference": ..., "known_answers": ..., "self_check":
        ..., "problem": ...}``; ``problem`` says why the reference must not be trusted
        (None: it can). The driver writes the study's reference files from it.
        """

        number = int(request_data["number"])
        self._jobs.pop(number, None)
        outcome = await self.run_trial(request_data)
        return {"outcome": outcome, **self._redactor.data(self._jobs.pop(number, {}))}

    # -- phases -----------------------------------------------------------------

    async def _prepare(self, request: TrialRequest, trial_dir: Path, outcome: TrialOutcome) -> None:
        try:
            make_private_dir(trial_dir)
        except OSError as exc:
            reason = "disk_full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else "artifact_write_failed"
            raise ArtifactWriteError(f"could not create {trial_dir}: {exc}", reason=reason) from exc
        # What the trial is to run, written first: a trial that never gets its GPUs still
        # says which configuration it was.
        env_record = dict(request.env)
        if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
            env_record["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]
        self._write_json(trial_dir / "command.json", {
            "argv": request.argv,
            "env": env_record,
            "asked": request.asked,
            "values": request.values,
            "host": socket.gethostname(),
        })
        # A previous trial's processes must be gone before the next server starts: first
        # the process tree (everywhere), then what nvidia-smi sees (where there is one).
        began = time.monotonic()
        await self._wait_group_free(request, outcome)
        # Bounded: the study's execution.gpu_free_timeout, else what is left of the stop
        # grace (a previous server's memory is released as its last process exits).
        limit = request.gpu_free_timeout_s
        if limit is None:
            limit = max(1.0, request.stop_timeout_s - (time.monotonic() - began))
        waiting = time.monotonic()
        try:
            waited, held = await gpu.wait_until_free(timeout_s=limit)
        except GpusNotFree:
            outcome.gpu_wait_s = round(time.monotonic() - waiting, 3)
            raise
        outcome.gpu_wait_s = round(waited, 3)
        if held:
            outcome.warnings.append(f"waited {waited:.1f}s for the GPUs to be free: {held.text()}")

    async def _wait_group_free(self, request: TrialRequest, outcome: TrialOutcome) -> None:
        """No process of an earlier server of this group may still run on this node.

        Normally the previous stop already made sure; this catches a server whose worker
        died (its watchdog may still be stopping it) and anything that escaped a stop.
        Those processes are ours by their tag, so after a grace they are killed.
        """

        killed = await clear_leftovers(self.server_tag(request), grace_s=request.stop_timeout_s + 5,
                                       group=self.group_index)
        if killed:
            outcome.warnings.append(f"killed processes left by an earlier server of this group: {killed}")

    async def _start(self, request: TrialRequest, trial_dir: Path, guard: SweepGuard | None,
                     outcome: TrialOutcome) -> float:
        env = dict(os.environ)
        env.update({**request.env, **simulator_energy_env(request.argv, request.trial_dir)})
        log_path = trial_dir / "server.log"
        with contextlib.suppress(FileNotFoundError):
            log_path.unlink()  # a retried trial starts a clean log
        self._server = ServerProcess(
            request.argv, env, log_path,
            host=request.host, port=request.port,
            served_model_name=request.served_model_name,
            pid_file=trial_dir / "server.pid",
            tag=self.server_tag(request),
            stop_grace_s=request.stop_timeout_s,
            redactor=self._redactor,
            headers=self._headers,
        )
        relayed, spare = bool(self._redactor), None
        if request.prestart:
            spare, outcome.prestart = self._spares.take(request.argv, self._server.env, relayed=relayed)
        self._server.start(spare)
        if request.prestart:   # the next server's imports overlap this one's start
            self._spares.start_next(request.argv, self._server.env, relayed=relayed, searched=request.searched_env)
        if guard is None or not guard.enabled:
            return await self._server.wait_ready(request.startup_timeout_s)
        # Early stop while starting: a downgrade the log already shows for good (see
        # vllm.verify.startup_mismatches) ends the start minutes before "ready".
        began = time.monotonic()
        ready = asyncio.ensure_future(self._server.wait_ready(request.startup_timeout_s))
        try:
            while True:
                done, _ = await asyncio.wait({ready}, timeout=STARTUP_LOG_POLL_S)
                if done:
                    return ready.result()
                # The reader wait_ready polls too: only what was appended since is read.
                if guard.stop_while_starting(request.asked, self._server.log.poll().effective()):
                    return time.monotonic() - began
        finally:
            if not ready.done():
                ready.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await ready

    def _verify(self, request: TrialRequest, trial_dir: Path, outcome: TrialOutcome) -> None:
        assert self._server is not None
        log = self._server.log.poll()
        effective = log.effective()
        # The shapes the server specialises for (CUDA-graph capture sizes) are what the
        # probe's prompt lengths and batch sizes must cover (tuner.probe.shapes).
        self._capture_sizes = list(effective.cudagraph_capture_sizes or [])
        self._boundaries = log.boundaries()
        result = verify(request.asked, effective)
        self._write_json(trial_dir / "effective_config.json", effective.model_dump(mode="json"))
        self._write_json(trial_dir / "verification.json", result.model_dump(mode="json"))
        outcome.applied = result.applied
        outcome.mismatches = [c.model_dump(mode="json") for c in result.mismatches()]
        outcome.parallel = result.parallel

    async def _probe(self, request: TrialRequest, trial_dir: Path, outcome: TrialOutcome) -> None:
        assert self._server is not None
        if request.kind == "reference":
            await self._record_reference(request, outcome)
            return
        # A lossy trial (request.quality): the corruption rule loosened, then the quality gate.
        spec, reference = loosened_probe(request.probe, request.quality), request.reference
        began = time.monotonic()
        # Both layers: known answers, then agreement with the study's reference (token
        # agreement to the first divergence, top-k there, teacher-forced prompt logprobs).
        result = await run_trial_probe(self._server.base_url, request.served_model_name, spec,
                                       reference=reference, sample_seed=request.number,
                                       capture_sizes=getattr(self, "_capture_sizes", []),
                                       boundaries=getattr(self, "_boundaries", []),
                                       deadline_s=self._remaining(request), headers=self._headers)
        if result.passed and request.quality is not None:
            outcome.quality = await quality_gate(self._server.base_url, request.served_model_name, spec,
                                                 request.quality, deadline_s=self._remaining(request),
                                                 headers=self._headers)
        outcome.probe_s = time.monotonic() - began
        outcome.probe_passed = result.passed
        outcome.probe_reason = result.reason
        coverage = [] if result.coverage is None else [result.coverage.short()]
        if (said := mode_text(spec, dummy_weights=request.asked.get("load_format") == DUMMY)) is not None:
            coverage.insert(0, said)
        outcome.probe_coverage = "; ".join(coverage) or None
        record = result.model_dump(mode="json")
        outcome.probe_agreement = agreement_line(record.get("reference"))
        self._write_json(trial_dir / "probe.json", record)

    async def _record_reference(self, request: TrialRequest, outcome: TrialOutcome) -> None:
        """Record the study's reference from this (reference-configuration) server and
        judge whether it can be trusted; the verdict goes into the job's result, not an
        exception, so the driver can save what was recorded next to why it was refused."""

        assert self._server is not None
        spec = request.probe
        began = time.monotonic()
        items = load_probe_items(spec)
        sources = load_reference_sources(spec, items=items)
        problems: list[str] = []
        known, reference, self_check = await self._record_bank_reference(request, spec, items, sources, problems)
        quality = None if request.quality is None or reference is None else await record_quality_reference(
            self._server.base_url, request.served_model_name, spec, request.quality,
            deadline_s=self._remaining(request), headers=self._headers)
        verdict = validate_reference(known, reference=reference, self_check=self_check,
                                     reference_only=spec.reference_only)
        if verdict is not None:
            problems.append(verdict)
        # A reference that silently kept graphs, compilation or a drafter could share the
        # very bug the trials are checked for.
        conservative = [m for m in outcome.mismatches
                        if str(m.get("target", "")).split(".")[0]
                        in ("enforce_eager", "compilation_config", "speculative_config")]
        if conservative:
            problems.append("the server did not apply the reference configuration as asked: " + "; ".join(
                f"{m.get('target')}: asked {m.get('asked')!r}, got {m.get('got')!r}" for m in conservative))
        outcome.probe_s = time.monotonic() - began
        outcome.probe_passed = not problems
        outcome.probe_reason = "; ".join(problems) if problems else "ok"
        self._jobs[request.number] = {
            "reference": None if reference is None else reference.model_dump(mode="json"),
            "known_answers": known.model_dump(mode="json"),
            "self_check": None if self_check is None else self_check.model_dump(mode="json"),
            "problem": outcome.probe_reason if problems else None,
            "quality": None if quality is None else quality.model_dump(mode="json"),
        }

    async def _record_bank_reference(self, request: TrialRequest, spec: ProbeSpec, items: list[Any],
                                     sources: list[Any], problems: list[str]) -> tuple[Any, Any, Any]:
        """Record the bank's pool (batched), judge the reference's own known answers from its
        record, then run a trial's probe against the reference itself: batch 1 vs N under the
        same numerics rule that judges trials (a reference that fails it would fail correct
        trials)."""
        assert self._server is not None
        url, served = self._server.base_url, request.served_model_name
        try:
            reference = await record_reference(url, served, spec, sources=sources,
                                               deadline_s=self._remaining(request), headers=self._headers)
        except ReferenceRecordError as exc:
            problems.append(str(exc))
            return ProbeResult.disabled(), None, None
        if spec.reference_only:  # dummy weights: nothing to hold their answers to
            known = ProbeResult.not_judged()
        else:
            known = reference_known_answers(spec, items, reference)
            reference = reference.model_copy(update={"known_answers_accuracy": known.accuracy})
        check = await run_trial_probe(url, served, spec, reference=reference, items=items,
                                      sample_seed=0, capture_sizes=getattr(self, "_capture_sizes", []),
                                      deadline_s=self._remaining(request), headers=self._headers)
        return known, reference, check

    async def _load(self, request: TrialRequest, trial_dir: Path, outcome: TrialOutcome,
                    guard: SweepGuard | None = None) -> None:
        assert self._server is not None
        if request.kind == "reference":
            return  # the reference job records answers; its speed is of no interest
        spec, began, guard = request.load, time.monotonic(), guard or SweepGuard(None)
        guard.trial_metrics = {"startup_s": outcome.startup_s, "probe_s": outcome.probe_s,
                               ACCURACY_DROP: trial_metric_value(outcome, ACCURACY_DROP)}
        slo = request.slo
        with TrialEnergy(request.argv, os.environ.get("CUDA_VISIBLE_DEVICES"), request.trial_dir) as energy:
            outcome.energy = await energy.record(measure_idle=request.idle_draw)
            sweep = await run_sweep(
                self._server.base_url, request.served_model_name, spec,
                ignore_eos=request.ignore_eos, deadline_s=self._remaining(request), headers=self._headers,
                levels=guard.levels(spec.concurrency), after_level=guard.after_level,
                inside_level=guard.inside_level if guard.enabled else None,
                slo=slo, max_rate=spec.rate_search if request.search_max_rate else None, holding=request.holding,
                # A miss near the boundary may be noise: the bound early stop uses is the search's
                # lowest miss widened by its precision (never stopped on a bound noise could cross).
                stop_search=(lambda levels, bound: guard.during_search(
                    levels, bound * (1 + spec.rate_search.precision))) if guard.enabled else None,
                energy=energy.source)
        outcome.warnings.extend(energy.notes)
        outcome.load_s = time.monotonic() - began
        for level in sweep.levels:
            key = str(level.concurrency)
            outcome.levels[key] = level.metrics.flat_json()
            if level.server_side is not None:
                outcome.server_side[key] = level.server_side
            write_records_jsonl(trial_dir / f"requests-c{level.concurrency}.jsonl", level.records)
        # Open-loop levels (load.request_rates, the trace, the max_rate@slo search's) by name
        # (r2.0, trace): objectives and limits read them with rate: <rate> or level: trace.
        for level in sweep.rate_levels:
            name = level_key(level)
            outcome.rate_levels[name] = level.metrics.flat_json()
            write_records_jsonl(trial_dir / f"requests-{name}.jsonl", level.records)
        if sweep.max_rate is not None:
            outcome.max_rate = sweep.max_rate.model_dump(mode="json")
        outcome.load_failures = sweep.load_failures()
        # A level stopped at its last dispatch (early stop rule 4a) has its objective measured:
        # its output tok/s is recorded so the trial is told with it, like any completed one.
        for key, level_values in guard.measured_levels(spec.noise_floor or 0.0).items():
            outcome.levels.setdefault(key, level_values)
        # What the intervals above carry for the noise between starts, so that readers can put
        # the study's current estimate in its place (tuner.study.between_starts).
        outcome.noise_floor = spec.noise_floor or 0.0
        outcome.warnings.extend(sweep.warnings)
        self._write_json(trial_dir / "metrics.json", sweep.summary())

    def _remaining(self, request: TrialRequest) -> float:
        assert self._began is not None
        return max(1.0, request.deadline_s - (time.monotonic() - self._began))

    async def _watch(self, work: Any) -> None:
        """Run ``work`` but fail at once if the server process dies meanwhile."""

        assert self._server is not None
        task = asyncio.ensure_future(work)
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=0.2)
                if not task.done():
                    self._raise_if_died(task)
            # Work against a dead server can end quickly on connection errors alone: a
            # server that exited meanwhile is the failure, not the empty measurement.
            self._raise_if_died(task)
            task.result()
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    def _raise_if_died(self, task: asyncio.Future[Any]) -> None:
        assert self._server is not None
        code = self._server.exit_code()
        if code is None:
            return
        task.cancel()
        raise ServerDied(
            f"server exited with code {code} during the trial",
            log_excerpt=self._server.log_excerpt(),
        )

    async def _stop(self, request: TrialRequest, outcome: TrialOutcome) -> bool:
        """Stop the server; True when a cancellation arrived meanwhile (re-raised later)."""

        server, self._server = self._server, None
        if server is None:
            return False
        stopping = asyncio.ensure_future(server.stop(request.stop_timeout_s))
        interrupted = False
        while True:
            try:
                report = await asyncio.shield(stopping)
                break
            except asyncio.CancelledError:
                # Leaving now would leave the server running: finish the stop first.
                interrupted = True
                current = asyncio.current_task()
                if current is not None:
                    current.uncancel()
        outcome.stop = {
            "signal": report.signal_used,
            "seconds": round(report.seconds, 3),
            "exit_code": report.exit_code,
            "leftover_pids": report.leftover_pids,
        }
        if report.leftover_pids:
            outcome.warnings.append(f"processes still alive after stop: {report.leftover_pids}")
        try:
            log = server.log.finish()   # the whole log now, the last line even without its newline
        except OSError as exc:
            for record in ("compile", "startup"):
                outcome.warnings.append(f"could not read the server log for the {record} record: {exc}")
            return interrupted
        self._record_compile(log, request, outcome)
        self._record_startup(log, server.first_line_s, request, outcome)
        return interrupted

    def _record_compile(self, log: LogDigest, request: TrialRequest, outcome: TrialOutcome) -> None:
        """What the server's log says about torch.compile and vLLM's compile cache (hit,
        miss, none, or unknown when the log stops before the engine was up), with compile,
        graph capture and init-engine seconds: ``compile_cache.json`` in the trial folder
        and ``outcome.compile`` (a trial user attribute through scoring.outcome_summary)."""

        record = log.compile_record().to_json()
        with contextlib.suppress(TrialError):   # a missing side file must not fail the trial
            self._write_json(Path(request.trial_dir) / "compile_cache.json", record)
        outcome.compile = record

    @staticmethod
    def _record_startup(log: LogDigest, first_line_s: float | None, request: TrialRequest,
                        outcome: TrialOutcome) -> None:
        """Where the start's time went, phase by phase, with the KV-cache size and the graph
        capture the log states (vllm.startup): ``startup.json`` in the trial folder and
        ``outcome.startup`` (a trial user attribute through scoring.outcome_summary)."""

        ahead = imports_ahead(outcome.prestart)
        if ahead is not None and first_line_s is not None:
            first_line_s += ahead   # the imports the spare did ahead are part of the start
        record = log.startup(first_line_s=first_line_s, ready_s=outcome.startup_s, overlapped_s=ahead).to_json()
        with contextlib.suppress(TrialError):   # a missing side file must not fail the trial
            atomic_write_json(Path(request.trial_dir) / "startup.json", record)
        outcome.startup = record

    # -- bookkeeping ---------------------------------------------------------------

    @staticmethod
    def _fail(outcome: TrialOutcome, err: TrialError, phase: str) -> None:
        outcome.status = "failed"
        outcome.reason = err.reason
        outcome.message = str(err)
        outcome.phase = phase
        outcome.detected_unix = time.time()
        outcome.log_excerpt = err.log_excerpt or None
        outcome.signature = err.signature

    def _write_json(self, path: Path, data: Any) -> None:
        atomic_write_json(path, self._redactor.data(data))

    def _write_outcome(self, trial_dir: Path, outcome: TrialOutcome, began: float) -> None:
        outcome.trial_s = time.monotonic() - began
        outcome.finished_unix = time.time()
        try:
            self._write_json(trial_dir / "outcome.json", outcome.model_dump(mode="json"))
        except TrialError as err:
            # The outcome still reaches the driver, which records it in the storage.
            outcome.warnings.append(str(err))
            if outcome.status == "completed":
                outcome.status = "failed"
                outcome.reason = err.reason
                outcome.message = str(err)
                outcome.phase = "stop"
                outcome.detected_unix = time.time()
