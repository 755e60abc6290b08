"""Record which arguments, config fields and environment variables a vLLM knows, for
``tuner validate`` and ``tuner run`` to check a study's names against without asking vLLM.

    .venv/bin/python scripts/record_vllm_arguments.py PYTHON [--cpu-platform] [--pythonpath DIR]

PYTHON is the interpreter of a vLLM environment (the CPU build: ``.venv-vllm/bin/python``).
``--pythonpath DIR`` puts an unpacked vLLM wheel in front of that environment's own vLLM
(how the GPU build 0.26.0 was read on a machine without a GPU, with the CPU build's
dependencies), and ``--cpu-platform`` lets a GPU build import without its GPU. Writes
tuner/vllm/recorded/<distribution>-<version>.json; the recordings are committed and tests
never run this script.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tuner.adapters.vllm_arguments import RECORDED_DIR, ask_vllm  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("python")
    parser.add_argument("--cpu-platform", action="store_true")
    parser.add_argument("--pythonpath")
    args = parser.parse_args()
    env = {"PYTHONPATH": args.pythonpath} if args.pythonpath else None
    record = ask_vllm(args.python, env, cpu_platform=args.cpu_platform, timeout_s=600)
    if record is None:
        print(f"{args.python}: vLLM's arguments could not be read", file=sys.stderr)
        return 1
    path = RECORDED_DIR / f"{record['distribution']}-{record['version']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path}: {len(record['flags'])} flags, {len(record['config_fields'])} config "
          f"arguments, {len(record['env'])} variables")
    return 0


if __name__ == "__main__":
    sys.exit(main())
