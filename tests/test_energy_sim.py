"""End to end: the simulator's modelled energy, recovered by the measurement.

The simulator (tiny-cpu: one CPU package, 20 W idle, 65 W busy) writes its energy counter
as a powercap tree (TUNER_SIM_POWERCAP_DIR); the RAPL reader samples it beside a closed-loop
level; joules per output token over the level's steady window must equal what the profile
models for that window (idle power throughout, busy power while requests were in flight,
in simulated seconds) within the interval the measurement states. The idle draw before the
level must be the profile's idle watts, within its interval. Plus the power model's pieces.
"""

from __future__ import annotations

import asyncio
import os
import stat
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.sim_process import serving_sim
from tests.waiting import wait_for
from tuner.adapters.artifacts import StudyPaths
from tuner.energy.per_token import idle_draw, window_joules_per_token
from tuner.energy.rapl import RaplSource, open_rapl
from tuner.energy.sampler import EnergySampler
from tuner.energy.series import shifted
from tuner.engine.trial_energy import simulator_energy_env
from tuner.load.closed_loop import run_level
from tuner.load.records import RequestRecord
from tuner.load.window import WindowPolicy, window_rates
from tuner.load.workload import RequestPlan
from tuner.sim.power import POWERCAP_DIR_ENV, RANGE_UJ, WRITE_PERIOD_S, BusyClock, PowercapDir, energy_j
from tuner.sim.profile import DEFAULT_POWER, PowerSpec, ProfileError, load_profile, parse_profile

SCALE = 0.05
CONCURRENCY = 4


def plan(n: int) -> list[RequestPlan]:
    return [RequestPlan(index=i, class_name="t", kind="open_ended", prompt=f"Tell me about the number {i}.",
                        max_tokens=48, ignore_eos=True, target_prompt_tokens=8) for i in range(n)]


def in_flight_s(records: Sequence[RequestRecord], start: float, end: float) -> float:
    """Seconds of [start, end] with at least one request in flight (the engine has work only
    then: a request reaches it after its dispatch and leaves it before its end)."""
    spans = sorted((max(r.dispatch_s, start), min(r.done_s, end)) for r in records)
    covered, reach = 0.0, start
    for a, b in spans:
        if b <= reach:
            continue
        covered += b - max(a, reach)
        reach = b
    return covered


# quiethost: the simulator writes its counter from its event loop every 50 ms, and a loop
# held up by a busy host writes late, which the interval's resolution term does not cover.
@pytest.mark.slow
@pytest.mark.quiethost
def test_the_simulators_modelled_energy_is_recovered_within_the_stated_interval(tmp_path: Path) -> None:
    cap = tmp_path / "powercap"
    spec = load_profile("tiny-cpu").power_spec
    with serving_sim(tmp_path, TUNER_SIM_POWERCAP_DIR=str(cap), TUNER_SIM_TIME_SCALE=str(SCALE)) as url:
        wait_for(lambda: (cap / "intel-rapl:0" / "energy_uj").is_file(), 10, "the simulated counter")
        source = open_rapl(cap, update_s=WRITE_PERIOD_S)      # the simulator's counter refresh
        assert isinstance(source, RaplSource), source
        with EnergySampler(source) as sampler:
            quiet_from = time.monotonic()
            time.sleep(2.5)
            # The records' time base: run_level takes time.monotonic() as it starts, within
            # microseconds of this (far inside the 50 ms sampling period).
            origin = time.monotonic()
            records = asyncio.run(run_level(url, "smol", plan(150), concurrency=CONCURRENCY, api="completions",
                                            deadline_s=None, request_timeout_s=60))
            time.sleep(0.2)
        series = sampler.series
    assert sampler.failed_reads == 0, sampler.last_error

    # Idle: no request yet, so the package draws idle_w (in simulated seconds: / SCALE).
    idle = idle_draw(series, quiet_from + 0.1, origin - 0.1, source.resolution)
    assert idle.ci95 is not None
    assert abs(idle.watts - spec.idle_w / SCALE) <= idle.ci95, idle

    ok = [r for r in records if r.ok]
    assert len(ok) == len(records) == 150
    total_out = sum(r.n_output_tokens() for r in ok)
    rates = window_rates(records, ok, CONCURRENCY, WindowPolicy(), total_out,
                         sum(r.prompt_tokens or 0 for r in ok))
    assert not rates.window_fallback, rates.window_fallback_reason
    got = window_joules_per_token(shifted(series, origin), rates, source.resolution)
    assert got is not None and got.ci95 is not None
    start, end = got.window_start_s, got.window_end_s
    busy = in_flight_s(records, start, end)
    assert busy > 0.95 * (end - start)            # four streams keep the engine at work
    modelled = energy_j(spec, end - start, busy, SCALE) / got.output_tokens
    assert abs(got.joules_per_token - modelled) <= got.ci95, (got, modelled)
    assert got.ci95 < 0.25 * modelled, got          # and the interval says something


