"""Voxwire as a Pipecat TTS service: ``VoxwireTTSService`` streams an LLM's text to a
Voxwire server over protocol v1 (docs/protocol.md) and gives back its audio and word
timings as Pipecat frames.

    pip install "voxwire-client[pipecat]"

    from voxwire_client.pipecat import VoxwireTTSService

    tts = VoxwireTTSService(
        url="ws://127.0.0.1:8000/v1/stream",
        api_key=os.environ.get("VOXWIRE_API_KEY"),  # for a server started with keys
        settings=VoxwireTTSService.Settings(voice="joe", speed=1.1),
    )
    pipeline = Pipeline([transport.input(), stt, user_aggregator, llm, tts,
                         transport.output(), assistant_aggregator])

One WebSocket per service (a ``voxwire_client.Client``) and one utterance (``ctx``) per
Pipecat turn context. The LLM's tokens go to the server as they arrive (text aggregation
``TOKEN`` by default): Voxwire's own segmenter decides when a sentence can be spoken, and
the end of the LLM's response sends the utterance's final text. The server produces the
pipeline's output rate, so nothing is resampled here; where its engine times words, they
become TTSTextFrames timed against the audio. An interruption cancels the utterance on
the server. A dropped connection fails the turn in flight with an ErrorFrame and is
reconnected with backoff; a refused API key is an authentication error, never retried.
Settings changed while running (``TTSUpdateSettingsFrame``) apply from the next utterance.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

try:
    from pipecat.frames.frames import ErrorFrame, Frame, TTSAudioRawFrame, TTSStoppedFrame
    from pipecat.processors.frame_processor import FrameProcessorSetup
    from pipecat.services.settings import TTSSettings
    from pipecat.services.tts_service import TextAggregationMode, WebsocketTTSService
    from pipecat.utils.errors import ErrorCategory
    from pipecat.utils.types import NOT_GIVEN, NotGiven
except ImportError as e:
    raise ImportError(
        'voxwire_client.pipecat needs pipecat-ai 1.14 or later: pip install "voxwire-client[pipecat]"'
    ) from e

from voxwire_client.client import DEFAULT_URL, Audio, Client, Closed, ServerError, Utterance, bearer_header

__all__ = ["VoxwireTTSService", "VoxwireTTSSettings"]

# Protocol v1's error codes in the framework's terms. A permanent category (a request
# refused every time, such as an unknown voice) makes the service unusable.
_CATEGORIES = {
    code: category
    for category, codes in {
        ErrorCategory.INVALID_REQUEST: "unknown_voice no_voice invalid_field invalid_format invalid_sample_rate "
        "unsupported_sample_rate invalid_chunk_ms invalid_speed",
        ErrorCategory.RATE_LIMIT: "rate_limited overloaded too_many_utterances",
        ErrorCategory.QUOTA: "session_text_limit",
        ErrorCategory.SERVER: "engine_error engine_timeout engine_restarted not_ready shutting_down",
    }.items()
    for code in codes.split()
}


@dataclass
class VoxwireTTSSettings(TTSSettings):
    """Settings of ``VoxwireTTSService``; ``None`` leaves a setting to the server.

    Parameters:
        voice: A voice id from the server's ``ready.voices`` (``GET /v1/voices``).
        speed: 0.5 to 2.0.
        fast_start: CosyVoice2's sooner first chunk, at some cost in voice likeness
            (docs/protocol.md); ``None``: the voice's own default.
        first_clause_words: How many words a first clause needs for the server to
            speak it before its sentence ends; 0 waits for the sentence (docs/protocol.md).
    """

    speed: float | None | NotGiven = field(default_factory=lambda: NOT_GIVEN)
    fast_start: bool | None | NotGiven = field(default_factory=lambda: NOT_GIVEN)
    first_clause_words: int | None | NotGiven = field(default_factory=lambda: NOT_GIVEN)


@dataclass
class _Stream:
    """The utterance that speaks one Pipecat context."""

    utterance: Utterance | None = None  # None: it could not start; the rest of its text is dropped
    final: bool = False
    cancelled: bool = False


class VoxwireTTSService(WebsocketTTSService):
    """Streaming TTS from a Voxwire server, with word timestamps (module docstring)."""

    Settings = VoxwireTTSSettings
    _settings: VoxwireTTSSettings

    def __init__(
        self,
        *,
        url: str = DEFAULT_URL,
        api_key: str | None = None,
        chunk_ms: int | None = None,
        sample_rate: int | None = None,
        settings: VoxwireTTSSettings | None = None,
        text_aggregation_mode: TextAggregationMode = TextAggregationMode.TOKEN,
        **kwargs: Any,
    ) -> None:
        """``api_key`` is sent as ``Authorization: Bearer``, never in the URL. ``chunk_ms``:
        150 to 250 ms of audio per frame (the server's default, 200, when None).
        ``sample_rate``: the pipeline's output rate when None. Other arguments go to
        ``WebsocketTTSService`` (``reconnect_backoff_min_wait`` and so on)."""
        if api_key is not None:
            bearer_header(api_key)  # a key no header can carry fails here, not at the first turn
        store = VoxwireTTSSettings(
            model=None, voice=None, language=None, speed=None, fast_start=None, first_clause_words=None
        )
        if settings is not None:
            store.apply_update(settings)
        super().__init__(
            text_aggregation_mode=text_aggregation_mode,
            # Words are pushed as they are spoken, from the server's timings. Where the
            # engine has none (CosyVoice2), the base class pushes the text that was not
            # timed once the context's audio has ended.
            push_text_frames=False,
            push_start_frame=True,
            sample_rate=sample_rate,
            settings=store,
            **kwargs,
        )
        self._url = url
        self._api_key = api_key
        self._chunk_ms = chunk_ms
        self._client: Client | None = None
        self._streams: dict[str, _Stream] = {}
        self._receive_task: asyncio.Task[None] | None = None
        # A turn and the reconnecting loop may both find the socket gone: one socket is made.
        self._connecting = asyncio.Lock()

    def can_generate_metrics(self) -> bool:
        return True

    async def setup(self, setup: FrameProcessorSetup) -> None:
        await super().setup(setup)
        await self._connect()

    # -- text in ----------------------------------------------------------------------

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        stream = self._streams.get(context_id)
        if stream is None:
            stream = self._streams[context_id] = _Stream()
            await self._open_stream(stream, text, context_id)
        elif stream.utterance is not None and not stream.final:
            # Sends nothing once the utterance has failed: a turn is not resumed mid-sentence.
            await stream.utterance.send(text)
        await self.start_tts_usage_metrics(text)
        yield None  # the audio comes from the stream's reader

    async def flush_audio(self, context_id: str | None = None) -> None:
        """The end of the LLM's response (or of a TTSSpeakFrame): the utterance's final text."""
        context_id = context_id or self.get_active_audio_context_id()
        stream = self._streams.get(context_id) if context_id else None
        if stream is None or stream.final:
            return
        stream.final = True
        if stream.utterance is None or not await stream.utterance.send("", final=True):
            del self._streams[context_id]  # it had already failed, and its reader is gone

    async def on_audio_context_interrupted(self, context_id: str) -> None:
        await self.stop_all_metrics()
        stream = self._streams.pop(context_id, None)
        if stream is not None:
            stream.cancelled = True  # before any await: its reader drops what is still coming
            if stream.utterance is not None:
                await stream.utterance.cancel()
        await super().on_audio_context_interrupted(context_id)

    async def _open_stream(self, stream: _Stream, text: str, context_id: str) -> None:
        if not self._is_open():
            await self._connect()
        client = self._client
        if client is None or not self._is_open():
            await self._end_context(context_id)  # _connect has reported why
            return
        settings = {
            "voice": self._settings.voice,
            "speed": self._settings.speed,
            "fast_start": self._settings.fast_start,
            "first_clause_words": self._settings.first_clause_words,
            "chunk_ms": self._chunk_ms,
        }
        settings = {k: v for k, v in settings.items() if v is not None}
        if client.ready.get("features", {}).get("timestamps"):
            settings["timestamps"] = True
        try:
            # The server makes the pipeline's rate itself (libsoxr, streamed): nothing is resampled here.
            stream.utterance = await client.speak(
                text, ctx=context_id, final=False, format="pcm_s16le", sample_rate=self.sample_rate, **settings
            )
        except Exception as e:  # the socket went away just now; its loop reconnects
            await self.push_error(
                f"{self} could not start an utterance: {e}", exception=e, category=ErrorCategory.CONNECTIVITY
            )
            await self._end_context(context_id)
            return
        if stream.cancelled:  # interrupted while the speak was on its way
            await stream.utterance.cancel()
        self.create_task(self._read(stream, context_id), name=f"voxwire_read_{context_id}")

    # -- audio and words out ----------------------------------------------------------

    async def _read(self, stream: _Stream, context_id: str) -> None:
        """Move one utterance's audio and word timings into its audio context, in order."""
        assert stream.utterance is not None
        try:
            async for item in stream.utterance:
                if stream.cancelled:
                    continue  # read on to `cancelled`, so the client lets go of the utterance
                if isinstance(item, Audio):
                    frame = TTSAudioRawFrame(item.data, item.sample_rate, 1, context_id=context_id)
                    await self.append_to_audio_context(context_id, frame)
                elif item.type == "timestamps":
                    # The utterance's own timeline, as the base class times words: from its first sample.
                    words = [(w["word"], w["start_ms"] / 1000) for w in item["words"]]
                    await self.add_word_timestamps(words, context_id)
                elif item.type == "error":  # not terminal: one message was refused, the utterance goes on
                    await self._push_server_error(item["code"], item["message"])
        except ServerError as e:
            await self._push_server_error(e.code, e.message)
        except Closed as e:
            if not self._disconnecting:
                await self.push_error(f"{self} lost its connection mid-utterance: {e}", exception=e)
        if stream.final and self._streams.get(context_id) is stream:
            del self._streams[context_id]
        if not stream.cancelled:
            await self._end_context(context_id)

    async def _end_context(self, context_id: str) -> None:
        if self.audio_context_available(context_id):
            await self.append_to_audio_context(context_id, TTSStoppedFrame(context_id=context_id))
            await self.remove_audio_context(context_id)

    async def _push_server_error(self, code: str, message: str) -> None:
        await self.push_error(
            f"{self} Voxwire error {code}: {message}", category=_CATEGORIES.get(code, ErrorCategory.UNKNOWN)
        )

    # -- the connection ---------------------------------------------------------------

    def _is_open(self) -> bool:
        return self._client is not None and not self._client.closed

    def _classify_error(self, exception: Exception) -> ErrorCategory | None:
        # The server closes a missing or wrong key with 1008 after the handshake, which no
        # HTTP status says; this category makes the base class stop, not retry.
        if isinstance(exception, Closed) and exception.refused:
            return ErrorCategory.AUTHENTICATION
        return None

    async def _connect(self) -> None:
        await super()._connect()
        try:
            await self._connect_websocket()
        except Exception as e:
            await self._report_error(ErrorFrame(f"{self} could not connect to {self._url}: {e}", exception=e))
            return
        if self._receive_task is None or self._receive_task.done():
            self._receive_task = self.create_task(self._receive_task_handler(self._report_error))

    async def _disconnect(self) -> None:
        await super()._disconnect()
        if self._receive_task is not None:
            await self.cancel_task(self._receive_task)
            self._receive_task = None
        await self._disconnect_websocket()

    async def _connect_websocket(self) -> None:
        async with self._connecting:
            if self._is_open():
                return
            # The audio goes into Pipecat's queue as it arrives, so a count of the frames
            # taken would not say what was played: the server paces by its queue instead.
            self._client = await Client.connect(
                self._url, api_key=self._api_key, report_progress=False, close_timeout=self._ws_close_timeout
            )
            self._websocket = self._client.ws
        await self._call_event_handler("on_connected")

    async def _disconnect_websocket(self) -> None:
        await self.stop_all_metrics()
        client, self._client, self._websocket = self._client, None, None
        if client is not None:
            await client.close()  # each utterance's reader ends with Closed
            await self._call_event_handler("on_disconnected")

    async def _reconnect_websocket(self, attempt_number: int) -> bool:
        # Not the base class's, which would move a turn in flight to a new context and
        # speak the rest of it from mid-sentence: here that turn's reader has failed it
        # with an ErrorFrame. Nor is an open socket closed: a new turn may have reopened it.
        await self._connect_websocket()
        return True

    async def _receive_messages(self) -> None:
        # The client's own reader routes every message to its utterance; the base class's
        # loop only needs to learn that the socket is gone, to reconnect.
        client = self._client
        if client is None:
            raise ConnectionError(f"{self} is not connected")
        await client.wait_closed()
