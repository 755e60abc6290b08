"""`tuner status` reads a study's records straight from the SQLite tables (records.
read_records_direct); it must return exactly what reading through Optuna returns."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial

from tuner.store import records
from tuner.store.records import read_records, read_records_direct


def _study(tmp_path: Path) -> optuna.Study:
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="s", storage=url, directions=["maximize", "minimize"])
    with warnings.catch_warnings():          # "experimental" since Optuna 3.2
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(["output_tok_s@cmax", "tpot_ms.mean@c1"])
    other = optuna.create_study(study_name="other", storage=url, directions=["maximize", "minimize"])
    other.add_trial(create_trial(state=TrialState.COMPLETE, values=[1.0, 2.0]))   # must not leak in
    dists = {"mode": CategoricalDistribution(["FULL", "NONE", None]), "k": IntDistribution(1, 5),
             "util": FloatDistribution(0.8, 0.95, step=0.05)}
    study.add_trial(create_trial(
        state=TrialState.COMPLETE, values=[300.5, 12.25], params={"mode": "FULL", "k": 3, "util": 0.9},
        distributions=dists, user_attrs={"kind": "run", "values": {"mode": "FULL", "k": 3},
                                         "outcome": {"levels": {"1": {"tpot_ms.mean": 12.25}}}, "baseline": True},
        system_attrs={"constraints:probe": 0.0, "constraints:limit:ttft_ms.p90@c1<=5000": -40.5}))
    study.add_trial(create_trial(state=TrialState.FAIL, params={"mode": None, "k": 1, "util": 0.8},
                                 distributions=dists,
                                 user_attrs={"kind": "run", "failure": {"reason": "server_exited"}}))
    study.add_trial(create_trial(state=TrialState.COMPLETE, values=[math.inf, -math.inf],
                                 user_attrs={"kind": "duplicate", "duplicate_of": 0},
                                 system_attrs={"constraints": [0.0, 1.0]}))      # Optuna's old list format
    study.add_trial(create_trial(state=TrialState.COMPLETE, values=[10.0, 99.0],
                                 user_attrs={"kind": "run", "placeholder_values": True},
                                 system_attrs={"constraints:early_stopped": 1.0, "constraints:applied": 2.0}))
    study.enqueue_trial({"mode": "NONE"})
    running = study.ask()
    running.set_user_attr("kind", "run")
    return study


def test_direct_read_equals_the_optuna_read(tmp_path: Path) -> None:
    _study(tmp_path)  # writes optuna.db, read back fresh below
    fresh = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    # The SQL path itself (read_records_direct would hide a failure behind its fallback).
    direct = records._read_rows(fresh._storage._backend.engine, fresh._study_id, fresh)
    assert read_records_direct(fresh) == direct
    assert [r.number for r in direct] == [0, 1, 2, 3, 4]
    assert direct == read_records(fresh)
    assert direct[1].params == {"mode": None, "k": 1, "util": 0.8}     # no "values" attr: Optuna's params
    assert direct[2].constraints == {"0": 0.0, "1": 1.0}
    assert direct[3].outcome == "not_applied" and not direct[3].feasible
    assert direct[4].state == "RUNNING" and direct[0].seconds is not None


def test_direct_read_falls_back_when_the_storage_is_not_a_database() -> None:
    study = optuna.create_study(directions=["maximize", "minimize"])     # in memory
    study.add_trial(create_trial(state=TrialState.COMPLETE, values=[1.0, 2.0], user_attrs={"kind": "run"}))
    assert read_records_direct(study) == read_records(study)
