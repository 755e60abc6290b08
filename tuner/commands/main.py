"""The `tuner` command line: the only place that parses arguments, configures logging,
prints and chooses exit codes (with ``tuner.commands.run``: the commands that start servers -
run, resume, confirm - and the study file as this host reads it).

Exit codes: 0 done, 1 unexpected error, 2 invalid input (study file, arguments),
3 the study cannot run (locked, missing, mismatched, a pre-flight problem on this machine),
4 the study ran but has no feasible configuration (every trial failed or was infeasible),
130 interrupted by Ctrl-C, 143 by SIGTERM (both resumable).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner import __version__
from tuner.commands.run import check_study_inputs, cmd_confirm, cmd_resume, cmd_run, confirm, load_spec_file, say
from tuner.errors import SpecError, StudyError, Terminated, TunerError
from tuner.study.durations import format_duration
from tuner.terminal import for_terminal

if TYPE_CHECKING:
    from tuner.study.spec import StudySpec

# Each command imports what it needs inside its function: `tuner status` must answer in well
# under a second, and importing Optuna (SQLAlchemy, Alembic, NumPy) and the pydantic spec
# models costs about 0.3 s before any work is done.

__all__ = ["main"]

DEFAULT_RESULTS = Path("results")


# -- validate ---------------------------------------------------------------------


def _command_text(spec: StudySpec, values: dict[str, Any]) -> str:
    from tuner.secrets import public_spec
    from tuner.study.space import trial_command
    from tuner.vllm.knobs import RenderedCommand, shell_line

    # What a trial starts: the measurement env (NCCL_DEBUG to read NCCL's choices back) too;
    # secrets as the references they are everywhere the tuner writes.
    command = trial_command(public_spec(spec), values, python="python")
    return shell_line(RenderedCommand(command.argv, command.launch_env))


def cmd_validate(args: argparse.Namespace) -> int:
    from tuner.study import space

    spec = load_spec_file(args.file)
    names_from = check_study_inputs(spec, args.file)
    # Counting walks the space point by point (~60 us each): a few seconds at most here.
    size, continuous, exact = space.discrete_size(spec, cap=100_000)
    say(f"{args.file}: valid study {spec.name!r}")
    say(f"names checked against {names_from}")
    say(f"server: {' '.join(spec.server.command)} --model {spec.server.model} "
        f"({spec.server.gpus_per_trial} GPUs per trial, {spec.server.host}:{spec.server.port})")
    say("")
    say("parameters (condition tree):")
    for line in space.condition_tree(spec).splitlines():
        say("  " + line)
    if spec.forbidden:
        say("forbidden combinations:")
        for rule in spec.forbidden:
            cond = ", ".join(f"{k} in {v}" if isinstance(v, list) else f"{k} = {v}" for k, v in rule.when.items())
            say(f"  - {cond}: {rule.reason}")
    bound = "" if exact else " (at least; enumeration stopped)"
    cont = f", plus {continuous} continuous parameter(s)" if continuous else ""
    say(f"discrete space: {size} allowed point(s){bound}{cont}")
    say("objectives: " + ", ".join(f"{o.label} ({o.direction})" for o in spec.objectives))
    if spec.limits:
        say("limits: " + ", ".join(l.label for l in spec.limits))
    say(f"load: concurrency {list(spec.load.concurrency)}, api {spec.load.api}")
    if spec.load.request_rates:
        say(f"open-loop levels: {list(spec.load.request_rates)} requests/s ({spec.load.arrival})")
    if spec.slo is not None:
        say(f"slo: {spec.slo.text()} (goodput at every level)")
    if spec.searches_max_rate:
        rs = spec.load.rate_search
        say(f"max_rate@slo: searched in [{rs.low:g}, {rs.high:g}] requests/s to {rs.precision:.0%} "
            f"in at most {rs.max_levels} rate levels per trial ({spec.load.arrival} arrivals, "
            f"{spec.load.rate_duration_s:g} s levels)")
    timeout = f", wall-clock limit {format_duration(spec.budget.timeout)}" if spec.budget.timeout else ""
    say(f"budget: {spec.budget.n_trials} trials{timeout}, {format_duration(spec.budget.trial_timeout)} per trial")
    say("")
    baseline = space.baseline_values(spec)
    say("baseline trial: " + (" ".join(f"{k}={_fmt(v)}" for k, v in baseline.items()) or "(server defaults)"))
    say("  " + _command_text(spec, baseline))
    for i, start in enumerate(space.starting_point_values(spec)):
        say(f"starting point {i}: " + (" ".join(f"{k}={_fmt(v)}" for k, v in start.items()) or "(server defaults)"))
    point = space.random_values(spec, random.Random(args.seed))
    say(f"random point (seed {args.seed}): " + (" ".join(f"{k}={_fmt(v)}" for k, v in point.items()) or "(none)"))
    say("  " + _command_text(spec, point))
    if args.preflight:
        from tuner.commands.run import preflight

        say("")
        preflight(spec, cluster=False)
    return 0


def _fmt(value: Any) -> str:
    return "unset" if value is None else str(value)


# -- status / export --------------------------------------------------------------


def cmd_status(args: argparse.Namespace) -> int:
    from tuner.views.status import format_status, status_from_folder

    # The default SQLite file is read without Optuna; any other storage, a folder without
    # one, or anything unexpected takes the full path (which reports errors as it always has).
    status = None if args.storage is not None else status_from_folder(Path(args.results), args.name)
    if status is None:
        from tuner.store.folder import open_for_reading
        from tuner.views.status import build_status

        _quiet_optuna(args)
        # Status shows a study whose spec.yaml was edited, and says so; the others refuse it.
        handle = open_for_reading(Path(args.results), args.name, storage_url=args.storage, edited_spec_ok=True)
        status = build_status(handle, handle.load())
    if args.json:
        say(json.dumps(status, indent=2, default=str))
    else:
        say(format_status(status, verbose=not args.brief))
    return 0


def _check_export(handle: Any, record: Any, args: argparse.Namespace) -> int:
    """Parse every flag-carrying export format with vLLM's own parser; 0 when all pass."""

    from tuner.views.export import render_export
    from tuner.views.export_check import argv_from_export, check_arguments, env_from_export, vllm_python_for

    spec = handle.spec
    python = vllm_python_for(spec, args.vllm_python)
    model_here = Path(spec.server.model).exists()
    build = model_here and not args.no_engine_config
    say(f"checking trial {record.number} with {python} "
        f"({'parser + engine config' if build else 'parser + engine arguments only'}"
        f"{'' if model_here else '; the model is not on this machine'})")
    exported_env = json.loads(render_export(spec, handle.name, record, "json"))["env"]
    # Secrets are exported as ${NAME} references; the check runs without them.
    env = {k: v for k, v in exported_env.items() if not v.startswith("${")}
    formats = ("shell", "json", "systemd", "yaml")
    argvs, temps = [], []
    for fmt in formats:
        argv, temp = argv_from_export(fmt, render_export(spec, handle.name, record, fmt), spec)
        argvs.append(argv)
        temps.append(temp)
    try:
        results = check_arguments(python, argvs, env=env, build_engine=build)
    finally:
        for temp in temps:
            if temp is not None:
                temp.unlink(missing_ok=True)
    # The env format carries no flags, only the environment every check above ran with:
    # it must read back to exactly that environment.
    env_file = env_from_export(render_export(spec, handle.name, record, "env"))
    formats += ("env",)
    results.append((True, f"same {len(env_file)} variable(s) as the formats above")
                   if env_file == exported_env else
                   (False, f"reads back as {env_file}, the other formats set {exported_env}"))
    failed = 0
    for fmt, (ok, message) in zip(formats, results):
        failed += not ok
        say(f"  {fmt:<8} {'ok  ' if ok else 'FAIL'} {message if ok else ''}")
        if not ok:
            for line in message.splitlines():
                say(f"           {line}")
    return 1 if failed else 0


