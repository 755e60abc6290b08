"""Input a careless or hostile user can give the tuner: study files (size, depth, aliases,
duplicate keys, encodings, non-finite numbers, sizes), study names, and the command line.

Every case must end in a one-line error (or a valid study), never a traceback, and never
cost more than a bounded amount of memory (issue 16, defects 3, 5, 6, 7 and 10).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, copy_cpu_example, write_study
from tuner.commands.main import main as tuner_main

DEMO = yaml.safe_load((ROOT / "search_spaces" / "demo.yaml").read_text())

# What one `tuner validate` of a hostile file may use at most (its own peak RSS): a normal
# validate needs about 120 MB (pydantic, the catalog); the anchor bomb used 5.8 GB.
VALIDATE_RSS_LIMIT_MB = 400

# Runs `tuner validate FILE` in this interpreter with a hard address-space cap (so a bomb
# fails fast instead of taking the machine's memory), then prints the peak RSS.
_MEASURED = textwrap.dedent("""
    import contextlib, io, json, resource, sys
    from tests.peak_memory import own_peak_rss_kb
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
    from tuner.commands.main import main
    err = io.StringIO()
    out = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = main(["validate", sys.argv[1]])
    except BaseException as exc:
        import traceback
        code = "exception"
        err.write("Traceback (most recent call last):\\n" + repr(exc))
    print(json.dumps({"code": code, "stderr": err.getvalue(),
                      "rss_mb": own_peak_rss_kb() / 1024}))
