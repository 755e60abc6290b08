"""The generated shared-prefix workload (issue 33, item 4): groups of requests that begin with
the same system prompt, then a question of their own, for users without data of their own."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from tests.request_plans import build_plan
from tests.sim_process import serving_sim
from tuner.engine.measure import format_summary, measure
from tuner.load.filler import shared_prefix_text
from tuner.load.load_spec import WorkloadClass, WorkloadSpec
from tuner.load.workload import PromptStream
from tuner.study.study_file import parse_study

ROOT = Path(__file__).resolve().parents[1]


def shared(**kw: object) -> WorkloadSpec:
    fields = {"name": "sp", "kind": "shared_prefix", "prompt_tokens": 600, "prefix_tokens": 400,
              "prefix_groups": 3, **kw}
    return WorkloadSpec(classes=(WorkloadClass.model_validate(fields),))


def _group(prompt: str) -> int:
    assert prompt.startswith("Policy set ")
    return int(prompt.split()[2].rstrip("."))


def test_a_group_shares_its_prefix_byte_for_byte_across_levels_and_the_rest_differs() -> None:
    spec = shared()
    prefixes = {g: shared_prefix_text(0, "sp", g, 400) for g in range(3)}
    plans = [p for stream in ("warmup-c1", "measure-c1", "measure-c8")
             for p in build_plan(spec, 40, seed=0, stream=stream, ignore_eos=True)]
    for plan in plans:
        prefix = prefixes[_group(plan.prompt)]
        assert plan.prompt.startswith(prefix)
        assert len(plan.prompt) > len(prefix) + 20        # a question of its own follows
    assert set(Counter(_group(p.prompt) for p in plans)) == {0, 1, 2}
    assert len({p.prompt for p in plans}) == len(plans)   # no request repeats another
    # prompts of different groups part within the server's first cache block
    assert len({prefixes[g][:24] for g in prefixes}) == 3
    # the prefix length is the one asked for, as estimated (~1.3 tokens a word)
    for prefix in prefixes.values():
        assert 0.9 * 400 <= len(prefix.split()) * 1.3 <= 1.1 * 400


def test_the_prefix_depends_on_seed_class_and_group_only() -> None:
    assert shared_prefix_text(0, "sp", 1, 400) == shared_prefix_text(0, "sp", 1, 400)
    assert shared_prefix_text(1, "sp", 1, 400) != shared_prefix_text(0, "sp", 1, 400)
    assert shared_prefix_text(0, "other", 1, 400) != shared_prefix_text(0, "sp", 1, 400)


def test_exact_fitting_and_the_steady_stream_trim_the_question_never_the_prefix() -> None:
    spec = shared()
    words = lambda text: len(text.split())  # noqa: E731 - a stand-in tokenizer: one token a word
    for plan in build_plan(spec, 12, seed=0, stream="measure-c4", ignore_eos=True, count_tokens=words):
        assert plan.prompt.startswith(shared_prefix_text(0, "sp", _group(plan.prompt), 400))
        assert abs(words(plan.prompt) - plan.target_prompt_tokens) <= 2
    stream = PromptStream(spec, seed=0, stream="measure-c4", ignore_eos=True)
    for _ in range(70):                                  # past one allocation block
        prompt = stream.next().prompt
        assert prompt.startswith(shared_prefix_text(0, "sp", _group(prompt), 400))


@pytest.mark.parametrize(("fields", "message"), [
    ({"prefix_tokens": None}, "kind shared_prefix needs prefix_tokens"),
    ({"prefix_tokens": 560}, "prefix_tokens 560 leaves no room for a question in the shortest prompt (540"),
    ({"kind": "open_ended", "prefix_groups": None}, "prefix_tokens is for kind shared_prefix only"),
    ({"prefix_groups": 0}, "prefix_groups"),
])
def test_bad_shared_prefix_fields_name_the_field(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message.replace("(", r"\(")):
        shared(**fields)


STUDY = """
name: shared-prefix
server:
  command: ["{python}", -m, tuner.sim]
  model: /models/smol
  served_model_name: smol
load:
  api: completions
  sizing: requests
  concurrency: [1, 4]
  requests_per_stream: 6
  warmup_requests: 4
  workload:
    classes:
      - {CLASS}
"""


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The simulator (prefix caching on, as vLLM's default) serving 'smol'."""
    with serving_sim(tmp_path_factory.mktemp("sim")) as url:
        yield url


def test_the_server_prefix_cache_sees_the_reuse_only_the_shared_prefix_class_has(
        sim: str, tmp_path: Path) -> None:
    rates = {}
    for name, cls in {
        "open_ended": "{name: o, kind: open_ended, prompt_tokens: 600, output_tokens: 8}",
        "shared_prefix": ("{name: s, kind: shared_prefix, prompt_tokens: 600, prefix_tokens: 480, "
                          "prefix_groups: 2, output_tokens: 8}"),
    }.items():
        spec = parse_study(STUDY.replace("{CLASS}", cls), "shared-prefix.yaml")
        summary = measure(sim, spec, probe=False, out_dir=tmp_path / name)
        level = summary["levels"]["4"]
        assert level["metrics"]["failed"] == 0
        rates[name] = level["prefix_cache_hit_rate"]
        if name == "shared_prefix":
            assert f"prefix cache {rates[name]:.0%}" in format_summary(summary)
    # 2 groups x 480 of ~600 tokens shared: most of each prompt is served from the cache
    assert rates["shared_prefix"] > 0.5, rates
    assert rates["open_ended"] < 0.1, rates
