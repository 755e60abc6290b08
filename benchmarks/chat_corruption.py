"""Which configurations of ``search_spaces/smollm2-cpu.yaml`` change what the real vLLM CPU
server answers to ordinary chat questions, and how?

Issue 14: a configuration in that space answered ordinary chat questions with garbage for
some prompts while passing the templated probe. This script looks for it the way a user
would notice it: it asks plain chat questions (several wordings of the same facts, small
requests, a second turn), greedy, through the chat endpoint with top-5 logprobs, first on
the eager float32 server (the study's reference configuration), then on each configuration
named, and reports per question where the answer first departs from eager float32 and how
confident eager float32 was about its own token there (the logprob gap between its token
and the one the configuration chose, when that one is in eager's top-5).

Each server runs in its own process group and is always stopped (benchmarks/vllm_server.py).
Run it under ``flock /tmp/realvllm.lock`` on a shared machine (one real server at a time).

Usage::

    PYTHONPATH=. .venv/bin/python benchmarks/chat_corruption.py --configs ngram4-3-3 bf16 \
        [--concurrency 1] [--max-tokens 64]

Writes ``benchmarks/results/chat_corruption-<time>.json`` (every answer, every config).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from vllm_server import MODEL_DIR, SERVED, VLLM_PYTHON, VllmServer, available  # noqa: E402


def _spec(k: int, lo: int, hi: int) -> list[str]:
    body = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": lo,
            "prompt_lookup_max": hi}
    return ["--speculative-config", json.dumps(body)]


# The knob combinations of smollm2-cpu.yaml worth separating: dtype, compiled vs eager,
# n-gram k and lookup ranges. Names are what --configs takes.
CONFIGS: dict[str, list[str]] = {
    "eager-fp32": ["--enforce-eager", "--dtype", "float32"],
    "eager-bf16": ["--enforce-eager", "--dtype", "bfloat16"],
    "compiled-fp32": ["--no-enforce-eager", "--dtype", "float32"],
    "compiled-bf16": ["--no-enforce-eager", "--dtype", "bfloat16"],
}
for _k in range(2, 6):
    for _lo in range(1, 4):
        for _hi in range(3, 6):
            if _lo <= _hi:
                CONFIGS[f"ngram{_k}-{_lo}-{_hi}"] = [
                    "--enforce-eager", "--dtype", "float32", *_spec(_k, _lo, _hi)]
                CONFIGS[f"ngram{_k}-{_lo}-{_hi}-bf16"] = [
                    "--enforce-eager", "--dtype", "bfloat16", *_spec(_k, _lo, _hi)]
                CONFIGS[f"compiled-ngram{_k}-{_lo}-{_hi}"] = [
                    "--no-enforce-eager", "--dtype", "float32", *_spec(_k, _lo, _hi)]

# Ordinary chat: the same facts in several natural wordings, small tasks, open questions,
# and second turns. None of it is the probe's template.
QUESTIONS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Which city is the capital of France?"}],
    [{"role": "user", "content": "Can you tell me what the capital of France is?"}],
    [{"role": "user", "content": "France's capital city is called what?"}],
    [{"role": "user", "content": "Name the capital of Italy."}],
    [{"role": "user", "content": "I'm planning a trip to Japan. What is its capital?"}],
    [{"role": "user", "content": "Tell me about Paris."}],
    [{"role": "user", "content": "Where is the Eiffel Tower?"}],
    [{"role": "user", "content": "What is the largest ocean on Earth?"}],
    [{"role": "user", "content": "How many legs does a spider have?"}],
    [{"role": "user", "content": "Translate 'good morning' into French."}],
    [{"role": "user", "content": "Write a haiku about autumn leaves."}],
    [{"role": "user", "content": "Give me three tips for sleeping better."}],
    [{"role": "user", "content": "What does a baker do?"}],
    [{"role": "user", "content": "Write a Python function that returns the square of a number."}],
    [{"role": "user", "content": "Explain photosynthesis in two sentences."}],
    [{"role": "user", "content": "Who wrote Romeo and Juliet?"}],
    [{"role": "user", "content": "What is 15 plus 27?"}],
    [{"role": "user", "content": "Hi! How are you today?"}],
    [{"role": "user", "content": "Summarize the plot of Cinderella in one paragraph."}],
    [{"role": "user", "content": "What is the capital of Germany?"},
     {"role": "assistant", "content": "The capital of Germany is Berlin."},
     {"role": "user", "content": "And what about Spain?"}],
    [{"role": "user", "content": "I have a cat named Milo."},
     {"role": "assistant", "content": "Milo is a lovely name for a cat!"},
     {"role": "user", "content": "What is my cat's name?"}],
]


async def _ask(client: httpx.AsyncClient, messages: list[dict[str, str]], max_tokens: int,
               gate: asyncio.Semaphore) -> dict[str, Any]:
    body = {"model": SERVED, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "seed": 0, "logprobs": True, "top_logprobs": 5}
    async with gate:
        r = await client.post("/v1/chat/completions", json=body, timeout=600)
    r.raise_for_status()
    choice = r.json()["choices"][0]
    content = (choice.get("logprobs") or {}).get("content") or []
    return {
        "text": choice["message"].get("content") or "",
        "tokens": [c["token"] for c in content],
        "logprobs": [c["logprob"] for c in content],
        "top": [{t["token"]: t["logprob"] for t in c.get("top_logprobs") or []} for c in content],
        "finish_reason": choice.get("finish_reason"),
    }


async def _ask_all(url: str, max_tokens: int, concurrency: int) -> list[dict[str, Any]]:
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, trust_env=False) as client:
        return list(await asyncio.gather(*(_ask(client, q, max_tokens, gate) for q in QUESTIONS)))


def _compare(ref: dict[str, Any], got: dict[str, Any]) -> dict[str, Any]:
    """Where ``got`` first departs from ``ref``, and eager's confidence there."""
    for i, (a, b) in enumerate(zip(ref["tokens"], got["tokens"], strict=False)):
        if a != b:
            top = ref["top"][i]
            gap = top[a] - top[b] if b in top else None
            return {"diverged_at": i, "ref_token": a, "got_token": b,
                    "gap_nats": gap, "got_in_ref_top5": b in top}
    if len(ref["tokens"]) != len(got["tokens"]):
        return {"diverged_at": min(len(ref["tokens"]), len(got["tokens"])), "length_only": True}
    return {"diverged_at": None}


