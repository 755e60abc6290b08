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
from tuner.study.ties import Pooled, candidates, next_runs, remaining_ties, ties_record

if TYPE_CHECKING:
    from tuner.engine.execution import JobHost

__all__ = ["separate_ties"]


def _objectives(host: JobHost) -> tuple[list[str], list[str]]:
    return ([o.label for o in host.spec.objectives], [o.direction for o in host.spec.objectives])


def _candidates(host: JobHost, study: optuna.Study) -> list[Pooled]:
    """The noisy front's points, pooled with their re-runs so far (tuner.study.ties)."""

    labels, directions = _objectives(host)
    return candidates(read_records(study), host.paths.confirmations(), directions, labels)


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
        pooled_now = _candidates(host, study)
        ties = remaining_ties(pooled_now, directions, labels)
        if not ties:
            break
        runs = {c.number: c.runs for c in pooled_now}
        todo = next_runs(ties, runs, cfg.tie_runs - spent)
        host.progress(f"[ties] {len(ties)} tie(s) within noise; re-running trial(s) {todo} "
                      f"({spent + len(todo)} of {cfg.tie_runs} runs)")
        verdicts = confirm_trials(host, study, todo, repeats=1, tolerance=cfg.tolerance,
                                  keep_previous=True)
        spent += len(todo)
        rounds.append({"trials": todo, "ties_before": [t.as_dict() for t in ties],
                       "finished": [v.trial for v in verdicts]})
        _write(host, ties_record(budget=cfg.tie_runs, spent=spent, spent_s=time.monotonic() - began,
                                 rounds=rounds, first=first, pooled_now=_candidates(host, study),
                                 directions=directions, labels=labels))
    record = ties_record(budget=cfg.tie_runs, spent=spent, spent_s=time.monotonic() - began, rounds=rounds,
                         first=first, pooled_now=_candidates(host, study), directions=directions, labels=labels)
    _write(host, record)
    left = record["remaining_ties"]
    host.progress(f"[ties] {spent} extra run(s) spent; "
                  + (f"{len(left)} tie(s) remain: " + "; ".join(t["text"] for t in left)
                     if left else "no tie remains"))
    return record


def _write(host: JobHost, record: dict[str, Any]) -> None:
    try:
        atomic_write_json(host.paths.confirm_root / "ties.json", record)
    except ArtifactWriteError as err:
        host.progress(f"[ties] ties.json not written ({err.reason}): {err}")
