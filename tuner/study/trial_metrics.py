"""The trial-level metrics: one value per trial (not per load level), each with the
direction that makes it better, and how a trial's outcome holds it.

``startup_s`` and ``probe_s`` are known before the load levels run, ``accuracy_drop`` too
(the quality gate runs with the probe, before the load; docs/study-file.md, "Lossy knobs
under a quality budget"), so early stop treats all three as exact from the start
(``tuner.study.early_stop.TRIAL_LEVEL``); ``trial_s`` is known only when the trial ends.

Pure, and free of the spec's pydantic models so the trial records (``tuner.study.trials``)
can use it too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal

__all__ = ["TRIAL_METRICS", "TRIAL_METRIC_DIRECTION", "ACCURACY_DROP", "trial_metric_value"]

ACCURACY_DROP: Final = "accuracy_drop"

# Every one is better lower: seconds spent, or accuracy points lost against the reference.
TRIAL_METRIC_DIRECTION: Final[Mapping[str, Literal["minimize", "maximize"]]] = {
    "startup_s": "minimize",
    "probe_s": "minimize",
    "trial_s": "minimize",
    ACCURACY_DROP: "minimize",
}
TRIAL_METRICS: Final = tuple(TRIAL_METRIC_DIRECTION)


def trial_metric_value(outcome: object, metric: str) -> float | None:
    """``metric`` (one of TRIAL_METRICS) as ``outcome`` holds it, None when not measured.

    Seconds are the outcome's own attributes; ``accuracy_drop`` is the quality record's
    ``drop`` (``outcome.quality``: a model, or its JSON mapping in a stored summary), and 0.0
    for a trial without one: a lossless trial computes in the reference's numerics class, so
    its drop is 0 by construction (docs/probe.md, "the gate in a study"); a lossy trial the
    corruption rule failed before any gate ran is infeasible (probe_failed) whatever it is told.
    """
    if metric == ACCURACY_DROP:
        quality = getattr(outcome, "quality", None)
        if quality is None:
            return 0.0
        value = quality.get("drop") if isinstance(quality, Mapping) else getattr(quality, "drop", None)
    else:
        value = getattr(outcome, metric, None)
    return None if value is None else float(value)
