"""An asyncio load generator for any protocol-v1 server.

Closed loop: N clients, each on its own connection, speak one text after another; by
default each waits, as a listener would, until its simulated playback has finished
before speaking again. Poisson: utterances arrive at a given rate, each on a fresh
connection, for a fixed time. Every utterance is measured from the client's side.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np
import orjson
import websockets
from voxwire_client.formats import to_float32

from voxwire.benchmarks.playback import simulate


@dataclass
class Heard:
    """What a listener received, for the quality harness: the audio decoded to mono
    float32 at the stream's rate, and where the pieces it arrived in join."""

    audio: np.ndarray
    rate: int
    joins: list[int] = field(default_factory=list)
    """Sample positions at which consecutive pieces (frames, chunks) meet; empty where the
    protocol delivers no pieces of its own (an HTTP body's reads are the network's)."""

    @staticmethod
    def of_pieces(pieces: list[np.ndarray], rate: int) -> Heard:
        audio = np.concatenate(pieces).astype(np.float32, copy=False) if pieces else np.zeros(0, np.float32)
        return Heard(audio, rate, joins([p.size for p in pieces]))


def joins(sizes: Sequence[int]) -> list[int]:
    """Where consecutive pieces of these sizes meet in their concatenation: the index of
    each later piece's first sample. Empty pieces add no join of their own, and the start
    and end of the whole are not joins."""
    if any(int(n) < 0 for n in sizes):
        raise ValueError(f"negative piece size in {list(sizes)}")
    total = sum(int(n) for n in sizes)
    return sorted({int(j) for j in itertools.accumulate(sizes) if 0 < j < total})


@dataclass
class UtteranceResult:
    words: int
    ttfa_ms: float = float("nan")
    """Client-observed: from sending the text to receiving the first audio frame."""
    total_ms: float = float("nan")
    """From sending the text to the end of the answer (``done``, the body's last byte)."""
    last_audio_ms: float = float("nan")
    """From sending the text to receiving the last audio."""
    first_byte_ms: float = float("nan")
    """HTTP only: the first byte of the body, audio or not (a WAV header, an mp3 frame)."""
    audio_ms: float = 0.0
    frames: int = 0
    max_gap_ms: float = 0.0
    """The longest wait between two frames."""
    sound_ms: float = float("nan")
    """When a listener's jitter buffer would start playing."""
    underruns: int = 0
    stall_ms: float = 0.0
    server: dict[str, Any] = field(default_factory=dict)
    """The server's own ``done`` figures."""
    error: str | None = None
    heard: Heard | None = None
    """The audio itself, when the session was asked to keep it."""

    @property
    def rtf(self) -> float:
        """Client-side: wall time to receive it all over its duration."""
        return self.total_ms / self.audio_ms if self.audio_ms else float("nan")


_ids = itertools.count()


async def speak(
    ws: Any, text: str, settings: dict[str, Any], start_ms: float = 100.0, timeout_s: float = 120.0,
    keep_audio: bool = False,
) -> UtteranceResult:
    """Speak one text on an open connection and measure it; with ``keep_audio``, the
    result also holds the audio and its frame joins (``heard``)."""
    ctx = f"b{next(_ids)}"
    result = UtteranceResult(words=len(text.split()))
    arrivals: list[float] = []
    durations: list[float] = []
    kept: list[bytes] = []
    sizes: list[int] = []
    fmt = settings.get("format", "pcm_s16le")
    rate = settings.get("sample_rate", 0)
    sent = time.perf_counter()
    await ws.send(orjson.dumps({"type": "speak", "ctx": ctx, "text": text, **settings}).decode())
    while True:
        raw = await asyncio.wait_for(ws.recv(), timeout_s)
        now = time.perf_counter() - sent
        if isinstance(raw, bytes):
            frame = msgpack.unpackb(raw)
            if frame["ctx"] != ctx:
                continue
            arrivals.append(now)
            durations.append(frame["samples"] / rate)
            if keep_audio:
                kept.append(frame["audio"])
                sizes.append(frame["samples"])
            continue
        event = orjson.loads(raw)
        if event.get("ctx") != ctx:
            continue
        if event["type"] == "started":
            rate, fmt = event["sample_rate"], event.get("format", fmt)
        elif event["type"] == "done":
            result.total_ms = now * 1000
            result.server = event
            break
        elif event["type"] == "error":
            result.error = event["code"]
            result.total_ms = now * 1000
            return result
    if keep_audio:
        result.heard = _frames_heard(kept, sizes, fmt, rate)
    return finish(result, arrivals, durations, start_ms)


def _frames_heard(kept: list[bytes], sizes: list[int], fmt: str, rate: int) -> Heard:
    """Protocol-v1 frames as heard: a compressed stream is decoded whole (its frames'
    bytes alone are not decodable), and the joins are where each frame's samples end.
    A decoder that gives more samples than the frames said (MP3's and AAC's priming and
    padding, which a raw stream does not tell it to drop) leaves the joins unplaceable:
    there are none, rather than joins at the wrong places."""
    audio = to_float32(b"".join(kept), fmt)
    return Heard(audio, rate, joins(sizes) if audio.size == sum(sizes) else [])


