"""A user's dataset as the study's requests (issue 33): drawn once each, verbatim, through the
real load generator (the fake streaming server sees the bodies) and the commands a user types
(validate, measure on the simulator, run then resume over a changed file)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.conftest import run_tuner, write_study
from tests.fake_server import Served
from tests.faultkit import FAST
from tuner.load.dataset import parse_dataset
from tuner.load.dataset_draw import DATASET_CLASS, DatasetDraw, unsupported
from tuner.load.load_spec import LoadSpec
from tuner.load.sweep import run_sweep


def jsonl(entries: list[dict]) -> str:
    return "".join(json.dumps(e) + "\n" for e in entries)


PROMPTS = [{"prompt": f"Question {i}: name a colour  ", "output_tokens": 3 + i % 4} for i in range(40)]
CHATS = [{"messages": [{"role": "system", "content": f"Policy {i % 3}"},
                       {"role": "user", "content": f"Ask {i}"},
                       {"role": "assistant", "content": "(the dataset's own reply)"}]}
         for i in range(30)]


def draw(entries: list[dict], fmt: str = "prompts", seed: int = 0) -> DatasetDraw:
    return DatasetDraw(parse_dataset(jsonl(entries), fmt, source="d"), seed=seed, output_tokens=9,
                       ignore_eos=True)


def test_each_entry_is_drawn_once_in_a_seeded_order_before_any_repeats() -> None:
    d = draw(PROMPTS)
    first = [p.prompt for p in d.take(25)] + [d.stream().next().prompt for _ in range(15)]
    assert sorted(first) == sorted(e["prompt"] for e in PROMPTS)       # each once, verbatim
    assert d.note() is None
    assert first == [p.prompt for p in draw(PROMPTS).take(40)]           # same seed, same order
    assert first != [p.prompt for p in draw(PROMPTS, seed=1).take(40)]
    again = d.take(5)
    assert [p.prompt for p in again] == first[:5]
    assert d.note() == ("the dataset's 40 entries were used up: 5 of 45 requests repeat an earlier one, "
                        "which the prefix cache may serve (a larger file, fewer or shorter levels avoid it)")


def test_plans_carry_the_entrys_length_the_default_and_the_chat_messages() -> None:
    by_prompt = {e["prompt"]: e["output_tokens"] for e in PROMPTS}
    for plan in draw(PROMPTS).take(40):
        assert plan.max_tokens == by_prompt[plan.prompt] and plan.class_name == DATASET_CLASS
        assert plan.messages is None and plan.ignore_eos
    chat = draw(CHATS, "openai-chat").take(3)
    for plan in chat:
        assert plan.max_tokens == 9                                         # no length given
        role_order = [role for role, _ in plan.messages]
        assert role_order == ["system", "user"]                             # not the dataset's reply


def test_what_the_sweep_cannot_send_yet_is_said_before_anything_starts() -> None:
    multi = [{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                           {"role": "user", "content": "c"}]}]
    assert "1 of 1 conversations have more than one user turn (the first is entry 1)" in unsupported(
        parse_dataset(jsonl(multi), "openai-chat", source="d"), "chat")
    trace = [{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}]
    assert "mooncake is a timed trace" in unsupported(parse_dataset(jsonl(trace), "mooncake", source="d"), "chat")
    assert "needs load.api: chat" in unsupported(parse_dataset(jsonl(CHATS), "auto", source="d"), "completions")
    assert unsupported(parse_dataset(jsonl(PROMPTS), "auto", source="d"), "completions") is None


@pytest.mark.parametrize(("entries", "api", "sizing"), [
    (PROMPTS, "completions", "requests"), (CHATS, "chat", "requests"), (PROMPTS, "chat", "steady")])
def test_a_sweep_sends_dataset_requests_verbatim_and_none_twice(
        served: Served, tmp_path: Path, entries: list[dict], api: str, sizing: str) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(jsonl(entries))
    sized = ({"requests_per_stream": 2, "warmup_requests": 2, "min_requests": 2} if sizing == "requests"
             else {"min_window_s": 0.4, "stability_subwindows": 4, "stability_max_ratio": 1.5, "max_level_seconds": 3})
    spec = LoadSpec.model_validate({
        "api": api, "sizing": sizing, "concurrency": [1, 2], "fit_prompt_tokens": True,
        "workload": {"dataset": {"path": str(path), "output_tokens": 5}}, **sized})
    result = asyncio.run(run_sweep(served.base_url, "fake", spec, ignore_eos=True))
    assert served.state.tokenize_calls == 0                  # nothing to fit: text is sent as it is
    if api == "chat":
        sent = [json.dumps(b["messages"]) for b in served.state.bodies]
        allowed = {json.dumps([{"role": m["role"], "content": m["content"]} for m in e["messages"][:2]]
                              if "messages" in e else [{"role": "user", "content": e["prompt"]}])
                   for e in entries}
    else:
        sent = [b["prompt"] for b in served.state.bodies]
        allowed = {e["prompt"] for e in entries}
    assert set(sent) <= allowed
    if sizing == "requests":                                 # 40 entries cover every request once
        assert len(sent) == len(set(sent)) == (2 + 2) + (2 + 4)   # warm-ups, then c=1 and c=2
    for level in result.levels:
        assert {r.class_name for r in level.records} == {DATASET_CLASS}


STUDY_UPDATES = {**FAST, "budget.n_trials": 1, "load.api": "completions"}


def test_validate_says_the_detected_format_and_each_bad_input_in_one_line(tmp_path: Path) -> None:
    data = tmp_path / "traffic.jsonl"
    data.write_text(jsonl(PROMPTS))
    updates = {k: v for k, v in STUDY_UPDATES.items() if k != "load.workload.classes"}
    path, _ = write_study(tmp_path, updates={**updates, "load.workload": {"dataset": {"path": "traffic.jsonl"}}})
    out = run_tuner("validate", str(path), timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"[dataset] {data}: 40 entries, format prompts (detected)" in out.stdout

    for text, want in [
        (None, f"load.workload.dataset: load.workload.dataset.path: '{tmp_path / 'traffic.jsonl'}' does not exist"),
        ('{"prompt": "a"}\n{"prompt": 7}\n',
         "load.workload.dataset: " + str(data) + ": line 2: prompt: int, not a string"),
        ("", "the dataset is empty"),
        (jsonl(CHATS), "needs load.api: chat"),
    ]:
        if text is None:
            data.unlink()
        else:
            data.write_text(text)
        out = run_tuner("validate", str(path), timeout=120)
        assert out.returncode != 0
        assert want in out.stderr, out.stderr
        assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_classes_and_a_dataset_are_one_source_too_many(tmp_path: Path) -> None:
    path, _ = write_study(tmp_path, updates={**STUDY_UPDATES, "load.workload.dataset": {"path": "x.jsonl"}})
    out = run_tuner("validate", str(path), timeout=120)
    assert out.returncode != 0 and "classes and dataset are two sources of requests" in out.stderr


def test_a_study_measures_the_dataset_and_resume_refuses_a_changed_file(
        tmp_path: Path, orphan_check: list[str]) -> None:
    data = tmp_path / "traffic.jsonl"
    data.write_text(jsonl(PROMPTS))
    updates = {k: v for k, v in STUDY_UPDATES.items() if k != "load.workload.classes"}
    path, marker = write_study(tmp_path, name="dataset-study",
                               updates={**updates, "load.workload": {"dataset": {"path": str(data)}}})
    orphan_check.append(marker)
    results = tmp_path / "results"
    out = run_tuner("run", str(path), "--results", str(results), timeout=400)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    trial = results / "dataset-study" / "trials" / "0000"
    records = [json.loads(line) for c in (1, 4) for line in
               (trial / f"requests-c{c}.jsonl").read_text().splitlines() if line.strip()]
    assert records and {r["class_name"] for r in records} == {DATASET_CLASS}
    assert json.loads((results / "dataset-study" / "study.json").read_text())["environment"]["dataset"].startswith(
        "sha256:")

    data.write_text(jsonl(PROMPTS[:-1]))
    refused = run_tuner("resume", "dataset-study", "--results", str(results), "--n-trials", "2", timeout=300)
    assert refused.returncode == 3, refused.stdout[-2000:] + refused.stderr[-2000:]
    assert "workload dataset sha256:" in refused.stderr and "--allow-environment-change" in refused.stderr
    assert not (results / "dataset-study" / "trials" / "0001").exists()