def cmd_export(args: argparse.Namespace) -> int:
    from tuner.adapters.artifacts import atomic_write_text
    from tuner.store.folder import open_for_reading
    from tuner.store.records import read_records
    from tuner.store.spec_guard import check_measured_command
    from tuner.study.pareto import check_pick, parse_filter
    from tuner.views.export import ExportError, choose_record, noise_notes, render_export

    if args.output:
        _check_output_file(args.output)
    handle = open_for_reading(Path(args.results), args.name, storage_url=args.storage)
    study = handle.load()
    labels = list(study.metric_names or [])
    directions = [d.name.lower() for d in study.directions]
    try:
        if args.pick is not None:
            check_pick(args.pick, labels)
        filters = [parse_filter(text) for text in args.where]
        from tuner.views.saved_spec import noisy_records

        records = noisy_records(handle.paths, read_records(study), labels)
        record = choose_record(records, labels, directions, trial=args.trial,
                               pick=args.pick, filters=filters, force=args.force,
                               # --confirm --trial N re-checks N now: its last verdict is not the judge.
                               confirmations={} if args.confirm and args.trial is not None
                               else handle.paths.confirmations())
        # The command printed must be the one the trial ran, whatever spec.yaml says now.
        check_measured_command(handle.paths, handle.spec, record.number)
        if args.confirm:
            # Re-run the chosen point on a fresh server now; export it only if it holds up.
            if not handle.paths.sqlite.exists() and args.storage is None:
                raise ExportError(f"--confirm needs the study's storage; {handle.paths.root} has trial "
                                  "files only (a copied study). Re-run the exported command and measure "
                                  "it with `tuner measure` instead")
            cfg = handle.spec.confirm
            say(f"confirming trial {record.number} before export: {cfg.repeats} re-run(s), "
                f"tolerance {'from the study noise' if cfg.tolerance is None else format(cfg.tolerance, '.0%')}")
            verdicts = confirm(handle, args, [record.number], repeats=cfg.repeats, tolerance=cfg.tolerance)
            if not verdicts:
                raise ExportError(f"the confirmation of trial {record.number} did not finish")
            if verdicts[0].verdict != "reproduced" and not args.force:
                _error(f"trial {record.number} did not reproduce ({verdicts[0].reason}); "
                       "nothing exported (use --force to export it anyway)")
                return 1
        from tuner.study.environment import environment_for

        text = render_export(handle.spec, handle.name, record, args.format,
                             noise_notes(records, labels, directions, record),
                             handle.paths.probe_agreement(record.number, record.summary),
                             environment_for(record.number, *handle.paths.environment()),
                             handle.paths.dry_run_of())
        if args.check:
            return _check_export(handle, record, args)
    except (ExportError, ValueError) as exc:
        _error(str(exc))
        return 2
    if args.output:
        atomic_write_text(Path(args.output), text)
        print(f"wrote {args.output} (trial {record.number})", file=sys.stderr)
    else:
        # Byte for byte into a file or a pipe; a terminal sees control characters escaped.
        sys.stdout.write(for_terminal(text) if sys.stdout.isatty() else text)
    return 0


