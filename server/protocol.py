"""Protocol v1: parsing and validating client messages, building server messages.

Pure functions and dataclasses, no I/O: the session decides what to do with a message,
the endpoint moves bytes. Every way a message can be wrong maps to a ``ProtocolError``
with a stable code; nothing else escapes ``parse``. docs/protocol.md is the reference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any, Literal, overload

import msgpack
import orjson

from voxwire.engine.errors import CodedError, ErrorCode, quoted
from voxwire.engine.text.lexicon import Lexicon, LexiconError, from_mapping
from voxwire.engine.text.segment import SegmenterLimits
from voxwire.server.audio import (
    FORMATS,
    MAX_CHUNK_MS,
    MAX_SAMPLE_RATE,
    MIN_CHUNK_MS,
    MIN_SAMPLE_RATE,
    FormatError,
    stream_rate,
)

PROTOCOL_VERSION = 1
MIN_SPEED, MAX_SPEED = 0.5, 2.0
MAX_FIRST_CLAUSE_WORDS = 40
MAX_CTX_CHARS = 128
MAX_SPEAKER_CHARS = 128
MAX_LEXICON_ENTRIES = 500
"""A request's own lexicon entries: a message stays well under the size limit; a longer
lexicon belongs in a file (``--lexicon``)."""


class ProtocolError(CodedError):
    """A client message refused, with the utterance (``ctx``) it concerns, if any, and
    any further fields the error message carries (``retry_after_ms``)."""

    def __init__(self, code: str, message: str, ctx: str | None = None, **extra: Any) -> None:
        super().__init__(code, message)
        self.ctx = ctx
        self.extra = extra
        self.message_type: str | None = None
        """The ``type`` of the message refused (set by ``parse`` where it knew it, and
        by the session for a dropped ``progress``): an error about a message that cannot
        end an utterance (``progress``) is never terminal."""


@dataclass(frozen=True)
class StreamSettings:
    """How an utterance is spoken and delivered. Session defaults, overridable per speak."""

    voice: str
    speaker: str | None = None
    """A multi-speaker voice's speaker, by name or by its id written in decimal; None:
    the voice's default speaker. Checked against the voice by the pipeline."""
    format: str = "pcm_s16le"
    sample_rate: int = 24000
    chunk_ms: int = 200
    speed: float = 1.0
    timestamps: bool = False
    fast_start: bool | None = None
    """CosyVoice2's sooner first chunk (a trimmed voice prompt); None: the voice's default,
    else the server's. Engines without that choice ignore it."""
    first_clause_words: int = SegmenterLimits.first_clause_words
    """Streamed text: the first audio may start at a clause boundary once this many words
    precede it, before the first sentence has ended; 0 waits for the sentence's end."""
    lexicon: Lexicon | None = None
    """The client's own pronunciation entries (engine/text/lexicon.py); the pipeline
    layers them over the server's (``--lexicon``) for each utterance."""
    text_format: str = "text"
    """``text``, or ``ssml``: the text is an SSML document (engine/text/ssml.py), which
    comes whole."""

    def to_dict(self) -> dict[str, Any]:
        """The settings as a client is told them (``ready.defaults``, ``configured``,
        ``started``): ``sample_rate`` is the rate the stream will be sent at, which a codec
        with a rate of its own decides (Opus: 48 kHz, whatever was asked). The rate asked
        is kept, not replaced: a later switch to PCM is spoken at it again."""
        shown = {f.name: getattr(self, f.name) for f in fields(self)}
        shown["lexicon"] = len(self.lexicon) if self.lexicon else 0  # a count: the client has the entries
        try:
            shown["sample_rate"] = stream_rate(self.format, self.sample_rate)
        except FormatError:
            pass  # refused when an utterance asks for it (the pipeline says why); shown as asked
        return shown


SETTING_NAMES = frozenset(f.name for f in fields(StreamSettings))


@dataclass(frozen=True)
class Configure:
    settings: dict[str, Any]


@dataclass(frozen=True)
class Speak:
    ctx: str | None
    text: str
    final: bool
    settings: dict[str, Any]


@dataclass(frozen=True)
class Flush:
    ctx: str


@dataclass(frozen=True)
class Cancel:
    ctx: str


@dataclass(frozen=True)
class Progress:
    """The client has played ``played`` samples of ``ctx`` (a running total)."""

    ctx: str
    played: int


MAX_PLAYED = 2**53  # any exact integer JSON carries; far beyond any utterance

Message = Configure | Speak | Flush | Cancel | Progress


