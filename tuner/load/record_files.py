"""Request records as JSON lines (``requests-c<C>.jsonl`` in a trial folder)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tuner.adapters.artifacts import atomic_write_text
from tuner.load.records import RequestRecord

__all__ = ["read_records_jsonl", "write_records_jsonl"]


def write_records_jsonl(path: Path, records: Sequence[RequestRecord]) -> None:
    """Write records one JSON object per line, atomically (a full disk raises ArtifactWriteError)."""
    atomic_write_text(path, "".join(r.model_dump_json() + "\n" for r in records))


def read_records_jsonl(path: Path) -> list[RequestRecord]:
    with path.open(encoding="utf-8") as f:
        return [RequestRecord.model_validate_json(line) for line in f if line.strip()]
