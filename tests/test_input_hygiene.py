"""A value is a value, and what a study or a server says reaches the terminal as text
(issue #39, items 13 and 14): a flag value that looks like a flag, a list element that
would become one, a server listening beyond loopback, control characters in printed
values, `export --check` without vLLM, and the one error prefix of every command."""

from __future__ import annotations

import argparse
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import CPU_EXAMPLE, ROOT, copy_cpu_example, measured_with_flags, run_tuner, tuner_argv
from tuner.commands.main import main
from tuner.sim.args import parse_argv
from tuner.study.space import trial_command
from tuner.study.study_file import parse_study

STUDY = """
name: hygiene
server:
  command: ["{{python}}", "-m", "tuner.sim"]
  model: /models/smol
  host: {host}
  gpus_per_trial: 0
  flags: {flags}
parameters:
  - {{name: seed, flag: seed, kind: categorical, values: [-1, 0]}}
forbidden: {forbidden}
baseline: {{seed: 0}}
"""


def study_text(*, host: str = "127.0.0.1", flags: str = "{}", forbidden: str = "[]") -> str:
    return STUDY.format(host=host, flags=flags, forbidden=forbidden)


def study_file(tmp_path: Path, **kw: str) -> Path:
    path = tmp_path / "hygiene.yaml"
    path.write_text(study_text(**kw))
    return path


# -- item 13: flag values that are flags ---------------------------------------------------------

def test_a_value_starting_with_a_dash_stays_the_flags_value() -> None:
    spec = parse_study(study_text(flags='{chat_template: "--trust-remote-code"}'), "hygiene.yaml")
    argv = trial_command(spec, {"seed": -1}, python="python").argv
    assert "--chat-template=--trust-remote-code" in argv and "--seed=-1" in argv
    assert "--trust-remote-code" not in argv
    # argparse, as vLLM's parser builds on it, and the simulator's own parser read one value.
    parser = argparse.ArgumentParser()
    parser.add_argument("--chat-template")
    parser.add_argument("--trust-remote-code", action="store_true")
    parser.add_argument("--seed", type=int)
    args, _ = parser.parse_known_args(argv[3:])
    assert args.chat_template == "--trust-remote-code" and not args.trust_remote_code and args.seed == -1
    sim = parse_argv(argv[3:])
    assert sim.unknown["chat_template"] == "--trust-remote-code" and "trust_remote_code" not in sim.unknown
    # Every other value keeps its own word, as in the committed exports.
    assert argv[argv.index("--model") + 1] == "/models/smol"


def test_a_list_element_that_is_a_flag_is_refused_naming_the_field(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    path = study_file(tmp_path, flags='{served_model_name: [glm5, "--api-key", "s3cr3t-key"]}')
    assert main(["validate", str(path)]) == 2
    out = capsys.readouterr()
    assert "flags.served_model_name: element 1 ('--api-key') starts with '-'" in out.err
    assert "s3cr3t-key" not in out.out + out.err   # nothing printed the key


def test_the_yaml_export_refuses_a_value_vllms_config_reader_would_split(tmp_path: Path) -> None:
    results = copy_cpu_example(tmp_path)
    measured_with_flags(results / CPU_EXAMPLE.name, {"chat_template": "--trust-remote-code"})
    base = ("export", CPU_EXAMPLE.name, "--results", str(results), "--pick", "best-throughput")
    shell = run_tuner(*base, "--format", "shell", timeout=120)
    assert shell.returncode == 0, shell.stderr
    assert " --chat-template=--trust-remote-code" in shell.stdout
    out = run_tuner(*base, "--format", "yaml", timeout=120)
    assert out.returncode == 2
    assert out.stderr.startswith("error: yaml: --chat-template: the value '--trust-remote-code' starts with '-'")


# -- item 14: host, control characters, export --check, the error prefix ------------------------

@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "box.example"])
def test_a_server_listening_beyond_loopback_is_a_warning(tmp_path: Path, host: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(study_file(tmp_path, host=f'"{host}"'))]) == 0
    [warning] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[warning]")]
    assert f"server.host '{host}'" in warning and "anyone who can reach it can send it requests" in warning
    assert "use 127.0.0.1" in warning


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_a_loopback_host_gets_no_warning(tmp_path: Path, host: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(study_file(tmp_path, host=f'"{host}"'))]) == 0
    assert "[warning]" not in capsys.readouterr().out


def test_control_characters_in_a_studys_values_reach_the_terminal_escaped(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = study_file(tmp_path, flags='{chat_template: "\\e]0;owned\\a"}',
                      forbidden='[{when: {seed: -1}, reason: "\\e[2Jcleared"}]')
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "\\x1b]0;owned\\x07" in out and "\\x1b[2Jcleared" in out


def _read_pty(argv: list[str], timeout_s: float = 120) -> tuple[int, bytes]:
    """Run ``argv`` with its stdout on a pseudo-terminal (as in a shell); what it wrote there."""

    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdout=slave, stderr=subprocess.DEVNULL, cwd=ROOT)
    os.close(slave)
    chunks, deadline = [], time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:
                    break   # the child closed the terminal
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        return proc.wait(timeout=30), b"".join(chunks)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)


def test_an_export_is_exact_in_a_pipe_and_escaped_on_a_terminal(tmp_path: Path) -> None:
    results = copy_cpu_example(tmp_path)
    measured_with_flags(results / CPU_EXAMPLE.name, {"chat_template": "\x1b]0;owned\x07"})
    args = ("export", CPU_EXAMPLE.name, "--results", str(results), "--pick", "best-throughput")
    piped = run_tuner(*args, timeout=120)
    assert piped.returncode == 0 and "'\x1b]0;owned\x07'" in piped.stdout   # the command, byte for byte
    code, shown = _read_pty(tuner_argv(*args))
    assert code == 0 and b"\x1b" not in shown and b"\x07" not in shown
    assert b"\\x1b]0;owned\\x07" in shown


def test_export_check_without_vllm_says_so_in_one_line(tmp_path: Path) -> None:
    results = copy_cpu_example(tmp_path)
    out = run_tuner("export", CPU_EXAMPLE.name, "--results", str(results), "--pick", "best-throughput",
                    "--check", "--vllm-python", sys.executable, timeout=300)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr == (f"error: --check: {sys.executable} cannot import vLLM's argument parser "
                          "(ModuleNotFoundError: No module named 'vllm'); pass --vllm-python with the "
                          "vLLM environment's interpreter\n")
    assert "Traceback" not in out.stdout + out.stderr


def test_export_errors_carry_the_prefix_of_every_other_command(tmp_path: Path) -> None:
    results = copy_cpu_example(tmp_path)
    out = run_tuner("export", CPU_EXAMPLE.name, "--results", str(results), "--pick", "best:nonsense", timeout=120)
    assert out.returncode == 2
    assert out.stderr.startswith("error: ") and "nonsense" in out.stderr


def test_a_servers_words_in_an_error_reach_the_terminal_escaped(tmp_path: Path) -> None:
    """`tuner measure` quotes what the server answered; a hostile or broken server's escape
    sequence arrives as text."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Hostile(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"\x1b]0;owned\x07no models here"
            self.send_response(500)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        run = run_tuner("measure", str(study_file(tmp_path)), "--url", url, "-o", str(tmp_path / "o"), timeout=120)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
    assert run.returncode == 3, run.stdout + run.stderr
    assert run.stderr.startswith(f"error: {url}/v1/models answered HTTP 500: \\x1b]0;owned\\x07no models here")
    assert "\x1b" not in run.stderr and "\x07" not in run.stderr
