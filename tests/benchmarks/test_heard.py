"""What the bench's clients keep of an answer (``keep_audio``), for the quality harness:
the audio decoded at the stream's rate, and the joins between the pieces it came in.
Against a real server on loopback around the tone engine, whose words are tones of known
pitch: every kept answer must be those tones, for as long as they were spoken."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from voxwire.benchmarks.loadgen import UtteranceResult
from voxwire.benchmarks.protocols import OpenAISession, Session, V1Session
from tests.fixtures.engines import WORD_SECONDS, word_pitch

WORDS = ["alpha", "bravo", "charlie", "delta"]
TEXT = " ".join(WORDS) + "."


def speak_once(session: Session) -> UtteranceResult:
    async def speak() -> UtteranceResult:
        try:
            return await session.speak(TEXT)
        finally:
            await session.close()

    return asyncio.run(speak())


def strongest(audio: np.ndarray, rate: int, k: int) -> list[float]:
    """The k strongest tones of the whole answer, each bin's neighbours set aside."""
    spectrum = np.abs(np.fft.rfft(audio * np.hanning(audio.size)))
    hz = rate / audio.size
    found = []
    for _ in range(k):
        i = int(np.argmax(spectrum))
        found.append(i * hz)
        spectrum[max(0, i - int(30 / hz)) : i + int(30 / hz) + 1] = 0
    return sorted(found)


def check(heard, extra_s: float = 0.0) -> None:
    seconds = heard.audio.size / heard.rate
    assert len(WORDS) * WORD_SECONDS - 0.01 <= seconds <= len(WORDS) * WORD_SECONDS + 0.01 + extra_s, seconds
    assert 0.4 < np.abs(heard.audio).max() < 0.7  # the engine's tones are 0.5 high: scaled to [-1, 1]
    expected = sorted(word_pitch(w) for w in WORDS)
    assert np.allclose(strongest(heard.audio, heard.rate, len(WORDS)), expected, atol=12), expected


@pytest.mark.parametrize(
    "settings", [{}, {"format": "pcm_f32le", "sample_rate": 48000}, {"format": "mulaw", "sample_rate": 8000},
                 {"format": "flac"}, {"format": "opus"}, {"format": "mp3"}],
    ids=lambda s: s.get("format", "default"),
)
def test_protocol_v1_keeps_the_frames_and_their_joins(tone_server, settings):
    r = speak_once(V1Session(tone_server.ws, {**settings, "chunk_ms": 150}, keep_audio=True))
    assert r.error is None and r.heard is not None
    fmt = settings.get("format", "pcm_s16le")
    assert r.heard.rate == {"opus": 48000}.get(fmt, settings.get("sample_rate", 16000))
    if fmt == "mp3":
        # Its decoder's priming and padding: more samples than the frames said, so the
        # joins cannot be placed and none are given.
        check(r.heard, extra_s=0.12)
        assert r.heard.joins == []
    else:
        check(r.heard)
        # Frames of 150 ms (the first may be shorter: a resampler's delay follows later):
        # the joins are where each frame's samples end.
        step, joins = r.heard.rate * 150 // 1000, r.heard.joins
        assert joins and joins[0] <= step and all(b - a == step for a, b in zip(joins, joins[1:])), joins


@pytest.mark.parametrize("fmt", ["pcm", "wav", "mp3"])
def test_the_openai_route_keeps_the_body(tone_server, fmt):
    r = speak_once(OpenAISession(f"{tone_server.http}/v1/audio/speech", fmt, keep_audio=True))
    assert r.error is None and r.heard is not None
    assert r.heard.rate == 24000
    check(r.heard, extra_s=0.12 if fmt == "mp3" else 0.0)
    assert r.heard.joins == []  # an HTTP body's reads are the network's, not the server's pieces
