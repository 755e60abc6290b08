"""tuner.sim: a stand-in `vllm serve` (vLLM 0.32.0 behaviour on a simulated machine).

Run it as `python -m tuner.sim [serve] --model M [vLLM flags]` (or the `tuner-sim` script).
The pure parts are usable without a server, e.g. to compute ground-truth Pareto fronts:

    from tuner.sim import load_profile, effective_config, estimate, Workload
    prof = load_profile("glm5-8xpcie")
    eff = effective_config(["--model", "glm5", "-tp", "8"], {}, prof)
    estimate(prof, eff.perf, Workload(), concurrencies=(1, 64))

Exports are resolved lazily so that importing the package stays cheap.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "load_profile": "tuner.sim.profile", "Profile": "tuner.sim.profile",
    "builtin_profiles": "tuner.sim.profile", "ProfileError": "tuner.sim.profile",
    "parse_argv": "tuner.sim.args", "ArgvError": "tuner.sim.args", "SimArgs": "tuner.sim.args",
    "resolve": "tuner.sim.effective", "Effective": "tuner.sim.effective",
    "ConfigError": "tuner.sim.effective", "effective_config": "tuner.sim.__main__",
    "estimate": "tuner.sim.perf_model", "Workload": "tuner.sim.perf_model",
    "PerfConfig": "tuner.sim.perf_model", "CostModel": "tuner.sim.perf_model",
    "LevelEstimate": "tuner.sim.perf_model", "parse_faults": "tuner.sim.faults",
    "FAULT_NAMES": "tuner.sim.faults", "TOKENIZER": "tuner.sim.model",
    "plan_output": "tuner.sim.model", "chat_prompt": "tuner.sim.model",
}
# The names of _EXPORTS, sorted (tests/test_sim_perf_model.py checks that the two agree).
__all__ = [
    "ArgvError", "ConfigError", "CostModel", "Effective", "FAULT_NAMES", "LevelEstimate",
    "PerfConfig", "Profile", "ProfileError", "SimArgs", "TOKENIZER", "Workload",
    "builtin_profiles", "chat_prompt", "effective_config", "estimate", "load_profile",
    "parse_argv", "parse_faults", "plan_output", "resolve",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(name)
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)
