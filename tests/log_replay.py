"""A log written to a real file a few bytes at a time, read back by the server-log reader
after every write: what the launcher's reader makes of a log its server flushes at
arbitrary byte boundaries (mid-line, mid-character)."""

from __future__ import annotations

from pathlib import Path

from tuner.adapters.server_log import ServerLog
from tuner.vllm.log_digest import LogDigest


def digest_written_in_chunks(path: Path, data: bytes, chunk: int) -> LogDigest:
    """Write ``data`` to ``path`` ``chunk`` bytes at a time, polling a ServerLog after each
    write; the digest after ``finish()`` (end of input)."""

    log = ServerLog(path)
    with open(path, "wb", buffering=0) as out:
        for start in range(0, len(data), chunk):
            out.write(data[start:start + chunk])
            log.poll()
    return log.finish()
