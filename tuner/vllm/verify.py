"""Compare what a trial asked vLLM for with what its log says vLLM applied.

`verify(asked, effective)` returns one :class:`KnobCheck` per asked target:

* ``applied``: the log shows the asked value in effect;
* ``not_applied``: the log shows something else (a silent downgrade, a forced value, a
  leftover setting) — the trial measured a different configuration than it claims;
* ``unverifiable``: the log cannot tell (the note says what would make it tell);
* ``not_applicable``: the knob cannot act on this server (NCCL's variables and the custom
  all-reduce on the CPU build, whose collectives run over shared memory or gloo): never
  "applied", and no failure either - the evidence says why.

How a target is read back is its knob's ``rule`` (``tuner.vllm.knobs``), one of
:data:`RULES`: a knob with a ``log`` field is compared with that field of the
:class:`EffectiveConfig`, a few need their own rule (graph capture, downgrades, the
all-reduce, NCCL's environment report), and any other argument falls back to vLLM's own
record of parsed arguments, the ``non-default args:`` line. Values are compared in their
knob's canonical form, so ``2`` and ``"full"`` both match a FULL cudagraph mode.

Only asked targets are checked: a knob the trial did not name is never a failure. To make
sure a setting is *off* (e.g. no leftover speculation, field-notes trap 2), ask for it
explicitly: ``speculative_config.method: "none"`` means "speculation must be off" and is
verified like any other value.

:func:`startup_mismatches` is the same check on a *partial* startup log, keeping only the
mismatches their knob's ``final`` says cannot change any more (early stop while starting).

:class:`VerificationResult` is the typed verdict a trial stores: its ``applied`` is the
one answer to "did the server run what was asked".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, model_validator

from tuner.vllm.effective_config import EffectiveConfig, excerpt_around_key
from tuner.vllm.knob_values import ANY
from tuner.vllm.knobs import GRAPH_KINDS, Knob, knob
from tuner.vllm.parallel import allreduce_text, ranks_text

__all__ = ["KnobCheck", "Status", "VerificationResult", "verify", "startup_mismatches", "RULES",
           "parallel_summary"]

Status = Literal["applied", "not_applied", "unverifiable", "not_applicable"]


class KnobCheck(BaseModel):
    """The verdict on one asked target."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    target: str
    asked: Any
    got: Any = None
    status: Status
    evidence: str | None = None
    note: str | None = None


