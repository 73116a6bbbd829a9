"""Decoding the server's output formats: pcm_s16le, pcm_f32le and G.711 mu-law."""

from __future__ import annotations

import numpy as np


def mulaw_to_int16(data: bytes) -> np.ndarray:
    u = ~np.frombuffer(data, np.uint8).astype(np.int32) & 0xFF
    exponent = (u >> 4) & 0x07
    magnitude = (((u & 0x0F) << 3) + 0x84) << exponent
    pcm = magnitude - 0x84
    return np.where(u & 0x80, -pcm, pcm).astype(np.int16)


def to_float32(data: bytes, fmt: str) -> np.ndarray:
    if fmt == "pcm_s16le":
        return np.frombuffer(data, "<i2").astype(np.float32) / 32767.0
    if fmt == "pcm_f32le":
        return np.frombuffer(data, "<f4").astype(np.float32)
    if fmt == "mulaw":
        return mulaw_to_int16(data).astype(np.float32) / 32767.0
    raise ValueError(f"unknown format {fmt!r}")
