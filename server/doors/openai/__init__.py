"""The second door: ``POST /v1/audio/speech``, as OpenAI's API has it, streamed chunk by chunk.

For code that already calls ``client.audio.speech`` of the OpenAI SDK: point its
``base_url`` at Voxwire. Formats, as OpenAI names them: ``mp3`` (the default, as at
OpenAI), ``opus`` (Ogg Opus, 48 kHz), ``aac`` (ADTS), ``flac``, ``wav`` (16-bit with a
streaming header) and ``pcm`` (raw 16-bit little-endian mono at 24 kHz, as OpenAI sends
it); beyond OpenAI's, ``mulaw`` and ``alaw`` (G.711, at 8 kHz), and a ``sample_rate``
field for any of them but Opus. Each is streamed as it is encoded (server/audio.py). OpenAI's voice names
("alloy", ...) speak with the voice ``--openai-voice`` maps them to, else the server's
default voice (voices.py); Voxwire's own voice ids work too, as a string or as
OpenAI's voice object ``{"id": ...}``, and ``VOICE:SPEAKER`` names a speaker of a
multi-speaker voice. ``lexicon`` is a request's own pronunciation entries, as protocol
v1 takes them (docs/lexicons.md). An ``input`` that starts with ``<speak`` is SSML
(docs/ssml.md), as is any with ``text_format: "ssml"``. ``stream_format: "sse"`` sends the same audio as base64 inside
server-sent events, as OpenAI does for its newer models. ``model`` and ``instructions``
are accepted and ignored: the loaded engine speaks. Optional fields may be null.
Errors come in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.
The body must be ``application/json`` and at most ``MAX_BODY_BYTES`` (server/bodies.py
reads it no further). docs/protocol.md has the reference.
"""

from __future__ import annotations

import logging
import math
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route
from starlette.types import Message, Receive, Scope, Send

from voxwire.engine.base import Engine, EngineError
from voxwire.engine.errors import CodedError, ErrorCode
from voxwire.engine.text import expanded_length
from voxwire.engine.text.lexicon import Lexicon
from voxwire.engine.text.ssml import looks_like_ssml
from voxwire.server import auth
from voxwire.server.audio import MAX_SAMPLE_RATE, MIN_SAMPLE_RATE, FormatError, content_type, stream_rate
from voxwire.server.bodies import Body, TooLarge, declared_media_type
from voxwire.server.doors.base import Door, Host
from voxwire.server.doors.openai.body import audio, events, wav_header
from voxwire.server.doors.openai.voices import check_map, parse_map, resolve
from voxwire.server.pipeline import Refused
from voxwire.server.protocol import (
    MAX_SPEED,
    MIN_SPEED,
    TEXT_FORMATS,
    ProtocolError,
    StreamSettings,
    lexicon_setting,
)
from voxwire.server.speech import Speech

log = logging.getLogger(__name__)

RATE = 24000  # OpenAI's
G711_RATE = 8000  # telephony's, the rate G.711 is made for
CHUNK_MS = 200
MAX_INPUT_CHARS = 4096  # OpenAI's own limit
# The largest body read. JSON may write any character as escapes, one beyond the BMP as a
# surrogate pair (12 bytes: \ud83d\ude00), so 4096 characters of ``input`` take at most
# 48 KiB; ``instructions`` (taken and ignored, but clients send prompts there) gets as
# much again, and the last 32 KiB is for ``model``, ``voice``, the other short fields and
# whitespace, and a ``lexicon`` of a few hundred ordinary entries (a long one belongs in a
# server's file). Larger bodies are refused before they are read (server/bodies.py).
MAX_BODY_BYTES = 128 * 1024
JSON = "application/json"
# response_format -> (the stream's format, the Content-Type). OpenAI's own types for its
# formats, but Ogg's for opus: the body is an Ogg file, which is what players look for.
FORMATS = {
    "mp3": ("mp3", content_type("mp3")),
    "opus": ("opus", content_type("opus")),
    "aac": ("aac", content_type("aac")),
    "flac": ("flac", content_type("flac")),
    "wav": ("pcm_s16le", "audio/wav"),
    "pcm": ("pcm_s16le", "audio/pcm"),
    # Not OpenAI's: G.711 for telephony (RFC 4856's types), at 8 kHz unless sample_rate says.
    "mulaw": ("mulaw", "audio/PCMU"),
    "alaw": ("alaw", "audio/PCMA"),
}
DEFAULT_FORMAT = "mp3"  # OpenAI's default
SSE = "text/event-stream"
# The range OpenAI documents for ``speed``; the engines here speak MIN_SPEED..MAX_SPEED of it.
OPENAI_MIN_SPEED, OPENAI_MAX_SPEED = 0.25, 4.0
# nginx's status for a client that closed its request: never sent (nobody is left to read
# it), but it keeps the handler's return type honest.
CLIENT_CLOSED_REQUEST = 499


