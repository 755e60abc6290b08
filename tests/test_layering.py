"""The package's shape, kept: no import cycle anywhere in ``tuner/``, every import pointing
down the layers (``RANK``), and the pure layer free of processes, sockets, clocks, the
environment, Ray, HTTP clients and file I/O.

Read from the source with ``ast`` (module-level and function-level imports alike, and
``TYPE_CHECKING`` ones: a cycle hidden in a function is still a cycle), nothing is imported.
``PURE`` lists the pure modules by name; a pure module may import only the standard
library's harmless parts, pydantic / PyYAML, and other pure modules - so an upward import
(a pure module reaching for the loop, an adapter or the CLI) fails here too. Run the checks
on a planted copy (``test_a_planted_*``) to see them fail.
"""

from __future__ import annotations

import ast
import shutil
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The pure layer, by module name (packages too: their __init__ is a docstring). A module
# joins when it passes the checks below.
PURE = [
    "tuner.errors", "tuner.energy.per_token", "tuner.energy.series", "tuner.energy.source",
    "tuner.views.export_formats", "tuner.load", "tuner.load.live_window", "tuner.load.load_spec",
    "tuner.load.metrics", "tuner.load.prometheus", "tuner.load.protocol", "tuner.load.records",
    "tuner.load.results", "tuner.load.sse", "tuner.load.stats", "tuner.load.steady",
    "tuner.load.slo", "tuner.load.efficiency", "tuner.load.level_energy", "tuner.energy.energy_text",
    "tuner.load.goodput", "tuner.load.rate_search", "tuner.load.max_rate_text", "tuner.load.token_counts",
    "tuner.load.uncertainty", "tuner.load.window", "tuner.load.host_steadiness", "tuner.load.dataset",
    "tuner.load.dataset_draw", "tuner.load.trace_prompts", "tuner.load.trace_spec", "tuner.load.level_names",
    "tuner.load.filler",
    "tuner.load.workload", "tuner.load.workload_profile",
    "tuner.probe", "tuner.probe.agreement", "tuner.probe.bank", "tuner.probe.checks",
    "tuner.probe.compare", "tuner.probe.items", "tuner.probe.known_score",
    "tuner.probe.numerics", "tuner.probe.plan_score", "tuner.probe.prompts_file", "tuner.probe.quality_stats",
    "tuner.probe.quality_items", "tuner.probe.quality_text",
    "tuner.probe.record", "tuner.probe.reference_score", "tuner.probe.sample",
    "tuner.probe.selection", "tuner.probe.shapes", "tuner.probe.spec", "tuner.probe.verdict",
    "tuner.probe.wire", "tuner.secrets", "tuner.study",
    "tuner.study.command", "tuner.study.confirmation", "tuner.study.confirmation_text",
    "tuner.study.bounds", "tuner.study.cost", "tuner.study.dry_run", "tuner.study.durations", "tuner.study.environment",
    "tuner.study.early_stop", "tuner.study.objectives",
    "tuner.study.outcome", "tuner.study.outcome_summary", "tuner.study.parameters", "tuner.study.pareto",
    "tuner.study.planner", "tuner.study.policy", "tuner.study.preflight", "tuner.study.quality",
    "tuner.study.quality_plan",
    "tuner.study.safe_yaml", "tuner.study.sampling", "tuner.study.simulated",
    "tuner.study.scoring", "tuner.study.server_spec", "tuner.study.spec_base", "tuner.study.surrogate",
    "tuner.study.sweep_guard",
    "tuner.study.space", "tuner.study.spec", "tuner.study.study_file", "tuner.study.study_name",
    "tuner.study.integrity", "tuner.study.trial_folders",
    "tuner.study.noise", "tuner.study.between_starts", "tuner.study.study_noise",
    "tuner.study.stopping", "tuner.study.ties", "tuner.study.trials", "tuner.study.trial_metrics",
    "tuner.study.weights", "tuner.terminal",
    "tuner.vllm",
    "tuner.vllm.argument_names", "tuner.vllm.compile_cache", "tuner.vllm.compile_order", "tuner.vllm.effective_config",
    "tuner.vllm.failure_signatures", "tuner.vllm.knob_values", "tuner.vllm.knobs", "tuner.vllm.log_digest",
    "tuner.vllm.log_lines", "tuner.vllm.lossy", "tuner.vllm.multicast", "tuner.vllm.parallel",
    "tuner.vllm.startup",
    "tuner.vllm.unverified", "tuner.vllm.verify",
]
# Pure modules not (yet) clean under mypy --strict; empty now, kept so a module can join the
# pure layer before its annotations are complete.
NOT_YET_TYPED: set[str] = set()
# Modules above the pure layer that are strict too: the whole study engine (the loop, the
# samplers, the reference, confirmation and tie re-runs, recovery, the trial worker and the
# Ray executor, where Ray's own untyped calls are marked), the whole store, the views'
# quality and serving-curve sections, the energy sources and their sampler, and the
# simulator's power model and quality gate.
TYPED_ABOVE_PURE = [
    "tuner.energy.detect", "tuner.energy.nvml", "tuner.energy.rapl", "tuner.energy.sampler",
    "tuner.load.level_meter", "tuner.engine.trial_energy",
    "tuner.engine.confirming", "tuner.engine.execution", "tuner.engine.measure", "tuner.engine.orchestrator",
    "tuner.engine.recovery", "tuner.engine.referencing", "tuner.engine.runfile", "tuner.engine.samplers",
    "tuner.engine.tie_runs", "tuner.engine.prestart", "tuner.engine.leftovers", "tuner.engine.pareto_file",
    "tuner.engine.quality_run",
    "tuner.engine.worker", "tuner.engine.ray_executor",
    "tuner.store.handle", "tuner.store.storage_lock", "tuner.store.records", "tuner.store.folder",
    "tuner.store.spec_guard",
    "tuner.views.quality_view", "tuner.views.serving_curve", "tuner.sim.power", "tuner.sim.quality_gate",
]
# What .ci/run type-checks with mypy --strict: the pure modules with code, and those above.
TYPED = sorted((set(PURE) - NOT_YET_TYPED - {"tuner.load", "tuner.probe", "tuner.study", "tuner.vllm"})
               | set(TYPED_ABOVE_PURE))

