"""One client per protocol, each measuring an utterance the same way.

The URL picks the protocol:

- ``ws://`` or ``wss://``: Voxwire's protocol v1;
- ``http(s)://…/v1/audio/speech``: OpenAI-compatible streaming speech (pcm, wav or mp3);
- ``tcp://host:port``: Wyoming (Home Assistant's voice protocol), streaming
  ``synthesize-start/chunk/stop`` where the server offers it, else ``synthesize``;
- any other ``http(s)://`` URL: Piper's HTTP server (``POST`` a JSON ``{"text": …}``,
  one WAV back), at ``/synthesize`` when the URL has no path.

Every client records when each piece of audio arrived and how long it plays, and
:func:`benchmarks.loadgen.finish` turns that into the same figures for all of them. A
server that answers with an error, or closes before the end of the utterance, gives a
result with ``error`` set and no latency figure.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import numpy as np
from voxwire_client.formats import decoded_to_float32

from voxwire.benchmarks import loadgen
from voxwire.benchmarks.loadgen import Heard, UtteranceResult

KINDS = ("v1", "openai", "wyoming", "piper_http")
OPENAI_RATE = 24000  # OpenAI's pcm: 24 kHz, 16-bit mono, little-endian
WAV_HEADER = 44
CACHED_HEADER = "X-Voxwire-Cached"
"""Voxwire's OpenAI route: ``1`` when the answer came from its result cache (as ``done.cached``)."""
TIMEOUT_S = 30.0
"""The longest wait for the next piece of an answer; a server silent for longer has failed."""


REFUSALS = frozenset({"overloaded", "http_429"})
"""A result's ``error`` where the server refused for want of capacity: protocol v1's and
Wyoming's code, the OpenAI route's status."""


@dataclass(frozen=True)
class Target:
    """A server to measure, as a name in the report and a URL."""

    name: str
    url: str
    fmt: str = "pcm"
    """The OpenAI route's ``response_format``: pcm, wav or mp3."""
    voice: str | None = None
    """The voice each utterance asks for; None: the server's default (OpenAI's ``alloy``
    on an OpenAI-compatible route, whose body must name one)."""

    @property
    def kind(self) -> str:
        return kind_of(self.url)


