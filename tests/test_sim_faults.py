"""Injected faults (TUNER_SIM_FAULTS) that the tuner's failure paths are tested against."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from tests.sim_process import alive, chat
from tests.waiting import wait_for
from tuner.sim.faults import FaultError, parse_faults


def faults(*items: dict) -> str:
    return json.dumps(list(items))


def test_parse_faults_validates():
    assert parse_faults(None) == []
    assert parse_faults(faults({"fault": "garbage"}))[0].fault == "garbage"
    for bad in ("[{", '[{"fault": "nope"}]', '[{"fault": "slow_start"}]',
                '[{"fault": "garbage", "extra": 1}]', '[{"fault": "usage_lie"}]',
                '[{"fault": "usage_lie", "value": 1, "factor": 2}]', '[{"fault": "huge_reply"}]'):
        with pytest.raises(FaultError):
            parse_faults(bad)


def test_request_count_faults(start):
    sim = start(TUNER_SIM_FAULTS=faults(
        {"fault": "http_5xx", "after_requests": 1, "count": 1},
        {"fault": "diverge_after_tokens", "tokens": 3},
        {"fault": "garbage_sse", "after_requests": 3}))
    q = "Repeat the following line exactly:\nalpha beta gamma delta epsilon zeta eta theta"
    first = chat(sim.url, q)["choices"][0]["message"]["content"]
    assert first.startswith("alpha beta gamma") and first != "alpha beta gamma delta epsilon zeta eta theta"
    r = httpx.post(sim.url + "/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 500
    assert chat(sim.url, "What is 1 + 1?")["choices"][0]["message"]["content"] == "2"
    with httpx.stream("POST", sim.url + "/v1/completions", json={
            "prompt": "Tell me a story.", "max_tokens": 5, "stream": True}) as resp:
        lines = [ln for ln in resp.iter_lines() if ln.startswith("data: {")]
    with pytest.raises(json.JSONDecodeError):
        json.loads(lines[0][6:])


def test_streamed_counting_skips_unstreamed_requests(start):
    # counting "streamed": the probe's plain requests never move a load-phase fault.
    sim = start(TUNER_SIM_FAULTS=faults(
        {"fault": "http_5xx", "after_requests": 1, "count": 1, "counting": "streamed"}))
    for _ in range(3):
        assert chat(sim.url, "What is 1 + 1?")["choices"][0]["message"]["content"] == "2"

    def streamed() -> int:
        with httpx.stream("POST", sim.url + "/v1/completions", json={
                "prompt": "Tell me a story.", "max_tokens": 3, "stream": True}) as resp:
            resp.read()
            return resp.status_code

    assert [streamed(), streamed(), streamed()] == [200, 500, 200]
    assert chat(sim.url, "What is 1 + 1?")["choices"][0]["message"]["content"] == "2"


def test_config_matched_faults_hang_stream_and_batch_garbage(start):
    # `when` selects the asked configuration: only the eager server gets the faults.
    spec = faults({"fault": "hang_mid_stream", "after_requests": 0,
                   "when": {"enforce_eager": True}},
                  {"fault": "garbage_when_batch_gt", "batch": 1,
                   "when": {"compilation_config.cudagraph_mode": ["FULL_AND_PIECEWISE", "FULL"]}})
    eager = start("--enforce-eager", TUNER_SIM_FAULTS=spec)
    chunks = 0
    with pytest.raises(httpx.ReadTimeout):
        with httpx.stream("POST", eager.url + "/v1/completions", json={
                "prompt": "Tell me a story.", "max_tokens": 50, "ignore_eos": True,
                "stream": True}, timeout=httpx.Timeout(5, read=1.0)) as resp:
            for line in resp.iter_lines():
                chunks += line.startswith("data: {")
    assert 0 < chunks <= 3
    # the default-config server is on the tiny CPU profile, where cudagraph_mode is asked as
    # FULL_AND_PIECEWISE (then silently forced to NONE): the batch fault applies to it
    graphs = start(TUNER_SIM_FAULTS=spec)
    body = {"messages": [{"role": "user", "content": "What is 37 + 48?"}], "temperature": 0,
            "max_tokens": 40, "ignore_eos": True}
    alone = chat(graphs.url, "What is 37 + 48?", max_tokens=40, ignore_eos=True)
    reference = alone["choices"][0]["message"]["content"]
    assert reference.startswith("85")

    async def together() -> list[str]:
        async with httpx.AsyncClient(base_url=graphs.url, timeout=30) as cl:
            rs = await asyncio.gather(*[cl.post("/v1/chat/completions", json=body)
                                        for _ in range(6)])
        return [r.json()["choices"][0]["message"]["content"] for r in rs]

    assert any(out != reference for out in asyncio.run(together()))


def test_crash_mid_load_kills_tree_and_startup_faults(start):
    sim = start(TUNER_SIM_FAULTS=faults({"fault": "crash_mid_load", "after_requests": 1}))
    child = sim.child_pid()
    assert chat(sim.url, "What is 2 + 3?")["choices"][0]["message"]["content"] == "5"
    with pytest.raises(httpx.TransportError):
        chat(sim.url, "What is 2 + 3?")
    # The bounds are generous: each wait ends the moment the process does, and a fresh
    # interpreter's imports alone took over 5 s at a load average of 10 (CI 2026-12-07).
    assert sim.proc.wait(timeout=30) != 0
    wait_for(lambda: not alive(child), 10, "the EngineCore child to go with its crashed parent")
    oom = start(ready=False, TUNER_SIM_FAULTS=faults({"fault": "oom_at_start"}))
    assert oom.proc.wait(timeout=60) == 1
    assert "is less than desired GPU memory utilization" in oom.log()
    t0 = time.monotonic()
    slow = start(TUNER_SIM_FAULTS=faults({"fault": "slow_start", "seconds": 150}))
    assert time.monotonic() - t0 > 1.5   # 150 simulated s at time scale 0.01
    assert "Application startup complete." in slow.log()