def _check_output_file(output: str) -> None:
    """-o names a file to write: not a folder, and in a folder that exists."""

    path = Path(output)
    if path.is_dir() or output.endswith("/") or not path.name:
        raise SpecError(f"-o {output}: is a folder; give a file name, e.g. -o {Path(output) / 'export.txt'}")
    if not path.parent.is_dir():
        raise SpecError(f"-o {output}: the folder {path.parent} does not exist")


def cmd_report(args: argparse.Namespace) -> int:
    from tuner.store.folder import open_for_reading
    from tuner.study.pareto import check_pick
    from tuner.views.report import write_report

    handle = open_for_reading(Path(args.results), args.name, storage_url=args.storage)
    try:
        check_pick(args.pick, [o.label for o in handle.spec.objectives])
    except ValueError as exc:
        raise SpecError(f"--pick: {exc}") from None
    out_dir = Path(args.output) if args.output else handle.paths.root / "report"
    paths = write_report(handle, out_dir, pick=args.pick)
    for path in paths.values():
        say(f"wrote {path}")
    if args.markdown:
        say("")
        say(paths["report.md"].read_text())
    return 0


# -- measure ----------------------------------------------------------------------


def cmd_measure(args: argparse.Namespace) -> int:
    """Run a study file's load profile (and with --probe its probe) against a running server."""

    from tuner.engine.measure import MeasureError, files_in_the_way, format_summary, measure, study_headers

    spec = load_spec_file(args.file)
    if args.output:
        out_dir = Path(args.output)
        in_the_way = files_in_the_way(out_dir)
        if in_the_way and not args.force:
            shown = ", ".join(in_the_way[:6]) + (f" and {len(in_the_way) - 6} more" if len(in_the_way) > 6 else "")
            raise SpecError(f"-o {args.output}: holds {shown} (a trial's or an earlier measurement's files), "
                            "which this measurement would overwrite; give a new folder, or --force to "
                            "overwrite them")
    else:
        # One folder per run, so measuring the same server twice keeps both.
        stamp = time.strftime("%Y%m%d-%H%M%S")
        out_dir = Path(args.results) / spec.name / "measure" / stamp
    try:
        summary = measure(args.url, spec, probe=args.probe, out_dir=out_dir, headers=study_headers(spec, os.environ))
    except MeasureError as exc:
        _error(str(exc))
        return 3
    say(format_summary(summary))
    # Numbers a trial would not be scored on: written, shown, and not passed as a result.
    for problem in summary["problems"]:
        print(f"tuner measure: {problem}", file=sys.stderr)
    return 4 if summary["problems"] else 0


