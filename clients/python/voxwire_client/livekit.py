"""Voxwire as the voice of a LiveKit Agents (1.x) agent: a TTS plugin over protocol v1.

    from livekit.agents import AgentSession
    from voxwire_client.livekit import TTS

    session = AgentSession(tts=TTS(url="ws://tts.internal:8000/v1/stream", voice="joe"), ...)

``speaker`` names a multi-speaker voice's speaker (a name from its ``speakers`` in
``GET /v1/voices``, or its number).

``pip install "voxwire-client[livekit]"``. ``url`` and ``api_key`` default to the
``VOXWIRE_URL`` and ``VOXWIRE_API_KEY`` environment variables; the key travels in the
``Authorization`` header, never in the URL.

How LiveKit's model maps onto Voxwire's:

- One WebSocket (a ``voxwire_client.Client``) carries every stream and ``synthesize``
  call of a ``TTS``, each as one utterance (its own ``ctx``); it is opened on first use
  and reopened once it has closed.
- ``stream()``: each token goes to the server as it arrives, so Voxwire's segmenter
  decides when a sentence is ready to speak; ``flush()`` is Voxwire's ``flush``,
  ``end_input()`` the utterance's final text, and ``aclose()`` before the end cancels the
  utterance on the server (barge-in).
- Audio is 16-bit PCM at the plugin's ``sample_rate``, resampled by the server. Word
  timings (``TimedString``) come with it when the server has them
  (``ready.features.timestamps``); ``capabilities.aligned_transcript`` turns false on
  the first connection to a server without them. Each ``TimedString`` is a slice of the
  text as it was pushed (a word with its punctuation and the space before it): LiveKit
  joins them into the transcript and the chat history, which then read as the text was
  written, where the server's words alone carry no punctuation.
- The socket's messages are paced under the server's message rate (``ready.limits``):
  tokens of streams that would go over it are joined into fewer messages.
- Failures are the framework's errors, so its retries (``conn_options``) apply: a dropped
  or refused connection is ``APIConnectionError``, a wrong API key ``APIStatusError``
  401, and a server ``error`` an ``APIStatusError`` whose message starts with its code.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, replace

import websockets

from voxwire_client.client import DEFAULT_URL, Audio, Client, Closed, ServerError, Utterance, bearer_header

try:
    from livekit.agents import (
        DEFAULT_API_CONNECT_OPTIONS,
        NOT_GIVEN,
        APIConnectionError,
        APIConnectOptions,
        APIStatusError,
        APITimeoutError,
        NotGivenOr,
        tts,
        utils,
    )
    from livekit.agents.types import TimedString
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        'voxwire_client.livekit needs LiveKit Agents 1.x: pip install "voxwire-client[livekit]"'
    ) from e

__all__ = ["TTS"]

# HTTP-like statuses for Voxwire's error codes: the framework retries 408, 429 and 5xx,
# and never another 4xx. Any code not listed is the caller's mistake (400).
_STATUS = {
    "overloaded": 429, "too_many_utterances": 429, "rate_limited": 429,
    "session_text_limit": 429,  # per connection: a fresh socket (TTS._errors) clears it
    "idle_timeout": 408, "listener_stalled": 408,
    "engine_error": 500, "engine_timeout": 504,
    "engine_restarted": 503, "not_ready": 503, "shutting_down": 503,
    "voice_download_failed": 503,  # the next request downloads again
}


@dataclass
class _Options:
    voice: str | None
    speaker: str | int | None
    speed: float | None
    chunk_ms: int | None
    first_clause_words: int | None
    lexicon: dict[str, str] | None


class TTS(tts.TTS):
    def __init__(
        self,
        *,
        url: str | None = None,
        api_key: str | None = None,
        voice: str | None = None,
        speaker: str | int | None = None,
        speed: float | None = None,
        sample_rate: int = 24000,
        chunk_ms: int | None = None,
        first_clause_words: int | None = None,
        lexicon: dict[str, str] | None = None,
    ) -> None:
        """``voice``, ``speaker`` (of a multi-speaker voice: a name, or its number),
        ``speed``, ``chunk_ms`` and ``first_clause_words`` (how many words a first clause
        needs to be spoken before its sentence ends; 0 waits for the sentence) left out
        take the server's defaults (for ``speaker``, the voice's default speaker).
        ``lexicon``: how words are said, ``{"word": "/phonemes/" or "respelling"}``
        (docs/lexicons.md), on top of the server's; the aligned transcript keeps the
        words as written.
        ``sample_rate`` (8000-48000) is asked of the server, which resamples; 24 kHz is
        CosyVoice2's own rate, above Piper's 22.05 kHz, and the usual one of LiveKit's
        TTS plugins."""
        super().__init__(
            capabilities=tts.TTSCapabilities(streaming=True, aligned_transcript=True),
            sample_rate=sample_rate,
            num_channels=1,
        )
        self._url = url or os.environ.get("VOXWIRE_URL") or DEFAULT_URL
        self._api_key = api_key or os.environ.get("VOXWIRE_API_KEY") or None
        if self._api_key:
            bearer_header(self._api_key)  # a key no header can carry fails here, not at each connect
        self._opts = _Options(
            voice=voice, speaker=speaker, speed=speed, chunk_ms=chunk_ms, first_clause_words=first_clause_words,
            lexicon=lexicon,
        )
        self._client: Client | None = None
        self._connect_lock = asyncio.Lock()
        self._streams: weakref.WeakSet[SynthesizeStream] = weakref.WeakSet()
        self._prewarm_task: asyncio.Task[None] | None = None

    @property
    def provider(self) -> str:
        return "Voxwire"

    @property
    def model(self) -> str:
        return self._client.ready.get("engine", "unknown") if self._client else "unknown"

    def update_options(
        self,
        *,
        voice: NotGivenOr[str] = NOT_GIVEN,
        speaker: NotGivenOr[str | int | None] = NOT_GIVEN,
        speed: NotGivenOr[float] = NOT_GIVEN,
        chunk_ms: NotGivenOr[int] = NOT_GIVEN,
        first_clause_words: NotGivenOr[int] = NOT_GIVEN,
        lexicon: NotGivenOr[dict[str, str] | None] = NOT_GIVEN,
    ) -> None:
        """For the streams and ``synthesize`` calls made from now on: an utterance's
        settings are fixed by its first message. ``speaker=None``: the voice's default
        speaker again (a speaker belongs to its voice: a new voice may want it reset)."""
        if utils.is_given(voice):
            self._opts.voice = voice
        if utils.is_given(speaker):
            self._opts.speaker = speaker
        if utils.is_given(speed):
            self._opts.speed = speed
        if utils.is_given(chunk_ms):
            self._opts.chunk_ms = chunk_ms
        if utils.is_given(first_clause_words):
            self._opts.first_clause_words = first_clause_words
        if utils.is_given(lexicon):
            self._opts.lexicon = lexicon

    def synthesize(
        self, text: str, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
    ) -> ChunkedStream:
        return ChunkedStream(tts=self, input_text=text, conn_options=conn_options)

    def stream(self, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS) -> SynthesizeStream:
        stream = SynthesizeStream(tts=self, conn_options=conn_options)
        self._streams.add(stream)
        return stream

    def prewarm(self) -> None:
        """Open the socket before the first utterance needs it."""

        async def connect() -> None:
            with contextlib.suppress(Exception):  # the first utterance will retry and report it
                await self._connection(DEFAULT_API_CONNECT_OPTIONS.timeout)

        if self._prewarm_task is None or self._prewarm_task.done():
            self._prewarm_task = asyncio.create_task(connect())

    async def aclose(self) -> None:
        for stream in list(self._streams):
            await stream.aclose()
        if self._prewarm_task is not None:
            await utils.aio.cancel_and_wait(self._prewarm_task)
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def _connection(self, timeout: float) -> Client:
        """The shared socket, opened again if it has closed (dropped, or idle for too long)."""
        async with self._connect_lock:
            if self._client is None or self._client.closed:
                with self._errors():
                    # No progress reports: the frames are taken as fast as they come, so
                    # reports would bound nothing and would spend the connection's message
                    # rate, which the tokens of every stream on it share.
                    connecting = Client.connect(self._url, api_key=self._api_key, report_progress=False, pace=True)
                    self._client = await asyncio.wait_for(connecting, timeout)
                if not self._client.ready.get("features", {}).get("timestamps"):
                    self._capabilities = tts.TTSCapabilities(streaming=True, aligned_transcript=False)
            return self._client

    @contextlib.contextmanager
    def _errors(self, client: Client | None = None) -> Iterator[None]:
        """Voxwire's failures as the framework's errors, which decide whether it retries."""
        try:
            yield
        except ServerError as e:
            if e.code == "session_text_limit" and client is not None and client is self._client:
                # This socket has spent its text: new utterances (and the retry) go to a
                # fresh one; it closes when the server finds it idle.
                self._client = None
            raise APIStatusError(f"{e.code}: {e.message}", status_code=_STATUS.get(e.code, 400), body=e.code) from None
        except Closed as e:
            if e.refused:
                raise APIStatusError(f"Voxwire refused the connection: {e.reason}", status_code=401) from None
            raise APIConnectionError(f"Voxwire connection closed ({e.code}) {e.reason}".rstrip()) from e
        except websockets.InvalidStatus as e:  # answered over HTTP, not upgraded (a wrong path, a proxy)
            raise APIStatusError(f"Voxwire: {e}", status_code=e.response.status_code) from None
        except asyncio.TimeoutError as e:  # before OSError, of which it is one
            raise APITimeoutError("Voxwire did not answer in time") from e
        except (OSError, websockets.WebSocketException) as e:
            raise APIConnectionError("Voxwire connection failed") from e

    def _settings(self, opts: _Options, client: Client) -> dict[str, object]:
        settings: dict[str, object] = {"format": "pcm_s16le", "sample_rate": self.sample_rate}
        settings.update({k: v for k, v in vars(opts).items() if v is not None})
        if client.ready.get("features", {}).get("timestamps"):
            settings["timestamps"] = True  # asked elsewhere, the server refuses the utterance
        return settings


class ChunkedStream(tts.ChunkedStream):
    """One whole text, one utterance."""

    def __init__(self, *, tts: TTS, input_text: str, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, input_text=input_text, conn_options=conn_options)
        self._tts: TTS = tts
        self._opts = replace(tts._opts)

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        ctx = utils.shortuuid()
        output_emitter.initialize(
            request_id=ctx, sample_rate=self._tts.sample_rate, num_channels=1, mime_type="audio/pcm"
        )
        client = await self._tts._connection(self._conn_options.timeout)
        settings = self._tts._settings(self._opts, client)
        with self._tts._errors(client):
            utterance = await client.speak(self._input_text, ctx=ctx, final=True, **settings)
            try:
                await _pump(utterance, output_emitter, _Transcript(self._input_text))
            finally:
                await _stop(utterance)


class SynthesizeStream(tts.SynthesizeStream):
    """Text as an LLM writes it, one utterance per stream."""

    def __init__(self, *, tts: TTS, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, conn_options=conn_options)
        self._tts: TTS = tts
        self._opts = replace(tts._opts)

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        ctx = utils.shortuuid()
        output_emitter.initialize(
            request_id=ctx, sample_rate=self._tts.sample_rate, num_channels=1, mime_type="audio/pcm", stream=True
        )
        client = await self._tts._connection(self._conn_options.timeout)
        with self._tts._errors(client):
            # Opened before the first token, with the settings only a first message may carry.
            utterance = await client.speak("", ctx=ctx, final=False, **self._tts._settings(self._opts, client))
        output_emitter.start_segment(segment_id=ctx)
        transcript = _Transcript()

        async def send_text() -> None:
            unflushed = False
            async for data in self._input_ch:
                if isinstance(data, self._FlushSentinel):
                    # end_input() flushes too: one flush is enough for the same text.
                    if unflushed:
                        await utterance.flush()
                    unflushed = False
                    continue
                self._mark_started()
                transcript.add(data)
                await utterance.send(data)
                unflushed = True
            await utterance.send("", final=True)

        sender = asyncio.create_task(send_text())
        try:
            with self._tts._errors(client):
                await asyncio.gather(sender, _pump(utterance, output_emitter, transcript))
            output_emitter.end_segment()
        finally:
            await utils.aio.cancel_and_wait(sender)
            await _stop(utterance)


class _Transcript:
    """One utterance's text as it was pushed, handed back a slice at a time as the server
    times its words. The server's words are written words without their punctuation
    ("nine" for "nine,"): LiveKit joins the TimedStrings into the transcript and the chat
    history, so each carries its stretch of the text itself, from the end of the last one
    to the end of its word and the punctuation after it. Joined, they are the text."""

    SKIPPABLE = 2
    """Words of the text that may go by untimed before a timed word is taken to be one
    the server wrote differently, and left for the text's end."""

    def __init__(self, text: str = "") -> None:
        self.text = text
        self._at = 0  # how much of the text has been handed back

    def add(self, text: str) -> None:
        self.text += text

    def timed(self, word: str, start: float, end: float) -> TimedString | None:
        """The stretch of text that ends with ``word``, timed as it; None if the word is not
        found just ahead (its text then goes with the next word that is)."""
        found = re.compile(rf"(?<!\w){re.escape(word)}(?!\w)", re.IGNORECASE).search(self.text, self._at)
        if found is None or len(re.findall(r"\w+", self.text[self._at : found.start()])) > self.SKIPPABLE:
            return None
        stop = found.end()
        while stop < len(self.text) and not self.text[stop].isspace():
            stop += 1  # a word's punctuation is spoken with it
        piece, self._at = self.text[self._at : stop], stop
        return TimedString(piece, start_time=start, end_time=end)

    def rest(self, at: float) -> TimedString | None:
        """What no timed word has taken (a closing quote, a word the server wrote
        differently), once the whole utterance has been spoken."""
        piece, self._at = self.text[self._at :], len(self.text)
        return TimedString(piece, start_time=at, end_time=at) if piece else None


