"""Pre-flight: what on this machine would stop a study, said before anything of it starts.

A study whose server command is missing used to start Ray, report its GPU groups and only
then fail its first server start (``internal_error: FileNotFoundError``); on a GPU box that
is minutes after the command, and overnight nobody reads it. So ``run``, ``resume``,
``confirm`` and ``validate --preflight`` look first at the few things a study file names
about the machine - the server executable, the model path, the GPUs, the ports - and say
every problem in one line each, naming the field, the value and what to do.

Pure: the facts are gathered by ``tuner.adapters.preflight`` (PATH lookups, the file
system, nvidia-smi, a socket bind); here they are only judged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tuner.study.simulated import is_simulator
from tuner.study.spec import StudySpec
from tuner.vllm.knobs import PYTHON_PLACEHOLDER

__all__ = ["CommandFacts", "HostFacts", "model_path_to_check", "group_count",
           "ports_to_check", "usable_gpus", "problems", "summary", "failure_text"]


@dataclass(frozen=True)
class CommandFacts:
    """The server command's first word as this machine resolves it."""

    word: str                      # as the study file gives it
    path: str | None               # what would be executed: None when nothing was found
    exists: bool = False           # a file is there (it may still not be executable)
    search_path: str | None = None  # the PATH searched (a word without '/'), else None
    path_from_server_env: bool = False  # that PATH is server.env's, not the tuner's
    missing_interpreter: str | None = None  # a '#!' line naming an interpreter that is gone


@dataclass(frozen=True)
class HostFacts:
    """What the adapter found on this machine for one study."""

    command: CommandFacts
    model_exists: bool | None = None    # None: not looked at (not a path, or the simulator)
    gpus: tuple[str, ...] | None = None  # nvidia-smi's GPU names; None: no nvidia-smi
    gpu_error: str | None = None         # nvidia-smi is there but did not answer
    visible_devices: str | None = None   # CUDA_VISIBLE_DEVICES when set
    ports: dict[int, str | None] = field(default_factory=dict)  # port -> why unusable (None: free)
    host_error: str | None = None        # server.host cannot be bound here at all


def model_path_to_check(spec: StudySpec) -> str | None:
    """``server.model`` for the adapter to look up on this machine; None for the simulator,
    which reads no model. Only a model that looks like a path (it starts with ``/``, ``./``,
    ``../`` or ``~``) and is not there is a problem: a hub id (``org/name``) is the server's
    to download."""

    return None if is_simulator(spec.server.command) else spec.server.model


def _looks_like_path(model: str) -> bool:
    return model.startswith(("/", "./", "../", "~"))


def usable_gpus(gpus: Sequence[str] | None, visible_devices: str | None) -> int | None:
    """GPUs a study may use here: nvidia-smi's, narrowed by CUDA_VISIBLE_DEVICES (Ray
    honours it); None without nvidia-smi."""

    if gpus is None:
        return None
    if visible_devices is None:
        return len(gpus)
    return min(len([d for d in visible_devices.split(",") if d.strip()]), len(gpus))


def group_count(spec: StudySpec, gpus: int | None) -> int:
    """GPU groups (parallel trials) the executor will start: ``execution.parallel_trials``,
    else as many as the GPUs hold (one where GPUs are declared, not counted), at most what
    fits and at least one (the ports of one group are checked even when no group fits)."""

    per_trial = spec.server.gpus_per_trial
    fit = None if gpus is None or not per_trial else gpus // per_trial
    wanted = spec.execution.parallel_trials
    if wanted is None:
        wanted = fit if fit is not None else 1
    elif fit is not None:
        wanted = min(wanted, fit)
    return max(1, wanted)


def ports_to_check(spec: StudySpec, gpus: int | None) -> list[int]:
    """The ports the study's servers bind: ``server.port`` plus the group index."""

    return [spec.server.port + g for g in range(group_count(spec, gpus)) if spec.server.port + g <= 65535]


def _command_problem(spec: StudySpec, found: CommandFacts) -> str | None:
    word = found.word
    if word == PYTHON_PLACEHOLDER:
        return None
    if found.missing_interpreter is not None:
        return (f"server.command: {found.path} starts with '#!{found.missing_interpreter}', which does not "
                "exist (a virtual environment moved or deleted?); reinstall it, or name the interpreter "
                "in server.command")
    if found.path is not None:
        return None
    if "/" in word:
        if found.exists:
            return f"server.command: {word!r} is not executable; chmod +x it, or name its interpreter first"
        return f"server.command: {word!r} does not exist; give the path of vLLM's executable or interpreter"
    where = "server.env's PATH" if found.path_from_server_env else "the PATH the server inherits"
    return (f"server.command: {word!r} is not on {where} ({found.search_path or 'empty'}); install it, "
            "give its full path, or activate the environment that has it before `tuner run`")


