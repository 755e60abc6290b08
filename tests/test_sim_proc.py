"""The simulator as a real `vllm serve` stand-in: processes, logs, HTTP API, shutdown."""

from __future__ import annotations

import json
import os
import signal
import time

import httpx
import pytest

from tests.sim_process import alive, chat
from tests.waiting import wait_for


def metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def stream(url: str, path: str, body: dict) -> tuple[list[dict], list[str]]:
    events, raw = [], []
    with httpx.stream("POST", url + path, json=body, timeout=30) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                raw.append(line)
                if line != "data: [DONE]":
                    events.append(json.loads(line[6:]))
    return events, raw


def test_tiny_server_api_usage_metrics_and_shutdown(start):
    sim = start("--served-model-name", "smol", "other")
    url = sim.url
    assert httpx.get(url + "/version").json() == {"version": "0.32.0"}
    assert [m["id"] for m in httpx.get(url + "/v1/models").json()["data"]] == ["smol", "other"]
    before = metric(httpx.get(url + "/metrics").text, "vllm:generation_tokens_total")
    events, raw = stream(url, "/v1/chat/completions", {
        "model": "smol", "messages": [{"role": "user", "content": "Tell me about boats."}],
        "max_tokens": 30, "ignore_eos": True, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True}})
    assert raw[-1] == "data: [DONE]" and events[-1]["choices"] == []
    content = [e for e in events if e["choices"] and e["choices"][0]["delta"].get("content")]
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert content[-1]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["usage"]["completion_tokens"] == 30
    ev2, _ = stream(url, "/v1/completions", {"model": "other", "prompt": "What is 7 + 5?",
                                             "max_tokens": 20, "temperature": 0, "stream": True,
                                             "stream_options": {"include_usage": True}})
    text = "".join(e["choices"][0]["text"] for e in ev2 if e["choices"])
    assert text.strip() == "12" and ev2[-2]["choices"][0]["finish_reason"] == "stop"
    used = ev2[-1]["usage"]["completion_tokens"]
    after = metric(httpx.get(url + "/metrics").text, "vllm:generation_tokens_total")
    assert after - before == 30 + used
    # probe families, non-streaming, with logprobs in both shapes
    out = chat(url, "What is the capital of France?", model="smol", logprobs=True, top_logprobs=3)
    assert out["choices"][0]["message"]["content"] == "Paris"
    lp = out["choices"][0]["logprobs"]["content"][0]
    assert len(lp["top_logprobs"]) == 3 and lp["logprob"] == lp["top_logprobs"][0]["logprob"]
    r = httpx.post(url + "/v1/completions", json={
        "model": "smol", "prompt": "Write this number in digits: nine hundred and one\n",
        "max_tokens": 8, "temperature": 0, "logprobs": 2, "prompt_logprobs": 1}).json()
    choice = r["choices"][0]
    assert choice["text"] == "901" and choice["finish_reason"] == "stop"
    assert set(choice["logprobs"]) == {"text_offset", "token_logprobs", "tokens", "top_logprobs"}
    assert choice["prompt_logprobs"][0] is None and "logprob" in next(
        iter(choice["prompt_logprobs"][1].values()))
    tok = httpx.post(url + "/tokenize", json={"model": "smol", "prompt": "a b c"}).json()
    assert tok["count"] == 3 and tok["max_model_len"] == 8192
    assert httpx.post(url + "/detokenize", json={"tokens": tok["tokens"]}).json()["prompt"] == "a b c"
    bad = httpx.post(url + "/v1/chat/completions", json={"model": "nope", "messages": [
        {"role": "user", "content": "hi"}]})
    assert bad.status_code == 404 and bad.json()["error"]["type"] == "NotFoundError"
    assert httpx.post(url + "/v1/completions", json={"model": "smol"}).status_code == 400
    assert httpx.post(url + "/v1/completions", content=b"{oops").status_code == 400
    # SIGTERM to the API server alone: parent and EngineCore child both gone well within 2 s
    child = sim.child_pid()
    t0 = time.monotonic()
    sim.proc.send_signal(signal.SIGTERM)
    sim.proc.wait(timeout=2)
    wait_for(lambda: not alive(child), 2, "the EngineCore child to exit after SIGTERM")
    assert time.monotonic() - t0 < 2
    log = sim.log()
    assert "[shutdown] EngineCore: trigger received signal=SIGTERM" in log
    assert "[shutdown] API server: shutdown triggered" in log


