"""The stream client, SSE parser and record building on real vLLM responses.

tests/fixtures/vllm_streams/*.http are complete HTTP responses recorded byte for byte from
the vLLM 0.32 CPU server (scripts/record_vllm_streams.py; the request is in the .json
beside each): completions and chat with include_usage + continuous_usage_stats, one with
usage only at the end (how vLLM's own benchmark asks), n-gram speculative streams whose
chunks carry several tokens, and a 400 error. Expected values come from a separate,
deliberately naive reading of the same bytes (regex + json.loads), not from the code
under test.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tuner.load.closed_loop import run_level
from tuner.load.http_stream import Endpoint, StreamConnection
from tuner.load.metrics import compute_level_metrics
from tuner.load.records import token_timeline
from tuner.load.sse import SSEParser, _fast_chunk
from tuner.load.workload import RequestPlan

FIXTURES = Path(__file__).parent / "fixtures" / "vllm_streams"
STREAMS = sorted(p.stem for p in FIXTURES.glob("*.http") if "error" not in p.stem)


@dataclass
class Oracle:
    status: int
    headers: dict[str, str]
    body: bytes  # de-chunked
    events: list[dict[str, Any]]  # every JSON data event, in order
    request: dict[str, Any]

    @property
    def content(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("choices")]


def oracle(name: str) -> Oracle:
    raw = (FIXTURES / f"{name}.http").read_bytes()
    head, _, rest = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line, 16)
            if size == 0:
                break
            body += rest[:size]
            rest = rest[size + 2:]
    else:
        body = rest
    events = [json.loads(m) for m in re.findall(rb"^data: (\{.*\})$", body, re.M)]
    request = json.loads((FIXTURES / f"{name}.json").read_text())
    return Oracle(status, headers, body, events, request)


def test_fixtures_are_there() -> None:
    assert {"completions", "chat", "completions-usage-only-at-end", "chat-ngram",
            "completions-ngram"} <= set(STREAMS)
    for name in STREAMS:
        o = oracle(name)
        assert o.status == 200 and o.body.endswith(b"data: [DONE]\n\n")
        assert o.events[-1]["choices"] == [] and o.events[-1]["usage"]["completion_tokens"] > 0


def _splits(data: bytes, how: str, seed: int = 0) -> list[bytes]:
    if how == "whole":
        return [data]
    if how == "bytes":
        return [data[i:i + 1] for i in range(len(data))]
    if how == "odd":
        return [data[i:i + 7] for i in range(0, len(data), 7)]
    rng = random.Random(seed)
    out, i = [], 0
    while i < len(data):
        n = rng.randint(1, 400)
        out.append(data[i:i + n])
        i += n
    return out


@pytest.mark.parametrize("how", ["whole", "bytes", "odd", "random"])
@pytest.mark.parametrize("name", STREAMS)
def test_parser_yields_every_event(name: str, how: str) -> None:
    o = oracle(name)
    parser = SSEParser()
    got: list[Any] = []
    for piece in _splits(o.body, how):
        got.extend(parser.feed(piece))
    got.extend(parser.close())
    assert parser.done
    assert len(got) == len(o.events)
    for ev, want in zip(got, o.events, strict=True):
        assert isinstance(ev, dict)
        # The fast path keeps only what the runner reads; it must equal the full parse.
        assert ev["choices"] == want["choices"]
        assert ev.get("usage") == want.get("usage")


@pytest.mark.parametrize("name", STREAMS)
def test_fast_path_matches_json_loads(name: str) -> None:
    o = oracle(name)
    texts = re.findall(rb"^data: (\{.*\})$", o.body, re.M)
    fast_hits = 0
    for raw in texts:
        text = raw.decode()
        fast = _fast_chunk(text)
        full = json.loads(text)
        if fast is not None:
            fast_hits += 1
            assert fast == {"choices": full["choices"], "usage": full.get("usage")}
    # Token chunks are the bulk of every stream and must take the fast path.
    assert fast_hits >= len(o.content) - 2


class _FakeTransport:
    def __init__(self) -> None:
        self.written = b""
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.written += data

    def abort(self) -> None:
        self.aborted = True


def _replay_dechunk(raw: bytes, pieces: list[bytes]) -> tuple[int, bytes, bytes]:
    async def go() -> tuple[int, bytes, bytes]:
        conn = StreamConnection(Endpoint.from_url("http://127.0.0.1:9/v1/completions"))
        tr = _FakeTransport()
        conn.connection_made(tr)  # type: ignore[arg-type]
        got = bytearray()

        def sink(payload: bytes, now: float) -> None:
            got.extend(payload)

        task = asyncio.ensure_future(conn.post(b"{}", sink))
        await asyncio.sleep(0)
        assert tr.written.startswith(b"POST /v1/completions HTTP/1.1\r\n")
        assert tr.written.endswith(b"\r\n\r\n{}")
        for piece in pieces:
            conn.data_received(piece)
        status = await asyncio.wait_for(task, 5)
        return status, bytes(got), conn.error_body

    return asyncio.run(go())


@pytest.mark.parametrize("how", ["whole", "bytes", "odd", "random"])
@pytest.mark.parametrize("name", [*STREAMS, "completions-error-400"])
def test_http_client_dechunks_recorded_responses(name: str, how: str) -> None:
    o = oracle(name)
    raw = (FIXTURES / f"{name}.http").read_bytes()
    status, body, error_body = _replay_dechunk(raw, _splits(raw, how, seed=len(name)))
    assert status == o.status
    if status == 200:
        assert body == o.body
    else:
        assert body == b"" and error_body == o.body


async def _replay_server(raw: bytes, pieces: int) -> tuple[asyncio.Server, str]:
    """Answers every request with the recorded bytes, in ``pieces`` timed writes."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(re.search(rb"(?i)content-length: (\d+)", head).group(1))  # type: ignore[union-attr]
        await reader.readexactly(length)
        step = max(1, len(raw) // pieces)
        for i in range(0, len(raw), step):
            writer.write(raw[i:i + step])
            await writer.drain()
            await asyncio.sleep(0.002)
        writer.close()  # the recording says Connection: close

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


def _run_replay(name: str, n: int = 3, pieces: int = 40) -> list[Any]:
    raw = (FIXTURES / f"{name}.http").read_bytes()
    api = "chat" if "chat" in name else "completions"
    # As recorded: the server's counts are judged against the request's max_tokens.
    sent = json.loads((FIXTURES / f"{name}.json").read_text())["body"]
    plan = [RequestPlan(index=i, class_name="x", kind="open_ended", prompt="p",
                        max_tokens=sent.get("max_tokens", 8), ignore_eos=True,
                        target_prompt_tokens=1) for i in range(n)]

    async def go() -> list[Any]:
        server, url = await _replay_server(raw, pieces)
        async with server:
            return await run_level(url, "smollm2", plan, concurrency=2, api=api,
                                   deadline_s=None, request_timeout_s=30)

    return asyncio.run(go())


@pytest.mark.parametrize("name", STREAMS)
def test_records_from_recorded_streams(name: str) -> None:
    o = oracle(name)
    final = o.events[-1]["usage"]
    records = _run_replay(name)
    assert len(records) == 3
    for r in records:
        assert r.ok, r.error
        assert r.http_status == 200
        assert len(r.chunk_times_s) == len(o.content)
        assert r.chunk_times_s == sorted(r.chunk_times_s) and r.dispatch_s < r.chunk_times_s[0]
        # Real vLLM's counts (speculative chunks included) are within what arrived: believed.
        assert r.usage_rejected is None
        assert r.output_tokens == final["completion_tokens"]
        assert r.prompt_tokens == final["prompt_tokens"]
        assert r.finish_reason == o.content[-1]["choices"][0]["finish_reason"]
        chars = []
        for e in o.content:
            c0 = e["choices"][0]
            text = c0.get("text") if "text" in c0 else (c0["delta"].get("content") or "")
            chars.append(len(text))
        assert r.chunk_chars == chars
        cumulative = [(e.get("usage") or {}).get("completion_tokens") for e in o.content]
        if all(c is not None for c in cumulative):
            assert r.chunk_tokens == [b - a for a, b in zip([0, *cumulative], cumulative)]
        else:
            assert r.chunk_tokens is None  # usage only at the end: weights from text
        timeline = token_timeline(r)
        assert sum(k for _, k in timeline) == pytest.approx(final["completion_tokens"])


def test_speculative_chunks_carry_several_tokens() -> None:
    """n-gram speculation: TPOT divides by tokens, not chunks (ITL counts chunks)."""
    records = _run_replay("completions-ngram", n=2)
    r = records[0]
    assert r.chunk_tokens is not None and max(r.chunk_tokens) > 1
    assert len(r.chunk_times_s) < r.output_tokens
    m = compute_level_metrics(records, concurrency=2)
    want = [(x.chunk_times_s[-1] - x.chunk_times_s[0]) / (x.output_tokens - 1) * 1000
            for x in records]
    assert m.tpot_ms.n == 2
    assert m.tpot_ms.mean == pytest.approx(sum(want) / 2)
    assert m.itl_ms.n == sum(len(x.chunk_times_s) - 1 for x in records)


def test_recorded_http_error_becomes_a_typed_failure() -> None:
    records = _run_replay("completions-error-400", n=2, pieces=3)
    for r in records:
        assert not r.ok and r.http_status == 400
        assert r.error is not None and r.error.type == "http_status"
        assert "max_tokens" in r.error.message
