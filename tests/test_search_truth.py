"""Ground truth of a search space on the simulator: verdicts, calibration, hypervolume."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.sim_studies import build_ground_truth
from tuner.sim import ground_truth, truth_verify
from tuner.sim import truth as st
from tuner.sim.dry_log import startup_log
from tuner.sim.profile import load_profile
from tuner.study import space
from tuner.study.study_file import parse_study
from tuner.vllm.effective_config import parse_effective_config
from tuner.vllm.verify import verify

ROOT = Path(__file__).resolve().parents[1]
GLM = load_profile("glm5-8xpcie")


def spec_of(name: str):
    path = ROOT / "search_spaces" / name
    return parse_study(path.read_text(), str(path))


@pytest.fixture(scope="module")
def glm5():
    return spec_of("glm5-8xpcie.yaml")


@pytest.fixture(scope="module")
def small():
    from tests.sim_studies import SMALL_STUDY

    return parse_study(SMALL_STUDY, "small")


@pytest.fixture(scope="module")
def large():
    return spec_of("glm5-8xpcie-large.yaml")


def test_enumeration_matches_the_tuners_space_size(glm5, large) -> None:
    for spec in (glm5, large):
        points = st.enumerate_points(spec)
        assert len(points) == space.discrete_size(spec)[0]
        assert len({space.params_key(p) for p in points}) == len(points)


def test_outcomes_of_known_points(large) -> None:
    # Levels up to 16 keep the test fast; the verdicts and the c=1 calibration are the same.
    large = large.model_copy(update={"load": large.load.model_copy(update={"concurrency": (1, 4, 16)})})
    ev = st.Evaluator(large, GLM)
    base = space.baseline_values(large)
    b = ev.evaluate(base)
    assert b.status == "completed" and b.applied and b.probe_passed
    # Field notes: about 43 tok/s for one stream with graphs and NCCL's default protocol.
    assert b.levels[1].metrics["output_tok_s"] == pytest.approx(43, rel=0.1)
    tok_s = {c: b.levels[c].metrics["output_tok_s"] for c in (1, 4, 16)}
    assert tok_s[16] > tok_s[4] > tok_s[1]
    full = ev.evaluate({**base, "cudagraph_mode": "FULL", "capture_max": None})
    assert not full.applied and full.mismatches == ("compilation_config.cudagraph_mode",)
    custom = {k: v for k, v in base.items() if k not in ("nccl_proto", "nccl_algo")}
    assert ev.evaluate({**custom, "disable_custom_all_reduce": False}).mismatches == ("disable_custom_all_reduce",)
    ll128 = ev.evaluate({**base, "nccl_proto": "LL128"})
    assert ll128.applied and not ll128.probe_passed
    bad = ev.evaluate({**base, "spec_method": "ngram", "spec_k": 2, "lookup_min": 3, "lookup_max": 2})
    assert bad.failed and bad.reason == "invalid_config" and not bad.levels
    assert bad.startup_s < b.startup_s / 10          # refused at argument time, not after loading


def test_natural_stopping_and_ngram_calibration(small) -> None:
    ev = st.Evaluator(small, GLM)
    eos = ev.workload(16, True, None)
    natural = ev.workload(16, False, None)
    assert eos.output_tokens == 48 and eos.output_jitter == 0
    assert eos.requests_per_stream == 2 and 80 < eos.prompt_tokens < 150
    assert natural.output_tokens < 48 and natural.output_jitter > 0.1
    # Copy-heavy requests are where prompt lookup finds drafts.
    copy = ev.workload(1, False, (3, 2, 4), "edit")
    prose = ev.workload(1, False, (3, 2, 4), "chat")
    assert copy.ngram_hit_rate > 3 * prose.ngram_hit_rate
    assert 0 < copy.ngram_accept_prob <= 1


def test_measurement_noise_is_seeded_and_multiplicative(small) -> None:
    truth = st.Evaluator(small, GLM).evaluate(space.baseline_values(small))
    clean = ground_truth.measure(small, truth)
    a = ground_truth.measure(small, truth, noise=0.05, rng=random.Random(3))
    b = ground_truth.measure(small, truth, noise=0.05, rng=random.Random(3))
    assert a == b and a.objectives != clean.objectives
    for noisy, exact in zip(a.objectives, clean.objectives):
        assert 0.75 < noisy / exact < 1.33
    assert clean.feasible and clean.constraints["limit:ttft_ms.p90@c1<=5000.0"] < 0


def test_hypervolume_and_reference() -> None:
    dirs = ["maximize", "minimize"]
    front = [(300.0, 14.0), (280.0, 11.0)]
    ref = ground_truth.reference_point(front, dirs, margin=0.1)
    assert ref == pytest.approx((278.0, 14.3))
    # A = [278, 300] x [14, 14.3], plus B = [278, 280] x [11, 14] (the rest of B overlaps A)
    assert ground_truth.hypervolume(front, dirs, ref) == pytest.approx(22 * 0.3 + 2 * 3.0)
    assert ground_truth.hypervolume(front + [(290.0, 15.0), (270.0, 10.0)], dirs, ref) == \
        pytest.approx(22 * 0.3 + 2 * 3.0)
    assert ground_truth.hypervolume([(300.0, 14.0)], dirs, ref) == pytest.approx(22 * 0.3)
    assert ground_truth.hypervolume([], dirs, ref) == 0.0


def test_ground_truth_round_trips_through_json(small) -> None:
    points = st.enumerate_points(small)[::5]
    truth = build_ground_truth(small, GLM, points=points)
    again = ground_truth.GroundTruth.from_json(truth.to_json())
    assert again.front == truth.front and again.hypervolume == pytest.approx(truth.hypervolume)
    assert again.get(points[3]) == truth.get(points[3])


def test_not_applied_shows_in_the_log_before_the_weights_are_loaded(large) -> None:
    """startup_verdict() stops the downgrades of these spaces at communicator / attention
    init: the log before "Loading weights took" must already fail verification."""

    ev = st.Evaluator(large, GLM)
    base = space.baseline_values(large)
    custom = {k: v for k, v in base.items() if k not in ("nccl_proto", "nccl_algo")}
    for values in ({**base, "cudagraph_mode": "FULL"}, {**custom, "disable_custom_all_reduce": False}):
        command = truth_verify.default_render(large, values)
        text = startup_log(command.argv[len(large.server.command):], command.launch_env, GLM)
        early = text[:text.index("Loading weights took")]
        asked = command.asked
        assert verify(asked, parse_effective_config(early)).mismatches(), values
        seen = ev.startup_verdict(values)
        assert seen is not None and seen.seconds < ev.evaluate(values).startup_s / 10
    assert ev.startup_verdict(base) is None


@pytest.mark.parametrize("name", ["glm5-8xpcie.yaml", "glm5-8xpcie-large.yaml"])
def test_startup_stop_never_stops_what_full_verification_would_pass(name) -> None:
    """Early stop while starting (vllm.verify.startup_mismatches on the simulator's log cut
    where the weights start loading, as Evaluator.startup_verdict cuts it) finds only
    targets the full log confirms not applied, and finds some in these spaces."""

    from tuner.vllm.effective_config import parse_effective_config
    from tuner.vllm.verify import startup_mismatches

    spec = spec_of(name)
    ev = st.Evaluator(spec, GLM)
    early_seen = 0
    for values in random.Random(9).sample(st.enumerate_points(spec), 40):
        start = truth_verify.sim_start(spec, values, GLM)
        if start is None:
            continue
        argv, env, asked = start.argv, start.env, start.asked
        lines = startup_log(argv, env, GLM).splitlines()
        cut = next(i for i, line in enumerate(lines) if "Loading weights" in line or "Loading model" in line)
        early = set(startup_mismatches(asked, parse_effective_config("\n".join(lines[:cut]))))
        assert early <= set(truth_verify.log_mismatches(argv, env, asked, GLM)), values   # never a wrong stop
        assert (ev.startup_verdict(values) is not None) == bool(early), values
        early_seen += bool(early)
    assert early_seen, "no early verdict in the sample: the check would prove nothing"


def test_startup_stop_defers_to_full_verification_once_capture_lines_appear(glm5) -> None:
    """A capture still running shows one kind of graph so far; a cudagraph_mode verdict is
    only taken early before the first capture line (afterwards "ready" is seconds away)."""

    from tuner.vllm.effective_config import parse_effective_config
    from tuner.vllm.verify import startup_mismatches

    values = next(v for v in st.enumerate_points(glm5)
                  if v.get("cudagraph_mode") == "FULL" and v.get("disable_custom_all_reduce") is True)
    command = truth_verify.default_render(glm5, values)
    asked = command.asked
    lines = startup_log(command.argv[len(glm5.server.command):], command.launch_env, GLM).splitlines()
    cut = next(i for i, line in enumerate(lines) if "Loading weights" in line or "Loading model" in line)
    early = startup_mismatches(asked, parse_effective_config("\n".join(lines[:cut])))
    assert early == ["compilation_config.cudagraph_mode"]
    capture = next(i for i, line in enumerate(lines) if "Capturing CUDA graphs" in line)
    assert startup_mismatches(asked, parse_effective_config("\n".join(lines[:capture + 1]))) == []
