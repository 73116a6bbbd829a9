"""``voxwire say`` as a user runs it: a subprocess, against a real server, into a WAV
file read back by an independent reader (libsndfile)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import soundfile

from tests.server.test_stream import SENTENCE, assert_speech

SUBTYPE = {"pcm_s16le": "PCM_16", "pcm_f32le": "FLOAT", "mulaw": "ULAW"}


def say(server, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "server", "say", *args, "--url", server.ws],
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