def finish(
    result: UtteranceResult, arrivals: list[float], durations: list[float], start_ms: float = 100.0
) -> UtteranceResult:
    """Fill in the figures every protocol reports from when each piece of audio arrived
    (seconds after the request) and how long it plays (seconds)."""
    play = simulate(arrivals, durations, start_ms)
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    result.ttfa_ms = arrivals[0] * 1000 if arrivals else float("nan")
    result.last_audio_ms = arrivals[-1] * 1000 if arrivals else float("nan")
    result.audio_ms = sum(durations) * 1000
    result.frames = len(arrivals)
    result.max_gap_ms = max(gaps, default=0.0) * 1000
    result.sound_ms = play.start_at * 1000
    result.underruns = play.underruns
    result.stall_ms = play.stall_ms
    return result


async def connect(url: str, headers: dict[str, str] | None) -> Any:
    ws = await websockets.connect(url, max_size=None, open_timeout=60, additional_headers=headers)
    ready = orjson.loads(await asyncio.wait_for(ws.recv(), 60))
    if ready.get("type") != "ready":
        raise RuntimeError(f"expected ready, got {ready}")
    return ws


async def closed_loop(
    url: str,
    clients: int,
    per_client: int,
    texts: list[str],
    settings: dict[str, Any] | None = None,
    listen: bool = True,
    headers: dict[str, str] | None = None,
) -> list[UtteranceResult]:
    settings = settings or {}

    async def client(i: int) -> list[UtteranceResult]:
        ws = await connect(url, headers)
        out = []
        try:
            for k in range(per_client):
                r = await speak(ws, texts[(i + k) % len(texts)], settings)
                out.append(r)
                if listen and r.error is None:
                    # A listener hears it out before asking again.
                    await asyncio.sleep(max(0.0, (r.sound_ms + r.audio_ms + r.stall_ms - r.total_ms) / 1000))
        finally:
            await ws.close()
        return out

    results = await asyncio.gather(*(client(i) for i in range(clients)))
    return [r for rs in results for r in rs]


async def poisson(
    url: str,
    rate_per_s: float,
    duration_s: float,
    texts: list[str],
    settings: dict[str, Any] | None = None,
    seed: int = 0,
    headers: dict[str, str] | None = None,
) -> list[UtteranceResult]:
    rng = random.Random(seed)
    settings = settings or {}
    tasks = []

    async def one(text: str) -> UtteranceResult:
        ws = await connect(url, headers)
        try:
            return await speak(ws, text, settings)
        finally:
            await ws.close()

    end = time.monotonic() + duration_s
    while time.monotonic() < end:
        tasks.append(asyncio.create_task(one(rng.choice(texts))))
        await asyncio.sleep(rng.expovariate(rate_per_s))
    return list(await asyncio.gather(*tasks))


def listening_s(r: UtteranceResult) -> float:
    """How long a listener still hears this utterance after the answer has arrived."""
    if r.error is not None or r.sound_ms != r.sound_ms:
        return 0.0
    return max(0.0, (r.sound_ms + r.audio_ms + r.stall_ms - r.total_ms) / 1000)


async def staggered(
    opener: Any, listeners: int, utterances: int, texts: list[str], spread_s: float
) -> list[UtteranceResult]:
    """Real-time listeners who arrive at staggered times (listener i after i/N of
    ``spread_s``), then speak, hear the answer out, and speak again, until ``utterances``
    have been spoken in all. ``opener`` is a :class:`benchmarks.protocols.Opener`."""
    each = -(-utterances // listeners)

    async def listener(i: int) -> list[UtteranceResult]:
        await asyncio.sleep(spread_s * i / listeners)
        session = opener.session()
        out = []
        try:
            for k in range(each):
                r = await session.speak(texts[(i + k) % len(texts)])
                out.append(r)
                await asyncio.sleep(listening_s(r))
        finally:
            await session.close()
        return out

    results = await asyncio.gather(*(listener(i) for i in range(listeners)))
    return [r for rs in results for r in rs]


async def burst(opener: Any, newcomers: int, rounds: int, texts: list[str]) -> list[UtteranceResult]:
    """``newcomers`` fresh clients that all speak at the same moment, ``rounds`` times;
    each round starts once the last one's answer has arrived."""
    out: list[UtteranceResult] = []
    for k in range(rounds):
        sessions = [opener.session() for _ in range(newcomers)]
        try:
            out += await asyncio.gather(
                *(s.speak(texts[(k * newcomers + i) % len(texts)]) for i, s in enumerate(sessions))
            )
        finally:
            for s in sessions:
                await s.close()
    return out
