"""``tuner run FILE --dry-run``: the study file, as it is, run against the built-in simulator
on fast clocks, so the whole night - reference, baseline, starting points, search, early
stops, confirmation re-runs, status, report and export - is seen in minutes before it is
spent on the box.

What changes, and only that: the server command becomes the simulator (the study's own
profile when its server.env names one, else the field-notes box), the simulator's clocks run
fast, the load levels are sized by a few requests instead of steady-state windows (a level of
the real study runs for tens of seconds of wall-clock time whatever the clock of the server
it measures), the host check is skipped, the trial count is capped, and the study gets its own
name, folder, storage and compile cache, so nothing of it mixes with the real study's. The
numbers it shows are the simulator's model, never a measurement of the box.

Pure: ``tuner.commands.dry_run`` reads the file, makes the folder and runs the study.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuner.study.spec import StudySpec
from tuner.vllm.knobs import PYTHON_PLACEHOLDER

__all__ = ["DryRun", "dry_run_spec", "dry_run_name", "SUFFIX", "SIMULATOR_COMMAND", "TRIALS",
           "TIME_SCALE", "STARTUP_SCALE"]

SUFFIX = "-dry-run"
SIMULATOR_COMMAND = [PYTHON_PLACEHOLDER, "-m", "tuner.sim"]
PROFILE_ENV, TIME_SCALE_ENV, STARTUP_SCALE_ENV = "TUNER_SIM_PROFILE", "TUNER_SIM_TIME_SCALE", "TUNER_SIM_STARTUP_SCALE"
# The demo's clocks: tokens 10x faster than modelled, GLM-5's minutes of startup in about
# two seconds. The reference alone took 284 s on the unscaled clock; 7 s on these.
TIME_SCALE = 0.1
STARTUP_SCALE = 0.001
# Trials unless --n-trials says otherwise: the demo's twelve, enough for the baseline, the
# starting points, the initial design and the first model-guided points.
TRIALS = 12
# Levels sized like the demo's: two requests per stream, at least four, two warm-ups.
REQUESTS_PER_STREAM, MIN_REQUESTS, WARMUP_REQUESTS = 2, 4, 2
# An open-loop rate level plans rate x this many seconds of arrivals (at least min_requests).
RATE_DURATION_S = 5.0
# The trace level (load.trace) replays in wall-clock time whatever the simulator's clock: at
# most this many requests over at most this many seconds a trial.
TRACE_REQUESTS, TRACE_SECONDS = 32, 10.0
# Request lengths, at most: on a small box the client and the simulator stream every token
# on its CPUs whatever the clock, so tokens, not modelled time, are what a dry run costs (the
# field-notes study's 256-token answers at c=64 took 12 s a level on two shared cores).
OUTPUT_TOKENS, PROMPT_TOKENS = 16, 128


@dataclass(frozen=True)
class DryRun:
    """The study to run, and each way it differs from the file, one line each."""

    spec: StudySpec
    changes: tuple[str, ...]


def dry_run_name(name: str) -> str:
    return name + SUFFIX


def dry_run_spec(spec: StudySpec, *, name: str, default_profile: str, cache_dir: str) -> DryRun:
    """``spec`` made to run on the simulator under ``name`` with its compile cache in
    ``cache_dir`` (the dry run's own folder: a study that shares vLLM's real cache must not
    get the simulator's entries in it).

    Raises:
        ValueError: the resulting study is not valid (e.g. the name grew too long).
    """

    data: dict[str, Any] = spec.model_dump(mode="json")
    changes = [f"study {spec.name} -> {name}: its own folder, storage and compile cache; nothing of "
               f"{spec.name}'s is read or written"]
    changes += _server(data["server"], default_profile)
    changes += _load(data["load"], rates_measured=bool(spec.load.request_rates) or spec.searches_max_rate)
    data["name"] = name
    data["execution"]["compile_cache_dir"] = cache_dir
    trials = data["budget"]["n_trials"]
    if trials > TRIALS:
        data["budget"]["n_trials"] = TRIALS
        changes.append(f"budget.n_trials {trials} -> {TRIALS} (--n-trials N runs more)")
    return DryRun(StudySpec.model_validate(data), tuple(changes))


def _server(server: dict[str, Any], default_profile: str) -> list[str]:
    env = {k: v for k, v in server["env"].items() if k != "VLLM_CACHE_ROOT"}
    before = " ".join(server["command"])
    profile = env.setdefault(PROFILE_ENV, default_profile)
    scale = env.setdefault(TIME_SCALE_ENV, TIME_SCALE)
    startup = env.setdefault(STARTUP_SCALE_ENV, STARTUP_SCALE)
    server["env"] = env
    server["command"] = list(SIMULATOR_COMMAND)
    lines = [f"server.command {before} -> the built-in simulator, hardware profile {profile}; its clock "
             f"runs at {scale} x modelled time ({TIME_SCALE_ENV}), server starts at {startup} x "
             f"({STARTUP_SCALE_ENV}), so its tok/s and latencies are not the box's"]
    return lines


def _load(load: dict[str, Any], *, rates_measured: bool) -> list[str]:
    lines = []
    if load["sizing"] == "steady" or load["requests_per_stream"] > REQUESTS_PER_STREAM \
            or load["requests_per_level"] is not None or load["repeats"] > 1:
        was = ("steady-state windows of at least "
               f"{load['min_window_s']:g} s" if load["sizing"] == "steady" else "the file's request counts")
        load.update(sizing="requests", requests_per_stream=REQUESTS_PER_STREAM, requests_per_level=None,
                    min_requests=MIN_REQUESTS, warmup_requests=WARMUP_REQUESTS, repeats=1)
        lines.append(f"load: each level {REQUESTS_PER_STREAM} requests per stream (at least {MIN_REQUESTS}) "
                     f"after {WARMUP_REQUESTS} warm-up requests, once, instead of {was}")
    classes = load["workload"]["classes"]
    if load["workload"]["dataset"] is not None:
        # The user's own requests stay as the file has them: text is never rewritten.
        lines.append("load.workload.dataset: its requests are sent as the file has them (their lengths "
                     "set the dry run's pace)")
    elif any(c["output_tokens"] > OUTPUT_TOKENS or c["prompt_tokens"] > PROMPT_TOKENS for c in classes):
        was = ", ".join(f"{c['name']} {c['prompt_tokens']}/{c['output_tokens']}" for c in classes)
        for c in classes:
            prompt = min(c["prompt_tokens"], PROMPT_TOKENS)
            if c.get("prefix_tokens"):
                # The shared part keeps its share of the prompt, so the class still has a question.
                c["prefix_tokens"] = max(1, c["prefix_tokens"] * prompt // c["prompt_tokens"])
            c.update(output_tokens=min(c["output_tokens"], OUTPUT_TOKENS), prompt_tokens=prompt)
        lines.append(f"load.workload: requests of at most {PROMPT_TOKENS} prompt and {OUTPUT_TOKENS} output "
                     f"tokens (the file's prompt/output tokens: {was})")
    if load["fit_prompt_tokens"]:
        # Fitting asks /tokenize a few times per prompt: half of a short level's time.
        load["fit_prompt_tokens"] = False
        lines.append("load.fit_prompt_tokens true -> false: prompt lengths are estimated, not fitted with "
                     "the server's /tokenize")
    if load["rate_duration_s"] > RATE_DURATION_S:
        if rates_measured:
            lines.append(f"load.rate_duration_s {load['rate_duration_s']:g} -> {RATE_DURATION_S:g}")
        load["rate_duration_s"] = RATE_DURATION_S
    if load["trace"] is not None:
        lines += _trace(load["trace"])
    if load["host_check_s"]:
        lines.append(f"load.host_check_s {load['host_check_s']:g} -> 0 (the host check is the real run's)")
        load["host_check_s"] = 0.0
    return lines


def _trace(trace: dict[str, Any]) -> list[str]:
    """The trace level cut to TRACE_REQUESTS requests within TRACE_SECONDS of replay."""
    cap, window = trace["max_requests"], TRACE_SECONDS / trace["time_scale"]
    if (cap is not None and cap <= TRACE_REQUESTS) and (trace["duration_s"] is not None
                                                         and trace["duration_s"] <= window):
        return []
    trace["max_requests"] = min(cap or TRACE_REQUESTS, TRACE_REQUESTS)
    trace["duration_s"] = min(trace["duration_s"] or window, window)
    return [f"load.trace: at most {trace['max_requests']} requests of {trace['duration_s']:g} s of trace time "
            f"from start_s {trace['start_s']:g} (at most {TRACE_SECONDS:g} s of replay a trial)"]
