"""The commands that start servers on the study's GPU groups - ``tuner run``, ``resume`` and
``confirm`` (and ``export --confirm``, through ``confirm``) - with the lock, Ray and the
executor around them, and the study file as this host reads it (``load_spec_file``, which the
other commands in ``tuner.commands.main`` share).

Part of the command line (``tuner.commands.main`` parses the arguments and chooses exit codes): each
command returns its exit code.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.errors import SpecError, StudyError, Terminated
from tuner.study.durations import parse_duration

if TYPE_CHECKING:
    from tuner.study.spec import StudySpec

# Each command imports what it needs inside its function (see tuner.commands.main): `tuner status`
# imports this module too and must answer in well under a second.

__all__ = ["say", "load_spec_file", "check_study_inputs", "on_this_host", "confirm", "cmd_run", "cmd_resume",
           "cmd_confirm", "interrupted_line"]


def say(line: str) -> None:
    """Print a progress line. A study outlives its console: when stdout has gone (`tuner run
    ... | head`, a closed `tee`), further lines go to /dev/null and the study runs on - its
    record is the study folder, not the terminal."""

    from tuner.terminal import for_terminal

    try:
        print(for_terminal(line), flush=True)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def load_spec_file(path: str) -> StudySpec:
    from tuner.adapters.artifacts import read_text_bounded
    from tuner.study.study_file import parse_study

    file = Path(path)
    # A study folder's own spec.yaml (a past run's, to validate or run again) may hold keys a
    # study file may no longer set, e.g. the retired template probe's; they are read as saved.
    saved = file.name == "spec.yaml" and any((file.parent / part).exists() for part in ("study.json", "trials"))
    spec = on_this_host(parse_study(read_text_bounded(file), str(file), saved=saved), source=str(file))
    # Prompts files (known answers, reference) are relative to the study file, and read and
    # checked now: a bad file must stop the study before any server starts.
    from tuner.engine.referencing import resolve_probe_files

    spec = spec.model_copy(update={"probe": resolve_probe_files(spec.probe, file.parent.resolve())})
    return resolve_dataset(spec, file.parent.resolve(), source=str(file))


def resolve_dataset(spec: StudySpec, base_dir: Path, *, source: str) -> StudySpec:
    """``spec`` with its dataset path made absolute against ``base_dir`` (the study file's
    folder, so workers elsewhere find it), the file read and checked now: a missing file, a bad
    line or a dataset the sweep cannot send stops the study before any server starts. Says the
    format it read (and that it was detected, for ``auto``)."""

    from tuner.load.dataset import DatasetError
    from tuner.load.dataset_draw import unsupported
    from tuner.load.dataset_file import FIELD, read_dataset
    from tuner.load.trace_spec import trace_problem, trace_text

    workload = spec.load.workload
    if workload.dataset is None:
        return spec
    dataset_source = workload.dataset.model_copy(
        update={"path": str((base_dir / os.path.expanduser(workload.dataset.path)).resolve())})
    try:
        dataset = read_dataset(dataset_source)
    except DatasetError as exc:
        raise SpecError(f"{source}: {FIELD}: {exc}") from None
    open_loop = bool(spec.load.request_rates) or spec.searches_max_rate
    if problem := unsupported(dataset, spec.load.api, open_loop=open_loop):
        raise SpecError(f"{source}: {FIELD}: {problem}")
    if spec.load.trace is not None and (
            problem := trace_problem(dataset, spec.load.trace, max_level_seconds=spec.load.max_level_seconds)):
        raise SpecError(f"{source}: {problem}")
    how = "detected" if dataset.detected else "as named"
    say(f"[dataset] {dataset_source.path}: {len(dataset):,} entries, format {dataset.format} ({how})")
    if spec.load.trace is not None:
        say(f"[dataset] {trace_text(dataset, spec.load.trace)}")
    load = spec.load.model_copy(update={"workload": workload.model_copy(update={"dataset": dataset_source})})
    return spec.model_copy(update={"load": load})


def check_study_inputs(spec: StudySpec, source: str, *, energy_here: bool = True) -> str:
    """Before any server starts: every flag, config field and variable the study names must
    exist in its vLLM (tuner.vllm.argument_names), else SpecError naming each with the closest
    names; doubtful names and a server listening beyond loopback are printed as warnings.
    ``energy_here``: the trials run on this machine, whose energy counter an energy objective
    needs (not on a Ray cluster, nor in a dry run: the simulator has its own).
    Returns where the names were checked against (the recording or the vLLM asked)."""

    from tuner.adapters.vllm_arguments import arguments_for, study_targets
    from tuner.engine.trial_energy import energy_refusal
    from tuner.study.server_spec import exposure_warning
    from tuner.study.spec import dummy_weights_warning
    from tuner.vllm.argument_names import check_names

    known = arguments_for(spec.server, progress=say)
    problems = check_names(study_targets(spec), known)
    errors = [f"{source}: {p}" for p in problems if p.error]
    if errors:
        raise SpecError("\n".join(errors + [f"{source}: (names checked against {known.source})"]))
    if energy_here and (refusal := energy_refusal(spec)):
        raise SpecError(f"{source}: {refusal}")
    for problem in problems:
        say(f"[warning] {source}: {problem}")
    for warning in (exposure_warning(spec.server), dummy_weights_warning(spec)):
        if warning:
            say(f"[warning] {source}: {warning}")
    return known.source


def on_this_host(spec: StudySpec, *, source: str | None = None) -> StudySpec:
    """``spec`` with its paths as this machine names them: ``execution.compile_cache_dir``
    with ``~`` and ``$VARS`` expanded from this process's environment. The study file and
    the spec model keep what the user wrote; only here, where the study is run, is the
    environment read."""

    from tuner.vllm.compile_cache import expand_cache_dir

    raw = spec.execution.compile_cache_dir
    if raw is None:
        return spec
    try:
        path = expand_cache_dir(raw, os.environ, str(Path.home()))
    except ValueError as exc:
        where = f"{source}: " if source else ""
        raise SpecError(f"{where}execution.compile_cache_dir: {exc}") from exc
    execution = spec.execution.model_copy(update={"compile_cache_dir": path})
    return spec.model_copy(update={"execution": execution})


def _with_secrets(spec: StudySpec) -> StudySpec:
    """``spec`` with every secret given as ``${NAME}`` read from this process's environment:
    what a study saves holds references only, so a resumed study (and one whose file uses
    references) gets its secrets here, where it runs (docs/study-file.md, Secrets)."""

    from tuner.secrets import resolve_server

    try:
        return spec.model_copy(update={"server": resolve_server(spec.server, os.environ)})
    except ValueError as exc:
        raise SpecError(str(exc)) from None


def check_host_steadiness(paths: Any, seconds: float, noise_floor: float | None) -> dict[str, Any]:
    """`tuner host-check` for a study: the CPUs' own spread measured while nothing of the study
    runs, printed, and appended to host-check.json (one entry per run and resume: a resumed
    study may run on another day's host). A floor below it is a warning, not an error: the
    study still ranks within its intervals, they are only narrower than the host's noise."""

    import time

    from tuner.adapters import host_probe
    from tuner.adapters.artifacts import atomic_write_json, read_json
    from tuner.load.host_steadiness import summarize

    cpus = host_probe.default_cpus()
    say(f"[host] timing CPU work on CPUs {','.join(map(str, cpus))} for {seconds:g} s before any server "
        f"starts (load.host_check_s)")
    series, steal = host_probe.measure(cpus, seconds)
    host = summarize(series, steal)
    worst = host.worst_cv_5s
    below = worst is not None and noise_floor is not None and noise_floor < worst
    for line in host.verdict(noise_floor):
        say(f"[warning] {line}" if below and line.startswith("load.noise_floor") else f"[host] {line}")
    entry = {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "seconds": seconds, **host.to_dict(),
             "noise_floor": noise_floor, "floor_below_host": below}
    history = read_json(paths.host_check_json, list) or []
    atomic_write_json(paths.host_check_json, [*history, entry])
    return entry


def preflight(spec: StudySpec, *, cluster: bool) -> None:
    """Refuse a study this machine cannot run, before Ray or any server starts: the server
    executable, the model path, the GPUs and the ports (tuner.study.preflight), every problem
    on its own line. On a Ray cluster they are the nodes' to have, not this machine's."""

    from tuner.adapters.preflight import gather
    from tuner.study.preflight import failure_text, problems, summary

    if cluster:
        say("[preflight] on a Ray cluster (--ray-address) the server command, model, GPUs and ports are "
            "the nodes': not checked here")
        return
    facts = gather(spec)
    found = problems(spec, facts)
    if found:
        raise StudyError(failure_text(found))
    say(f"[preflight] {summary(spec, facts)}")


@contextlib.contextmanager
def _locked_study(handle: Any, *, budget: tuple[int | None, float | None] | None = None) -> Iterator[None]:
    """The study held by this run for as long as the block runs: its storage's lock (read
    first: tuner.store.storage_lock), its folder's lock, then what a run writes before it
    starts - a new study's files, a lost storage rebuilt, the run's marker in the storage,
    ``budget`` (--n-trials, --timeout) kept for later resumes. Nothing is written before
    both locks are held: a refused command leaves every file as it was."""

    from tuner.engine.runfile import clean_up_previous_run
    from tuner.store.folder import restore_storage
    from tuner.store.handle import StudyLock, remember_budget, write_new_study
    from tuner.store.storage_lock import StorageLock

    with StorageLock(handle.storage_url, handle.name, handle.paths.root) as storage_lock, \
            StudyLock(handle.paths):
        write_new_study(handle)
        rebuilt = restore_storage(handle, progress=say)
        if rebuilt:
            say(f"[resume] the study storage was missing: rebuilt it from the trial files ({rebuilt} "
                f"trials); new trials continue after them")
        storage_lock.hold([o.direction for o in handle.spec.objectives])
        if budget is not None and (warning := remember_budget(handle.paths, n_trials=budget[0],
                                                              timeout_s=budget[1])):
            say(f"[warning] {warning}")
        stale = clean_up_previous_run(handle.paths.root)
        if stale:
            say(f"[resume] stopped {len(stale)} process(es) left by an earlier, killed run")
        yield


@contextlib.contextmanager
def _study_executor(handle: Any, args: argparse.Namespace, *, check_host: bool = False,
                    checked: bool = False, profile: bool = False) -> Iterator[Any]:
    """Ray and a started executor for as long as the block runs, inside ``_locked_study``;
    every server, worker and the local Ray runtime are stopped after it, whatever happens.
    ``check_host``: the study's host check first (load.host_check_s), before anything of
    ours runs beside it. ``checked``: the pre-flight already ran (a new study's, before its
    folder was made); otherwise it runs once the lock is held and an earlier run's leftover
    servers are gone (they would hold the study's own ports). ``profile``: the workload's
    profile written (workload.json) once the environment holds."""

    from tuner.engine.ray_executor import RayExecutor, init_ray
    from tuner.engine.runfile import clear_run, record_run

    handle.spec = _with_secrets(handle.spec)
    spec = handle.spec
    allow_change = getattr(args, "allow_environment_change", False)
    cluster = getattr(args, "ray_address", None) is not None
    if not checked:
        preflight(spec, cluster=cluster)
    pinned = _check_environment(handle, allow_change=allow_change, cluster=cluster)
    if profile:
        write_workload_profile(handle)
    if check_host and spec.load.host_check_s:
        check_host_steadiness(handle.paths, spec.load.host_check_s, spec.load.noise_floor)
    groups = spec.execution.parallel_trials
    declared = spec.server.gpus_per_trial * (groups or 1)
    ours = signal.getsignal(signal.SIGTERM)
    try:
        init_ray(address=args.ray_address, gpus_needed=declared,
                 cpus_needed=spec.server.cpus_per_trial * (groups or 1))
    finally:
        # ray.init makes SIGTERM exit the driver at once; it stops this run cleanly instead.
        signal.signal(signal.SIGTERM, ours)
    record_run(handle.paths.root, local_ray=args.ray_address is None)
    # On a cluster every node is judged too, before its group gets a trial; on one
    # machine the check above already covers the workers.
    node_check: dict[str, Any] = {} if not cluster else {
        "server": spec.server.model_dump(mode="json"),
        "accept": lambda info: _node_refusal(info, pinned, allow_change=allow_change, names_energy=spec.names_energy)}
    executor = RayExecutor(gpus_per_trial=spec.server.gpus_per_trial,
                           cpus_per_trial=spec.server.cpus_per_trial, groups=groups, progress=say,
                           **node_check)
    try:
        executor.start()
        yield executor
    finally:
        executor.shutdown()
        import ray

        ray.shutdown()
        clear_run(handle.paths.root)


def _check_environment(handle: Any, *, allow_change: bool, cluster: bool) -> dict[str, Any]:
    """Refuse to add measurements from another environment to the study's (another vLLM,
    driver, GPU, CPU or model: tuner.study.environment); pin it on the first run. Returns
    the pinned environment."""

    from tuner.adapters.environment import current_environment
    from tuner.store.handle import pin_environment
    from tuner.study.environment import summary

    now = current_environment(handle.spec.server, cluster=cluster)
    if (source := handle.spec.load.workload.dataset) is not None:
        # the requests are part of what the numbers mean: another file is another measurement
        from tuner.load.dataset import dataset_digest
        from tuner.load.dataset_file import read_dataset_bytes

        # The bytes are what is pinned: the file was parsed and checked when the study loaded.
        now["dataset"] = dataset_digest(read_dataset_bytes(source))
    changed = pin_environment(handle.paths, now, allow_change=allow_change, name=handle.name)
    if changed:
        say(f"[warning] the environment changed since this study's first run: {'; '.join(changed)}; "
            "continuing as --allow-environment-change asks (recorded in study.json)")
    else:
        say(f"[environment] {summary(now)}")
    pinned, _ = handle.paths.environment()
    return pinned or now


def write_workload_profile(handle: Any) -> None:
    """The workload this run measures (tuner.load.workload_profile) into the study's
    workload.json, for status and the report, and its gist printed. The dataset is read again
    here: the study file's reading only checked it, and the bytes were just pinned."""

    from tuner.adapters.artifacts import atomic_write_json
    from tuner.errors import ArtifactWriteError
    from tuner.load.dataset_file import read_dataset
    from tuner.load.workload_profile import profile_workload
    from tuner.views.workload_view import workload_lines

    workload = handle.spec.load.workload
    dataset = None if workload.dataset is None else read_dataset(workload.dataset)
    profile = profile_workload(workload, dataset).to_dict()
    try:
        atomic_write_json(handle.paths.workload_json, profile)
    except ArtifactWriteError as err:
        # A description for status and the report: a full disk must not stop the run over it
        # (the run itself says what it could not keep, trial by trial).
        say(f"[warning] workload.json not written ({err.reason}): {err}; status and the report "
            "will not describe the workload")
    for line in workload_lines(profile):
        say(f"[workload] {line.strip()}")


def _node_refusal(info: dict[str, Any], pinned: dict[str, Any], *, allow_change: bool,
                  names_energy: bool = False) -> str | None:
    """Why a cluster node's trial worker must not run this study's trials: its environment
    differs from the pinned one (each change named), or could not be read, or - in a study
    with an energy objective or limit (``names_energy``) - it cannot read an energy counter,
    so every trial there would end without its objective. With --allow-environment-change
    a differing node is only named."""

    from tuner.study.environment import differences

    env = info.get("environment")
    if env is None:
        return f"its environment could not be read ({info.get('environment_error', 'no answer')})"
    if names_energy and info.get("energy_unavailable"):
        return ("the study names an energy objective or limit, and this node cannot read an energy counter: "
                f"{info['energy_unavailable']}")
    changed = differences(pinned, env)
    if not changed:
        return None
    if allow_change:
        say(f"[warning] group {info.get('group')} on {info.get('host')} runs in another environment: "
            f"{'; '.join(changed)}; used as --allow-environment-change asks")
        return None
    return ("another environment than the study's: " + "; ".join(changed)
            + " (a study mixes no environments; --allow-environment-change to use it anyway)")


def _run_study(handle: Any, args: argparse.Namespace, *, n_trials: int | None, timeout_s: float | None,
               checked: bool = False) -> int:
    from tuner.adapters.artifacts import saved_budget
    from tuner.engine.orchestrator import Orchestrator
    from tuner.store.handle import read_study_json
    from tuner.views.status import build_status, format_status

    # A secret missing from this environment is bad input, said before anything is locked or
    # written, also when the study turns out to have nothing left to do. (Resolved again,
    # and only then kept, where the servers are started: the saved spec holds references.)
    _with_secrets(handle.spec)
    try:
        # --n-trials/--timeout given now are kept for later resumes and for `tuner status`;
        # without them, those given last time apply (then the study file's budget).
        with _locked_study(handle, budget=(n_trials, timeout_s)):
            saved_trials, saved_timeout = saved_budget(read_study_json(handle.paths))
            n_trials = n_trials or saved_trials or handle.spec.budget.n_trials
            timeout_s = timeout_s if timeout_s is not None else saved_timeout
            if (finished := _nothing_to_do(handle, n_trials, timeout_s)) is not None:
                say(finished)
                return 0
            # This run's ports only: the saved spec keeps the study file's (an export, a
            # later run of the same file).
            handle.spec = _with_port(handle.spec, getattr(args, "port", None))
            with _study_executor(handle, args, check_host=True, checked=checked, profile=True) as executor:
                orchestrator = Orchestrator(handle, executor, n_trials=n_trials, timeout_s=timeout_s,
                                            progress=say)
                say(f"study {handle.name}: {orchestrator.n_trials} trials on {executor.n_groups} GPU "
                    f"group(s); results in {handle.paths.root}")
                summary = orchestrator.run()
    except Terminated:
        # Before the trial loop (Ray starting, the host check) or a second SIGTERM in it.
        say(interrupted_line(handle.name, "SIGTERM"))
        return 143
    study = handle.load()
    say("")
    status = build_status(handle, study)
    say(format_status(status, verbose=False))
    say(f"\npareto front written to {handle.paths.pareto_json}")
    if summary.stopped_because == "interrupted":
        say(interrupted_line(handle.name, orchestrator.stopped_by))
        return 143 if orchestrator.stopped_by == "SIGTERM" else 130
    if not status["front"]:
        # A script must not take "ran" for "found a configuration".
        print(f"error: study {handle.name} has no feasible configuration: every trial failed or was "
              f"infeasible (see `tuner status {handle.name}`)", file=sys.stderr)
        return 4
    return 0


def confirm(handle: Any, args: argparse.Namespace, trials: list[int], *, repeats: int,
             tolerance: float | None) -> list[Any]:
    """Re-run ``trials`` on the study's GPU groups (the reference first, if it must be
    recorded); their verdicts, also written to confirm/ and pareto.json."""

    from tuner.engine.confirming import confirm_trials
    from tuner.engine.orchestrator import Orchestrator, restore_signals

    with _locked_study(handle), _study_executor(handle, args) as executor:
        orchestrator = Orchestrator(handle, executor, progress=say)
        study = orchestrator.open_study()
        previous = orchestrator.catch_stop_signals()
        try:
            if not orchestrator.prepare_reference():
                verdicts = []
            else:
                verdicts = confirm_trials(orchestrator.job_host(), study, trials, repeats=repeats,
                                          tolerance=tolerance)
        finally:
            restore_signals(previous)
            orchestrator.write_pareto(study)
    if orchestrator.interrupted:
        raise Terminated if orchestrator.stopped_by == "SIGTERM" else KeyboardInterrupt
    return verdicts


def interrupted_line(name: str, signal_name: str | None) -> str:
    """What a stopped run says last: what stopped it and what to run next."""

    how = "by SIGTERM" if signal_name == "SIGTERM" else "by Ctrl-C"
    return f"interrupted {how}; run `tuner resume {name}` to continue"


def _nothing_to_do(handle: Any, n_trials: int, timeout_s: float | None) -> str | None:
    """What a run of a finished study says instead of starting anything: its trial budget
    reached or its wall-clock budget spent, no trial left running by a killed run, the
    confirmation re-runs and tie runs done. None while there is work."""

    import optuna

    from tuner.store.handle import make_storage
    from tuner.store.records import read_records
    from tuner.study import policy
    from tuner.study.confirmation import choose_candidates
    from tuner.study.durations import format_duration
    from tuner.study.trials import record_points

    try:
        study = optuna.load_study(study_name=handle.name, storage=make_storage(handle.storage_url))
    except KeyError:
        return None
    records = read_records(study)
    finished = policy.finished_runs(records)
    spent = timeout_s is not None and float(study.user_attrs.get("elapsed_s", 0.0)) >= timeout_s
    if any(r.state == "RUNNING" for r in records) or (finished < n_trials and not spent):
        return None
    cfg, spec, paths = handle.spec.confirm, handle.spec, handle.paths
    if not spent:   # a run out of time skips them (`tuner confirm` runs them)
        chosen = choose_candidates(record_points(records, [o.label for o in spec.objectives]),
                                   [o.direction for o in spec.objectives], cfg.candidates)
        if any(n not in paths.confirmations() for n in chosen):
            return None
        if cfg.tie_runs > 0 and not (paths.confirm_root / "ties.json").exists():
            return None
    name = handle.name
    if spent and timeout_s is not None:
        why = f"its wall-clock budget of {format_duration(timeout_s)} is spent"
        more = f"`tuner resume {name} --timeout {format_duration(2 * timeout_s)}`"
    else:
        why = f"{finished}/{n_trials} trials finished"
        more = f"`tuner resume {name} --n-trials {n_trials + max(n_trials, 1)}`"
    return (f"study {name} has nothing to do: {why}. To run more: {more}; to see its results: "
            f"`tuner status {name}`, `tuner report {name}`")


def _with_port(spec: StudySpec, port: int | None) -> StudySpec:
    """``spec`` with its servers on ``port`` (GPU group k on port + k), as --port asks."""

    if port is None:
        return spec
    return spec.model_copy(update={"server": spec.server.model_copy(update={"port": port})})


def _check_port(port: int | None) -> None:
    if port is not None and not 1 <= port <= 65535:
        raise SpecError(f"--port: {port} is not allowed; give a TCP port from 1 to 65535 "
                        "(GPU group k of the study listens on PORT+k)")


def cmd_confirm(args: argparse.Namespace) -> int:
    from tuner.store.handle import open_existing
    from tuner.store.records import read_records
    from tuner.study.confirmation import choose_candidates
    from tuner.study.trials import record_points

    handle = open_existing(Path(args.results), args.name, storage_url=args.storage)
    handle.spec = on_this_host(handle.spec, source=str(handle.paths.spec_yaml))
    cfg = handle.spec.confirm
    repeats = args.repeats or cfg.repeats
    tolerance = args.tolerance if args.tolerance is not None else cfg.tolerance
    if tolerance is not None and not 0 < tolerance < 1:
        raise SpecError(f"--tolerance: {tolerance} is not allowed; give a fraction between 0 and 1, e.g. 0.1")
    study = handle.load()
    records = read_records(study)
    if args.rejudge:
        from tuner.engine.confirming import rejudge
        from tuner.engine.pareto_file import write_pareto_file
        from tuner.views.saved_spec import study_noise_at

        verdicts = rejudge(handle.paths, handle.spec, records, list(dict.fromkeys(args.trial)),
                           tolerance=tolerance, progress=say)
        labels = [o.label for o in handle.spec.objectives]
        write_pareto_file(handle.paths, handle.name, records, labels, [o.direction for o in handle.spec.objectives],
                          study_noise_at(handle.paths, records, labels), say)
        return 0 if verdicts and all(v.verdict == "reproduced" for v in verdicts) else 1
    if args.trial:
        trials = list(dict.fromkeys(args.trial))
        measured = sorted(r.number for r in records if r.values and r.measured_values() == r.values)
        for trial in trials:
            if trial not in measured:
                raise SpecError(f"--trial: {trial} is not a measured trial of {handle.name}; "
                                f"measured trials: {', '.join(map(str, measured)) or 'none'}")
    else:
        labels = list(study.metric_names or [])
        directions = [d.name.lower() for d in study.directions]
        trials = choose_candidates(record_points(records, labels), directions,
                                   args.candidates or max(cfg.candidates, 1))
        if not trials:
            raise StudyError(f"study {handle.name} has no feasible trial to confirm")
    say(f"confirming trial(s) {', '.join(map(str, trials))} of {handle.name}: {repeats} re-run(s) each, "
        f"tolerance {'from the study noise' if tolerance is None else format(tolerance, '.0%')}")
    verdicts = confirm(handle, args, trials, repeats=repeats, tolerance=tolerance)
    return 0 if verdicts and all(v.verdict == "reproduced" for v in verdicts) else 1


def _option_duration(text: str | None, option: str) -> float | None:
    """A duration given on the command line, in seconds: finite and above zero."""

    if text is None:
        return None
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise SpecError(f"{option}: {exc}") from None
    if not 0 < seconds < float("inf"):
        raise SpecError(f"{option}: {text!r} is not allowed; give a duration above zero such as 8h")
    return seconds


def cmd_run(args: argparse.Namespace) -> int:
    from tuner.adapters.artifacts import StudyPaths
    from tuner.store.handle import create_or_open

    spec = load_spec_file(args.file)
    check_study_inputs(spec, args.file, energy_here=getattr(args, "ray_address", None) is None)
    timeout_s = _option_duration(args.timeout, "--timeout")
    _check_port(args.port)
    # A new study is checked before its folder exists: a folder made for a study that could
    # not start would hold the old spec, and the corrected file would then be refused as
    # "a different spec". Written only once the run holds the study (_locked_study).
    new = not StudyPaths.of(Path(args.results), args.study or spec.name).study_json.exists()
    if new:
        preflight(_with_port(spec, args.port), cluster=args.ray_address is not None)
    handle = create_or_open(spec, Path(args.results), name=args.study, storage_url=args.storage, write=False)
    return _run_study(handle, args, n_trials=args.n_trials, timeout_s=timeout_s, checked=new)


def cmd_resume(args: argparse.Namespace) -> int:
    from tuner.store.handle import open_existing

    handle = open_existing(Path(args.results), args.name, storage_url=args.storage)
    handle.spec = on_this_host(handle.spec, source=str(handle.paths.spec_yaml))
    timeout_s = _option_duration(args.timeout, "--timeout")
    _check_port(args.port)
    return _run_study(handle, args, n_trials=args.n_trials, timeout_s=timeout_s)
