"""A local single-node run binds Ray to 127.0.0.1 only (issue 16, defect 9): the GCS, the
raylet, the runtime-env agent, the driver and the workers listen on loopback, checked with
`ss -ltnp` against the process tree of a fresh interpreter that started Ray as `tuner run`
does (tuner.engine.ray_executor.init_ray)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")

_SCRIPT = textwrap.dedent("""
    import json, os, subprocess, sys, time
    import ray                      # imported first, as `tuner run` may (study fingerprint)
    from tuner.adapters import proctree
    from tuner.engine.ray_executor import init_ray
    init_ray(address=None, gpus_needed=0, cpus_needed=1)

    @ray.remote
    def touch():
        return os.getpid()

    ray.get([touch.remote() for _ in range(2)])
    time.sleep(1.0)
    mine = set(proctree.descendants(os.getpid())) | {os.getpid()}
    table = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout.splitlines()
    sockets = [(line.split()[3], line.split()[-1]) for line in table
               if any(f"pid={pid}," in line for pid in mine)]
    node = ray.nodes()[0]["NodeManagerAddress"]
    ray.shutdown()
    print("RESULT " + json.dumps({"node": node, "sockets": sockets}))
""")


def _loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    return host in ("127.0.0.1", "::1", "::ffff:127.0.0.1", "localhost")


def test_local_ray_listens_on_loopback_only() -> None:
    run = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(next(l for l in run.stdout.splitlines() if l.startswith("RESULT "))[7:])
    assert result["sockets"], "no listening socket of the Ray processes found"
    open_to_all = [s for s in result["sockets"] if not _loopback(s[0])]
    assert not open_to_all, open_to_all
    assert result["node"] == "127.0.0.1"
    print(f"{len(result['sockets'])} Ray sockets, all on loopback: {sorted(a for a, _ in result['sockets'])}")
