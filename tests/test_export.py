"""Export: picks, refusal of broken points, every format, secrets never written."""

from __future__ import annotations

import json
import shlex
import textwrap

import pytest

from tuner.study.pareto import parse_filter
from tuner.study.study_file import parse_study
from tuner.study.trials import TrialRecord
from tuner.views.export import ExportError, choose_record, render_export

SPEC = parse_study(textwrap.dedent("""
    name: ex
    server:
      command: [vllm, serve]
      model: /m
      gpus_per_trial: 0
      env: {VLLM_X: 1}
      secret_env: [HF_TOKEN]
    parameters:
      - {name: eager, flag: enforce_eager, kind: bool}
      - {name: proto, env: NCCL_PROTO, kind: categorical, values: [null, LL]}
      - {name: method, flag: speculative_config.method, kind: categorical, values: [null, ngram]}
"""), "ex.yaml")
LABELS = ["output_tok_s@cmax", "tpot_ms.mean@c1"]
DIRS = ["maximize", "minimize"]


def rec(n: int, tput: float, tpot: float, *, constraints: dict | None = None, **params: object) -> TrialRecord:
    return TrialRecord(number=n, state="COMPLETE", kind="run",
                       params={"eager": False, "proto": None, "method": None, **params},
                       values={LABELS[0]: tput, LABELS[1]: tpot},
                       constraints=constraints or {"probe": 0.0, "applied": 0.0}, attrs={})


RECORDS = [
    rec(0, 100, 20, baseline=True),
    rec(1, 150, 25, proto="LL"),
    rec(2, 120, 12, method="ngram"),
    rec(3, 400, 5, constraints={"probe": 1.0, "applied": 0.0}),   # fast and wrong
    rec(4, 300, 6, constraints={"probe": 0.0, "applied": 2.0}),   # not what was asked
]


def test_picks_never_choose_infeasible_points() -> None:
    best = choose_record(RECORDS, LABELS, DIRS, trial=None, pick="best-throughput", filters=[], force=False)
    assert best.number == 1
    fastest = choose_record(RECORDS, LABELS, DIRS, trial=None, pick="lowest-latency", filters=[], force=False)
    assert fastest.number == 2
    under = choose_record(RECORDS, LABELS, DIRS, trial=None, pick="best-throughput",
                          filters=[parse_filter("tpot_ms.mean@c1<=15")], force=False)
    assert under.number == 2
    assert choose_record(RECORDS, LABELS, DIRS, trial=None, pick="best-throughput", filters=[], force=True).number == 3


def test_export_refuses_failed_probe_and_unapplied_unless_forced() -> None:
    RECORDS[3].attrs["outcome"] = {"probe_reason": "accuracy 0.10 < 0.80 at concurrency 1"}
    with pytest.raises(ExportError, match="probe_failed.*accuracy 0.10.*--force"):
        choose_record(RECORDS, LABELS, DIRS, trial=3, pick=None, filters=[], force=False)
    with pytest.raises(ExportError, match="not_applied"):
        choose_record(RECORDS, LABELS, DIRS, trial=4, pick=None, filters=[], force=False)
    assert choose_record(RECORDS, LABELS, DIRS, trial=3, pick=None, filters=[], force=True).number == 3
    with pytest.raises(ExportError, match="does not exist"):
        choose_record(RECORDS, LABELS, DIRS, trial=99, pick=None, filters=[], force=False)
    with pytest.raises(ValueError, match="names no objective"):
        choose_record(RECORDS, LABELS, DIRS, trial=None, pick="knee", filters=[parse_filter("x<=1")], force=False)


def test_shell_export_round_trips_and_carries_metadata() -> None:
    text = render_export(SPEC, "ex", RECORDS[1], "shell")
    assert "# tuner export: study ex, trial 1" in text and "output_tok_s@cmax = 150" in text
    line = [l for l in text.splitlines() if not l.startswith("#")][0]
    words = shlex.split(line)
    assert "NCCL_PROTO=LL" in words and "VLLM_X=1" in words
    assert words[words.index("vllm"):][:2] == ["vllm", "serve"]
    assert "--no-enforce-eager" in words
    assert 'HF_TOKEN="${HF_TOKEN}"' in line


def test_json_env_and_systemd_never_contain_secret_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_supersecret")
    for fmt in ("shell", "env", "json", "systemd"):
        text = render_export(SPEC, "ex", RECORDS[2], fmt)
        assert "hf_supersecret" not in text, fmt
    data = json.loads(render_export(SPEC, "ex", RECORDS[2], "json"))
    assert data["env"]["HF_TOKEN"] == "${HF_TOKEN}"
    assert data["trial"] == 2 and data["objectives"][LABELS[1]] == 12
    spec_arg = data["argv"][data["argv"].index("--speculative-config") + 1]
    assert json.loads(spec_arg) == {"method": "ngram"}


