"""The committed prefix-caching studies (issue 33, item 7): the same knobs (prefix caching x
chunked prefill) on the real vLLM CPU build, measured once on the support-chat dataset
(``results/examples/smollm2-cpu-chat``: multi-turn conversations sharing long system prompts)
and once on synthetic prompts of the same length that share nothing
(``results/examples/smollm2-cpu-synthetic``). What the README says of them, read back from
their files: every combination ran as asked and answered as the reference did, the server's
own prefix-cache counters show the reuse the workload profile predicted, and the chat
traffic's winner needs prefix caching (beyond noise) while on the synthetic traffic every
combination ties."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from tuner.store.handle import open_existing
from tuner.store.records import read_records
from tuner.study.study_noise import noise_of_study

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "results" / "examples"
CHAT, SYNTHETIC = "smollm2-cpu-chat", "smollm2-cpu-synthetic"
COMBINATIONS = {(True, True), (True, False), (False, False), (False, True)}


def _runs(name: str):  # type: ignore[no-untyped-def]
    handle = open_existing(EXAMPLES, name)
    return handle, [r for r in read_records(handle.load()) if r.kind == "run"]


def _outcome(name: str, number: int) -> dict:
    return json.loads((EXAMPLES / name / "trials" / f"{number:04d}" / "outcome.json").read_text())


@pytest.mark.parametrize("name", [CHAT, SYNTHETIC])
def test_every_combination_ran_as_asked_and_answered_as_the_reference(name: str) -> None:
    _, runs = _runs(name)
    asked = {(r.params["prefix_caching"], r.params["chunked_prefill"]) for r in runs}
    assert asked == COMBINATIONS
    for r in runs:
        outcome = _outcome(name, r.number)
        assert outcome["status"] == "completed" and outcome["applied"] is True and outcome["probe_passed"] is True
        checks = {c["target"]: c for c in json.loads(
            (EXAMPLES / name / "trials" / f"{r.number:04d}" / "verification.json").read_text())["checks"]}
        # the server's own log said what was asked, on and off
        for knob in ("prefix_caching", "chunked_prefill"):
            check = checks["enable_" + knob]
            assert check["status"] == "applied" and check["asked"] is check["got"] is r.params[knob], check


def test_the_server_counted_the_reuse_the_workload_profile_predicted() -> None:
    chat = json.loads((EXAMPLES / CHAT / "workload.json").read_text())
    synthetic = json.loads((EXAMPLES / SYNTHETIC / "workload.json").read_text())
    assert chat["prefix_repeat_share"] > 0.9 and chat["multi_turn"] == chat["entries"] == 48
    assert synthetic["prefix_repeat_share"] == 0
    for name, low, high in ((CHAT, 0.5, 1.0), (SYNTHETIC, 0.0, 0.0)):
        _, runs = _runs(name)
        for r in runs:
            side = _outcome(name, r.number)["server_side"]
            for level in side.values():
                if r.params["prefix_caching"]:
                    assert level["prefix_cache_queries"] > 0
                    assert low <= level["prefix_cache_hit_rate"] <= high, (name, r.number, level)
                else:                                   # off: the server never looked
                    assert level["prefix_cache_queries"] == 0


def test_on_chat_traffic_every_configuration_without_prefix_caching_loses_by_far() -> None:
    handle, runs = _runs(CHAT)
    tok, ttft = (o.label for o in handle.spec.objectives)
    on = [r for r in runs if r.params["prefix_caching"]]
    off = [r for r in runs if not r.params["prefix_caching"]]
    # Every configuration without prefix caching is behind every one with it, on both
    # objectives, and by a factor far beyond the noise between the study's fresh starts.
    assert max(r.values[tok] for r in off) < min(r.values[tok] for r in on)
    assert min(r.values[ttft] for r in off) > max(r.values[ttft] for r in on)
    assert statistics.median(r.values[tok] for r in on) > 3 * statistics.median(r.values[tok] for r in off)
    pareto = json.loads((EXAMPLES / CHAT / "pareto.json").read_text())
    assert pareto["front"] and all(e["params"]["prefix_caching"] for e in pareto["front"])
    # Beyond noise, not a tie: the runs' own intervals (a dozen bursty requests a level) are
    # scaled by what the repeated starts allow, and no tie involves a configuration without it.
    noise = noise_of_study(runs, handle.paths.confirmations(), [tok, ttft], override=None)
    assert noise.run_scale(tok) < 0.5 and noise.measured[tok].cv < 0.1
    without = {r.number for r in off}
    assert pareto["ties"] and not [t for t in pareto["ties"] if without & set(t["trials"])], pareto["ties"]


def test_on_synthetic_prompts_the_same_knobs_are_ties() -> None:
    handle, runs = _runs(SYNTHETIC)
    tok = handle.spec.objectives[0].label
    values = [r.values[tok] for r in runs]
    assert max(values) < 1.15 * min(values)
    pareto = json.loads((EXAMPLES / SYNTHETIC / "pareto.json").read_text())
    (front,) = pareto["front"]
    assert {n for t in pareto["ties"] for n in t["trials"]} == {r.number for r in runs}, pareto["ties"]


def test_on_the_real_server_each_turn_followed_the_previous_reply_and_carried_it() -> None:
    """Multi-turn ordering against the real vLLM server, from the chat study's request records:
    a conversation's turns are consecutive plans (index - turn is its first), so turn k's
    record follows turn k-1's. Each was dispatched after the previous reply's last byte, and
    the server counted its prompt as longer than the previous prompt plus that reply: the
    reply went back in (docs/measurement.md, "Your own traffic")."""

    folders = sorted((EXAMPLES / CHAT / "trials").iterdir()) + sorted((EXAMPLES / CHAT / "confirm").glob("*-*"))
    pairs = 0
    for folder in folders:
        for path in folder.glob("requests-c*.jsonl"):
            levels: dict[tuple[str, int], dict[int, dict]] = {}
            for line in path.read_text().splitlines():
                if line.strip():
                    r = json.loads(line)
                    levels.setdefault((r["phase"], r["repeat"]), {})[r["index"]] = r
            for records in levels.values():
                for index, r in records.items():
                    if not r["turn"]:
                        continue
                    before = records[index - 1]
                    assert before["turn"] == r["turn"] - 1 and before["ok"], (path, index)
                    assert r["dispatch_s"] >= before["done_s"], (path, index)
                    assert r["prompt_tokens"] > before["prompt_tokens"] + before["output_tokens"], (path, index)
                    pairs += 1
    # 2 conversations at c=1 and 4 at c=4, two later turns each, in 6 trials and the re-run
    assert pairs == 7 * 2 * (2 + 4)
