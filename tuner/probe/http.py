"""The probe's HTTP plumbing: one client per probe run, a POST that turns every failure into a
readable ``ValueError``, and per-request timeouts capped by the probe's deadline.

A request the server resets before answering (a keep-alive connection closed under it) is
sent once more on a new connection: the probe's requests are greedy and idempotent, and a
connection's timing says nothing about the configuration's answers. A server that really
died fails the second attempt too, and the error names both. A reply is read up to
``tuner.adapters.http_client.MAX_REPLY_BYTES`` and no further (``ReplyTooLarge``, a
``ValueError``: the item's answer is a bad body).
"""

from __future__ import annotations

from collections.abc import Mapping
from time import perf_counter
from typing import Any

import httpx

from tuner.adapters.http_client import capped_request, server_client
from tuner.probe.spec import ProbeSpec

__all__ = ["describe", "make_client", "post", "post_json", "request_timeout"]

# Failures of the connection before any response: the request can be sent again.
_RESET = (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError)


def make_client(
    base_url: str, headers: Mapping[str, str] | None, spec: ProbeSpec, width: int
) -> httpx.AsyncClient:
    return server_client(base_url=base_url.rstrip("/"), headers=dict(headers or {}),
                         timeout=spec.request_timeout_s, width=width)


def _detail(exc: httpx.HTTPError) -> str:
    # A reset surfaces as an httpx error with an empty message; name its cause instead.
    return str(exc) or (type(exc.__cause__).__name__ if exc.__cause__ else "") or "no detail"


def describe(exc: httpx.HTTPError) -> str:
    return f"{type(exc).__name__}: {_detail(exc)}"


async def post(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], timeout: float
) -> httpx.Response:
    """POST once, and once more on a new connection if the first was reset before any answer.

    Raises:
        httpx.TimeoutException: no answer in ``timeout`` (not retried: the time is spent).
        httpx.HTTPError: any other failure; a reset twice raises the second with both named.
        ReplyTooLarge: the reply is longer than MAX_REPLY_BYTES (not retried).
    """
    try:
        return await capped_request(client, "POST", path, json=body, timeout=timeout)
    except _RESET as first:  # (a timeout is none of these: it is not resent)
        try:
            return await capped_request(client, "POST", path, json=body, timeout=timeout)
        except httpx.TimeoutException:
            raise
        except httpx.HTTPError as second:
            raise type(second)(
                f"{_detail(second)}, after {describe(first)} on the first attempt"
            ) from second


async def post_json(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], timeout: float
) -> Any:
    """POST and return the JSON body; raises ValueError with a readable reason otherwise."""
    try:
        response = await post(client, path, body, timeout)
    except httpx.TimeoutException as exc:
        raise ValueError(f"timeout after {timeout:.1f} s") from exc
    except httpx.HTTPError as exc:
        raise ValueError(describe(exc)) from exc
    if response.status_code != 200:
        raise ValueError(f"HTTP {response.status_code}: {response.text[:200]}")
    try:
        return response.json()
    except ValueError as exc:
        raise ValueError(f"bad response body: {exc}") from exc


def request_timeout(spec: ProbeSpec, deadline: float | None) -> float | None:
    """The per-request timeout, capped by the time left; None when the time is up."""
    if deadline is None:
        return spec.request_timeout_s
    remaining = deadline - perf_counter()
    return min(spec.request_timeout_s, remaining) if remaining > 0 else None
