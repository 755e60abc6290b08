"""Shared helpers for tests that run real tuner, simulator and Ray processes."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fake_server import Served, serving
from tests.sim_process import Sim
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[1]
# Room a timing bound leaves for a loaded CI box: scripts/run_tests.sh runs this lane beside a
# real vLLM server that keeps both cores busy, where a 0.1 s poll has taken three seconds. A
# bound that tells two mechanisms apart (a detection against a 60 s timeout) adds this; the
# idle-box figures are benchmarks' (benchmarks/fail_fast.py), not tests'.
LOADED_BOX_SLACK_S = 8.0


def free_port_block(size: int = 4) -> int:
    """A base port with ``size`` consecutive free ports after it.

    Drawn below the kernel's ephemeral range and above Ray's worker ports (10002-19999): a
    port the kernel hands out for binding to port 0 can be taken by one of Ray's processes
    in the seconds between this check and the server's start (seen: a simulator's study
    port held by a Ray process started by the same `tuner run`)."""

    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    top = max(low, 20000 + 200 + size) - size
    rng = random.Random()
    for _ in range(500):
        base = rng.randrange(20000, top)
        ok = True
        for port in range(base, base + size):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free port block")


def processes_with_env(marker: str) -> list[int]:
    """Pids whose environment contains TUNER_TEST_ID=<marker> (our simulators)."""

    needle = f"TUNER_TEST_ID={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes():
                stat = (entry / "stat").read_text()
                if stat[stat.rfind(")") + 2] not in "ZX":
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def _ignores_sigint(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    ignored = next((line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:")), "0")
    return bool(int(ignored, 16) & (1 << (signal.SIGINT - 1)))


def host_probes_running(marker: str, cli_pid: int, probes: int) -> bool:
    """``probes`` host-check probes (tuner.adapters.host_probe) of a CLI carrying ``marker``
    are timing their work: each ignores SIGINT (the CLI's to handle) and has pinned itself
    to its CPU, which it does after that, at the start of its run."""

    def pinned(pid: int) -> bool:
        try:
            return len(os.sched_getaffinity(pid)) == 1
        except OSError:
            return False

    running = [pid for pid in processes_with_env(marker) if pid != cli_pid and _ignores_sigint(pid) and pinned(pid)]
    return len(running) >= probes


def write_study(tmp_path: Path, *, base: str = "demo.yaml", name: str | None = None,
                updates: dict[str, Any] | None = None, env: dict[str, Any] | None = None) -> tuple[Path, str]:
    """A copy of a shipped study with a unique port block, marker and optional changes."""

    data = yaml.safe_load((ROOT / "search_spaces" / base).read_text())
    marker = uuid.uuid4().hex[:12]
    data["name"] = name or f"t{marker}"
    data["server"]["port"] = free_port_block()
    data["server"].setdefault("env", {})["TUNER_TEST_ID"] = marker
    data["server"]["env"].update(env or {})
    for dotted, value in (updates or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    path = tmp_path / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path, marker


def tuner_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "tuner", *args]


def run_tuner(*args: str, timeout: float = 600, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(tuner_argv(*args), cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session", autouse=True)
def private_compile_cache(tmp_path_factory: pytest.TempPathFactory):
    """Every server the tests start (simulator or real vLLM, through Ray's workers, which
    inherit this process's environment) keeps its torch.compile cache in this session's
    temporary folder, never in ~/.cache. A VLLM_CACHE_ROOT set by the caller is kept."""

    if os.environ.get("VLLM_CACHE_ROOT"):
        yield os.environ["VLLM_CACHE_ROOT"]
        return
    root = tmp_path_factory.mktemp("vllm-cache")
    os.environ["VLLM_CACHE_ROOT"] = str(root)
    try:
        yield str(root)
    finally:
        os.environ.pop("VLLM_CACHE_ROOT", None)


@pytest.fixture
def orphan_check():
    """Yields a list to append markers to; fails if any process with a marker survives."""

    markers: list[str] = []
    yield markers
    leftovers: dict[str, list[int]] = {}
    for marker in markers:
        if pids := wait_no_orphans(marker, timeout=5):
            leftovers[marker] = pids
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    assert not leftovers, f"orphan processes left behind: {leftovers}"


# -- in-test servers (tests/fake_server.py, tests/sim_process.py) --------------------


@pytest.fixture(scope="module")
def _server() -> Iterator[Served]:
    """The fake streaming server, one per test module."""
    with serving() as served:
        yield served


@pytest.fixture
def served(_server: Served) -> Served:
    """The module's fake streaming server, its counters and switches reset for this test."""
    _server.state.reset()
    return _server


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., Sim]]:
    """start(*argv, ready=True, **env) runs the simulator as `vllm serve` (waiting until it
    answers /health unless ready=False); every one started is killed after the test."""
    procs: list[Sim] = []

    def _start(*argv: str, ready: bool = True, **env: str) -> Sim:
        sim = Sim(tmp_path, ["--model", "/models/smol", *argv], env)
        procs.append(sim)
        if ready:
            sim.wait_ready()
        return sim

    yield _start
    for p in procs:
        p.kill()


