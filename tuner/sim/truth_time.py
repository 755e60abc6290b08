"""Trial time model of the ground truth (``tuner.sim.truth``), for the early-stop savings.

Startup follows the simulator's startup timeline (``Sim.startup``: API init, engine init,
weight load, compile, profile run, KV init, graph capture per size, warm-up unless eager,
server start), cut at the failing stage for failures; a fixed prepare and stop cost
(``TimeModel``) is added.
``PointTruth.startup_s`` is a torch.compile cache miss; ``compile_fields`` gives the compile
key and the miss/hit timeline that let a simulated study (``tuner.sim.study``,
``compile_cache=True``) shorten a start whose key an earlier trial compiled
(``Sim.startup``'s hit loads in ``StartupSpec.compile_hit_parts``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tuner.sim.cache import compile_hash
from tuner.sim.effective import Effective

__all__ = ["TimeModel", "compile_fields", "startup_s"]


@dataclass(frozen=True)
class TimeModel:
    """Constant parts of a trial's wall time that the simulator does not model."""

    stop_s: float = 10.0             # SIGTERM -> process group gone, GPUs checked free
    prepare_s: float = 5.0           # GPU check, trial folder, launcher start


def compile_fields(eff: Effective, env: Mapping[str, str], tm: TimeModel) -> dict[str, Any]:
    """PointTruth's compile-cache fields for a start that gets through torch.compile: the
    simulator's own key (tuner.sim.cache.compile_hash) and its miss/hit timeline."""

    if eff.compile_mode == 0:
        return {}
    st = eff.profile.startup
    dynamo, load = st.compile_hit_parts
    compile_s = st.dynamo_s + st.inductor_s
    at = tm.prepare_s + st.api_init_s + st.engine_init_s + st.weight_load_s + compile_s
    return {"compile_key": compile_hash(eff, env)[:16], "compile_s": compile_s,
            "compile_hit_s": dynamo + load, "compile_at_s": at}


def startup_s(eff: Effective, until: str | None = None) -> float:
    """Simulated seconds of Sim.startup, or until the stage where it fails."""

    st = eff.profile.startup
    t = st.api_init_s + st.engine_init_s
    if until in ("init", "comm", "attn"):
        return t
    t += st.weight_load_s
    if until == "load":
        return t
    if eff.compile_mode != 0:
        t += st.dynamo_s + st.inductor_s
    t += st.profile_run_s
    if until == "kv":
        return t
    t += st.kv_init_s
    if until == "kv_backend":
        return t
    if eff.capture_sizes:
        per = {"FULL_AND_PIECEWISE": st.capture_piecewise_s_per_size + st.capture_full_s_per_size,
               "PIECEWISE": st.capture_piecewise_s_per_size}.get(eff.cudagraph_mode, st.capture_full_s_per_size)
        t += per * len(eff.capture_sizes)
    if not eff.enforce_eager:
        t += st.warmup_s
    return t + st.server_start_s
