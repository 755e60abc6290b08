"""A landscape measured on a real server, as a ground truth the simulated studies replay.

``benchmarks/landscape_record.py`` writes a landscape file (``benchmarks/landscapes/*.json``)
from a finished grid study: for every allowed point of the study file's space, what its trial
reported - started or failed, every knob applied or not, probe passed or not, the metrics of
each load level and how long each part of the trial took. ``ground_truth`` turns it into the
``GroundTruth`` table that ``tuner.sim.study`` answers trials from, so a replay of the real
landscape goes through exactly the code the simulator's spaces go through.

What a replay cannot know: a point measured once is its own truth (the replay adds the
benchmark's noise on top); the compile cache is not modelled (``compile_key`` None): each
compiled point of the real grid compiled from scratch, which is what its ``startup_s`` says.

Pure: a parsed JSON document in, a table out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tuner.sim.ground_truth import GroundTruth
from tuner.sim.truth import LevelTruth, PointTruth
from tuner.study import space
from tuner.study.sampling import grid_points
from tuner.study.spec import StudySpec

__all__ = ["ground_truth", "point_truth", "LANDSCAPE_VERSION"]

LANDSCAPE_VERSION = 1


def point_truth(point: Mapping[str, Any]) -> PointTruth:
    """One recorded point as the simulator's ``PointTruth``."""

    levels = {int(c): LevelTruth(int(c), {k: float(v) for k, v in lv["metrics"].items()}, float(lv["load_s"]))
              for c, lv in (point.get("levels") or {}).items()}
    return PointTruth(
        values=dict(point["values"]), status=point["status"], reason=point.get("reason"),
        message=point.get("message"), applied=bool(point.get("applied", True)),
        mismatches=tuple(point.get("mismatches") or ()), probe_passed=bool(point.get("probe_passed", True)),
        levels=levels, startup_s=float(point.get("startup_s") or 0.0), probe_s=float(point.get("probe_s") or 0.0),
        stop_s=float(point.get("stop_s") or 0.0))


def ground_truth(spec: StudySpec, landscape: Mapping[str, Any]) -> GroundTruth:
    """The landscape's points as a ground truth over ``spec``'s space (the study file the
    landscape names). Every allowed point must have been measured exactly once: a replay
    that met an unmeasured point could only invent it."""

    if int(landscape.get("version", 0)) != LANDSCAPE_VERSION:
        raise ValueError(f"landscape version {landscape.get('version')!r}, expected {LANDSCAPE_VERSION}")
    points = [point_truth(p) for p in landscape["points"]]
    by_key = {p.key: p for p in points}
    if len(by_key) != len(points):
        raise ValueError("the landscape measures a point twice")
    allowed = [space.params_key(v) for v in grid_points(spec)]
    missing = [k for k in allowed if k not in by_key]
    extra = sorted(set(by_key) - set(allowed))
    if missing or extra:
        raise ValueError(f"the landscape does not match the space: {len(missing)} allowed point(s) "
                         f"not measured, {len(extra)} measured point(s) not allowed")
    return GroundTruth.build(spec, [by_key[k] for k in allowed])