# -- fault-injection bookkeeping (tests/test_faults.py and friends) -------------------

# The rows go to a file the whole session shares: under pytest-xdist (scripts/run_tests.sh)
# the tests run in worker processes, and the table is printed by the controlling one. The
# controller names the file before its workers start; they inherit the variable.
FAULT_ROWS_ENV = "TUNER_TEST_FAULT_ROWS"


@pytest.hookimpl(trylast=True)   # after pytest's own tmp_path set-up
def pytest_configure(config: Any) -> None:
    if not hasattr(config, "workerinput"):   # the controller (or a run without xdist)
        path = Path(config._tmp_path_factory.getbasetemp()) / "fault-rows.jsonl"
        path.unlink(missing_ok=True)
        os.environ[FAULT_ROWS_ENV] = str(path)


# Files that must not run at the same time as each other under pytest-xdist: both start a
# ray.cluster_utils.Cluster, which writes /tmp/ray/ray_current_cluster on start and deletes it on
# shutdown, and one test checks the tuner does not join the cluster that file names (CI
# 2026-12-07: the other file's teardown deleted it mid-test). One scope puts them on one worker.
SHARED_SCOPES = {"tests/test_multinode_environment.py": "tests/test_multinode.py"}
# Tests that share nothing with the rest of their file (no module fixture) and are long enough
# to be worth a worker of their own: the quiet-host tests run before the real-vLLM lane starts,
# so their longest scope holds the lane back.
OWN_SCOPE = (
    "tests/test_confirm_study.py::test_a_wall_clock_limit_keeps_time_for_the_reruns",
    "tests/test_confirm_study.py::test_second_ctrl_c_kills_a_rerun_at_once_and_a_later_confirm_starts_afresh",
)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: Any, log: Any) -> Any:
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedFileScheduling(LoadFileScheduling):   # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith(OWN_SCOPE):
                return nodeid
            scope = super()._split_scope(nodeid)
            return SHARED_SCOPES.get(scope, scope)

    return SharedFileScheduling(config, log)


def record_fault_row(scenario: str, *, detection: str, lost: int, orphans: int, reason: str) -> None:
    """One line of the fault table printed at the end of the session."""

    row = {"scenario": scenario, "detection": detection, "lost": lost, "orphans": orphans, "reason": reason}
    with open(os.environ[FAULT_ROWS_ENV], "a", encoding="utf-8") as rows:
        rows.write(json.dumps(row) + "\n")


def _fault_rows() -> list[dict[str, Any]]:
    path = Path(os.environ.get(FAULT_ROWS_ENV, "/nonexistent"))
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# Seconds per test file (setup, call and teardown), printed at the end: the CI log is the one
# place the whole suite's time is seen on CI's machine, and cutting it starts from where it goes.
FILE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    file = report.nodeid.split("::", 1)[0]
    FILE_SECONDS[file] = FILE_SECONDS.get(file, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: Any) -> None:
    if FILE_SECONDS:
        terminalreporter.section("seconds per test file (the 25 slowest)")
        total = sum(FILE_SECONDS.values())
        for file, seconds in sorted(FILE_SECONDS.items(), key=lambda kv: -kv[1])[:25]:
            terminalreporter.write_line(f"{seconds:8.1f}  {100 * seconds / total:4.1f} %  {file}")
        terminalreporter.write_line(f"{total:8.1f}  in {len(FILE_SECONDS)} files")
    fault_rows = _fault_rows()
    if not fault_rows:
        return
    terminalreporter.section("fault injection")
    widths = {"scenario": 28, "detection": 44, "lost": 11, "orphans": 7}
    head = (f"{'scenario':<{widths['scenario']}} {'detection':<{widths['detection']}} "
            f"{'trials lost':>{widths['lost']}} {'orphans':>{widths['orphans']}}  recorded reason")
    terminalreporter.write_line(head)
    terminalreporter.write_line("-" * len(head))
    for row in fault_rows:
        terminalreporter.write_line(
            f"{row['scenario']:<{widths['scenario']}} {row['detection']:<{widths['detection']}} "
            f"{row['lost']:>{widths['lost']}} {row['orphans']:>{widths['orphans']}}  {row['reason']}")


def wait_no_orphans(marker: str, timeout: float = 10.0) -> list[int]:
    """Pids still carrying the marker after up to ``timeout`` s (empty = no orphan)."""

    try:
        wait_for(lambda: not processes_with_env(marker), timeout, f"the processes marked {marker} to go",
                 every=0.2)   # each check reads every process's environment
    except AssertionError:
        return processes_with_env(marker)
    return []


def load_trials(results: Path, name: str, storage: str | None = None) -> list[Any]:
    import optuna

    url = storage or f"sqlite:///{(results / name / 'optuna.db').resolve()}"
    return optuna.load_study(study_name=name, storage=url).get_trials(deepcopy=False)


