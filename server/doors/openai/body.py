"""The body of a speech response: the audio itself, or the audio inside OpenAI's
server-sent events (``stream_format: "sse"``), from a speech's events."""

from __future__ import annotations

import base64
import struct
from collections.abc import AsyncIterator

import orjson

from voxwire.server.doors.base import utterance_events
from voxwire.server.framing import AudioFrame, DoneEvent, FailedEvent, Figures
from voxwire.server.speech import Speech


def wav_header(rate: int) -> bytes:
    """A 16-bit mono WAV header for a stream of unknown length (sizes 0xFFFFFFFF), which
    players read as "until the data ends"."""
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate * 2, 2, 16)
    return b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt + b"data" + struct.pack(
        "<I", 0xFFFFFFFF
    )


class StreamFailed(Exception):
    """An utterance failed after its body began; raised to abort the response."""


async def audio(speech: Speech, header: bytes) -> AsyncIterator[bytes]:
    if header:
        yield header
    async for event in utterance_events(speech):
        if isinstance(event, AudioFrame):
            if event.data:  # a codec may hold a whole chunk back (less than one frame)
                yield event.data
        elif isinstance(event, FailedEvent):
            # The status line is gone already: the body ends without its last chunk,
            # which every HTTP client reports as an error; the log has the cause.
            raise StreamFailed(f"{event.code}: {event.message}")


def sse_event(event: dict[str, object]) -> bytes:
    return b"data: " + orjson.dumps(event) + b"\n\n"


def usage(chars: int, figures: Figures) -> dict[str, object]:
    """OpenAI's ``usage``, in what this server counts, having no tokens: the input's
    characters, and the audio's milliseconds."""
    audio_ms = round(figures.audio_ms)
    return {"input_tokens": chars, "output_tokens": audio_ms, "total_tokens": chars + audio_ms}


async def events(speech: Speech, header: bytes) -> AsyncIterator[bytes]:
    """The speech as OpenAI's events: ``speech.audio.delta`` with each piece of the
    body ``audio`` would send, in base64, then ``speech.audio.done`` with the usage (and
    the figures the socket's ``done`` carries, under ``voxwire``)."""
    if header:
        yield sse_event({"type": "speech.audio.delta", "audio": base64.b64encode(header).decode()})
    async for event in utterance_events(speech):
        if isinstance(event, AudioFrame):
            if event.data:
                yield sse_event({"type": "speech.audio.delta", "audio": base64.b64encode(event.data).decode()})
        elif isinstance(event, DoneEvent):
            yield sse_event({"type": "speech.audio.done", "usage": usage(speech.text_chars, event.figures),
                             "voxwire": event.figures.to_dict()})
        elif isinstance(event, FailedEvent):
            # Said in an event a client can read, then the body is cut as ``audio``'s is,
            # so that a client reading only the deltas sees a failed request too.
            error = {"message": event.message, "type": "server_error", "param": None, "code": event.code}
            yield sse_event({"type": "error", "error": error})
            raise StreamFailed(f"{event.code}: {event.message}")
