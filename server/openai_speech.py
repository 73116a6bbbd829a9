"""``POST /v1/audio/speech``, as OpenAI's API has it, streamed chunk by chunk.

For code that already calls ``client.audio.speech`` of the OpenAI SDK: point its
``base_url`` at Voxwire. Formats: ``pcm`` (raw 16-bit little-endian mono at 24 kHz, as
OpenAI sends it) and ``wav`` (the same with a streaming header). OpenAI's voice names
("alloy", ...) speak with the server's default voice; Voxwire's own voice ids work too.
Errors come in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator, Callable

import numpy as np
import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from engine.base import EngineError, SynthesisParams
from engine.queue import Failed, Finished
from server.audio import OutputStream, encode
from server.cache import Entry
from server.service import Service

RATE = 24000
CHUNK_MS = 200
MAX_INPUT_CHARS = 4096  # OpenAI's own limit
FORMATS = {"pcm": "audio/pcm", "wav": "audio/wav"}
OPENAI_VOICES = frozenset("alloy ash ballad coral echo fable nova onyx sage shimmer verse".split())


def openai_error(status: int, message: str, code: str, param: str | None = None) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}}, status_code=status)


def wav_header(rate: int) -> bytes:
    """A 16-bit mono WAV header for a stream of unknown length (sizes 0xFFFFFFFF), which
    players read as "until the data ends"."""
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate * 2, 2, 16)
    return b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt + b"data" + struct.pack(
        "<I", 0xFFFFFFFF
    )


async def speech(request: Request, service: Service) -> Response:
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError:
        return openai_error(400, "the body must be a JSON object", "invalid_json")
    if not isinstance(body, dict):
        return openai_error(400, "the body must be a JSON object", "invalid_json")
    text, model, voice = body.get("input"), body.get("model"), body.get("voice")
    fmt = body.get("response_format", "wav")
    speed = body.get("speed", 1.0)
    for name, value in (("model", model), ("input", text), ("voice", voice)):
        if not isinstance(value, str) or not value.strip():
            return openai_error(400, f"'{name}' is required and must be a non-empty string", "missing_field", name)
    assert isinstance(text, str) and isinstance(voice, str)
    if len(text) > MAX_INPUT_CHARS:
        return openai_error(400, f"'input' is limited to {MAX_INPUT_CHARS} characters", "text_too_long", "input")
    if fmt not in FORMATS:
        return openai_error(
            400, f"response_format {fmt!r} is not supported; use one of {', '.join(FORMATS)}", "invalid_format",
            "response_format",
        )
    if body.get("stream_format", "audio") != "audio":
        return openai_error(400, "only stream_format 'audio' is supported", "invalid_field", "stream_format")
    if type(speed) not in (int, float) or not 0.5 <= speed <= 2.0:
        return openai_error(400, "'speed' must be a number from 0.5 to 2.0", "invalid_speed", "speed")
    try:
        engine = service.worker.loaded_engine()
    except EngineError as e:
        return openai_error(503, e.message, e.code)
    if voice in OPENAI_VOICES and not engine.has_voice(voice):
        assert service.defaults is not None
        voice = service.defaults.voice
    if not engine.has_voice(voice):
        return openai_error(400, f"unknown voice {voice!r}; GET /v1/voices lists them", "unknown_voice", "voice")
    if not service.admission.try_start_utterance():
        return openai_error(429, "the server is at capacity; try again shortly", "overloaded")

    key = service.cache.key(engine.name, voice, float(speed), text)
    hit = service.cache.get(key) if service.cache.enabled else None
    utterance = None
    if hit is not None:
        queue = hit.replay(asyncio.get_running_loop())
    else:
        try:
            utterance = service.worker.submit(SynthesisParams(voice=voice, speed=float(speed)), asyncio.get_running_loop())
        except EngineError as e:
            service.admission.end_utterance()
            return openai_error(503, e.message, e.code)
        utterance.feed(text, final=True)
        queue = utterance.queue

    released = False

    def release() -> None:
        nonlocal released
        # Ended, failed, or the client went away (even before the body began): the
        # worker stops and the slot frees, exactly once.
        if utterance is not None and utterance.outcome is None:
            utterance.cancel()
        if not released:
            released = True
            service.admission.end_utterance()

    async def body_chunks() -> AsyncIterator[bytes]:
        out = OutputStream(engine.sample_rate, RATE, CHUNK_MS)
        produced: list[np.ndarray] = []
        try:
            if fmt == "wav":
                yield wav_header(RATE)
            while True:
                item = await queue.get()
                if isinstance(item, np.ndarray):
                    produced.append(item)
                    for frame in out.push(item):
                        yield encode(frame, "pcm_s16le")
                elif isinstance(item, Finished):
                    for frame in out.finish():
                        yield encode(frame, "pcm_s16le")
                    if utterance is not None and produced:
                        service.cache.put(key, Entry(np.concatenate(produced), utterance.segments))
                    return
                elif isinstance(item, Failed):
                    # The status line is gone already: end the body; the log has the cause.
                    raise RuntimeError(f"{item.code}: {item.message}")
        finally:
            release()

    headers = {"X-Voxwire-Cached": "1" if hit is not None else "0"}
    return _Stream(body_chunks(), media_type=FORMATS[fmt], headers=headers, on_close=release)


class _Stream(StreamingResponse):
    """A streaming response that runs ``on_close`` however it ends, cancelled included."""

    def __init__(self, *args: object, on_close: Callable[[], None], **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()
