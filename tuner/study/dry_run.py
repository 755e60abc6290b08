"""``tuner run FILE --dry-run``: the study file, as it is, run against the built-in simulator
on fast clocks, so the whole night - reference, baseline, starting points, search, early
stops, confirmation re-runs, status, report and export - is seen in minutes before it is
spent on the box.

What changes, and only that: the server command becomes the simulator (the study's own
profile when its server.env names one, else the built-in profile of the study's shape:
``pick_profile``), the simulator's clocks run
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

from tuner.study.parameters import CategoricalParam, IntParam
from tuner.study.simulated import PROFILE_ENV, SIMULATOR_MODULE
from tuner.study.spec import StudySpec
from tuner.vllm.knobs import PYTHON_PLACEHOLDER

__all__ = ["DryRun", "dry_run_spec", "dry_run_name", "pick_profile", "PROFILES", "SUFFIX", "SIMULATOR_COMMAND",
           "TRIALS", "TIME_SCALE", "STARTUP_SCALE"]

SUFFIX = "-dry-run"
SIMULATOR_COMMAND = [PYTHON_PLACEHOLDER, "-m", SIMULATOR_MODULE]
TIME_SCALE_ENV, STARTUP_SCALE_ENV = "TUNER_SIM_TIME_SCALE", "TUNER_SIM_STARTUP_SCALE"
# The demo's clocks: tokens 10x faster than modelled, GLM-5's minutes of startup in about
# two seconds. The reference alone took 284 s on the unscaled clock; 7 s on these.
TIME_SCALE = 0.1
# ...except where the profile's steps are already short: the simulator and the client stream
# every token on this host's CPUs, and an 8B model's 6-ms decode step at 0.1 x (0.6 ms) is
# less than that costs them on two cores, so the host, not the model, set the pace (fresh
# starts of one configuration 14-24 % apart, c=32 at a twentieth of the model's rate). Its
# levels take about a second on the modelled clock anyway.
PROFILE_TIME_SCALES = {"llama8b-h100": 1.0}
STARTUP_SCALE = 0.001
# The built-in simulator profiles (tuner/sim/profiles) a dry run picks from by the study's
# shape when the study names none (pick_profile), and what each one is.
CPU_PROFILE, ONE_GPU_PROFILE, MULTI_GPU_PROFILE = "tiny-cpu", "llama8b-h100", "glm5-8xpcie"
PROFILES = {CPU_PROFILE: "SmolLM2-135M on a 2-core CPU", ONE_GPU_PROFILE: "an 8B Llama on one H100",
            MULTI_GPU_PROFILE: "GLM-5 on eight PCIe GPUs"}
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


def pick_profile(spec: StudySpec) -> tuple[str, str]:
    """The simulator profile a dry run of ``spec`` runs on, and why (a clause for the changes).

    The study's own ``server.env.TUNER_SIM_PROFILE`` if it sets one; else a CPU study
    (``gpus_per_trial`` 0, or a ``VLLM_CPU_*`` variable in ``server.env``) gets tiny-cpu; else
    the GPUs a trial's server uses - tensor_parallel_size x pipeline_parallel_size, the largest
    the fixed flags and the parameters can ask, 1 where unset, as vLLM - decide: one GPU gets
    llama8b-h100, more the eight-GPU GLM-5 box. The box's shape, never the model, decides."""

    server = spec.server
    own = server.env.get(PROFILE_ENV)
    if own is not None:
        return str(own), f"the study's own server.env.{PROFILE_ENV}"
    cpu_vars = sorted(k for k in server.env if k.startswith("VLLM_CPU_"))
    if server.gpus_per_trial == 0 or cpu_vars:
        hint = "server.gpus_per_trial 0" if server.gpus_per_trial == 0 else f"{cpu_vars[0]} in server.env"
        return CPU_PROFILE, f"a CPU study ({hint})"
    gpus = _largest("tensor_parallel_size", spec) * _largest("pipeline_parallel_size", spec)
    if gpus == 1:
        return ONE_GPU_PROFILE, "one GPU a trial (tensor_parallel_size x pipeline_parallel_size 1)"
    return MULTI_GPU_PROFILE, (f"{gpus} GPUs a trial (the largest tensor_parallel_size x pipeline_parallel_size "
                               "it asks)")


def _largest(flag: str, spec: StudySpec) -> int:
    """The largest value of an integer vLLM flag a trial of ``spec`` can ask (1 where unset)."""

    def norm(name: str) -> str:
        return name.replace("-", "_")

    found: list[Any] = [v for k, v in spec.server.flags.items() if norm(k) == flag]
    for p in spec.parameters:
        if p.flag is not None and norm(p.flag) == flag:
            if isinstance(p, IntParam):
                found.append(p.high)
            elif isinstance(p, CategoricalParam):
                found += p.values
    return max([1, *(int(v) for v in found if isinstance(v, int) and not isinstance(v, bool))])


def dry_run_spec(spec: StudySpec, *, name: str, cache_dir: str) -> DryRun:
    """``spec`` made to run on the simulator under ``name`` with its compile cache in
    ``cache_dir`` (the dry run's own folder: a study that shares vLLM's real cache must not
    get the simulator's entries in it).

    Raises:
        ValueError: the resulting study is not valid (e.g. the name grew too long).
    """

    data: dict[str, Any] = spec.model_dump(mode="json")
    changes = [f"study {spec.name} -> {name}: its own folder, storage and compile cache; nothing of "
               f"{spec.name}'s is read or written"]
    profile, why = pick_profile(spec)
    changes += _server(data["server"], profile)
    what = f" ({PROFILES[profile]})" if profile in PROFILES else ""
    other = "" if PROFILE_ENV in spec.server.env else \
        f"; server.env.{PROFILE_ENV} picks another (built-in: {', '.join(sorted(PROFILES))})"
    changes.append(f"simulator profile {profile}{what}: {why}{other}")
    changes += _load(data["load"], rates_measured=bool(spec.load.request_rates) or spec.searches_max_rate)
    data["name"] = name
    data["execution"]["compile_cache_dir"] = cache_dir
    trials = data["budget"]["n_trials"]
    if trials > TRIALS:
        data["budget"]["n_trials"] = TRIALS
        changes.append(f"budget.n_trials {trials} -> {TRIALS} (--n-trials N runs more)")
    return DryRun(StudySpec.model_validate(data), tuple(changes))


def _server(server: dict[str, Any], profile_name: str) -> list[str]:
    env = {k: v for k, v in server["env"].items() if k != "VLLM_CACHE_ROOT"}
    before = " ".join(server["command"])
    profile = env.setdefault(PROFILE_ENV, profile_name)
    scale = env.setdefault(TIME_SCALE_ENV, PROFILE_TIME_SCALES.get(profile, TIME_SCALE))
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