# -- host-check -------------------------------------------------------------------


def _parse_cpus(text: str) -> list[int]:
    import os

    allowed = sorted(os.sched_getaffinity(0))
    try:
        cpus = sorted({int(word) for word in text.split(",") if word.strip()})
    except ValueError:
        cpus = []
    if not cpus or not set(cpus) <= set(allowed):
        raise SpecError(f"--cpus: {text!r} is not a comma-separated list of usable CPUs "
                        f"(allowed: {','.join(map(str, allowed))})")
    return cpus


def cmd_host_check(args: argparse.Namespace) -> int:
    from tuner.adapters import host_probe
    from tuner.load.host_steadiness import MIN_SECONDS, summarize

    if not MIN_SECONDS <= args.seconds <= 3600:
        raise SpecError(f"--seconds: {args.seconds:g} is out of range (allowed: {MIN_SECONDS:g} to 3600; "
                        "the spread of 5-s means needs two of them)")
    noise_floor = load_spec_file(args.file).load.noise_floor if args.file else None
    cpus = _parse_cpus(args.cpus) if args.cpus else host_probe.default_cpus()
    # On stderr: stdout carries the figures (JSON with --json).
    print(f"probing CPUs {','.join(map(str, cpus))} for {args.seconds:g} s (keep the box otherwise idle) ...",
          file=sys.stderr, flush=True)
    series, steal = host_probe.measure(cpus, args.seconds)
    host = summarize(series, steal)
    verdict = host.verdict(noise_floor)
    if args.json:
        print(json.dumps({**host.to_dict(), "noise_floor": noise_floor, "verdict": verdict}, indent=2))
    else:
        print(host.render())
        for line in verdict:
            print(f"- {line}")
    return 0


# -- parser -----------------------------------------------------------------------


