"""``tuner run FILE --dry-run``: the study file run end to end on the built-in simulator, fast
(what changes is tuner.study.dry_run's to decide), in its own folder ``results/NAME-dry-run``
that each dry run starts afresh.

Part of the command line: returns the exit code of the run.
"""

from __future__ import annotations

import argparse
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.adapters.artifacts import DRY_RUN_JSON
from tuner.errors import SpecError, StudyError

if TYPE_CHECKING:
    from tuner.adapters.artifacts import StudyPaths

__all__ = ["cmd_dry_run", "MARKER"]

# Written into the dry run's folder: what it is and how it differs from the study file. A
# folder without it is never removed by the next dry run.
MARKER = DRY_RUN_JSON


def cmd_dry_run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from tuner.adapters.artifacts import StudyPaths, atomic_write_json
    from tuner.commands.run import _option_duration, _run_study, check_study_inputs, load_spec_file, preflight, say
    from tuner.sim.profile import ProfileError, load_profile
    from tuner.store.handle import create_or_open
    from tuner.study.dry_run import SUFFIX, dry_run_name, dry_run_spec
    from tuner.study.study_name import check_study_name

    if args.storage is not None:
        raise SpecError("--storage: a dry run keeps its own storage in its folder (results/NAME-dry-run), "
                        "never the real study's; leave --storage out")
    spec = load_spec_file(args.file)
    # The names the file gives are the real study's: a misspelled knob must stop the dry run
    # as it would stop the night.
    check_study_inputs(spec, args.file, energy_here=False)   # the simulator has its own counters
    timeout_s = _option_duration(args.timeout, "--timeout")
    name = dry_run_name(args.study or spec.name)
    try:
        check_study_name(name)
    except ValueError as exc:
        raise SpecError(f"--dry-run: the dry run is named after the study plus {SUFFIX!r}: {exc}; "
                        "give it a shorter name with --study") from None
    paths = StudyPaths.of(Path(args.results), name)
    try:
        dry = dry_run_spec(spec, name=name, cache_dir=str((paths.root / "vllm-cache").resolve()))
    except (ValueError, ValidationError) as exc:
        raise SpecError(f"--dry-run: the study cannot be run on the simulator as {name!r}: {exc}") from None
    profile = str(dry.spec.server.env["TUNER_SIM_PROFILE"])
    try:
        load_profile(profile)
    except ProfileError as exc:
        raise SpecError(f"server.env.TUNER_SIM_PROFILE: {exc}") from None
    say(f"DRY RUN of {args.file} on the built-in simulator: nothing here measures this machine")
    _clear_previous(paths, say)
    for line in dry.changes:
        say(f"[dry run] {line}")
    preflight(dry.spec, cluster=args.ray_address is not None)
    handle = create_or_open(dry.spec, Path(args.results), name=name)
    atomic_write_json(paths.root / MARKER, {"study_file": str(Path(args.file).resolve()), "source_name": spec.name,
                                            "created_unix": time.time(), "changes": list(dry.changes)})
    code = _run_study(handle, args, n_trials=args.n_trials, timeout_s=timeout_s, checked=True)
    say(f"\nDRY RUN finished ({name}, simulator profile {profile}): the study file ran end to end; its figures "
        f"are the simulator's model, not this machine's. Look at it with `tuner status {name}`, "
        f"`tuner report {name}`, `tuner export {name}`; run the study itself with `tuner run {args.file}`")
    return code


def _clear_previous(paths: StudyPaths, say: Callable[[str], None]) -> None:
    """Remove the folder of an earlier dry run of this study (never one that is running, and
    never a folder that is not a dry run's)."""

    from tuner.store.handle import StudyLock

    if not paths.root.exists():
        return
    if not (paths.root / MARKER).is_file():
        raise StudyError(f"{paths.root} holds a study that is not a dry run; a dry run would replace it. "
                         "Give the dry run another name with --study")
    with StudyLock(paths):   # refuses a dry run that is still running
        shutil.rmtree(paths.root)
    say(f"[dry run] replaced the earlier dry run in {paths.root}")
