"""``/v1/voices``: list voices, and register a cloned voice from reference audio.

Uploads are decoded with libsndfile (soundfile: WAV, FLAC, OGG, MP3 and more) on a thread
of their own, then handed to the engine on its own thread; engines that cannot clone say so
(501). Decoding stops at what a reference could need: 16 MiB of MP3 holds hours of audio,
gigabytes once decoded. A registration may carry the voice's default ``fast_start``
(CosyVoice2's sooner first chunk), which a request that does not choose then gets.
"""

from __future__ import annotations

import asyncio
import io
import logging

import numpy as np
import soundfile
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from voxwire.engine.base import Engine, EngineError
from voxwire.engine.errors import ErrorCode
from voxwire.engine.worker import Worker
from voxwire.server.bodies import Body, TooLarge
from voxwire.server.cache import ResultCache

log = logging.getLogger(__name__)

MAX_UPLOAD_BYTES = 16 * 1024 * 1024
MAX_TRANSCRIPT_CHARS = 2000
MAX_DECODED_SECONDS = 60
"""Twice the longest reference an engine takes (CosyVoice2: 30 s): the engine, not this,
says how long a reference may be; past it, decoding would only cost time and memory."""
MAX_DECODED_SAMPLES = MAX_DECODED_SECONDS * 192_000 * 2
"""60 s of 192 kHz stereo (88 MiB as float32): the most decoded, whatever the rate and channels."""

# Keyed by str: an ErrorCode member is one, and ``error`` takes any CodedError's code.
_STATUS: dict[str, int] = {
    ErrorCode.VOICE_REGISTRATION_UNSUPPORTED: 501,
    ErrorCode.NOT_READY: 503,
    ErrorCode.SHUTTING_DOWN: 503,
    ErrorCode.ENGINE_RESTARTED: 503,
    ErrorCode.ENGINE_TIMEOUT: 503,
    ErrorCode.UPLOAD_TOO_LARGE: 413,
    ErrorCode.VOICE_EXISTS: 409,
}


def error(code: str, message: str, status: int | None = None) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status or _STATUS.get(code, 400))


UNKNOWN_FRAMES = 2**63 - 1
"""libsndfile's frame count (SF_COUNT_MAX) for a stream whose header does not give its
length: a streamed FLAC, whose STREAMINFO says 0 samples (Voxwire's own FLAC output)."""
STREAMED_WAV_SIZES = (0, 0xFFFFFFFF)
"""What a WAV written as a stream puts in its data chunk's size, the length not yet known
(Voxwire's own WAV output writes 0xFFFFFFFF): libsndfile reads 0 as no samples at all."""


