"""params -> argv/env rendering (shared by trials and export)."""

from __future__ import annotations

import json
import shlex

from tuner.vllm.render import RenderedCommand, asked_settings, render_command, shell_line
from tuner.study.spec import ServerSpec


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


def test_speculative_fields_without_method_are_dropped() -> None:
    out = render_command(server(), {"speculative_config.method": None, "speculative_config.num_speculative_tokens": 3})
    assert "--speculative-config" not in out.argv
    out = render_command(server(), {"speculative_config.method": "ngram", "speculative_config.num_speculative_tokens": 3})
    i = out.argv.index("--speculative-config")
    assert json.loads(out.argv[i + 1]) == {"method": "ngram", "num_speculative_tokens": 3}


def test_asked_settings_is_flat_and_includes_fixed() -> None:
    s = server(flags={"compilation_config": {"mode": 3}}, env={"A": 1})
    assert asked_settings(s, {"enforce_eager": False, "env:NCCL_PROTO": "LL"}) == {
        "compilation_config.mode": 3, "env:A": "1", "enforce_eager": False, "env:NCCL_PROTO": "LL",
    }


def test_shell_line_round_trips_and_redacts() -> None:
    cmd = RenderedCommand(["vllm", "serve", "--speculative-config", '{"method":"ngram","k":3}', "a b"],
                          {"NCCL_PROTO": "LL", "HF_TOKEN": "hf_secret"})
    line = shell_line(cmd, redact=("HF_TOKEN",))
    assert "hf_secret" not in line
    assert 'HF_TOKEN="${HF_TOKEN}"' in line
    words = shlex.split(line)
    assert words[2:] == cmd.argv and words[0] == "NCCL_PROTO=LL"