def openai_error(
    status: int, message: str, code: str, param: str | None = None, retry_after_ms: int | None = None,
) -> JSONResponse:
    """An error in OpenAI's shape. A 429 is the service's load, not a fault in the request:
    OpenAI's SDKs retry it, after ``Retry-After`` (seconds) or ``retry-after-ms``."""
    kind = "server_error" if status >= 500 else "rate_limit_error" if status == 429 else "invalid_request_error"
    headers = {}
    if retry_after_ms is not None:
        headers = {"Retry-After": str(max(1, math.ceil(retry_after_ms / 1000))), "retry-after-ms": str(retry_after_ms)}
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": param, "code": code}}, status_code=status, headers=headers,
    )


class Invalid(CodedError):
    """A request refused with 400, in OpenAI's error shape: with the field (``param``) at fault."""

    def __init__(self, message: str, code: str, param: str | None) -> None:
        super().__init__(code, message)
        self.param = param


@dataclass(frozen=True)
class OpenAIRequest:
    text: str
    voice: str
    """As the client named it; OpenAI's names are mapped, and a ``VOICE:SPEAKER`` split,
    once the engine is known."""
    fmt: str
    speed: float
    rate: int = RATE
    speaker: str | None = None
    sse: bool = False
    """The audio inside server-sent events (``stream_format: "sse"``), not as the body."""
    lexicon: Lexicon | None = None
    """The request's own entries, over the server's (``--lexicon``)."""
    text_format: str = "text"
    """``ssml``: ``input`` is an SSML document (said so, or starting with ``<speak``)."""


def optional(body: dict[str, Any], name: str, default: Any) -> Any:
    # Many clients send null for a field they leave unset; OpenAI takes that as absent.
    value = body.get(name)
    return default if value is None else value


