"""Output formats, rechunking and the streaming resampler."""

import numpy as np
import pytest
import soxr

from tests.fixtures import g711
from voxwire.server import audio
from voxwire.server.audio import ChunkCutter, Rechunker, alaw_encode, encode, mulaw_encode, to_int16
from voxwire_client.formats import alaw_to_int16, mulaw_to_int16, to_float32


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


def test_mulaw_matches_known_g711_codes_where_the_sign_matters():
    # G.711's reference takes a negative sample's magnitude in ones' complement (-1 is 0):
    # 31612 is the first sample of the top code, and -31613 the first negative one.
    pcm = np.array([-1, 31611, 31612, -31612, -31613], np.float32) / 32767
    assert mulaw_encode(pcm).tolist() == [0x7F, 0x81, 0x80, 0x01, 0x00]


def test_alaw_round_trip_error_is_within_g711_quantisation():
    x = np.linspace(-1, 1, 20001).astype(np.float32)
    y = alaw_to_int16(alaw_encode(x).tobytes()).astype(np.float32) / 32767
    # A-law's step grows with amplitude: at most half the top segment's step (1024/32767),
    # and half the first two segments' (16/32767) near silence, plus to_int16's rounding.
    assert np.max(np.abs(x - y)) < 513 / 32767
    small = np.abs(x) < 0.01
    assert np.max(np.abs(x - y)[small]) < 9 / 32767


# (sample, code), from G.711's definition: the 13-bit magnitude (a negative sample's in
# ones' complement), its segment by the segment ends 0x1F, 0x3F, ... 0xFFF (the first
# two of one step), four bits within it, the sign bit 1 for positive, then XOR 0x55.
ALAW_CODES = [
    (0, 0xD5), (-1, 0x55),  # silence: the smallest levels, +8 and -8
    (255, 0xDA), (256, 0xC5), (-256, 0x5A), (-257, 0x45),  # the end of segment 0, the start of 1
    (16383, 0xBA), (16384, 0xA5), (-16384, 0x3A), (-16385, 0x25),  # segment 6 to 7 (FFmpeg: 0xBA for 16384)
    (32767, 0xAA), (-32767, 0x2A),  # the largest codes
]


def test_alaw_matches_known_g711_codes():
    samples, codes = zip(*ALAW_CODES)
    assert alaw_encode(np.array(samples, np.float32) / 32767).tolist() == list(codes)
    assert [g711.alaw_compress(x) for x in samples] == list(codes)  # and so does the reference
    assert alaw_encode(np.array([-1.5, -1.0, 1.0, 1.5], np.float32)).tolist() == [0x2A, 0x2A, 0xAA, 0xAA]


ENCODERS = {"alaw": alaw_encode, "mulaw": mulaw_encode}


def test_every_16_bit_sample_is_reachable_from_a_float():
    """The sweep below, as floats, is every sample the encoders are given: v / 32767 comes
    back as v, and -32768 is never made (the floats are clipped to [-1, 1])."""
    x = g711.SAMPLES.astype(np.float32) / 32767
    assert np.array_equal(to_int16(x), g711.SAMPLES)
    assert g711.SAMPLES.size == 65535 and to_int16(np.array([-32768 / 32767], np.float32))[0] == -32767


@pytest.mark.parametrize("law", g711.LAWS)
def test_g711_is_bit_exact_with_the_itu_reference_for_every_sample(law):
    codes = ENCODERS[law](g711.SAMPLES.astype(np.float32) / 32767)
    reference = g711.reference_codes(law)
    assert codes.dtype == np.uint8
    np.testing.assert_array_equal(codes, reference)


@pytest.mark.parametrize("law", g711.LAWS)
def test_g711_agrees_with_ffmpeg_but_where_ffmpeg_takes_the_nearest_level(law):
    """FFmpeg's encoder is not G.711's (tests/fixtures/g711.py): byte for byte over every
    sample, the two agree but on samples by a decision value, where FFmpeg's table takes
    the nearer of the two levels around it (a few values off for negative samples); the
    reference above is what decides there."""
    codes = ENCODERS[law](g711.SAMPLES.astype(np.float32) / 32767)
    ffmpeg = g711.ffmpeg_encode(law, g711.SAMPLES)
    assert ffmpeg.size == codes.size
    assert np.mean(codes == ffmpeg) > 0.98
    assert g711.unexplained(law, g711.SAMPLES, codes, ffmpeg).size == 0


@pytest.mark.parametrize("law", g711.LAWS)
def test_a_wrong_encoder_fails_both_comparisons(law, monkeypatch):
    """Negative controls: the even bits (A-law) or all bits (mu-law) left uninverted fail
    against FFmpeg on every sample; a negative sample's plain magnitude, one value off
    the reference's, fails against the reference on the samples it moves."""
    x = g711.SAMPLES.astype(np.float32) / 32767
    uninverted = ENCODERS[law](x) ^ (0x55 if law == "alaw" else 0xFF)
    ffmpeg = g711.ffmpeg_encode(law, g711.SAMPLES)
    assert g711.unexplained(law, g711.SAMPLES, uninverted, ffmpeg).size == g711.SAMPLES.size
    monkeypatch.setattr(audio, "_magnitude", np.abs)
    moved = g711.SAMPLES[ENCODERS[law](x) != g711.reference_codes(law)]
    assert moved.size > 100 and (moved < 0).all()


@pytest.mark.parametrize("fmt,width", [("pcm_s16le", 2), ("pcm_f32le", 4), ("mulaw", 1), ("alaw", 1)])
def test_encode_decode(fmt, width):
    x = speechlike(0.2, 16000)
    data = encode(x, fmt)
    assert len(data) == width * x.size
    # Decoded by the Python client: the server's encoder against the client's decoder.
    assert np.max(np.abs(to_float32(data, fmt) - x)) < (0.02 if fmt in ("mulaw", "alaw") else 1e-4)
