"""Every error code the server gives, and the one base of every error a client is told about."""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class ErrorCode(StrEnum):
    """The stable, machine-readable codes, one member each, named as they are written.

    A member is its string (``ErrorCode.UNKNOWN_VOICE == "unknown_voice"``), so JSON,
    msgpack, Wyoming events and metric labels carry it as the plain code. docs/protocol.md
    lists them all, with their causes; tests/engine/test_error_codes.py keeps the two, and
    every code written in the source, the same."""

    # Protocol v1 (the socket): a message refused.
    INVALID_JSON = "invalid_json"
    INVALID_MSGPACK = "invalid_msgpack"
    INVALID_MESSAGE = "invalid_message"
    MISSING_FIELD = "missing_field"
    UNKNOWN_TYPE = "unknown_type"
    UNKNOWN_FIELD = "unknown_field"
    INVALID_FIELD = "invalid_field"
    UNKNOWN_CTX = "unknown_ctx"
    CTX_FINISHED = "ctx_finished"
    RATE_LIMITED = "rate_limited"
    # Stream settings, on every door.
    INVALID_FORMAT = "invalid_format"
    INVALID_SAMPLE_RATE = "invalid_sample_rate"
    INVALID_CHUNK_MS = "invalid_chunk_ms"
    INVALID_SPEED = "invalid_speed"
    UNSUPPORTED_SAMPLE_RATE = "unsupported_sample_rate"
    TIMESTAMPS_UNSUPPORTED = "timestamps_unsupported"
    # An utterance refused, or ended.
    UNKNOWN_VOICE = "unknown_voice"
    UNKNOWN_SPEAKER = "unknown_speaker"
    INVALID_VOICE_BLEND = "invalid_voice_blend"
    INVALID_LEXICON = "invalid_lexicon"
    INVALID_SSML = "invalid_ssml"
    NO_VOICE = "no_voice"
    TEXT_TOO_LONG = "text_too_long"
    SESSION_TEXT_LIMIT = "session_text_limit"
    TOO_MANY_UTTERANCES = "too_many_utterances"
    OVERLOADED = "overloaded"
    IDLE_TIMEOUT = "idle_timeout"
    LISTENER_STALLED = "listener_stalled"
    UTTERANCE_TOO_LONG = "utterance_too_long"
    OVER_MEMORY_BUDGET = "over_memory_budget"
    # The server's and the engine's state.
    AT_CAPACITY = "at_capacity"
    CLIENT_AT_CAPACITY = "client_at_capacity"
    NOT_READY = "not_ready"
    SHUTTING_DOWN = "shutting_down"
    ENGINE_ERROR = "engine_error"
    VOICE_DOWNLOAD_FAILED = "voice_download_failed"
    ENGINE_TIMEOUT = "engine_timeout"
    ENGINE_RESTARTED = "engine_restarted"
    BAD_SPEED = "bad_speed"
    # Loading an engine (the server does not start).
    BAD_CONFIG = "bad_config"
    MODEL_MISSING = "model_missing"
    MODEL_INVALID = "model_invalid"
    # HTTP routes.
    UNAUTHORIZED = "unauthorized"
    NOT_FOUND = "not_found"
    INVALID_VOICE = "invalid_voice"
    UNSUPPORTED_SPEED = "unsupported_speed"
    INVALID_INSTRUCTIONS = "invalid_instructions"
    INVALID_STREAM_FORMAT = "invalid_stream_format"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    REQUEST_TOO_LARGE = "request_too_large"
    # Registering a voice (POST /v1/voices).
    BAD_REQUEST = "bad_request"
    BAD_AUDIO = "bad_audio"
    AUDIO_TOO_SHORT = "audio_too_short"
    AUDIO_TOO_LONG = "audio_too_long"
    TRANSCRIPT_MISSING = "transcript_missing"
    TRANSCRIPT_TOO_LONG = "transcript_too_long"
    VOICE_EXISTS = "voice_exists"
    UPLOAD_TOO_LARGE = "upload_too_large"
    VOICE_REGISTRATION_UNSUPPORTED = "voice_registration_unsupported"
    # Wyoming.
    INVALID_EVENT = "invalid_event"
    EVENT_TOO_LARGE = "event_too_large"
    UNKNOWN_EVENT = "unknown_event"
    NO_STREAM = "no_stream"
    BUSY = "busy"
    UNSUPPORTED_TEXT_FORMAT = "unsupported_text_format"


class CodedError(Exception):
    """A failure with a stable machine-readable ``code`` and a human ``message``.

    Each layer extends it with the fields its own errors carry: the engine's
    ``EngineError`` adds nothing; the server's protocol errors add the utterance id they
    concern. Whoever reports one sends ``code`` and ``message`` as they are.

    Every one pickles whole, its own fields included: Ray carries an exception from a
    replica to the process that called it that way (server/ray_app.py)."""

    def __init__(self, code: str, message: str) -> None:
        # Typed ``str``: an ``ErrorCode`` member is one. tests/engine/test_error_codes.py
        # finds any code written as a string that is not a member.
        super().__init__(message)
        self.code = code
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:
        # Exception's own reduce calls ``cls(*self.args)``, and args holds the message
        # alone: ``EngineError(message)`` fails (no code) and a subclass whose arguments
        # come in another order (``Invalid(message, code, param)``) would mix them up. So
        # no constructor runs: the instance is rebuilt from its args and its fields as
        # they are, whatever the subclass's signature.
        return (_rebuilt, (type(self), self.args), self.__dict__)


def _rebuilt(cls: type[CodedError], args: tuple[Any, ...]) -> CodedError:
    """An instance of ``cls`` with ``args``, its fields still to come (pickle sets them)."""
    return cls.__new__(cls, *args)


QUOTED_CHARS = 64


def quoted(value: str, limit: int = QUOTED_CHARS) -> str:
    """A client's string as an error message names it: quoted, and cut at ``limit``
    characters. Echoed whole, a 250 KB voice name made each error (and log line) as long."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}… ({len(value)} characters)"
