"""Multi-rank servers read from their logs (issue 41): the ranks, the all-reduce that ran and
the knobs that cannot act there, on the real three-rank CPU log (cpu-0.32.0/tp3-eager.log,
see the fixture README) and on the GPU logs with rank-prefixed lines."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tuner.vllm.effective_config import EffectiveConfig, parse_effective_config, text_lines
from tuner.vllm.log_digest import LogDigest
from tuner.vllm.parallel import parallel_lines
from tuner.vllm.verify import startup_mismatches, verify

LOGS = Path(__file__).parent / "fixtures" / "vllm_logs"
TP3 = LOGS / "cpu-0.32.0" / "tp3-eager.log"
# What the study's starting point asks (search_spaces/smollm2-cpu-tp.yaml), as rendered.
ASKED = {"tensor_parallel_size": 3, "distributed_executor_backend": "mp", "enforce_eager": True,
         "disable_custom_all_reduce": True, "env:NCCL_PROTO": "LL", "env:NCCL_ALGO": "Ring"}


def tp3_text() -> str:
    return TP3.read_text(encoding="utf-8")


def test_the_three_rank_cpu_log_shows_every_rank_and_the_gloo_all_reduce() -> None:
    eff = parse_effective_config(tp3_text())
    assert (eff.tensor_parallel_size, eff.world_size, eff.distributed_backend) == (3, 3, "gloo")
    assert eff.platform == "cpu"
    assert [r["rank"] for r in eff.ranks or []] == [0, 1, 2]
    assert [r["tp_rank"] for r in eff.ranks or []] == [0, 1, 2]
    assert {r["world_size"] for r in eff.ranks or []} == {3}
    # one worker process per rank, each under its own rank-prefixed tag
    assert [r["process"] for r in eff.ranks or []] == ["Worker_TP0", "Worker_TP1", "Worker_TP2"]
    assert len({r["pid"] for r in eff.ranks or []}) == 3
    # On this box every rank fell back from vLLM's shared-memory all-reduce to gloo, and said so.
    assert eff.allreduce == ["GLOO"]
    assert "CPU SHM communicator disabled for group tp:0" in eff.evidence["allreduce"]
    # NCCL_DEBUG=INFO was set, yet NCCL never printed a line: it never ran
    assert eff.nccl_debug_seen is None and eff.nccl_env is None


def test_the_ranks_verify_and_the_nccl_knobs_are_not_applicable_here() -> None:
    result = verify(ASKED, parse_effective_config(tp3_text()))
    checks = {c.target: c for c in result.checks}
    tp = checks["tensor_parallel_size"]
    assert (tp.status, tp.got) == ("applied", 3), tp
    assert tp.note is not None and tp.note.startswith("world size 3: TP rank 0 (Worker_TP0 pid ")
    assert "TP rank 2 (Worker_TP2 pid " in tp.note
    for target in ("env:NCCL_PROTO", "env:NCCL_ALGO", "disable_custom_all_reduce"):
        check = checks[target]
        assert check.status == "not_applicable", check
        assert check.note is not None and check.note.startswith("not applicable here"), check
        assert check.note.endswith("GLOO"), check.note
        assert check.evidence, "a knob that cannot act must cite the line that shows it"
    assert "backend=gloo" in (checks["env:NCCL_PROTO"].evidence or "")
    assert "disable_custom_all_reduce=True" in (checks["disable_custom_all_reduce"].evidence or "")
    assert result.applied is True and result.mismatches() == []
    parallel = result.parallel or {}
    assert (parallel["world_size"], parallel["allreduce"]) == (3, ["GLOO"])
    assert parallel["not_applicable"] == ["disable_custom_all_reduce", "env:NCCL_PROTO", "env:NCCL_ALGO"]
    # what tuner status prints under the trial
    lines = parallel_lines(json.loads(result.model_dump_json())["parallel"],
                           [c.model_dump(mode="json") for c in result.checks])
    assert lines[0].startswith("ranks: world size 3: TP rank 0 (Worker_TP0 pid ")
    assert lines[0].endswith("; all-reduce: GLOO")
    shown = [line for line in lines if line.startswith("not applicable here: ")]
    assert [line.split("=")[0] for line in shown] == [
        "not applicable here: disable_custom_all_reduce", "not applicable here: env:NCCL_PROTO",
        "not applicable here: env:NCCL_ALGO"]


def test_a_wrong_tensor_parallel_size_or_world_size_is_not_applied() -> None:
    eff = parse_effective_config(tp3_text())
    one = verify({"tensor_parallel_size": 1}, eff).checks[0]
    assert (one.status, one.got) == ("not_applied", 3)
    # Suppose rank 1 had joined a world of two: the ranks disagree with what was asked.
    tampered = re.sub(r"world_size=3 rank=1 ", "world_size=2 rank=1 ", tp3_text())
    check = verify({"tensor_parallel_size": 3}, parse_effective_config(tampered)).checks[0]
    assert check.status == "not_applied", check
    assert check.note is not None and "world size [2, 3], not 3" in check.note
    assert check.evidence


def test_a_rank_that_logged_nothing_is_named() -> None:
    kept = [line for line in text_lines(tp3_text()) if "pid=15257)" not in line]   # rank 2's process
    eff = parse_effective_config("\n".join(kept))
    assert [r["rank"] for r in eff.ranks or []] == [0, 1]
    check = verify({"tensor_parallel_size": 3}, eff).checks[0]
    assert check.status == "applied"
    assert check.note is not None and "TP ranks [2] logged no rank line" in check.note


def test_without_the_fallback_line_the_shared_memory_all_reduce_ran() -> None:
    kept = [line for line in text_lines(tp3_text()) if "CPU SHM communicator disabled" not in line]
    eff = parse_effective_config("\n".join(kept))
    assert eff.allreduce == ["CPU_SHM"]
    assert "rank 0 in world size 3 is assigned as" in eff.evidence["allreduce"]
    # ... but not before the ranks were assigned (the communicators are built by then).
    early = [line for line in kept if " is assigned as " not in line]
    assert parse_effective_config("\n".join(early)).allreduce is None


def test_read_a_line_at_a_time_the_ranks_come_out_the_same() -> None:
    digest = LogDigest()
    for number, line in enumerate(text_lines(tp3_text())):
        digest.feed(line)
        # Early stop while starting checks every partial log (a rank's TP rank unknown yet).
        if number % 5 == 0:
            assert startup_mismatches(ASKED, digest.effective()) == []
            verify(ASKED, digest.effective())
    assert digest.effective() == parse_effective_config(tp3_text())


@pytest.mark.parametrize(("name", "world", "allreduce"), [
    ("handwritten/tp2-nvlink-allreduce.log", 2, ["FLASHINFER", "CUSTOM", "SYMM_MEM", "PYNCCL"]),
    ("handwritten/tp4-pcie-nccl-debug.log", 4, ["PYNCCL"]),
    ("h200-0.26.0/eager.log", 1, []),
    ("cpu-0.32.0/eager.log", 1, []),
])
def test_the_all_reduce_of_the_gpu_and_single_rank_logs(name: str, world: int | None,
                                                         allreduce: list[str]) -> None:
    eff: EffectiveConfig = parse_effective_config((LOGS / name).read_text(encoding="utf-8"))
    assert (eff.world_size, eff.allreduce) == (world, allreduce)
    assert eff.evidence["allreduce"]


def test_the_gpu_knobs_still_verify_on_the_rank_prefixed_gpu_logs() -> None:
    tp4 = parse_effective_config((LOGS / "handwritten/tp4-pcie-nccl-debug.log").read_text(encoding="utf-8"))
    result = verify({"tensor_parallel_size": 4, "env:NCCL_PROTO": "LL", "env:NCCL_ALGO": "Ring",
                     "disable_custom_all_reduce": False}, tp4)
    status = {c.target: c.status for c in result.checks}
    assert status == {"tensor_parallel_size": "applied", "env:NCCL_PROTO": "applied",
                      "env:NCCL_ALGO": "applied", "disable_custom_all_reduce": "not_applied"}
    assert result.parallel is not None and result.parallel["not_applicable"] == []
    assert parallel_lines(result.parallel, [])[0] == (
        "ranks: world size 4: TP rank 0 (Worker_TP0 pid 301), TP rank 1 (Worker_TP1 pid 302), "
        "TP rank 2 (Worker_TP2 pid 303), TP rank 3 (Worker_TP3 pid 304); all-reduce: PYNCCL")


def test_status_lists_the_ranks_the_all_reduce_and_the_knobs_that_cannot_act(tmp_path: Path) -> None:
    from tests.test_status_format import _status
    from tuner.adapters.artifacts import StudyPaths
    from tuner.study.trials import TrialRecord
    from tuner.views.status import _trial_row, format_status

    paths = StudyPaths(tmp_path / "s")
    paths.trial_dir(1).mkdir(parents=True)
    result = verify(ASKED, parse_effective_config(tp3_text()))
    (paths.trial_dir(1) / "verification.json").write_text(result.model_dump_json())
    record = TrialRecord(number=1, state="COMPLETE", kind="run", params={"nccl_proto": "LL"},
                         values={"output_tok_s@cmax": 40.0}, attrs={"outcome": {"applied": True}})
    row = _trial_row(record, paths)
    assert row["parallel"]["allreduce"] == ["GLOO"]
    json.dumps(row)     # --json prints the same row
    text = format_status(_status([row])).splitlines()
    asked_vs_got = next(line for line in text if "asked vs got:" in line)
    assert "tensor_parallel_size=3" in asked_vs_got and "NCCL" not in asked_vs_got, asked_vs_got
    assert any(line.startswith("        ranks: world size 3: TP rank 0 (Worker_TP0 pid ")
               and line.endswith("all-reduce: GLOO") for line in text), text
    shown = [line.strip() for line in text if "not applicable here: " in line and "evidence" not in line]
    assert [line.split("=")[0] for line in shown] == [
        "not applicable here: disable_custom_all_reduce", "not applicable here: env:NCCL_PROTO",
        "not applicable here: env:NCCL_ALGO"], text
    assert "not applicable here: env:NCCL_PROTO='LL'" in shown[1]
