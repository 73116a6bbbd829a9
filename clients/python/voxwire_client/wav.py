"""Writing a stream's bytes to a WAV file in the encoding they arrived in.

The standard library's ``wave`` writes integer PCM only; float, A-law and mu-law need the
WAVE_FORMAT_IEEE_FLOAT (3), WAVE_FORMAT_ALAW (6) and WAVE_FORMAT_MULAW (7) tags, whose
headers are written here.
"""

from __future__ import annotations

import struct
from pathlib import Path

# format -> (WAV format tag, bits per sample)
_TAGS = {"pcm_s16le": (1, 16), "pcm_f32le": (3, 32), "alaw": (6, 8), "mulaw": (7, 8)}


def write_wav(path: str | Path, data: bytes, sample_rate: int, fmt: str) -> None:
    tag, bits = _TAGS[fmt]
    block = bits // 8
    fmt_chunk = struct.pack("<HHIIHH", tag, 1, sample_rate, sample_rate * block, block, bits)
    chunks = [b"fmt ", struct.pack("<I", len(fmt_chunk) + (2 if tag != 1 else 0)), fmt_chunk]
    if tag != 1:
        # Non-PCM formats carry an extension size, and a fact chunk with the frame count.
        chunks += [struct.pack("<H", 0), b"fact", struct.pack("<II", 4, len(data) // block)]
    pad = b"\0" if len(data) % 2 else b""
    chunks += [b"data", struct.pack("<I", len(data)), data, pad]
    body = b"WAVE" + b"".join(chunks)
    Path(path).write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)
