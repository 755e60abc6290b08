"""A Ray cluster whose second node runs another environment: its trial worker is refused
before it gets a trial, and the study runs on the node that matches.

``ray.cluster_utils.Cluster`` starts two real raylets on this machine. The second one's
PYTHONPATH carries a package folder with a ``vllm 0.26.0`` distribution (metadata only)
ahead of the checkout, as a node with another vLLM installed would; the driver and the
head node have none. Each node declares 8 GPUs and 1 CPU, so Ray must put the study's two
GPU groups on different nodes.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, load_trials, run_tuner
from tests.faultkit import fault_study

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mixed_cluster(tmp_path_factory: pytest.TempPathFactory):
    from ray.cluster_utils import Cluster

    kit = tmp_path_factory.mktemp("kit")
    dist = kit / "vllm-0.26.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.26.0\n")
    previous = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(ROOT) + (os.pathsep + previous if previous else "")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 8,
                                                             "include_dashboard": False})
    try:
        other = cluster.add_node(num_cpus=1, num_gpus=8,
                                 env_vars={"PYTHONPATH": f"{kit}{os.pathsep}{os.environ['PYTHONPATH']}"})
        cluster.wait_for_nodes()
        yield cluster, other.node_id
    finally:
        cluster.shutdown()
        if previous is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = previous


def test_a_node_in_another_environment_gets_no_trial(tmp_path: Path, mixed_cluster,
                                                    orphan_check: list[str]) -> None:
    cluster, other_node = mixed_cluster
    study, marker = fault_study(tmp_path, {256: [], 257: [], 258: []},
                                updates={"execution.parallel_trials": 2, "server.cpus_per_trial": 1})
    orphan_check.append(marker)
    results = tmp_path / "results"
    out = run_tuner("run", str(study), "--results", str(results), "--ray-address", cluster.address,
                    timeout=600)
    print(out.stdout[-4000:])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    refused = re.findall(r"\[worker\] group (\d) on \S+ \(node (\w+)\) refused: (.*)", out.stdout)
    assert len(refused) == 1, out.stdout[-3000:]
    group, node, why = refused[0]
    assert other_node.startswith(node)
    assert why.startswith("another environment than the study's: vllm not installed -> 0.26.0")
    ready = re.findall(r"\[worker\] group (\d) ready: pid \d+ on \S+ \(node (\w+)\)", out.stdout)
    assert [g for g, _ in ready] == [str(1 - int(group))] and not other_node.startswith(ready[0][1])
    # Every trial ran, on the matching node's group.
    trials = [t for t in load_trials(results, study.stem) if t.user_attrs.get("kind", "run") == "run"]
    assert len(trials) == 3 and all(t.state.name == "COMPLETE" for t in trials)
    base_port = yaml.safe_load(study.read_text())["server"]["port"]
    for t in trials:
        argv = json.loads((results / study.stem / "trials" / f"{t.number:04d}" / "command.json").read_text())["argv"]
        assert int(argv[argv.index("--port") + 1]) == base_port + 1 - int(group), argv


def test_a_node_is_judged_against_the_pin() -> None:
    from tuner.commands.run import _node_refusal

    pinned = {"packages": {"vllm": "0.26.0"}, "gpus": ["NVIDIA H200"] * 8, "cluster": False, "host": "a"}
    same = {"group": 1, "host": "b", "environment": dict(pinned, host="b", cluster=True)}
    assert _node_refusal(same, pinned, allow_change=False) is None
    other = {"group": 1, "host": "b", "environment": dict(pinned, packages={"vllm": "0.27.0"})}
    why = _node_refusal(other, pinned, allow_change=False)
    assert why is not None and why.startswith("another environment than the study's: vllm 0.26.0 -> 0.27.0")
    assert _node_refusal(other, pinned, allow_change=True) is None
    unread = {"group": 1, "host": "b", "environment": None, "environment_error": "TimeoutExpired: 60 s"}
    assert _node_refusal(unread, pinned, allow_change=True) == (
        "its environment could not be read (TimeoutExpired: 60 s)")


def test_a_node_without_an_energy_counter_is_refused_only_by_a_study_that_needs_one() -> None:
    from tuner.commands.run import _node_refusal
    from tuner.energy.detect import energy_unavailable
    from tuner.engine.trial_energy import worker_energy_refusal

    pinned = {"packages": {"vllm": "0.26.0"}, "gpus": ["NVIDIA H200"] * 8, "cluster": False, "host": "a"}
    blind = {"group": 1, "host": "b", "environment": dict(pinned, host="b", cluster=True),
             "energy_unavailable": "no NVML (nvmlInit failed: Driver Not Loaded)"}
    assert _node_refusal(blind, pinned, allow_change=True, names_energy=True) == (
        "the study names an energy objective or limit, and this node cannot read an energy counter: "
        "no NVML (nvmlInit failed: Driver Not Loaded)")
    assert _node_refusal(blind, pinned, allow_change=False, names_energy=False) is None
    assert _node_refusal(dict(blind, energy_unavailable=None), pinned, allow_change=False, names_energy=True) is None
    # What a worker reports: this machine's own reason for a real server's GPUs, nothing for the
    # simulator (it writes its counters itself).
    assert worker_energy_refusal(["python", "-m", "tuner.sim"], "0,1") is None
    assert worker_energy_refusal(["vllm", "serve"], "0,1") == energy_unavailable(["0", "1"])
    assert worker_energy_refusal(["vllm", "serve"], "") == energy_unavailable([])


def test_the_worker_tells_the_driver_whether_its_node_can_read_energy() -> None:
    from tuner.energy.detect import energy_unavailable
    from tuner.engine.worker import TrialWorker
    from tuner.study.study_file import parse_study

    real = parse_study((ROOT / "search_spaces" / "d8b-h100-energy.yaml").read_text()).server
    sim = parse_study((ROOT / "search_spaces" / "demo.yaml").read_text()).server
    worker = TrialWorker(group_index=0)
    assert "energy_unavailable" not in worker.describe()                 # one machine: run checked it
    told = worker.describe(real.model_dump(mode="json"))
    gpus = [g for g in told["gpus"].split(",") if g]
    assert told["energy_unavailable"] == energy_unavailable(gpus)
    assert worker.describe(sim.model_dump(mode="json"))["energy_unavailable"] is None
