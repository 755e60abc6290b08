"""The startup log a configuration would print, without starting anything.

Runs the simulator's own startup code (``tuner.sim.__main__``: the lines ``main`` prints
before resolving, then ``Sim.startup``) with no delays, no EngineCore child and no socket,
into a string. The ground truth's "applied" verdicts go through it
(``tuner.sim.truth_verify.log_mismatches``: this log, ``parse_effective_config`` and
``verify``), as does early stop while starting (``Evaluator.startup_verdict``).
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Mapping, Sequence

from tuner.sim.__main__ import Sim
from tuner.sim.args import ArgvError, non_default_args, parse_argv
from tuner.sim.effective import ConfigError, resolve
from tuner.sim.faults import ActiveFaults
from tuner.sim.logs import LogWriter, banner, non_default_line, sim_notice, traceback_lines
from tuner.sim.profile import Profile

__all__ = ["startup_log"]


class _DrySim(Sim):
    def spawn_child(self) -> None:   # no EngineCore process: only its pid is printed
        self.log.engine_pid = self.log.api_pid + 1

    def kill_child(self, graceful: bool) -> None:
        return None


def startup_log(argv: Sequence[str], env: Mapping[str, str], profile: Profile) -> str:
    """Log text up to readiness (or the failure traceback) for `vllm serve` argv (no prefix)."""

    out = io.StringIO()
    log = LogWriter(out, clock=lambda: 0.0, api_pid=1000)
    try:
        args = parse_argv(argv)
    except ArgvError as exc:
        return exc.text
    for line in banner(args.model):
        log.api("INFO", "api_utils.py:345", line)
    log.api("INFO", "api_utils.py:286", non_default_line(non_default_args(args)))
    try:
        eff = resolve(args, env, profile)
    except ConfigError as exc:
        for line in traceback_lines(exc.failure):
            log.raw(line, "APIServer")
        return out.getvalue()
    log.api("INFO", "api_utils.py:346", sim_notice(eff, 1.0))
    sim = _DrySim(eff, ActiveFaults([]), 1.0, log, sock=None, startup_scale=0.0)  # type: ignore[arg-type]
    asyncio.run(sim.startup())
    return out.getvalue()
