"""vLLM's torch.compile cache as the tuner sees it (tuner.vllm.compile_cache): the compile
record of a server log and the compile key of a configuration.

Which lines are recorded and which are built:
* recorded: tests/fixtures/vllm_logs/h200-0.26.0/cudagraph-full.log (a CUDA miss),
  cpu-0.32.0/compiled.log (a CPU miss, AOT only), the eager fixtures (no compile); the
  real H200 hits and the misses of every CUDA-graph mode are asserted in
  tests/test_gpu_h200_run.py (fixtures h200-0.26.0-study/);
* built here from vLLM's own format strings (backends.py, the AOT cache in
  decorators.py / compilation AOT module, monitor.py, core.py) with ``%``, exactly as
  vLLM's logger formats them, for what no recorded log shows: a hit without its init
  line, tensor-parallel workers, partial hits, stale entries (``hit_log`` below).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.vllm.compile_cache import (
    CompileRecord,
    check_cache_dir,
    compile_key,
    compile_settings,
    expand_cache_dir,
)
from tuner.vllm.knobs import knob
from tuner.vllm.log_digest import read_log

FIXTURES = Path(__file__).parent / "fixtures" / "vllm_logs"

# vLLM's format strings (vllm/compilation/backends.py, the AOT cache, monitor.py, core.py).
USING_CACHE = "Using cache directory: %s for vLLM's torch.compile"
DYNAMO = "Dynamo bytecode transform time: %.2f s"
LOADED = "Directly load the compiled graph(s) for compile range %s from the cache, took %.3f s"
COMPILED = "Compiling a graph for compile range %s takes %.2f s"
AOT_LOADED = "Directly load AOT compilation from path %s"
AOT_SAVED = "saved AOT compiled function to %s"
RELOAD = "Compiling model again due to a load failure from %s, reason: %s"
TOTAL = "torch.compile took %.2f s in total"
INIT = "init engine (profile, create kv cache, warmup model) took %.2f s (compilation: %.2f s)"
CAPTURED = "Graph capturing finished in %.0f secs, took %.2f GiB"

ROOT = "/cache/vllm/torch_compile_cache"
AOT = f"{ROOT}/torch_aot_compile/{'ab' * 32}/rank_0_0/model"


def line(text: str, src: str = "backends.py:1094", proc: str = "EngineCore pid=7") -> str:
    return f"({proc}) INFO 11-29 10:04:12 [{src}] {text}"


def hit_log(proc: str = "EngineCore pid=7") -> str:
    return "\n".join([
        line(USING_CACHE % f"{ROOT}/027d5a3cd6/rank_0_0/backbone", proc=proc),
        line(DYNAMO % 1.47, "backends.py:1155", proc),
        line(LOADED % ("(1, 8192)", 0.717), "backends.py:292", proc),
        line(AOT_LOADED % AOT, "decorators.py:311", proc),
        line(TOTAL % 2.89, "monitor.py:53", proc),
        line(CAPTURED % (2, 0.17), "gpu_model_runner.py:6582", proc),
        line(INIT % (18.02, 2.89), "core.py:340", proc),
    ])


def test_recorded_cuda_miss() -> None:
    rec = read_log((FIXTURES / "h200-0.26.0" / "cudagraph-full.log").read_text()).compile_record()
    assert rec.cache == "miss"
    assert rec.compile_s == 13.49 and rec.dynamo_s == 4.88 and rec.inductor_s == 6.55
    assert rec.load_s is None
    assert rec.cache_dir == "~/.cache/vllm/torch_compile_cache/027d5a3cd6/rank_0_0/backbone"
    assert rec.cache_hash == "027d5a3cd6"
    assert rec.aot == "saved" and rec.aot_path.endswith(
        "356c278101e4b0a7be6cc9da23961a3f6dbf7855f6000e64b2272cfc29d0e07a/rank_0_0/model")
    assert rec.graph_capture_s == 2.0 and rec.init_engine_s == 29.24


def test_recorded_cpu_032_miss_names_the_module() -> None:
    # 0.32 on CPU prints only "[backbone] saved AOT compiled function to ..." and no totals.
    rec = read_log((FIXTURES / "cpu-0.32.0" / "compiled.log").read_text()).compile_record()
    assert rec.cache == "miss" and rec.aot == "saved"
    assert rec.aot_path.startswith("/root/.cache/vllm/torch_compile_cache/torch_aot_compile/bc0873e4")
    assert rec.compile_s is None and rec.init_engine_s == 140.16


@pytest.mark.parametrize("path", ["h200-0.26.0/eager.log", "cpu-0.32.0/eager.log"])
def test_recorded_eager_compiles_nothing(path: str) -> None:
    rec = read_log((FIXTURES / path).read_text()).compile_record()
    assert rec.cache == "none" and rec.cache_dir is None and rec.compile_s is None
    assert rec.init_engine_s is not None


def test_built_hit_without_init_line_takes_the_total() -> None:
    text = "\n".join(hit_log().splitlines()[:5])
    rec = read_log(text).compile_record()
    assert rec.cache == "hit" and rec.compile_s == 2.89 and rec.init_engine_s is None


def test_032_module_prefix_on_the_aot_lines() -> None:
    text = line("[backbone] " + AOT_LOADED % AOT, "decorators.py:311")
    rec = read_log(text).compile_record()
    assert rec.cache == "hit" and rec.aot_path == AOT


def test_partial_when_something_loads_and_something_compiles() -> None:
    # Seen in public 0.2x logs: the AOT artifact loaded, yet a graph range compiled.
    text = "\n".join([line(USING_CACHE % f"{ROOT}/5a9d9c976f/rank_0_0/backbone"),
                      line(COMPILED % ("(1, 8192)", 7.77), "backends.py:391"),
                      line(AOT_LOADED % AOT, "decorators.py:305"), line(TOTAL % 9.69, "monitor.py:53")])
    assert read_log(text).compile_record().cache == "partial"
    stale = "\n".join([line(RELOAD % (AOT, "Compile cache file corrupted."), "decorators.py:1"),
                       line(AOT_LOADED % AOT, "decorators.py:311")])
    rec = read_log(stale).compile_record()
    assert rec.cache == "partial" and rec.reload_reason == "Compile cache file corrupted."


def test_unknown_until_the_engine_is_up() -> None:
    text = (FIXTURES / "h200-0.26.0" / "cudagraph-full.log").read_text()
    head = "\n".join(l for l in text.splitlines()[:25])
    assert "Using cache directory" not in head
    assert read_log(head).compile_record().cache is None
    assert read_log("").compile_record().cache is None


def test_tensor_parallel_times_come_from_one_process() -> None:
    tp0 = hit_log("Worker_TP0 pid=57").splitlines()
    tp1 = [l.replace("Worker_TP0 pid=57", "Worker_TP1 pid=58").replace("took 2.89", "took 3.50")
           for l in tp0]
    rec = read_log("\n".join(x for pair in zip(tp0, tp1) for x in pair)).compile_record()
    assert rec.cache == "hit" and rec.load_s == 0.717 and rec.compile_s == 2.89


def test_record_round_trips_and_missing_is_unknown() -> None:
    rec = read_log(hit_log()).compile_record()
    again = CompileRecord.from_json({**rec.to_json(), "later_field": 1})
    assert again == rec
    assert CompileRecord.from_json(None) is None


# ---------------------------------------------------------------------------------- the key

BASE = {"tensor_parallel_size": 8, "max_model_len": 32768, "gpu_memory_utilization": 0.92,
        "compilation_config.cudagraph_mode": "FULL_AND_PIECEWISE", "disable_custom_all_reduce": True,
        "env:VLLM_ALLREDUCE_USE_FLASHINFER": "0", "env:NCCL_PROTO": "LL"}


@pytest.mark.parametrize("change", [
    {"env:NCCL_PROTO": "Simple"}, {"env:NCCL_ALGO": "Ring"}, {"disable_custom_all_reduce": False},
    {"gpu_memory_utilization": 0.8}, {"enable_prefix_caching": False}, {"seed": 3},
    {"async_scheduling": False}, {"env:VLLM_LOGGING_LEVEL": "DEBUG"}, {"env:VLLM_CACHE_ROOT": "/x"},
    {"max_num_partial_prefills": 2}, {"served_model_name": "other"},
])
def test_settings_outside_vllms_key_share_it(change: dict) -> None:
    assert compile_key({**BASE, **change}) == compile_key(BASE)


@pytest.mark.parametrize("change", [
    {"compilation_config.cudagraph_mode": "PIECEWISE"}, {"max_num_batched_tokens": 4096},
    {"speculative_config.method": "ngram"}, {"tensor_parallel_size": 4}, {"kv_cache_dtype": "fp8"},
    {"env:VLLM_ALLREDUCE_USE_FLASHINFER": "1"}, {"env:VLLM_USE_AOT_COMPILE": "0"},
    {"max_model_len": 16384}, {"compilation_config.max_cudagraph_capture_size": 64},
    {"max_num_seqs": 64}, {"dtype": "float16"}, {"some_future_flag": 1},
])
def test_settings_in_vllms_key_change_it(change: dict) -> None:
    assert compile_key({**BASE, **change}) != compile_key(BASE)


def test_eager_compiles_nothing() -> None:
    assert compile_key({**BASE, "enforce_eager": True}) is None
    assert compile_key({**BASE, "compilation_config.mode": 0}) is None
    assert compile_key({**BASE, "enforce_eager": False}) is not None


def test_every_verdict_has_a_reason() -> None:
    for target in [*BASE, "speculative_config.num_speculative_tokens", "compilation_config.cache_dir",
                   "env:RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES", "unknown_flag"]:
        assert knob(target).why
    assert knob("compilation_config.cache_dir").compile_key is False
    assert knob("env:NCCL_PROTO").compile_key is False and knob("env:VLLM_FOO").compile_key is True
    assert set(compile_settings(BASE)) == {"compilation_config.cudagraph_mode", "max_model_len",
                                           "tensor_parallel_size", "env:VLLM_ALLREDUCE_USE_FLASHINFER"}


# ------------------------------------------------------------------------ execution.compile_cache_dir


def test_cache_dir_in_the_spec_is_checked_but_not_expanded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spec validation is pure: it reads no environment, so the spec keeps what the file says."""
    from pydantic import ValidationError

    from tuner.study.spec import ExecutionSpec

    monkeypatch.setenv("HOME", "/should/not/be/read")
    assert ExecutionSpec().compile_cache_dir is None
    assert ExecutionSpec(compile_cache_dir="~/vc").compile_cache_dir == "~/vc"
    assert ExecutionSpec(compile_cache_dir=" $CACHE/x ").compile_cache_dir == "$CACHE/x"
    assert ExecutionSpec(compile_cache_dir="/data/vllm").compile_cache_dir == "/data/vllm"
    for bad in ("cache/vllm", "./vllm", "", "  "):
        with pytest.raises(ValidationError, match="compile_cache_dir"):
            ExecutionSpec(compile_cache_dir=bad)
    with pytest.raises(ValueError, match="relative"):
        check_cache_dir("rel")