def parse(data: str | bytes) -> Message:
    """Decode and validate one client message (JSON text or msgpack binary)."""
    obj = _decode(data)
    if not isinstance(obj, dict):
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, "a message must be an object with a \"type\" field")
    kind = obj.get("type")
    if not isinstance(kind, str):
        raise ProtocolError(ErrorCode.MISSING_FIELD, "the message has no \"type\" field")
    ctx = obj.get("ctx") if isinstance(obj.get("ctx"), str) else None
    try:
        if kind == "config":
            _only(obj, {"type"} | SETTING_NAMES)
            return Configure(settings=validate_settings(obj))
        if kind == "speak":
            _only(obj, {"type", "ctx", "text", "final"} | SETTING_NAMES)
            text = obj.get("text", "")
            if not isinstance(text, str):
                raise ProtocolError(ErrorCode.INVALID_FIELD, "\"text\" must be a string")
            final = obj.get("final", True)
            if not isinstance(final, bool):
                raise ProtocolError(ErrorCode.INVALID_FIELD, "\"final\" must be true or false")
            speak_ctx = _ctx(obj, required=False)
            if speak_ctx is None and not final:
                raise ProtocolError(
                    ErrorCode.MISSING_FIELD, "streamed text (\"final\": false) needs a \"ctx\" to continue"
                )
            return Speak(ctx=speak_ctx, text=text, final=final, settings=validate_settings(obj))
        if kind == "flush":
            _only(obj, {"type", "ctx"})
            return Flush(ctx=_ctx(obj, required=True))
        if kind == "cancel":
            _only(obj, {"type", "ctx"})
            return Cancel(ctx=_ctx(obj, required=True))
        if kind == "progress":
            _only(obj, {"type", "ctx", "played"})
            played = obj.get("played")
            if played is None:
                raise ProtocolError(ErrorCode.MISSING_FIELD, "a 'progress' message needs \"played\"")
            if type(played) is not int or not 0 <= played <= MAX_PLAYED:
                raise ProtocolError(ErrorCode.INVALID_FIELD, "\"played\" must be a whole number of samples, 0 or more")
            return Progress(ctx=_ctx(obj, required=True), played=played)
    except ProtocolError as e:
        e.ctx = e.ctx or ctx
        e.message_type = kind
        raise
    raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"unknown message type {quoted(str(kind))}", ctx)


def _decode(data: str | bytes) -> Any:
    if isinstance(data, str):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError as e:
            # The position helps a person find the mistake; the parser's own words do not.
            raise ProtocolError(
                ErrorCode.INVALID_JSON, f"the message is not valid JSON (line {e.lineno}, column {e.colno})"
            ) from None
    try:
        # Any key type decodes, so a map with a non-string key is reported as the wrong
        # message shape (invalid_message) rather than as undecodable bytes.
        obj = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception:  # msgpack raises several unrelated types for bad input
        raise ProtocolError(ErrorCode.INVALID_MSGPACK, "the binary message is not valid msgpack") from None
    if isinstance(obj, dict) and not all(isinstance(k, str) for k in obj):
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, "every key of a message must be a string")
    return obj


def _only(obj: dict[str, Any], allowed: set[str] | frozenset[str]) -> None:
    extra = sorted(k for k in obj if k not in allowed)
    if extra:
        raise ProtocolError(
            ErrorCode.UNKNOWN_FIELD, f"unknown field {quoted(extra[0])} in a {quoted(str(obj['type']))} message"
        )


@overload
def _ctx(obj: dict[str, Any], required: Literal[True]) -> str: ...
@overload
def _ctx(obj: dict[str, Any], required: bool) -> str | None: ...
def _ctx(obj: dict[str, Any], required: bool) -> str | None:
    ctx = obj.get("ctx")
    if ctx is None:
        if required:
            raise ProtocolError(ErrorCode.MISSING_FIELD, f"a {obj['type']!r} message needs a \"ctx\"")
        return None
    if not isinstance(ctx, str) or not 0 < len(ctx) <= MAX_CTX_CHARS or not ctx.isprintable():
        raise ProtocolError(
            ErrorCode.INVALID_FIELD, f"\"ctx\" must be a printable string of 1 to {MAX_CTX_CHARS} characters"
        )
    return ctx


