"""From an engine's float32 audio to the frames a client asked for.

One stateful stream per utterance: resample the engine's pieces (soxr, keeping its
filter state across them, so streamed output equals whole-signal output), cut them into
chunks of the stream's duration, and encode each chunk for its frame. This module is the
single place where output formats are defined: the PCM ones here, the compressed ones
(Opus, MP3, AAC, FLAC) in server/codecs.py, which this module opens through
``open_encoder``.
"""

from __future__ import annotations

from typing import Literal, get_args

import numpy as np
import soxr

from voxwire.engine.errors import CodedError, ErrorCode, quoted
from voxwire.server.codecs import CODECS, CompressedEncoder

# G.711 in both its laws: mu-law is North America's and Japan's telephone network's, A-law
# Europe's and most of the rest; a SIP trunk or a telephony bridge there takes A-law only.
Format = Literal["pcm_s16le", "pcm_f32le", "mulaw", "alaw", "opus", "mp3", "aac", "flac"]
FORMATS: tuple[str, ...] = get_args(Format)
PCM_FORMATS: tuple[str, ...] = ("pcm_s16le", "pcm_f32le", "mulaw", "alaw")
assert set(FORMATS) == set(PCM_FORMATS) | set(CODECS)
MIN_SAMPLE_RATE, MAX_SAMPLE_RATE = 8000, 48000
MIN_CHUNK_MS, MAX_CHUNK_MS = 150, 250

_MULAW_BIAS = 0x84
_MULAW_CLIP = 32635
# A-law's segments, by the largest 13-bit magnitude each holds (G.711).
_ALAW_SEGMENT_ENDS = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF])


def to_int16(x: np.ndarray) -> np.ndarray:
    return np.round(np.clip(x, -1.0, 1.0) * 32767.0).astype(np.int16)


def _magnitude(pcm: np.ndarray) -> np.ndarray:
    """A sample's magnitude, a negative one's in ones' complement (-1 is 0), as ITU-T's
    reference G.711 (the G.191 tools) takes it, so that the codes are bit-exact with it."""
    return np.where(pcm < 0, ~pcm, pcm)


def mulaw_encode(x: np.ndarray) -> np.ndarray:
    """G.711 mu-law, from float samples in [-1, 1] to bytes."""
    pcm = to_int16(x).astype(np.int32)
    sign = (pcm < 0).astype(np.int32) << 7
    magnitude = np.minimum(_magnitude(pcm), _MULAW_CLIP) + _MULAW_BIAS
    exponent = np.floor(np.log2(magnitude)).astype(np.int32) - 7
    mantissa = (magnitude >> (exponent + 3)) & 0x0F
    return (~(sign | (exponent << 4) | mantissa) & 0xFF).astype(np.uint8)


def alaw_encode(x: np.ndarray) -> np.ndarray:
    """G.711 A-law, from float samples in [-1, 1] to bytes."""
    pcm = to_int16(x).astype(np.int32)
    sign = (pcm >= 0).astype(np.int32) << 7
    magnitude = _magnitude(pcm) >> 3  # 13-bit, 0..4095
    segment = np.searchsorted(_ALAW_SEGMENT_ENDS, magnitude).astype(np.int32)
    # Segments 0 and 1 share one step (2); each one above doubles it.
    mantissa = (magnitude >> np.maximum(segment, 1)) & 0x0F
    # The even bits inverted: a line of silence (0xD5) keeps changing bits for the clock.
    return ((sign | (segment << 4) | mantissa) ^ 0x55).astype(np.uint8)


def encode(x: np.ndarray, fmt: str) -> bytes:
    if fmt == "pcm_s16le":
        return to_int16(x).astype("<i2").tobytes()
    if fmt == "pcm_f32le":
        return np.clip(x, -1.0, 1.0).astype("<f4").tobytes()
    if fmt == "mulaw":
        return mulaw_encode(x).tobytes()
    if fmt == "alaw":
        return alaw_encode(x).tobytes()
    raise ValueError(f"unknown format {fmt!r}")


class FormatError(CodedError, ValueError):
    """A format and rate that cannot go together."""


def stream_rate(fmt: str, rate: int) -> int:
    """The rate a stream of ``fmt`` asked for at ``rate`` is sent at: the same, but for a
    codec with one rate of its own (Opus: 48 kHz). Raises ``FormatError``."""
    if fmt in PCM_FORMATS:
        return rate
    codec = CODECS.get(fmt)
    if codec is None:
        raise FormatError(ErrorCode.INVALID_FORMAT, f"unknown format {quoted(fmt)}; one of {', '.join(FORMATS)}")
    if codec.fixed_rate is not None:
        return codec.fixed_rate
    if codec.rates is not None and rate not in codec.rates:
        rates = ", ".join(map(str, codec.rates))
        raise FormatError(ErrorCode.UNSUPPORTED_SAMPLE_RATE, f"{fmt} cannot be encoded at {rate} Hz; it takes {rates}")
    return rate


