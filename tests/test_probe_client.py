"""The probe client against a tiny OpenAI-compatible starlette app served by uvicorn on
127.0.0.1 in a thread. The app's behaviour is chosen by the first path segment of the
base URL (``/good``, ``/garbage``, ``/batchy``, ...), so one server serves every test."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from tests.fake_server import serving_app
from tuner.probe.client import load_probe_items, run_probe
from tuner.probe.items import Check, ProbeItem
from tuner.probe.prompts_file import PromptsFileError, parse_prompts_jsonl
from tuner.probe.sample import known_sample
from tuner.probe.spec import ProbeSpec
from tuner.probe.wire import apply_stop

MODEL = "tiny-test-model"
SLOW_ANSWER_S = 60.0
# What a probe without a reference asks with the default spec: one bank item of every stratum.
BANK = known_sample(load_probe_items(ProbeSpec()), 0)
# Past this many characters a "flaky" server fails: a prompt-length-dependent bug (the bank's
# retrieval items are the long ones).
FLAKY_PAST_CHARS = 200


def _key(body: dict[str, Any]) -> str:
    """What the fake server looks an answer up by: the whole chat, or the raw prompt."""
    return json.dumps(body["messages"]) if "messages" in body else str(body["prompt"])


class FakeServer:
    """State of the in-test server: the answer key and what it has seen."""

    def __init__(self) -> None:
        self.oracle: dict[str, tuple[str, Check]] = {}
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.slow_answered = 0
        self.arrivals = threading.Semaphore(0)   # one release per request received

    def learn(self, items: list[ProbeItem]) -> None:
        for item in items:
            key = _key({"messages": item.messages()} if item.api == "chat" else {"prompt": item.prompt})
            self.oracle[key] = (item.expected, item.check)

    def reset(self) -> None:
        self.bodies.clear()
        self.headers.clear()
        self.max_in_flight = 0
        self.slow_answered = 0
        self.arrivals = threading.Semaphore(0)

    def right_answer(self, body: dict[str, Any]) -> str:
        expected, check = self.oracle[_key(body)]
        # Answer the way SmolLM2 does where the check allows it: in a sentence.
        return f"I believe it is {expected}." if check == "sentence" else expected


FAKE = FakeServer()


async def _handle(request: Request) -> Response:
    mode = request.path_params["mode"]
    body = await request.json()
    FAKE.bodies.append(body)
    FAKE.headers.append(dict(request.headers))
    FAKE.arrivals.release()
    chat = "messages" in body
    prompt = body["messages"][-1]["content"] if chat else body["prompt"]
    FAKE.in_flight += 1
    FAKE.max_in_flight = max(FAKE.max_in_flight, FAKE.in_flight)
    try:
        # A short wait so requests sent together really overlap in the server.
        # (0.1 s: long enough to overlap even on a busy 2-core machine)
        # A "slow" server answers only after a minute: a probe call that returns before then
        # was cut by its own timeout, deadline or cancellation, whatever the machine's load.
        await asyncio.sleep(SLOW_ANSWER_S if mode == "slow" else 0.1)
        crowded = FAKE.in_flight > 1
        if mode == "slow":
            FAKE.slow_answered += 1
    finally:
        FAKE.in_flight -= 1
    if mode == "flaky" and len(prompt) > FLAKY_PAST_CHARS:
        return PlainTextResponse("internal error", status_code=500)
    if mode == "broken":
        return PlainTextResponse("this is not json", status_code=200)
    if mode == "garbage":
        text = "The answer to this question depends on several important factors."
    elif mode == "batchy" and crowded:
        # A batch-dependent bug: wrong, and differently wrong, when requests share a batch.
        text = "I think it is 7."
    else:
        text = FAKE.right_answer(body)
    usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": 3, "total_tokens": 0}
    if chat:
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}}
    else:
        choice = {"index": 0, "text": " " + text}
    choice["finish_reason"] = "stop"
    return JSONResponse({"id": "x", "model": MODEL, "choices": [choice], "usage": usage})


APP = Starlette(
    routes=[
        Route("/{mode}/v1/chat/completions", _handle, methods=["POST"]),
        Route("/{mode}/v1/completions", _handle, methods=["POST"]),
    ]
)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with serving_app(APP, log_level="warning") as url:
        yield url


@pytest.fixture(autouse=True)
def _fresh_state() -> None:
    FAKE.reset()


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_correct_server_passes(server: str) -> None:
    spec = ProbeSpec()
    FAKE.learn(BANK)
    began = time.perf_counter()
    result = _run(run_probe(f"{server}/good", MODEL, spec, headers={"Authorization": "Bearer k"}))
    wall = time.perf_counter() - began
    assert result.passed, result.reason
    assert result.accuracy == 1.0 and result.total == 2 * len(BANK) and result.consistency == 1.0
    assert {r.id for r in result.records} == {i.id for i in BANK}
    # The probe's own cost: inside the call's wall time, and no shorter than its slowest request.
    assert result.probe_seconds is not None and 0 < result.probe_seconds <= wall
    assert result.probe_seconds >= max(r.latency_s or 0.0 for r in result.records)
    assert all(r.latency_s and r.latency_s > 0 for r in result.records)
    assert all(r.prompt_tokens for r in result.records)
    # The semaphore really limits and really allows 8 requests in flight.
    assert FAKE.max_in_flight == 8
    assert FAKE.headers[0]["authorization"] == "Bearer k"


def test_requests_are_greedy_and_well_formed(server: str) -> None:
    spec = ProbeSpec(concurrency=[1], max_tokens=20)
    turns = next(i for i in BANK if i.history)
    own = parse_prompts_jsonl("\n".join(json.dumps({"prompt": f"What is {n} + 1?", "expected": n + 1,
                                                     "check": "number"}) for n in range(3)),
                              ("chat", "completions"))
    items = [*BANK[:5], turns, *own]
    FAKE.learn(items)
    result = _run(run_probe(f"{server}/good/", MODEL, spec, items=items))  # trailing slash tolerated
    assert result.passed and len(FAKE.bodies) == 12
    for body in FAKE.bodies:
        assert body["temperature"] == 0 and body["seed"] == 0
        assert body["max_tokens"] == 20 and body["model"] == MODEL and body["stream"] is False
    chat = [b for b in FAKE.bodies if "messages" in b]
    comp = [b for b in FAKE.bodies if "prompt" in b]
    assert len(chat) == 9 and len(comp) == 3
    assert all(b["messages"][-1]["role"] == "user" for b in chat)
    # A multi-turn item sends its earlier turns before the question.
    assert len(turns.messages()) > 1 and turns.messages() in [b["messages"] for b in chat]
    # The user's completion prompts are sent verbatim.
    assert sorted(b["prompt"] for b in comp) == [f"What is {n} + 1?" for n in range(3)]
    assert all(b["stop"] == ["\nQuestion:"] for b in comp)


def test_garbage_server_fails_with_clear_reason(server: str) -> None:
    spec = ProbeSpec()
    result = _run(run_probe(f"{server}/garbage", MODEL, spec, items=BANK[:12]))
    assert not result.passed
    assert result.reason.startswith("accuracy 0.00 < 0.80 at concurrency 1 (chat 0.00)")
    assert not result.errors  # the server "worked": only the answers were wrong


def test_batch_dependent_bug_fails_at_high_concurrency(server: str) -> None:
    spec = ProbeSpec()
    FAKE.learn(BANK)
    result = _run(run_probe(f"{server}/batchy", MODEL, spec, items=BANK[:12]))
    low, high = result.levels
    assert low.concurrency == 1 and low.passed and low.accuracy == 1.0
    assert high.concurrency == 8 and not high.passed and high.accuracy < 0.5
    assert result.consistency is not None and result.consistency < 0.5
    assert not result.passed
    assert "at concurrency 8" in result.reason and "consistency" in result.reason
    assert "at concurrency 1" not in result.reason


def test_server_errors_count_as_wrong(server: str) -> None:
    spec = ProbeSpec(concurrency=[1, 4])
    FAKE.learn(BANK)
    result = _run(run_probe(f"{server}/flaky", MODEL, spec))
    failing = {i.id for i in BANK if len(i.prompt) > FLAKY_PAST_CHARS}
    assert failing == {i.id for i in BANK if i.family == "retrieval"} and len(failing) > len(BANK) / 5
    assert {f.item_id for f in result.errors} == failing
    assert all(f.detail.startswith("HTTP 500: internal error") for f in result.errors)
    assert result.by_family["retrieval"].correct == 0
    assert result.correct == result.total - 2 * len(failing)
    assert not result.passed  # more than a fifth wrong: under 0.8
    assert "request error(s), e.g. HTTP 500" in result.reason


def test_malformed_body_is_recorded(server: str) -> None:
    spec = ProbeSpec(concurrency=[1])
    result = _run(run_probe(f"{server}/broken", MODEL, spec, items=BANK[:4]))
    assert result.correct == 0
    assert all(f.detail.startswith("bad response body") for f in result.errors)


def test_request_timeout_is_recorded(server: str) -> None:
    spec = ProbeSpec(concurrency=[2], request_timeout_s=0.2)
    result = _run(run_probe(f"{server}/slow", MODEL, spec, items=BANK[:2]))
    assert FAKE.slow_answered == 0
    assert [f.detail for f in result.errors] == ["timeout after 0.2 s"] * 2


def test_deadline_bounds_the_probe(server: str) -> None:
    spec = ProbeSpec(concurrency=[1])
    result = _run(run_probe(f"{server}/slow", MODEL, spec, deadline_s=0.3, items=BANK[:6]))
    assert FAKE.slow_answered == 0
    details = [f.detail for f in result.errors]
    # Capped by the remaining budget, not the request timeout (60 s): under 0.3 s, and less
    # the busier the machine (0.1 s at a load average of 10, CI 2026-12-07).
    assert details[0].startswith("timeout after ")
    assert 0 <= float(details[0].split()[2]) <= 0.3
    assert details[1:] == ["not sent: probe deadline reached"] * 5


def test_refused_connection_is_recorded() -> None:
    with socket.socket() as sock:  # find a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    spec = ProbeSpec(concurrency=[1])
    result = _run(run_probe(f"http://127.0.0.1:{port}", MODEL, spec, items=BANK[:2]))
    assert not result.passed and len(result.errors) == 2
    assert all(f.detail.startswith("ConnectError") for f in result.errors)


def test_cancellation_propagates(server: str) -> None:
    spec = ProbeSpec(concurrency=[4])

    async def cancel_soon() -> None:
        task = asyncio.create_task(run_probe(f"{server}/slow", MODEL, spec, items=BANK[:4]))
        for _ in range(4):   # cancel while all four are inside the server
            assert await asyncio.to_thread(FAKE.arrivals.acquire, True, 30)
        task.cancel()
        await task

    with pytest.raises(asyncio.CancelledError):
        _run(cancel_soon())
    assert FAKE.slow_answered == 0


def test_disabled_probe_sends_nothing(server: str) -> None:
    result = _run(run_probe(f"{server}/good", MODEL, ProbeSpec(enabled=False)))
    assert result.skipped and result.passed and not FAKE.bodies


def test_prompts_file_end_to_end(server: str, tmp_path: Path) -> None:
    lines = [
        {"prompt": "What is 2 + 2?", "expected": "4", "check": "number"},
        {"prompt": "Say the word lemon.", "expected": "lemon", "check": "word", "api": "chat"},
    ]
    (tmp_path / "mine.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    spec = ProbeSpec(prompts_file="mine.jsonl", concurrency=[1])
    items = load_probe_items(spec, base_dir=tmp_path)
    assert [i.id for i in items] == ["line1-chat", "line1-completions", "line2-chat"]
    FAKE.learn(items)
    result = _run(run_probe(f"{server}/good", MODEL, spec, items=items))
    assert result.passed and result.total == 3
    assert result.by_family == {"custom": result.by_family["custom"]}


def test_prompts_file_errors(tmp_path: Path) -> None:
    with pytest.raises(PromptsFileError, match="cannot read"):
        load_probe_items(ProbeSpec(prompts_file="missing.jsonl"), base_dir=tmp_path)
    (tmp_path / "bad.jsonl").write_text('{"prompt": "p", "expected": "x", "check": "nope"}\n')
    with pytest.raises(PromptsFileError, match=r"line 1: check: "):
        load_probe_items(ProbeSpec(prompts_file=str(tmp_path / "bad.jsonl")))


def test_apply_stop_cuts_completion_answers_where_the_request_would_have_stopped() -> None:
    line = json.dumps({"prompt": "Question: What is 41 + 1?\nAnswer:", "expected": "42", "check": "number"})
    chat, completion = parse_prompts_jsonl(line, ("chat", "completions"))
    assert (chat.api, completion.api) == ("chat", "completions")
    text = " 42\nQuestion: What is 1 + 1?\nAnswer: 2"
    assert apply_stop(completion, text, "length") == (" 42", "stop")
    assert apply_stop(completion, " 42", "length") == (" 42", "length")
    # Chat requests carry no stop strings: their text is left alone.
    assert apply_stop(chat, text, "length") == (text, "length")