def test_glm5_startup_log_lines(start):
    sim = start("-tp", "8", "--max-model-len", "16384", TUNER_SIM_PROFILE="glm5-8xpcie",
                TUNER_SIM_TIME_SCALE="0.002", NCCL_DEBUG="INFO", NCCL_PROTO="LL",
                NCCL_ALGO="Ring")
    log = sim.log()
    assert "non-default args: {'port': " in log and "'tensor_parallel_size': 8" in log
    cfg = next(line for line in log.splitlines() if "Initializing a V1 LLM engine (v0.32.0)" in line)
    assert cfg.startswith("(EngineCore pid=")
    for part in ("tensor_parallel_size=8", "enforce_eager=False", "speculative_config=None",
                 "disable_custom_all_reduce=False", "dtype=torch.bfloat16",
                 "'cudagraph_mode': <CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>",
                 "'max_cudagraph_capture_size': 512", "'mode': <CompilationMode.VLLM_COMPILE: 3>"):
        assert part in cfg, part
    for part in ("vLLM is using nccl==2.27.5", "NCCL INFO NCCL_PROTO set by environment to LL",
                 "NCCL INFO NCCL_ALGO set by environment to Ring",
                 "Channel 00/04 : 0[0] -> 1[1] via P2P",
                 "Custom allreduce is disabled because it's not supported on more than two "
                 "PCIe-only GPUs.",
                 "Using ['PYNCCL'] all-reduce backends (in dispatch order) for group 'tp:0'",
                 "Using TRITON_MLA attention backend out of potential backends",
                 "torch.compile took", "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): "
                 "100%", "Capturing CUDA graphs (decode, FULL): 100%", "Graph capturing finished in",
                 "GPU KV cache size: ", "init engine (profile, create kv cache, warmup model) took",
                 f"Starting vLLM server on http://127.0.0.1:{sim.port}",
                 "Application startup complete.", "tuner's vLLM simulator"):
        assert part in log, part
    assert "| 51/51 [" in log
    out = chat(sim.url, "What is 37 + 48? Answer with the number only.")
    assert out["choices"][0]["message"]["content"] == "85"


def test_eager_full_downgrade_and_ngram_logs(start):
    glm = {"TUNER_SIM_PROFILE": "glm5-8xpcie", "TUNER_SIM_TIME_SCALE": "0.002"}
    eager = start("-tp", "8", "--enforce-eager", ready=False, **glm)
    full = start("-tp", "8", "-cc.cudagraph_mode=FULL", ready=False, **glm)
    eager.wait_ready()
    full.wait_ready()
    log = eager.log()
    assert "Enforce eager set, disabling torch.compile, CUDAGraphs" in log
    assert "enforce_eager=True" in log and "<CUDAGraphMode.NONE: 0>" in log
    assert "Capturing CUDA graphs" not in log and "torch.compile took" not in log
    lines = full.log().splitlines()
    cfg_at = next(i for i, s in enumerate(lines) if "Initializing a V1 LLM engine" in s)
    warn_at = next(i for i, s in enumerate(lines) if "CUDAGraphMode.FULL is not supported with "
                   "TritonMLABackend backend (support: AttentionCGSupport.UNIFORM_BATCH); "
                   "setting cudagraph_mode=FULL_AND_PIECEWISE" in s)
    assert "'cudagraph_mode': <CUDAGraphMode.FULL: 2>" in lines[cfg_at] and warn_at > cfg_at


