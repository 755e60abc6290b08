"""Spend ``confirm.tie_runs`` fresh-server re-runs on front candidates noise cannot tell
apart (tuner.study.ties), and record what was spent and what stayed a tie.

Runs after the confirmation re-runs, through the same machinery (``tuner.engine.confirming``):
each re-run is a whole trial again in ``confirm/NNNN-K/`` and joins the candidate's
confirmation verdict. The result is written to ``confirm/ties.json`` after every round, so
an interrupted study keeps what it learned.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import optuna

from tuner.adapters.artifacts import atomic_write_json
from tuner.engine.confirming import confirm_trials
from tuner.errors import ArtifactWriteError
from tuner.store.records import read_records
from tuner.study.noise import noisy_front
from tuner.study.ties import Pooled, next_runs, pooled, remaining_ties
from tuner.study.trials import noisy_points

if TYPE_CHECKING:
    from tuner.engine.execution import JobHost

__all__ = ["separate_ties"]


def _objectives(host: JobHost) -> tuple[list[str], list[str]]:
    return ([o.label for o in host.spec.objectives], [o.direction for o in host.spec.objectives])


def _candidates(host: JobHost, study: optuna.Study) -> list[Pooled]:
    """The noisy front's points, pooled with their re-runs so far."""
    labels, directions = _objectives(host)
    records = {r.number: r for r in read_records(study)}
    points = noisy_points(list(records.values()), labels)
    near, _ = noisy_front(points, directions, labels)
    confirmations = host.paths.confirmations()
    out = []
    for number in near:
        record = records[number]
        samples = [[record.values[l] for l in labels]]
        for run in (confirmations.get(number) or {}).get("runs") or []:
            if run.get("feasible") and run.get("values") is not None:
                samples.append([float(v) for v in run["values"]])
        out.append(pooled(number, samples, list(record.noise(labels).values())))
    return out


def separate_ties(host: JobHost, study: optuna.Study) -> dict[str, Any] | None:
    """Re-run tied candidates until separated or ``confirm.tie_runs`` runs are spent; the
    record (also ``confirm/ties.json``), or None when the setting is off."""
    cfg = host.spec.confirm
    if cfg.tie_runs <= 0:
        return None
    labels, directions = _objectives(host)
    began = time.monotonic()
    rounds: list[dict[str, Any]] = []
    spent = 0
    first = remaining_ties(_candidates(host, study), directions, labels)
    while spent < cfg.tie_runs and not host.interrupted():
        candidates = _candidates(host, study)
        ties = remaining_ties(candidates, directions, labels)
        if not ties:
            break
        runs = {c.number: c.runs for c in candidates}
        todo = next_runs(ties, runs, cfg.tie_runs - spent)
        host.progress(f"[ties] {len(ties)} tie(s) within noise; re-running trial(s) {todo} "
                      f"({spent + len(todo)} of {cfg.tie_runs} runs)")
        verdicts = confirm_trials(host, study, todo, repeats=1, tolerance=cfg.tolerance,
                                  keep_previous=True)
        spent += len(todo)
        rounds.append({"trials": todo, "ties_before": [t.as_dict() for t in ties],
                       "finished": [v.trial for v in verdicts]})
        _write(host, _record(cfg.tie_runs, spent, began, rounds, first,
                             _candidates(host, study), directions, labels))
    record = _record(cfg.tie_runs, spent, began, rounds, first, _candidates(host, study),
                     directions, labels)
    _write(host, record)
    left = record["remaining_ties"]
    host.progress(f"[ties] {spent} extra run(s) spent; "
                  + (f"{len(left)} tie(s) remain: " + "; ".join(t["text"] for t in left)
                     if left else "no tie remains"))
    return record


def _record(budget: int, spent: int, began: float, rounds: list[dict[str, Any]],
            first: list[Any], candidates: list[Pooled], directions: list[str],
            labels: list[str]) -> dict[str, Any]:
    left = remaining_ties(candidates, directions, labels)
    left_pairs = {t.trials for t in left}
    return {
        "budget_runs": budget,
        "spent_runs": spent,
        "spent_s": time.monotonic() - began,
        "rounds": rounds,
        "ties_at_start": [t.as_dict() for t in first],
        "separated": [t.as_dict() for t in first if t.trials not in left_pairs],
        "remaining_ties": [t.as_dict() for t in left],
        "pooled": {str(c.number): {"runs": c.runs, "values": dict(zip(labels, c.values)),
                                   "noise": dict(zip(labels, c.noise))} for c in candidates},
    }


def _write(host: JobHost, record: dict[str, Any]) -> None:
    try:
        atomic_write_json(host.paths.confirm_root / "ties.json", record)
    except ArtifactWriteError as err:
        host.progress(f"[ties] ties.json not written ({err.reason}): {err}")
