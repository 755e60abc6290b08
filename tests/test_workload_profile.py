"""The workload a study measures, as status and the report show it (issue 33, item 6): length
distributions, turns, the share of prompt tokens repeating an earlier prefix and a trace's
arrivals, over each dataset format and the synthetic classes, with numbers worked out by hand."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import CPU_EXAMPLE
from tuner.adapters.artifacts import atomic_write_json
from tuner.load.dataset import parse_dataset
from tuner.load.load_spec import DatasetSource, WorkloadClass, WorkloadSpec
from tuner.load.workload_profile import Distribution, profile_workload
from tuner.views.workload_view import workload_lines


def jsonl(entries: list[dict]) -> str:
    return "".join(json.dumps(e) + "\n" for e in entries)


def dataset_spec(fmt: str, **kw: object) -> WorkloadSpec:
    return WorkloadSpec(dataset=DatasetSource(path="traffic.jsonl", format=fmt, **kw))


def profile_of(entries: list[dict] | str, fmt: str, block_words: int = 1, **kw: object):
    text = entries if isinstance(entries, str) else jsonl(entries)
    return profile_workload(dataset_spec(fmt, **kw), parse_dataset(text, fmt, source="d", **(
        {"block_tokens": kw["block_tokens"]} if "block_tokens" in kw else {})), block_words=block_words)


PROMPTS = [
    {"prompt": "one two three four", "output_tokens": 7},   # 4 words, nothing before it
    {"prompt": "one two three five six"},                   # 5 words, 3 shared with the first
    {"prompt": "seven eight", "output_tokens": 3},          # 2 words, nothing shared
    {"prompt": "one two three four", "output_tokens": 7},   # 4 words, all repeat the first
]


def test_prompts_lengths_and_longest_common_prefix_in_words() -> None:
    p = profile_of(PROMPTS, "prompts", output_tokens=9)
    assert (p.source, p.entries, p.requests, p.multi_turn) == ("dataset", 4, 4, 0)
    # words x 1.3, rounded: 5.2 -> 5, 6.5 -> 6, 2.6 -> 3, 5.2 -> 5
    assert p.prompt_tokens == Distribution(count=4, mean=4.75, min=3, p50=5.0, p90=pytest.approx(5.7), max=6,
                                           edges=(3, 4, 5, 6, 7), counts=(1, 0, 2, 1))
    # 7, the default 9, 3, 7 -> sorted 3 7 7 9: p90 at 2.7 of 3 steps
    assert (p.output_tokens.p50, p.output_tokens.p90, p.output_tokens.max) == (7.0, pytest.approx(8.4), 9)
    # repeated words 3 + 4 of 15
    assert p.prefix_repeat_share == pytest.approx(7 / 15)
    assert p.trace is None and p.turns.max == 1
    # whole blocks only, as a prefix cache reuses them: 2-word blocks give 2 + 4 of 15
    assert profile_of(PROMPTS, "prompts", block_words=2).prefix_repeat_share == pytest.approx(6 / 15)


CHATS = [
    {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"},
                  {"role": "assistant", "content": "hi you"}, {"role": "user", "content": "bye now"}],
     "output_tokens": 4},
    {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what time"}],
     "output_tokens": 6},
]
SHAREGPT = [{"conversations": [{"from": {"system": "system", "user": "human", "assistant": "gpt"}[m["role"]],
                                "value": m["content"]} for m in c["messages"]]} for c in CHATS]


@pytest.mark.parametrize(("fmt", "entries"), [("openai-chat", CHATS), ("sharegpt", SHAREGPT)])
def test_a_later_turn_repeats_the_conversation_so_far(fmt: str, entries: list[dict]) -> None:
    p = profile_of(entries, fmt, output_tokens=5)
    # requests: conversation 1 turn 0 (4 words, new), turn 1 (8 words: turn 0, the reply,
    # the new message; 6 repeat), conversation 2 (4 words, its system prompt's 2 repeat)
    assert (p.entries, p.requests, p.multi_turn) == (2, 3, 1)
    assert p.prefix_repeat_share == pytest.approx(8 / 16)
    assert (p.turns.p50, p.turns.max) == (1.5, 2)
    assert sorted([p.prompt_tokens.min, p.prompt_tokens.p50, p.prompt_tokens.max]) == [5, 5, 10]
    outputs = (4, 4, 6) if fmt == "openai-chat" else (5, 5, 5)     # sharegpt gives no lengths
    assert (p.output_tokens.min, p.output_tokens.p50, p.output_tokens.max) == (min(outputs), outputs[1],
                                                                              max(outputs))
    assert "a turn resends the conversation so far" in p.prefix_method


def test_the_same_words_from_another_role_are_another_prefix() -> None:
    chats = [{"messages": [{"role": "user", "content": "same words here"}]},
             {"messages": [{"role": "system", "content": "same words here"}, {"role": "user", "content": "x"}]}]
    assert profile_of(chats, "openai-chat").prefix_repeat_share == 0.0


TRACE = [  # block_tokens 4
    {"timestamp": 0, "input_length": 8, "output_length": 10, "hash_ids": [1, 2]},
    {"timestamp": 500, "input_length": 6, "output_length": 20, "hash_ids": [1, 3]},    # block 1 seen: 4
    {"timestamp": 1500, "input_length": 7, "output_length": 30, "hash_ids": [1, 2]},   # both seen: all 7
    {"timestamp": 2500, "input_length": 4, "output_length": 40, "hash_ids": [2]},      # 2 came after 1 only
    {"timestamp": 3000, "input_length": 5, "output_length": 50, "hash_ids": [9, 8]},
]


def test_mooncake_prefix_repeat_from_hash_ids_and_its_arrivals() -> None:
    p = profile_of(TRACE, "mooncake", block_tokens=4)
    assert p.prefix_repeat_share == pytest.approx((4 + 7) / (8 + 6 + 7 + 4 + 5))
    assert (p.prompt_tokens.p50, p.prompt_tokens.max) == (6.0, 8)
    assert (p.output_tokens.p50, p.output_tokens.p90) == (30.0, pytest.approx(46.0))
    assert p.trace is not None
    # 3 s from first to last, 1 s buckets: 0 and 0.5 s, 1.5 s, 2.5 s and the last at 3.0 s
    assert (p.trace.duration_s, p.trace.bucket_s, p.trace.rates) == (3.0, 1.0, (2.0, 1.0, 2.0))
    assert p.trace.mean_rate == pytest.approx(5 / 3)


def test_a_long_trace_is_shown_in_coarser_buckets() -> None:
    lines = [{"timestamp": t, "input_length": 4, "output_length": 1, "hash_ids": [t]}
             for t in (0, 5_000, 9_999, 600_000)]
    p = profile_of(lines, "mooncake", block_tokens=4)
    assert p.trace is not None and p.prefix_repeat_share == 0.0
    assert (p.trace.bucket_s, len(p.trace.rates)) == (10.0, 60)          # 600 s in at most 60 buckets
    assert p.trace.rates[0] == 0.3 and p.trace.rates[-1] == 0.1 and sum(p.trace.rates[1:-1]) == 0
    assert p.trace.mean_rate == pytest.approx(4 / 600)
    # a last bucket the trace fills in part is a rate over that part: [600, 601] holds 2 requests
    p = profile_of([*lines, {"timestamp": 601_000, "input_length": 4, "output_length": 1, "hash_ids": [1]}],
                   "mooncake", block_tokens=4)
    assert p.trace is not None and (p.trace.bucket_s, len(p.trace.rates)) == (15.0, 41)
    assert p.trace.rates[0] == 3 / 15 and p.trace.rates[-1] == 2.0 and sum(p.trace.rates[1:-1]) == 0


def test_synthetic_classes_are_profiled_as_configured() -> None:
    spec = WorkloadSpec(classes=(
        WorkloadClass(name="a", kind="open_ended", weight=3, prompt_tokens=100, prompt_tokens_jitter=0,
                      output_tokens=50),
        WorkloadClass(name="sp", kind="shared_prefix", prompt_tokens=200, prompt_tokens_jitter=0,
                      prefix_tokens=150, prefix_groups=2, output_tokens=10)))
    p = profile_workload(spec, synthetic_requests=12)
    # 9 of a and 3 of sp; sp's second group's first request is its third: one repeats 150
    assert (p.source, p.requests, p.prompt_tokens.p50, p.prompt_tokens.p90) == ("synthetic", 12, 100.0, 200.0)
    assert p.prefix_repeat_share == pytest.approx(150 / (9 * 100 + 3 * 200))
    assert (p.output_tokens.min, p.output_tokens.max, p.output_tokens.mean) == (10, 50, 40.0)
    assert p.description == "a (open_ended, weight 3), sp (shared_prefix, weight 1)"

    jittered = WorkloadSpec(classes=(WorkloadClass(name="j", kind="copy_heavy", prompt_tokens=80,
                                                   prompt_tokens_jitter=0.5),))
    p = profile_workload(jittered, synthetic_requests=4)
    # spread evenly over 80 x (1 +- 0.5): 80 x 0.625, 0.875, 1.125, 1.375
    assert (p.prompt_tokens.min, p.prompt_tokens.p50, p.prompt_tokens.max) == (50, 80.0, 110)
    assert p.prompt_tokens.mean == 80 and p.prefix_repeat_share == 0.0
    assert profile_workload(WorkloadSpec()).prefix_repeat_share == 0.0    # the default open_ended class


def test_histogram_bins_stay_coarse() -> None:
    d = Distribution.of(list(range(1, 101)))
    assert (len(d.counts), d.edges[0], d.edges[-1], set(d.counts)) == (25, 1, 101, {4})
    one = Distribution.of([7, 7])
    assert (one.edges, one.counts, one.p90) == ((7, 8), (2,), 7.0)


def test_a_dataset_workload_needs_its_entries() -> None:
    with pytest.raises(ValueError, match="profiled from the dataset's entries"):
        profile_workload(dataset_spec("prompts"))


def test_status_block_lines() -> None:
    p = profile_of(TRACE, "mooncake", block_tokens=4)
    assert workload_lines(p.to_dict()) == [
        "  workload: dataset traffic.jsonl, format mooncake (as named): 5 entries, 5 requests",
        "    prompt tokens p50 6, p90 7.6, max 8 (as the trace gives them); output tokens p50 30, p90 46",
        "    turns: one per entry",
        "    prefix repeat: 37% of prompt tokens repeat an earlier prefix (from hash ids, blocks of 4 tokens)",
        "    trace: 5 requests over 3.0s, mean 1.67 req/s; busiest 1 s bucket 2.00 req/s",
    ]
    chat = profile_of(CHATS, "openai-chat", block_words=12)
    assert "    turns per conversation p50 1.5, p90 1.9, max 2 (1 of 2 multi-turn)" in workload_lines(chat.to_dict())
    assert workload_lines(None) == []
    assert workload_lines({"source": "dataset"}) == [
        "  workload: workload.json is not a workload profile this tuner reads"]


def test_the_report_shows_the_workload_and_a_traces_arrivals(tmp_path: Path) -> None:
    from tuner.store.folder import open_for_reading
    from tuner.views.report import write_report

    root = tmp_path / "results"
    shutil.copytree(CPU_EXAMPLE, root / CPU_EXAMPLE.name)
    profile = profile_of(TRACE, "mooncake", block_tokens=4).to_dict()
    atomic_write_json(root / CPU_EXAMPLE.name / "workload.json", profile)
    handle = open_for_reading(root, CPU_EXAMPLE.name, storage_url=None)
    out = tmp_path / "report"
    paths = write_report(handle, out)
    for name in ("workload.png", "arrivals.png"):
        assert paths[name].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and paths[name].stat().st_size > 5000, name
    page = (out / "report.html").read_text()
    assert '<div id="workload"><ul><li>dataset traffic.jsonl, format mooncake (as named)' in page
    assert page.count('<img alt="workload.png"') == 1 and page.count('<img alt="arrivals.png"') == 1
    markdown = (out / "report.md").read_text()
    assert "## Workload" in markdown and "![arrivals](arrivals.png)" in markdown
    assert json.loads((out / "report.json").read_text())["workload"] == json.loads(json.dumps(profile))

    (root / CPU_EXAMPLE.name / "workload.json").unlink()     # a study run before workload.json
    paths = write_report(open_for_reading(root, CPU_EXAMPLE.name, storage_url=None), tmp_path / "old")
    assert "workload.png" not in paths and "## Workload" not in (tmp_path / "old" / "report.md").read_text()
    assert "No workload profile" in (tmp_path / "old" / "report.html").read_text()


def test_a_run_writes_the_profile_and_status_shows_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.test_status_fast import _filled_study
    from tuner.commands.run import write_workload_profile
    from tuner.views.status import build_status, format_status, status_from_folder

    handle, study = _filled_study(tmp_path)
    before = format_status(build_status(handle, study))
    assert "workload:" not in before                  # a study without workload.json shows no block
    write_workload_profile(handle)
    # demo.yaml: chat (open_ended) and edit (copy_heavy), 96 prompt tokens +-10 %, 64 output tokens;
    # 500 each spread evenly over 96 x [0.9, 1.1]: 86.4 .. 105.6, p90 between 103.66 and 103.70
    block = [
        "  workload: synthetic classes chat (open_ended, weight 1), edit (copy_heavy, weight 1): as configured, "
        "over 1,000 requests",
        "    prompt tokens p50 96, p90 104, max 106 (prompt_tokens within its jitter); output tokens p50 64, p90 64",
        "    turns: one per entry",
        "    prefix repeat: 0% of prompt tokens repeat an earlier prefix (open_ended and copy_heavy prompts share "
        "none by design)",
    ]
    assert capsys.readouterr().out.splitlines() == [f"[workload] {line.strip()}" for line in block]
    assert json.loads(handle.paths.workload_json.read_text())["source"] == "synthetic"
    fast = status_from_folder(tmp_path, handle.name)
    assert fast is not None and fast == build_status(handle, study)
    shown = format_status(fast).splitlines()
    at = shown.index(block[0])
    assert shown[at:at + len(block)] == block


def _brute_share(chats: list[dict], block: int) -> float:
    """Each request against every earlier request and request-plus-reply, word by word."""
    seen: list[list[str]] = []
    repeated = total = 0
    for chat in chats:
        units: list[str] = []
        for at, m in enumerate(chat["messages"]):
            words = m["content"].split(" ")
            units += [f"{m['role']}:{words[0]}" + (" " if len(words) > 1 else "")] + [
                w + " " for w in words[1:-1]] + ([words[-1]] if len(words) > 1 else [])
            if m["role"] == "user":
                common = max((next((i for i, (a, b) in enumerate(zip(units, s)) if a != b), min(len(units), len(s)))
                              for s in seen), default=0)
                repeated += common // block * block
                total += len(units)
                seen.append(list(units))
                rest = chat["messages"][at + 1:]
                if rest and rest[0]["role"] == "assistant":
                    reply = rest[0]["content"].split(" ")
                    seen.append(units + [f"assistant:{reply[0]}" + (" " if len(reply) > 1 else "")]
                                + [w + " " for w in reply[1:-1]] + ([reply[-1]] if len(reply) > 1 else []))
    return repeated / total


@pytest.mark.parametrize("block", [1, 2, 3, 12])
def test_the_prefix_share_is_the_longest_earlier_prefix_in_whole_blocks(block: int) -> None:
    import random

    rng = random.Random(block)
    chats = []
    for _ in range(60):
        messages = [{"role": "system", "content": " ".join(rng.choice("ab") for _ in range(rng.randint(1, 14)))}]
        for _ in range(rng.randint(1, 4)):
            messages += [{"role": "user", "content": " ".join(rng.choice("abc") for _ in range(rng.randint(1, 6)))},
                         {"role": "assistant", "content": " ".join(rng.choice("ab") for _ in range(rng.randint(1, 9)))}]
        chats.append({"messages": messages[:-1] if rng.random() < 0.5 else messages})
    share = profile_of(chats, "openai-chat", block_words=block).prefix_repeat_share
    assert 0 < share < 1 and share == pytest.approx(_brute_share(chats, block))
