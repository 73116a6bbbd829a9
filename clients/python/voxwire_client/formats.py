"""Decoding the server's output formats: pcm_s16le, pcm_f32le and G.711 (mulaw, alaw) here;
the compressed ones (opus, mp3, aac, flac) through PyAV, when it is installed (the
``decode`` extra). A compressed stream needs no decoding to be saved: its frames,
concatenated, are the file (``extension`` names it)."""

from __future__ import annotations

import io

import numpy as np

PCM_FORMATS = ("pcm_s16le", "pcm_f32le", "mulaw", "alaw")
# format -> the file extension its stream is saved under, as players know it.
COMPRESSED = {"opus": ".opus", "mp3": ".mp3", "aac": ".aac", "flac": ".flac"}


def extension(fmt: str) -> str | None:
    """The file extension a compressed format's stream is saved under; None for PCM."""
    return COMPRESSED.get(fmt)


def format_for_path(path: str) -> str | None:
    """The compressed format a file name asks for by its extension (None: not one)."""
    lower = path.lower()
    for fmt, ext in COMPRESSED.items():
        if lower.endswith(ext):
            return fmt
    return None


def as_file(data: bytes, fmt: str, samples: int) -> bytes:
    """A compressed stream made into the file it is, now that its length is known: FLAC's
    STREAMINFO, written before any audio, says "length unknown" (0), which some readers
    (libsndfile) take badly; here it gets the stream's ``samples``. Others need nothing."""
    # "fLaC", a block header (4 bytes), then STREAMINFO: 10 bytes of block and frame
    # sizes, then 64 bits: rate (20), channels - 1 (3), bits - 1 (5), total samples (36).
    if fmt != "flac" or data[:4] != b"fLaC" or len(data) < 26 or not 0 <= samples < 1 << 36:
        return data
    packed = int.from_bytes(data[18:26], "big")
    packed = (packed & ~((1 << 36) - 1)) | samples
    return data[:18] + packed.to_bytes(8, "big") + data[26:]


def mulaw_to_int16(data: bytes) -> np.ndarray:
    u = ~np.frombuffer(data, np.uint8).astype(np.int32) & 0xFF
    exponent = (u >> 4) & 0x07
    magnitude = (((u & 0x0F) << 3) + 0x84) << exponent
    pcm = magnitude - 0x84
    return np.where(u & 0x80, -pcm, pcm).astype(np.int16)


def _alaw_levels() -> np.ndarray:
    """All 256 A-law codes decoded (G.711): each to the middle of its step, in 16 bits."""
    a = np.arange(256) ^ 0x55  # the even bits, inverted on the line, back
    segment = (a >> 4) & 0x07
    magnitude = ((a & 0x0F) << 4) + 8 + np.where(segment > 0, 0x100, 0)  # segments above 0: the leading 1
    magnitude <<= np.maximum(segment - 1, 0)
    return np.where(a & 0x80, magnitude, -magnitude).astype(np.int16)


_ALAW = _alaw_levels()


def alaw_to_int16(data: bytes) -> np.ndarray:
    return _ALAW[np.frombuffer(data, np.uint8)]


def decode_compressed(data: bytes) -> np.ndarray:
    """A whole compressed stream (or a prefix of one) as mono float32 at its own rate."""
    try:
        import av  # optional: only decoding needs it
    except ImportError:
        raise RuntimeError("decoding opus, mp3, aac or flac needs PyAV: pip install 'voxwire-client[decode]'") from None
    with av.open(io.BytesIO(data)) as container:
        # Mono: planar or packed, the first (only) row is the channel.
        frames = [f.to_ndarray()[0] for f in container.decode(audio=0)]
    if not frames:
        return np.zeros(0, np.float32)
    return decoded_to_float32(np.concatenate(frames))


def decoded_to_float32(pcm: np.ndarray) -> np.ndarray:
    """A decoder's samples (PyAV's int16, int32 or float arrays) as float32 in [-1, 1]."""
    if pcm.dtype == np.int16:  # flac: the server's 16-bit samples, scaled as pcm_s16le is
        return pcm.astype(np.float32) / 32767.0
    if pcm.dtype == np.int32:
        return (pcm / 2.0**31).astype(np.float32)
    return pcm.astype(np.float32)


def to_float32(data: bytes, fmt: str) -> np.ndarray:
    if fmt == "pcm_s16le":
        return np.frombuffer(data, "<i2").astype(np.float32) / 32767.0
    if fmt == "pcm_f32le":
        return np.frombuffer(data, "<f4").astype(np.float32)
    if fmt == "mulaw":
        return mulaw_to_int16(data).astype(np.float32) / 32767.0
    if fmt == "alaw":
        return alaw_to_int16(data).astype(np.float32) / 32767.0
    if fmt in COMPRESSED:
        return decode_compressed(data)
    raise ValueError(f"unknown format {fmt!r}")