def decode_audio(data: bytes) -> tuple[np.ndarray, int]:
    """Any format libsndfile reads, to float32 mono. Blocking (call it on a thread), and
    ``audio_too_long`` past ``MAX_DECODED_SECONDS`` or ``MAX_DECODED_SAMPLES``, told by
    the length libsndfile finds before decoding (it then decodes no more than that), or,
    where the header does not give it, by decoding no further than the limit."""
    try:
        with soundfile.SoundFile(io.BytesIO(wav_sized_from_data(data))) as f:
            rate, channels = int(f.samplerate), f.channels
            limit = min(MAX_DECODED_SECONDS * rate, MAX_DECODED_SAMPLES // channels)
            if f.frames >= UNKNOWN_FRAMES:
                audio = _read_unknown_length(f, limit + 1)
                if len(audio) > limit:
                    raise too_long(len(audio), rate, channels, holds=f"more than {limit / rate:.1f} s")
            else:
                if f.frames > limit:
                    raise too_long(f.frames, rate, channels)
                audio = f.read(dtype="float32", always_2d=True)
    except (soundfile.LibsndfileError, RuntimeError, TypeError):
        # libsndfile's text names internal objects; the person needs to know what to send.
        raise EngineError(
            ErrorCode.BAD_AUDIO, "the upload is not audio that can be decoded (send WAV, FLAC, OGG or MP3)"
        ) from None
    if audio.size == 0:
        raise EngineError(ErrorCode.BAD_AUDIO, "the upload holds no samples")
    return audio.mean(axis=1).astype(np.float32), rate


def wav_sized_from_data(data: bytes) -> bytes:
    """A RIFF/WAVE upload whose data chunk's size says "length unknown" (0 or 0xFFFFFFFF,
    as a WAV written as a stream has it) with that size, and the RIFF size, measured from
    the bytes that follow; any other upload as it is. A streamed WAV's data runs to the
    end of the file: nothing is written after a chunk whose length was never known."""
    if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return data
    at = 12
    while at + 8 <= len(data):
        chunk, size = data[at : at + 4], int.from_bytes(data[at + 4 : at + 8], "little")
        if chunk == b"data":
            if size not in STREAMED_WAV_SIZES:
                return data
            measured = len(data) - (at + 8)
            return b"".join((b"RIFF", (len(data) - 8).to_bytes(4, "little"), data[8 : at + 4],
                             measured.to_bytes(4, "little"), data[at + 8 :]))
        at += 8 + size + (size & 1)  # chunks are padded to an even length
    return data


def _read_unknown_length(f: soundfile.SoundFile, frames: int) -> np.ndarray:
    """Up to ``frames`` frames from where ``f`` stands, in a file whose length libsndfile
    does not know. soundfile seeks to where it believes each read ended, and libsndfile
    cannot seek to the end of a FLAC of unknown length (``psf_fseek() failed``), so the
    read is made as for a stream that cannot seek: libsndfile reads on until the data ends."""
    f._info.seekable = 0  # what soundfile checks before it seeks; libsndfile's own state is left alone
    return f.read(frames, dtype="float32", always_2d=True)


def too_long(frames: int, rate: int, channels: int, holds: str | None = None) -> EngineError:
    """``audio_too_long`` for an upload of ``frames`` (``holds``: what to say of its
    length where that is not all of it)."""
    holds = holds or f"{frames / rate:.1f} s"
    if frames > MAX_DECODED_SECONDS * rate:
        return EngineError(
            ErrorCode.AUDIO_TOO_LONG, f"the upload holds {holds} of audio; a reference may be at most {MAX_DECODED_SECONDS} s"
        )
    return EngineError(
        ErrorCode.AUDIO_TOO_LONG,
        f"the upload holds {holds} of {channels}-channel audio at {rate} Hz, more data than "
        f"{MAX_DECODED_SECONDS} s of 192 kHz stereo; send fewer channels or a lower sample rate",
    )


async def cannot_clone(request: Request, engine: Engine) -> Response:
    """501 for an engine that cannot clone, before anything is decoded. An upload within
    the upload limit is read and dropped first: a proxy still sending it would otherwise
    see the connection close and answer its client 502 instead of this. A larger one is
    read no further than the limit (a declared one not at all), and the answer closes the
    connection."""
    unsupported = error(ErrorCode.VOICE_REGISTRATION_UNSUPPORTED, f"the {engine.name} engine cannot clone voices")
    return await Body(request, MAX_UPLOAD_BYTES).settle(unsupported, MAX_UPLOAD_BYTES)


def upload_too_large() -> JSONResponse:
    return error(ErrorCode.UPLOAD_TOO_LARGE, f"uploads are limited to {MAX_UPLOAD_BYTES // (1024 * 1024)} MiB")


def form_flag(value: object, field: str) -> bool | None:
    """An optional true/false form field: None when absent."""
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise EngineError(ErrorCode.BAD_REQUEST, f"\"{field}\" must be true or false (or left out)")


def list_voices(engine: Engine, default: str | None) -> JSONResponse:
    return JSONResponse({"voices": [v.to_dict() for v in engine.voices()], "default": default})


async def register_voice(request: Request, worker: Worker, cache: ResultCache) -> Response:
    """multipart/form-data: ``audio`` (a file), ``transcript`` (what it says), ``name``,
    and optionally ``fast_start`` (``true`` or ``false``: the voice's default schedule)."""
    # The whole body within the limit, however it is sent: counted as it arrives, so a
    # chunked upload is refused once it passes the limit, not after it is all on disk.
    body = Body(request, MAX_UPLOAD_BYTES)
    if body.declared_too_large:
        return await body.settle(upload_too_large(), 0)
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        return await body.settle(
            error(ErrorCode.BAD_REQUEST, "send multipart/form-data with fields audio, transcript and name"), MAX_UPLOAD_BYTES
        )
    try:
        form = await body.request.form(max_files=1, max_fields=4, max_part_size=MAX_UPLOAD_BYTES)
    except TooLarge:
        return await body.settle(upload_too_large(), 0)
    except ClientDisconnect:
        # Ordinary (a cancelled upload, a dropped connection): one line, no traceback, and
        # no answer, as nobody is left to read it (499 is nginx's status for this; never sent).
        log.info("client disconnected before sending the whole request body", extra={"path": request.url.path})
        return Response(status_code=499)
    except Exception:  # the multipart parser's errors have no common base
        return await body.settle(
            error(ErrorCode.BAD_REQUEST, "the form could not be read as multipart/form-data"), MAX_UPLOAD_BYTES
        )
    upload = form.get("audio")
    transcript = form.get("transcript", "")
    name = form.get("name", "")
    if upload is None or isinstance(upload, str):
        return error(ErrorCode.BAD_REQUEST, "the form needs a file field \"audio\"")
    if not isinstance(transcript, str) or not isinstance(name, str):
        return error(ErrorCode.BAD_REQUEST, "\"transcript\" and \"name\" must be text fields")
    if len(transcript) > MAX_TRANSCRIPT_CHARS:
        return error(ErrorCode.TRANSCRIPT_TOO_LONG, f"the transcript is limited to {MAX_TRANSCRIPT_CHARS} characters")
    data = await upload.read()  # within the limit: the whole body was
    try:
        fast_start = form_flag(form.get("fast_start"), "fast_start")
        # Passed only when given: ``Engine.register_voice`` itself has no such argument.
        options = {} if fast_start is None else {"fast_start": fast_start}
        # Seconds of CPU for a long upload: on the event loop, every other stream would wait.
        audio, rate = await asyncio.to_thread(decode_audio, data)
        registered = await asyncio.wrap_future(worker.call(lambda e: e.register_voice(audio, rate, transcript, name, **options)))
    except EngineError as e:
        return error(e.code, e.message)
    voice = registered.voice
    if registered.created:
        # Whatever was cached under this id was made from what it was before.
        cache.invalidate_voice(voice.id)
    return JSONResponse({**voice.to_dict(), "cached": not registered.created}, status_code=201 if registered.created else 200)
