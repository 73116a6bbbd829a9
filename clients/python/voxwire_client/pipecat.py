"""Voxwire as a Pipecat TTS service: ``VoxwireTTSService`` streams an LLM's text to a
Voxwire server over protocol v1 (docs/protocol.md) and gives back its audio and word
timings as Pipecat frames.

    pip install "voxwire-client[pipecat]"

    from voxwire_client.pipecat import VoxwireTTSService

    tts = VoxwireTTSService(
        url="ws://127.0.0.1:8000/v1/stream",
        api_key=os.environ.get("VOXWIRE_API_KEY"),  # for a server started with keys
        settings=VoxwireTTSService.Settings(voice="joe", speed=1.1),  # speaker= for a multi-speaker voice
    )
    pipeline = Pipeline([transport.input(), stt, user_aggregator, llm, tts,
                         transport.output(), assistant_aggregator])

One WebSocket per service (a ``voxwire_client.Client``, paced under the server's message
rate) and one utterance (``ctx``) per Pipecat turn context. The LLM's tokens go to the
server as they arrive (text aggregation ``TOKEN`` by default): Voxwire's own segmenter
decides when a sentence can be spoken, and the end of the LLM's response sends the
utterance's final text. The server produces the pipeline's output rate, so nothing is
resampled here; where its engine times words, they become TTSTextFrames timed against
the audio, each released once the audio it begins in has arrived. An interruption
cancels the utterance on the server.

Failures (docs/integrations.md): a turn whose speech fails midway (the connection drops,
the server fails it) ends with an ErrorFrame, the rest of its text is neither spoken nor
put in the assistant's context, and only its heard words are. A dropped connection is
reopened with Pipecat's backoff; once Pipecat has given up (the service unusable), each
new turn tries the server again and speaks if it is back. A voice set while running that
the server does not know falls back to the last voice (and speaker) it spoke with, and a
speaker the voice does not have to the last one it spoke with in that voice, else to the
voice's default speaker; one refused from the start is a setting to fix, as a refused API
key is (never retried). A turn the service cannot speak gets an ErrorFrame, not silence.
Settings changed while running (``TTSUpdateSettingsFrame``) apply from the next utterance.

Pipecat members used beyond its public API (pyproject.toml bounds the version for them):
the ``WebsocketService`` hooks (``_connect``, ``_disconnect``, ``_connect_websocket``,
``_disconnect_websocket``, ``_reconnect_websocket``, ``_receive_messages``) and its
reconnecting loop ``_receive_task_handler`` with the ``_report_error`` it reports through,
``_classify_error``, and ``_call_event_handler`` for ``on_connected``/``on_disconnected``.
"""

from __future__ import annotations

import asyncio
import re
from collections import OrderedDict
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

try:
    from pipecat.frames.frames import (
        DataFrame,
        ErrorFrame,
        Frame,
        InterruptionFrame,
        LLMFullResponseEndFrame,
        LLMFullResponseStartFrame,
        LLMTextFrame,
        TTSAudioRawFrame,
        TTSStoppedFrame,
        TTSTextFrame,
    )
    from pipecat.processors.frame_processor import FrameDirection, FrameProcessorSetup
    from pipecat.services.settings import TTSSettings
    from pipecat.services.tts_service import TextAggregationMode, WebsocketTTSService
    from pipecat.services.websocket_service import WS_CLOSE_TIMEOUT
    from pipecat.utils.errors import ErrorCategory
    from pipecat.utils.types import NOT_GIVEN, NotGiven
except ImportError as e:
    raise ImportError(
        'voxwire_client.pipecat needs pipecat-ai 1.14: pip install "voxwire-client[pipecat]"'
    ) from e

from voxwire_client.client import DEFAULT_URL, Audio, Client, Closed, ServerError, Utterance, bearer_header

__all__ = ["VoxwireTTSService", "VoxwireTTSSettings"]

