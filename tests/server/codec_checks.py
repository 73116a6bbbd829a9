"""Checks shared by the compressed-format tests: decode a stream with PyAV, and line it
up against the PCM of the same speech."""

from __future__ import annotations

import io

import av
import numpy as np

# A codec frame in samples at the stream's rate (server/codecs.py; mp3 at 24 kHz and
# below is MPEG-2, whose frame is 576).
CODEC_FRAME = {"opus": 1920, "aac": 1024, "flac": 1152}  # opus: 40 ms at 48 kHz
# Samples a decoder gives before the speech (the encoder's priming; PyAV trims Opus's
# pre-skip itself), and at most how many of the samples a stream has been given its
# encoder may still hold (measured: a codec frame not yet full, the codec's lookahead,
# LAME's and FFmpeg AAC's analysis window, and the one page FFmpeg's Ogg muxer keeps).
PRIMING = {"opus": 0, "mp3": 1105, "aac": 1024, "flac": 0}
HELD_BACK = {"opus": 2 * 1920 + 312, "mp3": 6 * 576, "aac": 4 * 1024, "flac": 1152}
# How far past one codec frame the decoded end may run. LAME's last frame reaches past
# it: over 340 stream lengths at 24 and 48 kHz (server/codecs.py's encoder, random
# noise), the samples after priming and speech ran from 48 to a frame + 46 (one length
# in 12 over a frame); AAC stayed within its frame, FLAC and Opus ended exactly.
END_SLACK = {"mp3": 48}
# The least correlation with the PCM of the same speech, once aligned (measured on Piper's
# speech: opus at 24 kbit/s 0.98, mp3 and aac at 64 kbit/s 0.998; flac is lossless, and
# its tests also ask for the very samples of pcm_s16le).
MIN_CORRELATION = {"opus": 0.9, "mp3": 0.98, "aac": 0.98, "flac": 0.9999}


def codec_frame(fmt: str, rate: int) -> int:
    if fmt == "mp3":
        return 1152 if rate >= 32000 else 576
    return CODEC_FRAME[fmt]


def decode(data: bytes) -> tuple[np.ndarray, int, str, str]:
    """Samples (mono float32), rate, container and codec of a whole stream. PyAV raises
    on a stream it cannot read, so decoding at all is a check."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        frames = [f.to_ndarray()[0] for f in container.decode(stream)]
        rate, codec, fmt = stream.rate, stream.codec_context.name, container.format.name
    pcm = np.concatenate(frames) if frames else np.zeros(0, np.float32)
    if pcm.dtype == np.int16:
        pcm = pcm.astype(np.float32) / 32767.0
    return pcm.astype(np.float32), rate, fmt, codec


def align(reference: np.ndarray, decoded: np.ndarray, max_lag: int) -> tuple[int, float]:
    """The delay (0..max_lag samples) at which ``decoded`` best matches ``reference``, and
    the correlation there: a codec's priming samples come first, then the speech."""
    n = reference.size + decoded.size
    size = 1 << (n - 1).bit_length()
    xcorr = np.fft.irfft(np.fft.rfft(decoded, size) * np.conj(np.fft.rfft(reference, size)), size)
    lag = int(np.argmax(xcorr[: max_lag + 1]))
    part = decoded[lag : lag + reference.size]
    ref = reference[: part.size]
    corr = float(np.dot(part, ref) / (np.linalg.norm(part) * np.linalg.norm(ref) + 1e-12))
    return lag, corr


def assert_matches_pcm(data: bytes, pcm: np.ndarray, fmt: str, rate: int) -> np.ndarray:
    """``data`` decodes to ``pcm``'s speech: the same rate, the same duration within one
    codec frame (and ``END_SLACK``) once the codec's priming is taken off, and correlated
    at least ``MIN_CORRELATION``. Returns the decoded samples."""
    decoded, decoded_rate, _, _ = decode(data)
    assert decoded_rate == rate
    frame = codec_frame(fmt, rate)
    lag, corr = align(pcm, decoded, max_lag=3 * frame)
    assert -frame <= decoded.size - lag - pcm.size <= frame + END_SLACK.get(fmt, 0), (fmt, decoded.size, lag, pcm.size)
    assert corr >= MIN_CORRELATION[fmt], (fmt, corr)
    return decoded