class VerificationResult(BaseModel):
    """All checks of one trial; ``applied`` is False as soon as one check is not_applied."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    checks: list[KnobCheck]
    applied: bool
    # The ranks and the all-reduce the log shows (parallel_summary); None: not recorded.
    parallel: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _applied_matches_checks(self) -> VerificationResult:
        if self.applied != all(c.status != "not_applied" for c in self.checks):
            raise ValueError("applied must be True exactly when no check is not_applied")
        return self

    def mismatches(self) -> list[KnobCheck]:
        return [c for c in self.checks if c.status == "not_applied"]


def verify(asked: Mapping[str, Any], effective: EffectiveConfig) -> VerificationResult:
    """Check every asked target against the effective configuration. Never raises on
    unknown targets or odd values: those come back as ``unverifiable``."""
    checks = [check_one(knob(str(target)), value, effective) for target, value in asked.items()]
    return VerificationResult(checks=checks, applied=all(c.status != "not_applied" for c in checks),
                              parallel=parallel_summary(effective, checks))


def parallel_summary(eff: EffectiveConfig, checks: list[KnobCheck] | None = None) -> dict[str, Any]:
    """What a trial's record says about its ranks: world size, TP size, the ranks' lines,
    the TP all-reduce that ran, and the asked knobs that could not act here."""

    return {"world_size": eff.world_size, "tensor_parallel_size": eff.tensor_parallel_size,
            "distributed_backend": eff.distributed_backend, "ranks": eff.ranks,
            "allreduce": eff.allreduce, "allreduce_evidence": eff.evidence.get("allreduce"),
            "not_applicable": [c.target for c in checks or [] if c.status == "not_applicable"]}


def check_one(k: Knob, asked: Any, effective: EffectiveConfig) -> KnobCheck:
    return RULES[k.rule](k, asked, effective)


def startup_mismatches(asked: Mapping[str, Any], eff: EffectiveConfig) -> list[str]:
    """Asked targets that a *partial* startup log (``eff``: what its lines so far establish,
    vllm.log_digest) already proves not applied, for good.

    Only knobs whose ``final`` holds: verdicts resting on a line vLLM prints once and never
    takes back (the attention backend's CUDA-graph downgrade, printed at attention init
    before the weights load; the custom all-reduce outcome at communicator init). Verdicts
    resting on a line still missing (graph capture, printed at the end) wait for the full
    log. The field-notes box shows both downgrades minutes before the server is ready.
    """

    sure = []
    for check in verify(asked, eff).mismatches():
        final = knob(check.target).final
        if final is not None and final(eff):
            sure.append(check.target)
    return sure


# ---------------------------------------------------------------------------------------
# Rules: (knob, asked value, effective config) -> check

Rule = Callable[[Knob, Any, EffectiveConfig], KnobCheck]
_OFF = {"", "none", "null", "off", "false"}


def _check(k: Knob, asked: Any, status: Status, got: Any = None, evidence: str | None = None,
           note: str | None = None) -> KnobCheck:
    return KnobCheck(target=k.target, asked=asked, got=got, status=status, evidence=evidence,
                     note=note)


def _uninterpretable(k: Knob, asked: Any, got: Any = None, evidence: str | None = None) -> KnobCheck:
    return _check(k, asked, "unverifiable", got, evidence,
                  note=f"cannot interpret the asked value {asked!r}")


def _seen(eff: EffectiveConfig, field: str) -> bool:
    # A field is "seen" when the log established it, even as None (e.g. speculation off).
    return getattr(eff, field) is not None or field in eff.evidence


def _cpu_build(eff: EffectiveConfig) -> tuple[str, str | None] | None:
    """(what shows it, its evidence) when the log shows the CPU build, else None."""

    # The ranks' own line first: it names the collectives' backend.
    for field, shown in (("distributed_backend", "backend=gloo"), ("platform", "device_config=cpu"),
                         ("kv_cache_device", "a CPU KV cache")):
        if getattr(eff, field) in ("cpu", "gloo", "CPU"):
            return shown, eff.evidence.get(field)
    return None


def _from_args(k: Knob, asked: Any, eff: EffectiveConfig) -> KnobCheck:
    """Compare with vLLM's record of the arguments it parsed (``non-default args:``)."""
    if eff.non_default_args is None:
        return _check(k, asked, "unverifiable", note="no `non-default args:` line in the log")
    node: Any = eff.non_default_args
    for key in k.target.split("."):
        if not isinstance(node, dict) or node.get(key) is None:
            return _check(k, asked, "unverifiable", note="not among vLLM's non-default args: "
                          "vLLM used its default, which the log does not print")
        node = node[key]
    line = eff.non_default_args_line or ""
    evidence = excerpt_around_key(line, k.target) or eff.evidence.get("non_default_args")
    status: Status = "applied" if ANY.canonical(node) == ANY.canonical(asked) else "not_applied"
    return _check(k, asked, status, node, evidence, note="from the non-default args line")


def _from_field(k: Knob, asked: Any, eff: EffectiveConfig) -> KnobCheck:
    """Compare with the EffectiveConfig field the knob's ``log`` names."""
    field = k.log or ""
    if not _seen(eff, field):
        return _from_args(k, asked, eff)
    want, got = k.values.canonical(asked), getattr(eff, field)
    if want is None:
        return _uninterpretable(k, asked, got, eff.evidence.get(field))
    status: Status = "applied" if got is not None and k.values.canonical(got) == want else "not_applied"
    return _check(k, asked, status, got, eff.evidence.get(field))


def _optional_field(k: Knob, asked: Any, eff: EffectiveConfig) -> KnobCheck:
    """A field the engine line prints as ``None`` when off (``quantization=None``): asking
    for none of it (null, "none") is verified like any value."""
    off = asked is None or (isinstance(asked, str) and asked.strip().lower() in _OFF)
    if not off:
        return _from_field(k, asked, eff)
    return _from_field(k, "None", eff).model_copy(update={"asked": asked})