# -- the power model's pieces ----------------------------------------------------------------

def test_energy_is_idle_throughout_plus_busy_while_at_work_in_simulated_seconds() -> None:
    spec = PowerSpec(idle_w=70, busy_w=700)
    assert energy_j(spec, 10.0, 0.0, 1.0) == 700.0
    assert energy_j(spec, 10.0, 10.0, 1.0) == 7000.0
    assert energy_j(spec, 10.0, 5.0, 0.1) == pytest.approx((700 + 630 * 5) / 0.1)


def test_the_busy_clock_counts_stretches_of_work() -> None:
    busy = BusyClock()
    busy.work(1.0)
    busy.work(1.5)                 # already busy: the stretch still began at 1.0
    assert busy.seconds(2.0) == 1.0
    busy.idle(3.0)
    busy.idle(4.0)
    busy.work(5.0)
    assert busy.seconds(5.5) == 2.5


def test_the_powercap_tree_reads_as_rapl_and_wraps(tmp_path: Path) -> None:
    tree = PowercapDir(tmp_path, 2)
    source = open_rapl(tmp_path)
    assert isinstance(source, RaplSource)
    assert [z.name for z in source.zones] == ["intel-rapl:0", "intel-rapl:1"]
    tree.write(5.0)
    assert source.read() == pytest.approx(10.0)            # two zones of 5 J
    tree.write(RANGE_UJ / 1e6 + 1.0)                       # past the range: wrapped to 1 J
    assert (tmp_path / "intel-rapl:0" / "energy_uj").read_text() == "1000000\n"
    assert source.read() == pytest.approx(2 * (RANGE_UJ / 1e6 + 1.0))


def test_the_powercap_tree_is_owner_only_like_the_study_folder_it_lives_in(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        tree = PowercapDir(tmp_path / "sim-powercap" / "123", 2)
        tree.write(1.0)
    finally:
        os.umask(old)
    made = [p for p in (tmp_path / "sim-powercap").rglob("*")] + [tmp_path / "sim-powercap"]
    assert len(made) == 2 + 2 * 4                          # 2 folders; 2 zones, each a folder of 3 files
    loose = [f"{oct(stat.S_IMODE(p.stat().st_mode))} {p}" for p in made
             if (p.is_dir() and stat.S_IMODE(p.stat().st_mode) != 0o700)
             or (p.is_file() and stat.S_IMODE(p.stat().st_mode) & 0o077)]
    assert not loose


def test_profiles_carry_power_or_get_the_platforms_default() -> None:
    assert load_profile("llama8b-h100").power_spec == PowerSpec(idle_w=70, busy_w=700)
    text = (Path(__file__).parents[1] / "tuner/sim/profiles/tiny-cpu.yaml").read_text()
    bare = parse_profile(text.split("\n# Per CPU package")[0], "bare")
    assert bare.power is None and bare.power_spec == DEFAULT_POWER["cpu"]
    with pytest.raises(ProfileError, match="busy_w 50.0 is below power.idle_w 60.0"):
        parse_profile(text.replace("idle_w: 20.0", "idle_w: 60.0").replace("busy_w: 65.0", "busy_w: 50.0"), "x")


def test_every_job_of_a_study_writes_its_counters_in_the_study_folder(tmp_path: Path) -> None:
    # The reference job's folder is one level down, a trial's or a re-run's two: all of them
    # put the simulator's counters in the study's folder, never beside it in the results root.
    study = tmp_path / "results" / "s1"
    paths = StudyPaths(study)
    study.mkdir(parents=True)
    paths.study_json.write_text("{}")
    argv = ["python", "-m", "tuner.sim", "serve"]
    for job in (paths.reference_dir, study / "trials" / "0007", paths.confirm_dir(7, 1)):
        job.mkdir(parents=True)
        env = simulator_energy_env(argv, job)
        assert env == {POWERCAP_DIR_ENV: str(study.resolve() / "sim-powercap" / str(os.getpid()))}, job
    assert simulator_energy_env(["vllm", "serve", "m"], study / "trials" / "0007") == {}
