"""``voxwire say`` as a user runs it: a subprocess, against a real server, into a WAV
file read back by an independent reader (libsndfile)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest
import soundfile

from voxwire.engine.registry import EngineOptions
from voxwire.server.config import AuthConfig, ServerConfig
from tests.conftest import run_server
from tests.fixtures.engines import RATE as TONE_RATE
from tests.fixtures.engines import dominant_pitches, speaker_pitch
from tests.server.test_stream import SENTENCE, assert_speech
from voxwire_client import synthesize
from voxwire_client.client import Closed

SUBTYPE = {"pcm_s16le": "PCM_16", "pcm_f32le": "FLOAT", "mulaw": "ULAW", "alaw": "ALAW"}


def say(server, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "voxwire", "say", *args, "--url", server.ws],
        capture_output=True, text=True, timeout=120,
    )


@pytest.mark.parametrize("fmt,rate", [("pcm_s16le", 24000), ("pcm_f32le", 48000), ("mulaw", 8000), ("alaw", 8000)])
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


# -- no text, and text with nothing to speak ---------------------------------------------


def test_say_refuses_empty_text_and_writes_no_file_for_text_with_nothing_to_speak(piper_server, tmp_path):
    out = tmp_path / "x.wav"
    # No text, as an argument or on standard input: refused before connecting (nothing
    # listens on port 9, so a client that tried would say "cannot reach").
    nowhere = "ws://127.0.0.1:9/v1/stream"
    for text, stdin in (("", None), ("  \n", None), ("-", "")):
        run = subprocess.run(
            [sys.executable, "-m", "voxwire_client.cli", "say", text, "-o", str(out), "--url", nowhere],
            capture_output=True, text=True, timeout=60, input=stdin,
        )
        assert run.returncode == 2, (text, run.stderr)
        line = one_line(run)
        assert "no text to speak" in line and "cannot reach" not in line
    # Text the server speaks no audio for: a failure, and no empty WAV passing for a result.
    run = say(piper_server, "...", "-o", str(out))
    assert run.returncode == 1, run.stdout
    assert "no audio" in one_line(run) and not out.exists()


# -- API keys --------------------------------------------------------------------------

KEY = "say-key-0123456789"
WRONG = "not-the-key-9876543"


@pytest.fixture(scope="module")
def keyed_server():
    """Piper behind a server started with an API key."""
    config = ServerConfig(engine=EngineOptions(name="piper"), cache_mb=0, auth=AuthConfig(api_keys=(KEY,)))
    with run_server(config) as s:
        yield s


def say_keyed(server, env_key: str | None, *args: str, query: str = "") -> subprocess.CompletedProcess[str]:
    """``voxwire say`` with ``VOXWIRE_API_KEY`` set to ``env_key`` (None: unset)."""
    env = {k: v for k, v in os.environ.items() if k != "VOXWIRE_API_KEY"}
    if env_key is not None:
        env["VOXWIRE_API_KEY"] = env_key
    return subprocess.run(
        [sys.executable, "-m", "voxwire", "say", *args, "--url", server.ws + query],
        capture_output=True, text=True, timeout=120, env=env,
    )


def test_say_sends_an_api_key_from_the_flag_or_the_environment(keyed_server, tmp_path):
    text = "Hello there, friend."
    spoken = {
        "flag": say_keyed(keyed_server, None, text, "-o", str(tmp_path / "flag.wav"), "--api-key", KEY),
        "env": say_keyed(keyed_server, KEY, text, "-o", str(tmp_path / "env.wav")),
        # The flag wins over the environment.
        "flag over env": say_keyed(keyed_server, WRONG, text, "-o", str(tmp_path / "both.wav"), "--api-key", KEY),
    }
    refused = {
        "wrong": say_keyed(keyed_server, None, text, "-o", str(tmp_path / "wrong.wav"), "--api-key", WRONG),
        "wrong env": say_keyed(keyed_server, WRONG, text, "-o", str(tmp_path / "wrong-env.wav")),
        "none": say_keyed(keyed_server, None, text, "-o", str(tmp_path / "none.wav")),
        # The old way, still taken, but the URL it is in is printed with the key masked.
        "wrong token": say_keyed(keyed_server, None, text, "-o", str(tmp_path / "token.wav"), query=f"?token={WRONG}"),
    }
    for how, run in spoken.items():
        assert run.returncode == 0, (how, run.stderr)
    for name in ("flag.wav", "env.wav", "both.wav"):
        audio, rate = soundfile.read(str(tmp_path / name), dtype="float32")
        assert_speech(np.asarray(audio), rate, words=3)
    for how, run in refused.items():
        assert run.returncode == 1, (how, run.stdout)
        line = one_line(run)
        # Reached, and refused by policy: not "cannot reach"; the server's reason says how
        # to send a key, and the line how to give voxwire one.
        assert "the server closed the connection" in line and "1008" in line and "refused" in line, line
        assert "cannot reach" not in line and "Authorization: Bearer KEY" in line, line
        assert "--api-key KEY" in line and "VOXWIRE_API_KEY" in line, line
    assert all("was refused" in one_line(refused[how]) for how in ("wrong", "wrong env", "wrong token"))
    assert "was refused" not in one_line(refused["none"])
    assert "?token=***" in one_line(refused["wrong token"])
    assert not any((tmp_path / f).exists() for f in ("wrong.wav", "wrong-env.wav", "none.wav", "token.wav"))
    for run in (*spoken.values(), *refused.values()):
        assert KEY not in run.stderr + run.stdout and WRONG not in run.stderr + run.stdout
    # The library: synthesize(api_key=...) and Client.connect(api_key=...) beneath it.
    result = synthesize(text, keyed_server.ws, api_key=KEY)
    assert_speech(result.audio, result.sample_rate, words=3)
    with pytest.raises(Closed) as e:
        synthesize(text, keyed_server.ws, api_key=WRONG)
    assert e.value.refused and "Authorization: Bearer KEY" in e.value.reason


def test_say_speaks_the_speaker_asked_for(speakers_server, tmp_path):
    out = tmp_path / "bob.wav"
    run = say(speakers_server, "mike november.", "-o", str(out), "--voice", "chorus", "--speaker", "bob",
              "--sample-rate", str(TONE_RATE))
    assert run.returncode == 0, run.stderr
    audio, _ = soundfile.read(str(out), dtype="float32")
    assert dominant_pitches(np.asarray(audio)) == pytest.approx(
        [speaker_pitch(w, 1) for w in ("mike", "november")], abs=15
    )
    refused = say(speakers_server, "mike.", "-o", str(tmp_path / "x.wav"), "--voice", "chorus", "--speaker", "dave")
    assert refused.returncode == 1 and "unknown_speaker" in refused.stderr


def test_say_sends_a_lexicon_file_and_names_a_bad_entry(piper_server, tmp_path):
    names = tmp_path / "names.txt"
    names.write_text("# ours\n\nPostgres = post gress, the database of databases\n", encoding="utf-8")
    plain, said = tmp_path / "plain.wav", tmp_path / "said.wav"
    assert say(piper_server, "I use Postgres daily.", "-o", str(plain)).returncode == 0
    run = say(piper_server, "I use Postgres daily.", "-o", str(said), "--lexicon", str(names), "--timestamps")
    assert run.returncode == 0, run.stderr
    assert re.findall(r"\bPostgres\b", run.stdout) and "database" not in run.stdout  # timed as written
    heard, rate = soundfile.read(str(said), dtype="float32")
    assert heard.size > soundfile.info(str(plain)).frames + 1.2 * rate  # the respelling's four words more
    assert_speech(np.asarray(heard), rate, words=8)
    names.write_text("Postgres = a/b\n", encoding="utf-8")
    bad = say(piper_server, "I use Postgres daily.", "-o", str(tmp_path / "x.wav"), "--lexicon", str(names))
    assert bad.returncode == 1 and "invalid_lexicon" in bad.stderr and "'Postgres'" in bad.stderr, bad.stderr
    names.write_text("Postgres post gress\n", encoding="utf-8")
    unsplit = vox("hi", "-o", str(tmp_path / "x.wav"), "--lexicon", str(names))
    assert unsplit.returncode == 2 and f"--lexicon {names}:1: write KEY = VALUE" in one_line(unsplit)
    missing = vox("hi", "-o", str(tmp_path / "x.wav"), "--lexicon", str(tmp_path / "none.txt"))
    assert missing.returncode == 2 and "cannot be read" in one_line(missing)
    assert not (tmp_path / "x.wav").exists()


def test_say_speaks_an_ssml_document_and_reports_one_it_cannot_read(piper_server, tmp_path):
    out = tmp_path / "pause.wav"
    run = say(piper_server, 'Hello. <break time="2s"/> Goodbye.', "-o", str(out), "--ssml")
    assert run.returncode == 0, run.stderr
    audio, rate = soundfile.read(str(out), dtype="float32")
    zero = np.flatnonzero(np.diff(np.concatenate([[0], (np.asarray(audio) == 0).astype(np.int8), [0]])))
    assert max(np.diff(zero)[::2]) >= 2 * rate  # the break, as exact silence
    bad = say(piper_server, "<speak>Fish & chips</speak>", "-o", str(tmp_path / "x.wav"), "--ssml")
    assert bad.returncode == 1 and "invalid_ssml" in bad.stderr and "line 1, column 14" in bad.stderr