def lost_completed(results: Path, name: str, storage: str | None = None) -> int:
    """Trials whose worker wrote a completed outcome.json but that the storage does not
    hold as COMPLETE with values: measurements the tuner lost."""

    by_number = {t.number: t for t in load_trials(results, name, storage)}
    lost = 0
    for path in sorted((results / name / "trials").glob("*/outcome.json")):
        data = yaml.safe_load(path.read_text())  # JSON is YAML
        if data.get("status") != "completed":
            continue
        trial = by_number.get(int(data["number"]))
        if trial is None or trial.state.name != "COMPLETE" or trial.values is None:
            lost += 1
    return lost


def failure_reasons(results: Path, name: str, storage: str | None = None) -> dict[int, str | None]:
    """Trial number -> the failure reason recorded in the storage (run trials only)."""

    return {t.number: t.user_attrs.get("failure", {}).get("reason")
            for t in load_trials(results, name, storage) if t.user_attrs.get("kind", "run") == "run"}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]):
    """Under CI=true a real-vLLM test that skips (no .venv-vllm, no model) fails instead:
    CI installs the vLLM CPU build, so a skip there means a broken setup step, and a green
    run that silently skipped the real-server study would prove nothing."""

    outcome = yield
    report = outcome.get_result()
    if (report.skipped and os.environ.get("CI") == "true"
            and item.get_closest_marker("realvllm") is not None):
        report.outcome = "failed"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.longrepr = f"real-vLLM test skipped under CI=true: {reason}"


# -- headless Chromium (report pages) ---------------------------------------------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# CI installs Chromium, so there a missing browser is a failure, not a skip.
needs_chromium = pytest.mark.skipif(CHROMIUM is None and os.environ.get("CI") != "true",
                                    reason="chromium not installed (.ci/run installs it)")


def render_in_chromium(page: Path, profile: Path) -> tuple[str, list[str]]:
    """Open ``page`` in headless Chromium; return (the DOM after load, console messages).

    The report marks ``data-plots-rendered="yes"`` on <body> once every figure decoded;
    any console line (a script error, a failed load) is returned for the caller to assert on.
    """

    assert CHROMIUM is not None, "chromium not installed"
    run = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
         "--virtual-time-budget=5000", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout, [l for l in run.stderr.splitlines() if ":CONSOLE" in l]


# -- the committed real CPU study (results/examples/smollm2-cpu) ------------------------

CPU_EXAMPLE = ROOT / "results" / "examples" / "smollm2-cpu"


def measured_with_flags(folder: Path, flags: dict[str, Any]) -> None:
    """Make the study in ``folder`` one that was run with these fixed ``server.flags``: its
    spec.yaml says so and so does every trial's recorded command. (An edit of spec.yaml
    alone is refused by every command that reads the study: issue 39, item 6.)"""

    from tuner.secrets import public_spec
    from tuner.study.space import trial_command
    from tuner.study.study_file import parse_study

    data = yaml.safe_load((folder / "spec.yaml").read_text())
    data["server"]["flags"].update(flags)
    text = yaml.safe_dump(data, sort_keys=False)
    (folder / "spec.yaml").write_text(text)
    spec = public_spec(parse_study(text, saved=True))   # an example's spec.yaml, old keys and all
    for command_json in sorted((folder / "trials").glob("*/command.json")):
        ran = json.loads(command_json.read_text())
        now = trial_command(spec, ran["values"], python=ran["argv"][0])
        port = ran["argv"][ran["argv"].index("--port") + 1]
        ran["argv"] = [port if prev == "--port" else word for prev, word in zip(["", *now.argv], now.argv)]
        command_json.write_text(json.dumps(ran, indent=2))


def copy_cpu_example(tmp_path: Path) -> Path:
    """A results root holding a copy of the committed CPU example study.

    Tests read the copy, so nothing they run can write into results/examples.
    """

    assert (CPU_EXAMPLE / "spec.yaml").exists(), f"{CPU_EXAMPLE} is missing"
    root = tmp_path / "results"
    shutil.copytree(CPU_EXAMPLE, root / CPU_EXAMPLE.name)
    return root


def rebuilt_study(original: Any, name: str,
                  edit: Callable[[int, dict[str, Any], dict[str, float]], None]) -> Any:
    """An in-memory copy of an Optuna study with each trial's user attributes and constraints
    passed through ``edit(number, attrs, constraints)`` (changed in place): a committed example
    read as if its trials had stored something else (tests of the views)."""
    import optuna

    study = optuna.create_study(directions=original.directions, study_name=name)
    study.set_metric_names(list(original.metric_names or []))
    for key, value in original.user_attrs.items():
        study.set_user_attr(key, value)
    for t in original.get_trials(deepcopy=True):
        attrs = dict(t.user_attrs)
        constraints = {k.split(":", 1)[1]: v for k, v in t.system_attrs.items() if k.startswith("constraints:")}
        edit(t.number, attrs, constraints)
        study.add_trial(optuna.trial.create_trial(
            state=t.state, values=t.values, params=t.params, distributions=t.distributions,
            user_attrs=attrs, constraints=constraints or None))
    return study
