"""One Wyoming connection's events, without the socket: answered, and turned into utterances.

Events come in (read by wire.py, or the reader's end, or what it could not read), and
events go out through a coroutine the session is given, under the stall rule every door
shares (``Sender``, server/doors/base.py). Each utterance goes through the door base, so
its admission, text budget, task and stop are the other doors'.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace

from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.event import Event
from wyoming.info import Describe
from wyoming.ping import Ping, Pong
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped

from voxwire.engine.base import EngineError
from voxwire.engine.errors import ErrorCode, quoted
from voxwire.server.doors.base import Conversation, Door
from voxwire.server.doors.wyoming.wire import (
    CHANNELS, WIDTH, BadEvent, BadField, error, info, speaker_of, text_of, voice_of,
)
from voxwire.server.framing import AudioFrame, DoneEvent, Event as SpeechEvent, FailedEvent
from voxwire.server.pipeline import Refused
from voxwire.server.protocol import StreamSettings
from voxwire.server.speech import Speech

log = logging.getLogger(__name__)

Send = Callable[[Event], Awaitable[None]]

END_OF_INPUT = None
"""What the reader gives once the client has finished writing."""

Received = Event | BadEvent | None


class WyomingSession(Conversation[Received]):
    """One Wyoming connection's events: answered, and turned into pipeline utterances.

    One utterance at a time, as Wyoming clients ask for them. ``handle`` returns False
    when the connection should close: after an error that ends a request (a client that
    does not know ``error`` events, Home Assistant's among them, would otherwise wait for
    an ``audio-stop`` that never comes; a closed connection it does understand).
    """

    def __init__(self, door: Door, defaults: StreamSettings, send: Send) -> None:
        super().__init__()
        self.door = door
        self.pipeline = door.pipeline
        self.limits = door.limits
        # Wyoming audio is 16-bit mono; rate and chunk duration are the server's defaults
        # (the engine's own rate unless the operator set --sample-rate).
        self.settings = replace(defaults, format="pcm_s16le", timestamps=False)
        # The utterance task and the event handling share the connection.
        self._sender = door.sender(send, self._listener_stalled)
        self.id = secrets.token_hex(6)
        self._budget = door.budget()
        self._count = 0
        self.speech: Speech | None = None
        self._task: asyncio.Task[None] | None = None
        self._streaming = False
        """Between synthesize-start and synthesize-stop."""
        self.last_active_at = time.monotonic()

    @property
    def stalled(self) -> bool:
        """A send waited the stall timeout: the client reads nothing, and cannot be told."""
        return self._sender.stalled

    # -- events --------------------------------------------------------------------------------

    async def handle(self, event: Received) -> bool:
        """Act on one event (or the reader's end, or what it could not read); False:
        close the connection."""
        if isinstance(event, BadEvent):
            await self.send(error(event.code, event.message))
            return False
        if event is END_OF_INPUT:
            return await self._end_of_input()
        self.last_active_at = time.monotonic()
        if not self._budget.take_message():
            return await self._drop(event)
        try:
            return await self._dispatch(event)
        except BadField as e:
            await self.send(error(ErrorCode.INVALID_EVENT, str(e)))
            return True
        except (KeyError, TypeError, ValueError, AttributeError):
            # The event classes read fields as they find them; a wrong shape is the client's.
            wrong_shape = f"a {quoted(event.type)} event with fields of the wrong shape"
            await self.send(error(ErrorCode.INVALID_EVENT, wrong_shape))
            return True

    async def _drop(self, event: Event) -> bool:
        """Answer an event the rate limit dropped; False: close. A dropped chunk of a
        streamed text, or its synthesize-stop, would leave a hole in the speech, or the
        speech open for ever: the utterance fails and the connection closes, as on any
        failure here. So does a client that keeps sending far over the rate."""
        said = f"more than {self.limits.messages_per_second:g} events per second; this one was dropped"
        if not self._budget.tolerate_drop():
            log.info("wyoming connection %s: closing a connection that floods", self.id)
            await self.send(error(ErrorCode.RATE_LIMITED, f"{said}; closing a connection that keeps sending too fast"))
            return False
        streamed_text = SynthesizeChunk.is_type(event.type) or SynthesizeStop.is_type(event.type)
        if streamed_text and self._streaming:
            await self._stop("failed", ErrorCode.RATE_LIMITED)
            await self.send(error(ErrorCode.RATE_LIMITED, f"{said}; it carried text, so its utterance has ended"))
            return False
        await self.send(error(ErrorCode.RATE_LIMITED, said))
        return True

    async def _dispatch(self, event: Event) -> bool:
        if Describe.is_type(event.type):
            try:
                await self.send(info(self.pipeline.engine()).event())
            except EngineError as e:  # the worker is being replaced
                await self.send(error(e.code, e.message))
        elif Ping.is_type(event.type):
            await self.send(Pong(text=Ping.from_event(event).text).event())
        elif Synthesize.is_type(event.type):
            if self._streaming:
                # Clients that stream send the whole text once more, between the chunks and
                # synthesize-stop, for servers that do not stream: already being spoken.
                return True
            # Read here rather than by Synthesize.from_event, which takes a voice of the
            # wrong shape for no voice at all, and the default voice would speak unasked.
            text, voice, speaker = text_of(event.data["text"]), voice_of(event.data), speaker_of(event.data)
            if await self._busy():
                return True
            return await self._open(text, voice, speaker, event.data.get("text_format"), final=True)
        elif SynthesizeStart.is_type(event.type):
            voice, speaker = voice_of(event.data), speaker_of(event.data)
            if await self._busy():
                return True
            if not await self._open("", voice, speaker, event.data.get("text_format"), final=False):
                return False
            self._streaming = True
        elif SynthesizeChunk.is_type(event.type):
            return await self._feed(text_of(SynthesizeChunk.from_event(event).text), final=False)
        elif SynthesizeStop.is_type(event.type):
            return await self._feed("", final=True)
        else:
            await self.send(error(ErrorCode.UNKNOWN_EVENT, f"this server does not answer {quoted(event.type)} events"))
        return True

    async def _busy(self) -> bool:
        """An utterance is being spoken here: said so (the request is not taken)."""
        if self.speech is None:
            return False
        await self.send(error(ErrorCode.BUSY, "one utterance at a time on a connection; open another for more"))
        return True

    async def _open(self, text: str, voice: str, speaker: str | None, text_format: object, final: bool) -> bool:
        """Open an utterance and start sending it (``voice`` "": the default one; ``speaker``
        None: the voice's default); False (after an error): close."""
        self._count += 1
        ids = {"session": self.id, "utterance": str(self._count)}
        settings = replace(self.settings, voice=voice or self.settings.voice, speaker=speaker,
                           text_format="ssml" if text_format == "ssml" else "text")
        try:
            speech = self.door.open_utterance(text, final, settings, ids, self._budget, refusal=_format_refusal(text_format))
        except Refused as e:
            await self.send(error(e.code, e.message))
            return False
        self.speech = speech
        await self.send(AudioStart(rate=speech.settings.sample_rate, width=WIDTH, channels=CHANNELS, timestamp=0).event())
        self._task = self.door.speak(
            speech, lambda event: self._deliver(speech, event, streamed=not final), f"wyoming-{self.id}",
            on_gone=self.closing.set, on_end=lambda: self._ended(speech),
        )
        return True

    async def _feed(self, text: str, final: bool) -> bool:
        speech = self.speech
        if not self._streaming or speech is None:
            kind = "synthesize-stop" if final else "synthesize-chunk"
            await self.send(error(ErrorCode.NO_STREAM, f"{kind} comes between synthesize-start and synthesize-stop"))
            return True
        try:
            self.door.feed(speech, text, final, self._budget)
        except Refused as e:
            speech.end("failed", e.code)
            await self.send(error(e.code, e.message))
            return False
        if final:
            self._streaming = False
        return True

    async def _end_of_input(self) -> bool:
        """The client has finished writing (EOF on read: a half-close, not a client gone,
        which a reset or a failed write shows): the utterance in flight is finished and
        sent, then the connection closes.

        A stream that never got synthesize-stop ends with the text that arrived, answered
        as if synthesize-stop had come (audio-stop, synthesize-stopped): the client can send
        nothing more, and it asked for that text to be spoken."""
        if self.speech is not None:
            if self._streaming:
                await self._feed("", final=True)
            if self._task is not None:
                await asyncio.wait({self._task})
        return False

    # -- one utterance ---------------------------------------------------------------------------

    async def _deliver(self, speech: Speech, event: SpeechEvent, streamed: bool) -> None:
        rate = speech.settings.sample_rate
        if isinstance(event, AudioFrame):
            await self.send(AudioChunk(
                rate=rate, width=WIDTH, channels=CHANNELS, audio=event.data, timestamp=event.offset * 1000 // rate,
            ).event(), speech)
        elif isinstance(event, DoneEvent):
            await self.send(AudioStop(timestamp=speech.samples_sent * 1000 // rate).event())
            if streamed:
                await self.send(SynthesizeStopped().event())
        elif isinstance(event, FailedEvent):
            await self.send(error(event.code, event.message))
            self.closing.set()

    def _ended(self, speech: Speech) -> None:
        if self.speech is speech:
            self.speech = None
            self._streaming = False
            self.last_active_at = time.monotonic()

    # -- idleness and the end ------------------------------------------------------------------------

    def idle_in(self, now: float) -> float:
        """Seconds until the connection is idle (0 or less: it is): no event for the idle
        timeout, and no utterance with all its text still being spoken. A streamed
        utterance waiting for text counts as idle: its producer has gone quiet."""
        if self.speech is not None and self.speech.complete:
            return math.inf
        return self.last_active_at + self.limits.idle_timeout_seconds - now

    async def idle(self) -> None:
        idle = self.limits.idle_timeout_seconds
        if self.speech is not None:
            await self._stop("failed", ErrorCode.IDLE_TIMEOUT)
        await self.send(error(ErrorCode.IDLE_TIMEOUT, f"no event for {idle:g} s; closing the connection"))

    async def close(self, outcome: str = "disconnected", code: str | None = None) -> None:
        """The connection is ending: its utterance stops, so no computation outlives it."""
        if self.stalled and self.speech is not None:
            self.speech.end_stalled("not_reading")
        if self.speech is not None:
            await self._stop(outcome, code)

    async def _stop(self, outcome: str, code: str | None) -> None:
        if self.speech is None:
            return
        await self.door.stop(self.speech, self._task, outcome, code)
        self.speech = None
        self._streaming = False

    async def send(self, event: Event, audio_of: Speech | None = None) -> None:
        """Send one event (``audio_of``: the speech whose audio it carries); raises
        ``ListenerStalled`` when the client has taken nothing for the stall timeout beyond
        what it could have played (``Sender``). Every send is bounded: a client that stops
        reading (half-closed or not) would otherwise hold its connection and utterance slot
        for ever. The worker has stopped computing for it long before (its queue is full:
        backpressure)."""
        await self._sender.send(event, audio_of)

    def _listener_stalled(self) -> None:
        stall = self.limits.stall_timeout_seconds
        log.info("wyoming connection %s: the client read nothing for %g s; dropping it", self.id, stall)
        self.closing.set()


def _format_refusal(text_format: object) -> Refused | None:
    """This door's own rule on a new utterance's text: Wyoming's two formats."""
    if text_format not in (None, "text", "ssml"):
        return Refused(ErrorCode.UNSUPPORTED_TEXT_FORMAT, f"text_format is 'text' or 'ssml', not {text_format!r}")
    return None
