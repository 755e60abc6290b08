"""Reading the committed real-GPU trial folders back (results/examples/smollm2-h200*): the
server log, the startup record parsed again from it, and a recorded confirmation judged again.
Shared by the tests over each H200 run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tuner.study.confirmation import Confirmation, RunResult, judge
from tuner.vllm.log_digest import read_log

__all__ = ["server_log", "reparsed_startup", "rejudged"]

_RUN_FIELDS = ("folder", "values", "feasible", "outcome", "message", "trial_s")


def server_log(folder: Path) -> str:
    return (folder / "server.log").read_text(encoding="utf-8", errors="replace")


def reparsed_startup(folder: Path) -> dict[str, Any]:
    """The startup record parsed again from the log, with the launcher's two clock figures of
    that run (seconds to the first log line, to the first /health 200) as it recorded them."""

    recorded = json.loads((folder / "startup.json").read_text())
    ready = recorded["total_s"] if recorded["complete"] else None
    return read_log(server_log(folder)).startup(first_line_s=recorded["first_line_s"], ready_s=ready).to_json()


def recorded_startup(folder: Path) -> dict[str, Any]:
    """The startup record the tuner wrote for that run, as it writes it now. Before the phases
    were made to add up to the measured start (issue 35), where vLLM's whole-second stamps
    overran the launcher's figures "ready" was clamped to 0 and the surplus stayed in the
    logged phases; now it comes off the longest logged phase (tuner.vllm.startup)."""

    rec = json.loads((folder / "startup.json").read_text())
    phases = rec["phases"]
    if rec["complete"] and rec["total_s"] is not None and phases.get("serve") == 0.0:
        logged = {p: v for p, v in phases.items() if p not in ("imports", "serve")}
        serve = rec["total_s"] - rec["first_line_s"] - sum(logged.values())
        if serve < 0:
            longest = max(logged, key=lambda p: logged[p])
            phases[longest] = round(max(0.0, phases[longest] + serve), 3)
    return rec


def rejudged(recorded: dict[str, Any], number: int, **overrides: Any) -> Confirmation:
    """A confirmation file (confirm/NNNN.json) judged again by the tuner's rule, with its own
    tolerance, repeats and finish time unless ``overrides`` says otherwise."""

    objectives = recorded["objectives"]
    runs = [RunResult(**{k: run[k] for k in _RUN_FIELDS}) for run in recorded["runs"]]
    settings = {"tolerance": recorded["tolerance"], "repeats": recorded["repeats"],
                "finished_unix": recorded["finished_unix"], **overrides}
    return judge(number, [o["label"] for o in objectives], [o["direction"] for o in objectives],
                 [o["trial"] for o in objectives], runs, **settings)
