"""The Wyoming wire format: events read with bounds, and what this server says in them.

Wyoming is a JSON-lines-plus-binary protocol over TCP (the ``wyoming`` package on PyPI):
a JSON header line, then ``data_length`` bytes of JSON merged into its data, then
``payload_length`` bytes. Events are written with that package's own classes; they are
read here (``read_event``), because its reader believes the lengths a header claims.
``info`` answers ``describe``; ``text_of``, ``voice_of`` and ``speaker_of`` read a
request's fields.
"""

from __future__ import annotations

import asyncio
from importlib import metadata

import orjson
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Attribution, Info, TtsProgram, TtsVoice, TtsVoiceSpeaker

from voxwire.engine.base import Engine
from voxwire.engine.errors import CodedError, ErrorCode

WIDTH = 2  # bytes per sample: 16-bit PCM, the format every Wyoming client plays
CHANNELS = 1


class BadField(ValueError):
    """An event whose fields have the wrong shape: answered, and the connection goes on."""


class BadEvent(CodedError):
    """Input that cannot be read as a Wyoming event: the connection cannot go on."""


# -- reading events, with bounds -----------------------------------------------------------


async def read_event(reader: asyncio.StreamReader, max_bytes: int) -> Event | None:
    """The next event, or None at the end of the stream. Raises ``BadEvent``.

    The format is the ``wyoming`` package's (a JSON header line, then ``data_length``
    bytes of JSON merged into its data, then ``payload_length`` bytes), but its own
    reader believes the lengths a header claims: a header saying 2 GB makes it wait for
    2 GB. Here an event is at most ``max_bytes`` in all, and the header line is bounded by
    the reader's limit (set to the same when the connection is accepted).
    """
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as e:
        if not e.partial.strip():
            return None
        raise BadEvent(ErrorCode.INVALID_EVENT, "the connection ended inside an event header") from None
    except asyncio.LimitOverrunError:
        raise BadEvent(ErrorCode.EVENT_TOO_LARGE, f"an event header is limited to {max_bytes} bytes") from None
    try:
        header = orjson.loads(line)
    except orjson.JSONDecodeError:
        raise BadEvent(ErrorCode.INVALID_EVENT, "an event header must be one line of JSON") from None
    if not isinstance(header, dict) or not isinstance(header.get("type"), str):
        raise BadEvent(ErrorCode.INVALID_EVENT, "an event header must be a JSON object with a string 'type'")
    data = header.get("data") or {}
    if not isinstance(data, dict):
        raise BadEvent(ErrorCode.INVALID_EVENT, "an event's 'data' must be a JSON object")
    data_length, payload_length = _length(header, "data_length"), _length(header, "payload_length")
    if len(line) + data_length + payload_length > max_bytes:
        raise BadEvent(ErrorCode.EVENT_TOO_LARGE, f"an event is limited to {max_bytes} bytes; this one claims more")
    try:
        if data_length:
            extra = orjson.loads(await reader.readexactly(data_length))
            if not isinstance(extra, dict):
                raise BadEvent(ErrorCode.INVALID_EVENT, "an event's data must be a JSON object")
            data.update(extra)
        payload = await reader.readexactly(payload_length) if payload_length else None
    except asyncio.IncompleteReadError:
        raise BadEvent(ErrorCode.INVALID_EVENT, "the connection ended inside an event") from None
    except orjson.JSONDecodeError:
        raise BadEvent(ErrorCode.INVALID_EVENT, "an event's data must be JSON") from None
    return Event(type=header["type"], data=data, payload=payload)


def _length(header: dict[str, object], name: str) -> int:
    value = header.get(name)
    if value is None:
        return 0
    # true is an int to Python, not a length to a client.
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadEvent(ErrorCode.INVALID_EVENT, f"'{name}' must be a non-negative integer")
    return value


# -- what the door says ------------------------------------------------------------------------


def _version() -> str | None:
    try:
        return metadata.version("voxwire")
    except metadata.PackageNotFoundError:
        return None


def info(engine: Engine) -> Info:
    """``info``: one TTS program, with the engine's voices by id and language, and a
    multi-speaker voice's speakers by name (as wyoming-piper lists them; none for a
    voice with one speaker)."""
    attribution = Attribution(name="Voxwire", url="")
    voices = [
        TtsVoice(
            name=v.id, attribution=attribution, installed=True, description=v.name or v.id, version=None,
            languages=[v.language] if v.language else [],
            speakers=[TtsVoiceSpeaker(name=speaker) for speaker in v.speakers] or None,
        )
        for v in engine.voices()
    ]
    program = TtsProgram(
        name="voxwire", attribution=attribution, installed=True,
        description=f"Voxwire streaming text-to-speech ({engine.name} engine)", version=_version(),
        voices=voices, supports_synthesize_streaming=True,
    )
    return Info(tts=[program])


def error(code: str, message: str) -> Event:
    return Error(text=message, code=code).event()


def text_of(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError("text must be a string")
    return value


def voice_of(data: dict[str, object]) -> str:
    """The voice id a ``synthesize`` or ``synthesize-start`` asks for, "" for the default
    (no ``voice``, or one without a ``name``). Raises ``BadField``: a voice of the wrong
    shape is a mistake to be told, not a request for the default voice."""
    voice = data.get("voice")
    if voice is None:
        return ""
    if not isinstance(voice, dict):
        example = orjson.dumps({"name": voice[:40] if isinstance(voice, str) else "a voice id from info"}).decode()
        raise BadField(f"'voice' must be an object such as {example}, not {_kind(voice)}")
    name = voice.get("name")
    if name is None:
        return ""
    if not isinstance(name, str):
        raise BadField(f"'voice.name' must be a voice id from info (a string), not {_kind(name)}")
    return name


def speaker_of(data: dict[str, object]) -> str | None:
    """The speaker a ``synthesize`` or ``synthesize-start`` asks for (``voice.speaker``, a
    name from ``info``, or a speaker's id), None for the voice's default (no speaker, or
    an empty one). Call after ``voice_of``, which checks that ``voice`` is an object.
    Raises ``BadField``."""
    voice = data.get("voice")
    speaker = voice.get("speaker") if isinstance(voice, dict) else None
    if speaker is None or speaker == "":
        return None
    if isinstance(speaker, int) and not isinstance(speaker, bool):
        if speaker < 0:
            raise BadField("'voice.speaker' as a number must be a speaker's number from 0 up")
        return str(speaker)
    if not isinstance(speaker, str):
        raise BadField(f"'voice.speaker' must be a speaker's name from info (or its number), not {_kind(speaker)}")
    return speaker


def _kind(value: object) -> str:
    """What a JSON value is, as a message names it."""
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, (int, float)):
        return "a number"
    names: dict[type, str] = {str: "a string", list: "a list", dict: "an object"}
    return names.get(type(value), "null")
