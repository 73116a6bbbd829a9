"""``voxwire say -o out.opus|out.mp3|out.flac``: the extension picks the format, and the
file is one that standard readers open: libsndfile (soundfile) and FFmpeg (PyAV)."""

from __future__ import annotations

import av
import numpy as np
import pytest
import soundfile

from tests.clients.python.test_cli import say
from tests.server.test_stream import SENTENCE, assert_speech


@pytest.mark.parametrize("ext,codec,rate", [("opus", "opus", 48000), ("mp3", "mp3", 24000), ("flac", "flac", 24000)])
def test_say_picks_the_format_from_the_extension(piper_server, tmp_path, ext, codec, rate):
    out = tmp_path / f"out.{ext}"
    run = say(piper_server, SENTENCE, "-o", str(out), "--sample-rate", "24000", "--voice", "joe")
    assert run.returncode == 0, run.stderr
    assert f"{ext} at {rate} Hz" in run.stdout
    with av.open(str(out)) as container:
        stream = container.streams.audio[0]
        assert stream.codec_context.name.startswith(codec) and stream.rate == rate
        decoded = np.concatenate([f.to_ndarray()[0] for f in container.decode(stream)]).astype(np.float32)
    if decoded.dtype != np.float32 or np.abs(decoded).max() > 2:
        decoded = decoded / 32768.0
    assert_speech(decoded, rate, words=9)
    audio, sf_rate = soundfile.read(str(out), dtype="float32")  # a second, independent reader
    assert sf_rate == rate and abs(audio.size - decoded.size) <= 2304


@pytest.mark.parametrize(
    "args,message",
    [
        (["-o", "x.opus", "--format", "mp3"], "drop --format"),
        (["-o", "x.wav", "--format", "opus"], "-o out.opus"),
    ],
)
def test_a_format_that_contradicts_the_file_name_is_refused(piper_server, tmp_path, args, message):
    args = [a if not a.startswith("x.") else str(tmp_path / a) for a in args]
    run = say(piper_server, "hello", *args)
    assert run.returncode == 2 and message in run.stderr and not list(tmp_path.iterdir())
