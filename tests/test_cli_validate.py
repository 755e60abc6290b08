"""`tuner validate` through the real console entry point (a subprocess)."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def tuner(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tuner", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("name", ["demo.yaml", "glm5-8xpcie.yaml"])
def test_validate_shipped_spaces(name: str) -> None:
    out = tuner("validate", f"search_spaces/{name}")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "parameters (condition tree):" in text
    assert "discrete space:" in text and "allowed point" in text
    assert "baseline trial:" in text and "random point (seed 0):" in text
    # The baseline command line is a real, quoted argv.
    baseline_cmd = text.split("baseline trial:", 1)[1].splitlines()[1].strip()
    words = shlex.split(baseline_cmd)
    assert "--model" in words and "--port" in words


def test_validate_glm5_counts_conditional_space() -> None:
    text = tuner("validate", "search_spaces/glm5-8xpcie.yaml").stdout
    assert "- cudagraph_mode -> compilation_config.cudagraph_mode" in text
    assert "    - nccl_proto -> env:NCCL_PROTO" in text  # nested under disable_custom_all_reduce
    assert "NCCL_DEBUG=INFO" in text  # NCCL knobs are searched, so they are read back


def test_validate_bad_value_exits_nonzero_with_field_and_allowed(tmp_path: Path) -> None:
    bad = (ROOT / "search_spaces" / "glm5-8xpcie.yaml").read_text().replace(
        "values: [FULL_AND_PIECEWISE, FULL_DECODE_ONLY, PIECEWISE, FULL, NONE]",
        "values: [FULL_AND_PIECEWISE, BOGUS]",
    )
    path = tmp_path / "bad.yaml"
    path.write_text(bad)
    out = tuner("validate", str(path))
    assert out.returncode == 2
    assert str(path) in out.stderr
    assert "cudagraph_mode" in out.stderr and "'BOGUS'" in out.stderr
    assert "FULL_DECODE_ONLY" in out.stderr
    assert "Traceback" not in out.stderr


def test_validate_missing_file() -> None:
    out = tuner("validate", "search_spaces/nope.yaml")
    assert out.returncode == 2 and "nope.yaml" in out.stderr and "cannot read" in out.stderr


@pytest.mark.parametrize(("key", "shown"), [("bank: {enabled: false}", "bank.enabled: false"),
                                            ("items: 12", "items: 12")])
def test_validate_retired_template_probe_keys_say_what_replaced_them(tmp_path: Path, key: str, shown: str) -> None:
    text = (ROOT / "search_spaces" / "demo.yaml").read_text()
    assert "\nprobe:\n" in text
    path = tmp_path / "old.yaml"
    path.write_text(text.replace("\nprobe:\n", f"\nprobe:\n  {key}\n"))
    out = tuner("validate", str(path))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: probe: {shown}: ")
    assert "retired" in lines[0] and "issue 37" in lines[0]
