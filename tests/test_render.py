"""The one renderer (tuner.vllm.knobs.render_command): argv, the configuration env, the
measurement-only env and the flat asked settings, from one call."""

from __future__ import annotations

import json
import shlex

import pytest

from tuner.study.server_spec import ServerSpec
from tuner.vllm.knobs import RenderedCommand, render_command, shell_line


def server(**kw: object) -> ServerSpec:
    return ServerSpec(model="/m", command=["{python}", "-m", "tuner.sim"], **kw)


def test_nested_fields_merge_into_one_json_value_with_fixed_flags() -> None:
    s = server(flags={"compilation_config": {"mode": 3}, "tensor_parallel_size": 8})
    out = render_command(s, {
        "compilation_config.cudagraph_mode": "PIECEWISE",
        "compilation_config.max_cudagraph_capture_size": 64,
    }, python="/py")
    assert out.argv[:3] == ["/py", "-m", "tuner.sim"]
    i = out.argv.index("--compilation-config")
    assert json.loads(out.argv[i + 1]) == {"mode": 3, "cudagraph_mode": "PIECEWISE", "max_cudagraph_capture_size": 64}
    assert out.argv.count("--compilation-config") == 1
    assert out.argv[out.argv.index("--tensor-parallel-size") + 1] == "8"
    assert out.argv[out.argv.index("--host") + 1] == "127.0.0.1"
    assert out.args["compilation_config"] == json.loads(out.argv[i + 1])


def test_booleans_none_lists_and_env() -> None:
    out = render_command(server(env={"VLLM_X": True}), {
        "enforce_eager": True, "disable_custom_all_reduce": False,
        "cudagraph_capture_sizes": [1, 2, 4], "max_num_seqs": None,
        "env:NCCL_PROTO": "LL", "env:NCCL_ALGO": None,
    })
    assert "--enforce-eager" in out.argv
    assert "--no-disable-custom-all-reduce" in out.argv
    i = out.argv.index("--cudagraph-capture-sizes")
    assert out.argv[i + 1 : i + 4] == ["1", "2", "4"]
    assert "--max-num-seqs" not in out.argv
    assert out.env == {"VLLM_X": "1", "NCCL_PROTO": "LL"}
    assert out.measurement_env == {}


def test_speculative_fields_without_method_are_dropped() -> None:
    out = render_command(server(), {"speculative_config.method": None, "speculative_config.num_speculative_tokens": 3})
    assert "--speculative-config" not in out.argv and not out.asked
    out = render_command(server(), {"speculative_config.method": "ngram",
                                    "speculative_config.num_speculative_tokens": 3})
    i = out.argv.index("--speculative-config")
    assert json.loads(out.argv[i + 1]) == {"method": "ngram", "num_speculative_tokens": 3}


def test_asked_is_flat_includes_fixed_and_matches_the_argv() -> None:
    s = server(flags={"compilation_config": {"mode": 3}}, env={"A": 1})
    out = render_command(s, {"enforce_eager": False, "env:NCCL_PROTO": "LL"})
    assert out.asked == {
        "compilation_config.mode": 3, "env:A": "1", "enforce_eager": False, "env:NCCL_PROTO": "LL",
    }
    assert json.loads(out.argv[out.argv.index("--compilation-config") + 1]) == {"mode": 3}


@pytest.mark.parametrize(("mode", "searched", "expected"), [
    ("auto", ["env:NCCL_PROTO"], {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV"}),
    ("auto", ["env:NCCL_BUFFSIZE", "enforce_eager"], {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV"}),
    ("auto", ["enforce_eager", "env:VLLM_ALLREDUCE_USE_SYMM_MEM"], {}),
    ("on", [], {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV"}),
    ("off", ["env:NCCL_PROTO"], {}),
])
def test_measurement_env_comes_from_the_searched_knobs(mode: str, searched: list[str],
                                                       expected: dict[str, str]) -> None:
    out = render_command(server(), {"env:NCCL_PROTO": "LL"}, nccl_debug=mode, searched=searched)  # type: ignore[arg-type]
    assert out.measurement_env == expected
    assert out.env == {"NCCL_PROTO": "LL"}
    assert out.launch_env == {"NCCL_PROTO": "LL", **expected}


def test_the_configuration_env_wins_over_the_measurement_env() -> None:
    s = server(env={"NCCL_DEBUG": "WARN", "VLLM_CACHE_ROOT": "/mine"})
    out = render_command(s, {}, nccl_debug="on", compile_cache_dir="/study/cache")
    assert out.env == {"NCCL_DEBUG": "WARN", "VLLM_CACHE_ROOT": "/mine"}
    assert out.measurement_env == {"NCCL_DEBUG_SUBSYS": "INIT,ENV"}
    assert out.launch_env["NCCL_DEBUG"] == "WARN" and out.launch_env["VLLM_CACHE_ROOT"] == "/mine"


def test_compile_cache_dir_is_measurement_env_and_must_be_expanded() -> None:
    out = render_command(server(), {}, compile_cache_dir="/study/cache")
    assert out.measurement_env == {"VLLM_CACHE_ROOT": "/study/cache"} and out.env == {}
    with pytest.raises(ValueError, match="not absolute"):
        render_command(server(), {}, compile_cache_dir="~/cache")


def test_shell_line_round_trips_and_redacts() -> None:
    cmd = RenderedCommand(["vllm", "serve", "--speculative-config", '{"method":"ngram","k":3}', "a b"],
                          {"NCCL_PROTO": "LL", "HF_TOKEN": "hf_secret"}, {"NCCL_DEBUG": "INFO"})
    line = shell_line(cmd, redact=("HF_TOKEN",))
    assert "hf_secret" not in line and "NCCL_DEBUG" not in line
    assert 'HF_TOKEN="${HF_TOKEN}"' in line
    words = shlex.split(line)
    assert words[2:] == cmd.argv and words[0] == "NCCL_PROTO=LL"
