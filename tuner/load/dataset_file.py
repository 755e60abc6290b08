"""Reading a study's dataset file (the parsing is tuner.load.dataset's, pure), and opening it
for a sweep (``open_draw``: a trace's prompt words calibrated against the server).

Read where the study is loaded, so a missing or malformed file stops it before any server
starts, and again by each sweep (a worker on another node reads its own copy of the path).
"""

from __future__ import annotations

from pathlib import Path

import httpx

from tuner.load.dataset import Dataset, DatasetError, parse_dataset
from tuner.load.dataset_draw import DatasetDraw
from tuner.load.load_spec import DatasetSource, LoadSpec
from tuner.load.server_calls import calibrate_trace_text

__all__ = ["FIELD", "open_draw", "read_dataset", "read_dataset_bytes"]

# Where the source is named in the study file, for messages.
FIELD = "load.workload.dataset"


def read_dataset_bytes(source: DatasetSource) -> bytes:
    """The file's bytes; a DatasetError naming the path and why it cannot be read."""

    path = Path(source.path)
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise DatasetError(f"{FIELD}.path", [("", "", f"{str(path)!r} does not exist")]) from None
    except IsADirectoryError:
        raise DatasetError(f"{FIELD}.path", [("", "", f"{str(path)!r} is a folder, not a file")]) from None
    except OSError as exc:
        raise DatasetError(f"{FIELD}.path", [("", "", f"{str(path)!r} cannot be read: "
                                              f"{exc.strerror or exc}")]) from None


def read_dataset(source: DatasetSource) -> Dataset:
    """The parsed dataset (DatasetError: unreadable file, not UTF-8, or bad entries)."""

    data = read_dataset_bytes(source)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise DatasetError(source.path, [(f"line {line}", "", "not UTF-8 text")]) from None
    return parse_dataset(text, source.format, source=source.path, block_tokens=source.block_tokens)


async def open_draw(aux: httpx.AsyncClient, base_url: str, model: str, spec: LoadSpec,
                    *, ignore_eos: bool, notes: list[str]) -> DatasetDraw | None:
    """The cursor a sweep draws its requests from, or None for the synthetic classes. A trace of
    lengths first learns which words this server counts as one token (a note when lengths
    cannot be exact)."""

    source = spec.workload.dataset
    if source is None:
        return None
    dataset = read_dataset(source)
    trace_text = None
    if dataset.timed:
        trace_text, note = await calibrate_trace_text(aux, base_url, model, api=spec.api,
                                                      block_tokens=source.block_tokens, seed=spec.seed)
        if note:
            notes.append(note)
    return DatasetDraw(dataset, seed=spec.seed, output_tokens=source.output_tokens, ignore_eos=ignore_eos,
                       think_s=source.think_time_s, trace_text=trace_text)
