"""One load level sharded over several client processes.

When one core cannot parse the chunks a server streams (benchmarks/client_capacity.py
measures where that is), the C streams of a level are split over N processes, each with
its own event loop and connections:

* every shard gets the whole plan and runs ``C/N`` (±1) closed-loop streams; the next
  plan position is taken from one counter shared by all shards (a file under an
  ``flock``), so requests are issued in plan order across shards and no shard idles
  while another still has a backlog;
* record times are relative to one ``t0`` on CLOCK_MONOTONIC (``time.monotonic()``,
  system-wide on Linux), so the merged records share one time base: shards are started,
  report ready (imports done), and only then is ``t0`` taken and sent to all of them;
* the deadline is judged by every shard against that same ``t0``.

Shards are ``python -m tuner.load.shards`` children started with asyncio's
subprocess API (no ``multiprocessing``: it would re-import the parent's ``__main__``,
which inside a Ray worker is Ray's own), in their own process group, and killed with it if
the level is cancelled. The protocol runs over the child's stdin/stdout (length-prefixed
pickles); the child points its own ``sys.stdout`` at stderr so that nothing printed by a
library can corrupt it.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import pickle
import signal
import struct
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from tuner.load.loop_lag import LoopLagMonitor
from tuner.load.records import RequestRecord
from tuner.load.request import LevelContext
from tuner.load.workload import RequestPlan

__all__ = ["SharedCounter", "run_sharded", "split_concurrency"]

logger = logging.getLogger(__name__)

_READY_TIMEOUT_S = 120.0  # imports on a loaded machine; a shard slower than this is broken
_LEN = struct.Struct("<Q")


class SharedCounter:
    """A counter several processes take numbers from: an 8-byte file under ``flock``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDWR)

    @classmethod
    def create(cls) -> SharedCounter:
        fd, path = tempfile.mkstemp(prefix="tuner-claims-")
        os.write(fd, bytes(8))
        os.close(fd)
        return cls(path)

    def __call__(self) -> int:
        fd = self._fd
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            n = int.from_bytes(os.pread(fd, 8, 0), "little")
            os.pwrite(fd, (n + 1).to_bytes(8, "little"), 0)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
        return n

    def close(self, *, unlink: bool = False) -> None:
        os.close(self._fd)
        if unlink:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass


def split_concurrency(concurrency: int, shards: int) -> list[int]:
    """Streams per shard: as even as possible, every shard at least one."""
    shards = max(1, min(shards, concurrency))
    base, extra = divmod(concurrency, shards)
    return [base + (1 if i < extra else 0) for i in range(shards)]


async def _read_frame(reader: asyncio.StreamReader) -> Any:
    (n,) = _LEN.unpack(await reader.readexactly(_LEN.size))
    return pickle.loads(await reader.readexactly(n))


def _frame(obj: Any) -> bytes:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _LEN.pack(len(data)) + data


async def run_sharded(
    lv: LevelContext,
    plan: Sequence[RequestPlan],
    *,
    deadline_s: float | None,
    processes: int,
    lag: LoopLagMonitor | None = None,
    on_start: Callable[[float], None] | None = None,
) -> list[RequestRecord]:
    """:func:`tuner.load.closed_loop.run_level` over ``processes`` client processes.

    The time base is taken again once every shard is ready, so the shards' start-up is not
    part of the level (``on_start`` is told it). ``lag`` receives each shard's event-loop
    lateness samples.
    """
    concurrency = lv.concurrency
    per_shard = split_concurrency(concurrency, processes)
    counter = SharedCounter.create()
    procs: list[asyncio.subprocess.Process] = []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    try:
        for streams in per_shard:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tuner.load.shards",
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                env=env, start_new_session=True,
            )
            procs.append(proc)
            assert proc.stdin is not None
            proc.stdin.write(_frame({
                "level": lv, "plan": list(plan), "streams": streams,
                "deadline_s": deadline_s, "counter": counter.path,
            }))
            await proc.stdin.drain()
        async with asyncio.timeout(_READY_TIMEOUT_S):
            for proc in procs:
                assert proc.stdout is not None
                msg = await _read_frame(proc.stdout)
                if msg != "ready":
                    raise RuntimeError(f"client shard failed to start: {msg}")
        origin = time.monotonic()
        if on_start is not None:
            on_start(origin)
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(_frame(origin))
            await proc.stdin.drain()
        results = []
        for proc in procs:
            assert proc.stdout is not None
            try:
                results.append(await _read_frame(proc.stdout))
            except asyncio.IncompleteReadError:
                code = await proc.wait()
                raise RuntimeError(f"client shard exited with {code} before its results") from None
        for proc in procs:
            await proc.wait()
    except BaseException:
        for proc in procs:
            if proc.returncode is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for proc in procs:
            await proc.wait()
        raise
    finally:
        counter.close(unlink=True)
    by_pos: dict[int, RequestRecord] = {}
    for res in results:
        if isinstance(res, str):
            raise RuntimeError(f"client shard failed: {res}")
        by_pos.update(res["records"])
        if lag is not None:
            lag.extend(res["lag_ms"])
    return [by_pos[i] for i in sorted(by_pos)]


def _shard_main() -> int:
    """Child side: read the job, report ready, wait for t0, run, send records back."""
    import traceback

    proto_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed by a library goes to stderr, not into the protocol
    sys.stdout = sys.stderr
    proto_in = sys.stdin.buffer

    def read() -> Any:
        (n,) = _LEN.unpack(proto_in.read(_LEN.size))
        return pickle.loads(proto_in.read(n))

    def send(obj: Any) -> None:
        proto_out.write(_frame(obj))
        proto_out.flush()

    try:
        job = read()  # unpickling it imports the client modules: before "ready"
        from tuner.load.streams import run_streams
    except Exception:
        send(traceback.format_exc())
        return 1
    send("ready")
    header = proto_in.read(_LEN.size)
    if len(header) < _LEN.size:
        return 1  # the parent gave up
    (n,) = _LEN.unpack(header)
    t0 = pickle.loads(proto_in.read(n))
    try:
        counter = SharedCounter(job["counter"])
        lv = replace(job["level"], t0=t0)
        monitor = LoopLagMonitor()

        async def streams() -> dict[int, Any]:
            async with monitor:
                return await run_streams(lv, job["plan"], job["streams"], counter,
                                         job["deadline_s"])

        records = asyncio.run(streams())
    except Exception:
        send(traceback.format_exc())
        return 1
    send({"records": records, "lag_ms": monitor.samples_ms})
    return 0


if __name__ == "__main__":
    sys.exit(_shard_main())
