"""The simulator's OpenAI-compatible HTTP API (starlette), shaped like vLLM's responses.

Request-count faults (http_5xx, garbage_sse, hang_mid_stream, crash_mid_load) and the
untrustworthy replies (usage_lie and html_reply on streamed requests, huge_reply on every
generation request) are applied here because they concern the HTTP layer; token content
comes from the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import uvicorn
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from tuner.sim.effective import Effective
from tuner.sim.engine import Chunk, Engine, GenRequest
from tuner.sim.faults import ActiveFaults, Fault
from tuner.sim.logs import VERSION
from tuner.sim.model import TOKENIZER, chat_prompt, plan_output, prompt_logprobs


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")   # vLLM ignores fields it does not know

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=0)
    temperature: float | None = Field(default=None, ge=0)
    seed: int | None = None
    stream: bool = False
    stream_options: dict[str, bool] | None = None
    ignore_eos: bool = False
    stop: str | list[str] | None = None
    n: int = Field(default=1, ge=1, le=16)
    # vLLM's extra field: tokens and top-logprob keys as "token_id:<id>", so a client can
    # compare ids exactly (the reference-agreement probe does).
    return_tokens_as_token_ids: bool | None = None


class CompletionBody(_Body):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=0)
    logprobs: int | None = Field(default=None, ge=0, le=20)
    prompt_logprobs: int | None = Field(default=None, ge=0, le=20)


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.get("text", "") for p in self.content if p.get("type") == "text")
        return self.content or ""


class ChatBody(_Body):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=0)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)


def error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": None,
                                   "code": status}}, status_code=status)


def _lp_token(piece: str, tid: int, as_id: bool = False) -> str:
    if as_id:
        return f"token_id:{tid}"
    return piece if piece else TOKENIZER.piece(tid)


def _place(f: Fault, idx: tuple[int, int | None]) -> int | None:
    """A request's place in the count ``f`` uses: among all requests, or among streamed
    ones (None: a request that is not streamed does not count)."""
    return idx[0] if f.counting == "all" else idx[1]


API_KEY_ENV = "VLLM_API_KEY"
# vLLM's AuthenticationMiddleware guards these prefixes only: /health, /metrics and
# /tokenize answer without a key.
GUARDED_PREFIX = ("/v1", "/v2", "/inference", "/cohere")


def api_tokens(unknown: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """The keys a request may carry, as vLLM reads them: ``--api-key`` (one or more), else
    ``VLLM_API_KEY``; none (no authentication) when both are empty."""

    given = unknown.get("api_key")
    keys = given if isinstance(given, list) else [env.get(API_KEY_ENV, "")] if given is None else [given]
    return [str(k) for k in keys if k not in ("", True)]


class Authentication:
    """vLLM's AuthenticationMiddleware: a guarded path without ``Authorization: Bearer
    <one of the keys>`` is answered 401 ``{"error": "Unauthorized"}`` (OPTIONS passes)."""

    def __init__(self, app: ASGIApp, tokens: list[str]) -> None:
        self.app = app
        self.hashes = [hashlib.sha256(t.encode()).digest() for t in tokens]

    def _verified(self, headers: Headers) -> bool:
        scheme, _, param = headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        got = hashlib.sha256(param.encode()).digest()
        return any([secrets.compare_digest(got, h) for h in self.hashes])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and scope.get("method") != "OPTIONS":
            path = scope["path"].removeprefix(scope.get("root_path", ""))
            if path.startswith(GUARDED_PREFIX) and not self._verified(Headers(scope=scope)):
                await JSONResponse({"error": "Unauthorized"}, status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class SimServer:
    def __init__(self, eff: Effective, engine: Engine, faults: ActiveFaults,
                 on_crash: Callable[[], None], api_keys: list[str] | None = None) -> None:
        self.eff = eff
        self.engine = engine
        self.faults = faults
        self.on_crash = on_crash
        self.n_requests = 0
        self.n_streamed = 0
        self.created = int(time.time())
        self.app = Starlette(routes=[
            Route("/health", self.health), Route("/ping", self.health, methods=["GET", "POST"]),
            Route("/version", self.version), Route("/load", self.load),
            Route("/v1/models", self.models), Route("/metrics", self.metrics),
            Route("/tokenize", self.tokenize, methods=["POST"]),
            Route("/detokenize", self.detokenize, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
        ])
        if api_keys:
            self.app = Authentication(self.app, api_keys)

    # -- simple endpoints ------------------------------------------------------------------
    async def health(self, request: Request) -> Response:
        return Response(status_code=503 if self.engine.dead else 200)

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": VERSION})

    async def load(self, request: Request) -> Response:
        return JSONResponse({"server_load": len(self.engine.sched.running)
                             + len(self.engine.sched.waiting)})

    async def models(self, request: Request) -> Response:
        data = [{"id": name, "object": "model", "created": self.created, "owned_by": "vllm",
                 "root": self.eff.model, "parent": None, "max_model_len": self.eff.max_model_len,
                 "permission": [{"id": f"modelperm-{uuid.uuid4().hex[:16]}",
                                 "object": "model_permission", "created": self.created,
                                 "allow_create_engine": False, "allow_sampling": True,
                                 "allow_logprobs": True, "allow_search_indices": False,
                                 "allow_view": True, "allow_fine_tuning": False,
                                 "organization": "*", "group": None, "is_blocking": False}]}
                for name in self.eff.served_model_names]
        return JSONResponse({"object": "list", "data": data})

    async def metrics(self, request: Request) -> Response:
        return PlainTextResponse(self.engine.prometheus(self.eff.served_model_names[0]),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    async def _json(self, request: Request) -> dict[str, Any] | Response:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return error(400, "Invalid JSON body", "BadRequestError")
        if not isinstance(body, dict):
            return error(400, "Request body must be a JSON object", "BadRequestError")
        return body

    def _check_model(self, name: str | None) -> Response | None:
        if name is not None and name not in self.eff.served_model_names:
            return error(404, f"The model `{name}` does not exist.", "NotFoundError")
        return None

    async def tokenize(self, request: Request) -> Response:
        body = await self._json(request)
        if isinstance(body, Response):
            return body
        if (bad := self._check_model(body.get("model"))) is not None:
            return bad
        if "messages" in body:
            try:
                msgs = [Message.model_validate(m) for m in body["messages"]]
            except (ValidationError, TypeError) as exc:
                return error(400, str(exc), "BadRequestError")
            text = chat_prompt([{"role": m.role, "content": m.text()} for m in msgs],
                               body.get("add_generation_prompt", True))
        elif isinstance(body.get("prompt"), str):
            text = body["prompt"]
        else:
            return error(400, "tokenize needs 'prompt' (string) or 'messages'", "BadRequestError")
        ids = TOKENIZER.encode(text)
        return JSONResponse({"count": len(ids), "max_model_len": self.eff.max_model_len,
                             "tokens": ids, "token_strs": None})

    async def detokenize(self, request: Request) -> Response:
        body = await self._json(request)
        if isinstance(body, Response):
            return body
        if (bad := self._check_model(body.get("model"))) is not None:
            return bad
        ids = body.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
            return error(400, "detokenize needs 'tokens' (list of ints)", "BadRequestError")
        return JSONResponse({"prompt": TOKENIZER.decode(ids)})

    # -- generation ------------------------------------------------------------------------
    async def _admit(self, request: Request, cls: type[_Body]) -> _Body | Response:
        body = await self._json(request)
        if isinstance(body, Response):
            return body
        try:
            parsed = cls.model_validate(body)
        except ValidationError as exc:
            return error(400, str(exc), "BadRequestError")
        if (bad := self._check_model(parsed.model)) is not None:
            return bad
        idx = (self.n_requests, self.n_streamed if parsed.stream else None)
        self.n_requests += 1
        self.n_streamed += bool(parsed.stream)
        if self._fault_active("crash_mid_load", idx):
            self.on_crash()
        for f in self.faults.all("http_5xx"):
            place = _place(f, idx)
            if place is not None and f.after_requests <= place < f.after_requests + f.count:
                return error(500, "Internal Server Error", "InternalServerError")
        if parsed.stream and self._fault_active("html_reply", idx):
            # A proxy's page where the event stream should be, with a 200 status.
            return HTMLResponse("<!DOCTYPE html>\n<html><head><title>Gateway</title></head>\n"
                                "<body><h1>Please sign in</h1></body></html>\n")
        parsed.__dict__["_idx"] = idx
        return parsed

    def _fault_active(self, name: str, idx: tuple[int, int | None]) -> bool:
        f = self.faults.get(name)
        if f is None:
            return False
        place = _place(f, idx)
        return place is not None and place >= f.after_requests

    def _requests(self, prompts: list[tuple[str, list[int]]], body: _Body, max_tokens: int | None,
                  logprobs: int | None, read_cache: bool) -> list[GenRequest] | Response:
        reqs = []
        for p_i, (text, ids) in enumerate(prompts):
            budget = self.eff.max_model_len - len(ids)
            want = max_tokens if max_tokens is not None else budget
            if len(ids) + want > self.eff.max_model_len or budget <= 0:
                return error(400, f"This model's maximum context length is "
                             f"{self.eff.max_model_len} tokens. However, you requested "
                             f"{len(ids) + want} tokens ({len(ids)} in the messages, {want} in "
                             "the completion). Please reduce the length of the messages or "
                             "completion.", "BadRequestError")
            for j in range(body.n):
                temperature = 1.0 if body.temperature is None else body.temperature
                seed = body.seed if body.seed is not None else self.eff.seed * 1000003 + \
                    self.n_requests * 17 + j
                plan = plan_output(text, ids, max_tokens=want, ignore_eos=body.ignore_eos,
                                   temperature=temperature, seed=seed + j,
                                   dummy=self.eff.load_format == "dummy",
                                   lossy_drop=self.eff.lossy_drop)
                reqs.append(GenRequest(f"{p_i}-{j}", ids, plan, logprobs=logprobs,
                                       read_cache=read_cache, index=p_i * body.n + j))
        return reqs

    async def completions(self, request: Request) -> Response:
        body = await self._admit(request, CompletionBody)
        if isinstance(body, Response):
            return body
        assert isinstance(body, CompletionBody)
        raw = body.prompt
        if isinstance(raw, str):
            raw_list: list[Any] = [raw]
        elif raw and isinstance(raw[0], int):
            raw_list = [raw]
        else:
            raw_list = list(raw)
        prompts = [(p, TOKENIZER.encode(p)) if isinstance(p, str) else (TOKENIZER.decode(p), list(p))
                   for p in raw_list]
        if not prompts or any(not ids for _, ids in prompts):
            return error(400, "Prompt cannot be empty", "BadRequestError")
        reqs = self._requests(prompts, body, body.max_tokens, body.logprobs,
                              body.prompt_logprobs is None)
        if isinstance(reqs, Response):
            return reqs
        return await self._respond(body, reqs, chat=False)

    async def chat(self, request: Request) -> Response:
        body = await self._admit(request, ChatBody)
        if isinstance(body, Response):
            return body
        assert isinstance(body, ChatBody)
        text = chat_prompt([{"role": m.role, "content": m.text()} for m in body.messages])
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None \
            else body.max_tokens
        k = (body.top_logprobs or 0) if body.logprobs else None
        reqs = self._requests([(text, TOKENIZER.encode(text))], body, max_tokens, k, True)
        if isinstance(reqs, Response):
            return reqs
        return await self._respond(body, reqs, chat=True)

    async def _chunks(self, reqs: list[GenRequest], stops: list[str]
                      ) -> AsyncIterator[tuple[GenRequest, str, Chunk, str | None]]:
        """Merged per-request chunk stream with stop strings applied: (req, text, chunk, stop)."""
        for r in reqs:
            self.engine.submit(r)
        texts = {id(r): "" for r in reqs}
        pending = {asyncio.ensure_future(r.queue.get()): r for r in reqs}
        try:
            while pending:
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for fut in done:
                    req = pending.pop(fut)
                    chunk = fut.result()
                    if chunk is None:
                        continue
                    before = texts[id(req)]
                    text = "".join(chunk.pieces)
                    full = before + text
                    hit = None
                    for s in stops:
                        at = full.find(s, max(0, len(before) - len(s) + 1))
                        if at >= 0 and (hit is None or at < hit[0]):
                            hit = (at, s)
                    if hit is not None:
                        text = full[:hit[0]][len(before):]
                        chunk.finish_reason = "stop"
                        self.engine.finish(req, "stop")
                    texts[id(req)] = before + text
                    yield req, text, chunk, hit[1] if hit else None
                    if chunk.finish_reason is None:
                        pending[asyncio.ensure_future(req.queue.get())] = req
        finally:
            for fut in pending:
                fut.cancel()
            for r in reqs:
                self.engine.finish(r, "abort")

    def _usage(self, reqs: list[GenRequest], lie: Fault | None = None) -> dict[str, Any]:
        # n>1 samples of one prompt count its prompt tokens once, as vLLM does.
        prompt = sum(len(r.prompt_ids) for r in reqs if r.req_id.endswith("-0"))
        completion: Any = sum(r.emitted for r in reqs)
        total: Any = prompt + completion
        if lie is not None:
            completion = lie.value if lie.factor is None else int(completion * lie.factor)
            total = completion
        return {"prompt_tokens": prompt, "total_tokens": total,
                "completion_tokens": completion, "prompt_tokens_details": None}

    @staticmethod
    async def _huge(head: str, megabytes: float, tail: str) -> AsyncIterator[bytes]:
        """``head``, then ``megabytes`` MB of "x" without a line end, then ``tail``: sent in
        64 KiB pieces, so a client that gives up early costs this server little."""
        yield head.encode()
        left = int(megabytes * 1_000_000)
        piece = b"x" * 65536
        while left > 0:
            yield piece[:left]
            left -= len(piece)
        yield tail.encode()

    def _logprobs(self, chunk: Chunk, chat: bool, offset: int, as_ids: bool = False) -> Any:
        if chunk.logprobs is None:
            return None
        pieces = [_lp_token(p, t, as_ids) for p, t in zip(chunk.pieces, chunk.ids)]

        def name(tid: int) -> str:
            return _lp_token("", tid, as_ids)

        if chat:
            return {"content": [
                {"token": p, "logprob": lp, "bytes": list(p.encode()),
                 "top_logprobs": [{"token": name(c), "logprob": clp,
                                   "bytes": list(name(c).encode())} for c, clp in cands]}
                for p, (lp, cands) in zip(pieces, chunk.logprobs)]}
        offsets, pos = [], offset
        for p in chunk.pieces:
            offsets.append(pos)
            pos += len(p)
        return {"text_offset": offsets, "token_logprobs": [lp for lp, _ in chunk.logprobs],
                "tokens": pieces,
                "top_logprobs": [({name(c): clp for c, clp in cands} or {p: lp})
                                 for p, (lp, cands) in zip(pieces, chunk.logprobs)]}

    async def _respond(self, body: _Body, reqs: list[GenRequest], chat: bool) -> Response:
        idx = body.__dict__["_idx"]
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        name = body.model or self.eff.served_model_names[0]
        obj = "chat.completion" if chat else "text_completion"
        stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        hang = self._fault_active("hang_mid_stream", idx)
        huge = self.faults.get("huge_reply") if self._fault_active("huge_reply", idx) else None
        if huge is not None and huge.megabytes is not None:
            if body.stream:
                return StreamingResponse(self._huge(
                    f'data: {{"id":"{rid}","choices":[{{"index":0,"text":"', huge.megabytes,
                    '"}]}\n\ndata: [DONE]\n\n'), media_type="text/event-stream")
            return StreamingResponse(self._huge(
                f'{{"id":"{rid}","choices":[{{"index":0,"text":"', huge.megabytes,
                '","finish_reason":"length"}]}'), media_type="application/json")
        if not body.stream:
            return await self._respond_full(body, reqs, chat, rid, name, obj, stops, hang, idx)
        opts = body.stream_options or {}
        garbage = self._fault_active("garbage_sse", idx)
        lie = self.faults.get("usage_lie") if self._fault_active("usage_lie", idx) else None
        as_ids = bool(body.return_tokens_as_token_ids)

        async def events() -> AsyncIterator[str]:
            offsets = {r.index: 0 for r in reqs}
            started: set[int] = set()
            sent = 0
            async for req, text, chunk, stop in self._chunks(reqs, stops):
                if hang and sent >= 2:
                    await asyncio.Event().wait()   # stop sending, keep the connection open
                choice: dict[str, Any] = {"index": req.index}
                if chat:
                    if req.index not in started:
                        started.add(req.index)
                        first = {"id": rid, "object": "chat.completion.chunk",
                                 "created": self.created, "model": name, "choices": [
                                     {"index": req.index, "delta": {"role": "assistant",
                                                                    "content": ""},
                                      "logprobs": None, "finish_reason": None}]}
                        yield f"data: {json.dumps(first)}\n\n"
                    choice["delta"] = {"content": text}
                else:
                    choice["text"] = text
                choice["logprobs"] = self._logprobs(chunk, chat, offsets[req.index], as_ids)
                choice["finish_reason"] = chunk.finish_reason
                if not chat:
                    choice["stop_reason"] = stop
                offsets[req.index] += len(text)
                payload: dict[str, Any] = {"id": rid, "object": obj + ("" if not chat else ".chunk"),
                                           "created": self.created, "model": name,
                                           "choices": [choice]}
                if opts.get("continuous_usage_stats"):
                    payload["usage"] = self._usage(reqs, lie)
                line = json.dumps(payload)
                if garbage:
                    line = line[: max(5, len(line) // 2)]   # truncated JSON: malformed event
                yield f"data: {line}\n\n"
                sent += 1
            if opts.get("include_usage"):
                tail = {"id": rid, "object": obj + ("" if not chat else ".chunk"),
                        "created": self.created, "model": name, "choices": [],
                        "usage": self._usage(reqs, lie)}
                yield f"data: {json.dumps(tail)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def _respond_full(self, body: _Body, reqs: list[GenRequest], chat: bool, rid: str,
                            name: str, obj: str, stops: list[str], hang: bool,
                            idx: tuple[int, int | None]) -> Response:
        as_ids = bool(body.return_tokens_as_token_ids)
        texts: dict[int, list[str]] = {r.index: [] for r in reqs}
        lps: dict[int, list[Any]] = {r.index: [] for r in reqs}
        finish: dict[int, tuple[str | None, str | None]] = {}
        async for req, text, chunk, stop in self._chunks(reqs, stops):
            texts[req.index].append(text)
            lps[req.index].append(chunk)
            if chunk.finish_reason:
                finish[req.index] = (chunk.finish_reason, stop)
        if hang:
            await asyncio.Event().wait()
        choices = []
        for r in reqs:
            merged = Chunk([i for c in lps[r.index] for i in c.ids],
                           [p for c in lps[r.index] for p in c.pieces],
                           None if r.logprobs is None else
                           [x for c in lps[r.index] for x in (c.logprobs or [])], None)
            reason, stop = finish.get(r.index, ("abort", None))
            text = "".join(texts[r.index])
            if chat:
                choices.append({"index": r.index, "message": {"role": "assistant",
                                                              "content": text, "tool_calls": []},
                                "logprobs": self._logprobs(merged, True, 0, as_ids),
                                "finish_reason": reason, "stop_reason": stop})
            else:
                choice = {"index": r.index, "text": text,
                          "logprobs": self._logprobs(merged, False, 0, as_ids),
                          "finish_reason": reason, "stop_reason": stop, "prompt_logprobs": None}
                k = getattr(body, "prompt_logprobs", None)
                if k is not None:
                    plp = prompt_logprobs(r.prompt_ids, k, self.eff.numerics_salt,
                                          self.engine.prompt_corrupt(r.prompt_ids),
                                          flat=self.eff.load_format == "dummy")
                    choice["prompt_logprobs"] = [
                        None if e is None else {str(t): {"logprob": lp, "rank": rank,
                                                         "decoded_token": TOKENIZER.piece(t)}
                                                for t, (lp, rank) in e.items()} for e in plp]
                choices.append(choice)
        payload = {"id": rid, "object": obj, "created": self.created, "model": name,
                   "choices": choices, "usage": self._usage(reqs)}
        if self._fault_active("garbage_sse", idx):
            text = json.dumps(payload)
            return Response(text[: len(text) // 2], media_type="application/json")
        return JSONResponse(payload)


class QuietServer(uvicorn.Server):
    """uvicorn without its own signal handling: the simulator's main handles SIGTERM/SIGINT.
    ``listening`` is set once it listens (uvicorn's own ``started`` is a flag, to be polled)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.listening = asyncio.Event()

    async def startup(self, sockets: list[Any] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            self.listening.set()

    @contextlib.contextmanager
    def capture_signals(self):  # type: ignore[override]
        yield

    def install_signal_handlers(self) -> None:  # older uvicorn versions
        return
