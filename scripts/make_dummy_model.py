"""Make a config-only model directory that vLLM serves with `--load-format dummy`: the real
kernels, memory traffic and batching of a model of the named shape, with random weights.

Why: tuning for speed needs the model's shapes, not its weights. The real weights may not be
on the box (an 8B model is 16 GB, a 700B one over a terabyte), or may take longer to load
than the whole measurement. vLLM's dummy load format fills every weight with deterministic
random values, so the configurations of one study all run the same numbers: what a study
measures is the speed of those shapes on this box, and its probe compares each trial with the
study's reference answers (docs/probe.md) instead of judging known answers.

    python3 scripts/make_dummy_model.py --tokenizer .models/smollm2-135m-instruct \\
        --shape llama-3-8b --out .models/d8b

``--tokenizer``: any Hugging Face directory with tokenizer files (its config.json is the
starting point, so its special token ids stay right); ``--shape``: a built-in shape, or
``--config FILE`` with the fields to set. No weight file is written.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

# Llama-architecture shapes (the published configs' sizes): what vLLM allocates and runs.
SHAPES: dict[str, dict[str, object]] = {
    "llama-3-8b": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                   "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128},
    "llama-3-70b": {"hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
                    "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128},
    "llama-3.2-1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64},
}
TOKENIZER_FILES = ("special_tokens_map.json", "generation_config.json", "chat_template.jinja")


def model_config(source: dict[str, object], shape: dict[str, object], max_len: int) -> dict[str, object]:
    """The source's config reshaped: Llama architecture, bf16, untied embeddings, no quantization."""
    config = {k: v for k, v in source.items() if k != "quantization_config"}
    config.update(shape)
    config.update(architectures=["LlamaForCausalLM"], model_type="llama", torch_dtype="bfloat16",
                  tie_word_embeddings=False, max_position_embeddings=max_len)
    return config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", type=Path, required=True, help="HF directory with tokenizer files")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--shape", choices=sorted(SHAPES), help="a built-in model shape")
    group.add_argument("--config", type=Path, help="JSON file of config fields to set")
    parser.add_argument("--max-len", type=int, default=8192, help="max_position_embeddings (default 8192)")
    parser.add_argument("--out", type=Path, required=True, help="model directory to write")
    args = parser.parse_args(argv)

    source_config = args.tokenizer / "config.json"
    if not source_config.is_file():
        print(f"--tokenizer {args.tokenizer}: no config.json there; give a Hugging Face model directory",
              file=sys.stderr)
        return 2
    names = [p.name for p in args.tokenizer.iterdir() if p.name.startswith("tokenizer") or p.name in TOKENIZER_FILES]
    if not any(n.startswith("tokenizer") for n in names):
        print(f"--tokenizer {args.tokenizer}: no tokenizer files there (tokenizer.json or tokenizer_config.json)",
              file=sys.stderr)
        return 2
    if args.config is not None:
        try:
            shape = json.loads(args.config.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            print(f"--config {args.config}: not readable JSON ({exc})", file=sys.stderr)
            return 2
        if not isinstance(shape, dict):
            print(f"--config {args.config}: must be a JSON object of config fields", file=sys.stderr)
            return 2
    else:
        shape = SHAPES[args.shape]
    config = model_config(json.loads(source_config.read_text(encoding="utf-8")), shape, args.max_len)
    # Written beside the target and renamed into place: an interrupted run leaves no
    # directory that looks complete.
    args.out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{args.out.name}-", dir=args.out.parent))
    for name in names:
        shutil.copy(args.tokenizer / name, staging / name)
    (staging / "config.json").write_text(json.dumps(config, indent=1) + "\n", encoding="utf-8")
    if args.out.exists():
        shutil.rmtree(args.out)
    staging.rename(args.out)
    print(f"wrote {args.out}: {sorted(p.name for p in args.out.iterdir())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