# Protocol v1's error codes in the framework's terms. A permanent category (a request
# refused every time, such as an unknown voice) makes the service unusable.
_CATEGORIES = {
    code: category
    for category, codes in {
        ErrorCategory.INVALID_REQUEST: "unknown_voice unknown_speaker invalid_voice_blend invalid_lexicon no_voice "
        "invalid_field invalid_format invalid_sample_rate unsupported_sample_rate invalid_chunk_ms invalid_speed",
        ErrorCategory.RATE_LIMIT: "rate_limited overloaded too_many_utterances",
        ErrorCategory.QUOTA: "session_text_limit",
        ErrorCategory.SERVER: "engine_error engine_timeout engine_restarted not_ready shutting_down "
        "voice_download_failed",
    }.items()
    for code in codes.split()
}
_RECENT_STREAMS = 64
"""Streams remembered after they end, for their word frames still on the way."""


@dataclass
class VoxwireTTSSettings(TTSSettings):
    """Settings of ``VoxwireTTSService``; ``None`` leaves a setting to the server.

    Parameters:
        voice: A voice id from the server's ``ready.voices`` (``GET /v1/voices``).
        speaker: A multi-speaker voice's speaker: a name from its ``speakers`` there, or
            its number; ``None``: the voice's default speaker.
        speed: 0.5 to 2.0.
        fast_start: CosyVoice2's sooner first chunk, at some cost in voice likeness
            (docs/protocol.md); ``None``: the voice's own default.
        first_clause_words: How many words a first clause needs for the server to
            speak it before its sentence ends; 0 waits for the sentence (docs/protocol.md).
        lexicon: How words are said, ``{"word": "/phonemes/" or "respelling"}``
            (docs/lexicons.md), on top of the server's. The server says them; the word
            frames keep the words as written, so the context stays as the LLM wrote it.
    """

    speaker: str | int | None | NotGiven = field(default_factory=lambda: NOT_GIVEN)
    speed: float | None | NotGiven = field(default_factory=lambda: NOT_GIVEN)
    fast_start: bool | None | NotGiven = field(default_factory=lambda: NOT_GIVEN)
    first_clause_words: int | None | NotGiven = field(default_factory=lambda: NOT_GIVEN)
    lexicon: dict[str, str] | None | NotGiven = field(default_factory=lambda: NOT_GIVEN)


@dataclass
class _KeepOpen(DataFrame):
    """Keeps a failed turn's audio context from timing out while the rest of its text
    arrives; the service drops it before it leaves."""


@dataclass
class _Stream:
    """The utterance that speaks one Pipecat context, and how much of it was heard."""

    utterance: Utterance | None = None  # None: it could not start
    final: bool = False  # the context's text is all here
    cancelled: bool = False
    ended: bool = False  # its utterance is over: spoken, failed, or never started
    failed: bool = False  # over before all its text was spoken
    closed: bool = False  # its audio context has been ended
    text: list[str] = field(default_factory=list)  # as given, to speak it again in another voice
    voice: str | None = None  # the voice asked for
    speaker: str | None = None  # the speaker asked for (as the server shows it: an id as its digits)
    attempt: int = 0
    reopening: bool = False  # a second utterance is being opened: it takes the text meanwhile
    pending: list[dict[str, Any]] = field(default_factory=list)  # timed words whose audio has not come
    heard: int = 0  # words whose audio has come, released as timed words
    told: int = 0  # words that have gone out in TTSTextFrames

    def admit(self, frame: TTSTextFrame) -> bool:
        """Whether a word frame of this stream may go on; a failed stream's are cut to the
        words that were heard. The framework tells a context's untimed text at its end, as
        if spoken (for services that drop timings): after a failure, it was not."""
        count = len(frame.text.split())
        if not self.failed:
            self.told += count
            return True
        room = self.heard - self.told
        if room <= 0:
            return False
        if count > room:
            frame.text = re.match(rf"\s*(?:\S+\s+){{{room - 1}}}\S+", frame.text).group(0)  # type: ignore[union-attr]
            frame.raw_text = None  # the assistant's context would take it over the text
            count = room
        self.told += count
        return True


