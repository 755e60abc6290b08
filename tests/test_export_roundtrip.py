"""Every export format read back by its own reader yields exactly the measured command
(issue 16, defect 1): shlex for the shell command and the env file, yaml.safe_load for
the vLLM config, systemd's unquoting rules (tests/systemd_syntax.py, written from
systemd's code) for the unit, json for JSON - for values with newlines, quotes, '$', '%',
backslashes, unicode and control characters; NUL is refused clearly. Secrets come back as
references that resolve to the measured values. `systemd-analyze verify` checks units
where it is installed."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import systemd_syntax as sd
from tuner.errors import SpecError
from tuner.secrets import secret_slots
from tuner.study.space import trial_command
from tuner.study.study_file import parse_study
from tuner.study.trials import TrialRecord
from tuner.views.export import ExportError, exported_command, render_export
from tuner.views.export_formats import ExportFormatError, read_systemd_exec, shell_text, systemd_text
from tuner.views.export_formats import read_shell as export_read_shell

SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
UNIT_KEYS = {"Description", "After", "Wants", "Type", "Environment", "EnvironmentFile", "ExecStart",
             "Restart", "RestartSec", "KillMode", "TimeoutStopSec", "WantedBy"}

HOSTILE_CHARS = list("\n\r\t \"'$%\\{}#;=`*?~!&|<>()[]^,.:/@+-") + ["\x01", "\x1b", "\x7f", "é", "漢",
                                                                  "🙂", "\u2028", "\u00a0", "\u202e"]
hostile = st.text(alphabet=st.one_of(st.sampled_from(HOSTILE_CHARS), st.characters(
    codec="utf-8", exclude_categories=("Cs",), exclude_characters="\0")), max_size=30)

API_KEY = "sk-PLANTED-key-0123456789"
HF_TOKEN = "hf_PLANTED_token_abcdef"


def study_text(note: str, template: str, model: str, *, name: str = "rt", plain: str = "1") -> str:
    data = {
        "name": name,
        "server": {
            "command": ["vllm", "serve"], "model": model, "gpus_per_trial": 0,
            "env": {"MY_NOTE": note, "PLAIN": plain, "HF_TOKEN": HF_TOKEN},
            "flags": {"chat_template": template, "api_key": API_KEY},
        },
        "parameters": [{"name": "proto", "env": "NCCL_PROTO", "kind": "categorical", "values": [None, "LL"]},
                       {"name": "eager", "flag": "enforce_eager", "kind": "bool"}],
    }
    # PyYAML's dumper escapes what its reader would refuse raw (\x7f, C1 controls) and
    # keeps characters beyond the BMP whole (JSON's surrogate-pair escapes would not be).
    return yaml.safe_dump(data, allow_unicode=True)


def record() -> TrialRecord:
    return TrialRecord(number=3, state="COMPLETE", kind="run", params={"proto": "LL", "eager": False},
                       values={"output_tok_s@cmax": 1234.5, "tpot_ms.mean@c1": 9.5},
                       constraints={"probe": 0.0, "applied": 0.0}, attrs={})


def measured(spec: Any) -> tuple[list[str], dict[str, str], dict[str, Any]]:
    command = trial_command(spec, record().params, python="python")
    return command.argv, command.env, command.args


def secrets_of(spec: Any) -> dict[str, str]:
    return {s.ref: s.value for s in secret_slots(spec.server) if s.value is not None}


def resolve(word: str, secrets: dict[str, str]) -> str:
    for ref, value in secrets.items():
        word = word.replace("${" + ref + "}", value)
    return word


# -- readers ------------------------------------------------------------------------------

def read_shell(text: str) -> tuple[list[str], dict[str, str]]:
    words = shlex.split(text, comments=True)
    env: dict[str, str] = {}
    while words and "=" in words[0] and words[0].split("=", 1)[0].isidentifier():
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    return words, env


def read_env(text: str) -> dict[str, str]:
    return dict(word.split("=", 1) for word in shlex.split(text, comments=True))


def read_json(text: str) -> tuple[list[str], dict[str, str], list[str]]:
    data = json.loads(text)
    return data["argv"], data["env"], data["secrets"]


def read_systemd(text: str, secrets: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    entries = sd.read_unit(text)
    assert {key for _, key, _ in entries} <= UNIT_KEYS, [key for _, key, _ in entries]
    env: dict[str, str] = {}
    for _, key, value in entries:
        if key == "Environment":
            env.update(sd.environment_words(value))
    exec_lines = [value for _, key, value in entries if key == "ExecStart"]
    assert len(exec_lines) == 1
    files = [value for _, key, value in entries if key == "EnvironmentFile"]
    file_env = {ref: value for ref, value in secrets.items()} if files else {}
    words = [sd.expand_exec_word(w, {**env, **file_env}) for w in sd.exec_words(exec_lines[0])]
    assert words[0] == "/usr/bin/env"
    return words[1:], {**env, **{k: v for k, v in file_env.items() if k in ("HF_TOKEN",)}}


def read_yaml(text: str) -> tuple[dict[str, Any], list[str]]:
    lines = text.splitlines()
    start = lines[lines.index("# Start with (the environment is part of the measured configuration):") + 1]
    assert start.startswith("#   ")
    return yaml.safe_load(text), shlex.split(start[4:])


def systemd_verify(tmp: Path, unit: str) -> None:
    if SYSTEMD_ANALYZE is None:
        return
    path = tmp / "rt-export.service"
    path.write_text(unit)
    run = subprocess.run([SYSTEMD_ANALYZE, "verify", "--man=no", str(path)], capture_output=True,
                         text=True, timeout=60)
    # Only this unit's own complaints count (a container may lack unrelated units).
    own = [l for l in run.stderr.splitlines() if str(path) in l or "rt-export.service" in l]
    assert run.returncode == 0 and not own, run.stderr


# -- the round trip -------------------------------------------------------------------------

def check_round_trip(note: str, template: str, model: str, tmp: Path | None = None) -> None:
    spec = parse_study(study_text(note, template, model), "rt.yaml")
    argv, env, args = measured(spec)
    secrets = secrets_of(spec)
    for fmt in ("shell", "env", "json", "systemd", "yaml"):
        can = fmt != "yaml" or _yaml_can(spec.server.env["MY_NOTE"], template, model)
        text = render_export(spec, "rt", record(), fmt) if can else None
        if text is None:
            with pytest.raises(ExportError, match="comment line|starts with '-'"):
                render_export(spec, "rt", record(), fmt)
            continue
        for secret in secrets.values():
            assert secret not in text, fmt
        if fmt == "shell":
            got_argv, got_env = read_shell(text)
            assert [resolve(w, secrets) for w in got_argv] == argv
            assert export_read_shell(text) == (got_argv, got_env)
            assert {k: resolve(v, secrets) for k, v in got_env.items()} == env
        elif fmt == "env":
            assert {k: resolve(v, secrets) for k, v in read_env(text).items()} == env
        elif fmt == "json":
            got_argv, got_env, names = read_json(text)
            assert names == sorted(secrets)
            assert [resolve(w, secrets) for w in got_argv] == argv
            assert {k: resolve(v, secrets) for k, v in got_env.items()} == env
        elif fmt == "systemd":
            got_argv, got_env = read_systemd(text, secrets)
            assert got_argv == argv
            assert got_env == env
            # `tuner export --check` reads units with its own reader: it must agree.
            assert [resolve(w, secrets) for w in read_systemd_exec(text)] == argv
            if tmp is not None:
                systemd_verify(tmp, text)
        else:
            config, start = read_yaml(text)
            assert config == {k.replace("_", "-"): v for k, v in args.items() if k != "api_key"}
            got_env = dict(w.split("=", 1) for w in start[:len(env)])
            assert {k: resolve(v, secrets) for k, v in got_env.items()} == env
            assert [resolve(w, secrets) for w in start[len(env):]] == \
                ["vllm", "serve", "--api-key", API_KEY, "--config", "THIS_FILE.yaml"]


def _yaml_can(note: str, *values: str) -> bool:
    """The yaml format writes the environment into a comment line: printable values only;
    and vLLM's --config reader would read a value starting with '-' as a flag."""

    return all(c.isprintable() or c == " " for c in note) and not any(v.startswith("-") for v in values)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(note=hostile, template=hostile, model=hostile.filter(lambda s: s.strip() != ""))
