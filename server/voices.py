"""``/v1/voices``: list voices, and register a cloned voice from reference audio.

Uploads are decoded with libsndfile (soundfile: WAV, FLAC, OGG, MP3 and more), then handed
to the engine on its own thread; engines that cannot clone say so (501).
"""

from __future__ import annotations

import asyncio
import io

import numpy as np
import soundfile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from engine.base import EngineError
from server.service import Service

MAX_UPLOAD_BYTES = 16 * 1024 * 1024
MAX_TRANSCRIPT_CHARS = 2000

_STATUS = {
    "voice_registration_unsupported": 501,
    "not_ready": 503,
    "shutting_down": 503,
    "engine_restarted": 503,
    "engine_timeout": 503,
    "upload_too_large": 413,
}


def error(code: str, message: str, status: int | None = None) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status or _STATUS.get(code, 400))


def decode_audio(data: bytes) -> tuple[np.ndarray, int]:
    """Any format libsndfile reads, to float32 mono."""
    try:
        audio, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except (soundfile.LibsndfileError, RuntimeError, TypeError) as e:
        raise EngineError("bad_audio", f"the upload is not audio that can be decoded: {e}") from None
    if audio.size == 0:
        raise EngineError("bad_audio", "the upload holds no samples")
    return audio.mean(axis=1).astype(np.float32), int(rate)


def list_voices(service: Service) -> JSONResponse:
    assert service.defaults is not None
    engine = service.worker.loaded_engine()
    return JSONResponse({"voices": [v.to_dict() for v in engine.voices()], "default": service.defaults.voice})


async def register_voice(request: Request, service: Service) -> Response:
    """multipart/form-data: ``audio`` (a file), ``transcript`` (what it says), ``name``."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > MAX_UPLOAD_BYTES:
        return error("upload_too_large", f"uploads are limited to {MAX_UPLOAD_BYTES // (1024 * 1024)} MiB")
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        return error("bad_request", "send multipart/form-data with fields audio, transcript and name")
    try:
        form = await request.form(max_files=1, max_fields=4, max_part_size=MAX_UPLOAD_BYTES)
    except Exception as e:  # the multipart parser's errors have no common base
        return error("bad_request", f"the form could not be read: {e}")
    upload = form.get("audio")
    transcript = form.get("transcript", "")
    name = form.get("name", "")
    if upload is None or isinstance(upload, str):
        return error("bad_request", "the form needs a file field \"audio\"")
    if not isinstance(transcript, str) or not isinstance(name, str):
        return error("bad_request", "\"transcript\" and \"name\" must be text fields")
    if len(transcript) > MAX_TRANSCRIPT_CHARS:
        return error("transcript_too_long", f"the transcript is limited to {MAX_TRANSCRIPT_CHARS} characters")
    data = await upload.read()
    if len(data) > MAX_UPLOAD_BYTES:
        return error("upload_too_large", f"uploads are limited to {MAX_UPLOAD_BYTES // (1024 * 1024)} MiB")
    try:
        audio, rate = decode_audio(data)
        worker = service.worker
        existed = {v.id for v in worker.loaded_engine().voices()}
        voice = await asyncio.wrap_future(worker.call(lambda e: e.register_voice(audio, rate, transcript, name)))
    except EngineError as e:
        return error(e.code, e.message)
    # Whatever was cached under this id was made from what it was before.
    service.cache.invalidate_voice(voice.id)
    return JSONResponse({**voice.to_dict(), "cached": voice.id in existed}, status_code=200 if voice.id in existed else 201)
