"""`tuner status`: what a study has done so far, readable while it runs."""

from __future__ import annotations

import collections
import fcntl
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.adapters.artifacts import StudyPaths, read_json, saved_budget
from tuner.energy.energy_text import energy_lines
from tuner.load.host_steadiness import check_text
from tuner.load.max_rate_text import max_rate_text, max_rate_value_text
from tuner.probe.quality_text import quality_line
from tuner.store.records import StoredStudy, read_records_direct, read_sqlite_study
from tuner.study.confirmation_text import summary_text
from tuner.study.durations import format_duration
from tuner.study.environment import environment_lines
from tuner.study.integrity import damaged_rows, integrity_lines, spec_changes
from tuner.study.noise import noisy_front, plus_minus, unstable_text
from tuner.study.outcome_summary import OutcomeSummary
from tuner.study.simulated import saved_spec_label, simulated_label
from tuner.study.study_noise import with_study_noise
from tuner.study.trials import KIND_RUN, TrialRecord, front_records, noisy_points, stop_record_text
from tuner.views.saved_spec import searched_targets, study_noise_at
from tuner.views.workload_view import workload_lines
from tuner.vllm.parallel import parallel_lines
from tuner.vllm.startup import figures_text, median_phases, study_startup_lines
from tuner.vllm.startup import summary_text as startup_summary_text
from tuner.vllm.unverified import unverified, unverified_summary, unverified_text

if TYPE_CHECKING:
    import optuna

    from tuner.store.handle import StudyHandle

# `tuner status` on a study in its default SQLite file imports nothing heavier than this
# module (no Optuna, SQLAlchemy, pydantic): see status_from_folder.

__all__ = ["build_status", "format_status", "status_from_folder", "study_is_running"]


