"""A blocking helper for scripts: text in, the whole audio and its figures out."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import numpy as np

from voxwire_client.client import DEFAULT_URL, Client
from voxwire_client.formats import COMPRESSED, to_float32


@dataclass(frozen=True)
class Result:
    data: bytes
    """The audio as it arrived, in ``format``."""
    format: str
    sample_rate: int
    ttfa_ms: float | None
    """Client-observed: from sending the text to receiving the first audio frame."""
    chunks: int
    done: dict[str, Any]
    """The server's own figures for the utterance."""
    words: list[dict[str, Any]]
    """Word timings, when asked for with ``timestamps=True``."""

    @property
    def audio(self) -> np.ndarray:
        """Decoded to float32 (a compressed format needs PyAV: the ``decode`` extra)."""
        return to_float32(self.data, self.format)

    @property
    def duration(self) -> float:
        if self.format in COMPRESSED:
            # The samples the server encoded: known without decoding.
            return int(self.done.get("samples", 0)) / self.sample_rate
        return self.audio.shape[0] / self.sample_rate


async def synthesize_async(text: str, url: str = DEFAULT_URL, api_key: str | None = None, **settings: Any) -> Result:
    async with await Client.connect(url, api_key=api_key) as client:
        u = await client.speak(text, **settings)
        frames, done = await u.collect()
        assert u.started is not None and u.sent_at is not None
        ttfa = (frames[0].received_at - u.sent_at) * 1000 if frames else None
        return Result(
            data=b"".join(f.data for f in frames),
            format=u.started["format"],
            sample_rate=u.started["sample_rate"],
            ttfa_ms=ttfa,
            chunks=len(frames),
            done=done.data,
            words=u.words,
        )


def synthesize(text: str, url: str = DEFAULT_URL, api_key: str | None = None, **settings: Any) -> Result:
    """Speak ``text`` through a Voxwire server; settings: voice, speaker, format, sample_rate, ...
    ``api_key``: for a server started with keys (sent as ``Authorization: Bearer``)."""
    return asyncio.run(synthesize_async(text, url, api_key=api_key, **settings))