def describe(fmt: str) -> dict[str, str]:
    """The container and codec of a format, as ``started`` tells a client."""
    codec = CODECS.get(fmt)
    if codec is None:
        return {"container": "raw", "codec": fmt}
    return {"container": codec.container, "codec": codec.codec}


def content_type(fmt: str) -> str:
    codec = CODECS.get(fmt)
    return codec.content_type if codec is not None else "application/octet-stream"


class Encoder:
    """One utterance's encoder: chunks in, bytes out; ``finish`` ends the stream."""

    def push(self, x: np.ndarray) -> bytes:
        raise NotImplementedError

    def finish(self) -> bytes:
        return b""

    def close(self) -> None:
        pass


class PcmEncoder(Encoder):
    def __init__(self, fmt: str) -> None:
        self.fmt = fmt

    def push(self, x: np.ndarray) -> bytes:
        return encode(x, self.fmt)


def open_encoder(fmt: str, rate: int) -> Encoder | CompressedEncoder:
    """The encoder for a stream of ``fmt`` at ``rate`` (as ``stream_rate`` gives it)."""
    if fmt in PCM_FORMATS:
        return PcmEncoder(fmt)
    return CompressedEncoder(fmt, rate)


class Rechunker:
    """Cuts audio of arbitrary lengths into chunks of exactly ``size`` samples, but for
    the first, which leaves as soon as ``first_min`` samples are there (up to ``size``):
    waiting for a full chunk would hold back the first audio for nothing."""

    def __init__(self, size: int, first_min: int | None = None) -> None:
        self.size = size
        self.first_min = size if first_min is None else min(first_min, size)
        self._parts: list[np.ndarray] = []
        self._buffered = 0
        self._started = False

    def push(self, x: np.ndarray) -> list[np.ndarray]:
        if x.size:
            self._parts.append(x)
            self._buffered += x.size
        chunks: list[np.ndarray] = []
        if not self._started:
            if self._buffered < self.first_min:
                return []
            buf = np.concatenate(self._parts)
            first = min(buf.size, self.size)
            chunks.append(buf[:first])
            self._parts, self._buffered, self._started = [buf[first:]], buf.size - first, True
        if self._buffered < self.size:
            return chunks
        buf = np.concatenate(self._parts)
        n = (buf.size // self.size) * self.size
        chunks += [buf[i : i + self.size] for i in range(0, n, self.size)]
        rest = buf[n:]
        self._parts = [rest] if rest.size else []
        self._buffered = rest.size
        return chunks

    @property
    def started(self) -> bool:
        """The first chunk has left."""
        return self._started

    def flush(self) -> list[np.ndarray]:
        """Whatever is buffered, as one short chunk."""
        if not self._buffered:
            return []
        chunk = np.concatenate(self._parts)
        self._parts, self._buffered, self._started = [], 0, True
        return [chunk]


class ChunkCutter:
    """Engine pieces in, chunks out: resampled to the client's rate and cut to the
    stream's chunk duration."""

    def __init__(self, in_rate: int, out_rate: int, chunk_ms: int) -> None:
        self.in_rate = in_rate
        self.out_rate = out_rate
        self._resampler = (
            soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32", quality="HQ")
            if in_rate != out_rate
            else None
        )
        self._rechunker = Rechunker(out_rate * chunk_ms // 1000, out_rate * MIN_CHUNK_MS // 1000)
        self._first_in = in_rate * MIN_CHUNK_MS // 1000
        self._pushed = 0

    def push(self, x: np.ndarray) -> list[np.ndarray]:
        self._pushed += x.size
        if self._resampler is not None:
            x = self._resampler.resample_chunk(x)
        chunks = self._rechunker.push(x)
        if not chunks and not self._rechunker.started and self._pushed >= self._first_in:
            # The engine has made a first chunk's worth; what is missing at this rate is
            # the resampler's delay, which follows with the next audio. Waiting for it
            # would hold the first audio back by a whole engine step.
            chunks = self._rechunker.flush()
        return chunks

    def flush(self) -> list[np.ndarray]:
        """Everything resampled so far, so a client's ``flush`` hears its text now.

        The resampler keeps its filter delay (a few milliseconds), which follows with
        the next audio; ending the resampler here would put a seam in the stream.
        """
        return self._rechunker.flush()

    def finish(self) -> list[np.ndarray]:
        if self._resampler is not None:
            tail = self._resampler.resample_chunk(np.zeros(0, np.float32), last=True)
            chunks = self._rechunker.push(tail)
        else:
            chunks = []
        return chunks + self._rechunker.flush()
