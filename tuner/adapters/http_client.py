"""The httpx client for every call to a server the tuner started or was pointed at (the
launcher's readiness poll, the probe, a sweep's auxiliary calls, ``tuner measure``), and the
one way a non-streamed reply is read: up to a cap."""

from __future__ import annotations

from typing import Any

import httpx

from tuner.load.protocol import IDLE_REUSE_LIMIT_S

__all__ = ["MAX_REPLY_BYTES", "ReplyTooLarge", "capped_request", "server_client"]

MAX_REPLY_BYTES = 32 << 20
"""The largest non-streamed reply read from a server: 32 MiB. The largest the tuner asks
for is a probe reply with top-k logprobs at every position: about 0.5 KB a position at
top-5, so 32 MiB holds some 60,000 positions, far more than the probe's prompts and
continuations (4096 generated tokens at most). Reading a larger one whole would cost
memory without limit: 100 MB probe replies took ``measure --probe`` to 2 GB RSS."""


DEFAULT_TIMEOUT = httpx.Timeout(5.0)
"""server_client's timeout unless told: httpx's own default, 5 s for each phase of a request."""


class ReplyTooLarge(ValueError):
    """A server's reply was longer than the cap; the message says how long it was allowed."""


async def capped_request(client: httpx.AsyncClient, method: str, url: str, *,
                         limit: int = MAX_REPLY_BYTES, **kwargs: Any) -> httpx.Response:
    """``client.request`` that reads at most ``limit`` bytes of the (decoded) body.

    Raises:
        ReplyTooLarge: the body is longer; the connection is dropped without reading on.
        httpx.HTTPError: as ``client.request``.
    """
    async with client.stream(method, url, **kwargs) as response:
        body = bytearray()
        async for piece in response.aiter_bytes():
            body += piece
            if len(body) > limit:
                raise ReplyTooLarge(f"{method} {response.request.url.path}: reply over the "
                                    f"{limit >> 20} MiB cap (tuner.adapters.http_client)")
    # The body is decoded already: its encoding and framing headers no longer apply.
    headers = [(k, v) for k, v in response.headers.multi_items()
               if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")]
    return httpx.Response(response.status_code, headers=headers, content=bytes(body),
                          request=response.request)


def server_client(
    *,
    timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
    headers: dict[str, str] | None = None,
    width: int | None = None,
    base_url: str = "",
) -> httpx.AsyncClient:
    """An httpx client for a server the tuner started: no proxy from the environment in
    between, and idle connections given up before the server's keep-alive close can race a
    request (``IDLE_REUSE_LIMIT_S``). ``width``: connections it may hold (httpx's defaults
    when None); ``timeout``'s default is httpx's own."""

    sizes = {} if width is None else {"max_connections": width,
                                      "max_keepalive_connections": width}
    return httpx.AsyncClient(
        base_url=base_url, headers=dict(headers or {}), timeout=timeout, trust_env=False,
        limits=httpx.Limits(keepalive_expiry=IDLE_REUSE_LIMIT_S, **sizes),
    )