def test_ngram_acceptance_depends_on_content(start):
    sim = start("-tp", "8", "--speculative-config", '{"method": "ngram", "num_speculative_'
                'tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}',
                TUNER_SIM_PROFILE="glm5-8xpcie", TUNER_SIM_TIME_SCALE="0.002")
    log = sim.log()
    assert "speculative_config=SpeculativeConfig(method='ngram', model=None, num_spec_tokens=4)" in log
    assert "Async scheduling not supported with ngram-based speculative decoding" in log

    def acceptance(prompts: list[str]) -> tuple[float, int]:
        m0 = httpx.get(sim.url + "/metrics").text
        chunks = tokens = 0
        for p in prompts:
            events, _ = stream(sim.url, "/v1/chat/completions", {
                "messages": [{"role": "user", "content": p}], "temperature": 0,
                "max_tokens": 120, "stream": True, "stream_options": {"include_usage": True}})
            chunks += sum(1 for e in events if e["choices"])
            tokens += events[-1]["usage"]["completion_tokens"]
        m1 = httpx.get(sim.url + "/metrics").text
        drafted = metric(m1, "vllm:spec_decode_num_draft_tokens_total") - metric(
            m0, "vllm:spec_decode_num_draft_tokens_total")
        acc = metric(m1, "vllm:spec_decode_num_accepted_tokens_total") - metric(
            m0, "vllm:spec_decode_num_accepted_tokens_total")
        assert chunks < tokens + len(prompts) or acc == 0   # multi-token chunks when accepted
        return (acc / drafted if drafted else 0.0), int(acc)

    passage = ("Our team shipped the new billing service on Monday, migrated every customer "
               "account without downtime, and wrote a short guide explaining how refunds, "
               "invoices and failed payments are now handled by the support desk. ")
    copy_rate, copy_acc = acceptance([f"Rewrite this text, fixing typos:\n{passage * 2}",
                                      f"Edit this paragraph for clarity:\n{passage}"])
    open_rate, _ = acceptance(["Write a short poem about autumn.",
                               "Describe your favourite kind of weather."])
    assert copy_acc > 0 and copy_rate > open_rate + 0.2


def test_startup_failures_exit_fast(start):
    t0 = time.monotonic()
    bad = start("-cc", '{"cudagraph_mode": "BOGUS"}', ready=False)
    mtp = start("--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}',
                ready=False)
    crash = start(ready=False, TUNER_SIM_FAULTS='[{"fault": "crash_at_start"}]')
    for sim in (bad, mtp, crash):
        assert sim.proc.wait(timeout=5) != 0
    assert time.monotonic() - t0 < 5
    assert bad.log().rstrip().endswith("KeyError: 'BOGUS'")
    assert "NotImplementedError: Unsupported speculative method: 'mtp'" in mtp.log()
    log = crash.log()
    assert "EngineCore failed to start." in log
    assert "RuntimeError: Engine core initialization failed. See root cause above." in log
    assert not alive(crash.child_pid())


def test_garbage_fault_and_connection_refused_before_ready(start):
    sim = start(TUNER_SIM_FAULTS='[{"fault": "garbage"}]')
    out = chat(sim.url, "What is 37 + 48?")["choices"][0]["message"]["content"]
    assert out.strip() != "85" and out.strip()
    hang = start(ready=False, TUNER_SIM_FAULTS='[{"fault": "hang_at_start"}]')
    # Past its last startup stage (the KV cache), it hangs: no exit, no listening socket.
    wait_for(lambda: "Maximum concurrency for" in hang.log(), 20, "the hung sim's KV-cache line",
             unless=hang.exited)
    assert hang.stays_up(1.0)
    with pytest.raises(httpx.ConnectError):
        httpx.get(hang.url + "/health", timeout=1)


def test_ignore_sigterm_needs_sigkill(start):
    sim = start(TUNER_SIM_FAULTS='[{"fault": "ignore_sigterm"}]')
    child = sim.child_pid()
    os.killpg(sim.proc.pid, signal.SIGTERM)
    assert sim.stays_up(0.7) and alive(child)
    os.killpg(sim.proc.pid, signal.SIGKILL)
    sim.proc.wait(timeout=2)
    wait_for(lambda: not alive(child), 2, "the EngineCore child to die with its group's SIGKILL")
