"""argv parsing of the simulator: vLLM's spellings and vLLM's error texts."""

import pytest

from tuner.sim.args import ArgvError, non_default_args, parse_argv
from tuner.sim.logs import non_default_line


def test_serve_prefix_flag_forms_and_aliases():
    a = parse_argv(["serve", "--model=/m", "-tp", "8", "--pipeline_parallel_size=1",
                    "--max-num-seqs", "64", "--gpu-memory-utilization=0.85", "-O3",
                    "--served-model-name", "a", "b", "--enforce-eager", "--seed", "-1"])
    assert a.model == "/m" and a.tensor_parallel_size == 8 and a.pipeline_parallel_size == 1
    assert a.max_num_seqs == 64 and a.gpu_memory_utilization == 0.85
    assert a.optimization_level == 3 and a.served_model_name == ["a", "b"]
    assert a.enforce_eager is True and a.seed == -1


@pytest.mark.parametrize("argv,level", [(["-O0"], 0), (["-O", "1"], 1), (["-O=2"], 2),
                                        (["--optimization-level", "3"], 3)])
def test_optimization_level_spellings(argv, level):
    assert parse_argv(["--model", "m", *argv]).optimization_level == level


def test_compilation_config_json_dotted_and_merge():
    a = parse_argv(["--model", "m", "-cc", '{"cudagraph_mode": "piecewise", "mode": 3}',
                    "-cc.max_cudagraph_capture_size=64", "--compilation-config.pass_config."
                    "fuse_allreduce_rms=false", "--cudagraph-capture-sizes", "1", "2", "4"])
    cc = a.compilation_config
    assert cc["cudagraph_mode"] == "PIECEWISE" and cc["mode"] == 3
    assert cc["max_cudagraph_capture_size"] == 64
    assert cc["pass_config"] == {"fuse_allreduce_rms": False}
    assert a.cudagraph_capture_sizes == [1, 2, 4]


def test_speculative_config_forms():
    a = parse_argv(["--model", "m", "-sc.method=ngram", "-sc.num_speculative_tokens=3",
                    "--spec-tokens", "3"])
    assert a.speculative_config == {"method": "ngram", "num_speculative_tokens": 3}
    assert a.spec_tokens == 3


def test_bad_cudagraph_mode_is_a_bare_keyerror_traceback():
    for argv in (["-cc", '{"cudagraph_mode": "BOGUS"}'], ["-cc.cudagraph_mode=bogus"],
                 ["--compilation-config.cudagraph_mode", "Bogus"]):
        with pytest.raises(ArgvError) as exc:
            parse_argv(["--model", "m", *argv])
        assert exc.value.text.startswith("Traceback (most recent call last):")
        assert exc.value.text.rstrip().endswith("KeyError: 'BOGUS'")
        assert exc.value.exit_code != 0


def test_bad_compilation_mode_json_and_values():
    with pytest.raises(ArgvError) as exc:
        parse_argv(["--model", "m", "-cc.mode=bogus"])
    assert "Invalid compilation mode: bogus" in exc.value.text and exc.value.exit_code == 2
    with pytest.raises(ArgvError) as exc:
        parse_argv(["--model", "m", "--compilation-config", "{not json"])
    assert "Invalid JSON" in exc.value.text
    with pytest.raises(ArgvError) as exc:
        parse_argv(["--model", "m", "--speculative-config", "{oops"])
    assert "invalid loads value" in exc.value.text
    with pytest.raises(ArgvError) as exc:
        parse_argv(["--model", "m", "--max-num-seqs", "many"])
    assert "invalid int value: 'many'" in exc.value.text
    with pytest.raises(ArgvError) as exc:
        parse_argv(["--model", "m", "--optimization-level", "O2"])
    assert "validation error" in exc.value.text
    with pytest.raises(ArgvError) as exc:
        parse_argv(["--model", "m", "--dtype", "fp7"])
    assert "invalid choice: 'fp7'" in exc.value.text
    with pytest.raises(ArgvError) as exc:
        parse_argv(["--model", "m", "-cc", '{"no_such_key": 1}'])
    assert "Extra inputs are not permitted" in exc.value.text


def test_unknown_flags_accepted_and_listed_in_non_default_args():
    a = parse_argv(["--model", "m", "--trust-remote-code", "--max-logprobs=30",
                    "--block-size", "32", "--no-enable-prefix-caching", "--port", "8000"])
    nd = non_default_args(a)
    assert nd == {"model": "m", "enable_prefix_caching": False, "trust_remote_code": True,
                  "max_logprobs": 30, "block_size": 32}   # port 8000 equals vLLM's default
    line = non_default_line(nd)
    assert line.startswith("non-default args: {'model': 'm'")


def test_non_default_compilation_config_shows_enum_reprs():
    a = parse_argv(["--model", "m", "-cc.cudagraph_mode=FULL_DECODE_ONLY"])
    line = non_default_line(non_default_args(a))
    assert "'cudagraph_mode': <CUDAGraphMode.FULL_DECODE_ONLY: (2, 0)>" in line


def test_duplicate_flags_warn_and_last_wins():
    a = parse_argv(["--model", "m", "--max-model-len", "4k", "--max-model-len", "2048"])
    assert a.max_model_len == 2048
    assert a.warnings == ("Found duplicate keys --max-model-len",)
