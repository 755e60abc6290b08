"""Run one trial end to end on the GPU group this worker owns.

start server -> wait until ready -> read back the applied configuration -> correctness
probe -> load sweep -> stop the whole process group -> confirm the GPUs are free.
The server is stopped on every path out, including cancellation from the driver.

``TrialWorker`` is a plain class so it can be tested without Ray; the Ray executor wraps
it as an async actor that holds the trial's GPUs and CPUs as Ray resources.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import traceback
from pathlib import Path
from typing import Any

from tuner.adapters import gpu
from tuner.adapters.artifacts import atomic_write_json, redact_env
from tuner.adapters.launcher import ServerProcess
from tuner.adapters.loadgen import run_sweep, write_records_jsonl
from tuner.adapters.probe_client import run_probe
from tuner.core.effective_config import parse_effective_config
from tuner.core.load_spec import LoadSpec
from tuner.core.outcome import TrialOutcome, TrialRequest
from tuner.core.probe_spec import ProbeSpec
from tuner.core.verify import verify
from tuner.errors import ServerDied, TrialError, TrialTimeout

__all__ = ["TrialWorker"]

logger = logging.getLogger(__name__)


class TrialWorker:
    """Owns one GPU group; runs one trial at a time."""

    def __init__(self, group_index: int = 0) -> None:
        self.group_index = group_index
        self._server: ServerProcess | None = None
        self._began: float | None = None

    def describe(self) -> dict[str, Any]:
        return {
            "group": self.group_index,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "gpus": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
        }

    async def run_trial(self, request_data: dict[str, Any]) -> dict[str, Any]:
        request = TrialRequest.model_validate(request_data)
        outcome = TrialOutcome(
            number=request.number, status="failed", host=socket.gethostname(),
            started_unix=time.time(),
        )
        began = self._began = time.monotonic()
        phase = "prepare"
        trial_dir = Path(request.trial_dir)
        try:
            async with asyncio.timeout(request.deadline_s):
                phase = "prepare"
                await self._prepare(request, trial_dir)
                phase = "start"
                outcome.startup_s = await self._start(request, trial_dir)
                phase = "verify"
                self._verify(request, trial_dir, outcome)
                phase = "probe"
                if request.probe.get("enabled", True):
                    await self._watch(self._probe(request, trial_dir, outcome))
                phase = "load"
                await self._watch(self._load(request, trial_dir, outcome))
                phase = "stop"
                outcome.status = "completed"
        except TimeoutError:
            err = TrialTimeout(f"trial exceeded its {request.deadline_s:.0f}s deadline in phase {phase}")
            self._fail(outcome, err, phase)
        except TrialError as err:
            self._fail(outcome, err, phase)
        except asyncio.CancelledError:
            # The driver cancelled (deadline, Ctrl-C): stop the server, then let it propagate.
            await self._stop(request, outcome)
            self._write_outcome(trial_dir, outcome, "cancelled", began)
            raise
        except Exception as exc:  # the actor boundary: any bug becomes a failed trial, not a lost study
            outcome.status = "failed"
            outcome.reason = "internal_error"
            outcome.message = f"{type(exc).__name__}: {exc}"
            outcome.phase = phase
            outcome.log_excerpt = traceback.format_exc()[-4000:]
        await self._stop(request, outcome)
        self._write_outcome(trial_dir, outcome, None, began)
        return outcome.model_dump(mode="json")

    # -- phases -----------------------------------------------------------------

    async def _prepare(self, request: TrialRequest, trial_dir: Path) -> None:
        trial_dir.mkdir(parents=True, exist_ok=True)
        # A previous trial's processes must be gone before the next server starts.
        await gpu.wait_until_free(timeout_s=request.stop_timeout_s)
        env_record = dict(request.env)
        if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
            env_record["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]
        atomic_write_json(trial_dir / "command.json", {
            "argv": request.argv,
            "env": redact_env(env_record, request.secret_env),
            "asked": request.asked,
            "values": request.values,
            "host": socket.gethostname(),
        })

    async def _start(self, request: TrialRequest, trial_dir: Path) -> float:
        env = dict(os.environ)
        env.update(request.env)
        log_path = trial_dir / "server.log"
        with contextlib.suppress(FileNotFoundError):
            log_path.unlink()  # a retried trial starts a clean log
        self._server = ServerProcess(
            request.argv, env, log_path,
            host=request.host, port=request.port,
            served_model_name=request.served_model_name,
            pid_file=trial_dir / "server.pid",
        )
        self._server.start()
        return await self._server.wait_ready(request.startup_timeout_s)

    def _verify(self, request: TrialRequest, trial_dir: Path, outcome: TrialOutcome) -> None:
        assert self._server is not None
        effective = parse_effective_config(self._server.log_text())
        result = verify(request.asked, effective)
        atomic_write_json(trial_dir / "effective_config.json", effective.model_dump(mode="json"))
        atomic_write_json(trial_dir / "verification.json", result.model_dump(mode="json"))
        outcome.applied = result.applied
        outcome.mismatches = [c.model_dump(mode="json") for c in result.mismatches()]

    async def _probe(self, request: TrialRequest, trial_dir: Path, outcome: TrialOutcome) -> None:
        assert self._server is not None
        spec = ProbeSpec.model_validate(request.probe)
        began = time.monotonic()
        result = await run_probe(self._server.base_url, request.served_model_name, spec,
                                 deadline_s=self._remaining(request))
        outcome.probe_s = time.monotonic() - began
        outcome.probe_passed = result.passed
        outcome.probe_reason = result.reason
        atomic_write_json(trial_dir / "probe.json", result.model_dump(mode="json"))

    async def _load(self, request: TrialRequest, trial_dir: Path, outcome: TrialOutcome) -> None:
        assert self._server is not None
        spec = LoadSpec.model_validate(request.load)
        began = time.monotonic()
        sweep = await run_sweep(
            self._server.base_url, request.served_model_name, spec,
            ignore_eos=request.ignore_eos, deadline_s=self._remaining(request),
        )
        outcome.load_s = time.monotonic() - began
        for level in sweep.levels:
            key = str(level.concurrency)
            # NaN marks "no sample" in metrics; JSON and the Optuna storage want null.
            outcome.levels[key] = {k: (None if v != v else v) for k, v in level.metrics.flat().items()}
            if level.server_side is not None:
                outcome.server_side[key] = level.server_side
            write_records_jsonl(trial_dir / f"requests-c{level.concurrency}.jsonl", level.records)
        outcome.warnings.extend(sweep.warnings)
        atomic_write_json(trial_dir / "metrics.json", sweep.summary())

    def _remaining(self, request: TrialRequest) -> float:
        assert self._began is not None
        return max(1.0, request.deadline_s - (time.monotonic() - self._began))

    async def _watch(self, work: Any) -> None:
        """Run ``work`` but fail at once if the server process dies meanwhile."""

        assert self._server is not None
        task = asyncio.ensure_future(work)
        try:
            while not task.done():
                done, _ = await asyncio.wait({task}, timeout=0.2)
                if done:
                    break
                code = self._server.exit_code()
                if code is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
                    raise ServerDied(
                        f"server exited with code {code} during the trial",
                        log_excerpt=self._server.log_excerpt(),
                    )
            task.result()
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _stop(self, request: TrialRequest, outcome: TrialOutcome) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        report = await asyncio.shield(server.stop(request.stop_timeout_s))
        outcome.stop = {
            "signal": report.signal_used,
            "seconds": round(report.seconds, 3),
            "exit_code": report.exit_code,
            "leftover_pids": report.leftover_pids,
        }
        if report.leftover_pids:
            outcome.warnings.append(f"processes still alive after stop: {report.leftover_pids}")

    # -- bookkeeping ---------------------------------------------------------------

    @staticmethod
    def _fail(outcome: TrialOutcome, err: TrialError, phase: str) -> None:
        outcome.status = "failed"
        outcome.reason = err.reason
        outcome.message = str(err)
        outcome.phase = phase
        outcome.log_excerpt = err.log_excerpt or None

    @staticmethod
    def _write_outcome(trial_dir: Path, outcome: TrialOutcome, cancelled: str | None, began: float) -> None:
        outcome.trial_s = time.monotonic() - began
        outcome.finished_unix = time.time()
        if cancelled:
            outcome.status = "failed"
            outcome.reason = outcome.reason or cancelled
        try:
            atomic_write_json(trial_dir / "outcome.json", outcome.model_dump(mode="json"))
        except TrialError as err:
            # The outcome still reaches the driver, which records it in the storage.
            outcome.warnings.append(str(err))
            if outcome.status == "completed":
                outcome.status = "failed"
                outcome.reason = err.reason
                outcome.message = str(err)
                outcome.phase = "stop"