def _run(name: str, flags: list[str], args: argparse.Namespace, out_dir: Path
         ) -> tuple[list[dict[str, Any]], float]:
    log = Path(tempfile.gettempdir()) / f"chat_corruption-{name}.log"
    started = time.monotonic()
    with VllmServer(log, flags) as server:
        ready = time.monotonic() - started
        answers = asyncio.run(_ask_all(server.url, args.max_tokens, args.concurrency))
    return answers, ready


async def _force_one(client: httpx.AsyncClient, messages: list[dict[str, str]], answer: str
                     ) -> dict[str, Any]:
    """The eager float32 server's view of another configuration's answer: teacher-force it
    and report, per answer token, its rank among float32's top-5 and the gap to float32's
    own choice there."""
    head = (await client.post("/tokenize", json={"model": SERVED, "messages": messages,
                                                 "add_generation_prompt": True})).json()["tokens"]
    tail = (await client.post("/tokenize", json={"model": SERVED, "prompt": answer,
                                                 "add_special_tokens": False})).json()["tokens"]
    body = {"model": SERVED, "prompt": head + tail, "max_tokens": 1, "temperature": 0,
            "prompt_logprobs": 5}
    plp = (await client.post("/v1/completions", json=body, timeout=600)).json()
    plp = plp["choices"][0]["prompt_logprobs"]
    gaps = []
    for j, tok in enumerate(tail):
        entry = plp[len(head) + j]
        ranked = sorted(((v["logprob"], int(k)) for k, v in entry.items() if v.get("rank", 99) <= 5),
                        reverse=True)
        best = ranked[0][0]
        mine = entry.get(str(tok), {}).get("logprob")
        gaps.append(None if mine is None else best - mine)
    return {"tokens": len(tail), "gaps": gaps}


