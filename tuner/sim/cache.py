"""The simulator's torch.compile cache: real files under VLLM_CACHE_ROOT, keyed like vLLM's.

vLLM keys its compile cache by a hash of the compile-relevant configuration (see
``tuner.vllm.compile_cache`` for which settings and why) and writes, after compiling,
``$VLLM_CACHE_ROOT/torch_compile_cache/torch_aot_compile/<sha256>/rank_0_0/model``
atomically (``<path>.<pid>.tmp`` then ``os.replace``) next to the Inductor cache directory
``torch_compile_cache/<hash10>/rank_0_0/backbone``. The simulator does the same with the
hash of the *effective* (resolved) settings, so two starts whose compile-relevant settings
resolve alike share an entry and the second one loads.

The root is VLLM_CACHE_ROOT when set; otherwise a simulator-only directory
(``$XDG_CACHE_HOME/tuner-sim/vllm``, default ``~/.cache/tuner-sim/vllm``) - never the real
``~/.cache/vllm``, whose entries belong to real vLLM. Tests point VLLM_CACHE_ROOT at a
temporary directory. ``TUNER_SIM_COMPILE_CACHE=0`` turns the cache off (every start
compiles, nothing is written), like ``VLLM_DISABLE_COMPILE_CACHE=1``, which is honoured too.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.sim.effective import Effective
from tuner.sim.logs import VERSION
from tuner.vllm.knobs import CACHE_ROOT_ENV, IGNORED_VLLM_ENV

__all__ = ["CompileCache", "compile_factors", "compile_hash", "default_root", "RANK_DIR"]

RANK_DIR = "rank_0_0"


def default_root(env: Mapping[str, str]) -> Path:
    """VLLM_CACHE_ROOT, else the simulator's own directory under the XDG cache dir."""

    if env.get(CACHE_ROOT_ENV):
        return Path(os.path.expanduser(env[CACHE_ROOT_ENV]))
    xdg = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "tuner-sim" / "vllm"


def compile_factors(eff: Effective, env: Mapping[str, str]) -> dict[str, Any]:
    """What enters the key: the compile-relevant effective settings (vLLM's VllmConfig
    hash: model, dtype, max_model_len, parallel sizes, KV-cache dtype, compilation mode,
    cudagraph mode and capture sizes, the compile range's end (max_num_batched_tokens),
    speculative method and k) plus vLLM's hashed env vars and the version."""

    spec = None if eff.spec is None else [eff.spec.method, eff.spec.num_spec_tokens]
    envs = {k: v for k, v in sorted(env.items()) if k.startswith("VLLM_") and k not in IGNORED_VLLM_ENV}
    return {
        "version": VERSION, "platform": eff.profile.hardware.platform, "profile": eff.profile.name,
        "model": eff.model, "dtype": eff.dtype, "max_model_len": eff.max_model_len,
        "tp": eff.tp, "pp": eff.pp, "kv_cache_dtype": eff.kv_cache_dtype,
        "mode": eff.compile_mode, "cudagraph_mode": eff.cudagraph_mode,
        "capture_sizes": list(eff.capture_sizes), "compile_range_end": eff.max_num_batched_tokens,
        "spec": spec, "env": envs,
    }


def compile_hash(eff: Effective, env: Mapping[str, str]) -> str:
    """sha256 hex of compile_factors (the AOT directory name; its first 10 characters name
    the Inductor cache directory, as vLLM's 10-character config hash does)."""

    text = json.dumps(compile_factors(eff, env), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class CompileCache:
    root: Path
    enabled: bool = True

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> CompileCache:
        off = env.get("TUNER_SIM_COMPILE_CACHE", "1") == "0" or env.get("VLLM_DISABLE_COMPILE_CACHE") == "1"
        return cls(default_root(env), enabled=not off)

    def inductor_dir(self, key: str) -> Path:
        return self.root / "torch_compile_cache" / key[:10] / RANK_DIR / "backbone"

    def aot_path(self, key: str) -> Path:
        return self.root / "torch_compile_cache" / "torch_aot_compile" / key / RANK_DIR / "model"

    def lookup(self, key: str) -> bool:
        """Is there a complete entry for ``key`` (written whole, with the same key inside)?"""

        if not self.enabled:
            return False
        try:
            data = json.loads(self.aot_path(key).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        return isinstance(data, dict) and data.get("key") == key

    def store(self, key: str, factors: Mapping[str, Any], compile_s: float) -> Path | None:
        """Write the entry after a compile, atomically; None when the cache is off or the
        write fails (vLLM only warns: 'unable to save AOT compiled function')."""

        if not self.enabled:
            return None
        path = self.aot_path(key)
        try:
            self.inductor_dir(key).mkdir(parents=True, exist_ok=True)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"key": key, "factors": dict(factors), "compile_s": compile_s},
                                      sort_keys=True), encoding="utf-8")
            os.replace(tmp, path)
        except OSError:
            return None
        return path