def study_is_running(handle: StudyHandle | StudyPaths) -> bool:
    """True when a tuner process holds the study's lock right now."""

    paths = handle if isinstance(handle, StudyPaths) else handle.paths
    try:
        fd = os.open(paths.lock, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def read_checks(handle: StudyHandle | StudyPaths, number: int) -> list[dict[str, Any]]:
    """The trial's full asked-vs-got table from its verification.json (empty if absent)."""
    return list(read_verification(handle, number).get("checks", []))


def read_verification(handle: StudyHandle | StudyPaths, number: int) -> dict[str, Any]:
    """The trial's verification.json: checks, and its ranks and all-reduce (``parallel``)."""
    paths = handle if isinstance(handle, StudyPaths) else handle.paths
    return read_json(paths.trial_dir(number) / "verification.json", dict) or {}


# Server-side speculative-decoding counters per level (load/prometheus.py, kept in the
# outcome's server_side): None when the server did not speculate.
SPEC_KEYS = ("spec_acceptance_rate", "spec_mean_acceptance_length", "spec_drafts")
_SPEC_NAMES = {"ngram": "n-gram", "mtp": "MTP", "eagle": "EAGLE", "eagle3": "EAGLE-3", "medusa": "Medusa"}


def _speculation(outcome: OutcomeSummary) -> dict[str, dict[str, Any]] | None:
    """Per level (as in server_side, in concurrency order) the acceptance counters, or None
    when no level has any (no speculation, or a server without the metrics)."""

    server_side = outcome.server_side
    levels = {c: {k: (lv or {}).get(k) for k in SPEC_KEYS}
              for c, lv in sorted(server_side.items(), key=lambda item: _level_order(item[0]))}
    levels = {c: lv for c, lv in levels.items() if any(v is not None for v in lv.values())}
    return levels or None


def _level_order(level: str) -> tuple[int, float | str]:
    try:
        return (0, float(level))
    except ValueError:
        return (1, level)


def _spec_method(checks: list[dict[str, Any]]) -> str | None:
    """The speculative method the server ran (its asked-vs-got table), if it says."""
    for check in checks:
        if check.get("target") == "speculative_config.method":
            got = check.get("got") if check.get("got") is not None else check.get("asked")
            return None if got is None else str(got)
    return None


def _trial_row(record: TrialRecord, handle: StudyHandle | StudyPaths | None = None,
               paths: StudyPaths | None = None, searched: frozenset[str] = frozenset()) -> dict[str, Any]:
    """One trial as status shows it. ``handle``: read its asked-vs-got table into
    ``checks`` (and the ``searched`` knobs it could not verify into ``unverified``);
    ``paths`` alone: read it only for the speculative method's name."""
    outcome = record.summary
    verification = read_verification(handle, record.number) if handle is not None else {}
    checks = list(verification.get("checks", []))
    probe_s, trial_s = outcome.probe_s, outcome.trial_s
    folder = (handle if isinstance(handle, StudyPaths) else handle.paths) if handle is not None else paths
    speculation = _speculation(outcome)
    method = None
    if speculation is not None:
        method = _spec_method(checks if handle is not None else
                              read_checks(paths, record.number) if paths is not None else [])
    measured = record.measured_values()
    return {
        "trial": record.number,
        "state": record.state,
        "outcome": record.outcome,
        "baseline": record.is_baseline,
        "params": record.params,
        # Only what the trial measured: the bounds and placeholders a trial stopped early
        # was told are the optimizer's business (``bound_labels`` and ``early_stop`` say
        # what it was judged on).
        "values": measured,
        # 95 % half-width of each objective value (tuner.load.uncertainty), and the levels
        # whose throughput never met the stability rule.
        "noise": record.noise(list(measured)),
        "unstable_levels": record.unstable_levels,
        "client_bound_levels": record.client_bound_levels,
        "seconds": record.seconds,
        "failure": None if record.failure is None else record.failure.as_attr(),
        "mismatches": outcome.mismatches,
        "probe_passed": outcome.probe_passed,
        "probe_reason": outcome.probe_reason,
        "probe_coverage": outcome.probe_coverage,
        "probe_agreement": (folder.probe_agreement(record.number, outcome) if folder is not None
                            else outcome.probe_agreement),
        "startup_s": outcome.startup_s,
        "probe_s": probe_s,
        "trial_s": trial_s,
        "probe_share": probe_s / trial_s if probe_s is not None and trial_s else None,
        "spec_method": method,
        "dummy_weights": "--load-format dummy" in (record.command or ""),
        "speculation": speculation,
        # A trial stopped early was told placeholder or bound values for what it never
        # measured; the text view must not print those as measurements.
        "early_stop": outcome.early_stop,
        "compile": None if record.compile_record is None else record.compile_record.to_json(),
        "startup": None if record.startup_record is None else record.startup_record.to_json(),
        "gpu_wait_s": outcome.gpu_wait_s,
        "measured_levels": sorted(int(c) for c in outcome.levels),
        # Objectives told as an early stop's bound (label -> the level never measured).
        "bound_labels": record.bound_labels(list(record.values)),
        "max_rate": outcome.max_rate,
        "checks": checks,
        "unverified": unverified(checks, searched),
        "parallel": verification.get("parallel"),  # ranks, the all-reduce (vllm.parallel)
        # A lossy trial's quality gate (probe.quality_stats.QualityRecord) as JSON.
        "quality": None if outcome.quality is None else outcome.quality.model_dump(mode="json"),
    }


def build_status(handle: StudyHandle, study: optuna.Study) -> dict[str, Any]:
    # Straight from the tables: status runs in a fresh process, where Optuna would decode
    # every trial into a FrozenTrial first (about 1 s at 1,000 trials).
    stored = StoredStudy(handle.name, study.metric_names, [d.name.lower() for d in study.directions],
                         study.user_attrs, read_records_direct(study))
    meta = read_json(handle.paths.study_json, dict) or {}
    n_trials, timeout = _target(meta, handle.spec.budget.n_trials, handle.spec.budget.timeout)
    server = handle.spec.server
    return _status(handle.paths, stored, n_trials, timeout, name=handle.name,
                   spec_changes=list(getattr(handle, "spec_changes", [])),
                   simulated=simulated_label(server.command, server.env, handle.paths.dry_run_of()))


def _target(meta: Any, n_trials: int, timeout: float | None) -> tuple[int, float | None]:
    """The budget the study runs to: --n-trials/--timeout last given (study.json), else
    the spec's."""

    saved_trials, saved_timeout = saved_budget(meta if isinstance(meta, dict) else {})
    return saved_trials or n_trials, saved_timeout if saved_timeout is not None else timeout


def status_from_folder(results_root: Path, name: str) -> dict[str, Any] | None:
    """``build_status`` of a study in its default SQLite file, without Optuna or pydantic.

    ``tuner status`` is a fresh process each time: importing Optuna and the spec models and
    opening the storage through Optuna cost about 0.9 s at 1,000 trials, the rest of the
    command a third of that. Here study.json, the budget in spec.yaml and the SQLite tables
    are read directly. None whenever anything differs from the plain case (another storage,
    a missing or unreadable file, an unknown schema): the caller then takes the full path,
    which also reports what is wrong exactly as before.
    """

    paths = StudyPaths.of(results_root, name)
    try:
        meta = json.loads(paths.study_json.read_text())
        if not meta.get("storage_is_default", True) or not paths.sqlite.is_file():
            return None
        data = _spec_data(paths.spec_yaml)
        budget = _saved_budget(data)
    except (OSError, ValueError, AttributeError):
        return None
    if budget is None:
        return None
    stored = read_sqlite_study(paths.sqlite, name)
    if stored is None:
        return None
    return _status(paths, stored, *_target(meta, *budget), name=name,
                   spec_changes=spec_changes(meta.get("saved_spec"), data) or [],
                   simulated=saved_spec_label(data, paths.dry_run_of()))


def _spec_data(spec_yaml: Path) -> Any:
    """The saved spec.yaml as loaded YAML; None when it is not YAML."""

    from tuner.study.safe_yaml import YamlInputError, load_bounded

    try:
        # Bounded like a study file: a copied folder's spec.yaml is input like any other.
        return load_bounded(spec_yaml.read_text(encoding="utf-8"))
    except (YamlInputError, UnicodeDecodeError):
        return None


def _saved_budget(data: Any) -> tuple[int, float | None] | None:
    """(n_trials, timeout seconds) of the resolved spec the study saved, or None if odd.

    spec.yaml is written by the tuner from the validated spec (durations already seconds),
    so only these two fields are read; validating the whole spec would mean importing the
    pydantic models, which the full path (run, resume, report) does."""

    import math

    budget = data.get("budget") if isinstance(data, dict) else None
    if not isinstance(budget, dict):
        return None
    n_trials, timeout = budget.get("n_trials"), budget.get("timeout")
    if type(n_trials) is not int or not (timeout is None or type(timeout) in (int, float)):
        return None
    if timeout is not None and not math.isfinite(timeout):
        return None   # the full path reports it
    return n_trials, None if timeout is None else float(timeout)


def _status(paths: StudyPaths, study: StoredStudy, target_trials: int, timeout: float | None, *,
            name: str, spec_changes: list[str], simulated: str | None) -> dict[str, Any]:
    labels = list(study.metric_names or [])
    between = study_noise_at(paths, study.records, labels)
    records = with_study_noise(study.records, between)
    directions = study.directions
    runs = [r for r in records if r.kind == KIND_RUN]
    finished = [r for r in runs if r.state in ("COMPLETE", "FAIL") and not r.interrupted]
    failures = collections.Counter(
        "unknown" if r.failure is None else r.failure.reason for r in runs if r.state == "FAIL"
    )
    outcomes = collections.Counter(r.outcome for r in runs)
    elapsed = float(study.user_attrs.get("elapsed_s", 0.0))
    front = front_records(records, labels, directions)
    baseline = next((r for r in runs if r.is_baseline and r.state == "COMPLETE"), None)
    noisy = noisy_points(records, labels) if labels else []
    _, ties = noisy_front(noisy, directions, labels) if noisy else ([], [])
    searched = searched_targets(paths.spec_yaml)
    trials = [_trial_row(r, paths, searched=searched) for r in runs]
    return {
        "study": name,
        # A study the simulator served (a dry run, the quick start): no figure is measured.
        "simulated": simulated,
        "running_now": study_is_running(paths),
        "target_trials": target_trials,
        "finished_trials": len(finished),
        "outcomes": dict(outcomes),
        "failures": dict(failures),
        "running": [r.number for r in runs if r.state == "RUNNING"],
        "skipped": {"duplicate": sum(r.kind == "duplicate" for r in records),
                    "forbidden": sum(r.kind == "forbidden" for r in records)},
        "elapsed_s": elapsed,
        "time_left_s": None if timeout is None else max(0.0, timeout - elapsed),
        "objectives": [{"label": l, "direction": d} for l, d in zip(labels, directions)],
        "baseline": None if baseline is None else {"trial": baseline.number,
                                                    "values": baseline.measured_values()},
        "front": [_trial_row(r, paths=paths) for r in front],
        "ties": [t.as_dict() for t in ties],
        # Confirmation re-runs (confirm/), by trial number; shown under the front.
        "confirmations": {str(k): _with_rerun_startups(paths, v) for k, v in paths.confirmations().items()},
        "trials": trials,
        "unverified": unverified_summary(trials),
        "startup": _startup_summary(runs),
        "host_check": paths.last_host_check(),
        "between_starts": {**between.as_dict(), "lines": between.lines()} if labels else None,
        "probe_mode": paths.probe_mode(),
        "environment": (environment := paths.environment())[0],
        "environment_changes": environment[1], "energy": next((r.summary.energy for r in reversed(runs)
                                                              if r.summary.energy), None),
        "workload": paths.workload_profile(),
        # What the folder no longer says as it was measured (tuner.study.integrity).
        "spec_changes": spec_changes,
        "damaged": damaged_rows(records),
        "stray_folders": [stray.as_dict() for stray in paths.trial_folders().stray],
    }


def _with_rerun_startups(paths: StudyPaths, confirmation: dict[str, Any]) -> dict[str, Any]:
    """The verdict with each re-run's startup record beside it, so status can show what a
    fresh start cost with the study's compile cache warm."""

    runs = [dict(run, startup=paths.rerun_startup(run["folder"]))
            if isinstance(run, dict) and isinstance(run.get("folder"), str) else run
            for run in confirmation.get("runs") or []]
    return {**confirmation, "runs": runs}


def _startup_summary(runs: list[TrialRecord]) -> dict[str, Any] | None:
    """Median startup per phase over the trials whose server came up, and the share of
    trial time spent starting servers; None before any did."""

    records = [r.startup_record for r in runs if r.startup_record is not None]
    medians = median_phases(records)
    if not medians:
        return None
    trial_s = sum(float(r.summary.trial_s or 0.0) for r in runs)
    # What the trials waited: imports a spare did ahead (prestart) cost no trial time.
    ahead = sum(float(r.startup_record.overlapped_s or 0.0) for r in runs if r.startup_record is not None)
    startup_s = sum(float(r.summary.startup_s or 0.0) for r in runs) - ahead
    caches = collections.Counter(rec.compile_cache for rec in records
                                 if rec.compile_cache not in (None, "none"))
    return {"median": medians, "trials": sum(1 for rec in records if rec.complete),
            "share": startup_s / trial_s if trial_s else None, "compile_cache": dict(caches),
            "prestarted": sum(1 for rec in records if rec.overlapped_s), "ahead_s": round(ahead, 1)}


def _stopped_values(row: dict[str, Any], labels: list[str], directions: list[str]) -> str:
    """What a trial stopped early really measured: its measured objectives as values, the
    levels it skipped as the optimistic bound it was judged on (at most / at least), or
    nothing at all when it stopped before the load."""

    stop = row["early_stop"]
    bounds = stop.get("bounds")
    if not bounds:
        return f"not measured ({stop_record_text(stop)})"
    unmeasured = row.get("bound_labels") or {}
    shown = []
    for label, direction, bound in zip(labels, directions, bounds):
        level = unmeasured.get(label)
        if bound is None:
            shown.append(f"{label}=not measured")
        elif label == MAX_RATE and (row.get("max_rate") or {}).get("status") in ("stopped", None):
            shown.append(f"{label}<={value_text(bound)} (bound, search stopped)")
        elif level is not None:
            # Stopped during the level (rule 4b) or before it: part-measured or skipped.
            how = "stopped inside" if stop.get("after") == f"inside c{level}" else "skipped"
            sign = "<=" if direction == "maximize" else ">="
            shown.append(f"{label}{sign}{value_text(bound)} (bound, c={level} {how})")
        elif label in row["values"]:
            # Measured: the value it was told with and its interval, not the bound (a
            # measured value's bound is moved by its own noise towards the optimistic side).
            shown.append(_value(row, label))
        else:
            shown.append(f"{label}={value_text(bound)}")
    return "  ".join(shown) + f"  [{stop_record_text(stop)}]"


def value_text(value: Any) -> str:
    """A parameter value or bound as status and the report show it: floats to 4 significant
    digits, None as "unset"."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return "unset" if value is None else str(value)


# tuner.study.objectives.MAX_RATE, spelled out: status imports no pydantic (test_status_fast).
MAX_RATE = "max_rate@slo"


def _value(row: dict[str, Any], label: str) -> str:
    """``label=value±noise`` (the 95 % half-width, when the value has one); max_rate@slo as
    its search says it."""

    value = row["values"].get(label)
    if label == MAX_RATE and row.get("max_rate"):
        # As its search says it: >=100 when only a lower bound, 0 (slo_unmet).
        return f"{label}={max_rate_value_text(row['max_rate'])}"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{label}={plus_minus(float(value), (row.get('noise') or {}).get(label))}"
    return f"{label}={value_text(value)}"


def _unstable_text(row: dict[str, Any]) -> str:
    levels = row.get("unstable_levels") or []
    if not levels:
        return ""
    return " UNSTABLE (" + unstable_text(levels, row.get("client_bound_levels") or []) + ")"


def _running_lines(status: dict[str, Any]) -> list[str]:
    """What runs now. A trial the storage still holds as running while no run holds the
    study was cut off by a kill (kill -9, a lost machine): nothing runs it any more."""

    cut_off = ", ".join(map(str, status["running"]))
    if status["running_now"]:
        return [f"  running: trial(s) {cut_off}"] if cut_off else []
    if cut_off:
        return [f"  nothing is running: trial(s) {cut_off} were cut off when the run was killed; "
                f"`tuner resume {status['study']}` re-runs them and continues"]
    if status["finished_trials"] < status["target_trials"] and status["time_left_s"] != 0:
        return [f"  nothing is running; `tuner resume {status['study']}` continues"]
    return []


def format_status(status: dict[str, Any], *, verbose: bool = True) -> str:
    lines = [
        f"study {status['study']}: {status['finished_trials']}/{status['target_trials']} trials finished"
        + (" (running now)" if status["running_now"] else ""),
        *([f"  {status['simulated']}"] if status.get("simulated") else []),
        "  outcomes: " + (", ".join(f"{k} {v}" for k, v in sorted(status["outcomes"].items())) or "none yet"),
        f"  time used {format_duration(status['elapsed_s'])}"
        + (f", left {format_duration(status['time_left_s'])}" if status["time_left_s"] is not None else ""),
    ]
    if status.get("host_check"):
        lines.append(f"  {check_text(status['host_check'])}")
    if status.get("between_starts"):
        lines.append("  noise between fresh starts (what every interval carries beyond its own run):")
        lines.extend(f"    {line}" for line in status["between_starts"]["lines"])
    if status.get("probe_mode"):
        lines.append(f"  probe: {status['probe_mode']}")
    lines.extend(environment_lines(status.get("environment"), status.get("environment_changes") or [])
                 + energy_lines(status.get("energy")))
    lines.extend(workload_lines(status.get("workload")))
    lines.extend(integrity_lines(status))
    lines.extend(_running_lines(status))
    skipped = status["skipped"]
    if skipped["duplicate"] or skipped["forbidden"]:
        lines.append(f"  not run: {skipped['duplicate']} duplicate, {skipped['forbidden']} forbidden proposals")
    if status.get("startup"):
        lines.extend(study_startup_lines(status["startup"]))
    labels = [o["label"] for o in status["objectives"]]
    base = status["baseline"]
    lines.append("")
    lines.append("Pareto front (feasible trials only):")
    if not status["front"]:
        lines.append("  (empty)")
    for row in status["front"]:
        vals = "  ".join(_value(row, label) for label in labels)
        gain = ""
        if base:
            ratios = [
                f"{row['values'][l] / base['values'][l]:.2f}x"
                for l in labels if base["values"].get(l) and l in row["values"]
            ]
            gain = f"  (vs baseline: {' / '.join(ratios)})"
        params = " ".join(f"{k}={value_text(v)}" for k, v in row["params"].items())
        lines.append(f"  trial {row['trial']:>3}{' [baseline]' if row['baseline'] else ''}: {vals}{gain}"
                     f"{_unstable_text(row)}")
        lines.append(f"             {params}")
        if row.get("probe_agreement"):
            lines.append(f"             {row['probe_agreement']}")
        if row.get("max_rate"):
            lines.append(f"             {max_rate_text(row['max_rate'])}")
        confirmation = status.get("confirmations", {}).get(str(row["trial"]))
        if confirmation is not None:
            lines.append(f"             {summary_text(confirmation)}")
            lines.extend(_rerun_startup_lines(confirmation))
    off_front = [c for k, c in sorted(status.get("confirmations", {}).items(), key=lambda kv: int(kv[0]))
                 if int(k) not in {row["trial"] for row in status["front"]}]
    for confirmation in off_front:
        lines.append(f"  trial {confirmation['trial']:>3} (no longer on the front): {summary_text(confirmation)}")
        lines.extend(_rerun_startup_lines(confirmation))
    for tie in status.get("ties") or []:
        lines.append(f"  tie: {tie['text']} (values ± their 95 % noise)")
    unsteady = [row for row in status["front"] if row.get("unstable_levels")]
    if unsteady:
        lines.append("  !! UNSTABLE on the front: " + "; ".join(
            f"trial {row['trial']}{_unstable_text(row)}" for row in unsteady)
            + " - its numbers are not the server's steady figures; re-run or lengthen the levels"
            + (", and give a client-bound level more client processes (load.client_processes) "
               "or a quieter host" if any(row.get("client_bound_levels") for row in unsteady) else ""))
    for item in status.get("unverified") or []:
        lines.append(f"  !! {unverified_text(item)}")
    if verbose:
        lines.append("")
        lines.append("Trials:")
        directions = [o["direction"] for o in status["objectives"]]
        for row in status["trials"]:
            lines.extend(_trial_lines(row, labels, directions))
    return "\n".join(lines)


def _trial_lines(row: dict[str, Any], labels: list[str], directions: list[str]) -> list[str]:
    """One trial of the verbose list: outcome and values, then what went wrong or was
    measured besides (failure, knobs not applied, probe, startup, max_rate@slo)."""

    lines: list[str] = []
    vals = "  ".join(_value(row, label) for label in labels if label in row["values"])
    if row.get("early_stop") and row["early_stop"].get("reason") != "dominated_exact":
        vals = _stopped_values(row, labels, directions)
    lines.append(f"  {row['trial']:>3} {row['outcome']:<22} {vals}{_unstable_text(row)}")
    if row["failure"] and row["state"] == "FAIL":
        lines.append(f"        reason: {row['failure'].get('message') or row['failure'].get('reason')}")
    checked = [c for c in row["checks"] if c.get("status") not in ("unverifiable", "not_applicable")]
    if checked:
        lines.append("        asked vs got: " + ", ".join(
            f"{c['target']}={value_text(c.get('asked'))}"
            + ("" if c.get("status") == "applied" else f" -> GOT {value_text(c.get('got'))}")
            for c in checked))
    for check in row.get("unverified") or []:
        lines.append(f"        NOT VERIFIED: {check['target']}={value_text(check.get('asked'))}"
                     + (f" ({check['note']})" if check.get("note") else ""))
    lines.extend(f"        {text}" for text in parallel_lines(row.get("parallel"), row["checks"]))
    for m in row["mismatches"]:
        # The knob table's label; imported here, so a status without mismatches
        # does not pay for loading it.
        from tuner.vllm.knobs import mismatch_text

        lines.append(f"        not applied: {mismatch_text(m)}")
        if m.get("evidence"):
            lines.append(f"          evidence: {m['evidence'][:200]}")
    if row["probe_passed"] is False:
        lines.append(f"        probe failed: {row['probe_reason']}")
    if row.get("quality"):
        lines.append(f"        {quality_line(row['quality'])}")
    if row.get("probe_s") is not None:
        share = (f" ({row['probe_share']:.0%} of {row['trial_s']:.0f}s)"
                 if row.get("probe_share") is not None else "")
        covered = f"; {row['probe_coverage']}" if row.get("probe_coverage") else ""
        lines.append(f"        probe {row['probe_s']:.1f}s{share}{covered}")
    if row.get("probe_agreement"):
        lines.append(f"        {row['probe_agreement']}")
    if row.get("startup"):
        lines.extend(_startup_lines(row))
    elif row.get("compile") and row["compile"].get("cache") not in (None, "none"):
        lines.append(_compile_line(row))
    if row.get("speculation"):
        lines.append(_speculation_line(row))
    if row.get("max_rate"):
        lines.append(f"        {max_rate_text(row['max_rate'])}")
    return lines


def _rerun_startup_lines(confirmation: dict[str, Any]) -> list[str]:
    """``re-run 0002-1: startup 56.8s = ... (torch.compile cache hit)`` per re-run that
    came up: next to the trial's own first start, what the shared compile cache saved."""
    lines = []
    for run in confirmation.get("runs") or []:
        rec = run.get("startup") if isinstance(run, dict) else None
        if isinstance(rec, dict) and rec.get("total_s") is not None:
            lines.append(f"             re-run {run.get('folder')}: {startup_summary_text(rec)}")
    return lines


def _startup_lines(row: dict[str, Any]) -> list[str]:
    """The trial's startup breakdown and what the log says about KV cache and graphs."""
    rec = row["startup"]
    lines = ["        " + startup_summary_text(rec)]
    figures = figures_text(rec)
    if figures:
        lines.append("          " + figures)
    if row.get("gpu_wait_s") is not None and row["gpu_wait_s"] >= 0.5:
        lines.append(f"          waited {row['gpu_wait_s']:.1f}s for the GPUs before starting")
    return lines


def _compile_line(row: dict[str, Any]) -> str:
    """E.g. ``startup 61.2s: torch.compile cache hit (3.1s), graph capture 17s``."""
    rec = row["compile"]
    parts = [f"torch.compile cache {rec['cache']}"
             + (f" ({rec['compile_s']:.1f}s)" if rec.get("compile_s") is not None else "")]
    if rec.get("graph_capture_s") is not None:
        parts.append(f"graph capture {rec['graph_capture_s']:.0f}s")
    startup = f"startup {row['startup_s']:.1f}s: " if row.get("startup_s") is not None else ""
    return "        " + startup + ", ".join(parts)


def _speculation_line(row: dict[str, Any]) -> str:
    """E.g. ``n-gram acceptance: c=1 78% (mean length 2.9), c=4 71% (2.6)``."""

    method = row.get("spec_method")
    name = _SPEC_NAMES.get(method, method) if method else "speculative"
    parts = []
    for level, counters in row["speculation"].items():
        rate, length = counters.get("spec_acceptance_rate"), counters.get("spec_mean_acceptance_length")
        text = f"c={level} " + ("n/a" if rate is None else f"{rate:.0%}")
        if length is not None:
            text += f" (mean length {length:.1f})" if not parts else f" ({length:.1f})"
        parts.append(text)
    # Random weights repeat themselves: what drafts they accept says nothing of a real model's.
    dummy = " (random weights, load_format dummy: not your model's acceptance)" if row.get("dummy_weights") else ""
    return f"        {name} acceptance: " + ", ".join(parts) + dummy
