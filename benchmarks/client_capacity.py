"""How many streamed tokens/s can the load generator's client take, and what does it add?

Side by side, in one run, against the same instant server (benchmarks/instant_server.py,
pinned to its own core, one token per SSE chunk):

* ``tuner``        the tuner's generator, ``tuner.load.closed_loop.run_level``;
* ``aiohttp-vllm`` an aiohttp client that reads streams exactly as vLLM's own benchmark
  does (``vllm/benchmarks/lib/endpoint_request_func.py``, vLLM 0.32: ``iter_any()`` +
  ``StreamedResponseHandler`` + ``json.loads`` per message, ``perf_counter`` per message,
  a ``TCPConnector`` as in ``benchmarks/serve.py``, a semaphore around every request);
* ``httpx-lines``  a plain httpx ``aiter_lines()`` + ``json.loads`` loop;
* ``tuner-energy`` ``tuner`` with energy sampled beside the level as a worker does (a 50 ms
  thread reading a RAPL-format counter): its figure against ``tuner``'s is what measuring
  energy costs the load generator (issue 40: within 5 %);
* ``tuner-chat``   the tuner's generator on the chat API, one-message requests;
* ``tuner-turns``  the same on a user's own traffic (issue 33): chat conversations of four
  turns from a dataset (tuner.load.dataset_draw), each turn sent after the previous reply
  with the server's reply text carried back. Its figure against ``tuner-chat``'s is what
  multi-turn replay costs the client.

Each (client, concurrency, repeat) runs in a fresh process pinned to one core
(``os.sched_setaffinity``); the server is pinned to the other. Two experiments:

1. capacity: ``--delay-ms 0`` server; streamed tokens/s = Σ usage.completion_tokens /
   (last request done − first dispatch), best of ``--repeats`` (the machine may be shared).
2. overhead: a second server sleeping a fixed ``--overhead-delay-ms`` between chunks on an
   absolute schedule. The server reports, per request, when it received it and when it
   wrote the first and last chunk (CLOCK_MONOTONIC, system-wide), so for every request
   client TTFT − server (first write − receipt) and client TPOT − server TPOT are the
   client's own additions (loopback included).

Usage::

    PYTHONPATH=. .venv/bin/python benchmarks/client_capacity.py            # full run
    PYTHONPATH=. .venv/bin/python benchmarks/client_capacity.py --quick    # smoke test

aiohttp is needed for the ``aiohttp-vllm`` column only (``pip install aiohttp``); without
it that column is skipped. Results: a table on stdout, JSON in benchmarks/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import codecs
import gc
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
CLIENTS = ("tuner", "tuner-energy", "tuner-chat", "tuner-turns", "aiohttp-vllm", "httpx-lines")
MODEL = "instant"


# --------------------------------------------------------------------------- clients
# Every client returns one row per request: [key, start, first, last, chunks, tokens, ok]
# with times in CLOCK_MONOTONIC seconds (perf_counter is CLOCK_MONOTONIC on Linux).


def _prompt(i: int) -> str:
    return f"bench request {i} please stream"


async def client_tuner(url: str, c: int, n: int, max_tokens: int, processes: int,
                       api: str = "completions") -> list[list[Any]]:
    from tuner.load.closed_loop import run_level
    from tuner.load.workload import RequestPlan

    plan = [
        RequestPlan(index=i, class_name="bench", kind="open_ended", prompt=_prompt(i),
                    max_tokens=max_tokens, ignore_eos=True, target_prompt_tokens=4)
        for i in range(n)
    ]
    started: list[float] = []
    kwargs: dict[str, Any] = {"on_start": started.append}
    if processes > 1:
        kwargs["processes"] = processes
    records = await run_level(url, MODEL, plan, concurrency=c, api=api,  # type: ignore[arg-type]
                              deadline_s=None, request_timeout_s=300, **kwargs)
    t0 = started[0]     # the records' time base: absolute times for the figures
    rows = []
    for r in records:
        ts = r.chunk_times_s
        rows.append([_prompt(r.index), t0 + r.dispatch_s, t0 + ts[0] if ts else None,
                     t0 + ts[-1] if ts else None, len(ts), r.output_tokens, r.ok,
                     t0 + r.done_s])
    return rows


def _conversations(n: int) -> str:
    """JSONL of openai-chat conversations, four user turns each, enough for ``n`` requests."""
    lines = []
    for i in range(n // 4 + 1):
        turns = [m for t in range(4) for m in (
            {"role": "user", "content": f"bench conversation {i} turn {t} please stream"},
            {"role": "assistant", "content": "ok"})]
        lines.append(json.dumps({"messages": turns[:-1]}))
    return "\n".join(lines) + "\n"


async def client_tuner_energy(url: str, c: int, n: int, max_tokens: int, processes: int) -> list[list[Any]]:
    """``tuner`` with a level's energy sampled beside it, as a worker does (tuner.load.level_meter):
    the sampler thread reads a RAPL-format counter every 50 ms. The counter is a file in a
    temporary powercap tree (a real /sys/class/powercap read costs the same system call),
    so the column shows what sampling costs the client, whatever machine runs it."""
    import tempfile

    from tuner.energy.rapl import open_rapl
    from tuner.load.level_meter import LevelMeter

    with tempfile.TemporaryDirectory() as root:
        zone = Path(root) / "intel-rapl:0"
        zone.mkdir()
        (zone / "name").write_text("package-0\n")
        (zone / "energy_uj").write_text("1000\n")
        (zone / "max_energy_range_uj").write_text("262143328850\n")
        source = open_rapl(Path(root))
        assert not hasattr(source, "reason"), source
        with LevelMeter(source) as meter:   # type: ignore[arg-type]
            rows = await client_tuner(url, c, n, max_tokens, processes)
        assert len(meter._series) >= 2
        return rows


async def client_tuner_turns(url: str, c: int, n: int, max_tokens: int, processes: int) -> list[list[Any]]:
    from tuner.load.closed_loop import run_level
    from tuner.load.dataset import parse_dataset
    from tuner.load.dataset_draw import DatasetDraw

    draw = DatasetDraw(parse_dataset(_conversations(n), "openai-chat", source="bench"), seed=0,
                       output_tokens=max_tokens, ignore_eos=True)
    plan = draw.take(n)
    started: list[float] = []
    kwargs: dict[str, Any] = {"on_start": started.append}
    if processes > 1:
        kwargs["processes"] = processes
    records = await run_level(url, MODEL, plan, concurrency=c, api="chat",
                              deadline_s=None, request_timeout_s=300, **kwargs)
    t0 = started[0]
    rows = []
    for r in records:
        ts = r.chunk_times_s
        rows.append([f"{r.index}", t0 + r.dispatch_s, t0 + ts[0] if ts else None,
                     t0 + ts[-1] if ts else None, len(ts), r.output_tokens, r.ok,
                     t0 + r.done_s])
    return rows


class StreamedResponseHandler:
    """Verbatim from vllm/benchmarks/lib/endpoint_request_func.py (vLLM 0.32, Apache-2.0)."""

    def __init__(self) -> None:
        self.buffer = ""
        self._decoder = codecs.getincrementaldecoder("utf-8")()

    def add_chunk(self, chunk_bytes: bytes) -> list[str]:
        chunk_str = self._decoder.decode(chunk_bytes)
        self.buffer += chunk_str
        messages = []
        while "\n\n" in self.buffer:
            message, self.buffer = self.buffer.split("\n\n", 1)
            message = message.strip()
            if message:
                messages.append(message)
        if self.buffer.startswith("data: "):
            message_content = self.buffer.removeprefix("data: ").strip()
            if message_content == "[DONE]":
                messages.append(self.buffer.strip())
                self.buffer = ""
            elif message_content:
                try:
                    json.loads(message_content)
                    messages.append(self.buffer.strip())
                    self.buffer = ""
                except json.JSONDecodeError:
                    pass
        return messages


async def client_aiohttp_vllm(url: str, c: int, n: int, max_tokens: int, processes: int) -> list[list[Any]]:
    import aiohttp

    api_url = url + "/v1/completions"
    connector = aiohttp.TCPConnector(
        limit=c, limit_per_host=c, ttl_dns_cache=300, use_dns_cache=True,
        keepalive_timeout=60, enable_cleanup_closed=True, force_close=False, ssl=False,
    )
    session = aiohttp.ClientSession(connector=connector, trust_env=True,
                                    timeout=aiohttp.ClientTimeout(total=6 * 60 * 60))
    sem = asyncio.Semaphore(c)

    async def one(i: int) -> list[Any]:
        # async_request_openai_completions, timing and parsing unchanged.
        payload = {"model": MODEL, "prompt": _prompt(i), "repetition_penalty": 1.0,
                   "max_tokens": max_tokens, "logprobs": None, "stream": True,
                   "stream_options": {"include_usage": True}, "ignore_eos": True}
        generated_text = ""
        st = time.perf_counter()
        most_recent = st
        first_ts = None
        chunks = 0
        output_tokens = None
        ok = False
        async with session.post(url=api_url, json=payload, headers={}) as response:
            if response.status == 200:
                handler = StreamedResponseHandler()
                async for chunk_bytes in response.content.iter_any():
                    chunk_bytes = chunk_bytes.strip()
                    if not chunk_bytes:
                        continue
                    for message in handler.add_chunk(chunk_bytes):
                        if message.startswith(":"):
                            continue
                        chunk = message.removeprefix("data: ")
                        if chunk != "[DONE]":
                            data = json.loads(chunk)
                            if choices := data.get("choices"):
                                text = choices[0].get("text")
                                timestamp = time.perf_counter()
                                if first_ts is None:
                                    first_ts = timestamp
                                most_recent = timestamp
                                chunks += 1
                                generated_text += text or ""
                            elif usage := data.get("usage"):
                                output_tokens = usage.get("completion_tokens")
                ok = first_ts is not None
        return [_prompt(i), st, first_ts, most_recent, chunks, output_tokens, ok, time.perf_counter()]

    async def limited(i: int) -> list[Any]:
        async with sem:
            return await one(i)

    try:
        return list(await asyncio.gather(*(limited(i) for i in range(n))))
    finally:
        await session.close()


async def client_httpx_lines(url: str, c: int, n: int, max_tokens: int, processes: int) -> list[list[Any]]:
    import httpx

    api_url = url + "/v1/completions"
    limits = httpx.Limits(max_connections=c, max_keepalive_connections=c)
    sem = asyncio.Semaphore(c)
    async with httpx.AsyncClient(limits=limits, timeout=None) as client:

        async def one(i: int) -> list[Any]:
            body = {"model": MODEL, "prompt": _prompt(i), "max_tokens": max_tokens,
                    "stream": True, "stream_options": {"include_usage": True},
                    "ignore_eos": True, "temperature": 0}
            st = time.perf_counter()
            first = last = None
            chunks = 0
            output_tokens = None
            async with client.stream("POST", api_url, json=body) as resp:
                async for line in resp.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[6:]
                    if data == "[DONE]":
                        break
                    obj = json.loads(data)
                    if obj.get("choices"):
                        last = time.perf_counter()
                        if first is None:
                            first = last
                        chunks += 1
                    elif obj.get("usage"):
                        output_tokens = obj["usage"].get("completion_tokens")
            return [_prompt(i), st, first, last, chunks, output_tokens, first is not None,
                    time.perf_counter()]

        async def limited(i: int) -> list[Any]:
            async with sem:
                return await one(i)

        return list(await asyncio.gather(*(limited(i) for i in range(n))))


_CLIENT_FUNCS = {
    "tuner": client_tuner,
    "tuner-chat": lambda url, c, n, max_tokens, processes: client_tuner(url, c, n, max_tokens, processes, "chat"),
    "tuner-turns": client_tuner_turns,
    "tuner-energy": client_tuner_energy,
    "aiohttp-vllm": client_aiohttp_vllm,
    "httpx-lines": client_httpx_lines,
}


def child_main(args: argparse.Namespace) -> int:
    """One measurement in this (pinned) process; prints a JSON result line."""
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    func = _CLIENT_FUNCS[args.child]
    # Import outside the measured span: only the run's own CPU time counts.
    if args.child in ("tuner", "tuner-energy", "tuner-chat", "tuner-turns"):
        import tuner.energy.rapl
        import tuner.load.closed_loop
        import tuner.load.dataset_draw
        import tuner.load.level_meter
        import tuner.load.workload  # noqa: F401
    elif args.child == "aiohttp-vllm":
        import aiohttp  # noqa: F401
    else:
        import httpx  # noqa: F401
    gc.collect()
    # CPU seconds of the run itself (children included: the sharded variant), so
    # tokens per CPU-second is a capacity figure that other tenants of a shared machine
    # cannot depress the way they depress wall-clock rates.
    t = os.times()
    rows = asyncio.run(func(args.url, args.c, args.n, args.max_tokens, args.processes))
    u = os.times()
    cpu = (u.user - t.user) + (u.system - t.system) + (u.children_user - t.children_user) + (
        u.children_system - t.children_system)
    print(json.dumps({"rows": rows, "cpu_s": cpu}))
    return 0


# --------------------------------------------------------------------------- driver


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, delay_ms: float, cpu: int | None, burst: int = 1) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, str(ROOT / "benchmarks" / "instant_server.py"),
               "--port", str(self.port), "--delay-ms", str(delay_ms), "--burst", str(burst)]
        if cpu is not None:
            cmd += ["--cpu", str(cpu)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 15
        while True:
            try:
                urllib.request.urlopen(self.url + "/health", timeout=1).read()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("instant server did not start") from None
                time.sleep(0.05)

    def stats(self) -> dict[str, Any]:
        """{"rows": {key: [recv, first_send, last_send, chunks]}, "cpu_s": server CPU}."""
        with urllib.request.urlopen(self.url + "/stats", timeout=10) as r:
            return json.loads(r.read())

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, 15)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()


def run_child(client: str, url: str, c: int, n: int, max_tokens: int, cpu: int | None,
              processes: int = 1) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", client, "--url", url, "--c", str(c),
           "--n", str(n), "--max-tokens", str(max_tokens), "--processes", str(processes)]
    if cpu is not None:
        cmd += ["--cpu", str(cpu)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"{client} c={c} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def capacity_figures(result: dict[str, Any]) -> dict[str, Any]:
    rows = result["rows"]
    ok = [r for r in rows if r[6]]
    start = min(r[1] for r in rows)
    end = max(r[7] for r in rows)
    tokens = sum(r[5] or r[4] for r in ok)
    cpu = result["cpu_s"]
    return {"requests": len(rows), "failed": len(rows) - len(ok), "tokens": tokens,
            "wall_s": end - start, "tok_s": tokens / (end - start), "client_cpu_s": cpu,
            "tok_per_cpu_s": tokens / cpu if cpu > 0 else None}


def overhead_figures(result: dict[str, Any], stats: dict[str, Any], c: int) -> dict[str, Any]:
    ttft_add, tpot_add, tpot_client, tpot_server = [], [], [], []
    ttft_first_wave, ttft_later = [], []
    rows = sorted(result["rows"], key=lambda r: r[1])
    for k, (key, start, first, last, chunks, _tokens, ok, _done) in enumerate(rows):
        srv = stats["rows"].get(key)
        if not ok or srv is None or chunks < 2:
            continue
        recv, s_first, s_last, s_chunks = srv
        added = ((first - start) - (s_first - recv)) * 1000
        ttft_add.append(added)
        # The first wave opens c connections and sends c requests at once; later requests
        # reuse a connection and show the client's steady-state lag.
        (ttft_first_wave if k < c else ttft_later).append(added)
        ct = (last - first) / (chunks - 1) * 1000
        st = (s_last - s_first) / (s_chunks - 1) * 1000
        tpot_client.append(ct)
        tpot_server.append(st)
        tpot_add.append(ct - st)
    med = statistics.median
    return {
        "requests": len(tpot_add),
        "ttft_added_ms_median": med(ttft_add),
        "ttft_added_ms_max": max(ttft_add),
        "ttft_added_ms_median_first_wave": med(ttft_first_wave) if ttft_first_wave else None,
        "ttft_added_ms_median_later": med(ttft_later) if ttft_later else None,
        "tpot_client_ms_median": med(tpot_client),
        "tpot_server_ms_median": med(tpot_server),
        "tpot_added_ms_median": med(tpot_add),
        "tpot_added_ms_max": max(tpot_add),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", choices=CLIENTS)
    ap.add_argument("--url")
    ap.add_argument("--c", type=int, default=1)
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--cpu", type=int, default=None)
    ap.add_argument("--processes", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=256, help="tokens per response")
    ap.add_argument("--concurrency", default="1,16,64")
    ap.add_argument("--clients", default=",".join(CLIENTS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokens-per-run", type=int, default=150_000)
    ap.add_argument("--burst", type=int, default=8,
                    help="capacity server: chunks per write step (one token per chunk)")
    ap.add_argument("--skip-overhead", action="store_true")
    ap.add_argument("--skip-capacity", action="store_true")
    ap.add_argument("--overhead-delay-ms", type=float, default=20.0)
    ap.add_argument("--overhead-tokens", type=int, default=51)
    ap.add_argument("--shard", type=int, default=0,
                    help="also run the tuner with this many client processes")
    ap.add_argument("--quick", action="store_true", help="small runs, one repeat")
    ap.add_argument("--output", type=Path, default=RESULTS / "client_capacity.json")
    args = ap.parse_args(argv)
    if args.child:
        return child_main(args)

    if args.quick:
        args.repeats, args.tokens_per_run = 1, 20_000
    cores = sorted(os.sched_getaffinity(0))
    client_cpu = cores[0]
    server_cpu = cores[1] if len(cores) > 1 else None
    levels = [int(x) for x in args.concurrency.split(",")]
    clients = [c for c in args.clients.split(",") if c]
    if "aiohttp-vllm" in clients:
        try:
            import aiohttp  # noqa: F401
        except ImportError:
            print("aiohttp not installed: skipping the aiohttp-vllm column", file=sys.stderr)
            clients.remove("aiohttp-vllm")
    load = os.getloadavg()
    print(f"client on CPU {client_cpu}, server on CPU {server_cpu}; load average {load[0]:.2f}")

    report: dict[str, Any] = {
        "started_at": datetime.now(UTC).isoformat(),
        "host": {"cpus": os.cpu_count(), "python": platform.python_version(),
                 "loadavg_start": load, "client_cpu": client_cpu, "server_cpu": server_cpu},
        "settings": {k: v for k, v in vars(args).items() if k not in ("child", "url", "output")},
        "capacity": {}, "overhead": {},
    }
    report["settings"]["output"] = str(args.output)

    server = Server(0.0, server_cpu, args.burst)
    try:
        for c in (levels if not args.skip_capacity else []):
            n = max(4 * c, args.tokens_per_run // args.max_tokens)
            variants = [(cl, 1) for cl in clients]
            if args.shard > 1 and "tuner" in clients:
                variants.append(("tuner", args.shard))
            for rep in range(args.repeats):
                for client, procs in variants:  # interleaved: drift hits every client alike
                    name = client if procs == 1 else f"{client}x{procs}"
                    cpu0 = server.stats()["cpu_s"]  # also clears the rows
                    res = run_child(client, server.url, c, n, args.max_tokens,
                                    None if procs > 1 else client_cpu, procs)
                    fig = capacity_figures(res)
                    fig["server_busy"] = (server.stats()["cpu_s"] - cpu0) / fig["wall_s"]
                    fig["client_busy"] = fig["client_cpu_s"] / fig["wall_s"]
                    report["capacity"].setdefault(name, {}).setdefault(str(c), []).append(fig)
                    print(f"  capacity {name:14s} c={c:<3d} rep {rep}: {fig['tok_s']:9.0f} tok/s "
                          f"wall, {fig['tok_per_cpu_s'] or 0:9.0f} tok/CPU-s, busy client "
                          f"{fig['client_busy']:4.0%} server {fig['server_busy']:4.0%} "
                          f"({fig['requests']} req, {fig['failed']} failed, load "
                          f"{os.getloadavg()[0]:.1f})", flush=True)
    finally:
        server.stop()

    server = Server(args.overhead_delay_ms, server_cpu)
    try:
        for c in (levels if not args.skip_overhead else []):
            n = max(3 * c, 10)
            for rep in range(args.repeats):
                for client in clients:
                    res = run_child(client, server.url, c, n, args.overhead_tokens, client_cpu)
                    fig = overhead_figures(res, server.stats(), c)
                    report["overhead"].setdefault(client, {}).setdefault(str(c), []).append(fig)
                    print(f"  overhead {client:14s} c={c:<3d} rep {rep}: TTFT +{fig['ttft_added_ms_median']:.3f} ms, "
                          f"TPOT +{fig['tpot_added_ms_median']:.4f} ms", flush=True)
    finally:
        server.stop()
    report["host"]["loadavg_end"] = os.getloadavg()
    _summarize(report, levels, args.overhead_delay_ms)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1))
    print(f"\nwrote {args.output}")
    return 0


def _summarize(report: dict[str, Any], levels: list[int], delay_ms: float) -> None:
    for key, title, report_key in (
        ("tok_s", "Streamed tokens/s, wall clock, one client core (best of repeats)", "best_tok_s"),
        ("tok_per_cpu_s", "Streamed tokens per client CPU-second (best of repeats)",
         "best_tok_per_cpu_s"),
    ):
        best: dict[str, dict[str, float]] = {}
        for name, per_c in report["capacity"].items():
            best[name] = {c: max((f[key] or 0.0) for f in runs) for c, runs in per_c.items()}
        report[report_key] = best
        print(f"\n{title}")
        print(f"{'client':16s}" + "".join(f"{'c=' + str(c):>12s}" for c in levels))
        for name in best:
            print(f"{name:16s}" + "".join(f"{best[name].get(str(c), float('nan')):12.0f}"
                                          for c in levels))
        if "tuner" in best and "tuner-energy" in best:
            ratio = {str(c): best["tuner-energy"][str(c)] / best["tuner"][str(c)] for c in levels}
            report[f"energy_vs_tuner_{key}"] = ratio
            print(f"{'energy/tuner':16s}" + "".join(f"{ratio[str(c)]:12.2f}" for c in levels))
        if "tuner" in best and "aiohttp-vllm" in best:
            ratio = {str(c): best["tuner"][str(c)] / best["aiohttp-vllm"][str(c)] for c in levels}
            report[f"tuner_vs_aiohttp_{key}"] = ratio
            print(f"{'tuner/aiohttp':16s}" + "".join(f"{ratio[str(c)]:12.2f}" for c in levels))

    print(f"\nClient overhead with a {delay_ms:g} ms server inter-chunk delay (median over requests,"
          " best repeat)")
    print(f"{'client':16s}{'c':>4s}{'TTFT+ all':>11s}{'1st wave':>10s}{'later':>9s}"
          f"{'TPOT client':>13s}{'TPOT server':>13s}{'TPOT added':>12s}{'% of TPOT':>11s}")
    summary: dict[str, Any] = {}
    for name, per_c in report["overhead"].items():
        for c in levels:
            runs = per_c.get(str(c), [])
            if not runs:
                continue
            # The quietest repeat: least TTFT added (other tenants only ever add).
            f = min(runs, key=lambda x: x["ttft_added_ms_median"])
            pct = 100 * f["tpot_added_ms_median"] / f["tpot_server_ms_median"]
            summary.setdefault(name, {})[str(c)] = {**f, "tpot_added_pct": pct}
            later = f.get("ttft_added_ms_median_later")
            first = f.get("ttft_added_ms_median_first_wave")
            print(f"{name:16s}{c:4d}{f['ttft_added_ms_median']:11.3f}"
                  f"{first if first is not None else float('nan'):10.3f}"
                  f"{later if later is not None else float('nan'):9.3f}"
                  f"{f['tpot_client_ms_median']:13.4f}"
                  f"{f['tpot_server_ms_median']:13.4f}{f['tpot_added_ms_median']:12.4f}{pct:10.3f}%")
    report["overhead_best"] = summary


if __name__ == "__main__":
    import signal

    # SIGTERM → SystemExit, so the finally blocks stop the servers this script started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
