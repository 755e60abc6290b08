"""A server's interpreter, started ahead of its trial (``execution.startup.prestart``).

Run by path with the server's own interpreter, which need not have the tuner installed, so
it uses the standard library alone::

    PYTHON spare_main.py STATUS MODULE

It imports what ``python -m MODULE`` imports at its top level, without running MODULE;
writes STATUS (JSON: its
import seconds, which environment variables the imports read, whether CUDA got initialised);
then waits for one JSON line on stdin: ``{"args": [...], "env": {...}, "log": PATH}``. With
it, the process takes exactly that environment, sends its output to PATH and runs MODULE as
``python -m MODULE *args`` would. End of input instead (the tuner discarded it, or died)
ends it quietly.

The environment read during the imports is recorded because a value read then is fixed for
the life of the process: the tuner uses a spare only for a server whose environment differs
from the spare's in variables nobody read yet (tuner.adapters.spare).
"""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import importlib.util
import json
import os
import runpy
import sys
import threading
import time


def _top_level_imports(module: str) -> list[str]:
    """Module names ``module``'s own top-level import statements name, in order."""

    spec = importlib.util.find_spec(module)
    if spec is not None and spec.submodule_search_locations is not None:   # a package runs its __main__
        names = [module]
        spec = importlib.util.find_spec(f"{module}.__main__")
        return names + _top_level_imports_of(spec)
    return _top_level_imports_of(spec)


def _top_level_imports_of(spec: importlib.machinery.ModuleSpec | None) -> list[str]:
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return []
    with open(spec.origin, encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from a import b`: b may be a submodule (its import is the slow part) or a name.
            names += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def _import_all(names: list[str]) -> tuple[int, dict[str, str]]:
    done, failed = 0, {}
    for name in dict.fromkeys(names):
        if name in sys.modules:
            done += 1
            continue
        try:
            importlib.import_module(name)
            done += 1
        except Exception as exc:   # a name, not a module, or an optional part: not fatal
            if type(exc) is not ModuleNotFoundError or not exc.name or not name.startswith(exc.name):
                failed[name] = f"{type(exc).__name__}: {exc}"[:300]
    return done, failed


def _cuda_initialized() -> bool:
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except Exception:
        return False


def _write_status(path: str, data: dict[str, object]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


def _take_environment(env: dict[str, str]) -> None:
    # Through os.environ so that C code (getenv) sees the same values.
    for name in [n for n in os.environ if n not in env]:
        del os.environ[name]
    os.environ.update(env)


def _wait_for_order(orders: list[str], ready: threading.Event) -> None:
    """Read the one order line. End of input, even mid-import, ends the process at once: the
    tuner that started it is gone or has no use for it."""

    line = sys.stdin.readline()
    if not line.strip():
        os._exit(0)
    orders.append(line)
    ready.set()


def main(argv: list[str]) -> int:
    status_path, module = argv[1], argv[2]
    orders: list[str] = []
    ready = threading.Event()
    threading.Thread(target=_wait_for_order, args=(orders, ready), daemon=True).start()
    # `python -m` puts the working directory first on the path; running this file by path
    # put its own folder there instead, whose modules must not shadow the server's.
    sys.path[0] = os.getcwd()
    began = time.monotonic()
    read: set[str] = set()
    original = os._Environ.__getitem__   # type: ignore[attr-defined]

    def recording(self: object, key: str) -> str:
        if isinstance(key, str):   # os.environb shares the class; its keys are bytes
            read.add(key)
        return original(self, key)

    os._Environ.__getitem__ = recording   # type: ignore[attr-defined]
    try:
        done, failed = _import_all(_top_level_imports(module))
    finally:
        os._Environ.__getitem__ = original   # type: ignore[attr-defined]
    cuda = _cuda_initialized()
    _write_status(status_path, {
        "pid": os.getpid(), "import_s": round(time.monotonic() - began, 3), "imported": done,
        "failed": failed, "env_read": sorted(read), "cuda_initialized": cuda,
    })
    if cuda:   # useless (a forked engine could not use it) and it holds the GPU: leave now
        return 3
    ready.wait()
    order = json.loads(orders[0])
    _take_environment({str(k): str(v) for k, v in order["env"].items()})
    log = os.open(order["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    quiet = os.open(os.devnull, os.O_RDONLY)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.dup2(quiet, 0)   # as a server started directly: stdin is /dev/null
    os.close(log)
    os.close(quiet)
    sys.argv = [module, *order["args"]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
