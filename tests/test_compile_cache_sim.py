"""The compile cache end to end: real simulator starts sharing a temporary VLLM_CACHE_ROOT
(a miss compiles and writes the entry, the next start with the same compile-relevant
settings logs vLLM's hit lines and starts sooner), the worker recording it per trial, and
the simulated-study time model (tuner.sim.study with compile_cache)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import write_study
from tests.sim_process import Sim
from tuner.vllm.log_digest import read_log


def _env(tmp_path: Path) -> dict[str, str]:
    # Always a temporary cache root, and an XDG cache dir that must stay empty.
    return {"VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"), "XDG_CACHE_HOME": str(tmp_path / "xdg")}


def _start(tmp_path: Path, *argv: str, **env: str) -> str:
    sim = Sim(tmp_path, ["--model", "/models/smol", *argv], {**_env(tmp_path), **env})
    try:
        sim.wait_ready(timeout=60)
        return sim.log()
    finally:
        sim.kill()


def test_second_start_loads_what_the_first_compiled(tmp_path: Path) -> None:
    root = tmp_path / "vllm-cache"
    first = _start(tmp_path)
    one = read_log(first).compile_record()
    assert one.cache == "miss", first[-2000:]
    assert "Compiling a graph for compile range (1, " in first
    assert f"saved AOT compiled function to {root}/torch_compile_cache/torch_aot_compile/" in first
    assert one.cache_dir.startswith(f"{root}/torch_compile_cache/") and one.cache_dir.endswith(
        "/rank_0_0/backbone")
    entries = list((root / "torch_compile_cache" / "torch_aot_compile").glob("*/rank_0_0/model"))
    assert len(entries) == 1 and not list(entries[0].parent.glob("*.tmp"))

    second = _start(tmp_path, "--seed", "7")          # seed is outside vLLM's key
    two = read_log(second).compile_record()
    assert two.cache == "hit", second[-2000:]
    assert "Directly load the compiled graph(s) for compile range (1, " in second
    assert f"Directly load AOT compilation from path {entries[0]}" in second
    assert "Compiling a graph" not in second and "saved AOT compiled function" not in second
    assert two.cache_dir == one.cache_dir
    # Simulated seconds, as vLLM reports them: loading instead of compiling.
    assert two.compile_s < 0.5 * one.compile_s
    assert two.init_engine_s < one.init_engine_s - 0.5 * one.compile_s

    third = _start(tmp_path, "--max-num-batched-tokens", "2048")   # the compile range changes
    assert read_log(third).compile_record().cache == "miss"
    assert len(list((root / "torch_compile_cache" / "torch_aot_compile").iterdir())) == 2
    assert not (tmp_path / "xdg").exists()


def test_cache_off_and_eager_write_nothing(tmp_path: Path) -> None:
    root = tmp_path / "vllm-cache"
    log = _start(tmp_path, TUNER_SIM_COMPILE_CACHE="0")
    assert read_log(log).compile_record().cache == "miss" and not root.exists()
    log = _start(tmp_path, "--enforce-eager")
    assert read_log(log).compile_record().cache == "none" and not root.exists()


def test_default_root_is_the_simulators_own(tmp_path: Path) -> None:
    from tuner.sim.cache import default_root

    assert default_root({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "tuner-sim" / "vllm"
    assert default_root({"VLLM_CACHE_ROOT": str(tmp_path / "r")}) == tmp_path / "r"
    home = default_root({})
    assert home.parts[-2:] == ("tuner-sim", "vllm") and ".cache/vllm" not in str(home.parent)


def test_dry_log_never_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.sim.dry_log import startup_log
    from tuner.sim.profile import load_profile

    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "r"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    log = startup_log(["--model", "/m", "-tp", "8"], {}, load_profile("glm5-8xpcie"))
    assert read_log(log).compile_record().cache == "miss"
    assert not any(tmp_path.iterdir())


# -------------------------------------------------------------------------------- the worker


def _request(tmp_path: Path, number: int) -> Any:
    from tuner.commands.run import load_spec_file
    from tuner.study.outcome import TrialRequest
    from tuner.study.space import trial_command

    study, _ = write_study(tmp_path, env={"TUNER_SIM_STARTUP_SCALE": 0.02, **_env(tmp_path)},
                           updates={"server.startup_timeout": "120s"})
    spec = load_spec_file(str(study))
    values = {"enforce_eager": False, "cudagraph_mode": "FULL_AND_PIECEWISE", "nccl_proto": None,
              "spec_method": None}
    command = trial_command(spec, values, port=spec.server.port)
    return TrialRequest(
        study=study.stem, number=number, values=values,
        asked=command.asked, argv=command.argv, env=command.launch_env,
        host=spec.server.host, port=spec.server.port, served_model_name=spec.server.served_model_name,
        trial_dir=str(tmp_path / f"trial-{number}"), startup_timeout_s=120, stop_timeout_s=10, deadline_s=300,
        load=spec.load.model_dump(mode="json"), probe=spec.probe.model_dump(mode="json"), ignore_eos=True)


def test_the_worker_records_the_compile_cache_per_trial(tmp_path: Path) -> None:
    from tuner.engine.worker import TrialWorker
    from tuner.study.outcome import TrialOutcome

    async def start_stop(request: Any, trial_dir: Path) -> None:
        worker = TrialWorker()
        outcome = TrialOutcome(number=request.number, status="failed")
        try:
            await worker._start(request, trial_dir, None, outcome)
        finally:
            await worker._stop(request, outcome)

    def trial(number: int) -> dict[str, Any]:
        """One start and stop; the trial's compile_cache.json. The folder is made and the file
        read outside the event loop."""
        request = _request(tmp_path, number)
        trial_dir = Path(request.trial_dir)
        trial_dir.mkdir(parents=True)
        asyncio.run(start_stop(request, trial_dir))
        return json.loads((trial_dir / "compile_cache.json").read_text())

    first = trial(1)
    second = trial(2)
    assert first["cache"] == "miss" and first["aot"] == "saved" and first["compile_s"] == 140.0
    assert second["cache"] == "hit" and second["aot"] == "loaded"
    assert second["cache_dir"] == first["cache_dir"]
    assert str(tmp_path / "vllm-cache") in first["cache_dir"]
    assert second["compile_s"] < 30 and second["init_engine_s"] < first["init_engine_s"] - 100
    assert first["graph_capture_s"] is not None and second["graph_capture_s"] is not None


def test_records_read_the_compile_record_or_say_unknown() -> None:
    from tuner.study.trials import TrialRecord

    old = TrialRecord(0, "COMPLETE", "run", {}, attrs={"outcome": {"startup_s": 400.0}})
    assert old.compile_record is None and old.compile_cache is None
    rec = {"cache": "hit", "compile_s": 23.0}
    assert TrialRecord(1, "COMPLETE", "run", {}, attrs={"compile": rec}).compile_cache == "hit"
    read = TrialRecord(2, "COMPLETE", "run", {}, attrs={"outcome": {"compile": rec}}).compile_record
    assert read is not None and (read.cache, read.compile_s, read.load_s) == ("hit", 23.0, None)


# ----------------------------------------------------------------------- the study time model


@pytest.fixture(scope="module")
def small():
    from tests.sim_studies import SMALL_STUDY, build_ground_truth
    from tuner.sim.profile import load_profile
    from tuner.study.study_file import parse_study

    spec = parse_study(SMALL_STUDY, "small")
    return spec, build_ground_truth(spec, load_profile("glm5-8xpcie"))


def _rand(spec: Any, seed: int) -> Any:
    import optuna

    return optuna.samplers.RandomSampler(seed=seed)


def test_truth_carries_the_compile_key(small) -> None:
    spec, truth = small
    compiled = [p for p in truth.points if p.compile_key]
    eager = [p for p in truth.points if p.values.get("enforce_eager")]
    assert compiled and all(p.compile_key is None and p.hit_saving_s == 0 for p in eager if not p.failed)
    p = compiled[0]
    assert p.compile_s == 140.0 and p.compile_hit_s == pytest.approx(23.0)
    assert p.hit_saving_s == pytest.approx(117.0) and 0 < p.compile_at_s < p.startup_s
    # NCCL knobs are outside vLLM's key: points differing only there share it.
    by_key: dict[str, set[str]] = {}
    for q in compiled:
        by_key.setdefault(q.compile_key, set()).add(str(q.values.get("nccl_proto")))
    assert any(len(v) > 1 for v in by_key.values())


def test_a_repeated_compile_key_starts_sooner(small) -> None:
    from tuner.sim.study import run_study

    spec, truth = small
    off = run_study(spec, truth, _rand, n_trials=15, seed=3)
    on = run_study(spec, truth, _rand, n_trials=15, seed=3, compile_cache=True)
    assert [t.key for t in on.trials] == [t.key for t in off.trials]      # same proposals
    assert off.compile_hits == 0 and all(t.compile is None for t in off.trials)
    seen: set[str] = set()
    for a, b in zip(on.trials, off.trials):
        p = truth.get(a.values)
        if p.compile_key and p.compile_key in seen:
            assert a.compile == "hit" and a.seconds == pytest.approx(b.seconds - p.hit_saving_s)
        else:
            assert a.compile in (None, "miss") and a.seconds == pytest.approx(b.seconds)
        if a.compile == "miss":
            seen.add(p.compile_key)
    assert on.compile_hits > 0
    assert on.total_seconds == pytest.approx(off.total_seconds - on.compile_saved_seconds)


def test_parallel_trials_only_hit_what_finished_compiling_before_they_started(small) -> None:
    from tuner.sim.study import run_study

    spec, truth = small
    run = run_study(spec, truth, _rand, n_trials=16, seed=5, workers=4, compile_cache=True)
    written: dict[str, float] = {}
    for t in sorted(run.trials, key=lambda t: t.started_s):
        p = truth.get(t.values)
        if t.compile == "hit":
            assert written[p.compile_key] <= t.started_s
        elif t.compile == "miss":
            assert p.compile_key not in written or written[p.compile_key] > t.started_s
            written[p.compile_key] = min(written.get(p.compile_key, 1e18), t.started_s + p.compile_at_s)
