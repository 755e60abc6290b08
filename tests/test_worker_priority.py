"""Trial servers run at the priority a deployment's would (niceness 0), not at the nice 15
Ray gives its workers: on a busy host a server below the load generator's priority would
yield the CPU to it, and the study would measure the scheduler. Checked in a fresh
interpreter that starts Ray as `tuner run` does (tuner.engine.ray_executor.init_ray), and on a
worker process started at nice 15 as a cluster's would be."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from tests.conftest import ROOT

_LOCAL = textwrap.dedent("""
    import json, os, subprocess
    import ray
    from tuner.engine.ray_executor import init_ray
    from tuner.engine.worker import TrialWorker
    init_ray(address=None, gpus_needed=0, cpus_needed=1)

    @ray.remote
    def task():
        return os.getpriority(os.PRIO_PROCESS, 0)

    worker = ray.remote(TrialWorker).remote(0)
    info = ray.get(worker.describe.remote())
    child = ray.get(task.remote())
    ray.shutdown()
    driver = os.getpriority(os.PRIO_PROCESS, 0)
    print("RESULT " + json.dumps({"worker": info["niceness"], "task": child, "driver": driver}))
""")

# A worker process of a cluster started without RAY_worker_niceness=0: nice 15 from birth.
_CLUSTER_WORKER = textwrap.dedent("""
    import json, os, subprocess, sys
    from tuner.engine.worker import TrialWorker
    w = TrialWorker(0)
    server = subprocess.run([sys.executable, "-c", "import os; print(os.getpriority(os.PRIO_PROCESS, 0))"],
                            capture_output=True, text=True).stdout.strip()
    print("RESULT " + json.dumps({"described": w.describe()["niceness"], "server": int(server)}))
""")


def _result(out: subprocess.CompletedProcess[str]) -> dict[str, int]:
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(next(line for line in out.stdout.splitlines() if line.startswith("RESULT "))[7:])


def test_a_local_ray_runs_trial_workers_at_the_default_priority() -> None:
    run = subprocess.run([sys.executable, "-c", _LOCAL], cwd=ROOT, capture_output=True, text=True, timeout=300)
    found = _result(run)
    # Ray's workers run at the driver's own niceness, not 15 above it (a suite run under
    # `nice` keeps its niceness), and the trial worker goes back to 0 where it may.
    assert found["task"] == found["driver"]
    assert found["worker"] == (0 if os.geteuid() == 0 else found["driver"])


def test_a_worker_started_niced_brings_its_servers_back_or_says_so() -> None:
    run = subprocess.run(["nice", "-n", "15", sys.executable, "-c", _CLUSTER_WORKER], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    found = _result(run)
    # Raising priority back needs privilege: root (as on CI) gets 0 for the worker and the
    # server it starts; anyone else keeps 15, which describe() reports for the driver's warning.
    expected = 0 if os.geteuid() == 0 else 15
    assert found == {"described": expected, "server": expected}