@dataclass
class _Verdict:
    """Why the service became unusable: the error that did it."""

    error: ErrorFrame

    @property
    def recoverable(self) -> bool:
        """Not a refusal that would recur (a key, a setting), but a connection that gave
        up, or failures in a row: a server that is back clears it."""
        return self.error.category is not None and not self.error.category.is_permanent


class VoxwireTTSService(WebsocketTTSService):
    """Streaming TTS from a Voxwire server, with word timestamps (module docstring)."""

    Settings = VoxwireTTSSettings

    def __init__(
        self,
        *,
        url: str = DEFAULT_URL,
        api_key: str | None = None,
        chunk_ms: int | None = None,
        sample_rate: int | None = None,
        settings: VoxwireTTSSettings | None = None,
        text_aggregation_mode: TextAggregationMode = TextAggregationMode.TOKEN,
        ws_close_timeout: float = WS_CLOSE_TIMEOUT,
        **kwargs: Any,
    ) -> None:
        """``api_key`` is sent as ``Authorization: Bearer``, never in the URL. ``chunk_ms``:
        150 to 250 ms of audio per frame (the server's default, 200, when None).
        ``sample_rate``: the pipeline's output rate when None. ``ws_close_timeout``: how
        long a close waits for the server. Other arguments go to ``WebsocketTTSService``
        (``reconnect_backoff_min_wait`` and so on)."""
        if api_key is not None:
            bearer_header(api_key)  # a key no header can carry fails here, not at the first turn
        store = VoxwireTTSSettings(
            model=None, voice=None, language=None, speaker=None, speed=None, fast_start=None,
            first_clause_words=None, lexicon=None,
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
            ws_close_timeout=ws_close_timeout,
            **kwargs,
        )
        self._url = url
        self._api_key = api_key
        self._chunk_ms = chunk_ms
        self._close_timeout = ws_close_timeout
        self._client: Client | None = None
        self._streams: dict[str, _Stream] = {}
        self._recent: OrderedDict[str, _Stream] = OrderedDict()
        self._receive_task: asyncio.Task[None] | None = None
        # A turn and the reconnecting loop may both find the socket gone: one socket is made.
        self._connecting = asyncio.Lock()
        self._closing = False  # stopping on purpose: a closed socket is no failure then
        self._failed_turn: str | None = None  # an LLM turn whose speech failed while its text still comes
        self._spoken_voice: str | None = None  # the last voice the server spoke with
        self._spoken_speaker: str | None = None  # and its speaker (None: the voice's default)
        self._verdict: _Verdict | None = None
        self._last_try: Exception | None = None  # why the last turn could not reconnect

    def can_generate_metrics(self) -> bool:
        return True

    async def setup(self, setup: FrameProcessorSetup) -> None:
        await super().setup(setup)
        await self._connect()

    def _options(self) -> VoxwireTTSSettings:
        settings = self.settings
        assert isinstance(settings, VoxwireTTSSettings)
        return settings

    # -- frames -----------------------------------------------------------------------

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        if isinstance(frame, LLMFullResponseStartFrame):
            await self._forget_failed_turn()  # a response that never ended, now superseded
        elif self._failed_turn is not None and isinstance(frame, LLMTextFrame) and not frame.skip_tts:
            # The rest of a turn whose speech failed: not spoken from mid-sentence, and,
            # never heard, not the context's either. Its audio context stays open until the
            # turn's end, so that the words that were heard reach the context in full.
            if self.audio_context_available(self._failed_turn):
                await self.append_to_audio_context(self._failed_turn, _KeepOpen())
            return
        await super().process_frame(frame, direction)
        if isinstance(frame, (LLMFullResponseEndFrame, InterruptionFrame)):
            await self._forget_failed_turn()  # the turn's end closed it, unless its context had gone

    async def _forget_failed_turn(self) -> None:
        context_id, self._failed_turn = self._failed_turn, None
        stream = self._streams.get(context_id) if context_id is not None else None
        if stream is not None and context_id is not None:
            await self._close_stream(stream, context_id)

    async def push_frame(self, frame: Frame, direction: FrameDirection = FrameDirection.DOWNSTREAM) -> None:
        if isinstance(frame, _KeepOpen):
            return
        if isinstance(frame, TTSTextFrame) and frame.context_id is not None:
            stream = self._recent.get(frame.context_id)
            if stream is not None and not stream.admit(frame):
                return
        await super().push_frame(frame, direction)

    # -- usability --------------------------------------------------------------------

    async def push_error_frame(self, error: ErrorFrame, force_treat_as_permanent: bool = False) -> None:
        usable = self.is_usable
        if force_treat_as_permanent:
            await super().push_error_frame(error, force_treat_as_permanent=True)
        else:
            await super().push_error_frame(error)
        if usable and not self.is_usable:
            self._verdict = _Verdict(error)

    async def set_usable(self, is_usable: bool) -> None:
        if is_usable:
            self._verdict, self._last_try = None, None
        await super().set_usable(is_usable)

    async def on_turn_context_created(self, context_id: str) -> None:
        await super().on_turn_context_created(context_id)
        if self.is_usable or self._verdict is None or not self._verdict.recoverable:
            return
        # Pipecat gave up reconnecting (or the turns kept failing) and wrote the service
        # off: its loop has stopped, so a new turn is the moment to try the server again.
        try:
            await self._reopen()
        except Exception as e:
            self._last_try = e
            return
        await self.set_usable(True)

    async def _say_unspoken(self) -> None:
        """A turn the service could not speak at all (it is unusable): an ErrorFrame, once
        a turn, where the framework would only log a warning for each piece of text."""
        verdict = self._verdict
        if verdict is not None and verdict.recoverable and self._last_try is not None:
            why, category = f"the server is still unreachable ({self._last_try})", ErrorCategory.CONNECTIVITY
        elif verdict is not None:
            why, category = verdict.error.error, verdict.error.category
        else:
            why, category = "the service is not usable", ErrorCategory.UNKNOWN
        await self.push_error(f"{self} did not speak this turn: {why}", category=category)

    # -- text in ----------------------------------------------------------------------

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        stream = self._streams.get(context_id)
        if stream is None:
            stream = self._streams[context_id] = _Stream(text=[text])
            self._remember(context_id, stream)
            await self._open_stream(stream, context_id)
        elif not stream.final:
            stream.text.append(text)
            if stream.utterance is not None and not stream.reopening:
                # Sends nothing once the utterance has failed: a turn is not resumed mid-sentence.
                await stream.utterance.send(text)
        await self.start_tts_usage_metrics(text)
        yield None  # the audio comes from the stream's reader

    async def flush_audio(self, context_id: str | None = None) -> None:
        """The end of the LLM's response (or of a TTSSpeakFrame): the utterance's final text."""
        context_id = context_id or self.get_active_audio_context_id()
        if context_id is None:
            return
        stream = self._streams.get(context_id)
        if stream is None:
            if self.audio_context_available(context_id) and context_id not in self._recent:
                # Text came and nothing was asked to speak it: the service is not usable.
                await self._say_unspoken()
                await self._end_context(context_id)
            return
        if stream.final:
            return
        stream.final = True
        if stream.ended:
            await self._close_stream(stream, context_id)  # it failed while its text was coming
        elif stream.utterance is not None and not stream.reopening:
            await stream.utterance.send("", final=True)  # if it is over meanwhile, its reader closes it

    async def on_audio_context_interrupted(self, context_id: str) -> None:
        await self.stop_all_metrics()
        stream = self._streams.pop(context_id, None)
        if self._failed_turn == context_id:
            self._failed_turn = None
        if stream is not None:
            stream.cancelled = True  # before any await: its reader drops what is still coming
            if stream.utterance is not None:
                await stream.utterance.cancel()
        await super().on_audio_context_interrupted(context_id)

    async def _open_stream(self, stream: _Stream, context_id: str) -> None:
        if not self._is_open():
            await self._connect()
        client = self._client
        if client is None or not self._is_open():
            await self._finish(stream, context_id, failed=True)  # _connect has reported why
            return
        options = self._options()
        settings = {
            "voice": options.voice,
            "speaker": options.speaker,
            "speed": options.speed,
            "fast_start": options.fast_start,
            "first_clause_words": options.first_clause_words,
            "lexicon": options.lexicon,
            "chunk_ms": self._chunk_ms,
        }
        settings = {k: v for k, v in settings.items() if v is not None}
        if client.ready.get("features", {}).get("timestamps"):
            settings["timestamps"] = True
        stream.voice = options.voice if isinstance(options.voice, str) else None
        stream.speaker = _speaker(options.speaker)
        # A new ctx for a second attempt: text that followed a refused first speak may
        # have opened an utterance under the first one.
        ctx = context_id if not stream.attempt else f"{context_id}~{stream.attempt}"
        given, final = len(stream.text), stream.final
        try:
            # The server makes the pipeline's rate itself (libsoxr, streamed): nothing is resampled here.
            stream.utterance = await client.speak(
                "".join(stream.text[:given]), ctx=ctx, final=final, format="pcm_s16le",
                sample_rate=self.sample_rate, **settings,
            )
            stream.reopening = False
            if not final and (len(stream.text) > given or stream.final):
                # Text that came while a second attempt was opening, and the end of it.
                await stream.utterance.send("".join(stream.text[given:]), final=stream.final)
        except Exception as e:  # the socket went away just now; its loop reconnects
            await self.push_error(
                f"{self} could not start an utterance: {e}", exception=e, category=ErrorCategory.CONNECTIVITY
            )
            await self._finish(stream, context_id, failed=True)
            return
        if stream.cancelled:  # interrupted while the speak was on its way
            await stream.utterance.cancel()
        self.create_task(self._read(stream, context_id), name=f"voxwire_read_{ctx}")

    # -- audio and words out ----------------------------------------------------------

    async def _read(self, stream: _Stream, context_id: str) -> None:
        """Move one utterance's audio and word timings into its audio context, in order."""
        assert stream.utterance is not None
        received_ms = 0.0
        failed = False
        try:
            async for item in stream.utterance:
                if stream.cancelled:
                    continue  # read on to `cancelled`, so the client lets go of the utterance
                if isinstance(item, Audio):
                    frame = TTSAudioRawFrame(item.data, item.sample_rate, 1, context_id=context_id)
                    await self.append_to_audio_context(context_id, frame)
                    received_ms += item.samples * 1000 / item.sample_rate
                    await self._release_words(stream, context_id, received_ms)
                elif item.type == "started":
                    self._spoken_voice = item.data.get("voice", self._spoken_voice)
                    self._spoken_speaker = item.data.get("speaker")
                elif item.type == "timestamps":
                    # Sent just before the audio they begin in: held until that has come,
                    # so that a connection lost in between tells no word that was not heard.
                    stream.pending.extend(item["words"])
                elif item.type == "done":
                    await self._release_words(stream, context_id, float("inf"))
                elif item.type == "error":  # not terminal: one message was refused, the utterance goes on
                    await self._push_server_error(item["code"], item["message"])
        except ServerError as e:
            if await self._fall_back(stream, context_id, e):
                return
            failed = True
            await self._push_server_error(e.code, e.message)
        except Closed as e:
            failed = True
            if not self._closing:
                await self.push_error(
                    f"{self} lost its connection mid-utterance: {e}", exception=e,
                    category=ErrorCategory.CONNECTIVITY,
                )
        await self._finish(stream, context_id, failed)

    async def _release_words(self, stream: _Stream, context_id: str, until_ms: float) -> None:
        """The held word timings that begin before ``until_ms``: the utterance's own
        timeline, from its first sample, as the base class times words."""
        ready = [w for w in stream.pending if w["start_ms"] < until_ms]
        if ready:
            stream.pending = stream.pending[len(ready):]
            stream.heard += len(ready)
            await self.add_word_timestamps([(w["word"], w["start_ms"] / 1000) for w in ready], context_id)

    async def _fall_back(self, stream: _Stream, context_id: str, e: ServerError) -> bool:
        """An unknown voice chosen while running: speak the turn with the last voice (and
        speaker) the server spoke with, and keep it, rather than leave this turn and the
        next silent. An unknown speaker: the same voice, with the last speaker the server
        spoke with in it, else the voice's default speaker (one every voice has). Either
        refused before the server has spoken at all is a setting to fix, not repaired."""
        utterance = stream.utterance
        if utterance is None or utterance.started is not None or stream.cancelled:
            return False
        options = self._options()
        if e.code == "unknown_voice":
            voice, speaker = self._spoken_voice, self._spoken_speaker
            if voice is None or voice == stream.voice:
                return False
            options.voice, options.speaker = voice, speaker
            instead = f"{voice!r}" + (f" (speaker {speaker!r})" if speaker is not None else "")
            said = f"speaking with {instead}, the last voice the server spoke with,"
        elif e.code == "unknown_speaker":
            if self._spoken_voice is None:
                return False  # refused before anything was spoken: a setting to fix
            same_voice = stream.voice is None or stream.voice == self._spoken_voice
            last = self._spoken_speaker if same_voice else None
            speaker = last if last != stream.speaker else None
            if speaker == stream.speaker:
                return False
            options.speaker = speaker
            voice = stream.voice or self._spoken_voice
            named = f"{voice!r}" if voice is not None else "the default voice"
            said = (
                f"speaking {named} with speaker {speaker!r}, the last one the server spoke with in it,"
                if speaker is not None else f"speaking {named} with its default speaker"
            )
        else:
            return False
        stream.reopening = True  # before any await: text that comes now waits for the new utterance
        await self.push_error(
            f"{self} Voxwire error {e.code}: {e.message}; {said} until the settings name another",
            # The application's setting, repaired here: the service itself is fine.
            category=ErrorCategory.APPLICATION,
        )
        stream.attempt += 1
        await self._open_stream(stream, context_id)
        return True

    async def _finish(self, stream: _Stream, context_id: str, failed: bool) -> None:
        """Its utterance is over. A failed one's turn may still be sending text: its audio
        context then closes at the turn's end, once the heard words have been told."""
        stream.ended = True
        stream.failed = stream.failed or failed
        if stream.cancelled:
            return
        if stream.final:
            await self._close_stream(stream, context_id)
        elif stream.failed:
            self._failed_turn = context_id

    async def _close_stream(self, stream: _Stream, context_id: str) -> None:
        if stream.closed:
            return
        stream.closed = True
        if self._streams.get(context_id) is stream:
            del self._streams[context_id]
        if self._failed_turn == context_id:
            self._failed_turn = None
        await self._end_context(context_id)

    async def _end_context(self, context_id: str) -> None:
        if self.audio_context_available(context_id):
            await self.append_to_audio_context(context_id, TTSStoppedFrame(context_id=context_id))
            await self.remove_audio_context(context_id)

    def _remember(self, context_id: str, stream: _Stream) -> None:
        self._recent[context_id] = stream
        while len(self._recent) > _RECENT_STREAMS:
            self._recent.popitem(last=False)

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
        try:
            await self._reopen()
        except Exception as e:
            await self._report_error(ErrorFrame(f"{self} could not connect to {self._url}: {e}", exception=e))

    async def _reopen(self) -> None:
        """Open the socket, and Pipecat's loop that reconnects it; raises if it cannot."""
        await super()._connect()  # Pipecat's: reconnecting is allowed again, its failure count reset
        self._closing = False
        await self._connect_websocket()
        if self._receive_task is None or self._receive_task.done():
            self._receive_task = self.create_task(self._receive_task_handler(self._report_error))

    async def _disconnect(self) -> None:
        self._closing = True
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
            # Paced: many turns' tokens on one socket stay under the server's message rate.
            self._client = await Client.connect(
                self._url, api_key=self._api_key, report_progress=False, pace=True, close_timeout=self._close_timeout
            )
        await self._call_event_handler("on_connected")

    async def _disconnect_websocket(self) -> None:
        await self.stop_all_metrics()
        client, self._client = self._client, None
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


def _speaker(value: object) -> str | None:
    """A speaker setting as the server shows it (``started.speaker``): an id as its digits."""
    if isinstance(value, bool) or value is None:
        return None
    return str(value) if isinstance(value, (str, int)) else None