def _dtype(k: Knob, asked: Any, eff: EffectiveConfig) -> KnobCheck:
    if k.values.canonical(asked) == "auto":
        # auto resolves from the model's config.json, which the log does not show.
        return _check(k, asked, "unverifiable", eff.dtype, eff.evidence.get("dtype"),
                      note="dtype=auto follows the model's config; the log shows only the result")
    return _from_field(k, asked, eff)


def _capture_problem(mode: str, eff: EffectiveConfig) -> tuple[str, str | None] | None:
    """Whether the capture lines contradict `mode` (GPU only). Returns (note, evidence)."""
    if mode != "NONE" and eff.graph_capture_skipped:
        return "vLLM skipped CUDA graph capture", eff.evidence.get("graph_capture_skipped")
    if eff.graphs_captured is None:
        return None
    # Bars are labelled "FULL" (V2 runner) or "decode, FULL" (V1): the kind is the last word.
    kinds = {label.rsplit(",", 1)[-1].strip().upper() for label in eff.graphs_captured}
    kinds &= {"FULL", "PIECEWISE"}
    if mode in GRAPH_KINDS and kinds != GRAPH_KINDS[mode]:
        return (f"captured graphs {sorted(kinds)} do not match mode {mode}",
                eff.evidence.get("graphs_captured"))
    return None


def _cudagraph_mode(k: Knob, asked: Any, eff: EffectiveConfig) -> KnobCheck:
    want = k.values.canonical(asked)
    got = eff.cudagraph_mode
    evidence = eff.evidence.get("cudagraph_mode")
    if want is None:
        return _uninterpretable(k, asked, got, evidence)
    if got is None:
        return _check(k, asked, "unverifiable", note="no engine config line in the log")
    if got != want:
        if eff.cudagraph_downgrades:
            note = "vLLM downgraded it: " + ", ".join(
                f"{d.from_mode or '?'}→{d.to_mode}" for d in eff.cudagraph_downgrades)
        elif eff.platform == "cpu":
            note = "the CPU build forces cudagraph_mode NONE without logging it"
        else:
            note = f"the engine ran {got}"
        return _check(k, asked, "not_applied", got, evidence, note)
    if eff.platform != "cpu" and (problem := _capture_problem(got, eff)):
        return _check(k, asked, "not_applied", got, problem[1], problem[0])
    return _check(k, asked, "applied", got, evidence)


def _compilation_mode(k: Knob, asked: Any, eff: EffectiveConfig) -> KnobCheck:
    want = k.values.canonical(asked)
    got = eff.compilation_mode
    evidence = eff.evidence.get("compilation_mode")
    if got is None:
        return _from_args(k, asked, eff)
    if want is None:
        return _uninterpretable(k, asked, got, evidence)
    if got == want:
        return _check(k, asked, "applied", got, evidence)
    if want == "VLLM_COMPILE" and got == "DYNAMO_TRACE_ONCE" and eff.platform == "cpu":
        return _check(k, asked, "applied", got, evidence,
                      note="the CPU platform substitutes DYNAMO_TRACE_ONCE for VLLM_COMPILE")
    return _check(k, asked, "not_applied", got, evidence)


def _enforce_eager(k: Knob, asked: Any, eff: EffectiveConfig) -> KnobCheck:
    base = _from_field(k, asked, eff)
    if base.status != "applied" or k.values.canonical(asked) is not True:
        return base
    # Eager means no graphs at all; a config claiming otherwise is not eager.
    if eff.cudagraph_mode not in (None, "NONE"):
        return base.model_copy(update={"status": "not_applied", "got": eff.cudagraph_mode,
                                       "evidence": eff.evidence.get("cudagraph_mode"),
                                       "note": "enforce_eager=True but cudagraph_mode is not NONE"})
    if eff.graphs_captured:
        return base.model_copy(update={"status": "not_applied",
                                       "evidence": eff.evidence.get("graphs_captured"),
                                       "note": "enforce_eager=True but CUDA graphs were captured"})
    return base


