"""The server-log reader (tuner.adapters.server_log) on real files, written by a real child
process where the order of writes and reads matters: a partial last line, a growing file,
a truncated and a rotated one, bytes that are not UTF-8, a line over the size cap, memory
on a log far larger than the reader may hold; and its digest, over every recorded vLLM log,
agreeing with the whole-text parsers.

The writer child appends exactly what it is told and acknowledges each command after the
bytes are in the file, so each read below happens at a known point of the writing (no
sleeps, no polling for the file to change)."""

from __future__ import annotations

import subprocess
import sys
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.log_replay import digest_written_in_chunks
from tuner.adapters.server_log import LogFollower, ServerLog
from tuner.probe.shapes import log_boundaries
from tuner.vllm.effective_config import parse_effective_config, text_lines
from tuner.vllm.log_digest import BACKLOG_CHARS, LogDigest, read_log

LOGS = Path(__file__).parent / "fixtures" / "vllm_logs"

# Commands on stdin, one a line: "w HEX" appends the bytes, "t" truncates the file to zero,
# "r" renames it to PATH.1 and goes on in a new PATH, "b N" appends a progress bar of N
# redraws with no newline. Each is answered "ok" once done.
WRITER = """
import os, sys
path = sys.argv[1]
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
for command in sys.stdin:
    op, _, arg = command.strip().partition(" ")
    if op == "w":
        os.write(fd, bytes.fromhex(arg))
    elif op == "t":
        os.truncate(path, 0)
    elif op == "r":
        os.close(fd)
        os.rename(path, path + ".1")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    elif op == "b":
        for i in range(int(arg)):
            os.write(fd, b"\\rCapturing CUDA graphs (decode, FULL): %3d%%|" % (i % 100) + b"#" * 60)
    print("ok", flush=True)
"""

LINE = "(APIServer pid=1) INFO 12-06 08:00:0{} [api_server.py:1] line {}"


