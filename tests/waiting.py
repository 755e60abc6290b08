"""Waiting on a condition in tests, the one place that polls.

A test that waits for something to happen (a file to appear, a process to go, a server to
answer, a log line) names the condition and what it is: ``wait_for`` checks it until it
holds, and a timeout says what never came. Prefer a real signal where the thing gives one
(``Popen.wait``, a ``threading.Event``, a line read from a pipe); this is for the rest."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import httpx

T = TypeVar("T")

POLL_S = 0.02


def wait_for(condition: Callable[[], T], timeout: float, what: str, *,
             unless: Callable[[], str | None] | None = None,
             context: Callable[[], str] | None = None, every: float = POLL_S) -> T:
    """The first truthy value of ``condition()`` within ``timeout`` s.

    ``unless`` returns why the wait is hopeless (a process it waits on exited, with its
    output) or None; the wait then ends at once with that reason. ``context`` adds what
    helps to read a timeout (a log's tail). ``every``: the pause between checks, longer for
    a costly check (a scan of /proc)."""

    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if unless is not None and (why := unless()):
            raise AssertionError(f"{why}\n(while waiting for {what})")
        if time.monotonic() >= deadline:
            extra = f":\n{context()}" if context is not None else ""
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}{extra}")
        time.sleep(every)


def answers_health(url: str, timeout: float = 1.0) -> bool:
    """``url``/health answers 200 now (a refused or slow connection is a no)."""

    try:
        return httpx.get(url + "/health", timeout=timeout, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False
