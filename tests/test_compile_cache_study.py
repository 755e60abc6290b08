"""execution.compile_cache_dir in a real `tuner run` on the simulator: every server the study
starts gets it as VLLM_CACHE_ROOT, the second trial with the same compile-relevant settings
loads what the first compiled, and each trial's outcome, user attributes and status say so.
The export does not carry the tuner's cache folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import load_trials, run_tuner, write_study
from tests.faultkit import FAST

pytestmark = pytest.mark.slow


def test_trials_share_the_study_compile_cache(tmp_path: Path, orphan_check: list[str]) -> None:
    cache = tmp_path / "compile-cache"
    updates = dict(FAST)
    updates.update({
        # NCCL_PROTO is not in vLLM's compile hash: the second point reuses the first's graphs.
        "parameters": [{"name": "nccl_proto", "env": "NCCL_PROTO", "kind": "categorical",
                        "values": [None, "LL"]}],
        "budget.n_trials": 2, "budget.trial_timeout": "60s",
        "execution.compile_cache_dir": str(cache),
    })
    path, marker = write_study(tmp_path, updates=updates)
    orphan_check.append(marker)
    results = tmp_path / "results"
    out = run_tuner("run", str(path), "--results", str(results))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    name = path.stem
    root = results / name
    records = {}
    for number in (0, 1):
        outcome = json.loads((root / "trials" / f"{number:04d}" / "outcome.json").read_text())
        assert outcome["status"] == "completed"
        records[number] = outcome["compile"]
        command = json.loads((root / "trials" / f"{number:04d}" / "command.json").read_text())
        assert command["env"].get("VLLM_CACHE_ROOT") == str(cache), command["env"]
    assert records[0]["cache"] == "miss" and records[1]["cache"] == "hit", records
    assert records[0]["cache_dir"].startswith(f"{cache}/torch_compile_cache/")
    assert records[1]["compile_s"] < 0.5 * records[0]["compile_s"]
    assert list((cache / "torch_compile_cache").iterdir())          # written where the study said
    # The storage has it too (a user attribute, through the outcome).
    trials = load_trials(results, name)
    assert [t.user_attrs["outcome"]["compile"]["cache"] for t in sorted(trials, key=lambda t: t.number)
            if t.user_attrs.get("kind") == "run"] == ["miss", "hit"]
    status = run_tuner("status", name, "--results", str(results))
    assert "torch.compile cache miss" in status.stdout and "torch.compile cache hit" in status.stdout, status.stdout
    exported = run_tuner("export", name, "--results", str(results), "--trial", "1", "--format", "json")
    assert exported.returncode == 0, exported.stderr
    assert "VLLM_CACHE_ROOT" not in json.loads(exported.stdout)["env"]
