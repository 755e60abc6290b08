"""A server started with an API key (vLLM's --api-key, or VLLM_API_KEY): the simulator
refuses what vLLM refuses, and every request the tuner sends it - readiness, reference,
probe, tokenize, load, `tuner measure` - carries the study's key, which lands nowhere on
disk or in any output. A key the server does not take fails the study at once, saying so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT, wait_no_orphans, write_study
from tests.sim_process import serving_sim

KEY = "sk-apikey-PLANTED-424242"
OTHER = "sk-apikey-OTHER-777777"


def _status(url: str, path: str, key: str | None = None, scheme: str = "Bearer") -> int:
    headers = {"Authorization": f"{scheme} {key}"} if key else {}
    if path == "/tokenize":
        return httpx.post(url + path, json={"model": "smol", "prompt": "hi"}, headers=headers).status_code
    return httpx.get(url + path, headers=headers).status_code


def test_the_simulator_guards_v1_like_vllm(tmp_path: Path) -> None:
    with serving_sim(tmp_path, "--api-key", KEY) as url:
        reply = httpx.get(url + "/v1/models")
        assert (reply.status_code, reply.json()) == (401, {"error": "Unauthorized"})
        assert _status(url, "/v1/models", OTHER) == 401
        assert _status(url, "/v1/models", KEY, scheme="Basic") == 401
        assert _status(url, "/v1/models", KEY) == 200
        assert _status(url, "/v1/models", KEY, scheme="bearer") == 200     # the scheme is case-blind
        # Outside /v1 vLLM asks for nothing: health, metrics and tokenize answer without a key.
        assert [_status(url, p) for p in ("/health", "/metrics", "/tokenize")] == [200, 200, 200]
    # No flag: VLLM_API_KEY from the environment; with both, the flag wins.
    with serving_sim(tmp_path, VLLM_API_KEY=KEY) as url:
        assert (_status(url, "/v1/models"), _status(url, "/v1/models", KEY)) == (401, 200)
    with serving_sim(tmp_path, "--api-key", KEY, VLLM_API_KEY=OTHER) as url:
        assert (_status(url, "/v1/models", OTHER), _status(url, "/v1/models", KEY)) == (401, 200)


STUDY = """
name: measure-key
server:
  command: ["{python}", -m, tuner.sim]
  model: /models/smol
  served_model_name: smol
  flags: {api_key: "${TEST_SERVER_KEY}"}
load:
  concurrency: [1, 2]
  requests_per_stream: 2
  min_requests: 2
  warmup_requests: 1
  workload:
    classes:
      - {name: chat, kind: open_ended, prompt_tokens: 32, output_tokens: 8}
probe:
  concurrency: [1, 2]
  min_accuracy: 0.0
"""


def _tuner(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # Only the keys the test gives: one in the caller's environment would change what is sent.
    base = {k: v for k, v in os.environ.items() if k not in ("VLLM_API_KEY", "TEST_SERVER_KEY")}
    return subprocess.run([sys.executable, "-m", "tuner", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env={**base, **env})


def test_measure_sends_the_study_key(tmp_path: Path) -> None:
    study = tmp_path / "measure-key.yaml"
    study.write_text(STUDY)
    with serving_sim(tmp_path, "--api-key", KEY) as url:
        run = _tuner("measure", str(study), "--url", url, "-o", str(tmp_path / "none"), env={})
        assert run.returncode == 3
        assert "HTTP 401: the server wants an API key, none was sent" in run.stderr, run.stderr[-2000:]
        out = tmp_path / "out"
        run = _tuner("measure", str(study), "--url", url, "--probe", "-o", str(out), env={"TEST_SERVER_KEY": KEY})
    assert run.returncode == 0, run.stdout + run.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["probe"]["total"] > 0 and summary["problems"] == []
    for level in summary["levels"].values():
        assert level["metrics"]["completed"] >= 2 and level["metrics"]["failed"] == 0
    assert not [p.name for p in out.iterdir() if KEY in p.read_text(errors="replace")]
    assert KEY not in run.stdout + run.stderr


@pytest.mark.slow
def test_a_study_on_a_server_with_an_api_key_measures_and_never_writes_it(tmp_path: Path) -> None:
    # The probe is on (the demo's): readiness, the reference, the probe, tokenize and the
    # load all meet the server's key check.
    path, marker = write_study(tmp_path, updates={"budget.n_trials": 2,
                                                   "server.flags.api_key": "${TEST_SERVER_KEY}"})
    results = tmp_path / "results"
    run = _tuner("run", str(path), "--results", str(results), env={"TEST_SERVER_KEY": KEY})
    assert run.returncode == 0, run.stderr[-3000:]
    status = json.loads(_tuner("status", path.stem, "--results", str(results), "--json", env={}).stdout)
    assert status["outcomes"].get("feasible", 0) >= 1, status["outcomes"]
    grep = subprocess.run(["grep", "-r", "-a", "-l", "-F", KEY, str(results)], capture_output=True, text=True)
    assert grep.stdout == "" and KEY not in run.stdout + run.stderr
    assert "${TEST_SERVER_KEY}" in (results / path.stem / "spec.yaml").read_text()
    assert not wait_no_orphans(marker)


@pytest.mark.slow
def test_a_key_the_server_does_not_take_stops_the_study_saying_so(tmp_path: Path) -> None:
    # The server is started with a key of its own (in server.command, unseen by the tuner),
    # while the study names VLLM_API_KEY: the tuner sends that one, and it is refused.
    path, marker = write_study(tmp_path, updates={
        "server.command": ["{python}", "-m", "tuner.sim", "--api-key", OTHER],
        "server.secret_env": ["VLLM_API_KEY"]})
    results = tmp_path / "results"
    run = _tuner("run", str(path), "--results", str(results), env={"VLLM_API_KEY": KEY})
    assert run.returncode != 0
    line = next(x for x in run.stderr.splitlines() if "unauthorized" in x)
    assert "the server refused the study's API key (HTTP 401 on GET /v1/models)" in line, run.stderr[-2000:]
    assert KEY not in run.stdout + run.stderr
    assert not wait_no_orphans(marker)


def test_the_key_sent_is_the_one_the_server_reads() -> None:
    from tuner.secrets import api_key, api_key_ref, bearer, known_values
    from tuner.study.server_spec import ServerSpec

    def key(environ: dict[str, str], **section: object) -> str | None:
        server = ServerSpec.model_validate({"model": "m", **section})
        return api_key(api_key_ref(server), known_values(server), environ)

    # vLLM: --api-key, else VLLM_API_KEY; a reference is read where the study runs.
    assert key({}, flags={"api_key": KEY}, env={"VLLM_API_KEY": OTHER}) == KEY
    assert key({"MY_KEY": KEY}, flags={"api_key": "${MY_KEY}"}) == KEY
    assert key({}, env={"VLLM_API_KEY": KEY}) == KEY
    assert key({"VLLM_API_KEY": KEY}, secret_env=["VLLM_API_KEY"]) == KEY
    assert key({"VLLM_API_KEY": KEY}) == KEY            # inherited by the server, named nowhere
    assert key({}) is None and bearer(None) == {}
    assert bearer(KEY) == {"Authorization": f"Bearer {KEY}"}