def _custom_all_reduce(k: Knob, asked: Any, eff: EffectiveConfig) -> KnobCheck:
    want_disabled = k.values.canonical(asked)
    if want_disabled is None:
        return _uninterpretable(k, asked)
    if cpu := _cpu_build(eff):
        return _check(k, asked, "not_applicable", eff.disable_custom_all_reduce,
                      eff.evidence.get("disable_custom_all_reduce") or cpu[1],
                      note=f"not applicable here: the CPU build ({cpu[0]}) has no custom all-reduce "
                           f"and forces disable_custom_all_reduce=True; its all-reduce: "
                           f"{allreduce_text(eff.allreduce)}")
    active = eff.custom_all_reduce_active
    active_ev = eff.evidence.get("custom_all_reduce_active")
    config, config_ev = eff.disable_custom_all_reduce, eff.evidence.get("disable_custom_all_reduce")
    if not want_disabled:  # custom all-reduce wanted
        if active is False:
            return _check(k, asked, "not_applied", True, active_ev,
                          note=f"custom all-reduce is off: {eff.custom_all_reduce_reason}")
        if active:
            return _check(k, asked, "applied", False, active_ev)
        if config is None:
            return _from_args(k, asked, eff)
        note = None
        if eff.tensor_parallel_size == 1:
            note = "tensor_parallel_size=1: there is no all-reduce, so it is never built"
        return _check(k, asked, "applied" if config is False else "not_applied",
                      config, config_ev, note)
    if config is True or active is False:
        return _check(k, asked, "applied", True, config_ev if config else active_ev)
    if active:
        return _check(k, asked, "not_applied", False, active_ev,
                      note="CUSTOM is still among the all-reduce backends")
    if config is False:
        return _check(k, asked, "not_applied", False, config_ev)
    return _from_args(k, asked, eff)


def _speculative_method(k: Knob, asked: Any, eff: EffectiveConfig) -> KnobCheck:
    got = eff.speculative_method
    evidence = eff.evidence.get("speculative_method")
    if not _seen(eff, "speculative_method"):
        return _check(k, asked, "unverifiable", note="no engine config line in the log")
    if asked is None or asked is False or (isinstance(asked, str) and asked.strip().lower() in _OFF):
        if got is None:
            return _check(k, asked, "applied", None, evidence)
        return _check(k, asked, "not_applied", got, evidence,
                      note="speculative decoding is on although none was asked (leftover setting?)")
    if not isinstance(asked, str):
        return _uninterpretable(k, asked, got, evidence)
    want = asked.strip().lower()
    if got is not None and got.lower() == want:
        return _check(k, asked, "applied", got, evidence)
    if got == "mtp" and want.endswith("_mtp"):
        return _check(k, asked, "applied", got, evidence, note="vLLM rewrites the *_mtp aliases to mtp")
    return _check(k, asked, "not_applied", got, evidence)


def _nccl_env(k: Knob, asked: Any, eff: EffectiveConfig) -> KnobCheck:
    name = k.target.removeprefix("env:")
    if cpu := _cpu_build(eff):
        return _check(k, asked, "not_applicable", None, cpu[1],
                      note=f"not applicable here: NCCL is not used on the CPU build ({cpu[0]}); "
                           f"the all-reduce: {allreduce_text(eff.allreduce)}")
    env = eff.nccl_env or {}
    if name in env:
        same = str(env[name]).replace(" ", "").upper() == str(asked).replace(" ", "").upper()
        status: Status = "applied" if same else "not_applied"
        return _check(k, asked, status, env[name], eff.evidence.get(f"nccl_env.{name}"))
    if env and k.arg == "reported":  # NCCL always reports it: its absence is an answer
        return _check(k, asked, "not_applied", None, eff.evidence.get("nccl_env"),
                      note=f"NCCL reported its environment without {name}: "
                           "the variable did not reach the worker processes")
    if env:
        return _check(k, asked, "unverifiable", note=f"NCCL does not always report {name}")
    if eff.nccl_debug_seen:
        return _check(k, asked, "unverifiable",
                      note="NCCL debug output has no ENV lines; add ENV to NCCL_DEBUG_SUBSYS")
    if eff.world_size == 1:
        return _check(k, asked, "unverifiable", note="world size 1: NCCL carries no collectives here")
    return _check(k, asked, "unverifiable", note="enable NCCL_DEBUG=INFO to verify")