def test_cache_dir_expansion_reads_only_what_it_is_given() -> None:
    env = {"CACHE": "/fast/c", "REL": "here"}
    assert expand_cache_dir("~/vc", env, "/home/u") == "/home/u/vc"
    assert expand_cache_dir("~", env, "/home/u") == "/home/u"
    assert expand_cache_dir("$CACHE/x", env, "/home/u") == "/fast/c/x"
    assert expand_cache_dir("${CACHE}/x/", env, "/home/u") == "/fast/c/x"
    assert expand_cache_dir("/data/vllm/", {}, "/home/u") == "/data/vllm"
    with pytest.raises(ValueError, match="unset variable"):
        expand_cache_dir("$NOT_SET/vllm", env, "/home/u")
    with pytest.raises(ValueError, match="relative"):
        expand_cache_dir("$REL/vllm", env, "/home/u")


def test_the_cli_expands_the_cache_dir_where_the_study_runs(monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:
    from tuner.commands.run import on_this_host
    from tuner.errors import SpecError
    from tuner.study.study_file import parse_study

    spec = parse_study("name: s\nserver: {model: m}\nexecution: {compile_cache_dir: $TUNER_C/x}\n")
    monkeypatch.setenv("TUNER_C", str(tmp_path))
    assert on_this_host(spec).execution.compile_cache_dir == str(tmp_path / "x")
    assert spec.execution.compile_cache_dir == "$TUNER_C/x"
    monkeypatch.delenv("TUNER_C")
    with pytest.raises(SpecError, match="^s.yaml: execution.compile_cache_dir.*unset variable"):
        on_this_host(spec, source="s.yaml")


def test_compiled_engine_without_cache_lines_is_unknown_not_none() -> None:
    """The CPU build with VLLM_USE_AOT_COMPILE=0 compiles ("Warming up model for the
    compilation...") but prints no cache line: the record must say unknown, never "none"
    (which means the engine ran without torch.compile)."""

    from pathlib import Path

    from tuner.vllm.log_digest import read_log

    fixtures = Path(__file__).parent / "fixtures" / "vllm_logs" / "cpu-0.32.0"
    recorded = (fixtures / "compiled.log").read_text()
    assert read_log(recorded).compile_record().cache == "miss"          # recorded: it saved an AOT artifact
    silent = "\n".join(l for l in recorded.splitlines() if "saved AOT compiled function" not in l)
    assert read_log(silent).compile_record().cache is None
    assert read_log((fixtures / "eager.log").read_text()).compile_record().cache == "none"