def test_systemd_execstart_quoting_round_trips() -> None:
    unit = render_export(SPEC, "ex", RECORDS[2], "systemd")
    assert "[Service]" in unit and "KillMode=control-group" in unit
    assert "EnvironmentFile=/etc/vllm/ex.secrets" in unit
    exec_line = next(l for l in unit.splitlines() if l.startswith("ExecStart="))
    words = shlex.split(exec_line[len("ExecStart="):].replace("$$", "$").replace("%%", "%"))
    assert words[0] == "/usr/bin/env" and words[1:3] == ["vllm", "serve"]
    assert json.loads(words[words.index("--speculative-config") + 1]) == {"method": "ngram"}
    assert "Environment=VLLM_X=1" in unit


# A front of three feasible points plus a dominated one and a fast-but-wrong one:
#   10 (100 tok/s, 10 ms)  11 (190, 14)  12 (200, 40)  13 (150, 30, dominated by 11)
#   14 (300, 5, probe failed: dominates everything, must never be picked without --force)
KNEE = [
    rec(10, 100, 10), rec(11, 190, 14), rec(12, 200, 40), rec(13, 150, 30),
    rec(14, 300, 5, constraints={"probe": 1.0, "applied": 0.0}),
]


def _pick(pick: str, *where: str, force: bool = False) -> int:
    return choose_record(KNEE, LABELS, DIRS, trial=None, pick=pick,
                         filters=[parse_filter(w) for w in where], force=force).number


def test_knee_is_the_balanced_front_point() -> None:
    # Scaled to [0, 1] per objective: 10 -> (1, 0), 11 -> (0.1, 0.13), 12 -> (0, 1).
    assert _pick("knee") == 11
    # Only 11 and 12 clear the floor; between two points the knee is a tie, broken by number.
    assert _pick("knee", "output_tok_s@cmax>=150") == 11
    assert _pick("knee", force=True) == 14  # with --force the wrong point dominates the rest


def test_lowest_latency_above_a_throughput_floor() -> None:
    assert _pick("lowest-latency") == 10
    assert _pick("lowest-latency", "output_tok_s@cmax>=150") == 11
    assert _pick("lowest-latency", "output_tok_s@cmax>=195") == 12
    assert _pick("best:tpot_ms.mean@c1", "output_tok_s@cmax>=150") == 11  # the long form
    with pytest.raises(ExportError, match="no feasible trial matches the pick and filters"):
        _pick("lowest-latency", "output_tok_s@cmax>=250")  # only the probe-failed point is that fast
    assert _pick("lowest-latency", "output_tok_s@cmax>=250", force=True) == 14


def test_best_throughput_under_a_latency_limit_and_two_filters() -> None:
    assert _pick("best-throughput") == 12
    assert _pick("best-throughput", "tpot_ms.mean@c1<=20") == 11
    # Both filters apply: nothing feasible is at once this fast and this quick.
    with pytest.raises(ExportError, match="no feasible trial"):
        _pick("best-throughput", "tpot_ms.mean@c1<=20", "output_tok_s@cmax>=191")
    with pytest.raises(ValueError, match="unknown pick"):
        _pick("fastest")


NCCL_STUDY = parse_study(textwrap.dedent("""
    name: nccl
    server:
      command: [vllm, serve]
      model: /m
      gpus_per_trial: 0
      env: {NCCL_DEBUG: WARN}
    parameters:
      - {name: proto, env: NCCL_PROTO, kind: categorical, values: [null, LL]}
    execution: {compile_cache_dir: /tmp/tuner-cache}
"""), "nccl.yaml")


def test_export_keeps_every_variable_the_study_sets_itself() -> None:
    """NCCL_DEBUG here is part of the study's configuration (server.env), not something the
    tuner added to read NCCL's choices back: the export must carry it. It also carries
    neither the NCCL_DEBUG_SUBSYS the tuner adds to measure nor the compile cache root."""
    record = rec(1, 150, 25, proto="LL")
    for fmt in ("json", "env", "shell", "systemd", "yaml"):
        text = render_export(NCCL_STUDY, "nccl", record, fmt)
        assert "NCCL_DEBUG" in text and "WARN" in text, fmt
        assert "NCCL_DEBUG_SUBSYS" not in text and "VLLM_CACHE_ROOT" not in text, fmt
    env = json.loads(render_export(NCCL_STUDY, "nccl", record, "json"))["env"]
    assert env == {"NCCL_DEBUG": "WARN", "NCCL_PROTO": "LL"}
