"""Compressed output (Opus, MP3, AAC, FLAC) as a stream, through PyAV (FFmpeg's libraries).

One ``CompressedEncoder`` per utterance keeps the codec's and the muxer's state across
chunks: each chunk of PCM goes in, and out come the bytes the codec let go of at once
(whole Ogg pages, MP3 frames, ADTS frames or FLAC frames, the stream's header in front
of the first). What is held back is less than one codec frame, the part that does not
fill a frame yet; ``finish`` drains it. The chunks' bytes, concatenated, are one valid
stream, and so is any prefix of them: a cancelled utterance still decodes.

server/audio.py is the entry point: it names the formats and opens these encoders.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

import av
import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class Codec:
    """How one compressed format is made, and how it is described to clients."""

    container: str
    """FFmpeg's muxer, and what ``started`` calls the container."""
    codec: str
    """What ``started`` calls the codec."""
    encoder: str
    """FFmpeg's encoder."""
    content_type: str
    rates: tuple[int, ...] | None
    """The sample rates the codec takes; None: any."""
    fixed_rate: int | None = None
    """The one rate this format is always encoded at (Opus: 48 kHz, what its decoders give)."""
    bit_rate: int | None = None
    options: Mapping[str, str] = field(default_factory=dict)
    """The encoder's options."""
    muxer_options: Mapping[str, str] = field(default_factory=dict)


_MP3_AAC_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)

CODECS: Mapping[str, Codec] = MappingProxyType({
    # 24 kbit/s carries wideband speech well. "audio" over "voip": measured on Piper's
    # speech, the same size and a waveform nearer the PCM (correlation 0.98 against 0.94).
    # One Ogg page per packet, so that no page waits for the next chunk (FFmpeg's muxer
    # closes pages by duration, and PyAV reaches no flush). A page's header costs ~28
    # bytes; 40 ms packets keep that to ~6 kbit/s (20 ms ones would double it) while
    # holding back at most 40 ms of audio until the next chunk.
    "opus": Codec(
        "ogg", "opus", "libopus", "audio/ogg; codecs=opus", None, fixed_rate=48000, bit_rate=24000,
        options={"application": "audio", "frame_duration": "40"}, muxer_options={"page_duration": "40000"},
    ),
    # No Xing/LAME header: it is rewritten at the end, which a stream cannot do, and it
    # would claim a length of zero. No ID3 tag: it carries nothing here.
    "mp3": Codec(
        "mp3", "mp3", "libmp3lame", "audio/mpeg", _MP3_AAC_RATES, bit_rate=64000,
        muxer_options={"write_xing": "0", "id3v2_version": "0"},
    ),
    "aac": Codec("adts", "aac", "aac", "audio/aac", _MP3_AAC_RATES, bit_rate=64000),
    # Blocks of 1152 samples: FFmpeg's own choice (105 ms) is longer than a first chunk
    # can be, and would hold it back whole. No 8 KiB padding block after STREAMINFO:
    # nothing will fill it in a stream. STREAMINFO leaves before the length is known, so
    # its total says 0 ("unknown"), which libsndfile cannot read: docs/protocol.md, "A
    # streamed FLAC and its readers", says which readers can, and how to write it in.
    "flac": Codec(
        "flac", "flac", "flac", "audio/flac", None,
        options={"frame_size": "1152"}, muxer_options={"metadata_header_padding": "0"},
    ),
})


class _Sink:
    """Where the muxer writes: bytes gathered until the chunk is done."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def write(self, data: bytes) -> int:
        self._buf += data
        return len(data)

    def take(self) -> bytes:
        out = bytes(self._buf)
        self._buf.clear()
        return out


class CompressedEncoder:
    """Mono float32 chunks in, the container's bytes out, chunk by chunk."""

    def __init__(self, fmt: str, rate: int) -> None:
        codec = CODECS[fmt]
        self.rate = rate
        self._sink = _Sink()
        self._container = av.open(self._sink, "w", format=codec.container, options=dict(codec.muxer_options))
        stream = self._container.add_stream(codec.encoder, rate=rate, layout="mono", options=dict(codec.options))
        if not isinstance(stream, av.AudioStream):
            raise TypeError(f"{codec.encoder!r} is not an audio encoder")
        self._stream = stream
        if codec.bit_rate is not None:
            self._stream.codec_context.bit_rate = codec.bit_rate
        self._format = "s16" if codec.encoder == "flac" else "flt"  # flac takes integers only
        self._pts = 0
        self._open = True

    def push(self, x: np.ndarray) -> bytes:
        """One chunk's samples in; the bytes the codec could finish with them (none
        once it is finished or closed: an utterance that ended takes no more audio)."""
        if x.size and self._open:
            self._mux(self._stream.encode(self._frame(x)))
        return self._sink.take()

    def finish(self) -> bytes:
        """The samples still held (less than a frame), and the stream's end."""
        if self._open:
            self._open = False
            self._mux(self._stream.encode(None))
            self._container.close()
        return self._sink.take()

    def close(self) -> None:
        """Drop it unfinished (a cancelled utterance): what was sent stays decodable."""
        if self._open:
            self._open = False
            self._container.close()
            self._sink.take()

    def _frame(self, x: np.ndarray) -> av.AudioFrame:
        x = np.clip(x, -1.0, 1.0)
        data: npt.NDArray[np.int16] | npt.NDArray[np.float32]
        if self._format == "s16":
            data = np.ascontiguousarray(np.round(x * 32767.0).astype(np.int16))
        else:
            data = np.ascontiguousarray(x.astype(np.float32))
        frame = av.AudioFrame.from_ndarray(data[None, :], format=self._format, layout="mono")
        frame.sample_rate = self.rate
        frame.pts = self._pts
        self._pts += x.size
        return frame

    def _mux(self, packets: list[av.Packet]) -> None:
        for packet in packets:
            self._container.mux(packet)