def _allow_environment_change(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-environment-change", action="store_true",
                   help="continue a study although its vLLM, torch, GPU, driver, CPU or model files "
                        "changed since its first run (recorded in study.json)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tuner", description="Find the best vLLM serving configuration.")
    parser.add_argument("--version", action="version", version=f"tuner {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_validate(sub)
    for name, helptext in (("run", "start (or continue) a study from a study file"),
                           ("resume", "continue an interrupted study by name")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("file" if name == "run" else "name")
        if name == "run":
            p.add_argument("--study", help="study name (default: the file's name field)")
        _common(p)
        p.add_argument("--n-trials", type=int, help="trials to reach (overrides budget.n_trials)")
        p.add_argument("--timeout", help="wall-clock limit such as 8h (overrides budget.timeout)")
        p.add_argument("--ray-address", help="join this Ray cluster instead of starting a local one")
        p.add_argument("--port", type=int, help="this run's servers listen here (GPU group k on PORT+k) "
                                                "instead of on server.port")
        if name == "run":
            p.add_argument("--dry-run", action="store_true",
                           help="run the study file on the built-in simulator with fast clocks and short "
                                "levels, in results/NAME-dry-run (minutes; nothing of the real study is touched)")
        _allow_environment_change(p)
        p.set_defaults(func=_cmd_run if name == "run" else cmd_resume)

    p = sub.add_parser("status", help="progress, failures and the current Pareto front")
    p.add_argument("name")
    _common(p)
    p.add_argument("--json", action="store_true")
    p.add_argument("--brief", action="store_true", help="omit the per-trial table")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("report", help="HTML page, PNG figures and Markdown summary of a study")
    p.add_argument("name")
    _common(p)
    p.add_argument("--pick", default="knee", help="which point the report recommends (as in export)")
    p.add_argument("-o", "--output", help="folder (default: results/NAME/report)")
    p.add_argument("--markdown", action="store_true", help="also print the Markdown summary")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("export", help="the command line and environment of a chosen trial")
    p.add_argument("name")
    _common(p)
    p.add_argument("--trial", type=int, help="export this trial number")
    p.add_argument("--pick", help="knee (default), best-throughput, lowest-latency, best:<objective>")
    p.add_argument("--where", action="append", default=[], metavar="OBJECTIVE<=N",
                   help="filter before picking, e.g. 'tpot_ms.mean@c1<=30' (repeatable)")
    p.add_argument("--format", default="shell", choices=("shell", "env", "json", "systemd", "yaml"))
    p.add_argument("--force", action="store_true", help="allow a trial that failed probe/verification")
    p.add_argument("-o", "--output", help="write to this file instead of stdout")
    p.add_argument("--check", action="store_true",
                   help="parse every flag-carrying format with vLLM's own argument parser")
    p.add_argument("--vllm-python", help="interpreter of the vLLM environment (default: from server.command)")
    p.add_argument("--no-engine-config", action="store_true",
                   help="with --check: stop after the engine arguments (do not build the engine config)")
    p.add_argument("--confirm", action="store_true",
                   help="first re-run the chosen point on a fresh server (confirm: section); "
                        "export only if it holds up")
    p.add_argument("--ray-address", help="with --confirm: join this Ray cluster instead of starting a local one")
    _allow_environment_change(p)
    p.set_defaults(func=cmd_export)

    _add_confirm(sub)
    _add_measuring_commands(sub)
    return parser


def _common(p: argparse.ArgumentParser) -> None:
    """Where a study's folder and its storage are: every command that reads a study."""
    p.add_argument("--results", default=str(DEFAULT_RESULTS), help="results root (default: results)")
    p.add_argument("--storage", help="Optuna storage URL (default: SQLite file in the study folder)")


def _add_confirm(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("confirm", help="re-run front points (or given trials) on a fresh server and compare")
    p.add_argument("name")
    _common(p)
    p.add_argument("--trial", type=int, action="append", default=[], help="confirm this trial (repeatable)")
    p.add_argument("--candidates", type=int,
                   help="without --trial: how many front points (default: confirm.candidates or 1)")
    p.add_argument("--repeats", type=int, choices=range(1, 6), metavar="1-5",
                   help="re-runs per trial (default: confirm.repeats)")
    p.add_argument("--tolerance", type=float, help="allowed relative change (default: confirm.tolerance or noise)")
    p.add_argument("--rejudge", action="store_true", help="judge the stored re-runs again under the current "
                   "rule; starts nothing")
    p.add_argument("--ray-address", help="join this Ray cluster instead of starting a local one")
    _allow_environment_change(p)
    p.set_defaults(func=cmd_confirm)


def _add_validate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("validate", help="check a study file and show its space and commands")
    p.add_argument("file")
    p.add_argument("--seed", type=int, default=0, help="seed of the random example point")
    p.add_argument("--preflight", action="store_true",
                   help="also check this machine as `run` does first: server executable, model path, GPUs, "
                        "ports (exit 3 naming every problem)")
    p.set_defaults(func=cmd_validate)


def _cmd_run(args: argparse.Namespace) -> int:
    if args.dry_run:
        from tuner.commands.dry_run import cmd_dry_run

        return cmd_dry_run(args)
    return cmd_run(args)


def _add_measuring_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The commands that measure something other than a study: a running server, the host."""

    p = sub.add_parser("measure", help="measure an already running server with a study file's load profile")
    p.add_argument("file", help="study file (its load and probe sections are used)")
    p.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    p.add_argument("--probe", action="store_true", help="also run the study's correctness probe first")
    p.add_argument("-o", "--output", help="folder for the files (default: results/NAME/measure/DATE-TIME)")
    p.add_argument("--force", action="store_true",
                   help="with -o: overwrite the measurement or trial files already in that folder")
    p.add_argument("--results", default=str(DEFAULT_RESULTS), help="results root (default: results)")
    p.set_defaults(func=cmd_measure)

    p = sub.add_parser("host-check", help="how steady this host's own CPUs are (the floor under between-start noise)")
    p.add_argument("file", nargs="?", help="study file: compare with its load.noise_floor")
    p.add_argument("--seconds", type=float, default=30.0, help="probe length (default 30, at least 10)")
    p.add_argument("--cpus", help="CPUs to probe, e.g. 0,7,15 (default: the first, middle and last usable)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_host_check)


def _quiet_optuna(args: argparse.Namespace) -> None:
    if args.verbose:
        return
    import warnings

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # Multivariate/grouped TPE and metric names are marked experimental; they are
    # chosen on purpose, so the per-run notice is noise for users.
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # status quiets Optuna only if it imports it; host-check never does (it runs on a bare
    # box with the standard library alone).
    if args.func not in (cmd_status, cmd_host_check):
        _quiet_optuna(args)
    _answer_ctrl_c()
    previous_sigterm = _answer_sigterm()
    try:
        _check_names(args)
        return args.func(args)
    except SpecError as exc:
        _error(str(exc))
        return 2
    except StudyError as exc:
        _error(str(exc))
        return 3
    except TunerError as exc:
        # E.g. an artifact that could not be written outside a trial.
        _error(str(exc))
        return 1
    except Terminated:
        # run and resume say what to run next themselves (cli_run.interrupted_line).
        print("interrupted by SIGTERM", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`tuner export NAME | head -3`): nothing is wrong with the
        # command, so no traceback; stdout goes to /dev/null so the exit flush is silent.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 141
    finally:
        if previous_sigterm is not None:
            signal.signal(signal.SIGTERM, previous_sigterm)


def _answer_sigterm() -> Any:
    """SIGTERM raises Terminated (a KeyboardInterrupt) while a command runs: `timeout`,
    systemd and Kubernetes stop a process with it, and every command answers it as it does
    Ctrl-C - stopping what it started - with exit code 143 (128 + 15, the shell's). `tuner
    run` catches it itself and stops its trials as on Ctrl-C. The handler it replaces (to
    put back), or None when this is not the main thread (no handler can be set)."""

    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _raise_terminated)


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated


def _error(text: str) -> None:
    """One error as every command prints it: ``error: ...`` on stderr, control characters
    escaped (a value from a study file or a server must not reach the terminal raw)."""

    print(f"error: {for_terminal(text)}", file=sys.stderr)


def _answer_ctrl_c() -> None:
    """Make SIGINT raise KeyboardInterrupt even when this process inherited it ignored.

    A shell without job control starts its background commands with SIGINT ignored, and
    Python then installs no handler of its own: `tuner host-check` started that way by a
    script ran its whole minute through a `kill -INT` (CI, 2026-12-03 and -04). `tuner run`
    sets its own handler anyway; every command answers Ctrl-C alike: "interrupted", 130."""

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _check_names(args: argparse.Namespace) -> None:
    """Every study name given on the command line (NAME, --study) obeys the one rule of
    core.study_name before anything reads or writes a path built from it."""

    from tuner.study.study_name import check_study_name

    for option, value in (("NAME", getattr(args, "name", None)), ("--study", getattr(args, "study", None))):
        if value is None:
            continue
        try:
            check_study_name(value)
        except ValueError as exc:
            raise SpecError(f"{option}: {exc}") from None


if __name__ == "__main__":
    sys.exit(main())