# The layers above the pure one, by package: a module may import a module of a lower rank,
# or of its own package; every pure module (PURE) is rank 1, below all of them, and the
# leaves (tuner's __init__) rank 0. A new package must be placed here (a test says so).
RANK = {
    "tuner.__main__": 8,      # python -m tuner
    "tuner.commands": 7,      # what a user types: parsing, printing, exit codes
    "tuner.views": 6,         # read-only views of a study: status, report, plots, export
    "tuner.sim": 6,           # the stand-in server and its in-process executor (drives the engine)
    "tuner.engine": 5,        # the study run: loop, Ray executor, worker, re-runs, recovery
    "tuner.store": 4,         # the study folder and its Optuna storage
    "tuner.probe": 4,         # the correctness probe's client (its rules are pure)
    "tuner.load": 3,          # the load generator's sockets and processes (its rules are pure)
    "tuner.adapters": 2,      # processes, /proc, nvidia-smi, files, the HTTP client
    "tuner.energy": 2,        # energy counters: NVML, RAPL sysfs, the sampling thread (its arithmetic is pure)
    "tuner": 0,
}


# Standard-library and third-party modules a pure module may import (by top-level name).
ALLOWED_EXTERNAL = {
    "__future__", "abc", "ast", "bisect", "collections", "copy", "dataclasses", "decimal", "difflib",
    "enum", "functools", "hashlib", "heapq", "ipaddress", "itertools", "json", "math", "numbers", "operator",
    "posixpath",  # path strings only (no file system, no current directory)
    "random", "re", "shlex", "statistics", "string", "sys", "textwrap", "typing", "unicodedata",
    "pydantic", "yaml",
    "numpy",    # arithmetic only (the planner's model); numpy reads no files unless asked to
}
# Attribute reads that are I/O, a clock or the environment, as (object name, attribute).
FORBIDDEN_ATTRS = {
    ("os", "environ"), ("os", "getenv"), ("os", "getcwd"), ("os", "system"), ("os", "kill"),
    ("sys", "stdout"), ("sys", "stderr"), ("sys", "stdin"), ("sys", "exit"), ("sys", "argv"),
    ("datetime", "now"), ("datetime", "utcnow"), ("date", "today"),
}
# Method calls that touch the file system, whatever the object (pathlib's names).
FILE_METHODS = {"read_text", "write_text", "read_bytes", "write_bytes", "mkdir", "unlink", "rmdir",
                "iterdir", "glob", "rglob", "touch", "exists", "is_file", "is_dir", "resolve", "stat"}
