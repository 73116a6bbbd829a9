"""The runnable examples of docs/integrations.md (clients/python/examples), run as a user
runs them, against the real server on loopback: each writes the answer's speech to a WAV
file and prints every word of it, in order, with increasing times."""

from __future__ import annotations

import re
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest

from tests.server.test_stream import assert_speech

EXAMPLES = Path(__file__).resolve().parents[3] / "clients/python/examples"


def answer_of(example: Path) -> str:
    return re.search(r'^ANSWER = "(.*)"$', example.read_text(encoding="utf-8"), re.M).group(1)


@pytest.mark.slow  # runs each example script in a process of its own
@pytest.mark.parametrize(
    "name, extra", [("pipecat_pipeline.py", "pipecat"), ("livekit_stream.py", "livekit.agents")]
)
def test_the_example_speaks_its_answer_with_timed_words(piper_server, tmp_path, name, extra):
    pytest.importorskip(extra, reason="the client's framework extras (make test installs them)")
    example = EXAMPLES / name
    out = tmp_path / "answer.wav"
    run = subprocess.run(
        [sys.executable, str(example), "--url", piper_server.ws, "--sample-rate", "16000", "-o", str(out)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    with wave.open(str(out)) as wav:
        assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (16000, 1, 2)
        audio = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2").astype(np.float32) / 32768
    expected = re.findall(r"[\w']+", answer_of(example))
    assert_speech(audio, 16000, words=len(expected))
    timed = re.findall(r"^\s*(\d+\.\d+) s  (\S+)$", run.stdout, re.M)
    # A word as printed keeps its punctuation ("nine,"), as the transcript does.
    assert [re.findall(r"[\w']+", w) for _, w in timed] == [[w] for w in expected]
    times = [float(t) for t, _ in timed]
    # Pipecat's times are on the pipeline's clock, LiveKit's on the audio's: compare spans.
    assert times == sorted(times) and times[-1] - times[0] < audio.size / 16000