def test_every_format_round_trips_hostile_values(note: str, template: str, model: str) -> None:
    check_round_trip(note, template, model)


@pytest.mark.parametrize("note", [
    "x\nExecStartPre=/usr/bin/touch /tmp/pwned",
    "x\ntrust-remote-code: true #",
    "$HOME ${HOME} $$ %n %% 100%",
    "a\\nb \\\\ \\x41 \"q\" 'q' ;",
    ";",
    "",
    "tab\there\rcr\x01ctl\x7fdel",
    "漢字 é 🙂 \u2028 \u202e",
    "--trust-remote-code",
])
def test_examples_round_trip_and_verify_with_systemd(note: str, tmp_path: Path) -> None:
    check_round_trip(note, note + " template", "/models/m " + note.replace("\n", " ") + "x", tmp_path)


def test_the_issue_injections_stay_values(tmp_path: Path) -> None:
    spec = parse_study(study_text("x\nExecStartPre=/usr/bin/touch /tmp/pwned", "t", "/m"), "rt.yaml")
    unit = render_export(spec, "rt", record(), "systemd")
    assert not any(line.startswith("ExecStartPre") for line in unit.splitlines())
    assert "Environment=\"MY_NOTE=x\\nExecStartPre=/usr/bin/touch /tmp/pwned\"" in unit
    spec = parse_study(study_text("x", "t", "/m", plain="$HOME 100%"), "rt.yaml")
    unit = render_export(spec, "rt", record(), "systemd")
    assert 'Environment="PLAIN=$HOME 100%%"' in unit     # '$' means nothing in Environment=
    config = yaml.safe_load(render_export(parse_study(study_text("x", "x\ntrust-remote-code: true #", "/m"),
                                                      "rt.yaml"), "rt", record(), "yaml"))
    assert "trust-remote-code" not in config and config["chat-template"] == "x\ntrust-remote-code: true #"


def test_nul_is_refused_by_the_study_and_by_every_format() -> None:
    with pytest.raises(SpecError, match="NUL"):
        parse_study(study_text("a\0b", "t", "/m"), "rt.yaml")
    spec = parse_study(study_text("ok", "t", "/m"), "rt.yaml")
    exported = exported_command(spec, "rt", record())
    bad = exported.__class__(**{**exported.__dict__, "env": {**exported.env, "X": "a\0b"}})
    for writer in (shell_text, systemd_text):
        with pytest.raises(ExportFormatError, match="NUL"):
            writer(bad)
