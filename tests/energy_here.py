"""Whether this machine can read an energy counter, for the tests that validate every shipped
study: a study naming an energy objective (search_spaces/d8b-h100-energy.yaml) is refused by
`tuner validate` on a machine with none (CI's), with exactly that reason, and valid where
one can be read (the GPU box)."""

from __future__ import annotations

from tuner.energy.detect import energy_unavailable

NO_COUNTER = "needs an energy counter, and none can be read on this machine: "


def refused_only_for_energy(code: int, stderr: str) -> bool:
    """True when a validate that failed failed for the one reason this machine may give: no
    energy counter (and this machine indeed has none, for GPU 0 or RAPL)."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    return (code == 2 and len(lines) == 1 and NO_COUNTER in lines[0]
            and energy_unavailable([0]) is not None and energy_unavailable([]) is not None)
