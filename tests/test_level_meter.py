"""Energy sampled beside a real level (tests/fake_server.py through conftest's ``served``):
the level tells its time base (``on_start``; after the shards are ready when sharded), the
meter puts its series on it and counts the window's energy, which for a source of known
constant power must come back as that power and as power over throughput per token."""

from __future__ import annotations

import asyncio
import math
import threading
import time

import pytest

from tests.fake_server import Served
from tuner.energy.per_token import CounterResolution
from tuner.load.closed_loop import run_level
from tuner.load.level_meter import LevelMeter
from tuner.load.metrics import compute_level_metrics
from tuner.load.workload import RequestPlan

WATTS = 250.0


class ConstantPower:
    """A counter that grows at exactly WATTS: what the meter measures is known."""

    name = "constant 250 W"
    resolution = CounterResolution(quantum_j=0.001, update_s=0.0)

    def __init__(self) -> None:
        self.opened = time.monotonic()
        self.readers: set[str] = set()

    def read(self) -> float:
        self.readers.add(threading.current_thread().name)
        return WATTS * (time.monotonic() - self.opened)

    def close(self) -> None:
        pass


def plan(n: int, tokens: int = 40) -> list[RequestPlan]:
    return [RequestPlan(index=i, class_name="t", kind="open_ended", prompt=f"hello {i}", max_tokens=tokens,
                        ignore_eos=True, target_prompt_tokens=8) for i in range(n)]


@pytest.mark.parametrize("processes", [1, 2])
def test_the_window_energy_of_a_known_power_comes_back(served: Served, processes: int) -> None:
    source, started = ConstantPower(), []

    async def measure():
        with LevelMeter(source) as meter:
            records = await run_level(served.base_url, "fake", plan(48), concurrency=4, api="completions",
                                      deadline_s=None, request_timeout_s=10.0, processes=processes,
                                      on_start=lambda t: (started.append(t), meter.started(t)))
        return meter, records

    before = time.monotonic()
    meter, records = asyncio.run(measure())
    # One time base, taken after the call began (sharded: once the client processes were ready),
    # and the records are relative to it.
    assert len(started) == 1 and before <= started[0] <= time.monotonic()
    assert 0.0 <= min(r.dispatch_s for r in records) < 0.5
    metrics = meter.attach(compute_level_metrics(records, concurrency=4))
    energy = metrics.energy
    assert energy is not None and energy.source == "constant 250 W"
    assert energy.watts == pytest.approx(WATTS, rel=1e-3)
    assert energy.joules_per_token == pytest.approx(WATTS / metrics.output_tok_s, rel=1e-3)
    assert energy.window_s == pytest.approx(metrics.window_end_s - metrics.window_start_s)
    flat = metrics.flat()
    assert flat["joules_per_token"] == energy.joules_per_token and flat["watts"] == energy.watts
    assert flat["joules_per_request"] == pytest.approx(energy.joules_per_token * 40, rel=1e-6)
    assert "energy-sampler" in source.readers       # read from the sampler's thread, not the loop


def test_without_a_source_or_a_covered_window_nothing_is_added(served: Served) -> None:
    async def measure(source):
        with LevelMeter(source) as meter:
            records = await run_level(served.base_url, "fake", plan(8), concurrency=2, api="completions",
                                      deadline_s=None, request_timeout_s=10.0, on_start=meter.started)
        return meter, records

    meter, records = asyncio.run(measure(None))
    metrics = compute_level_metrics(records, concurrency=2)
    assert meter.attach(metrics) is metrics and math.isnan(meter.attach(metrics).flat().get("watts", math.nan))
    meter, records = asyncio.run(measure(ConstantPower()))
    # A series on the wrong time base does not cover the window: no figure rather than a wrong one.
    assert meter.attach(compute_level_metrics(records, concurrency=2), origin=-1e6).energy is None


class WedgedPower(ConstantPower):
    """A counter that stops answering after ``answers`` readings (a GPU whose driver is
    wedged) until ``release`` is set."""

    name = "wedged"

    def __init__(self, answers: int) -> None:
        super().__init__()
        self.answers = answers
        self.release = threading.Event()

    def read(self) -> float:
        if self.answers <= 0:
            self.release.wait(60)
        self.answers -= 1
        return super().read()


@pytest.mark.parametrize("answers", [0, 3])
def test_a_counter_that_stops_answering_costs_the_level_its_energy_not_its_measurement(
        served: Served, answers: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.energy import sampler as sampler_module

    monkeypatch.setattr(sampler_module, "START_WAIT_S", 0.3)
    monkeypatch.setattr(sampler_module, "STOP_WAIT_S", 0.5)
    source, notes = WedgedPower(answers), []

    async def measure():
        with LevelMeter(source, notes, "c=2") as meter:
            records = await run_level(served.base_url, "fake", plan(16), concurrency=2, api="completions",
                                      deadline_s=None, request_timeout_s=10.0, on_start=meter.started)
        return meter, records

    began = time.monotonic()
    try:
        meter, records = asyncio.run(measure())
        took = time.monotonic() - began
    finally:
        source.release.set()        # the wedged read returns, and the sampler's thread ends
    # Held up for the two waits at most, never for the 60 s the read hangs.
    assert took < 8, took
    metrics = compute_level_metrics(records, concurrency=2)
    assert metrics.completed == 16 and metrics.output_tok_s > 0
    assert meter.attach(metrics).energy is None       # the window is past the last reading
    sampler = meter._sampler
    assert sampler is not None and sampler.hung
    assert sampler.last_error == ("wedged: the first reading did not return in 0.3 s" if answers == 0
                                  else "wedged: a reading did not return in 0.5 s")
    assert len(meter._series) == answers
    assert notes == [f"c=2: energy not measured: {sampler.last_error}"]     # the sweep's warnings say why