def force_check(path: Path, config: str) -> int:
    """Teacher-force ``config``'s differing answers (from an earlier run's JSON) through a
    fresh eager float32 server: are they what float32 itself would say after the first
    flipped token (near ties all along: numerics and a fragile model), or tokens float32 is
    confident against (the configuration computes a different model)?"""
    data = json.loads(path.read_text())
    rows = data["configs"][config]
    picked = [(q, a) for q, a, r in zip(data["questions"], rows["answers"], rows["vs_eager_fp32"],
                                        strict=True) if r["diverged_at"] is not None]
    log = Path(tempfile.gettempdir()) / "chat_corruption-force.log"
    import vllm_server
    vllm_server.BASE_FLAGS = ["--max-model-len", "2048"]

    async def run(url: str) -> list[dict[str, Any]]:
        async with httpx.AsyncClient(base_url=url, trust_env=False, timeout=600) as client:
            return [await _force_one(client, q, a["text"]) for q, a in picked]

    with VllmServer(log, CONFIGS["eager-fp32"]) as server:
        forced = asyncio.run(run(server.url))
    all_gaps = [g for f in forced for g in f["gaps"]]
    known = [g for g in all_gaps if g is not None]
    print(f"{config}'s {len(picked)} differing answers forced through eager float32: "
          f"{len(all_gaps)} tokens; float32's top-1 at {sum(g == 0 for g in known)}, within "
          f"1 nat at {sum(g <= 1.0 for g in known)}, more than 1 nat below at "
          f"{sum(g > 1.0 for g in known)}, outside its top-5 at {len(all_gaps) - len(known)}")
    for (q, a), f in zip(picked, forced, strict=True):
        worst = max((g if g is not None else 99.0) for g in f["gaps"]) if f["gaps"] else 0
        bad = sum(g is None or g > 1.0 for g in f["gaps"])
        print(f"- {q[-1]['content'][:50]!r}: {bad}/{f['tokens']} tokens float32 is confident "
              f"against (worst gap {worst:.2f}): {a['text'][:80]!r}")
    out = path.resolve().with_name(path.stem + f"-forced-{config}.json")
    out.write_text(json.dumps({"config": config, "questions": [q for q, _ in picked],
                               "forced": forced}, indent=1))
    print(f"wrote {out.relative_to(ROOT)}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--force-from", type=Path, default=None,
                        help="an earlier run's JSON: teacher-force --force-config's answers "
                        "through eager float32 instead of asking")
    parser.add_argument("--force-config", default="eager-bf16")
    parser.add_argument("--configs", nargs="+", default=["eager-bf16", "ngram4-3-3"],
                        help=f"names from: {', '.join(sorted(CONFIGS))[:400]} ...")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=1)
    args = parser.parse_args()
    missing = available()
    if missing:
        print(f"skipped: {missing}")
        return 0
    if args.force_from is not None:
        return force_check(args.force_from, args.force_config)
    unknown = [c for c in args.configs if c not in CONFIGS]
    if unknown:
        parser.error(f"unknown configs {unknown}")
    out_dir = ROOT / "benchmarks" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    # The base flags of vllm_server are the reference's; each config replaces them.
    import vllm_server
    vllm_server.BASE_FLAGS = ["--max-model-len", "2048"]
    results: dict[str, Any] = {"model": str(MODEL_DIR), "python": str(VLLM_PYTHON),
                               "questions": QUESTIONS, "max_tokens": args.max_tokens,
                               "concurrency": args.concurrency,
                               "load_before": os.getloadavg()[0], "configs": {}}
    ref, ready = _run("eager-fp32", CONFIGS["eager-fp32"], args, out_dir)
    results["configs"]["eager-fp32"] = {"flags": CONFIGS["eager-fp32"], "ready_s": ready,
                                        "answers": ref}
    for name in args.configs:
        answers, ready = _run(name, CONFIGS[name], args, out_dir)
        rows = [_compare(r, a) for r, a in zip(ref, answers, strict=True)]
        results["configs"][name] = {"flags": CONFIGS[name], "ready_s": ready,
                                    "answers": answers, "vs_eager_fp32": rows}
        changed = sum(r["diverged_at"] is not None for r in rows)
        print(f"\n=== {name} ({' '.join(CONFIGS[name])}): ready {ready:.0f}s, "
              f"{changed}/{len(rows)} answers differ from eager float32")
        for q, r, a, row in zip(QUESTIONS, ref, answers, rows, strict=True):
            if row["diverged_at"] is None:
                continue
            gap = row.get("gap_nats")
            print(f"- {q[-1]['content']!r}: diverged at token {row['diverged_at']}"
                  f" (gap {'outside top-5' if gap is None else f'{gap:.3f}'} nats)")
            print(f"    eager fp32: {r['text'][:160]!r}")
            print(f"    {name}: {a['text'][:160]!r}")
    results["load_after"] = os.getloadavg()[0]
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = out_dir / f"chat_corruption-{stamp}.json"
    path.write_text(json.dumps(results, indent=1))
    print(f"\nwrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
