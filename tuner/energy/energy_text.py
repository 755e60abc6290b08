"""What `tuner status` says about a study's energy counter, in one line (pure).

The record is a trial outcome's ``energy`` (tuner.engine.trial_energy): the source and the
idle draw the worker measured once, or why nothing could be read. Free of pydantic and the
energy sources themselves, so ``tuner status`` stays light.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["energy_lines"]


def energy_lines(record: Mapping[str, Any] | None) -> list[str]:
    """The status line for ``record`` (none for a study whose trials never ran a load)."""
    if not record:
        return []
    if record.get("unavailable"):
        return [f"  energy: not measured ({record['unavailable']})"]
    idle = record.get("idle_w")
    if not isinstance(idle, (int, float)):
        return [f"  energy: {record.get('source')} (the idle draw is measured for a study with an energy "
                "objective or limit)"]
    ci = record.get("idle_ci95")
    spread = f" ±{ci:.1f}" if isinstance(ci, (int, float)) else ""
    return [f"  energy: {record.get('source')}; idle draw {idle:.1f}{spread} W (server up, no request, "
            f"{float(record.get('idle_s') or 0):.0f} s; not subtracted from joules per token)"]
