"""Entry point: `python -m tuner.sim [serve] --model M [vLLM flags]` behaves like `vllm serve`.

Startup prints vLLM's log lines with simulated (time-scaled) delays, starts an EngineCore
child in the same process group, binds the port early but listens only once startup is done
(so connections are refused before, as with vLLM), then serves until SIGTERM/SIGINT.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import uvicorn

from tuner.sim.args import ArgvError, non_default_args, parse_argv
from tuner.sim.cache import CompileCache, compile_factors, compile_hash, default_root
from tuner.sim.effective import ConfigError, Effective, Failure, resolve
from tuner.sim.engine import Engine
from tuner.sim.faults import ActiveFaults, FaultError, applies, parse_faults
from tuner.sim.logs import (
    ENGINE_STARTUP_FAILED,
    LogWriter,
    backends_line,
    banner,
    capture_bars,
    engine_config_line,
    nccl_debug_lines,
    non_default_line,
    route_lines,
    sim_notice,
    traceback_lines,
)
from tuner.sim.power import POWERCAP_DIR_ENV, write_counters
from tuner.sim.profile import Profile, ProfileError, load_profile
from tuner.sim.server import QuietServer, SimServer, api_tokens


def effective_config(argv: Sequence[str], env: Mapping[str, str], profile: Profile) -> Effective:
    """Pure helper: what configuration these argv/env would run on `profile`."""
    return resolve(parse_argv(argv), env, profile, parse_faults(env.get("TUNER_SIM_FAULTS")))


class Sim:
    def __init__(self, eff: Effective, faults: ActiveFaults, scale: float, log: LogWriter,
                 sock: socket.socket, startup_scale: float | None = None, *,
                 cache: CompileCache | None = None, env: Mapping[str, str] | None = None,
                 api_keys: list[str] | None = None) -> None:
        self.eff = eff
        self.api_keys = list(api_keys or [])
        # No cache given (dry logs): look like a miss, write nothing.
        self.cache = cache or CompileCache(default_root({}), enabled=False)
        self.env = dict(env or {})
        self.compile_hit: bool | None = None
        self.faults = faults
        self.scale = scale
        # Startup (weight loading, compile, capture) may be compressed separately: a demo
        # wants minutes of GLM-5 startup to take seconds without distorting token timing.
        self.startup_scale = scale if startup_scale is None else startup_scale
        self.log = log
        self.sock = sock
        self.child: subprocess.Popen[bytes] | None = None
        self.stop = asyncio.Event()
        self.simulated = 0.0

    async def wait(self, seconds: float) -> None:
        """Sleep `seconds` of simulated startup time; returns early only through cancellation."""
        self.simulated += seconds
        if seconds > 0:
            await asyncio.sleep(seconds * self.startup_scale)

    def spawn_child(self) -> None:
        cmd = [sys.executable, "-m", "tuner.sim._engine_core_child", str(os.getpid())]
        if "ignore_sigterm" in self.faults:
            cmd.append("--ignore-signals")
        # Same process group on purpose (no setsid), like vLLM's EngineCore.
        self.child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
        self.log.engine_pid = self.child.pid

    def kill_child(self, graceful: bool) -> None:
        if self.child is None or self.child.poll() is not None:
            return
        if graceful:
            self.child.terminate()
            try:
                self.child.wait(timeout=0.5)
                return
            except subprocess.TimeoutExpired:
                self.log.api("WARNING", "utils.py:626", "[shutdown] Process manager: force killing "
                             "remaining processes count=1")
        self.child.kill()
        self.child.wait(timeout=2)

    async def compile(self, cuda: bool) -> float:
        """torch.compile with vLLM's cache (tuner.sim.cache): load on a hit, else compile and
        write the entry; the lines are vLLM's (0.26/0.32 miss fixtures, AOT hit format
        strings). Returns the seconds vLLM reports as "compilation"."""

        eff, log, st = self.eff, self.log, self.eff.profile.startup
        cache = self.cache
        key = compile_hash(eff, self.env)
        hit = cache.lookup(key)
        self.compile_hit = hit
        module = "" if cuda else "[backbone] "     # 0.32 on CPU names the compiled module
        rng = f"(1, {eff.max_num_batched_tokens})"
        if not cuda:
            log.engine("INFO", "cpu_model_runner.py:96", "Warming up model for the compilation...")
        log.engine("INFO", "backends.py:1094", f"Using cache directory: {cache.inductor_dir(key)} "
                   "for vLLM's torch.compile")
        if hit:
            dynamo, load = st.compile_hit_parts
            await self.wait(dynamo)
            log.engine("INFO", "backends.py:1155", f"Dynamo bytecode transform time: {dynamo:.2f} s")
            await self.wait(load)
            log.engine("INFO", "backends.py:292", f"Directly load the compiled graph(s) for compile "
                       f"range {rng} from the cache, took {load:.3f} s")
            log.engine("INFO", "decorators.py:311", f"{module}Directly load AOT compilation from path "
                       f"{cache.aot_path(key)}")
            total = dynamo + load
        else:
            await self.wait(st.dynamo_s)
            log.engine("INFO", "backends.py:1155", f"Dynamo bytecode transform time: {st.dynamo_s:.2f} s")
            log.engine("INFO", "backends.py:378", f"Cache the graph of compile range {rng} for later use")
            await self.wait(st.inductor_s)
            log.engine("INFO", "backends.py:393", f"Compiling a graph for compile range {rng} takes "
                       f"{st.inductor_s:.2f} s")
            total = st.dynamo_s + st.inductor_s
            saved = cache.store(key, compile_factors(eff, self.env), total)
            if saved is not None:
                log.engine("INFO", "decorators.py:708" if cuda else "decorators.py:743",
                           f"{module}saved AOT compiled function to {saved}")
            elif cache.enabled:
                log.engine("WARNING", "decorators.py:712", f"unable to save AOT compiled function to "
                           f"{cache.aot_path(key)}: write failed")
        log.engine("INFO", "monitor.py:53", f"torch.compile took {total:.2f} s in total")
        return total

    def engine_failure(self, failure: Failure) -> int:
        if failure.nccl_line:
            self.log.raw(f"simhost:{self.log.engine_pid}:{self.log.engine_pid} [0] "
                         f"{failure.nccl_line}", "EngineCore")
        self.log.engine("ERROR", "core.py:1330", "EngineCore failed to start.")
        for line in traceback_lines(failure):
            self.log.engine("ERROR", "core.py:1330", line)
        for line in ENGINE_STARTUP_FAILED:
            self.log.raw(line, "APIServer")
        self.kill_child(graceful=False)
        return 1

    async def startup(self) -> int | None:
        """Print the startup log with simulated delays; an exit code if startup fails.

        The stages run in vLLM's order; a failure resolved ahead of time (``eff.failure``)
        is raised at the stage it names, after that stage's log lines."""
        st = self.eff.profile.startup
        await self._init_engine()
        injected = self._injected_failure()
        if injected is not None:
            return self.engine_failure(injected)
        if (fail := self._failure_at("init")) is not None:
            return self.engine_failure(fail)
        self._log_nccl_init()
        if (fail := self._failure_at("comm")) is not None:
            return self.engine_failure(fail)
        self._log_model_start()
        if (fail := self._failure_at("attn")) is not None:
            return self.engine_failure(fail)
        await self.wait(st.weight_load_s)
        if (fail := self._failure_at("load")) is not None:
            return self.engine_failure(fail)
        compile_s = await self._load_compile_profile()
        if (fail := self._failure_at("kv")) is not None:
            return self.engine_failure(fail)
        await self._init_kv_cache()
        if (fail := self._failure_at("kv_backend")) is not None:
            return self.engine_failure(fail)
        await self._capture_graphs()
        await self._serve_ready(compile_s)
        return None

    def _failure_at(self, stage: str) -> Failure | None:
        fail = self.eff.failure
        return fail if fail and fail.stage == stage else None

    async def _init_engine(self) -> None:
        """API-server init, then the EngineCore child and its engine-config lines."""
        eff, log, st = self.eff, self.log, self.eff.profile.startup
        cuda = eff.profile.hardware.platform == "cuda"
        for n in eff.notices_for("api"):
            log.api(n.level, n.source, n.text)
        await self.wait(st.api_init_s)
        self.spawn_child()
        log.engine("INFO", "core.py:133", engine_config_line(eff))
        backend = "nccl" if cuda else "gloo"
        log.engine("INFO", "parallel_state.py:1615", f"world_size={eff.tp * eff.pp} rank=0 "
                   f"local_rank=0 distributed_init_method=tcp://127.0.0.1:{eff.port + 1000} "
                   f"backend={backend}")
        await self.wait(st.engine_init_s)

    def _injected_failure(self) -> Failure | None:
        """The engine failure a crash_at_start / oom_at_start fault injects, if any."""
        eff = self.eff
        if "crash_at_start" in self.faults:
            return Failure("engine", "RuntimeError", "CUDA error: an illegal memory access was "
                           "encountered")
        if "oom_at_start" in self.faults:
            hw = eff.profile.hardware
            return Failure(
                "engine", "ValueError", f"Free memory on device cuda:0 ({hw.free_memory_gib:.2f}/"
                f"{hw.memory_gib:.2f} GiB) on startup is less than desired GPU memory utilization "
                f"({eff.gpu_memory_utilization}, {eff.gpu_memory_utilization * hw.memory_gib:.2f} "
                "GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
                "processes.")
        return None

    def _log_nccl_init(self) -> None:
        eff, log, p = self.eff, self.log, self.eff.profile
        if p.hardware.platform == "cuda" and eff.tp > 1:
            log.engine("INFO", "pynccl.py:148", f"vLLM is using nccl=={p.hardware.nccl_version}")
            for line in nccl_debug_lines(eff, log.engine_pid):
                log.raw(line, "EngineCore")

    def _log_model_start(self) -> None:
        """Communicator outcome, rank assignment, model load start and attention backend."""
        eff, log, p = self.eff, self.log, self.eff.profile
        cuda = p.hardware.platform == "cuda"
        for n in eff.notices_for("comm"):
            log.engine(n.level, n.source, n.text)
        if cuda and eff.tp > 1:
            log.engine("INFO", "cuda_communicator.py:353", backends_line(eff))
        log.engine("INFO", "parallel_state.py:1946", f"rank 0 in world size {eff.tp * eff.pp} is "
                   "assigned as DP rank 0, PP rank 0, PCP rank 0, TP rank 0, EP rank N/A, EPLB "
                   "rank N/A")
        log.engine("INFO", "gpu_model_runner.py:5250", f"Starting to load model {eff.model}...")
        log.engine("INFO", "cuda.py:482" if cuda else "cpu.py:166",
                   f"Using {p.attention.backend} attention backend out of "
                   f"potential backends: {p.attention.potential!r}.")
        for n in eff.notices_for("attn"):
            log.engine(n.level, n.source, n.text)

    async def _load_compile_profile(self) -> float:
        """Weights loaded, torch.compile (if on), profile run; the seconds compiling took."""
        eff, log, st = self.eff, self.log, self.eff.profile.startup
        log.engine("INFO", "default_loader.py:430", f"Loading weights took {st.weight_load_s * 0.93:.2f} seconds")
        log.engine("INFO", "gpu_model_runner.py:5347", f"Model loading took "
                   f"{eff.weights_gib_per_rank:.2f} GiB memory and {st.weight_load_s:.6f} seconds")
        compile_s = 0.0
        if eff.compile_mode != 0:
            compile_s = await self.compile(eff.profile.hardware.platform == "cuda")
        await self.wait(st.profile_run_s)
        log.engine("INFO", "monitor.py:81", f"Initial profiling/warmup run took {st.profile_run_s:.2f} s")
        return compile_s

    async def _init_kv_cache(self) -> None:
        eff, log, st = self.eff, self.log, self.eff.profile.startup
        cuda = eff.profile.hardware.platform == "cuda"
        dev = "GPU" if cuda else "CPU"
        if cuda:
            log.engine("INFO", "gpu_worker.py:560", f"Available KV cache memory: {eff.kv_cache_gib:.2f} GiB")
        log.engine("INFO", "kv_cache_utils.py:2177", f"{dev} KV cache size: {eff.kv_cache_tokens:,} tokens")
        log.engine("INFO", "kv_cache_utils.py:2178", f"Maximum concurrency for {eff.max_model_len:,} "
                   f"tokens per request: {eff.kv_cache_tokens / eff.max_model_len:.2f}x")
        await self.wait(st.kv_init_s)

    async def _capture_graphs(self) -> None:
        eff, log, st = self.eff, self.log, self.eff.profile.startup
        if eff.capture_sizes:
            n = len(eff.capture_sizes)
            per = {"FULL_AND_PIECEWISE": st.capture_piecewise_s_per_size + st.capture_full_s_per_size,
                   "PIECEWISE": st.capture_piecewise_s_per_size}.get(
                       eff.cudagraph_mode, st.capture_full_s_per_size)
            await self.wait(per * n)
            for bar in capture_bars(eff, per * n):
                log.raw(bar, "EngineCore")
            graphs = 2 if eff.cudagraph_mode == "FULL_AND_PIECEWISE" else 1
            log.engine("INFO", "gpu_model_runner.py:6582", f"Graph capturing finished in "
                       f"{per * n:.0f} secs, took {st.graph_memory_gib_per_size * n * graphs:.2f} GiB")
        elif eff.profile.hardware.platform == "cuda" and not eff.enforce_eager:
            log.engine("WARNING", "gpu_model_runner.py:6483", "Skipping CUDA graph capture. To turn "
                       "on CUDA graph capture, ensure cudagraph_mode was not manually set to none")

    async def _serve_ready(self, compile_s: float) -> None:
        """Start-delay faults, the engine-init summary, then the API server's ready lines."""
        eff, log, st = self.eff, self.log, self.eff.profile.startup
        slow = self.faults.get("slow_start")
        if slow and slow.seconds:
            await self.wait(slow.seconds)
        if "hang_at_start" in self.faults:
            await asyncio.Event().wait()   # never ready; SIGTERM/SIGKILL still work
        if not eff.enforce_eager:
            await self.wait(st.warmup_s)
        extra = f" (compilation: {compile_s:.2f} s)" if compile_s else ""
        log.engine("INFO", "core.py:340", "init engine (profile, create kv cache, warmup model) "
                   f"took {self.simulated - st.api_init_s:.2f} s{extra}")
        await self.wait(st.server_start_s)
        log.api("INFO", "api_server.py:673", "Supported tasks: ['generate']")
        host = eff.host if ":" not in eff.host else f"[{eff.host}]"
        log.api("INFO", "api_server.py:677", f"Starting vLLM server on http://{host}:{eff.port}")
        log.api("INFO", "launcher.py:37", "Available routes are:")
        for line in route_lines():
            log.api("INFO", "launcher.py:46", line)

    def on_crash(self) -> None:
        """Fault crash_mid_load: the engine dies and takes the API server down abruptly."""
        self.log.api("ERROR", "core_client.py:564", "Engine core proc EngineCore_DP0 died "
                     "unexpectedly, shutting down client.")
        if self.child is not None:
            self.child.kill()
        os._exit(1)

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        if "ignore_sigterm" in self.faults:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        else:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stop.set)
        rc = await self._until_stopped(self.startup())
        if rc is not None:
            return rc
        if self.stop.is_set():
            return self.shutdown(None)
        engine = Engine(self.eff, self.faults, self.scale, self.log)
        app = SimServer(self.eff, engine, self.faults, self.on_crash, self.api_keys).app
        server = QuietServer(uvicorn.Config(app, log_config=None, log_level="warning",
                                            access_log=False, lifespan="off"))
        serve = asyncio.create_task(server.serve(sockets=[self.sock]))
        stopper = asyncio.create_task(self.stop.wait())
        # Until uvicorn listens, or dies, or a stop signal comes: whichever is first.
        listening = asyncio.create_task(server.listening.wait())
        await asyncio.wait([listening, serve, stopper], return_when=asyncio.FIRST_COMPLETED)
        listening.cancel()
        for msg in (f"Started server process [{os.getpid()}]", "Waiting for application startup.",
                    "Application startup complete."):
            self.log.raw(f"INFO:     {msg}", "APIServer")
        tasks = [asyncio.create_task(engine.run()), asyncio.create_task(engine.stats_loop())]
        # Not among the tasks waited on: a counter that cannot be written is no reason to stop serving.
        power = asyncio.create_task(self.power_counters(engine)) if self.env.get(POWERCAP_DIR_ENV) else None
        await asyncio.wait([serve, stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
        engine.dead = True
        crashed = serve.done() and not self.stop.is_set()   # uvicorn died on its own
        server.should_exit = server.force_exit = True
        rc = self.shutdown(server) or (1 if crashed else 0)
        for t in tasks + [stopper] + ([power] if power else []):
            t.cancel()
        try:
            await asyncio.wait_for(serve, timeout=0.5)
        except (TimeoutError, asyncio.CancelledError):
            pass
        for msg in ("Shutting down", "Waiting for application shutdown.",
                    "Application shutdown complete."):
            self.log.raw(f"INFO:     {msg}", "APIServer")
        return rc

    async def power_counters(self, engine: Engine) -> None:
        """The simulated energy counters under TUNER_SIM_POWERCAP_DIR (tuner/sim/power.py), one
        zone per device served on: the group's GPUs, or the CPU packages."""
        hw = self.eff.profile.hardware
        zones = self.eff.tp * self.eff.pp if hw.platform == "cuda" else hw.num_devices
        root = Path(self.env[POWERCAP_DIR_ENV])
        try:
            await write_counters(root, zones, self.eff.profile.power_spec, engine.busy, self.scale)
        except OSError as exc:
            self.log.api("WARNING", "power.py:1", f"simulated energy counters under {root} stopped: {exc}")

    async def _until_stopped(self, coro) -> int | None:
        task = asyncio.ensure_future(coro)
        stopper = asyncio.ensure_future(self.stop.wait())
        await asyncio.wait([task, stopper], return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if task.done():
            return task.result()
        task.cancel()
        return None

    def shutdown(self, server: object | None) -> int:
        log = self.log
        log.api("INFO", "launcher.py:100", "[shutdown] API server: shutdown triggered")
        log.api("INFO", "launcher.py:116", "[shutdown] API server: stopping engine client "
                "mode=abort timeout=0s")
        log.api("INFO", "core_client.py:655", "[shutdown] MPClient: start timeout=0s")
        log.api("INFO", "core_client.py:657", "[shutdown] MPClient: stopping engine manager")
        self.kill_child(graceful=True)
        log.api("INFO", "core_client.py:659", "[shutdown] MPClient: engine manager stopped")
        log.api("INFO", "core_client.py:662", "[shutdown] MPClient: complete")
        log.api("INFO", "launcher.py:125", "[shutdown] API server: engine client stopped")
        if server is not None:
            log.api("INFO", "launcher.py:128", "[shutdown] API server: signalling HTTP server shutdown")
        return 0


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))   # bound now, listened on only when startup is done (like vLLM)
    sock.set_inheritable(False)
    return sock


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    env = dict(os.environ)
    try:
        args = parse_argv(argv)
    except ArgvError as exc:
        sys.stderr.write(exc.text)
        return exc.exit_code
    try:
        profile = load_profile(env.get("TUNER_SIM_PROFILE"))
        scale = float(env.get("TUNER_SIM_TIME_SCALE", "1.0"))
        if not scale > 0:
            raise ValueError("TUNER_SIM_TIME_SCALE must be > 0")
        startup_scale = float(env.get("TUNER_SIM_STARTUP_SCALE", scale))
        if not startup_scale > 0:
            raise ValueError("TUNER_SIM_STARTUP_SCALE must be > 0")
        faults = parse_faults(env.get("TUNER_SIM_FAULTS"))
        if env.get("TUNER_SIM_SEED"):
            args.values["seed"] = args.seed + int(env["TUNER_SIM_SEED"])
    except (ProfileError, FaultError, ValueError) as exc:
        sys.stderr.write(f"tuner.sim: {exc}\n")
        return 2
    log = LogWriter(sys.stdout, api_pid=os.getpid())
    for w in args.warnings:
        stamp = time.strftime("%m-%d %H:%M:%S")
        log.raw(f"WARNING {stamp} [argparse_utils.py:422] {w}")
    for line in banner(args.model):
        log.api("INFO", "api_utils.py:345", line)
    log.api("INFO", "api_utils.py:286", non_default_line(non_default_args(args)))
    try:
        eff = resolve(args, env, profile, faults)
    except ConfigError as exc:
        log.api("INFO", "api_utils.py:346", f"tuner simulator profile {profile.name!r}")
        for line in traceback_lines(exc.failure):
            log.raw(line, "APIServer")
        return 1
    log.api("INFO", "api_utils.py:346", sim_notice(eff, scale))
    active = ActiveFaults([f for f in faults if applies(f, eff.asked.get)])
    try:
        sock = _bind(eff.host, eff.port)
    except OSError as exc:
        log.raw("Traceback (most recent call last):", "APIServer")
        log.raw(f"OSError: [Errno {exc.errno}] {exc.strerror}", "APIServer")
        return 1
    sim = Sim(eff, active, scale, log, sock, startup_scale, cache=CompileCache.from_env(env), env=env,
              api_keys=api_tokens(args.unknown, env))
    try:
        return asyncio.run(sim.run())
    finally:
        sim.kill_child(graceful=False)
        sock.close()


if __name__ == "__main__":
    sys.exit(main())