def _model_problem(spec: StudySpec, facts: HostFacts) -> str | None:
    model = model_path_to_check(spec)
    if model is None or facts.model_exists is not False or not _looks_like_path(model):
        return None
    return (f"server.model: {model!r} does not exist on this machine; copy the model there, fix the path, "
            "or give a hub id (org/name) for the server to download")


def _gpu_problem(spec: StudySpec, facts: HostFacts) -> str | None:
    per_trial = spec.server.gpus_per_trial
    if not per_trial:
        return None
    if facts.gpu_error is not None:
        return (f"server.gpus_per_trial: the study asks for {per_trial} GPU(s) per trial, but nvidia-smi "
                f"failed ({facts.gpu_error}); fix the driver first (run `nvidia-smi`)")
    usable = usable_gpus(facts.gpus, facts.visible_devices)
    if usable is None or usable >= per_trial:
        return None
    assert facts.gpus is not None
    seen = f"nvidia-smi shows {len(facts.gpus)}" + (f" ({_gpu_names(facts.gpus)})" if facts.gpus else "")
    if facts.visible_devices is not None:
        seen += f", CUDA_VISIBLE_DEVICES={facts.visible_devices!r} leaves {usable}"
    return (f"server.gpus_per_trial: {per_trial} GPU(s) per trial, but {seen} on this machine; lower "
            "server.gpus_per_trial (and tensor_parallel_size with it) or run on a box with more GPUs")


def _gpu_names(names: Sequence[str]) -> str:
    kinds: dict[str, int] = {}
    for name in names:
        kinds[name] = kinds.get(name, 0) + 1
    return ", ".join(f"{n} x {name}" for name, n in kinds.items())


def _port_problems(spec: StudySpec, facts: HostFacts) -> list[str]:
    host = spec.server.host
    if facts.host_error is not None:
        return [f"server.host: {host!r} cannot be bound on this machine ({facts.host_error}); use "
                "127.0.0.1 or an address of this machine"]
    out = []
    base = spec.server.port
    for port, why in sorted(facts.ports.items()):
        if why is None:
            continue
        which = "server.port" if port == base else f"server.port + {port - base} (GPU group {port - base})"
        out.append(f"{which}: port {port} on {host} {why}; stop that process, or choose another server.port")
    return out


def problems(spec: StudySpec, facts: HostFacts) -> list[str]:
    """Everything that would stop this study here, one line each; empty when it may start."""

    found = [_command_problem(spec, facts.command), _model_problem(spec, facts), _gpu_problem(spec, facts)]
    return [line for line in found if line is not None] + _port_problems(spec, facts)


def summary(spec: StudySpec, facts: HostFacts) -> str:
    """One line on what was found, for a study that may start."""

    command = facts.command
    if is_simulator(spec.server.command):
        server = "the built-in simulator"
    else:
        server = command.path or command.word
    per_trial = spec.server.gpus_per_trial
    usable = usable_gpus(facts.gpus, facts.visible_devices)
    groups = group_count(spec, usable)
    if not per_trial:
        gpus = "no GPUs asked"
    elif facts.gpus is None:
        # The simulator and vLLM's CPU build run this way: Ray schedules the declared GPUs
        # exactly as real ones (tuner.engine.ray_executor.init_ray).
        gpus = f"no nvidia-smi here, so {per_trial * groups} GPU(s) are declared to Ray, not checked"
    else:
        gpus = f"{_gpu_names(facts.gpus)} for {groups} group(s) of {per_trial}"
    ports = ", ".join(str(p) for p in sorted(facts.ports)) or "none"
    model = "" if facts.model_exists is not True else f"; model {spec.server.model} found"
    return f"server {server}{model}; {gpus}; port(s) {ports} free on {spec.server.host}"


def failure_text(lines: Sequence[str]) -> str:
    """The error for a study that must not start: a head line, then each problem."""

    head = ("the study cannot start on this machine; nothing was started. "
            f"{len(lines)} problem(s) found before any server or Ray:")
    return "\n".join([head, *(f"  {line}" for line in lines)])
