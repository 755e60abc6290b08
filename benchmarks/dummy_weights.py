"""What does a model served with ``--load-format dummy`` answer, and can the probe's
reference comparison judge it?

Issue 34 (item 2): dummy weights (real kernels, random weights) are how speed is measured
when the real weights are not on the box. Known answers cannot be judged there; whether a
reference comparison can depends on what the random model's output looks like. This
script serves the real vLLM CPU build's model with ``--load-format dummy`` and asks token-id
prompts (the chat questions of ``chat_corruption.py`` through the chat template) greedily
with top-5 logprobs, the way the probe does: each prompt alone (batch 1), then all of them
in one request (a decode batch of all prompts). It does that on two fresh starts of eager
float32, on eager bfloat16 and on the real weights (``--configs`` picks; the ``-eps``
configurations compute another model: RMSNorm's epsilon 0.5), and reports

* whether the answers are deterministic across the two fresh starts and across batch sizes;
* the top-1 margins (logprob of the chosen token minus the runner-up's) at every decoded
  position: if they are all tiny, every position is a near tie and the numerics rule's
  "confident token replaced" cannot fire;
* what the text looks like (distinct tokens, the most repeated token's share).

Each server runs in its own process group and is always stopped (benchmarks/vllm_server.py).
Run it under ``flock /tmp/realvllm.lock`` on a shared machine (one real server at a time).

Usage::

    PYTHONPATH=. .venv/bin/python benchmarks/dummy_weights.py [--max-tokens 32] \
        [--configs dummy-fp32-a dummy-eps real-fp32 real-eps]

Writes ``benchmarks/results/dummy_weights-<time>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import vllm_server  # noqa: E402
from chat_corruption import QUESTIONS  # noqa: E402
from vllm_server import SERVED, VllmServer, available  # noqa: E402

CONFIGS: dict[str, list[str]] = {
    "dummy-fp32-a": ["--enforce-eager", "--dtype", "float32", "--load-format", "dummy"],
    "dummy-fp32-b": ["--enforce-eager", "--dtype", "float32", "--load-format", "dummy"],
    "dummy-bf16": ["--enforce-eager", "--dtype", "bfloat16", "--load-format", "dummy"],
    "real-fp32": ["--enforce-eager", "--dtype", "float32"],
    # A configuration that computes another model (every RMSNorm's epsilon 0.5 instead of
    # 1e-5): garbage on the real weights; does it show on dummy ones?
    "dummy-eps": ["--enforce-eager", "--dtype", "float32", "--load-format", "dummy",
                  "--hf-overrides", '{"rms_norm_eps": 0.5}'],
    "real-eps": ["--enforce-eager", "--dtype", "float32", "--hf-overrides", '{"rms_norm_eps": 0.5}'],
}


def _ids(server: VllmServer) -> list[list[int]]:
    return [server.post_json("/tokenize", {"model": SERVED, "messages": q, "add_generation_prompt": True})["tokens"]
            for q in QUESTIONS]


def _parse(choice: dict[str, Any]) -> dict[str, Any]:
    lp = choice["logprobs"]
    tokens = [int(t.removeprefix("token_id:")) for t in lp["tokens"]]
    tops = [{int(k.removeprefix("token_id:")): v for k, v in (top or {}).items()} for top in lp["top_logprobs"]]
    margins = []
    for top in tops:
        ranked = sorted(top.values(), reverse=True)
        margins.append(ranked[0] - ranked[1] if len(ranked) > 1 else None)
    return {"tokens": tokens, "logprobs": lp["token_logprobs"],
            "top": [{str(k): v for k, v in t.items()} for t in tops], "margins": margins,
            "finish_reason": choice.get("finish_reason")}


def _ask(server: VllmServer, prompts: list[list[int]], max_tokens: int) -> list[dict[str, Any]]:
    body = {"model": SERVED, "prompt": prompts, "max_tokens": max_tokens, "temperature": 0, "logprobs": 5,
            "return_tokens_as_token_ids": True, "ignore_eos": True}
    reply = server.post_json("/v1/completions", body, timeout=900)
    return [_parse(c) for c in sorted(reply["choices"], key=lambda c: c["index"])]


def _run(name: str, max_tokens: int) -> dict[str, Any]:
    log = Path(tempfile.gettempdir()) / f"dummy_weights-{name}.log"
    started = time.monotonic()
    with VllmServer(log, CONFIGS[name]) as server:
        ready = time.monotonic() - started
        prompts = _ids(server)
        alone = [_ask(server, [p], max_tokens)[0] for p in prompts]
        batched = _ask(server, prompts, max_tokens)
    return {"flags": CONFIGS[name], "ready_s": ready, "prompts": prompts, "batch1": alone, "batchN": batched}


def _margins(answers: list[dict[str, Any]]) -> dict[str, Any]:
    values = sorted(m for a in answers for m in a["margins"] if m is not None)
    top1 = [lp for a in answers for lp in a["logprobs"] if lp is not None]
    tokens = [t for a in answers for t in a["tokens"]]
    common = Counter(tokens).most_common(1)[0] if tokens else (None, 0)
    return {
        "positions": len(values),
        "margin_min": values[0], "margin_median": statistics.median(values), "margin_max": values[-1],
        "margin_p10": values[len(values) // 10], "margin_p90": values[(9 * len(values)) // 10],
        "share_margin_le_1nat": sum(v <= 1.0 for v in values) / len(values),
        "share_margin_le_0.01": sum(v <= 0.01 for v in values) / len(values),
        "top1_logprob_median": statistics.median(top1),
        "distinct_tokens": len(set(tokens)), "tokens": len(tokens),
        "most_common_token": common[0], "most_common_share": common[1] / max(1, len(tokens)),
        "distinct_answers": len({tuple(a["tokens"]) for a in answers}),
    }


def _agree(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> dict[str, Any]:
    """Identical answers, where the first differing position was (with the margin there),
    and how many of ``a``'s top-5 tokens ``b`` also lists, over the positions both decoded."""
    overlaps = [len(set(x) & set(y)) / max(1, len(x)) for p, q in zip(a, b, strict=True)
                for x, y in zip(p["top"], q["top"], strict=False)]
    same = 0
    first: list[dict[str, Any]] = []
    positions = agreeing = 0
    for x, y in zip(a, b, strict=True):
        for i, (s, t) in enumerate(zip(x["tokens"], y["tokens"], strict=False)):
            if s != t:
                top = x["top"][i]
                gap = x["logprobs"][i] - top[str(t)] if str(t) in top else None
                first.append({"at": i, "gap_nats": gap, "margin": x["margins"][i]})
                positions += i
                agreeing += i
                break
        else:
            same += 1
            positions += len(x["tokens"])
            agreeing += len(x["tokens"])
    gaps = [f["gap_nats"] for f in first if f["gap_nats"] is not None]
    return {"identical": same, "of": len(a), "first_divergences": first,
            "largest_gap_nats": max(gaps) if gaps else None,
            "outside_top5": sum(f["gap_nats"] is None for f in first),
            "top5_overlap_mean": sum(overlaps) / len(overlaps), "top5_overlap_min": min(overlaps)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--configs", nargs="+", default=[c for c in CONFIGS if not c.endswith("-eps")])
    args = parser.parse_args()
    missing = available()
    if missing:
        print(f"skipped: {missing}")
        return 0
    vllm_server.BASE_FLAGS = ["--max-model-len", "2048"]
    runs = {name: _run(name, args.max_tokens) for name in args.configs}
    summary: dict[str, Any] = {}
    for name, run in runs.items():
        summary[name] = {"ready_s": round(run["ready_s"], 1), "batch1": _margins(run["batch1"]),
                         "batchN": _margins(run["batchN"]),
                         "batch1_vs_batchN": _agree(run["batch1"], run["batchN"])}
    pairs = [("dummy-fp32-a", "dummy-fp32-b"), ("dummy-fp32-a", "dummy-bf16"), ("dummy-fp32-a", "dummy-eps"),
             ("real-fp32", "real-eps")]
    for x, y in pairs:
        if x in runs and y in runs:
            summary[f"{x}_vs_{y}"] = {"batch1": _agree(runs[x]["batch1"], runs[y]["batch1"]),
                                      "batchN": _agree(runs[x]["batchN"], runs[y]["batchN"])}
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"dummy_weights-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps({"max_tokens": args.max_tokens, "questions": QUESTIONS, "load": os.getloadavg()[0],
                                "summary": summary, "runs": runs}, indent=1))
    print(json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "first_divergences"} if isinstance(v, dict) else v
                      for k, v in summary.items()}, indent=1, default=str)[:12000])
    print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
