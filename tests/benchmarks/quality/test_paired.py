"""benchmarks/quality/paired.py carries one audio through the server's own output path
in every format; what comes back must be that audio, as each format keeps it."""

from __future__ import annotations

import numpy as np
import pytest

from voxwire.benchmarks.quality.paired import SETTINGS, through

RATE = 22050


@pytest.fixture(scope="module")
def audio() -> np.ndarray:
    t = np.arange(int(1.3 * RATE)) / RATE
    return (0.4 * np.sin(2 * np.pi * 440 * t) * np.minimum(1, t * 20)).astype(np.float32)


def test_lossless_formats_give_back_the_samples(audio):
    pcm = through(audio, RATE, {})
    flac = through(audio, RATE, {"format": "flac"})
    assert pcm.rate == flac.rate == RATE and pcm.audio.size == audio.size
    assert np.max(np.abs(pcm.audio - audio)) < 1 / 32767 + 1e-6  # 16-bit rounding only
    assert np.array_equal(flac.audio, pcm.audio)


@pytest.mark.parametrize("name", list(SETTINGS))
def test_every_format_gives_back_the_tone_for_its_length(audio, name):
    heard = through(audio, RATE, SETTINGS[name])
    seconds = heard.audio.size / heard.rate
    # MP3's and AAC's priming and padding add a little; nothing is lost.
    assert audio.size / RATE - 0.005 <= seconds <= audio.size / RATE + 0.15, (name, seconds)
    spectrum = np.abs(np.fft.rfft(heard.audio))
    assert abs(np.argmax(spectrum) * heard.rate / heard.audio.size - 440) < 3, name
    assert 0.3 < np.abs(heard.audio).max() < 0.5, name
