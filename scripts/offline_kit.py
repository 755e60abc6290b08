"""Build an offline install kit for an air-gapped GPU box: vLLM, the tuner's own
dependencies and a model, as one compressed tree plus the script that installs it there.

GPU boxes in a datacentre often reach no package index. Their image usually already holds
the heavy part (PyTorch, CUDA, NCCL, transformers), so what has to travel is the rest: the
vLLM wheel and the few dozen small packages it needs beside that image, and the tuner's
(optuna, ray, ...). A kit lists them exactly (a pinned requirements file, one `name==version`
a line, no dependency resolution: the list is what was measured to be enough on the box;
`scripts/gpu-kit/h200-vllm-0.26.0.txt` is the one for the project's H200), so nothing the
box already has is replaced.

    python3 scripts/offline_kit.py --requirements scripts/gpu-kit/h200-vllm-0.26.0.txt \\
        --python 3.12 --out kit/                       # here, with internet
    # carry kit/ to the box, then there:
    bash kit/install_offline.sh /opt/tuner-kit          # prints the line to source

What it does:
  1. `pip download --no-deps --only-binary=:all:` every pinned wheel for the box's Python and
     x86-64 manylinux platforms (pip matches each manylinux tag exactly, so all common ones
     are offered);
  2. unpacks them into one site tree (`pip install --target`, still for the box's Python);
  3. deletes the files the kit's `# trim:` lines name (e.g. vLLM's sm80-only FlashAttention-2
     library on a Hopper box: ~300 MB of the wheel's ~700 MB unpacked);
  4. writes `site.tar.xz`, `install_offline.sh` and `MANIFEST.json` (every wheel with its
     sha256, what was trimmed, sizes).

The kit file format: `name==version` lines; `# trim: <path glob relative to site>` lines;
other `#` lines are comments.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

# Offered to pip as acceptable platform tags; pip matches manylinux_2_N exactly, so list the
# ones wheels on PyPI actually carry.
MANYLINUX = [f"manylinux_2_{n}_x86_64" for n in (17, 24, 26, 27, 28, 31, 34, 35)] + [
    "manylinux2014_x86_64", "manylinux1_x86_64"]


def read_kit(path: Path) -> tuple[list[str], list[str]]:
    """Pinned requirements and trim globs of a kit file; refuses anything unpinned."""
    pins: list[str] = []
    trims: list[str] = []
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if line.startswith("# trim:"):
            trims.append(line.removeprefix("# trim:").strip())
            continue
        if not line or line.startswith("#"):
            continue
        name, sep, version = line.partition("==")
        if not sep or not name.strip() or not version.strip():
            raise SystemExit(f"{path}:{number}: {line!r} is not pinned as name==version")
        pins.append(f"{name.strip()}=={version.strip()}")
    if not pins:
        raise SystemExit(f"{path}: no pinned requirements")
    return pins, trims


def pip_platform_args(python: str) -> list[str]:
    args = ["--only-binary=:all:", "--python-version", python, "--implementation", "cp"]
    for tag in MANYLINUX:
        args += ["--platform", tag]
    return args


def run(argv: list[str]) -> None:
    print("+", " ".join(argv), flush=True)
    subprocess.run(argv, check=True)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def trim(site: Path, globs: list[str]) -> list[dict[str, object]]:
    removed: list[dict[str, object]] = []
    for pattern in globs:
        for hit in sorted(site.glob(pattern)):
            size = sum(p.stat().st_size for p in hit.rglob("*") if p.is_file()) \
                if hit.is_dir() else hit.stat().st_size
            shutil.rmtree(hit) if hit.is_dir() else hit.unlink()
            removed.append({"path": str(hit.relative_to(site)), "bytes": size})
    for cache in list(site.rglob("__pycache__")):
        shutil.rmtree(cache, ignore_errors=True)
    return removed


INSTALL_SH = r"""#!/usr/bin/env bash
# Install this offline kit on the box (no network needed): unpack site.tar.xz under PREFIX,
# check the unpacked packages import with the box's python3, and write PREFIX/env.sh.
#   bash install_offline.sh PREFIX [PYTHON]
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
prefix=${1:?usage: install_offline.sh PREFIX [PYTHON]}
py=${2:-python3}
mkdir -p "$prefix/site"
tar -xJf "$here/site.tar.xz" -C "$prefix/site"
cat > "$prefix/env.sh" <<EOF
export PYTHONPATH="$prefix/site\${PYTHONPATH:+:\$PYTHONPATH}"
export PATH="$prefix/site/bin:\$PATH"
EOF
PYTHONPATH="$prefix/site${PYTHONPATH:+:$PYTHONPATH}" "$py" -c 'import importlib, json, sys
mods = json.load(open(sys.argv[1]))["imports"]
for m in mods:
    importlib.import_module(m)
print("imports ok:", ", ".join(mods))' "$here/MANIFEST.json"
echo "source $prefix/env.sh"
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requirements", type=Path, required=True, help="kit file (pinned)")
    parser.add_argument("--python", default="3.12", help="the box's Python version (X.Y)")
    parser.add_argument("--out", type=Path, required=True, help="kit directory to write")
    parser.add_argument("--import-check", default="vllm,optuna,ray,pydantic",
                        help="modules install_offline.sh imports on the box to check the kit")
    args = parser.parse_args()

    pins, trims = read_kit(args.requirements)
    out = args.out.resolve()
    wheels, site = out / "wheels", out / "site"
    for d in (wheels, site):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    platform = pip_platform_args(args.python)
    run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels),
         *platform, *pins])
    files = sorted(wheels.glob("*.whl"))
    run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-compile",
         "--target", str(site), *platform, *map(str, files)])
    removed = trim(site, trims)
    archive = out / "site.tar.xz"
    with tarfile.open(archive, "w:xz", preset=9) as tar:
        for entry in sorted(site.iterdir()):
            tar.add(entry, arcname=entry.name)
    manifest = {
        "python": args.python,
        "requirements": pins,
        "wheels": [{"file": f.name, "sha256": sha256(f), "bytes": f.stat().st_size}
                   for f in files],
        "trimmed": removed,
        "archive_bytes": archive.stat().st_size,
        "imports": [m for m in args.import_check.split(",") if m],
    }
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")
    (out / "install_offline.sh").write_text(INSTALL_SH)
    (out / "install_offline.sh").chmod(0o755)
    shutil.rmtree(site)
    print(f"kit: {out} ({len(files)} wheels, archive {archive.stat().st_size / 2**20:.1f} MiB, "
          f"trimmed {sum(int(r['bytes']) for r in removed) / 2**20:.0f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
