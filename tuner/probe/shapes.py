"""Which shapes a trial's probe must cover (pure): prompt-length buckets and decode batch
sizes.

Compiled graphs, CUDA-graph capture and attention kernels are specialised by shape: a
captured graph is replayed for every batch padded up to its capture size, a compiled
range ends at ``max_num_batched_tokens``, a kernel switches implementation past a length.
Corruption that lives in one of those specialisations shows only for prompts in one length
bucket or at one decode batch size (vLLM #27057: wrong only above a context length; #28704
only in one parallel mode; landscape.md §5). So the probe sends one prompt inside every
length bucket and runs at every decode batch size that matters:

* **Length buckets**: the boundaries the server reports in its log where it does (CUDA-graph
  capture sizes - a prefill of n tokens runs the graph of the next size up to the largest,
  eagerly above it - and compile range endpoints), thinned so neighbours differ by at least
  ``min_ratio``, plus a geometric spread (powers of two) from 16 to the longest prompt the
  probe may send. Each bucket [low, high) gets a recorded prompt whose token count falls
  inside it, drawn afresh per trial, longest buckets first while the prompt budget lasts.
* **Decode batch sizes**: 1, every capture size the server reports up to the trial's top
  concurrency (powers of two when it reports none), and the top concurrency itself - the
  batch size the load test will run at. At size b the probe runs b requests at once.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence

from pydantic import BaseModel, Field

__all__ = ["Coverage", "batch_sizes", "length_buckets", "log_boundaries"]


_COMPILE_RANGES = re.compile(r"'compile_ranges_endpoints': \[([\d,\s]*)\]")
_COMPILE_SIZES = re.compile(r"'compile_sizes': \[([\d,\s]*)\]")


def log_boundaries(log_text: str) -> list[int]:
    """Prompt-length boundaries a server's startup log reports besides its capture sizes:
    the compile range endpoints and compile sizes of its engine config line (vLLM compiles
    one graph per range; the CPU build logs ``'compile_ranges_endpoints': [2048]``)."""
    found: set[int] = set()
    for pattern in (_COMPILE_RANGES, _COMPILE_SIZES):
        for match in pattern.finditer(log_text):
            found.update(int(v) for v in match.group(1).replace(",", " ").split())
    return sorted(found)


def _thin(values: Iterable[int], min_ratio: float, keep: set[int]) -> list[int]:
    out: list[int] = []
    for v in sorted(set(values)):
        if not out or v >= out[-1] * min_ratio:
            out.append(v)
        elif v in keep:
            # A boundary that must stay replaces its too-close neighbour below.
            if len(out) > 1 and out[-1] not in keep:
                out[-1] = v
            else:
                out.append(v)
    return out


def length_buckets(
    longest: int,
    reported: Sequence[int] = (),
    *,
    shortest: int = 16,
    min_ratio: float = 1.5,
) -> list[tuple[int, int]]:
    """Prompt-length buckets [low, high) up to ``longest`` tokens (inclusive: the last
    bucket's high is ``longest + 1``).

    ``reported``: boundaries from the server's log (capture sizes, compile range
    endpoints); the largest of them is always kept - past it the server runs another path.
    """
    if longest < shortest:
        return [(1, longest + 1)]
    powers = [2**i for i in range(4, 40) if shortest <= 2**i <= longest]
    inside = [b for b in reported if shortest < b <= longest]
    keep = {max(inside)} if inside else set()
    edges = _thin([shortest, *powers, *inside], min_ratio, keep)
    edges = [e for e in edges if e <= longest]
    bounds = [*edges, longest + 1]
    return [(lo, hi) for lo, hi in zip(bounds, bounds[1:], strict=False) if hi > lo]


def batch_sizes(
    top: int,
    reported: Sequence[int] = (),
    *,
    configured: Sequence[int] | None = None,
    max_sizes: int = 7,
) -> list[int]:
    """Decode batch sizes to run, ascending: 1, the reported capture sizes (else powers of
    two) below ``top``, thinned geometrically to at most ``max_sizes``, and ``top``.
    ``configured`` (the study's ``probe.bank.batch_sizes``) replaces the automatic choice."""
    if configured:
        return sorted(set(configured))
    below = [b for b in reported if 1 < b < top] or [2**i for i in range(1, 20) if 2**i < top]
    candidates = sorted({1, *below, top})
    if len(candidates) <= max_sizes:
        return candidates
    # Geometric targets between 1 and top, each taking the nearest (in ratio) candidate.
    picked = {1, top}
    for i in range(1, max_sizes - 1):
        target = top ** (i / (max_sizes - 1))
        picked.add(min(candidates, key=lambda c: abs(math.log(c / target))))
    chosen = sorted(picked)
    return chosen


class Coverage(BaseModel):
    """The shapes a probe run covered (stored in probe.json; shown by ``tuner status``)."""

    buckets: list[tuple[int, int]] = Field(description="The prompt-length buckets asked for.")
    prompt_tokens: list[int] = Field(
        default_factory=list, description="Prompt token counts sent (each distinct prompt once)."
    )
    buckets_covered: int = 0
    batch_sizes: list[int] = Field(default_factory=list, description="Decode batch sizes run.")
    strata: int = Field(0, description="(family, wording) strata asked.")
    families: list[str] = Field(default_factory=list)
    requests: int = 0
    forced_positions: int = 0
    compared_positions: int = 0
    reported_boundaries: list[int] = Field(
        default_factory=list,
        description="Boundaries read from the server's log (capture sizes, compile ranges).",
    )

    def short(self) -> str:
        """One line for status: 'buckets 7/7, batch 1/2/4/8, 20 strata, 412 positions'."""
        sizes = "/".join(str(b) for b in self.batch_sizes)
        return (
            f"lengths {min(self.prompt_tokens, default=0)}-{max(self.prompt_tokens, default=0)} "
            f"tok ({self.buckets_covered}/{len(self.buckets)} buckets), batch {sizes}, "
            f"{self.strata} strata, {self.compared_positions} positions"
        )
