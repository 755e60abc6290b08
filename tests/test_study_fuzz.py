"""Fuzz pass over study files: seeded mutations of every shipped study (types, bounds,
anchors, encodings, duplicates, deletions, nesting, truncation) through `tuner validate`.

Each input must end in exit 0 (a valid study) or exit 2 with error lines only - never a
traceback or another exit code - within a per-input time and a stated memory bound for
the whole pass (peak RSS of the validating process's own address space, VmHWM: see tests/peak_memory.py).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import ROOT
from tests.energy_here import refused_only_for_energy

STUDIES = sorted((ROOT / "search_spaces").glob("*.yaml"))
MUTATIONS_PER_STUDY = 60
RSS_LIMIT_MB = 400        # peak of the process that validated every input
SECONDS_PER_INPUT = 20.0  # validate counts the space for at most ~100k points

_WEIRD_VALUES: list[Any] = [
    None, True, False, 0, -1, 1, 2**31, 2**63, 10**30, -10**30, 0.0, -0.0, 1e308, -1e-308, 3.5,
    "", " ", "x" * 5000, "\n", "nan", "inf", "-inf", "1e999", "${HOME}", "$(touch /tmp/pwned)",
    "a\nb: c", "'\"\\", "é漢字🙂", "\u202e", [], [1, 2], {}, {"a": 1}, [[[[]]]], ["x"] * 200,
    "100000h", "1h30m", "-5s", "0s",
]


def _leaves(node: Any, path: tuple = ()) -> list[tuple]:
    out = [path]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _leaves(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _leaves(v, path + (i,))
    return out


def _set(node: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    parent = node
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return node


def _delete(node: Any, path: tuple) -> Any:
    if not path:
        return node
    parent = node
    for key in path[:-1]:
        parent = parent[key]
    del parent[path[-1]]
    return node


def _bomb(levels: int = 9) -> str:
    lines = ["  b0: &b0 [" + ", ".join(["v"] * 10) + "]"]
    lines += [f"  b{i}: &b{i} [" + ", ".join([f"*b{i - 1}"] * 10) + "]" for i in range(1, levels + 1)]
    return "\n".join(lines)


def mutate(text: str, rng: random.Random) -> bytes:
    """One mutation of a study file's text (bytes: some mutations change the encoding)."""

    data = yaml.safe_load(text)
    kind = rng.choice(["type", "type", "bound", "delete", "duplicate", "anchor_bomb", "alias_list",
                       "recursive", "encoding", "truncate", "nest", "junk_key", "swap_section"])
    paths = _leaves(data)[1:]
    path = rng.choice(paths)
    if kind == "type":
        return yaml.safe_dump(_set(data, path, rng.choice(_WEIRD_VALUES)), sort_keys=False,
                              allow_unicode=True).encode()
    if kind == "bound":
        value = rng.choice([0, -1, 10**6, 10**9, 10**18, 10**30, 1e300, -1e300, 0.5, 2**53 + 1])
        numeric = [p for p in paths if isinstance(_get(data, p), (int, float)) and not isinstance(_get(data, p), bool)]
        return yaml.safe_dump(_set(data, rng.choice(numeric or paths), value), sort_keys=False).encode()
    if kind == "delete":
        return yaml.safe_dump(_delete(data, path), sort_keys=False).encode()
    if kind == "duplicate":
        lines = text.splitlines()
        keyed = [i for i, l in enumerate(lines) if ":" in l and not l.lstrip().startswith(("#", "-"))]
        i = rng.choice(keyed)
        return "\n".join(lines[: i + 1] + [lines[i]] + lines[i + 1:]).encode()
    if kind == "anchor_bomb":
        where = rng.choice(["server:\n  flags:\n", "load:\n", "probe:\n", "baseline:\n"])
        body = text.replace(where, where + "  bomb:\n" + textwrap.indent(_bomb(), "  ") + "\n", 1)
        return (body if body != text else text + "\nbomb:\n" + _bomb() + "\n").encode()
    if kind == "alias_list":
        target = rng.choice(["concurrency", "flags", "values", "n_trials"])
        return ("anchors:\n" + _bomb() + "\n" + text.replace(f"{target}:", f"{target}: *b9\n  x_{target}:", 1)).encode()
    if kind == "recursive":
        return (text + "\nloop: &loop [1, *loop]\n").encode()
    if kind == "encoding":
        how = rng.choice(["utf16", "latin1", "bom", "nul", "invalid", "cr"])
        if how == "utf16":
            return text.encode("utf-16")
        if how == "latin1":
            return (text + "\ndescription: café\n").encode("latin-1")
        if how == "bom":
            return b"\xef\xbb\xbf" + text.encode()
        if how == "nul":
            pos = rng.randrange(len(text))
            return (text[:pos] + "\0" + text[pos:]).encode()
        if how == "cr":
            return text.replace("\n", "\r").encode()
        raw = bytearray(text.encode())
        raw[rng.randrange(len(raw))] = rng.choice([0xFF, 0xC0, 0x80, 0xFE])
        return bytes(raw)
    if kind == "truncate":
        raw = text.encode()
        return raw[: rng.randrange(1, len(raw))]
    if kind == "nest":
        depth = rng.choice([70, 500, 5000])
        return yaml.safe_dump(_set(data, path, "PLACEHOLDER"), sort_keys=False).replace(
            "PLACEHOLDER", "[" * depth + "]" * depth, 1).encode()
    if kind == "junk_key":
        parent = path[:-1]
        node = _get(data, parent)
        if isinstance(node, dict):
            node[rng.choice(["extra", "Name", "__class__", "<<", "name "])] = 1
        return yaml.safe_dump(data, sort_keys=False).encode()
    sections = list(data)
    a, b = rng.sample(sections, 2) if len(sections) > 1 else (sections[0], sections[0])
    data[a], data[b] = data[b], data[a]
    return yaml.safe_dump(data, sort_keys=False).encode()