def kind_of(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme in ("ws", "wss"):
        return "v1"
    if parts.scheme == "tcp":
        return "wyoming"
    if parts.scheme in ("http", "https"):
        return "openai" if parts.path.rstrip("/").endswith("/v1/audio/speech") else "piper_http"
    raise ValueError(f"unsupported URL {url!r}: use ws://, wss://, tcp:// or http(s)://")


class Session(Protocol):
    """One listener's client: it speaks one text after another. A session made with
    ``keep_audio`` also returns what it heard (``UtteranceResult.heard``)."""

    async def speak(self, text: str) -> UtteranceResult: ...

    async def close(self) -> None: ...


def _failed(text: str, error: str, sent: float) -> UtteranceResult:
    return UtteranceResult(words=len(text.split()), error=error, total_ms=(time.perf_counter() - sent) * 1000)


def _error_name(e: BaseException) -> str:
    if isinstance(e, asyncio.TimeoutError):
        return "timeout"
    return type(e).__name__


class V1Session:
    """Protocol v1: one WebSocket for the listener, reopened after a failure."""

    def __init__(self, url: str, settings: dict[str, Any] | None = None, keep_audio: bool = False) -> None:
        self.url, self.settings, self.ws = url, settings or {}, None
        self.keep_audio = keep_audio

    async def speak(self, text: str) -> UtteranceResult:
        sent = time.perf_counter()
        try:
            if self.ws is None:
                self.ws = await loadgen.connect(self.url, None)
            opened_ms = (time.perf_counter() - sent) * 1000
            result = await loadgen.speak(self.ws, text, self.settings, timeout_s=TIMEOUT_S,
                                         keep_audio=self.keep_audio)
        except Exception as e:  # a closed socket, a timeout: an error, never a figure
            await self.close()
            return _failed(text, _error_name(e), sent)
        if result.error is not None:
            await self.close()
        # Like every other client here, timed from the moment it began to open its
        # connection: a newcomer's handshake is part of what it waits for.
        for name in ("ttfa_ms", "last_audio_ms", "total_ms", "sound_ms"):
            setattr(result, name, getattr(result, name) + opened_ms)
        return result

    async def close(self) -> None:
        if self.ws is not None:
            ws, self.ws = self.ws, None
            await ws.close()


def _pcm16(data: bytes) -> np.ndarray:
    return np.frombuffer(data[: len(data) // 2 * 2], "<i2").astype(np.float32) / 32767.0


class _HttpSession:
    def __init__(self, url: str, keep_audio: bool = False) -> None:
        self.url = url
        self.keep_audio = keep_audio
        # The bench extra's: imported here so that `voxwire bench` starts without it and
        # says which extra to install (bench.py), rather than failing on import.
        import httpx

        self.http = httpx.AsyncClient(timeout=httpx.Timeout(TIMEOUT_S, connect=10.0))

    async def close(self) -> None:
        await self.http.aclose()


class OpenAISession(_HttpSession):
    """``POST /v1/audio/speech``, the body read as it arrives. It keeps the first body
    byte, the first decodable audio (after a WAV header; for mp3, the first decoded frame)
    and the last byte."""

    def __init__(self, url: str, fmt: str = "pcm", keep_audio: bool = False, voice: str | None = None) -> None:
        super().__init__(url, keep_audio)
        if fmt not in ("pcm", "wav", "mp3"):
            raise ValueError(f"response format {fmt!r}: pcm, wav or mp3")
        self.fmt = fmt
        self.voice = voice or "alloy"

    async def speak(self, text: str) -> UtteranceResult:
        # stream: Kokoro-FastAPI's and fastkokoro's flag to stream the body (else they send it
        # whole, once computed); OpenAI's API, Voxwire's and most others always stream it.
        body = {"model": "tts-1", "input": text, "voice": self.voice, "response_format": self.fmt, "stream": True}
        decoder = _Mp3Decoder(self.keep_audio) if self.fmt == "mp3" else None
        pcm: list[bytes] = []
        arrivals: list[float] = []
        durations: list[float] = []
        first_byte = float("nan")
        skip = WAV_HEADER if self.fmt == "wav" else 0
        odd = b""
        sent = time.perf_counter()
        try:
            async with self.http.stream("POST", self.url, json=body) as r:
                if r.status_code != 200:
                    await r.aread()
                    return _failed(text, f"http_{r.status_code}", sent)
                # Voxwire says whether the answer was replayed from its result cache; other
                # servers say nothing, and are taken to have computed it.
                cached = r.headers.get(CACHED_HEADER)
                async for chunk in r.aiter_raw():
                    now = time.perf_counter() - sent
                    if not chunk:
                        continue
                    if first_byte != first_byte:
                        first_byte = now * 1000
                    if decoder is not None:
                        seconds = decoder.feed(chunk)
                    else:
                        if skip:
                            cut = min(skip, len(chunk))
                            chunk, skip = chunk[cut:], skip - cut
                        chunk, odd = odd + chunk, b""
                        if len(chunk) % 2:
                            chunk, odd = chunk[:-1], chunk[-1:]
                        seconds = len(chunk) / 2 / OPENAI_RATE
                        if self.keep_audio:
                            pcm.append(chunk)
                    if seconds > 0:
                        arrivals.append(now)
                        durations.append(seconds)
        except Exception as e:  # an unfinished chunked body: the server closed mid-stream
            return _failed(text, _error_name(e), sent)
        result = loadgen.finish(UtteranceResult(words=len(text.split())), arrivals, durations)
        result.first_byte_ms = first_byte
        result.total_ms = (time.perf_counter() - sent) * 1000
        if cached is not None:
            result.server["cached"] = cached == "1"
        if self.keep_audio:
            # An HTTP body's reads are cut by the network, not by the server: no joins.
            result.heard = decoder.heard() if decoder is not None else Heard(_pcm16(b"".join(pcm)), OPENAI_RATE)
        undecoded = decoder is not None and not decoder.decodes and first_byte == first_byte
        if undecoded:
            # No PyAV here: the earliest a client could play is the first byte.
            result.ttfa_ms = first_byte
            result.server["first_audio"] = "first byte (PyAV not installed)"
        return result if arrivals or undecoded else _no_audio(result)


class PiperHttpSession(_HttpSession):
    """Piper's own HTTP server: the whole text is synthesised, then one WAV is sent."""

    def __init__(self, url: str, keep_audio: bool = False) -> None:
        parts = urlsplit(url)
        super().__init__(url if parts.path.strip("/") else url.rstrip("/") + "/synthesize", keep_audio)

    async def speak(self, text: str) -> UtteranceResult:
        arrivals: list[float] = []
        durations: list[float] = []
        first_byte = float("nan")
        skip, rate = WAV_HEADER, 22050
        body: list[bytes] = []
        sent = time.perf_counter()
        try:
            async with self.http.stream("POST", self.url, json={"text": text}) as r:
                if r.status_code != 200:
                    await r.aread()
                    return _failed(text, f"http_{r.status_code}", sent)
                async for chunk in r.aiter_raw():
                    now = time.perf_counter() - sent
                    if not chunk:
                        continue
                    if first_byte != first_byte:
                        first_byte = now * 1000
                        if chunk[:4] == b"RIFF" and len(chunk) >= 28:
                            rate = int.from_bytes(chunk[24:28], "little")
                    cut = min(skip, len(chunk))
                    chunk, skip = chunk[cut:], skip - cut
                    if chunk:
                        arrivals.append(now)
                        durations.append(len(chunk) / 2 / rate)
                        if self.keep_audio:
                            body.append(chunk)
        except Exception as e:
            return _failed(text, _error_name(e), sent)
        result = loadgen.finish(UtteranceResult(words=len(text.split())), arrivals, durations)
        result.first_byte_ms = first_byte
        result.total_ms = (time.perf_counter() - sent) * 1000
        if self.keep_audio:
            result.heard = Heard(_pcm16(b"".join(body)), rate)
        return result if arrivals else _no_audio(result)


class WyomingSession:
    """Wyoming over TCP, a connection per utterance as Home Assistant opens them. It
    streams the text (``synthesize-start/chunk/stop``) when the server's ``describe``
    says it can, else sends one ``synthesize``."""

    def __init__(self, url: str, streaming: bool, voice: str | None = None, keep_audio: bool = False) -> None:
        parts = urlsplit(url)
        self.host, self.port, self.streaming = parts.hostname or "127.0.0.1", parts.port or 10200, streaming
        self.voice = voice
        self.keep_audio = keep_audio

    async def speak(self, text: str) -> UtteranceResult:
        from wyoming.audio import AudioChunk, AudioStop
        from wyoming.client import AsyncTcpClient
        from wyoming.error import Error
        from wyoming.tts import (
            Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped, SynthesizeVoice,
        )

        arrivals: list[float] = []
        durations: list[float] = []
        pieces: list[np.ndarray] = []
        rate = 0
        sent = time.perf_counter()
        try:
            async with AsyncTcpClient(self.host, self.port) as client:
                voice = SynthesizeVoice(name=self.voice) if self.voice else None
                if self.streaming:
                    await client.write_event(SynthesizeStart(voice=voice).event())
                    await client.write_event(SynthesizeChunk(text=text).event())
                    await client.write_event(SynthesizeStop().event())
                else:
                    await client.write_event(Synthesize(text=text, voice=voice).event())
                while True:
                    event = await asyncio.wait_for(client.read_event(), TIMEOUT_S)
                    now = time.perf_counter() - sent
                    if event is None:
                        return _failed(text, "closed", sent)
                    if Error.is_type(event.type):
                        return _failed(text, Error.from_event(event).code or "error", sent)
                    if AudioChunk.is_type(event.type):
                        chunk = AudioChunk.from_event(event)
                        if chunk.audio:
                            arrivals.append(now)
                            durations.append(len(chunk.audio) / (chunk.width * chunk.channels) / chunk.rate)
                            if self.keep_audio:
                                if chunk.width != 2 or chunk.channels != 1:
                                    raise ValueError(f"{chunk.width * 8}-bit, {chunk.channels}-channel audio: "
                                                     "only 16-bit mono is kept")
                                pieces.append(_pcm16(chunk.audio))
                                rate = chunk.rate
                    elif self.streaming and SynthesizeStopped.is_type(event.type):
                        break
                    elif not self.streaming and AudioStop.is_type(event.type):
                        break
        except Exception as e:
            return _failed(text, _error_name(e), sent)
        result = loadgen.finish(UtteranceResult(words=len(text.split())), arrivals, durations)
        result.total_ms = (time.perf_counter() - sent) * 1000
        if self.keep_audio:
            result.heard = Heard.of_pieces(pieces, rate)
        return result if arrivals else _no_audio(result)

    async def close(self) -> None:
        pass


def _no_audio(result: UtteranceResult) -> UtteranceResult:
    result.error = "no_audio"
    result.ttfa_ms = float("nan")
    return result


async def wyoming_streams(url: str) -> bool:
    """Whether a Wyoming server's ``describe`` says it takes streamed text."""
    from wyoming.client import AsyncTcpClient
    from wyoming.info import Describe, Info

    parts = urlsplit(url)
    async with AsyncTcpClient(parts.hostname or "127.0.0.1", parts.port or 10200) as client:
        await client.write_event(Describe().event())
        while True:
            event = await asyncio.wait_for(client.read_event(), 30)
            if event is None:
                raise ConnectionError(f"{url} closed before describing itself")
            if Info.is_type(event.type):
                info = Info.from_event(event)
                return any(t.supports_synthesize_streaming for t in info.tts)


class Opener:
    """Opens sessions on a target; for Wyoming it asks the server once whether it streams."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self._streaming: bool | None = None

    async def prepare(self) -> None:
        if self.target.kind == "wyoming" and self._streaming is None:
            try:
                self._streaming = await wyoming_streams(self.target.url)
            except (OSError, asyncio.TimeoutError, ConnectionError):
                # No description: plain `synthesize`, which every Wyoming TTS server
                # takes; if the server is not there at all, each utterance says so.
                self._streaming = False

    @property
    def details(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.target.kind, "url": self.target.url}
        if self.target.kind == "openai":
            out["format"] = self.target.fmt
        if self.target.kind == "wyoming":
            out["streaming"] = self._streaming
        return out

    def session(self, keep_audio: bool = False) -> Session:
        kind, url, voice = self.target.kind, self.target.url, self.target.voice
        if kind == "v1":
            return V1Session(url, {"voice": voice} if voice else None, keep_audio=keep_audio)
        if kind == "openai":
            return OpenAISession(url, self.target.fmt, keep_audio, voice)
        if kind == "wyoming":
            return WyomingSession(url, bool(self._streaming), voice, keep_audio=keep_audio)
        return PiperHttpSession(url, keep_audio)  # one voice per server: none to name


class _Mp3Decoder:
    """Decodes an mp3 body as it arrives with PyAV, when PyAV is installed, so that "first
    audio" is the first decodable frame rather than the first byte."""

    def __init__(self, keep: bool = False) -> None:
        self.keep = keep
        self.decoded: list[np.ndarray] = []
        self.rate = 0
        try:
            import av  # noqa: F401
        except ImportError:
            if keep:
                raise RuntimeError("keeping mp3 audio needs PyAV") from None
            self.decodes = False
            return
        self.decodes = True
        self.codec = av.CodecContext.create("mp3", "r")

    def feed(self, data: bytes | None) -> float:
        """Seconds of audio decoded from ``data``; None: the body has ended."""
        if not self.decodes:
            return 0.0
        frames = [f for packet in self.codec.parse(data) for f in self.codec.decode(packet)]
        if data is None:  # the parser and the decoder hold back the last frames until the end
            frames += self.codec.decode(None)
        if self.keep:
            self.decoded += [decoded_to_float32(f.to_ndarray()[0]) for f in frames]
            self.rate = frames[-1].sample_rate if frames else self.rate
        return sum(f.samples / f.sample_rate for f in frames)

    def heard(self) -> Heard:
        self.feed(None)
        audio = np.concatenate(self.decoded) if self.decoded else np.zeros(0, np.float32)
        return Heard(audio, self.rate or OPENAI_RATE)