def validate_settings(obj: dict[str, Any]) -> dict[str, Any]:
    """The stream settings present in a message, checked. The voice and the speaker are
    checked later, against the engine, by the pipeline."""
    out: dict[str, Any] = {}
    if "voice" in obj:
        if not isinstance(obj["voice"], str) or not obj["voice"]:
            raise ProtocolError(ErrorCode.INVALID_FIELD, "\"voice\" must be a non-empty string")
        out["voice"] = obj["voice"]
    if "speaker" in obj:
        out["speaker"] = _speaker(obj["speaker"])
    if "format" in obj:
        if obj["format"] not in FORMATS:
            raise ProtocolError(ErrorCode.INVALID_FORMAT, f"\"format\" must be one of {', '.join(FORMATS)}")
        out["format"] = obj["format"]
    if "sample_rate" in obj:
        rate = obj["sample_rate"]
        if type(rate) is not int or not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:
            raise ProtocolError(
                ErrorCode.INVALID_SAMPLE_RATE,
                f"\"sample_rate\" must be an integer from {MIN_SAMPLE_RATE} to {MAX_SAMPLE_RATE}",
            )
        out["sample_rate"] = rate
    if "chunk_ms" in obj:
        chunk = obj["chunk_ms"]
        if type(chunk) is not int or not MIN_CHUNK_MS <= chunk <= MAX_CHUNK_MS:
            raise ProtocolError(
                ErrorCode.INVALID_CHUNK_MS, f"\"chunk_ms\" must be an integer from {MIN_CHUNK_MS} to {MAX_CHUNK_MS}"
            )
        out["chunk_ms"] = chunk
    if "speed" in obj:
        speed = obj["speed"]
        if type(speed) not in (int, float) or not math.isfinite(speed) or not MIN_SPEED <= speed <= MAX_SPEED:
            raise ProtocolError(ErrorCode.INVALID_SPEED, f"\"speed\" must be a number from {MIN_SPEED} to {MAX_SPEED}")
        out["speed"] = float(speed)
    if "timestamps" in obj:
        if not isinstance(obj["timestamps"], bool):
            raise ProtocolError(ErrorCode.INVALID_FIELD, "\"timestamps\" must be true or false")
        out["timestamps"] = obj["timestamps"]
    if "fast_start" in obj:
        # null is a choice too: back to the voice's (or the server's) default for one
        # utterance of a session whose config chose otherwise.
        if obj["fast_start"] is not None and not isinstance(obj["fast_start"], bool):
            raise ProtocolError(ErrorCode.INVALID_FIELD, "\"fast_start\" must be true, false or null")
        out["fast_start"] = obj["fast_start"]
    if "first_clause_words" in obj:
        words = obj["first_clause_words"]
        if type(words) is not int or not 0 <= words <= MAX_FIRST_CLAUSE_WORDS:
            raise ProtocolError(
                ErrorCode.INVALID_FIELD, f"\"first_clause_words\" must be an integer from 0 (off) to {MAX_FIRST_CLAUSE_WORDS}"
            )
        out["first_clause_words"] = words
    if "text_format" in obj:
        out["text_format"] = text_format_setting(obj["text_format"])
    if "lexicon" in obj:
        out["lexicon"] = lexicon_setting(obj["lexicon"])
    return out


TEXT_FORMATS = ("text", "ssml")


def text_format_setting(value: Any) -> str:
    """``text_format``: plain text, or an SSML document; null for plain text."""
    if value is None:
        return "text"
    if value not in TEXT_FORMATS:
        raise ProtocolError(ErrorCode.INVALID_FIELD, "\"text_format\" must be \"text\" or \"ssml\"")
    return str(value)


def lexicon_setting(value: Any) -> Lexicon | None:
    """A request's lexicon: ``{"word or phrase": "/phonemes/" or "respelling"}``, at most
    ``MAX_LEXICON_ENTRIES`` entries; null or {} for none. Every door that takes one reads
    it here."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ProtocolError(ErrorCode.INVALID_LEXICON, "\"lexicon\" must be an object of \"word\": \"/phonemes/\" or "
                                                       "\"respelling\" entries, or null")
    try:
        lexicon = from_mapping(value, limit=MAX_LEXICON_ENTRIES)
    except LexiconError as e:
        raise ProtocolError(ErrorCode.INVALID_LEXICON, str(e)) from None
    return lexicon or None


def _speaker(value: Any) -> str | None:
    """A speaker as the settings keep it: a name, an id as its decimal digits (a speaker's
    id may be given as a number), or None (null: the voice's default speaker)."""
    if value is None:
        return None
    if type(value) is int and value >= 0:
        return str(value)
    if isinstance(value, str) and 0 < len(value) <= MAX_SPEAKER_CHARS:
        return value
    raise ProtocolError(
        ErrorCode.INVALID_FIELD,
        f"\"speaker\" must be a speaker's name (1 to {MAX_SPEAKER_CHARS} characters), its id (an integer, 0 or more), "
        "or null",
    )


def with_overrides(settings: StreamSettings, overrides: dict[str, Any]) -> StreamSettings:
    return replace(settings, **overrides) if overrides else settings


# -- server -> client -----------------------------------------------------------------


def event(kind: str, **body: Any) -> str:
    """A JSON control message."""
    return orjson.dumps({"type": kind, **body}, option=orjson.OPT_SERIALIZE_NUMPY).decode()


def error(code: str, message: str, ctx: str | None = None, **extra: Any) -> str:
    body: dict[str, Any] = {"code": code, "message": message, **extra}
    if ctx is not None:
        body["ctx"] = ctx
    return event("error", **body)


def audio_frame(ctx: str, seq: int, offset: int, samples: int, data: bytes) -> bytes:
    """A binary audio frame: a msgpack map, so the PCM travels without base64."""
    return msgpack.packb(
        {"type": "audio", "ctx": ctx, "seq": seq, "offset": offset, "samples": samples, "audio": data},
        use_bin_type=True,
    )