def _allreduce_backend(k: Knob, asked: Any, eff: EffectiveConfig) -> KnobCheck:
    """A vLLM switch for one all-reduce backend (``k.arg``), read off the TP group's
    backends line."""
    want = k.values.canonical(asked)
    backends = eff.allreduce_backends
    if want is None:
        return _uninterpretable(k, asked)
    if backends is None and (cpu := _cpu_build(eff)):
        return _check(k, asked, "not_applicable", None, cpu[1],
                      note=f"not applicable here: {k.arg} is a GPU all-reduce and this is the CPU build "
                           f"({cpu[0]}); its all-reduce: {allreduce_text(eff.allreduce)}")
    if backends is None:
        return _check(k, asked, "unverifiable", note="no all-reduce backends line "
                      "(tensor_parallel_size=1, CPU, or older vLLM)")
    evidence = eff.evidence.get("allreduce_backends")
    if (k.arg in backends) == want:
        return _check(k, asked, "applied", backends, evidence)
    note = (f"{k.arg} is still used" if not want
            else f"{k.arg} is not used for the TP group (unsupported on this hardware?)")
    return _check(k, asked, "not_applied", backends, evidence, note)


def _parallel_size(k: Knob, asked: Any, eff: EffectiveConfig) -> KnobCheck:
    """tensor_parallel_size: the engine line's value, then the ranks (vllm.parallel): the
    world size every rank logged must be TP x PP and their TP ranks ranks of that size; a
    TP rank that logged nothing is named in the note."""

    base = _from_field(k, asked, eff)
    tp = k.values.canonical(asked)
    if base.status != "applied" or not isinstance(tp, int):
        return base
    world = tp * (eff.pipeline_parallel_size or 1)
    seen = {r["world_size"] for r in eff.ranks or []} | ({eff.world_size} if eff.world_size else set())
    if seen and seen != {world}:
        return base.model_copy(update={
            "status": "not_applied", "got": sorted(seen),
            "evidence": eff.evidence.get("ranks") or eff.evidence.get("world_size"),
            "note": f"the ranks logged world size {sorted(seen)}, not {world} (TP {tp} x PP "
                    f"{eff.pipeline_parallel_size or 1})"})
    # A rank's TP rank is unknown (None) until its retagged lines come, in a partial log.
    tp_ranks = sorted({r["tp_rank"] for r in eff.ranks or [] if r["tp_rank"] is not None})
    if any(r >= tp for r in tp_ranks):
        return base.model_copy(update={"status": "not_applied", "got": tp_ranks,
                                       "evidence": eff.evidence.get("ranks"),
                                       "note": f"TP ranks {tp_ranks} logged for a TP size of {tp}"})
    missing = sorted(set(range(tp)) - set(tp_ranks))
    note = ranks_text(eff.ranks, eff.world_size) + (
        f"; TP ranks {missing} logged no rank line" if tp_ranks and missing else "")
    return base.model_copy(update={"note": note})


def _unlogged_env(k: Knob, asked: Any, eff: EffectiveConfig) -> KnobCheck:
    return _check(k, asked, "unverifiable", note="vLLM does not log this variable's value")


RULES: Mapping[str, Rule] = {
    "args": _from_args,
    "field": _from_field,
    "optional_field": _optional_field,
    "dtype": _dtype,
    "cudagraph_mode": _cudagraph_mode,
    "compilation_mode": _compilation_mode,
    "enforce_eager": _enforce_eager,
    "custom_all_reduce": _custom_all_reduce,
    "speculative_method": _speculative_method,
    "nccl_env": _nccl_env,
    "allreduce_backend": _allreduce_backend,
    "parallel_size": _parallel_size,
    "unlogged_env": _unlogged_env,
}