""")


def validate_measured(path: Path, timeout: float = 120) -> dict:
    run = subprocess.run([sys.executable, "-c", _MEASURED, str(path)], cwd=ROOT, capture_output=True,
                         text=True, timeout=timeout)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def assert_one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = [l for l in stderr.strip().splitlines() if l.strip()]
    assert len(lines) == 1, stderr[-3000:]
    assert len(lines[0]) < 600, lines[0][:1000]
    return lines[0]


def run_tuner(*args: str, timeout: float = 0) -> subprocess.CompletedProcess[str]:
    """`tuner ARGS` in this process (a fresh interpreter per case costs seconds on a busy
    machine); what it printed, as a subprocess would return it."""

    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = tuner_main(list(args))
        except SystemExit as exc:   # argparse
            code = int(exc.code or 0)
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def write(tmp_path: Path, text: str | bytes, name: str = "study.yaml") -> Path:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def demo_with(**sections: object) -> str:
    data = json.loads(json.dumps(DEMO))
    for dotted, value in sections.items():
        node = data
        *parents, leaf = dotted.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return yaml.safe_dump(data, sort_keys=False)


# -- defect 5: a bounded document -----------------------------------------------------

def _bomb(kind: str) -> str:
    """~3 KB of anchors that expand to 10^9 leaves under server.flags."""

    lines = ["a0: &a0 [" + ", ".join(["lol"] * 10) + "]"]
    for i in range(1, 10):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    anchors = "\n".join("  " + l for l in lines)
    if kind == "mapping":
        flags = f"  flags:\n    tensor_parallel_size: 8\n    bomb:\n{textwrap.indent(anchors, '      ')}\n"
    else:
        flags = "  flags:\n    tensor_parallel_size: 8\n    bomb: *a9\n"
    body = demo_with().replace("  flags:\n    tensor_parallel_size: 8\n", flags, 1)
    if kind != "mapping":
        body = "anchors:\n" + anchors + "\n" + body
    return body


@pytest.mark.parametrize("kind", ["mapping", "list"])
def test_anchor_bomb_is_refused_in_bounded_memory(tmp_path: Path, kind: str) -> None:
    text = _bomb(kind)
    assert len(text) < 6000
    result = validate_measured(write(tmp_path, text))
    assert result["code"] == 2, result
    line = assert_one_line(result["stderr"])
    assert "expands to more than" in line, line
    assert result["rss_mb"] < VALIDATE_RSS_LIMIT_MB, result


def test_recursive_alias_and_deep_nesting_are_one_line_errors(tmp_path: Path) -> None:
    deep = write(tmp_path, "name: x\nserver: " + "[" * 5000 + "]" * 5000 + "\n", "deep.yaml")
    recursive = write(tmp_path, demo_with() + "extra: &r [*r]\n", "rec.yaml")
    for path, words in ((deep, "nested deeper than"), (recursive, "refers to a node that contains it")):
        result = validate_measured(path)
        assert result["code"] == 2, result
        assert words in assert_one_line(result["stderr"])


def test_duplicate_keys_are_refused(tmp_path: Path) -> None:
    text = demo_with().replace("budget:\n", "budget:\n  n_trials: 3\n", 1)
    assert text.count("n_trials") == 2
    run = run_tuner("validate", str(write(tmp_path, text)))
    assert run.returncode == 2, run.stdout + run.stderr
    assert "'n_trials' is given twice" in assert_one_line(run.stderr)


def test_oversized_file_is_refused_before_parsing(tmp_path: Path) -> None:
    text = demo_with() + "description: |\n" + ("  " + "x" * 1000 + "\n") * 2000
    run = run_tuner("validate", str(write(tmp_path, text)))
    assert run.returncode == 2
    assert "at most" in assert_one_line(run.stderr)


@pytest.mark.parametrize("content, words", [
    (b"name: x\n\xff\xfe bad\n", "not UTF-8"),
    (bytes(range(256)) * 4, "not UTF-8"),
    (b"name: x\x00y\n", "unacceptable character"),
    (b"\x7fELF\x02\x01\x01\x00" + b"\x00" * 100, "unacceptable character"),
    (b"[1, 2", "not valid YAML"),
])
def test_binary_and_invalid_text_are_one_line_errors(tmp_path: Path, content: bytes, words: str) -> None:
    run = run_tuner("validate", str(write(tmp_path, content)))
    assert run.returncode == 2, run.stderr
    assert words in assert_one_line(run.stderr)


# -- defect 6: upper bounds ----------------------------------------------------------

@pytest.mark.parametrize("section, value, field", [
    ("load__concurrency", [1, 1000000], "load.concurrency[1]"),
    ("budget__n_trials", 10**30, "budget.n_trials"),
    ("load__requests_per_stream", 1000000000, "load.requests_per_stream"),
    ("server__gpus_per_trial", 100000, "server.gpus_per_trial"),
    ("server__stop_timeout", "100000h", "server.stop_timeout"),
])
def test_sizes_have_upper_bounds(tmp_path: Path, section: str, value: object, field: str) -> None:
    run = run_tuner("validate", str(write(tmp_path, demo_with(**{section: value}))))
    assert run.returncode == 2, run.stdout[-2000:] + run.stderr
    line = assert_one_line(run.stderr)
    assert field in line and "upper bound" in line and "safety.bounds" in line, line


def test_a_bound_can_be_raised_in_the_study(tmp_path: Path) -> None:
    text = demo_with(load__concurrency=[1, 5000], safety={"bounds": {"load.concurrency": 8192}})
    run = run_tuner("validate", str(write(tmp_path, text)))
    assert run.returncode == 0, run.stderr
    unknown = demo_with(safety={"bounds": {"load.concurency": 8192}})
    run = run_tuner("validate", str(write(tmp_path, unknown, "u.yaml")))
    assert run.returncode == 2
    assert "load.concurency" in assert_one_line(run.stderr)


def test_a_huge_integer_range_is_checked_without_building_it(tmp_path: Path) -> None:
    data = json.loads(json.dumps(DEMO))
    data["parameters"].append({"name": "mbt", "flag": "max_num_batched_tokens", "kind": "int",
                               "low": 1, "high": 10**12, "default": 2048})
    data["safety"] = {"bounds": {"parameter_values": 10**13}}
    result = validate_measured(write(tmp_path, yaml.safe_dump(data, sort_keys=False)))
    assert result["rss_mb"] < VALIDATE_RSS_LIMIT_MB, result
    assert result["code"] in (0, 2), result
    data["safety"] = {}
    result = validate_measured(write(tmp_path, yaml.safe_dump(data, sort_keys=False), "b.yaml"))
    assert result["code"] == 2 and "parameter_values" in assert_one_line(result["stderr"]), result


# -- defect 7: non-finite numbers ------------------------------------------------------

@pytest.mark.parametrize("text_change", [
    ("limits: []", "limits:\n  - {metric: ttft_ms.p90, concurrency: 1, max: .nan}"),
    ("limits: []", "limits:\n  - {metric: ttft_ms.p90, concurrency: 1, max: 'nan'}"),
    ("  trial_timeout: 3m", "  trial_timeout: 3m\n  timeout: .inf"),
    ("  trial_timeout: 3m", "  trial_timeout: 3m\n  timeout: inf"),
    ("  trial_timeout: 3m", "  trial_timeout: 3m\n  timeout: 1e999"),
])
def test_non_finite_numbers_are_refused(tmp_path: Path, text_change: tuple[str, str]) -> None:
    text = (ROOT / "search_spaces" / "demo.yaml").read_text()
    if text_change[0] == "limits: []":
        text = text.replace("objectives:", text_change[1] + "\nobjectives:", 1)
    else:
        text = text.replace(text_change[0], text_change[1], 1)
    run = run_tuner("validate", str(write(tmp_path, text)))
    assert run.returncode == 2, run.stdout[-1500:] + run.stderr
    line = assert_one_line(run.stderr)
    assert "finite" in line, line


def test_status_of_a_saved_infinite_timeout_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    root = copy_cpu_example(tmp_path)
    study = root / "smollm2-cpu"
    spec = yaml.safe_load((study / "spec.yaml").read_text())
    spec["budget"]["timeout"] = float("inf")
    (study / "spec.yaml").write_text(yaml.safe_dump(spec))
    run = run_tuner("status", "smollm2-cpu", "--results", str(root))
    assert run.returncode in (2, 3), run.stdout[-1500:] + run.stderr
    assert "finite" in assert_one_line(run.stderr)


# -- defect 3: study names -------------------------------------------------------------

@pytest.mark.parametrize("name", ["../escaped", "/tmp/abs-study", "a\nb ExecStartPre=/bin/true", "x" * 300,
                                  "", ".hidden", "a b"])
def test_study_option_is_validated_before_anything_is_written(tmp_path: Path, name: str) -> None:
    results = tmp_path / "deep" / "results"
    study, _ = write_study(tmp_path)
    run = run_tuner("run", str(study), "--study", name, "--results", str(results), "--n-trials", "1",
                    timeout=180)
    assert run.returncode == 2, run.stdout[-2000:] + run.stderr[-2000:]
    assert "study name" in assert_one_line(run.stderr)
    assert not results.exists(), list(results.rglob("*"))
    assert not (tmp_path / "deep" / "escaped").exists()
    assert not Path("/tmp/abs-study").exists()


@pytest.mark.parametrize("command", ["status", "resume", "report", "export", "confirm"])
def test_positional_names_are_validated_too(tmp_path: Path, command: str) -> None:
    run = run_tuner(command, "../../etc", "--results", str(tmp_path / "results"))
    assert run.returncode == 2, run.stdout + run.stderr
    assert "study name" in assert_one_line(run.stderr)


def test_a_name_field_over_the_limit_is_refused(tmp_path: Path) -> None:
    run = run_tuner("validate", str(write(tmp_path, demo_with(name="n" * 300))))
    assert run.returncode == 2
    assert "300 characters" in assert_one_line(run.stderr)


# -- defect 10: one-line errors on the command line ----------------------------------

@pytest.fixture
def example(tmp_path: Path) -> Path:
    return copy_cpu_example(tmp_path)


def test_corrupt_study_json_is_one_line(example: Path) -> None:
    (example / "smollm2-cpu" / "study.json").write_text("{garbage")
    for command in ("status", "report", "export", "resume"):
        run = run_tuner(command, "smollm2-cpu", "--results", str(example))
        assert run.returncode == 3, (command, run.stdout[-1000:], run.stderr)
        assert "study.json" in assert_one_line(run.stderr)


def test_garbage_optuna_db_is_one_line(example: Path) -> None:
    study = example / "smollm2-cpu"
    (study / "study.json").write_text(json.dumps({"name": "smollm2-cpu", "storage_is_default": True}))
    (study / "optuna.db").write_bytes(b"this is not a database" * 100)
    for command in ("status", "export"):
        began = time.monotonic()
        run = run_tuner(command, "smollm2-cpu", "--results", str(example))
        assert run.returncode == 3, (command, run.stderr)
        assert "optuna.db" in assert_one_line(run.stderr)
        assert time.monotonic() - began < 30


def test_bad_storage_urls_fail_at_once_in_one_line(example: Path, tmp_path: Path) -> None:
    (example / "smollm2-cpu" / "study.json").write_text(json.dumps({"name": "smollm2-cpu",
                                                                    "storage_is_default": True}))
    cases = [("garbage://", 2), (f"sqlite:///{tmp_path}/missing/missing.db", 3), ("sqlite:////missing.db", 3)]
    for url, code in cases:
        began = time.monotonic()
        run = run_tuner("status", "smollm2-cpu", "--results", str(example), "--storage", url, timeout=200)
        took = time.monotonic() - began
        assert run.returncode == code, (url, run.stderr)
        assert_one_line(run.stderr)
        assert took < 20, (url, took)
    assert not Path("/missing.db").exists()


def test_export_to_a_folder_and_a_weird_pick_are_one_line(example: Path) -> None:
    run = run_tuner("export", "smollm2-cpu", "--results", str(example), "-o", "/")
    assert run.returncode == 2, run.stderr
    assert_one_line(run.stderr)
    run = run_tuner("report", "smollm2-cpu", "--results", str(example), "--pick", "weird")
    assert run.returncode == 2, run.stderr
    assert "weird" in assert_one_line(run.stderr)
    run = run_tuner("export", "smollm2-cpu", "--results", str(example), "--pick", "weird")
    assert run.returncode == 2, run.stderr
    assert "weird" in assert_one_line(run.stderr)
