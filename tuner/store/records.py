"""Read a study's Optuna trials back as plain records (``tuner.study.trials.TrialRecord``):
what the policy decides on and status, report and export show.

The orchestrator stores everything it knows about a trial as JSON user attributes (so
``optuna-dashboard`` and any script can read them too); this module is their one reader.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.study.trials import KIND_RUN, TrialRecord

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

# No Optuna at import time: `tuner status` imports this module, and importing Optuna (with
# SQLAlchemy, Alembic, NumPy) costs more than the rest of the command.

logger = logging.getLogger(__name__)

__all__ = ["StoredStudy", "to_record", "read_records", "RecordReader", "read_records_direct",
           "read_sqlite_study"]


def to_record(trial: FrozenTrial, labels: list[str]) -> TrialRecord:
    """One Optuna trial as a plain record (``labels``: the objectives, in order)."""

    values: dict[str, float] = {}
    if trial.values is not None:
        values = dict(zip(labels, trial.values, strict=False))
    seconds = None
    if trial.datetime_start and trial.datetime_complete:
        seconds = (trial.datetime_complete - trial.datetime_start).total_seconds()
    return TrialRecord(
        number=trial.number,
        state=trial.state.name,
        kind=str(trial.user_attrs.get("kind", KIND_RUN)),
        params=dict(trial.user_attrs.get("values", trial.params)),
        values=values,
        constraints=dict(trial.constraints),
        attrs=dict(trial.user_attrs),
        seconds=seconds,
    )


def _labels(study: optuna.Study) -> list[str]:
    return list(study.metric_names or [f"objective{i}" for i in range(len(study.directions))])


def read_records(study: optuna.Study) -> list[TrialRecord]:
    labels = _labels(study)
    return [to_record(t, labels) for t in study.get_trials(deepcopy=False)]


class RecordReader:
    """``read_records`` for the study a loop is running, called before and after every
    trial: a finished trial never changes again (Optuna refuses to update one), so each is
    converted once and the same record returned after. Only running and waiting trials
    are read anew. Records are shared: read them, do not change them."""

    def __init__(self) -> None:
        self._finished: dict[int, TrialRecord] = {}

    def __call__(self, study: optuna.Study) -> list[TrialRecord]:
        labels: list[str] | None = None
        out = []
        for trial in study.get_trials(deepcopy=False):
            record = self._finished.get(trial.number)
            if record is None:
                labels = labels or _labels(study)
                record = to_record(trial, labels)
                if trial.state.is_finished():
                    self._finished[trial.number] = record
            out.append(record)
        return out


# Columns read straight from Optuna's RDB schema (optuna/storages/_rdb/models.py, unchanged
# from schema v3 to Optuna 5): trials, trial_values, trial_user_attributes,
# trial_system_attributes and trial_params.
_TRIALS_SQL = ("SELECT trial_id, number, state, datetime_start, datetime_complete FROM trials "
               "WHERE study_id = :sid ORDER BY number")
_PER_TRIAL_SQL = {
    "values": "SELECT v.trial_id, v.objective, v.value, v.value_type FROM trial_values v "
              "JOIN trials t ON t.trial_id = v.trial_id WHERE t.study_id = :sid",
    "user": "SELECT a.trial_id, a.key, a.value_json FROM trial_user_attributes a "
            "JOIN trials t ON t.trial_id = a.trial_id WHERE t.study_id = :sid",
    "system": "SELECT a.trial_id, a.key, a.value_json FROM trial_system_attributes a "
              "JOIN trials t ON t.trial_id = a.trial_id WHERE t.study_id = :sid AND a.key LIKE 'constraints%'",
    "params": "SELECT p.trial_id, p.param_name, p.param_value, p.distribution_json FROM trial_params p "
              "JOIN trials t ON t.trial_id = p.trial_id WHERE t.study_id = :sid",
}


def _when(value: Any) -> dt.datetime | None:
    if value is None or isinstance(value, dt.datetime):
        return value
    return dt.datetime.fromisoformat(str(value))


def read_records_direct(study: optuna.Study) -> list[TrialRecord]:
    """``read_records`` for a process that has not read the study yet (``tuner status``).

    Optuna builds a FrozenTrial per trial (every attribute decoded, distributions checked),
    about 1 s for 1,000 trials; the records need a few columns, which five plain queries on
    the same database return in a tenth of that. Any storage that is not Optuna's RDB
    storage, or anything unexpected in it, falls back to ``read_records``.
    """

    try:
        # Optuna's private layout (a _CachedStorage around an RDBStorage); AttributeError otherwise.
        engine = study._storage._backend.engine  # type: ignore[attr-defined]
        study_id = study._study_id
    except AttributeError:
        return read_records(study)
    try:
        return _read_rows(engine, study_id, study)
    except Exception:
        logger.debug("direct read of the study failed; reading through Optuna", exc_info=True)
        return read_records(study)


def _read_rows(engine: Any, study_id: int, study: optuna.Study) -> list[TrialRecord]:
    from sqlalchemy import text

    labels = list(study.metric_names or [f"objective{i}" for i in range(len(study.directions))])
    with engine.connect() as conn:
        trials = conn.execute(text(_TRIALS_SQL), {"sid": study_id}).all()
        rows = {k: conn.execute(text(q), {"sid": study_id}).all() for k, q in _PER_TRIAL_SQL.items()}
    return _records_from_rows(trials, rows, labels)


def _records_from_rows(trials: list[Any], rows: dict[str, list[Any]], labels: list[str]) -> list[TrialRecord]:
    """Records from the rows of _TRIALS_SQL and _PER_TRIAL_SQL (SQLAlchemy or sqlite3 alike:
    enums arrive as members from one and as their names from the other)."""

    values: dict[int, dict[int, float]] = {}
    for tid, objective, value, kind in rows["values"]:
        kind = getattr(kind, "name", kind)
        values.setdefault(tid, {})[int(objective)] = (
            math.inf if kind == "INF_POS" else -math.inf if kind == "INF_NEG" else float(value))
    user: dict[int, dict[str, Any]] = {}
    for tid, key, raw in rows["user"]:
        user.setdefault(tid, {})[key] = json.loads(raw)
    constraints: dict[int, dict[str, float]] = {}
    for tid, key, raw in rows["system"]:
        if key.startswith("constraints:"):
            constraints.setdefault(tid, {})[key[len("constraints:"):]] = float(json.loads(raw))
        elif key == "constraints":          # Optuna's old list format
            for i, c in enumerate(json.loads(raw) or []):
                constraints.setdefault(tid, {})[str(i)] = float(c)
    raw_params: dict[int, list[tuple[str, float, str]]] = {}
    for tid, name, internal, dist in rows["params"]:
        raw_params.setdefault(tid, []).append((name, internal, dist))

    def params(tid: int) -> dict[str, Any]:
        # Only for trials without the "values" attribute the orchestrator sets (decoding a
        # distribution per parameter and trial would cost more than the rest of the read).
        return {name: _external(internal, dist) for name, internal, dist in raw_params.get(tid, [])}
    out = []
    for tid, number, state, start, complete in trials:
        state = getattr(state, "name", str(state))
        attrs = user.get(tid, {})
        vals = values.get(tid)
        start, complete = _when(start), _when(complete)
        out.append(TrialRecord(
            number=int(number), state=state, kind=str(attrs.get("kind", KIND_RUN)),
            params=dict(attrs["values"]) if "values" in attrs else params(tid),
            values={} if not vals else {labels[i]: v for i, v in sorted(vals.items()) if i < len(labels)},
            constraints=constraints.get(tid, {}), attrs=attrs,
            seconds=(complete - start).total_seconds() if start and complete else None))
    return out


def _external(internal: float, distribution_json: str) -> Any:
    """A parameter's value as the trial was given it: Optuna's to_external_repr for the
    three distributions the tuner uses (optuna/distributions.py), Optuna itself for others;
    importing Optuna for this would double the time of `tuner status`."""

    data = json.loads(distribution_json)
    name = data.get("name")
    if name == "CategoricalDistribution":
        return data["attributes"]["choices"][int(internal)]
    if name == "IntDistribution":
        return int(internal)
    if name == "FloatDistribution":
        return internal
    from optuna.distributions import json_to_distribution

    return json_to_distribution(distribution_json).to_external_repr(internal)


# Optuna keeps metric names as this study system attribute (optuna/study/study.py).
_METRIC_NAMES_KEY = "study:metric_names"


@dataclass
class StoredStudy:
    """What ``tuner status`` needs of a study, read from its SQLite file without Optuna."""

    name: str
    metric_names: list[str] | None
    directions: list[str]                 # "maximize" / "minimize", by objective
    user_attrs: dict[str, Any]
    records: list[TrialRecord]


def read_sqlite_study(db_path: Path, study_name: str) -> StoredStudy | None:
    """The study ``study_name`` in the Optuna SQLite file ``db_path``, read with sqlite3.

    Opening the file through Optuna means importing it (NumPy, SQLAlchemy, Alembic: about
    0.3 s) and checking the schema version (another 0.35 s), three times what reading the
    tables takes. The queries are the ones ``read_records_direct`` runs through SQLAlchemy.
    None when the file, the study or any table or column is not what this reader knows; the
    caller then reads through Optuna, which reports what is wrong.
    """

    import sqlite3

    try:
        # mode=rw: never create a database that is not there. The busy timeout lets this
        # read while a study writes; past it, the caller reads through Optuna, which waits
        # the storage's whole budget (tuner.store.handle.RetryPolicy).
        conn = sqlite3.connect(f"{Path(db_path).resolve().as_uri()}?mode=rw", uri=True, timeout=10.0)
    except sqlite3.Error:
        return None
    try:
        # One read transaction: a trial told between two queries must not appear in one
        # table and not in another.
        conn.execute("BEGIN")
        found = conn.execute("SELECT study_id FROM studies WHERE study_name = ?", (study_name,)).fetchone()
        if found is None:
            return None
        sid = found[0]
        directions = [str(d).lower() for (d,) in conn.execute(
            "SELECT direction FROM study_directions WHERE study_id = ? ORDER BY objective", (sid,))]
        user_attrs = {k: json.loads(v) for k, v in conn.execute(
            "SELECT key, value_json FROM study_user_attributes WHERE study_id = ?", (sid,))}
        names = conn.execute("SELECT value_json FROM study_system_attributes WHERE study_id = ? AND key = ?",
                             (sid, _METRIC_NAMES_KEY)).fetchone()
        metric_names = json.loads(names[0]) if names else None
        trials = conn.execute(_TRIALS_SQL, {"sid": sid}).fetchall()
        rows = {k: conn.execute(q, {"sid": sid}).fetchall() for k, q in _PER_TRIAL_SQL.items()}
        conn.execute("COMMIT")
    except (sqlite3.Error, ValueError):
        logger.debug("reading %s with sqlite3 failed; reading through Optuna", db_path, exc_info=True)
        return None
    finally:
        conn.close()
    if any(d not in ("maximize", "minimize") for d in directions) or not directions:
        return None
    labels = list(metric_names or [f"objective{i}" for i in range(len(directions))])
    try:
        records = _records_from_rows(trials, rows, labels)
    except (ValueError, TypeError, KeyError):
        logger.debug("unexpected rows in %s; reading through Optuna", db_path, exc_info=True)
        return None
    return StoredStudy(study_name, metric_names, directions, user_attrs, records)
