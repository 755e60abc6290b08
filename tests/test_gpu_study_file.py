"""The H200 study file's shape passes `tuner validate` (python3 -m vllm.entrypoints.openai.
api_server, one GPU per trial, the box's environment), and the safety guard refuses any
parameter or fixed variable that would turn NVLink multicast on."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.conftest import run_tuner
from tuner.errors import SpecError
from tuner.study.study_file import parse_study
from tuner.vllm.multicast import multicast_use

H200_STUDY = textwrap.dedent("""
    name: smollm2-h200
    server:
      command: [python3, -m, vllm.entrypoints.openai.api_server]
      model: /models/smollm2-135m-instruct
      served_model_name: smol
      gpus_per_trial: 1
      startup_timeout: 10m
      flags: {max_model_len: 4096, gpu_memory_utilization: 0.5}
      env:
        VLLM_USE_FLASHINFER_SAMPLER: 0
        NCCL_NVLS_ENABLE: 0
        TORCH_SYMM_MEM_DISABLE_MULTICAST: 1
        NVSHMEM_DISABLE_NVLS: 1
        HF_HUB_OFFLINE: 1
    execution: {gpu_free_timeout: 2m}
    budget: {n_trials: 10}
    parameters:
      - {name: enforce_eager, flag: enforce_eager, kind: bool, default: false}
      - name: cudagraph_mode
        flag: compilation_config.cudagraph_mode
        kind: categorical
        values: [NONE, PIECEWISE, FULL, FULL_DECODE_ONLY, FULL_AND_PIECEWISE]
        default: FULL_AND_PIECEWISE
        when: {enforce_eager: false}
      - {name: spec_method, flag: speculative_config.method, kind: categorical, values: [null, ngram]}
      - {name: spec_k, flag: speculative_config.num_speculative_tokens, kind: int, low: 2, high: 6,
         when: {spec_method: ngram}}
""")


def test_tuner_validate_accepts_the_h200_study(tmp_path: Path) -> None:
    path = tmp_path / "smollm2-h200.yaml"
    path.write_text(H200_STUDY)
    result = run_tuner("validate", str(path), timeout=120)
    assert result.returncode == 0, result.stderr
    assert "valid study 'smollm2-h200'" in result.stdout
    assert "(1 GPUs per trial" in result.stdout
    # The fixed environment reaches every server's command, with the values the box needs.
    assert ("VLLM_USE_FLASHINFER_SAMPLER=0 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 "
            "NVSHMEM_DISABLE_NVLS=1 HF_HUB_OFFLINE=1 python3 -m vllm.entrypoints.openai.api_server") in result.stdout
    assert parse_study(H200_STUDY).execution.gpu_free_timeout == 120.0


@pytest.mark.parametrize(("edit", "named"), [
    (("NCCL_NVLS_ENABLE: 0", "NCCL_NVLS_ENABLE: 1"), "server.env.NCCL_NVLS_ENABLE"),
    (("TORCH_SYMM_MEM_DISABLE_MULTICAST: 1", "TORCH_SYMM_MEM_DISABLE_MULTICAST: 0"),
     "server.env.TORCH_SYMM_MEM_DISABLE_MULTICAST"),
    (("NVSHMEM_DISABLE_NVLS: 1", "NVSHMEM_DISABLE_NVLS: false"), "server.env.NVSHMEM_DISABLE_NVLS"),
    (("HF_HUB_OFFLINE: 1", "HF_HUB_OFFLINE: 1\n    NCCL_ALGO: Ring,NVLS"), "server.env.NCCL_ALGO"),
    (("budget: {n_trials: 10}", "budget: {n_trials: 10}\nsafety: {allow_multicast: false}"), None),
])
def test_a_study_that_turns_multicast_on_is_refused(edit: tuple[str, str], named: str | None) -> None:
    text = H200_STUDY.replace(*edit)
    if named is None:
        parse_study(text)   # an unrelated variable: accepted
        return
    with pytest.raises(SpecError) as info:
        parse_study(text)
    assert named in str(info.value) and "multicast" in str(info.value)
    allowed = text.replace("budget: {n_trials: 10}", "budget: {n_trials: 10}\nsafety: {allow_multicast: true}")
    parse_study(allowed)


def test_a_searched_multicast_value_is_refused() -> None:
    searched = H200_STUDY.replace("    NCCL_NVLS_ENABLE: 0\n", "") + (
        "  - {name: nvls, env: NCCL_NVLS_ENABLE, kind: categorical, values: [null, 0, 1]}\n")
    with pytest.raises(SpecError) as info:
        parse_study(searched)
    assert "parameter 'nvls': value 1: NCCL_NVLS_ENABLE=1 enables" in str(info.value)
    parse_study(searched.replace("values: [null, 0, 1]", "values: [null, 0]"))


@pytest.mark.parametrize(("target", "value", "on"), [
    ("env:NCCL_ALGO", "Ring,Tree", False), ("env:NCCL_ALGO", "NVLS", True), ("env:NCCL_ALGO", "nvlstree", True),
    ("env:NCCL_ALGO", "^NVLS,NVLSTree", False), ("env:NCCL_ALGO", "ring,tree;allreduce:NVLS", True),
    ("env:NCCL_ALGO", "ring;allreduce:^nvls", False),
    ("env:NCCL_NVLS_ENABLE", 0, False), ("env:NCCL_NVLS_ENABLE", "1", True), ("env:NCCL_NVLS_ENABLE", True, True),
    ("env:TORCH_SYMM_MEM_DISABLE_MULTICAST", 1, False), ("env:TORCH_SYMM_MEM_DISABLE_MULTICAST", "0", True),
    ("env:NVSHMEM_DISABLE_NVLS", "1", False), ("env:NVSHMEM_DISABLE_NVLS", False, True),
    ("env:VLLM_FLASHINFER_ALLREDUCE_BACKEND", "trtllm", False),
    ("env:VLLM_FLASHINFER_ALLREDUCE_BACKEND", "mnnvl", True),
    ("env:VLLM_USE_NCCL_SYMM_MEM", 1, True), ("env:VLLM_USE_NCCL_SYMM_MEM", "0", False),
    ("env:NCCL_NVLS_ENABLE", None, False), ("env:NCCL_PROTO", "LL", False),
    ("compilation_config.cudagraph_mode", "FULL", False),
])
def test_which_settings_turn_multicast_on(target: str, value: object, on: bool) -> None:
    assert (multicast_use(target, value) is not None) is on


def test_a_searched_integer_switch_is_checked_without_building_its_range() -> None:
    base = H200_STUDY.replace("    NCCL_NVLS_ENABLE: 0\n", "").replace("    TORCH_SYMM_MEM_DISABLE_MULTICAST: 1\n", "")
    with pytest.raises(SpecError, match="value 1: NCCL_NVLS_ENABLE=1 enables"):
        parse_study(base + "  - {name: nvls, env: NCCL_NVLS_ENABLE, kind: int, low: 0, high: 1000000000000}\n"
                    "safety: {bounds: {parameter_values: 10000000000000}}\n")
    with pytest.raises(SpecError, match="TORCH_SYMM_MEM_DISABLE_MULTICAST=0 re-enables"):
        parse_study(base + "  - {name: mc, env: TORCH_SYMM_MEM_DISABLE_MULTICAST, kind: int, low: 0, high: 1}\n")
    parse_study(base + "  - {name: nvls, env: NCCL_NVLS_ENABLE, kind: int, low: 0, high: 0, default: 0}\n")
