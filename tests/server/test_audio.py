"""Output formats, rechunking and the streaming resampler."""

import numpy as np
import pytest
import soxr

from voxwire.server.audio import ChunkCutter, Rechunker, encode, mulaw_encode
from voxwire_client.formats import mulaw_to_int16, to_float32


def speechlike(seconds: float, rate: int, seed: int = 0) -> np.ndarray:
    """Band-limited noise with a moving pitch: a signal with content at all scales."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    f0 = 120 + 40 * np.sin(2 * np.pi * 0.7 * t)
    voiced = 0.3 * np.sin(2 * np.pi * np.cumsum(f0) / rate) + 0.15 * np.sin(2 * np.pi * 3 * np.cumsum(f0) / rate)
    noise = soxr.resample(rng.standard_normal(t.size).astype(np.float32), rate, 8000)
    noise = soxr.resample(noise, 8000, rate)[: t.size]
    return (voiced + 0.05 * noise).astype(np.float32)


@pytest.mark.parametrize("out_rate", [8000, 16000, 24000, 44100, 48000])
def test_streamed_resampling_equals_whole_resampling(out_rate):
    x = speechlike(3.0, 22050)
    whole = soxr.resample(x, 22050, out_rate, quality="HQ")
    stream = ChunkCutter(22050, out_rate, chunk_ms=200)
    chunks = []
    rng = np.random.default_rng(1)
    i = 0
    while i < x.size:  # pieces of random size, as an engine would yield them
        n = int(rng.integers(1, 9000))
        chunks += stream.push(x[i : i + n])
        i += n
    chunks += stream.finish()
    chunked = np.concatenate(chunks)
    assert abs(chunked.size - whole.size) <= 1
    n = min(chunked.size, whole.size)
    # Tolerance: float32 rounding only; the filter state carries across every seam.
    assert np.max(np.abs(chunked[:n] - whole[:n])) < 1e-5
    # No jump at the chunk seams larger than the signal's own largest step.
    steps = np.abs(np.diff(chunked))
    seams = np.cumsum([c.size for c in chunks[:-1]])
    assert steps[seams - 1].max() <= steps.max()


def test_chunks_have_exact_duration_but_the_last():
    stream = ChunkCutter(22050, 24000, chunk_ms=150)
    chunks = stream.push(speechlike(2.0, 22050)) + stream.finish()
    assert all(c.size == 3600 for c in chunks[:-1])
    assert 0 < chunks[-1].size <= 3600


def test_the_first_chunk_leaves_once_it_holds_150_ms():
    stream = ChunkCutter(24000, 24000, chunk_ms=250)
    assert stream.push(speechlike(0.1, 24000)) == []  # 100 ms: not yet
    (first,) = stream.push(speechlike(0.06, 24000))  # 160 ms: out it goes, short
    assert first.size == 3840
    assert stream.push(speechlike(0.2, 24000)) == []  # then full 250 ms chunks only
    assert [c.size for c in stream.push(speechlike(0.1, 24000))] == [6000]


def test_rechunker_flush_returns_the_remainder():
    r = Rechunker(100)
    assert [c.size for c in r.push(np.ones(250, np.float32))] == [100, 100]
    assert [c.size for c in r.flush()] == [50]
    assert r.flush() == []


def test_mulaw_round_trip_error_is_within_g711_quantisation():
    x = np.linspace(-1, 1, 20001).astype(np.float32)
    y = mulaw_to_int16(mulaw_encode(x).tobytes()).astype(np.float32) / 32767
    # mu-law's step grows with amplitude: at most half the top segment's step (1024/32767),
    # below the level where G.711 clips (32635 + bias).
    inside = np.abs(x) < 0.97
    assert np.max(np.abs(x - y)[inside]) < 0.017
    assert np.max(np.abs(x[np.abs(x) < 0.01] - y[np.abs(x) < 0.01])) < 0.0005


def test_mulaw_matches_known_g711_codes():
    pcm = np.array([0, 1000, -1000, 32767, -32768], np.float32) / 32767
    assert mulaw_encode(pcm).tolist() == [0xFF, 0xCE, 0x4E, 0x80, 0x00]


@pytest.mark.parametrize("fmt,width", [("pcm_s16le", 2), ("pcm_f32le", 4), ("mulaw", 1)])
def test_encode_decode(fmt, width):
    x = speechlike(0.2, 16000)
    data = encode(x, fmt)
    assert len(data) == width * x.size
    # Decoded by the Python client: the server's encoder against the client's decoder.
    assert np.max(np.abs(to_float32(data, fmt) - x)) < (0.02 if fmt == "mulaw" else 1e-4)
