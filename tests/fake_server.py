"""A small streaming server for the load generator's tests (starlette + uvicorn thread).

It plays vLLM's streaming protocol. A prompt starting with ``SCRIPT {json}`` makes it follow
a script (chunk delays and token counts, an HTTP error, an error event mid-stream, a stall,
a dropped connection); any other prompt gets ``max_tokens`` one-token chunks 2 ms apart. It
also serves ``/tokenize`` (one token per word) and ``/metrics`` (counters of what it
generated), each of which a test can switch off. conftest's ``served`` fixture runs one per
test module.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route


@dataclass
class FakeState:
    bodies: list[dict[str, Any]] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    generation_tokens: int = 0
    prompt_tokens: int = 0
    metrics_enabled: bool = True
    tokenize_enabled: bool = True
    tokenize_calls: int = 0
    # Tokens the "server" counts per request beyond what it streams (like aborted work).
    uncounted_tokens: int = 0

    def reset(self) -> None:
        self.__init__()  # type: ignore[misc]


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def build_app(state: FakeState) -> Starlette:
    async def completions(request: Request) -> Response:
        body = await request.json()
        state.bodies.append(body)
        chat = request.url.path.endswith("/chat/completions")
        prompt = body["messages"][-1]["content"] if chat else body["prompt"]
        script: dict[str, Any] = {}
        if prompt.startswith("SCRIPT "):
            script = json.loads(prompt[len("SCRIPT "):])
        if "status" in script:
            return JSONResponse(
                {"error": {"message": "scripted failure", "type": "BadRequestError"}},
                status_code=script["status"],
            )
        chunks = script.get(
            "chunks", [[0.002, 1] for _ in range(int(body["max_tokens"]))]
        )
        n_prompt = len(prompt.split())
        continuous = script.get(
            "continuous", bool(body.get("stream_options", {}).get("continuous_usage_stats"))
        )
        kind = "chat.completion.chunk" if chat else "text_completion"

        def chunk(tokens: int, cumulative: int, last: bool) -> dict[str, Any]:
            text = " tok" * tokens
            choice: dict[str, Any] = {"index": 0, "finish_reason": "length" if last else None}
            if chat:
                choice["delta"] = {"content": text}
            else:
                choice["text"] = text
            ev: dict[str, Any] = {"id": "x", "object": kind, "choices": [choice]}
            if continuous:
                ev["usage"] = {"prompt_tokens": n_prompt, "completion_tokens": cumulative,
                               "total_tokens": n_prompt + cumulative}
            return ev

        async def stream() -> AsyncIterator[bytes]:
            state.in_flight += 1
            state.max_in_flight = max(state.max_in_flight, state.in_flight)
            try:
                yield b": keep-alive\n\n"
                if "hang" in script:
                    await asyncio.sleep(script["hang"])
                total = 0
                for i, (delay, tokens) in enumerate(chunks):
                    await asyncio.sleep(delay)
                    if i == script.get("error_after"):
                        yield _sse({"error": {"message": "boom", "type": "InternalServerError",
                                              "code": 500}})
                        yield b"data: [DONE]\n\n"
                        return
                    if i == script.get("reset_after"):
                        raise ConnectionResetError("scripted reset")
                    if chat and i == 0:
                        role = {"index": 0, "delta": {"role": "assistant", "content": ""},
                                "finish_reason": None}
                        yield _sse({"id": "x", "object": kind, "choices": [role]})
                    total += tokens
                    state.generation_tokens += tokens
                    yield _sse(chunk(tokens, total, i == len(chunks) - 1))
                state.prompt_tokens += n_prompt
                state.generation_tokens += state.uncounted_tokens
                if script.get("usage", True):
                    # "claim": what a lying server says it generated instead.
                    claimed = script["claim"] if "claim" in script else total
                    yield _sse({"id": "x", "object": kind, "choices": [],
                                "usage": {"prompt_tokens": n_prompt, "completion_tokens": claimed,
                                          "total_tokens": n_prompt + total}})
                if not script.get("no_done"):
                    yield b"data: [DONE]\n\n"
            finally:
                state.in_flight -= 1

        return StreamingResponse(stream(), media_type="text/event-stream")

    async def tokenize(request: Request) -> Response:
        if not state.tokenize_enabled:
            return PlainTextResponse("not found", status_code=404)
        state.tokenize_calls += 1
        body = await request.json()
        text = body["messages"][-1]["content"] if "messages" in body else body["prompt"]
        n = len(text.split())
        return JSONResponse({"count": n, "max_model_len": 4096, "tokens": list(range(n))})

    async def metrics(request: Request) -> Response:
        if not state.metrics_enabled:
            return PlainTextResponse("not found", status_code=404)
        return PlainTextResponse(
            "# TYPE vllm:generation_tokens_total counter\n"
            f'vllm:generation_tokens_total{{engine="0",model_name="fake"}} '
            f"{float(state.generation_tokens)}\n"
            "# TYPE vllm:prompt_tokens_total counter\n"
            f'vllm:prompt_tokens_total{{engine="0",model_name="fake"}} '
            f"{float(state.prompt_tokens)}\n"
            "# TYPE vllm:num_preemptions_total counter\n"
            'vllm:num_preemptions_total{engine="0",model_name="fake"} 0.0\n'
        )

    return Starlette(
        routes=[
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/chat/completions", completions, methods=["POST"]),
            Route("/tokenize", tokenize, methods=["POST"]),
            Route("/metrics", metrics, methods=["GET"]),
        ]
    )


@dataclass
class Served:
    base_url: str
    state: FakeState


class _Server(uvicorn.Server):
    """uvicorn that says when it listens: ``ready`` is set once it does, or once it gave up."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = threading.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        self.ready.set()


@contextmanager
def serving_app(app: Any, log_level: str = "critical") -> Iterator[str]:
    """``app`` served on a free local port in a daemon thread until the block ends; its URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = _Server(uvicorn.Config(app, log_level=log_level, lifespan="off", timeout_graceful_shutdown=1))

    def run() -> None:
        try:
            server.run(sockets=[sock])
        finally:
            server.ready.set()   # a server that never started ends the wait too

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    if not server.ready.wait(10) or not server.started:
        raise RuntimeError("test server did not start")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=5)
        sock.close()


@contextmanager
def serving() -> Iterator[Served]:
    """The fake server on a free local port, in a daemon thread, until the block ends."""
    state = FakeState()
    with serving_app(build_app(state)) as url:
        yield Served(url, state)