async def _pump(utterance: Utterance, emitter: tts.AudioEmitter, transcript: _Transcript) -> None:
    """An utterance's audio and word timings into the framework's emitter, until it ends."""
    seconds = 0.0
    # Without word timings (CosyVoice2), LiveKit builds the transcript from the text itself.
    timed_words = bool(utterance.client.ready.get("features", {}).get("timestamps"))
    async for item in utterance:
        if isinstance(item, Audio):
            emitter.push(item.data)
            seconds += item.samples / item.sample_rate
        elif item.type == "timestamps":
            # Times are from the utterance's first sample: the segment's own timeline.
            timed = [transcript.timed(w["word"], w["start_ms"] / 1000, w["end_ms"] / 1000) for w in item["words"]]
            if found := [t for t in timed if t is not None]:
                emitter.push_timed_transcript(found)
        elif item.type == "flushed":
            emitter.flush()  # the audio before the flush is all here: let its tail go too
        elif item.type == "error":
            # Not terminal on the server, but some of our text was refused: the speech
            # would not be what was asked.
            raise ServerError(item["code"], item["message"], utterance.ctx)
        elif item.type == "done" and timed_words and (rest := transcript.rest(seconds)) is not None:
            emitter.push_timed_transcript(rest)


async def _stop(utterance: Utterance) -> None:
    """Cancel an utterance the server is still speaking (the stream was closed, or failed).
    Nobody reads it any more: its audio still on the way is dropped by the client's reader
    rather than queued for ever on a long-lived socket."""
    await utterance.close()