FORBIDDEN_CALLS = {"open", "input", "print", "breakpoint"}


@dataclass
class Module:
    name: str
    path: Path
    imports: set[str] = field(default_factory=set)           # tuner modules
    external: set[str] = field(default_factory=set)          # top-level names of the rest
    problems: list[str] = field(default_factory=list)         # forbidden uses (pure check)


def _module_name(package_root: Path, path: Path) -> str:
    parts = path.relative_to(package_root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def scan(package_root: Path) -> dict[str, Module]:
    """Every module under ``package_root`` with the tuner modules it imports (anywhere in
    its body) and what else it imports or touches."""

    paths = {_module_name(package_root, p): p for p in sorted(package_root.rglob("*.py"))}
    modules = {name: Module(name, path) for name, path in paths.items()}
    for name, module in modules.items():
        tree = ast.parse(module.path.read_text(), str(module.path))
        is_package = module.path.name == "__init__.py"
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    here = name.split(".")[: len(name.split(".")) - node.level + (1 if is_package else 0)]
                    base = ".".join([*here, base] if base else here)
                # "from package import module" imports the module, not the package's code.
                names = [f"{base}.{alias.name}" for alias in node.names]
                targets = [n for n in names if n in modules] or [base]
                if len(targets) < len(names):
                    targets.append(base)
            for target in targets:
                if target.split(".")[0] != "tuner":
                    module.external.add(target.split(".")[0])
                    continue
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    module.imports.add(target)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                if (node.value.id, node.attr) in FORBIDDEN_ATTRS:
                    module.problems.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
            if isinstance(node, ast.Call):
                func = node.func
                if isinstance(func, ast.Name) and func.id in FORBIDDEN_CALLS:
                    module.problems.append(f"line {node.lineno}: {func.id}()")
                if isinstance(func, ast.Attribute) and func.attr in FILE_METHODS:
                    module.problems.append(f"line {node.lineno}: .{func.attr}()")
    return modules


def cycles(modules: dict[str, Module]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""

    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in modules:
        if start in index:
            continue
        work: list[tuple[str, Iterable[str]]] = [(start, iter(sorted(modules[start].imports)))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(modules[nxt].imports))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def purity_problems(modules: dict[str, Module], pure: Iterable[str]) -> list[str]:
    pure = set(pure)
    out = []
    for name in sorted(pure):
        module = modules.get(name)
        if module is None:
            out.append(f"{name}: listed as pure but does not exist")
            continue
        out += [f"{name}: imports {ext}" for ext in sorted(module.external - ALLOWED_EXTERNAL)]
        out += [f"{name}: imports {imp}, which is not pure" for imp in sorted(module.imports - pure)
                if imp != "tuner"]
        out += [f"{name}: {problem}" for problem in module.problems]
    return out


def _rank(name: str, pure: set[str]) -> int | None:
    if name in pure:
        return 1
    parts = name.split(".")
    for key in (".".join(parts[:2]), name):
        if key in RANK:
            return RANK[key]
    return None


def upward_imports(modules: dict[str, Module], pure: Iterable[str]) -> list[str]:
    """Imports that point up the layers or sideways into another package of the same rank,
    and modules no layer holds."""

    pure = set(pure)
    out = []
    for name, module in sorted(modules.items()):
        rank = _rank(name, pure)
        if rank is None:
            out.append(f"{name}: in no layer (add its package to RANK)")
            continue
        for target in sorted(module.imports):
            to = _rank(target, pure)
            if to is None:
                continue
            if to > rank or (to == rank and rank > 1 and target.split(".")[:2] != name.split(".")[:2]):
                out.append(f"{name} (rank {rank}) imports {target} (rank {to})")
    return out


def test_every_import_points_down() -> None:
    assert upward_imports(scan(ROOT / "tuner"), PURE) == []


def test_a_planted_upward_import_between_layers_is_found(copy_of_tuner: Path) -> None:
    _plant(copy_of_tuner / "store" / "records.py", "from tuner.views.status import build_status  # noqa")
    _plant(copy_of_tuner / "engine" / "worker.py", "from tuner.commands.main import main  # noqa")
    _plant(copy_of_tuner / "views" / "report.py", "from tuner.sim.truth import evaluate  # noqa")
    found = upward_imports(scan(copy_of_tuner), PURE)
    assert "tuner.store.records (rank 4) imports tuner.views.status (rank 6)" in found
    assert "tuner.engine.worker (rank 5) imports tuner.commands.main (rank 7)" in found
    assert any(f.startswith("tuner.views.report (rank 6) imports tuner.sim.truth") for f in found)


def test_a_module_in_a_new_package_must_be_placed(copy_of_tuner: Path) -> None:
    (copy_of_tuner / "extras").mkdir()
    (copy_of_tuner / "extras" / "__init__.py").write_text("")
    assert "tuner.extras: in no layer (add its package to RANK)" in upward_imports(scan(copy_of_tuner), PURE)


def test_no_import_cycle_in_the_package() -> None:
    assert cycles(scan(ROOT / "tuner")) == []


def test_the_pure_layer_has_no_io_and_imports_only_pure_modules() -> None:
    assert purity_problems(scan(ROOT / "tuner"), PURE) == []


@pytest.fixture
def copy_of_tuner(tmp_path: Path) -> Path:
    target = tmp_path / "tuner"
    shutil.copytree(ROOT / "tuner", target, ignore=shutil.ignore_patterns("__pycache__", "*.yaml", "*.json"))
    return target


def _plant(path: Path, line: str) -> None:
    path.write_text(path.read_text() + f"\n\ndef _planted() -> None:\n    {line}\n")


def test_a_planted_upward_import_is_found(copy_of_tuner: Path) -> None:
    _plant(copy_of_tuner / "study" / "space.py", "from tuner.engine.orchestrator import StudyLoop  # noqa")
    problems = purity_problems(scan(copy_of_tuner), PURE)
    assert "tuner.study.space: imports tuner.engine.orchestrator, which is not pure" in problems
    assert any("tuner.study.space" in c and "tuner.engine.orchestrator" in c for c in cycles(scan(copy_of_tuner)))


def test_a_planted_cycle_is_found(copy_of_tuner: Path) -> None:
    _plant(copy_of_tuner / "study" / "trials.py", "from tuner.study import policy  # noqa")
    found = cycles(scan(copy_of_tuner))
    assert any({"tuner.study.policy", "tuner.study.trials"} <= set(c) for c in found), found


def test_planted_io_in_a_pure_module_is_found(copy_of_tuner: Path) -> None:
    _plant(copy_of_tuner / "study" / "policy.py", "import time, os; time.monotonic() + len(os.environ['X'])")
    problems = purity_problems(scan(copy_of_tuner), PURE)
    assert "tuner.study.policy: imports time" in problems
    assert any(p.startswith("tuner.study.policy: line") and "os.environ" in p for p in problems)
    assert "tuner.study.policy: imports os" in problems


def test_the_ci_type_checks_exactly_the_typed_list() -> None:
    """.ci/run runs mypy --strict on the modules of TYPED, no more, no less."""

    ci = (ROOT / ".ci" / "run").read_text()
    listed = {line.strip().removesuffix("\\").strip() for line in ci.splitlines()
              if line.strip().startswith("tuner/")}
    wanted = {name.replace(".", "/") + ".py" for name in TYPED}
    assert listed == wanted, f"in .ci/run only: {listed - wanted}; in TYPED only: {wanted - listed}"


if __name__ == "__main__":   # a quick look: python tests/test_layering.py
    found = scan(ROOT / "tuner")
    print("cycles:", cycles(found))
    print("\n".join(purity_problems(found, PURE)) or "pure layer: clean")
    print("\n".join(upward_imports(found, PURE)) or "layers: every import points down")
    sys.exit(0)
