"""The study file's ``server:`` section: how to start the server under test, with the
flags and environment fixed for every trial, and which of them are secrets."""

from __future__ import annotations

import ipaddress
from typing import Any

from pydantic import Field, field_validator, model_validator

from tuner.study.spec_base import Scalar, Seconds, Strict, env_text_or_none
from tuner.vllm.knobs import check_argument_value, check_target_name, check_value

__all__ = ["ServerSpec", "leaves", "fixed_targets", "exposure_warning"]


class ServerSpec(Strict):
    """How to start the server under test. Flags and env here are fixed for every trial."""

    command: list[str] = Field(
        default_factory=lambda: ["vllm", "serve"],
        min_length=1,
        description="argv prefix that starts the server; '{python}' is replaced by the "
        "tuner's interpreter (used for the built-in simulator).",
    )
    model: str = Field(min_length=1, description="model path or id, passed as --model")
    served_model_name: str | None = Field(None, description="name the API serves the model as")
    host: str = Field("127.0.0.1", description="address the server binds; loopback unless needed")
    port: int = Field(8000, ge=1, le=65535, description="first port; parallel groups add 1, 2, ...")
    gpus_per_trial: int = Field(8, ge=0, description="GPUs one trial holds (a Ray resource)")
    cpus_per_trial: float = Field(1.0, ge=0, description="CPUs one trial holds (a Ray resource)")
    startup_timeout: Seconds = Field(1200.0, gt=0, description="readiness deadline, e.g. '20m'")
    stop_timeout: Seconds = Field(30.0, gt=0, description="grace after SIGTERM before SIGKILL")
    flags: dict[str, Any] = Field(default_factory=dict, description="fixed vLLM arguments")
    env: dict[str, Scalar] = Field(default_factory=dict, description="fixed environment")
    secret_env: list[str] = Field(
        default_factory=list,
        description="names of variables whose values are secrets: passed through from the "
        "tuner's environment, or given in env (also as '${NAME}': read where the study "
        "runs); their values are never written anywhere (docs/study-file.md, Secrets)",
    )
    secret_flags: list[str] = Field(
        default_factory=list,
        description="flags (or dotted config fields) in flags whose values are secrets, "
        "besides those with secret-looking names (api_key, *_token, *password*, ...)",
    )

    @model_validator(mode="after")
    def _check_secrets(self) -> ServerSpec:
        from tuner.secrets import MIN_SECRET_CHARS, reference_name, secret_slots

        targets = {t for key, value in self.flags.items() for t, _ in leaves(key, value)} | set(self.flags)
        for name in self.secret_flags:
            if name not in targets:
                raise ValueError(f"secret_flags: {name!r} is not in server.flags; flags: "
                                 f"{', '.join(sorted(targets)) or 'none'}")
        for name in self.secret_env:
            if error := check_target_name(f"env:{name}"):
                raise ValueError(f"secret_env: {error}")
        refs: dict[str, str | None] = {}
        for slot in secret_slots(self):
            where = slot.where.removeprefix("env:")
            if slot.value is not None and reference_name(slot.value) is None \
                    and len(slot.value) < MIN_SECRET_CHARS:
                raise ValueError(f"{where}: a secret must have at least {MIN_SECRET_CHARS} characters "
                                 "(shorter ones cannot be told apart from ordinary text in server logs)")
            if slot.ref in refs and refs[slot.ref] != slot.value:
                raise ValueError(f"{where}: two different secrets would both be written as ${{{slot.ref}}}; "
                                 f"give one of them as a reference with its own name, e.g. ${{OTHER_{slot.ref}}}")
            refs[slot.ref] = slot.value
        return self

    @field_validator("flags")
    @classmethod
    def _check_flags(cls, flags: dict[str, Any]) -> dict[str, Any]:
        for key, value in flags.items():
            if error := check_target_name(key):
                raise ValueError(f"flags.{key}: {error}")
            for target, leaf in leaves(key, value):
                if error := check_value(target, leaf) or check_argument_value(leaf):
                    raise ValueError(f"flags.{target}: {error}")
        return flags

    @field_validator("env")
    @classmethod
    def _check_env(cls, env: dict[str, Scalar]) -> dict[str, Scalar]:
        for name, value in env.items():
            if error := check_target_name(f"env:{name}"):
                raise ValueError(f"env.{name}: {error}")
            if error := check_value(f"env:{name}", env_text_or_none(value)):
                raise ValueError(f"env.{name}: {error}")
        return env


def leaves(prefix: str, value: Any) -> list[tuple[str, Any]]:
    """Every (dotted target, value) of a flag whose value is a (nested) mapping."""

    if isinstance(value, dict):
        out: list[tuple[str, Any]] = []
        for k, v in value.items():
            out.extend(leaves(f"{prefix}.{k}", v))
        return out
    return [(prefix, value)]



def fixed_targets(server: ServerSpec) -> set[str]:
    """The targets ``server.flags`` and ``server.env`` fix for every trial."""

    fixed = {t for key, value in server.flags.items() for t, _ in leaves(key, value)}
    fixed |= {f"env:{name}" for name in server.env}
    return fixed


def exposure_warning(server: ServerSpec) -> str | None:
    """Why ``server.host`` is a risk, or None for a loopback address (the default)."""

    host = server.host.strip("[]")
    if host.lower() == "localhost":
        return None
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None   # a host name: it may resolve to anything
    if address is not None and address.is_loopback:
        return None
    where = ("on every network interface of this machine" if address is not None and address.is_unspecified
             else f"on {server.host}, an address other machines may reach")
    guard = "" if "api_key" in server.flags else " (server.flags sets no api_key)"
    return (f"server.host {server.host!r}: every server the study starts listens {where}: anyone "
            f"who can reach it can send it requests{guard}, and their load lands inside the "
            "measurements; use 127.0.0.1 unless the server must be reached from another machine")

