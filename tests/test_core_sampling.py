"""The sampler factory and its wrappers: Pareto local search, repeat avoidance, designs."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from tests.sim_studies import SMALL_STUDY
from tuner.engine import samplers
from tuner.study import sampling, space
from tuner.study.study_file import parse_study

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def glm5():
    path = ROOT / "search_spaces" / "glm5-8xpcie.yaml"
    return parse_study(path.read_text(), str(path))


@pytest.fixture(scope="module")
def small():
    return parse_study(SMALL_STUDY, "small")


def suggest_all(trial, spec):
    values = {}
    for param in space.ordered_parameters(spec):
        if space.is_active(param, values):
            values[param.name] = trial.suggest_categorical(param.name, param.domain()) \
                if param.kind != "int" else trial.suggest_int(param.name, param.low, param.high)
    trial.set_user_attr("values", values)
    return values


def changed(a: dict, b: dict) -> set[str]:
    return {k for k in set(a) | set(b) if a.get(k, "absent") != b.get(k, "absent")}


def test_neighbours_change_one_knob(glm5) -> None:
    base = space.baseline_values(glm5)
    when = {p.name: p.when for p in glm5.parameters}
    near = sampling.neighbours(glm5, base)
    assert len({space.params_key(n) for n in near}) == len(near)
    for n in near:
        assert space.forbidden_reason(glm5, n) is None
        diff = changed(base, n)
        top = [k for k in diff if not when[k]]
        # One knob changed; its branch's children appear or disappear with it.
        assert len(top) <= 1 and (top or len(diff) == 1)
    # Every value of every active knob is reached, including speculation with a default k.
    assert {n.get("spec_method") for n in near} >= {"ngram", "mtp"}
    assert any(n.get("nccl_proto") == "LL" for n in near)


def test_make_sampler_defaults_and_overrides(glm5) -> None:
    assert isinstance(samplers.make_sampler(glm5), samplers.PlannedSampler)
    tpe = glm5.model_copy(update={"sampler": glm5.sampler.model_copy(update={"name": "tpe"})})
    assert isinstance(samplers.make_sampler(tpe), samplers.ParetoLocalSampler)
    nsga = glm5.model_copy(update={"sampler": glm5.sampler.model_copy(update={"name": "nsga2"})})
    assert isinstance(samplers.make_sampler(nsga), optuna.samplers.NSGAIISampler)
    rnd = glm5.model_copy(update={"sampler": glm5.sampler.model_copy(update={"name": "random"})})
    assert isinstance(samplers.make_sampler(rnd), optuna.samplers.RandomSampler)


def test_local_trials_measure_a_new_neighbour_of_the_front(small) -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    sampler = samplers.ParetoLocalSampler(optuna.samplers.RandomSampler(seed=0), small, local=1.0,
                                          min_trials=3, seed=0)
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=sampler)
    seen = []
    local = 0
    for i in range(12):
        trial = study.ask()
        values = suggest_all(trial, small)
        front_before = [space.params_key(v) for v in sampler_front(study)]
        seen_before = {space.params_key(v) for v in seen}
        seen.append(values)
        # A made-up objective: more throughput and less latency with mtp, worse when eager.
        thr = 100 + 50 * (values.get("spec_method") == "mtp") - 60 * values["enforce_eager"]
        tpot = 20 - 5 * (values.get("spec_method") == "mtp") + 10 * values["enforce_eager"] + i * 0.01
        study.tell(trial, [thr, tpot])
        fresh = {space.params_key(n) for f in front_before for n in sampling.neighbours(small, _point(f))
                 if space.params_key(n) not in seen_before}
        if i >= 3 and fresh:
            # While the front has unmeasured neighbours, every trial measures one of them
            # (local share 1.0); afterwards the wrapped sampler takes over.
            assert space.params_key(values) in fresh, i
            local += 1
    assert local >= 5


def sampler_front(study):
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    front = []
    for t in done:
        if not any(o.values[0] >= t.values[0] and o.values[1] <= t.values[1] and o.values != t.values
                   for o in done):
            front.append(t.user_attrs["values"])
    return front


def _point(key: str) -> dict:
    import json

    return json.loads(key)


def test_enqueued_trials_are_left_alone(small) -> None:
    sampler = samplers.ParetoLocalSampler(optuna.samplers.RandomSampler(seed=1), small, local=1.0,
                                          min_trials=0, seed=1)
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=sampler)
    base = space.baseline_values(small)
    study.enqueue_trial(base)
    trial = study.ask()
    assert suggest_all(trial, small) == base


def test_initial_design_is_one_knob_at_a_time(glm5) -> None:
    base = space.baseline_values(glm5)
    when = {p.name: p.when for p in glm5.parameters}
    design = sampling.initial_design(glm5)
    assert 0 < len(design) <= glm5.budget.n_trials * sampling.MAX_DESIGN_FRACTION
    assert len({space.params_key(p) for p in design}) == len(design)
    for point in design:
        assert space.forbidden_reason(glm5, point) is None
        assert len([k for k in changed(base, point) if not when[k]]) <= 1
    assert len(sampling.initial_design(glm5, children=True)) > len(design)


def _made_up(values: dict, i: int) -> list[float]:
    thr = 100 + 50 * (values.get("spec_method") == "mtp") - 60 * values["enforce_eager"] + (i % 7)
    tpot = 20 - 5 * (values.get("spec_method") == "mtp") + 10 * values["enforce_eager"] + (i % 5) * 0.3
    return [thr, tpot]


def test_below_the_history_limit_tpe_proposes_what_it_would_alone(small) -> None:
    """The wrapper hands TPE one trial list per proposal; while the study is smaller than
    the history limit that list is the whole study, so TPE's proposals are unchanged
    (two trials in flight at a time, as with two GPU groups: constant liar sees them)."""

    optuna.logging.set_verbosity(optuna.logging.ERROR)

    def run(sampler) -> list[dict]:
        study = optuna.create_study(directions=["maximize", "minimize"], sampler=sampler)
        out = []
        for i in range(0, 40, 2):
            pair = [study.ask(), study.ask()]
            for j, trial in enumerate(pair):
                out.append(suggest_all(trial, small))
                study.tell(trial, _made_up(out[-1], i + j))
        return out

    def tpe():
        return optuna.samplers.TPESampler(seed=3, constant_liar=True, n_startup_trials=6)

    wrapped = samplers.ParetoLocalSampler(tpe(), small, local=0.0, min_trials=6, seed=3, history=1000)
    alone = run(tpe())
    assert run(wrapped) == alone
    assert len({space.params_key(v) for v in alone}) > 4      # TPE did choose, not one point


class _Recording(optuna.samplers.RandomSampler):
    """Records which trials the wrapped sampler was shown for each suggestion."""

    def __init__(self) -> None:
        super().__init__(seed=0)
        self.shown: list[list[int]] = []

    def sample_independent(self, study, trial, param_name, param_distribution):
        self.shown.append([t.number for t in study.get_trials(deepcopy=False)])
        return super().sample_independent(study, trial, param_name, param_distribution)


@pytest.mark.parametrize(("share", "newest"), [(0.0, 5), (0.5, 15)])
def test_a_large_study_shows_tpe_the_front_and_the_newest_trials(small, monkeypatch, share, newest) -> None:
    """30 finished trials, history 5: the front, the newest max(5, share x 30) trials and
    the running ones; never the old infeasible trial 0."""

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    monkeypatch.setattr(samplers, "HISTORY_SHARE", share)
    base = _Recording()
    sampler = samplers.ParetoLocalSampler(base, small, local=0.0, min_trials=0, seed=0, history=5)
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=sampler)
    for i in range(30):
        trial = study.ask()
        values = suggest_all(trial, small)
        if i == 0:
            trial.set_constraint("probe", 1.0)      # the best point, but infeasible
            study.tell(trial, [1e6, 0.0])
        else:
            study.tell(trial, _made_up(values, i))
    running = study.ask()                           # in flight on another group
    base.shown.clear()
    current = study.ask()
    suggest_all(current, small)
    feasible = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE and t.number != 0]
    front = {t.number for t in feasible
             if not any(o.values[0] >= t.values[0] and o.values[1] <= t.values[1] and o.values != t.values
                        for o in feasible)}
    expected = sorted(front | set(range(30 - newest, 30)) | {running.number, current.number})
    assert base.shown and all(shown == expected for shown in base.shown)
    assert 0 not in expected and len(expected) < 30
