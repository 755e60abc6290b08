"""The simulator's stand-in for vLLM's EngineCore process.

It does no compute: it exists so the process tree looks like vLLM's (API server + EngineCore
child in the SAME process group, no setsid), which exercises the tuner's process-group kill.
It exits when signalled (printing vLLM's [shutdown] lines) or when its parent disappears.
Deliberately imports nothing from the rest of the package so it starts in milliseconds.
"""

from __future__ import annotations

import os
import signal
import sys
import time


def _line(level: str, src: str, msg: str) -> str:
    stamp = time.strftime("%m-%d %H:%M:%S")
    return f"(EngineCore pid={os.getpid()}) {level} {stamp} [{src}] {msg}\n"


def main(argv: list[str]) -> int:
    parent = int(argv[0])
    if "--ignore-signals" in argv:
        # Fault ignore_sigterm: only SIGKILL (e.g. the tuner's killpg) ends this process.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    else:
        def on_signal(signum: int, _frame: object) -> None:
            name = signal.Signals(signum).name
            sys.stdout.write(
                _line("INFO", "core.py:1313", f"[shutdown] EngineCore: trigger received signal={name}")
                + _line("INFO", "core.py:1432", "[shutdown] EngineCore: start mode=abort timeout=0s")
                + _line("INFO", "core.py:1463", "[shutdown] EngineCore: request processing complete; "
                        "starting resource teardown")
                + _line("INFO", "core.py:1326", "[shutdown] EngineCore: exiting busy loop"))
            sys.stdout.flush()
            os._exit(0)

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
    while os.getppid() == parent:   # orphaned (parent SIGKILLed): leave promptly
        time.sleep(0.1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