class Writer:
    """The writer child (see WRITER)."""

    def __init__(self, path: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def _do(self, command: str) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline() == "ok\n"

    def write(self, data: bytes | str) -> None:
        self._do("w " + (data.encode() if isinstance(data, str) else data).hex())

    def truncate(self) -> None:
        self._do("t")

    def rotate(self) -> None:
        self._do("r")

    def progress_bar(self, redraws: int) -> None:
        self._do(f"b {redraws}")

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        assert self.proc.wait(timeout=30) == 0


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[Writer]:
    child = Writer(tmp_path / "server.log")
    try:
        yield child
    finally:
        if child.proc.poll() is None:
            child.proc.kill()
            child.proc.wait()


def test_a_partial_last_line_waits_for_its_newline(tmp_path: Path, writer: Writer) -> None:
    follower = LogFollower(tmp_path / "server.log")
    writer.write(LINE.format(0, 1) + "\n" + LINE.format(0, 2)[:30])
    assert list(follower.lines()) == [LINE.format(0, 1)]
    assert follower.partial == LINE.format(0, 2)[:30]
    assert list(follower.lines()) == []            # nothing new: the half line stays behind
    writer.write(LINE.format(0, 2)[30:] + "\n")
    assert list(follower.lines()) == [LINE.format(0, 2)]
    assert follower.partial == "" and follower.rest() is None
    writer.write("no newline at the end")
    writer.close()
    assert list(follower.lines()) == []
    assert follower.rest() == "no newline at the end"
    assert follower.rest() is None


def test_a_growing_file_is_read_once_line_by_line(tmp_path: Path, writer: Writer) -> None:
    path = tmp_path / "server.log"
    follower = LogFollower(path, chunk_bytes=64)    # lines straddle the chunks too
    assert list(follower.lines()) == []            # the file may not exist yet
    seen: list[str] = []
    written: list[str] = []
    for batch in range(20):
        lines = [LINE.format(batch % 10, f"{batch}.{i}") for i in range(batch % 4)]
        writer.write("".join(line + "\n" for line in lines))
        written += lines
        seen += follower.lines()
        assert seen == written
    assert follower.offset == path.stat().st_size
    assert follower.restarts == 0


def test_a_truncated_file_is_read_again_from_its_start(tmp_path: Path, writer: Writer) -> None:
    follower = LogFollower(tmp_path / "server.log")
    writer.write("".join(LINE.format(1, i) + "\n" for i in range(10)) + "half of a li")
    assert len(list(follower.lines())) == 10
    writer.truncate()       # copytruncate: the writer's stream goes on at the file's start
    writer.write("ne\n" + LINE.format(2, "after") + "\n")
    assert list(follower.lines()) == ["half of a line", LINE.format(2, "after")]
    assert follower.restarts == 1


def test_a_rotated_file_is_finished_then_the_new_one_followed(tmp_path: Path, writer: Writer) -> None:
    follower = LogFollower(tmp_path / "server.log")
    writer.write(LINE.format(1, "old") + "\n")
    assert list(follower.lines()) == [LINE.format(1, "old")]
    writer.write(LINE.format(1, "old, unread") + "\nold tail")
    writer.rotate()
    writer.write(LINE.format(2, "new") + "\n")
    assert list(follower.lines()) == [LINE.format(1, "old, unread"), "old tail", LINE.format(2, "new")]
    assert follower.restarts == 1
    writer.write(LINE.format(3, "newer") + "\n")
    assert list(follower.lines()) == [LINE.format(3, "newer")]


def test_bytes_that_are_not_utf8_are_replaced_and_split_characters_kept(tmp_path: Path,
                                                                       writer: Writer) -> None:
    follower = LogFollower(tmp_path / "server.log")
    euro = "€".encode()
    writer.write(b"bad \xff\xfe bytes, a euro split across writes: " + euro[:1])
    assert list(follower.lines()) == []
    writer.write(euro[1:] + b"\n\xc3\n")
    assert list(follower.lines()) == ["bad \ufffd\ufffd bytes, a euro split across writes: €", "\ufffd"]


def test_a_progress_bar_without_newlines_stays_under_the_cap(tmp_path: Path, writer: Writer) -> None:
    """Megabytes of \\r redraws and no newline (a tqdm bar in a log file), then a fatal
    line: the line in progress never holds more than the cap, keeps the bar's latest
    state, and the fatal line after it is still found."""

    log = ServerLog(tmp_path / "server.log")
    log._follower.max_line_chars = 1000
    for _ in range(5):
        writer.progress_bar(10_000)                  # ~1 MB a time
        log.poll()
        assert len(log._follower.partial) <= 1000
        assert log._follower.partial.startswith("Capturing CUDA graphs (decode, FULL):")
    writer.write("\n(EngineCore pid=1) ERROR 12-06 08:00:05 [core.py:1510] EngineCore failed to start.\n")
    found = log.poll().fatal.pending
    assert found is not None and found.reason == "engine_core_failed"
    assert log.digest.fatal.excerpt().split("\n")[0].startswith("Capturing CUDA graphs (decode, FULL): ")


def test_a_line_over_the_cap_keeps_its_head(tmp_path: Path, writer: Writer) -> None:
    follower = LogFollower(tmp_path / "server.log", max_line_chars=100, chunk_bytes=37)
    head = "(EngineCore pid=1) ERROR 12-06 08:00:05 [core.py:1] ValueError: "
    writer.write(head + "x" * 5000 + "\n" + LINE.format(1, "next") + "\n")
    lines = list(follower.lines())
    assert lines == [(head + "x" * 100)[:100], LINE.format(1, "next")]


def test_memory_stays_bounded_on_a_log_far_larger_than_a_chunk(tmp_path: Path) -> None:
    """32 MiB of log, a 1 MiB chunk and a 64 KiB line cap: the reader's peak stays a few
    chunks, whatever the file's size (the whole-file read it replaces held all of it,
    twice: bytes and text)."""

    path = tmp_path / "server.log"
    line = (LINE.format(1, "stats: Avg prompt throughput: 0.0 tokens/s, Running: 0 reqs") + "\n").encode()
    with open(path, "wb") as out:
        for _ in range(32):
            out.write(line * ((1 << 20) // len(line)))
        out.write(b"#" * (4 << 20) + b"\n")        # one 4 MiB line, over the cap
    follower = LogFollower(path)
    tracemalloc.start()
    try:
        count = sum(1 for _ in follower.lines())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 32 * ((1 << 20) // len(line)) + 1
    assert peak < 8 << 20, f"peak {peak / 2**20:.1f} MiB"


def _fixtures() -> list[str]:
    return sorted(str(p.relative_to(LOGS)) for p in LOGS.rglob("*.log"))


@pytest.mark.parametrize("name", _fixtures())
def test_the_digest_of_a_log_read_as_written_is_the_whole_texts(tmp_path: Path, name: str) -> None:
    """Every recorded vLLM log, written 4 KiB at a time and read by the reader as it grows:
    the fatal verdict, effective configuration, compile and startup records and shape
    boundaries are what the whole-text parsers give on the finished file."""

    data = (LOGS / name).read_bytes()
    digest = digest_written_in_chunks(tmp_path / "server.log", data, 4096)
    text = data.decode("utf-8", errors="replace")
    assert digest.fatal.signature == read_log(text).fatal.signature
    assert digest.effective() == parse_effective_config(text)
    assert digest.compile_record() == read_log(text).compile_record()
    assert digest.startup(first_line_s=15.0, ready_s=90.0) == read_log(text).startup(first_line_s=15.0, ready_s=90.0)
    assert digest.boundaries() == log_boundaries(text)


def test_the_first_logger_line_is_timed_when_it_arrives(tmp_path: Path, writer: Writer) -> None:
    log = ServerLog(tmp_path / "server.log")
    log.started_at = 0.0          # any origin: only "set once, on the first stamped line" is checked
    writer.write("Traceback-free import noise, no logger header\n")
    log.poll()
    assert log.first_line_s is None
    writer.write(LINE.format(1, "first"))          # flushed without its newline yet
    log.poll()
    assert log.first_line_s is not None
    first = log.first_line_s
    writer.write("\n" + LINE.format(2, "second") + "\n")
    log.poll()
    assert log.first_line_s == first


def test_the_digest_reads_a_long_log_in_bounded_batches(tmp_path: Path) -> None:
    """Past BACKLOG_CHARS of lines nobody asked about, the parsers behind the fail-fast
    scanner catch up by themselves: the lines waiting stay under the bound, and the answers
    are still the whole text's."""

    text = (LOGS / "h200-0.26.0" / "cudagraph-full.log").read_text(encoding="utf-8")
    stats = LINE.format(9, "Avg prompt throughput: 0.0 tokens/s, Running: 0 reqs") + "\n"
    text += stats * (3 * BACKLOG_CHARS // len(stats))
    digest = LogDigest()
    for line in text_lines(text):
        digest.feed(line)
        assert digest._backlog_chars <= BACKLOG_CHARS
    assert digest.effective() == parse_effective_config(text)
    assert digest.startup(first_line_s=1.0, ready_s=60.0) == read_log(text).startup(first_line_s=1.0, ready_s=60.0)
