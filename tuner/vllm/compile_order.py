"""The order in which known configurations run so that those sharing a torch.compile cache
entry run back to back.

vLLM compiles a configuration once per cache key (``compile_cache.compile_key``: the
compile-relevant settings) and loads the result on every later start with the same key, as
long as the cache is shared (the study's own cache by default, ``execution.
compile_cache_dir``). Points whose order is the tuner's to choose - the study's starting
points, queued after the baseline - are grouped by key: the group of the configuration
that runs just before them (the baseline) first, then the others in the order their first
member was listed, each group in listed order; points that compile nothing (key None:
eager) last, as they neither need nor fill the cache. With one GPU group this puts every
same-key pair back to back; with several, groups that start together still share what the
first of them compiled once it has finished.

Pure: keys in, order out.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["compile_order"]


def compile_order(keys: Sequence[str | None], *, after: str | None = None) -> list[int]:
    """Indices of ``keys`` in run order (see the module docstring). ``after``: the key of the
    configuration that runs right before the first of them."""

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