def _get(node: Any, path: tuple) -> Any:
    for key in path:
        node = node[key]
    return node


_RUNNER = textwrap.dedent("""
    import contextlib, io, json, resource, sys, time
    from tests.peak_memory import own_peak_rss_kb
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
    from tuner.commands.main import main
    results = []
    for path in json.loads(sys.argv[1]):
        out, err = io.StringIO(), io.StringIO()
        began = time.monotonic()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = main(["validate", path])
            problem = None
        except BaseException as exc:   # what the user would have seen as a traceback
            code, problem = None, f"{type(exc).__name__}: {str(exc)[:300]}"
        results.append({"path": path, "code": code, "stderr": err.getvalue()[-3000:],
                        "problem": problem, "seconds": time.monotonic() - began})
    print(json.dumps({"results": results,
                      "rss_mb": own_peak_rss_kb() / 1024}))
""")


def test_mutated_study_files_end_in_a_clear_error_or_a_valid_study(tmp_path: Path) -> None:
    inputs: list[str] = []
    for study in STUDIES:
        text = study.read_text()
        rng = random.Random(f"{study.name}-16")
        for i in range(MUTATIONS_PER_STUDY):
            path = tmp_path / f"{study.stem}-{i:03d}.yaml"
            path.write_bytes(mutate(text, rng))
            inputs.append(str(path))
        inputs.append(str(study))   # the unmutated file must stay valid
    run = subprocess.run([sys.executable, "-c", _RUNNER, json.dumps(inputs)], cwd=ROOT,
                         capture_output=True, text=True, timeout=1800)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    bad = []
    for item in report["results"]:
        lines = [l for l in item["stderr"].splitlines() if l.strip()]
        if item["problem"] or item["code"] not in (0, 2):
            bad.append((item["path"], item["code"], item["problem"], item["stderr"][-500:]))
        elif item["code"] == 2 and not (lines and lines[0].startswith("error: ")
                                        and all(len(l) < 1000 for l in lines) and len(lines) <= 11
                                        and "Traceback" not in item["stderr"]):
            bad.append((item["path"], "unclear error", item["stderr"][-800:]))
        elif item["seconds"] > SECONDS_PER_INPUT:
            bad.append((item["path"], f"{item['seconds']:.1f}s"))
    assert not bad, bad[:5]
    codes = [r["code"] for r in report["results"]]
    valid = [r["path"] for r in report["results"] if r["code"] == 0
             or r["path"] in map(str, STUDIES) and refused_only_for_energy(r["code"], r["stderr"])]
    assert all(str(s) in valid for s in STUDIES), "a shipped study no longer validates"
    # The pass must exercise both sides: mostly refusals, some mutations still valid.
    assert codes.count(2) > len(codes) // 2 and len(valid) > len(STUDIES)
    assert report["rss_mb"] < RSS_LIMIT_MB, report["rss_mb"]
    print(f"fuzz: {len(codes)} inputs, {codes.count(2)} refused, {len(valid)} valid, "
          f"peak RSS {report['rss_mb']:.0f} MB, slowest "
          f"{max(r['seconds'] for r in report['results']):.2f}s")
