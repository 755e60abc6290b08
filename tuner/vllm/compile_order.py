"""The order in which known configurations run so that every trial that can load a compiled
graph from the study's torch.compile cache does, and so that same-key trials run together.

vLLM compiles a configuration once per cache key (``compile_cache.compile_key``: the
compile-relevant settings) and loads the result on every later start with the same key, as
long as the cache is shared (the study's own cache by default, ``execution.
compile_cache_dir``) and the first start has finished compiling. Points whose order is the
tuner's to choose - the study's starting points, queued after the baseline - are ordered:

* **preferred order**: the group of the baseline's key first, then the other keys in the
  order their first point was listed, each group in listed order; points that compile
  nothing (key None: eager) last, as they neither need nor fill the cache;
* **with several GPU groups** (``parallel`` > 1) the first ``parallel`` queued jobs start
  together, and job *p* starts about when job *p - parallel* ends: a point whose key only
  a job fewer than ``parallel`` places before it compiles would start while that one is
  still compiling and compile the same graph again. Such a point is moved later, behind
  the next point that can run without that loss, when there is one.

With one GPU group every same-key point hits whatever the order (each key compiles once);
the order then only makes the study's hits come early and back to back, where its startup
figures are easy to compare. Pure: keys in, order out.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["compile_order"]


def _preferred(keys: Sequence[str | None], after: str | None) -> list[int]:
    groups: dict[str, list[int]] = {}
    uncompiled: list[int] = []
    for i, key in enumerate(keys):
        if key is None:
            uncompiled.append(i)
        else:
            groups.setdefault(key, []).append(i)
    order: list[int] = []
    if after is not None and after in groups:
        order += groups.pop(after)
    for members in groups.values():
        order += members
    return order + uncompiled


def compile_order(keys: Sequence[str | None], *, after: str | None = None, parallel: int = 1) -> list[int]:
    """Indices of ``keys`` in run order (see the module docstring). ``after``: the key of the
    configuration queued right before them (the baseline); ``parallel``: GPU groups that
    run trials at once."""

    waiting = _preferred(keys, after)
    if parallel <= 1:
        return waiting
    # Queue positions: the baseline is 0, the points follow from 1. A key is loadable at
    # position p once a job with it sits at p - parallel or earlier; the first job with a
    # key compiles it, which costs the same wherever it goes.
    compiled_at: dict[str, int] = {} if after is None else {after: 0}
    order: list[int] = []

    def no_loss(i: int, position: int) -> bool:
        key = keys[i]
        return key is None or key not in compiled_at or compiled_at[key] <= position - parallel

    while waiting:
        position = len(order) + 1
        pick = next((i for i in waiting if no_loss(i, position)), waiting[0])
        waiting.remove(pick)
        order.append(pick)
        key = keys[pick]
        if key is not None:
            compiled_at.setdefault(key, position)
    return order