def required_text(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value.strip():
        raise Invalid(f"'{name}' is required and must be a non-empty string", ErrorCode.MISSING_FIELD, name)
    return value


def voice_id(value: object) -> str:
    """A voice name, or OpenAI's voice object ``{"id": ...}`` (its form for custom voices)."""
    if isinstance(value, dict):
        voice = value.get("id")
        if not isinstance(voice, str) or not voice.strip():
            raise Invalid("a voice object needs an 'id' that is a non-empty string", ErrorCode.INVALID_VOICE, "voice")
        return voice
    if not isinstance(value, str) or not value.strip():
        raise Invalid("'voice' is required: a voice name, or an object with an 'id'", ErrorCode.MISSING_FIELD, "voice")
    return value


def speed_of(value: object) -> float:
    out_of_range = Invalid(
        f"'speed' must be a number from {OPENAI_MIN_SPEED} to {OPENAI_MAX_SPEED}", ErrorCode.INVALID_SPEED, "speed",
    )
    # true is an int to Python, not a number to a client.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise out_of_range
    speed = float(value)
    if not OPENAI_MIN_SPEED <= speed <= OPENAI_MAX_SPEED:
        raise out_of_range
    # OpenAI's range is wider than the engines': refuse plainly rather than clamp, so
    # nobody gets a speed they did not ask for.
    if not MIN_SPEED <= speed <= MAX_SPEED:
        raise Invalid(
            f"this server speaks at speeds from {MIN_SPEED} to {MAX_SPEED}; {speed:g} is outside that range",
            ErrorCode.UNSUPPORTED_SPEED, "speed",
        )
    return speed


def response_format(value: object) -> str:
    if not isinstance(value, str) or value not in FORMATS:
        raise Invalid(
            f"response_format must be one of {', '.join(FORMATS)}",
            ErrorCode.INVALID_FORMAT, "response_format",
        )
    return value


def sample_rate(value: object, fmt: str) -> int:
    """Voxwire's own field: the rate of the audio (OpenAI's is always 24 kHz, or 48 kHz
    for Opus). A compressed format takes the rates its codec does."""
    if value is None:
        value = G711_RATE if fmt in ("mulaw", "alaw") else RATE
    if isinstance(value, bool) or not isinstance(value, int) or not MIN_SAMPLE_RATE <= value <= MAX_SAMPLE_RATE:
        raise Invalid(
            f"'sample_rate' must be an integer from {MIN_SAMPLE_RATE} to {MAX_SAMPLE_RATE}",
            ErrorCode.INVALID_SAMPLE_RATE, "sample_rate",
        )
    try:
        stream_rate(FORMATS[fmt][0], value)
    except FormatError as e:
        raise Invalid(e.message, e.code, "sample_rate") from None
    return value


def is_sse(value: object) -> bool:
    """``stream_format``: the audio as the body (``audio``), or inside events (``sse``)."""
    if value not in ("audio", "sse"):
        raise Invalid("stream_format must be 'audio' or 'sse'", ErrorCode.INVALID_STREAM_FORMAT, "stream_format")
    return value == "sse"


def lexicon_of(value: object) -> Lexicon | None:
    try:
        return lexicon_setting(value)
    except ProtocolError as e:
        raise Invalid(e.message, e.code, "lexicon") from None


def text_format_of(value: object, text: str) -> str:
    """Voxwire's ``text_format`` field; unset, an input that starts with ``<speak`` is SSML."""
    if value is None:
        return "ssml" if looks_like_ssml(text) else "text"
    if value not in TEXT_FORMATS:
        raise Invalid("'text_format' must be 'text' or 'ssml'", ErrorCode.INVALID_FIELD, "text_format")
    return str(value)


def parse_request(body: object) -> OpenAIRequest:
    """The fields of a request body, checked; ``Invalid`` names the first one that is wrong."""
    if not isinstance(body, dict):
        raise Invalid("the body must be a JSON object", ErrorCode.INVALID_JSON, None)
    # Any model name is taken: the loaded engine speaks whichever is named, and OpenAI's
    # list changes (dated snapshots, deprecations) faster than clients are updated.
    required_text(body, "model")
    text = required_text(body, "input")
    voice = voice_id(body.get("voice"))
    # Counted as normalisation expands them, as every door counts: one U+FDFA is 18.
    if expanded_length(text) > MAX_INPUT_CHARS:
        raise Invalid(
            f"'input' is limited to {MAX_INPUT_CHARS} characters (a character that normalisation expands, "
            "such as a ligature, counts as what it becomes)", ErrorCode.TEXT_TOO_LONG, "input",
        )
    fmt = response_format(optional(body, "response_format", DEFAULT_FORMAT))
    sse = is_sse(optional(body, "stream_format", "audio"))
    # Taken and ignored, as OpenAI itself does for tts-1: the engines here have no
    # instruction-following model. A wrong type is still a client's mistake to hear about.
    if not isinstance(optional(body, "instructions", ""), str):
        raise Invalid("'instructions' must be a string", ErrorCode.INVALID_INSTRUCTIONS, "instructions")
    return OpenAIRequest(
        text=text, voice=voice, fmt=fmt, speed=speed_of(optional(body, "speed", 1.0)),
        rate=sample_rate(body.get("sample_rate"), fmt), sse=sse, lexicon=lexicon_of(body.get("lexicon")),
        text_format=text_format_of(body.get("text_format"), text),
    )


async def read_body(body: Body) -> bytes | None:
    """The request body, or None when the client hung up before sending all of it."""
    try:
        return await body.read()
    except ClientDisconnect:
        # Ordinary (a cancelled request, a dropped connection): one line, no traceback.
        log.info("client disconnected before sending the whole request body", extra={"path": body.request.url.path})
        return None


def too_large() -> JSONResponse:
    return openai_error(
        413, f"the request body is limited to {MAX_BODY_BYTES // 1024} KiB ('input' to {MAX_INPUT_CHARS} characters)",
        ErrorCode.REQUEST_TOO_LARGE,
    )


def unsupported_media_type(sent: str) -> JSONResponse:
    what = f"Content-Type '{sent}'" if sent else "no Content-Type"
    return openai_error(
        415, f"the body must be a JSON object sent with Content-Type: {JSON} (this request has {what})",
        ErrorCode.UNSUPPORTED_MEDIA_TYPE,
    )


# A refusal's HTTP status; everything the engine cannot do just now is a 503.
_REFUSED_STATUS: dict[str, int] = {
    ErrorCode.OVERLOADED: 429, ErrorCode.UNKNOWN_VOICE: 400, ErrorCode.UNKNOWN_SPEAKER: 400, ErrorCode.NO_VOICE: 400,
    ErrorCode.INVALID_LEXICON: 400, ErrorCode.INVALID_SSML: 400,
}
_REFUSED_PARAM: dict[str, str] = {ErrorCode.INVALID_LEXICON: "lexicon", ErrorCode.INVALID_SSML: "input"}
# Refusals of what ``voice`` named (its speaker included): ``param`` is "voice".
_VOICE_CODES = (ErrorCode.UNKNOWN_VOICE, ErrorCode.UNKNOWN_SPEAKER, ErrorCode.NO_VOICE)


class OpenAIDoor(Door):
    name = "http"

    def __init__(self, host: Host) -> None:
        super().__init__(host)
        self.voice_map: Mapping[str, str] = {}

    def check(self, engine: Engine) -> None:
        self.voice_map = parse_map(self.config.openai_voices)
        check_map(engine, self.voice_map)

    def routes(self) -> list[BaseRoute]:
        return [Route("/v1/audio/speech", self.endpoint, methods=["POST"])]

    async def endpoint(self, request: Request) -> Response:
        """A request with the key, as a connection through the gate (``_Admitted``)."""
        if not auth.presents_valid_key(self.config.auth, request.headers, request.query_params):
            return openai_error(401, auth.HTTP_KEY_REFUSED, ErrorCode.UNAUTHORIZED)
        return _Admitted(self, request)

    async def speech(self, request: Request) -> Response:
        """An admitted request's answer."""
        defaults = self.host.defaults()
        if defaults is None:
            return openai_error(503, "the engine is loading", ErrorCode.NOT_READY)
        ids = {"request": secrets.token_hex(6)}
        asked = await self._request(request, ids)
        if isinstance(asked, Response):
            return asked
        stream_format, media_type = FORMATS[asked.fmt]
        if asked.sse:
            media_type = SSE
        settings = StreamSettings(
            voice=asked.voice, format=stream_format, sample_rate=asked.rate, chunk_ms=CHUNK_MS, speed=asked.speed,
            speaker=asked.speaker, lexicon=asked.lexicon, text_format=asked.text_format,
        )
        try:
            # Its text is bounded by the request's own limit (MAX_INPUT_CHARS, parse_request).
            speech = self.open_utterance(asked.text, True, settings, ids)
        except Refused as e:
            status = _REFUSED_STATUS.get(e.code, 503)
            param = "voice" if e.code in _VOICE_CODES else _REFUSED_PARAM.get(e.code)
            return openai_error(status, e.message, e.code, param, e.retry_after_ms or None)
        return SpeechResponse(self, speech, asked, media_type, ids)

    async def _request(self, request: Request, ids: dict[str, str]) -> OpenAIRequest | Response:
        """The request read and checked, its voice named for the engine; or the response
        that refuses it (recorded)."""
        body = Body(request, MAX_BODY_BYTES)
        # A form (curl -d), text or multipart body is not what an OpenAI client sends: say
        # what to send rather than guess. Dropping a body this route would take keeps the
        # connection; anything larger is not read, and the connection closes.
        if (sent := declared_media_type(request)) != JSON:
            self.refused(ErrorCode.UNSUPPORTED_MEDIA_TYPE, ids)
            return await body.settle(unsupported_media_type(sent), MAX_BODY_BYTES)
        try:
            raw = await read_body(body)
        except TooLarge:
            self.refused(ErrorCode.REQUEST_TOO_LARGE, ids)
            return await body.settle(too_large(), 0)
        if raw is None:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        try:
            asked = parse_request(orjson.loads(raw))
            engine = self.pipeline.engine()
            voice, speaker = resolve(engine, self.voice_map, asked.voice, self.defaults().voice)
            return replace(asked, voice=voice, speaker=speaker)
        except orjson.JSONDecodeError:
            self.refused(ErrorCode.INVALID_JSON, ids)
            return openai_error(400, "the body must be a JSON object", ErrorCode.INVALID_JSON)
        except Invalid as e:
            self.refused(e.code, ids)
            return openai_error(400, e.message, e.code, e.param)
        except EngineError as e:
            self.refused(e.code, ids)
            return openai_error(503, e.message, e.code)


# A refusal at the gate: the server's load, or this client's, is retried after a second.
_GATE_STATUS: dict[str, int] = {ErrorCode.AT_CAPACITY: 429, ErrorCode.CLIENT_AT_CAPACITY: 429}


class _Admitted(Response):
    """A request through the gate, as every door's connections go: refused there (429 at
    capacity, this client's or the server's; 503 loading or shutting down), or holding a
    connection slot, and one of its client's, from before its body is read until its
    response has been sent, however it ends."""

    def __init__(self, door: OpenAIDoor, request: Request) -> None:
        super().__init__()
        self.door = door
        self.request = request

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        door, request = self.door, self.request
        # Its address, or the one a trusted proxy forwards (uvicorn's proxy headers).
        client = request.client.host if request.client else None
        refusal = door.admit(client)
        if refusal is not None:
            status = _GATE_STATUS.get(refusal.code, 503)
            await openai_error(status, refusal.message, refusal.code, retry_after_ms=1000)(scope, receive, send)
            return
        # At the drain's deadline its utterance is failed, which ends the body: nothing more to do.
        async with door.connection(self, _ended_already, client):
            await (await door.speech(request))(scope, receive, send)


async def _ended_already() -> None:
    pass


class SpeechResponse(StreamingResponse):
    """A speech as a streamed body: its frames' bytes (after a header, for WAV), each
    piece of body sent under the stall rule every door shares (``Sender``): a reader that
    stops reading would otherwise hold its utterance's slot for ever (TCP's buffers fill,
    and then the send waits as long as it does). However the response ends before done
    (the client went away, the server stops), the utterance ends as disconnected:
    ``end`` counts only its first call."""

    def __init__(
        self, door: OpenAIDoor, speech: Speech, asked: OpenAIRequest, media_type: str, ids: dict[str, str],
    ) -> None:
        headers = {"X-Voxwire-Cached": "1" if speech.cached else "0"}
        if speech.ignored:  # what of its SSML this server does not read, said once
            # A header is Latin-1; an element's name may be any XML name.
            headers["X-Voxwire-SSML-Ignored"] = ", ".join(speech.ignored).encode("ascii", "backslashreplace").decode()
        wav = wav_header(asked.rate) if asked.fmt == "wav" else b""
        body = audio(speech, wav)
        if asked.sse:
            # The audio's own type, as the body would have had it; and no proxy buffering
            # of events (nginx holds back a text/event-stream otherwise).
            headers |= {"X-Audio-Media-Type": FORMATS[asked.fmt][1], "Cache-Control": "no-cache",
                        "X-Accel-Buffering": "no"}
            body = events(speech, wav)
        super().__init__(body, media_type=media_type, headers=headers)
        self.door = door
        self.speech = speech
        self.ids = ids

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        sender = self.door.sender(send, self._stalled)

        async def bounded(message: Message) -> None:
            if message["type"] == "http.response.body":
                await sender.send(message, self.speech)
            else:
                await send(message)

        try:
            await super().__call__(scope, receive, bounded)
        finally:
            self.speech.end("disconnected")

    def _stalled(self) -> None:
        self.speech.end_stalled("not_reading")
        stall = self.door.limits.stall_timeout_seconds
        log.info("the client took none of its audio for %g s; the response is cut", stall, extra=self.ids)
