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
from tests.faultkit import MEASURING
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
    first = [p.prompt for p in d.take(25)] + [d.stream().next_group()[0].prompt for _ in range(15)]
    assert sorted(first) == sorted(e["prompt"] for e in PROMPTS)       # each once, verbatim
    assert d.note() is None
    assert first == [p.prompt for p in draw(PROMPTS).take(40)]           # same seed, same order
    assert first != [p.prompt for p in draw(PROMPTS, seed=1).take(40)]
    again = d.take(5)
    assert [p.prompt for p in again] == first[:5]
    assert d.note() == ("the dataset's 40 entries were used up: 5 of 45 entries sent repeat an earlier one, "
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


MULTI = [{"messages": [{"role": "system", "content": f"Be kind ({i})"},
                       *[m for t in range(i % 3 + 1) for m in (
                           {"role": "user", "content": f"conversation {i} turn {t}"},
                           {"role": "assistant", "content": f"dataset reply {i}.{t}"})]]}
         for i in range(12)]


def test_a_conversation_is_drawn_whole_as_consecutive_turns() -> None:
    plan = draw(MULTI, "openai-chat").take(7)
    assert len(plan) >= 7 and [p.index for p in plan] == list(range(len(plan)))
    at = 0
    while at < len(plan):
        turns = plan[at].turns
        group = plan[at:at + turns]
        assert [p.turn for p in group] == list(range(turns)) and {p.turns for p in group} == {turns}
        for earlier, later in zip(group, group[1:]):
            # each turn's messages begin with the previous turn's, then its reply and question
            assert later.messages[:len(earlier.messages)] == earlier.messages
            assert [r for r, _ in later.messages[len(earlier.messages):]] == ["assistant", "user"]
        assert group[-1].messages[-1][0] == "user"       # the dataset's last reply is not sent
        at += turns
    assert at == len(plan)


def test_what_the_sweep_cannot_send_is_said_before_anything_starts() -> None:
    multi = parse_dataset(jsonl(MULTI), "openai-chat", source="d")
    assert unsupported(multi, "chat") is None
    assert "8 of 12 conversations have more than one user turn (the first is entry 2)" in unsupported(
        multi, "chat", open_loop=True)
    trace = [{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}]
    for api in ("chat", "completions"):   # made into prompts of its lengths, for either API
        assert unsupported(parse_dataset(jsonl(trace), "mooncake", source="d"), api) is None
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


STUDY_UPDATES = {**MEASURING, "budget.n_trials": 1, "load.api": "completions"}


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
    # the workload measured, as status shows it: 5 words a prompt (6.5 -> 6 tokens), outputs 3..6
    # ten times each, no prompt as long as one 12-word block
    block = [f"  workload: dataset {data}, format prompts (detected): 40 entries, 40 requests",
             "    prompt tokens p50 6, p90 6, max 6 (estimated at 1.3 tokens a word); output tokens p50 4.5, p90 6",
             "    turns: one per entry",
             "    prefix repeat: 0% of prompt tokens repeat an earlier prefix (text in blocks of 12 words, about 16 "
             "tokens)"]
    assert f"[workload] {block[0].strip()}" in out.stdout
    status = run_tuner("status", "dataset-study", "--results", str(results), timeout=120)
    assert status.returncode == 0 and "\n".join(block) in status.stdout, status.stdout + status.stderr
    profile = (results / "dataset-study" / "workload.json").read_text()

    data.write_text(jsonl(PROMPTS[:-1]))
    refused = run_tuner("resume", "dataset-study", "--results", str(results), "--n-trials", "2", timeout=300)
    assert refused.returncode == 3, refused.stdout[-2000:] + refused.stderr[-2000:]
    assert "workload dataset sha256:" in refused.stderr and "--allow-environment-change" in refused.stderr
    assert not (results / "dataset-study" / "trials" / "0001").exists()
    assert (results / "dataset-study" / "workload.json").read_text() == profile   # a refused resume writes none


@pytest.mark.parametrize("sizing", ["requests", "steady"])
def test_a_turn_waits_for_the_previous_reply_and_carries_the_servers_words(
        served: Served, tmp_path: Path, sizing: str) -> None:
    path = tmp_path / "chats.jsonl"
    path.write_text(jsonl(MULTI))
    sized = ({"requests_per_stream": 4, "warmup_requests": 2, "min_requests": 2} if sizing == "requests"
             else {"min_window_s": 0.4, "stability_subwindows": 4, "stability_max_ratio": 1.5,
                   "max_level_seconds": 3})
    spec = LoadSpec.model_validate({
        "api": "chat", "sizing": sizing, "concurrency": [3],
        "workload": {"dataset": {"path": str(path), "output_tokens": 4, "think_time_s": 0.05}}, **sized})
    result = asyncio.run(run_sweep(served.base_url, "fake", spec, ignore_eos=True))
    bodies = [b["messages"] for b in served.state.bodies]
    by_first_user = {}
    for messages in {json.dumps(m): m for m in bodies}.values():   # a used-up file sends some again
        users = [m["content"] for m in messages if m["role"] == "user"]
        by_first_user.setdefault(users[0], []).append(messages)
    followed = 0
    for sent in by_first_user.values():
        sent.sort(key=len)
        for earlier, later in zip(sent, sent[1:]):
            followed += 1
            assert later[:len(earlier)] == earlier       # the conversation so far, unchanged
            reply = later[len(earlier)]
            assert reply["role"] == "assistant" and reply["content"] == " tok" * 4   # the server's words
    assert followed >= 3
    records = [r for level in result.levels for r in level.records]
    turns = [r for r in records if r.turn is not None]
    assert turns
    if sizing == "steady":      # warm-up and measured streams number their requests apart
        return
    by_index = {(r.repeat, r.index): r for r in records}
    for r in turns:
        if r.turn and (r.repeat, r.index - 1) in by_index:
            before = by_index[(r.repeat, r.index - 1)]
            assert before.turn == r.turn - 1
            # sent only after the previous reply fully arrived, and the think time after it
            assert r.dispatch_s >= before.done_s + 0.05


# -- mooncake: prompts made from lengths and prefix-block hashes ----------------------------

TRACE = [  # the published layout: one id per 512-token block, shared leading ids = shared prefix
    {"timestamp": 0, "input_length": 1100, "output_length": 6, "hash_ids": [0, 1, 2]},
    {"timestamp": 0, "input_length": 1300, "output_length": 4, "hash_ids": [0, 1, 3]},
    {"timestamp": 500, "input_length": 700, "output_length": 5, "hash_ids": [0, 4]},
    {"timestamp": 900, "input_length": 600, "output_length": 3, "hash_ids": [5, 6]},
]
TRACE = [{**e, "timestamp": e["timestamp"] + 1000 * k} for k in range(3) for e in TRACE]


def test_trace_blocks_are_identical_for_equal_ids_and_differ_otherwise() -> None:
    from tuner.load.dataset import TraceRequest
    from tuner.load.trace_prompts import CANDIDATE_WORDS, TraceText

    text = TraceText(CANDIDATE_WORDS, block_tokens=512, overhead=1)
    a, b = (text.prompt(TraceRequest(0, n, 1, tuple(ids))) for n, ids in ((1100, [0, 1, 2]), (1300, [0, 1, 3])))
    assert len(a.split()) == 1099 and len(b.split()) == 1299          # input_length less the overhead
    shared = text.block(0) + text.block(1)
    assert a.startswith(shared) and b.startswith(shared)               # byte for byte
    assert a[len(shared):len(shared) + 40] != b[len(shared):len(shared) + 40]
    assert len({text.block(i) for i in range(50)}) == 50
    assert TraceText(CANDIDATE_WORDS, block_tokens=512, overhead=1, seed=1).block(0) != text.block(0)


def test_a_trace_is_sent_with_exact_lengths_and_its_shared_prefixes_on_the_wire(
        served: Served, tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text(jsonl(TRACE))
    spec = LoadSpec.model_validate({
        "api": "completions", "sizing": "requests", "concurrency": [2], "requests_per_stream": 4,
        "warmup_requests": 2, "min_requests": 2, "workload": {"dataset": {"path": str(path), "format": "auto"}}})
    result = asyncio.run(run_sweep(served.base_url, "fake", spec, ignore_eos=True))
    assert not [w for w in result.warnings if "trace prompt" in w], result.warnings
    prompts = [b["prompt"] for b in served.state.bodies if b["max_tokens"] in (3, 4, 5, 6)]
    assert len(prompts) == 10
    by_length = {e["output_length"]: e for e in TRACE}
    for body in served.state.bodies:
        entry = by_length[body["max_tokens"]]
        assert len(body["prompt"].split()) == entry["input_length"]   # the fake's tokenizer: a word a token
    first = {body["max_tokens"]: body["prompt"] for body in served.state.bodies}
    blocks = [first[k].split() for k in (6, 4, 5, 3)]
    assert blocks[0][:1024] == blocks[1][:1024] and blocks[0][1024:1030] != blocks[1][1024:1030]
    assert blocks[0][:512] == blocks[2][:512] and blocks[0][512:520] != blocks[2][512:520]
    assert blocks[3][:8] != blocks[0][:8]
