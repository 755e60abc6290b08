"""The probe's HTTP plumbing: one client per probe run, a POST that turns every failure into a
readable ``ValueError``, and per-request timeouts capped by the probe's deadline.
"""

from __future__ import annotations

from collections.abc import Mapping
from time import perf_counter
from typing import Any

import httpx

from tuner.probe.spec import ProbeSpec

__all__ = ["make_client", "post_json", "request_timeout"]


def make_client(
    base_url: str, headers: Mapping[str, str] | None, spec: ProbeSpec, width: int
) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=base_url.rstrip("/"),
        headers=dict(headers or {}),
        timeout=spec.request_timeout_s,
        limits=httpx.Limits(max_connections=width, max_keepalive_connections=width),
        # The server is one the tuner started: no proxy from the environment in between.
        trust_env=False,
    )


async def post_json(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], timeout: float
) -> Any:
    """POST and return the JSON body; raises ValueError with a readable reason otherwise."""
    try:
        response = await client.post(path, json=body, timeout=timeout)
    except httpx.TimeoutException as exc:
        raise ValueError(f"timeout after {timeout:.1f} s") from exc
    except httpx.HTTPError as exc:
        raise ValueError(f"{type(exc).__name__}: {exc}") from exc
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
