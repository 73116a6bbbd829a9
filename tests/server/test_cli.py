"""``voxwire serve`` says clearly what is missing, and downloads nothing."""

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys

import pytest

from voxwire.server import config_loader
from tests.conftest import free_port


@pytest.mark.slow  # a spawned server, about 5 s
def test_cosyvoice2_without_a_model_names_every_missing_file(tmp_path):
    (tmp_path / "llm.pt").write_bytes(b"")
    run = subprocess.run(
        [sys.executable, "-m", "voxwire", "serve", "--engine", "cosyvoice2", "--model-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )
    assert run.returncode == 2
    for name in ("cosyvoice2.yaml", "flow.pt", "hift.pt", "campplus.onnx", "speech_tokenizer_v2.onnx", "CosyVoice-BlankEN"):
        assert name in run.stderr
    assert "llm.pt" not in run.stderr.split("lacks:")[1].split(".\n")[0]
    assert "pretrained_models/README.md" in run.stderr


def test_help_documents_the_options():
    run = subprocess.run([sys.executable, "-m", "voxwire", "serve", "--help"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0
    for flag in ("--engine", "--piper-backend", "--api-key", "--allow-origin", "--drain-seconds", "--step-timeout"):
        assert flag in run.stdout


def serve(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``voxwire serve``, expected to refuse: a free port, in case it does not."""
    return serve_on(free_port(), *args, timeout=timeout)


def serve_on(port: int, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``voxwire serve`` on ``port`` until it exits. In a process group of its own: should
    it start after all, its --workers processes end with it rather than outlive the test."""
    argv = [sys.executable, "-m", "voxwire", "serve", "--port", str(port), *args]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)


def one_line(run: subprocess.CompletedProcess) -> str:
    """What a refused start-up said: exit 2 and a single line. At --log-level info, loading
    the engine or binding the Wyoming port would have logged lines of their own."""
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    return lines[0]


@pytest.mark.slow  # a spawned server, about 4 s
def test_a_missing_piper_voice_is_one_line_and_exit_2(tmp_path):
    run = serve("--piper-voice", str(tmp_path / "missing.onnx"))
    assert run.returncode == 2
    assert "Traceback" not in run.stderr
    assert "missing.onnx" in run.stderr and len(run.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "args,says",
    [
        (["--chunk-ms", "100"], "--chunk-ms 100: default_chunk_ms must be from 150 to 250"),
        (["--chunk-ms", "0"], "--chunk-ms 0: default_chunk_ms must be from 150 to 250"),
        (["--sample-rate", "96000"], "--sample-rate 96000: default_sample_rate must be from 8000 to 48000"),
        (["--step-timeout", "0.03"], "--step-timeout 0.03: step_timeout must be at least 1"),
        (["--max-utterances-total", "0"], "--max-utterances-total 0: [limits] max_utterances_total must be at least 1"),
    ],
)
def test_settings_out_of_their_range_refuse_to_start(args, says):
    run = serve(*args)
    assert run.returncode == 2 and says in run.stderr and "Traceback" not in run.stderr


@pytest.mark.slow  # a spawned server loads the engine
def test_a_default_voice_the_engine_lacks_refuses_to_start():
    run = serve("--voice", "nobody")  # the engine loads, then the voice is checked
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "'nobody' is not a voice of the piper engine (its voices: joe)" in run.stderr


@pytest.mark.slow  # a spawned server loads the engine
@pytest.mark.parametrize(
    "entry, says",
    [
        ("nova=nobody", "--openai-voice nova=nobody: the piper engine has no voice 'nobody' (its voices: joe)"),
        ("nova=joe:bob", "--openai-voice nova=joe:bob: voice 'joe' has one speaker"),
    ],
)
def test_an_openai_voice_map_to_a_voice_the_engine_lacks_refuses_to_start(entry, says):
    run = serve("--openai-voice", entry)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert says in run.stderr, run.stderr


@pytest.mark.slow  # a spawned server loads the engine
@pytest.mark.parametrize(
    "entries, says",
    [
        (["nova"], "--openai-voice nova: must be NAME=VOICE or NAME=VOICE:SPEAKER"),
        (["=joe"], "--openai-voice =joe: must be NAME=VOICE"),
        (["nova="], "--openai-voice nova=: must be NAME=VOICE"),
        (["nova=joe", "nova=joe"], "--openai-voice nova=joe: 'nova' is mapped twice"),
    ],
)
def test_an_openai_voice_map_entry_that_cannot_be_read_refuses_to_start(entries, says):
    run = serve(*(a for e in entries for a in ("--openai-voice", e)))
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert says in run.stderr, run.stderr


@pytest.mark.slow  # a spawned server loads the engine
@pytest.mark.parametrize(
    "flag, lines, says",
    [
        ("{file}", "Vox wire! = x\n", "--lexicon {file}: lexicon entry 'Vox wire!': {file}:1: a key is one or more words"),
        ("{file}", "nginx = /ˈɛn€/\n", "--lexicon {file}: lexicon entry 'nginx': voice 'joe' has no phoneme '€'"),
        ("joe={file}", "nginx = /ˈɛn€/\n", "--lexicon joe={file}: lexicon entry 'nginx': voice 'joe' has no phoneme"),
        ("nobody={file}", "nginx = engine x\n", "--lexicon nobody={file}: the piper engine has no voice 'nobody'"),
        ("{missing}", "", "--lexicon {missing}: cannot read it (No such file or directory)"),
    ],
)
def test_a_lexicon_that_cannot_be_used_refuses_to_start(tmp_path, flag, lines, says):
    file, missing = tmp_path / "names.txt", tmp_path / "missing.txt"
    file.write_text(lines, encoding="utf-8")
    run = serve("--lexicon", flag.format(file=file, missing=missing))
    line = one_line(run)
    assert line.startswith("voxwire: --lexicon") and says.format(file=file, missing=missing) in line, line


def test_help_names_each_settings_file_key():
    run = subprocess.run([sys.executable, "-m", "voxwire", "serve", "--help"], capture_output=True, text=True, timeout=60)
    text = " ".join(run.stdout.split())  # argparse wraps lines
    assert "file: default_chunk_ms" in text and "file: [limits] max_text_chars" in text


def held_port() -> socket.socket:
    """A port some other program listens on."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


def test_a_default_format_its_default_rate_cannot_carry_refuses_to_start():
    # The Wyoming port is taken too: had it been bound first, that would be the complaint.
    with held_port() as wyoming:
        run = serve("--format", "mp3", "--sample-rate", "12345", "--wyoming-port", str(wyoming.getsockname()[1]),
                    "--log-level", "info")
    assert one_line(run) == (
        "voxwire: --format mp3 with --sample-rate 12345: mp3 cannot be encoded at 12345 Hz; "
        "it takes 8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000"
    )


@pytest.mark.slow  # spawned servers, one with --workers 2
@pytest.mark.parametrize("workers", [[], ["--workers", "2"]])
def test_a_port_in_use_refuses_to_start_in_one_line_before_the_engine_loads(workers):
    with held_port() as busy:
        port = busy.getsockname()[1]
        run = serve_on(port, "--log-level", "info", *workers)
    assert one_line(run) == f"voxwire: cannot listen on 127.0.0.1:{port}: Address already in use"


def test_workers_with_any_free_wyoming_port_refuse_to_start():
    run = serve("--workers", "2", "--wyoming-port", "0", "--log-level", "info")
    assert one_line(run) == (
        "voxwire: --workers 2 with --wyoming-port 0: each worker would listen for Wyoming on a different free "
        "port; 0 (any free port) is for a single process, so name the port"
    )


def help_entries() -> dict[str, str]:
    """``voxwire serve --help`` as {flag: its whole help, unwrapped}."""
    run = subprocess.run([sys.executable, "-m", "voxwire", "serve", "--help"], capture_output=True, text=True, timeout=60)
    entries: dict[str, str] = {}
    flag = None
    for line in run.stdout.split("options:", 1)[1].splitlines():
        if m := re.match(r"  (--?[\w-]+)", line):  # an option's first line; its help may follow on it
            flag = m.group(1)
            entries[flag] = line
        elif line.startswith(" ") and flag is not None:
            entries[flag] += " " + line.strip()
        else:
            flag = None  # a group's title or a blank line
    return {f: " ".join(text.split()) for f, text in entries.items()}


def test_help_shows_one_default_for_each_setting():
    entries = help_entries()
    for s in config_loader.settings():
        text = entries[f"--{s.flag}"]
        assert len(re.findall(r"\bdefault:", text)) == 1, text
    assert "(default: the engine's first; env VOXWIRE_VOICE; file: default_voice)" in entries["--voice"]
    assert "(default: the engine's own; env VOXWIRE_SAMPLE_RATE;" in entries["--sample-rate"]
    assert "(default: 200; env VOXWIRE_CHUNK_MS;" in entries["--chunk-ms"]


@pytest.mark.slow  # five spawned servers, about 2 s each
@pytest.mark.parametrize("host,warned", [("127.0.0.1", False), ("127.0.0.2", False), ("localhost", False),
                                         ("::1", False), ("0.0.0.0", True)])
def test_no_api_key_is_warned_about_off_loopback_only(tmp_path, host, warned):
    """Without a key anyone who can reach the port can use it: fine on any loopback address
    (server/net.py), worth a warning anywhere else. A missing voice ends the run right after."""
    run = serve("--host", host, "--piper-voice", str(tmp_path / "missing.onnx"))
    assert run.returncode == 2 and "missing.onnx" in run.stderr
    assert (f"listening on {host} with no API key" in run.stderr) is warned, run.stderr
