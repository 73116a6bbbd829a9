"""``voxwire say`` as a user runs it: a subprocess, against a real server, into a WAV
file read back by an independent reader (libsndfile)."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest
import soundfile

from tests.server.test_stream import SENTENCE, assert_speech

SUBTYPE = {"pcm_s16le": "PCM_16", "pcm_f32le": "FLOAT", "mulaw": "ULAW"}


def say(server, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "voxwire", "say", *args, "--url", server.ws],
        capture_output=True, text=True, timeout=120,
    )


@pytest.mark.parametrize("fmt,rate", [("pcm_s16le", 24000), ("pcm_f32le", 48000), ("mulaw", 8000)])
def test_say_writes_the_wav_that_was_asked_for(piper_server, tmp_path, fmt, rate):
    out = tmp_path / "out.wav"
    run = say(piper_server, SENTENCE, "-o", str(out), "--format", fmt, "--sample-rate", str(rate), "--voice", "joe")
    assert run.returncode == 0, run.stderr
    assert "time to first audio:" in run.stdout and "rtf" in run.stdout
    info = soundfile.info(str(out))
    assert (info.samplerate, info.channels, info.subtype) == (rate, 1, SUBTYPE[fmt])
    audio, _ = soundfile.read(str(out), dtype="float32")
    assert_speech(np.asarray(audio), rate, words=9)


def test_say_reports_a_server_error_clearly(piper_server, tmp_path):
    run = say(piper_server, "hello", "-o", str(tmp_path / "x.wav"), "--voice", "nobody")
    assert run.returncode == 1
    assert "unknown_voice" in run.stderr and not (tmp_path / "x.wav").exists()


def test_say_reports_an_unreachable_server(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "voxwire_client.cli", "say", "hi", "-o", str(tmp_path / "x.wav"),
         "--url", "ws://127.0.0.1:9/v1/stream"],
        capture_output=True, text=True, timeout=60,
    )
    assert run.returncode == 1 and "cannot reach" in run.stderr


# -- common mistakes: one clear line on stderr, no traceback ----------------------------


def vox(*args: str) -> subprocess.CompletedProcess[str]:
    """``voxwire say`` with exactly these arguments (no --url added)."""
    return subprocess.run(
        [sys.executable, "-m", "voxwire_client.cli", "say", *args], capture_output=True, text=True, timeout=120,
    )


def one_line(run: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in run.stderr, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("voxwire: "), run.stderr
    return lines[0]


def test_say_explains_a_url_with_no_websocket_endpoint(piper_server, tmp_path):
    url = f"ws://{piper_server.host}:{piper_server.port}/v1/wrong"
    run = vox("hello", "-o", str(tmp_path / "x.wav"), "--url", url)
    assert run.returncode == 1 and not (tmp_path / "x.wav").exists()
    line = one_line(run)
    status = re.search(r"the server answered HTTP (\d{3})", line)
    assert status and url in line, line
    # A server that refuses an unknown WebSocket path with 403 (Starlette's default)
    # rather than 404 still gets the path named as a possible cause.
    if status[1] == "404":
        assert "no WebSocket endpoint at this path; the default is /v1/stream" in line
    elif status[1] == "403":
        assert "no WebSocket endpoint at /v1/wrong; the default is /v1/stream" in line


def test_say_takes_an_http_url_for_the_websocket(piper_server, tmp_path):
    out = tmp_path / "out.wav"
    run = vox("Hello.", "-o", str(out), "--url", f"http://{piper_server.host}:{piper_server.port}/v1/stream")
    assert run.returncode == 0, run.stderr
    assert soundfile.info(str(out)).frames > 0


@pytest.mark.parametrize("url", ["127.0.0.1:9/v1/stream", "localhost:9/v1/stream", "ftp://127.0.0.1:9/v1/stream"])
def test_say_refuses_a_url_that_is_not_a_websocket_url(tmp_path, url):
    run = vox("hi", "-o", str(tmp_path / "x.wav"), "--url", url)
    assert run.returncode == 2
    line = one_line(run)
    assert url in line and "ws://" in line


@pytest.mark.parametrize("where", ["missing directory", "a directory"])
def test_say_checks_the_output_path_before_connecting(tmp_path, where):
    out = tmp_path / "no" / "such" / "x.wav" if where == "missing directory" else tmp_path
    # Nothing listens on port 9: a client that tried to speak first would say "cannot reach".
    run = vox("hi", "-o", str(out), "--url", "ws://127.0.0.1:9/v1/stream")
    assert run.returncode == 2
    line = one_line(run)
    assert str(out) in line and "cannot reach" not in line
