"""The CI guard in conftest: a real-vLLM test that skips fails under CI=true (CI installs the
vLLM CPU build, so a skip there hides a broken setup), and skips as usual elsewhere."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

SKIPPING = '''
import pytest

@pytest.mark.realvllm
@pytest.mark.skipif(True, reason="vLLM environment missing")
def test_needs_vllm():
    pass

@pytest.mark.skipif(True, reason="an ordinary skip")
def test_other():
    pass
'''


@pytest.mark.parametrize("ci", ["true", None])
def test_realvllm_skip_fails_only_under_ci(tmp_path: Path, ci: str | None) -> None:
    shutil.copy(HERE / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_skipping.py").write_text(SKIPPING)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    # the copied conftest imports the helper modules of this repository's tests package
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE.parent), env.get("PYTHONPATH")]))
    if ci:
        env["CI"] = ci
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-o", "markers=realvllm", "-rA", str(tmp_path)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    if ci:
        assert out.returncode != 0, out.stdout
        assert "real-vLLM test skipped under CI=true: Skipped: vLLM environment missing" in out.stdout
        assert "1 skipped" in out.stdout  # the ordinary skip stays a skip
    else:
        assert out.returncode == 0, out.stdout
        assert "2 skipped" in out.stdout
