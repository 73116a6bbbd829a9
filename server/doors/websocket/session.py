"""One WebSocket connection: protocol dispatch, its defaults and its utterances by ``ctx``.

The session turns parsed protocol messages into pipeline calls (server/pipeline.py) and
runs one asyncio task per utterance, which reads the utterance's events and sends them
as protocol v1 messages. It never touches a socket itself: it is given two coroutines
that send text and bytes, so the same session serves any transport and is easy to test.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from voxwire.server import protocol
from voxwire.server.audio import describe
from voxwire.server.limits import Limits, TokenBucket
from voxwire.server.pipeline import (
    AudioFrame, Done, Event, FailedEvent, FlushedEvent, Pipeline, Refused, Speech, UtteranceRequest, Words,
)
from voxwire.server.protocol import Cancel, Configure, Flush, Progress, ProtocolError, Speak, StreamSettings

log = logging.getLogger(__name__)

SendText = Callable[[str], Awaitable[None]]
SendBytes = Callable[[bytes], Awaitable[None]]
DOOR = "ws"

ENDED_CTX_REMEMBERED = 4096
"""Ended ctx ids a connection remembers: a late cancel for one is not an error, and text
for one is refused (ctx_finished) instead of opening a new utterance under its name."""


class ListenerStalled(RuntimeError):
    """The connection takes nothing: a send waited ``stall_timeout_seconds`` beyond the
    time a player would have heard all it was sent. Every utterance on it has ended with
    ``listener_stalled`` and its slot is free; the door must drop the connection without
    waiting on it (no frame, a close frame included, can reach the client now). A
    RuntimeError, as a send on a closed socket is: either way the socket is unusable."""


@dataclass
class Voicing:
    """One utterance of this connection: its ``ctx``, its speech and the task sending it."""

    ctx: str
    speech: Speech
    last_text_at: float
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    waiting_since: float | None = None
    """When its task began to wait for the next event (None while it has one in hand)."""
    progress_at: float | None = None
    """When its client first reported playback progress, or last reported more played."""
    played: int = 0

    def quiet_listener_since(self) -> float | None:
        """Since when a client that reports progress has reported none while the engine,
        with more to compute, waits for it (the playback window is in hand); None while
        that is not so. Waiting for the engine or for the producer's text never counts."""
        if self.progress_at is None or self.waiting_since is None or not self.speech.held_by_listener:
            return None
        # The task waits from its last event on; the window can only become full with an
        # event (more audio) or with the first report, so this is when the hold began.
        return max(self.waiting_since, self.progress_at)


class Session:
    def __init__(
        self,
        pipeline: Pipeline,
        defaults: StreamSettings,
        limits: Limits,
        send_text: SendText,
        send_bytes: SendBytes,
    ) -> None:
        self.pipeline = pipeline
        self.defaults = defaults
        self.limits = limits
        self._send_text = send_text
        self._send_bytes = send_bytes
        # Several utterance tasks share one socket; frames must not interleave mid-send.
        self._send_lock = asyncio.Lock()
        self._live: dict[str, Voicing] = {}
        self._ended: OrderedDict[str, None] = OrderedDict()  # a bounded set, oldest first
        self._auto_ctx = 0
        self._closed = False
        self._bucket = TokenBucket(limits.messages_per_second, limits.message_burst)
        self._session_chars = 0
        self.id = secrets.token_hex(6)
        self.last_message_at = time.monotonic()
        self._playing_until = 0.0
        """When the client will have played every frame it was sent (monotonic clock)."""
        self._not_reading = False
        """A send outlasted the stall timeout: the socket takes nothing, nothing more is sent."""

    # -- messages -------------------------------------------------------------------------

    def ready_message(self) -> str:
        engine = self.pipeline.engine()
        return protocol.event(
            "ready",
            protocol=protocol.PROTOCOL_VERSION,
            session=self.id,
            engine=engine.name,
            precision=engine.precision,
            sample_rate=engine.sample_rate,
            voices=[v.to_dict() for v in engine.voices()],
            defaults=self._shown(self.defaults),
            formats=list(protocol.FORMATS),
            features={"timestamps": engine.timestamps, "voice_cloning": engine.clones_voices},
            limits=self.limits.to_dict(),
        )

    async def handle(self, data: str | bytes) -> None:
        """Act on one client message. Protocol errors are answered, never raised;
        ``ListenerStalled`` is, when the socket takes nothing (the door must drop it)."""
        self._check_reading()
        self.last_message_at = time.monotonic()
        try:
            message = protocol.parse(data)
            # Parsed first, so the refusal can name the utterance whose text was dropped.
            if not self._bucket.take():
                dropped = ProtocolError(
                    "rate_limited",
                    f"more than {self.limits.messages_per_second:g} messages per second; this message was dropped",
                    getattr(message, "ctx", None),
                )
                dropped.message_type = "progress" if isinstance(message, Progress) else None
                raise dropped
            if isinstance(message, Configure):
                await self._config(message)
            elif isinstance(message, Speak):
                await self._speak(message)
            elif isinstance(message, Flush):
                await self._flush(message.ctx)
            elif isinstance(message, Cancel):
                await self._cancel(message.ctx)
            elif isinstance(message, Progress):
                self._progress(message)
        except ProtocolError as e:
            terminal = {"terminal": self._terminal(e)} if e.ctx is not None else {}
            await self._send(protocol.error(e.code, e.message, e.ctx, **terminal, **e.extra))

    def _terminal(self, e: ProtocolError) -> bool:
        """An error's ``terminal`` (docs/protocol.md, ``error``): no utterance is active
        under the ctx it names, except that an error about progress is never terminal."""
        # Progress neither opens nor ends an utterance: "terminal" would tell the client
        # that something ended, or that the ctx is spent, when neither is so.
        if e.message_type == "progress":
            return False
        return e.ctx not in self._live

    async def _config(self, message: Configure) -> None:
        settings = protocol.with_overrides(self.defaults, message.settings)
        try:
            # The voice is checked only when this config names one: with no voice yet (a
            # cloning engine), the other settings still apply.
            self.pipeline.resolve(settings, check_voice="voice" in message.settings)
        except Refused as e:
            raise _protocol_error(e, None) from None
        self.defaults = settings
        await self._send(protocol.event("configured", **self._shown(settings)))

    async def _speak(self, message: Speak) -> None:
        ctx = message.ctx
        voicing = self._live.get(ctx) if ctx is not None else None
        if voicing is not None:
            await self._continue(voicing, message)
            return
        if ctx is not None and ctx in self._ended:
            # Text that was on its way when the client cancelled (a barge-in) must not
            # open a new utterance, or it would be spoken at the start of the next turn.
            raise ProtocolError(
                "ctx_finished", f"utterance {ctx!r} has ended; start a new utterance with a new ctx", ctx
            )
        ctx = ctx if ctx is not None else self._auto_name()
        settings = protocol.with_overrides(self.defaults, message.settings)
        request = UtteranceRequest(DOOR, message.text, message.final, settings, {"session": self.id, "ctx": ctx})
        refusal = self._refusal(message.text, ctx)
        if refusal is not None:
            self.pipeline.refused(DOOR, refusal.code, request.ids, settings.voice, message.text)
            raise refusal
        try:
            speech = self.pipeline.open(request)
        except Refused as e:
            raise _protocol_error(e, ctx) from None
        self._session_chars += len(message.text)
        voicing = self._live[ctx] = Voicing(ctx, speech, last_text_at=time.monotonic())
        # The container and codec, so a client knows how to read the frames' bytes.
        started = {**speech.settings.to_dict(), **describe(speech.settings.format)}
        await self._send(protocol.event("started", ctx=ctx, **started))
        voicing.task = asyncio.create_task(self._stream(voicing), name=f"utterance-{ctx}")

    async def _continue(self, voicing: Voicing, message: Speak) -> None:
        """More text for a streamed utterance."""
        ctx = voicing.ctx
        if voicing.speech.complete:
            raise ProtocolError("ctx_finished", f"utterance {ctx!r} already received its final text", ctx)
        if message.settings:
            refused = " and ".join(f'"{name}"' for name in message.settings)
            raise ProtocolError(
                "invalid_field", f"{refused} can only be set in the first speak of an utterance", ctx
            )
        if voicing.speech.text_chars + len(message.text) > self.limits.max_text_chars:
            raise ProtocolError(
                "text_too_long", f"text is limited to {self.limits.max_text_chars} characters per utterance", ctx
            )
        self._check_session_text(message.text, ctx)
        voicing.last_text_at = time.monotonic()
        self._session_chars += len(message.text)
        voicing.speech.feed(message.text, message.final)

    def _refusal(self, text: str, ctx: str) -> ProtocolError | None:
        """This connection's own limits on a new utterance."""
        if len(text) > self.limits.max_text_chars:
            return ProtocolError("text_too_long", f"text is limited to {self.limits.max_text_chars} characters", ctx)
        try:
            self._check_session_text(text, ctx)
        except ProtocolError as e:
            return e
        if len(self._live) >= self.limits.max_utterances_per_socket:
            return ProtocolError(
                "too_many_utterances",
                f"at most {self.limits.max_utterances_per_socket} utterances may be active on one connection",
                ctx,
            )
        return None

    async def _flush(self, ctx: str) -> None:
        # Ended, or ending, while the flush was on its way: all its audio was sent, which
        # is what flushed says.
        if ctx in self._ended or not self._get(ctx).speech.flush():
            await self._send(protocol.event("flushed", ctx=ctx))

    async def _cancel(self, ctx: str) -> None:
        voicing = self._live.get(ctx)
        if voicing is None:
            if ctx in self._ended:
                return  # it finished while the cancel was on its way: nothing to stop
            raise ProtocolError("unknown_ctx", f"no active utterance {ctx!r}", ctx)
        await self._stop(voicing, "cancelled")
        stream = voicing.speech.stream
        await self._send(protocol.event("cancelled", ctx=ctx, samples_sent=stream.samples, frames=stream.frames))

    def _progress(self, message: Progress) -> None:
        """Playback progress: from now on this utterance is computed at most the flow
        window ahead of what the client has played (docs/protocol.md, flow control)."""
        voicing = self._live.get(message.ctx)
        # Not active: a player reporting the tail of an ended utterance, or one refused
        # while its first report was on the way. Progress is advice, so it is no error.
        if voicing is not None:
            played = min(message.played, voicing.speech.stream.samples)
            if voicing.progress_at is None or played > voicing.played:
                voicing.progress_at, voicing.played = time.monotonic(), played
            voicing.speech.played(message.played, self.limits.flow_window_seconds)

    def _shown(self, settings: StreamSettings) -> dict[str, object]:
        """Settings as a client is told them: the default voice by its current name
        (null while the engine has none)."""
        shown = settings.to_dict()
        if not settings.voice:
            shown["voice"] = self.pipeline.engine().default_voice()
        return shown

    def _get(self, ctx: str) -> Voicing:
        voicing = self._live.get(ctx)
        if voicing is None:
            raise ProtocolError("unknown_ctx", f"no active utterance {ctx!r}", ctx)
        return voicing

    def _auto_name(self) -> str:
        """A ctx for a speak that named none: never one the client uses or used here."""
        while True:
            self._auto_ctx += 1
            ctx = f"auto-{self._auto_ctx}"
            if ctx not in self._live and ctx not in self._ended:
                return ctx

    def _check_session_text(self, text: str, ctx: str | None) -> None:
        if self._session_chars + len(text) > self.limits.max_session_chars:
            raise ProtocolError(
                "session_text_limit",
                f"a connection may send at most {self.limits.max_session_chars} characters; open a new one",
                ctx,
            )

    # -- one utterance ----------------------------------------------------------------------

    async def _stream(self, voicing: Voicing) -> None:
        speech, ctx = voicing.speech, voicing.ctx
        try:
            async for event in self._events(voicing):
                if isinstance(event, AudioFrame):
                    await self._send(protocol.audio_frame(ctx, event.seq, event.offset, event.samples, event.data))
                    assert speech.first_frame_at is not None
                    played_by = speech.first_frame_at + speech.stream.samples / speech.settings.sample_rate
                    self._playing_until = max(self._playing_until, played_by)
                    # A send into a socket with room does not suspend; yield anyway, so a
                    # cancel waiting on this connection is read between two frames.
                    await asyncio.sleep(0)
                elif isinstance(event, Words):
                    await self._send(protocol.event("timestamps", ctx=ctx, words=list(event.words)))
                elif isinstance(event, FlushedEvent):
                    await self._send(protocol.event("flushed", ctx=ctx))
                elif isinstance(event, Done):
                    await self._send(protocol.event("done", ctx=ctx, **event.figures.to_dict()))
                    speech.end("done")
                elif isinstance(event, FailedEvent):
                    speech.end("failed", event.code)
                    await self._send(protocol.error(event.code, event.message, ctx, terminal=True))
        except asyncio.CancelledError:
            raise
        except ListenerStalled:
            pass  # every utterance here has ended already, listener_stalled
        except Exception:
            # A send that fails means the socket is gone; the session's close cleans up.
            log.debug("utterance %s stopped: socket closed", ctx, exc_info=True)
            speech.end("disconnected")
        finally:
            self._forget(voicing)

    @staticmethod
    async def _events(voicing: Voicing) -> AsyncIterator[Event]:
        """The utterance's events, noting while its task waits for the next one: the time
        a listener that reports progress can be found to hold the engine back."""
        events = voicing.speech.events()
        while True:
            voicing.waiting_since = time.monotonic()
            try:
                event = await anext(events)
            except StopAsyncIteration:
                return
            finally:
                voicing.waiting_since = None
            yield event

    def _forget(self, voicing: Voicing) -> None:
        if self._live.get(voicing.ctx) is voicing:
            del self._live[voicing.ctx]
            self._ended[voicing.ctx] = None
            if len(self._ended) > ENDED_CTX_REMEMBERED:
                self._ended.popitem(last=False)

    async def _stop(self, voicing: Voicing, outcome: str, code: str | None = None) -> None:
        """End an utterance from this side (cancel, idle, shutdown, socket gone): its
        computation stops and its queued audio goes, before anything else is sent."""
        voicing.speech.end(outcome, code)
        if voicing.task is not None and not voicing.task.done():
            voicing.task.cancel()
            # wait() rather than await: a cancel of this coroutine itself must propagate.
            await asyncio.wait({voicing.task})
        voicing.speech.drop_queued()
        self._forget(voicing)

    # -- idleness ------------------------------------------------------------------------------

    def idle_in(self, now: float) -> float:
        """Seconds until this connection is idle (0 or less: it is), as protocol.md defines
        it: no message and nothing playing for the idle timeout, where playing lasts until
        the audio sent has been heard. Infinite while an utterance with all its text is
        still being computed or sent, or while one waits for text: that one ends first, with
        its own idle_timeout error, so the close never overtakes the error."""
        if self._live:
            return math.inf
        quiet_since = max(self.last_message_at, self._playing_until)
        return quiet_since + self.limits.idle_timeout_seconds - now

    def open_utterance_expires_in(self, now: float) -> float:
        """Seconds until the first streamed utterance that is waiting for text has waited
        the idle timeout (infinite when none waits)."""
        waiting = [v.last_text_at for v in self._live.values() if not v.speech.complete]
        return min(waiting) + self.limits.idle_timeout_seconds - now if waiting else math.inf

    async def end_waiting_utterances(self, now: float) -> None:
        """End each streamed utterance that received no text for the idle timeout (its
        producer has gone quiet) and each whose listener stalled (below): neither must
        hold a slot for ever. The door calls this at least once a second while any
        utterance is active. Raises ``ListenerStalled`` once the socket takes nothing."""
        self._check_reading()
        await self._end_stalled_listeners(now)
        idle = self.limits.idle_timeout_seconds
        for voicing in list(self._live.values()):
            if not voicing.speech.complete and now - voicing.last_text_at >= idle:
                await self._stop(voicing, "failed", "idle_timeout")
                await self._send(
                    protocol.error(
                        "idle_timeout", f"utterance {voicing.ctx!r} received no text for {idle:g} s and has ended",
                        voicing.ctx, terminal=True,
                    )
                )

    # -- stalled listeners ----------------------------------------------------------------------

    async def _end_stalled_listeners(self, now: float) -> None:
        """End each utterance whose client reports progress but has reported none for the
        stall timeout while the engine waited for it (the flow window in hand): behind a
        proxy that buffers without bound it is the only sign that nobody listens. A client
        that stops reading altogether is caught by the send itself (``_send``)."""
        stall = self.limits.stall_timeout_seconds
        for voicing in list(self._live.values()):
            since = voicing.quiet_listener_since()
            if since is None or now - since < stall:
                continue
            voicing.speech.end_stalled("no_progress")
            await self._stop(voicing, "failed", "listener_stalled")
            log.info("session %s: utterance %s: no playback progress for %g s", self.id, voicing.ctx, stall)
            await self._send(
                protocol.error(
                    "listener_stalled",
                    f"utterance {voicing.ctx!r} has ended: its audio waited {stall:g} s "
                    "(stall_timeout_seconds) with no playback progress reported",
                    voicing.ctx, terminal=True,
                )
            )

    def _listener_stalled(self) -> ListenerStalled:
        """The socket took nothing for the stall timeout: every utterance on it ends now
        (slot, computation and queued audio given back). No error can be sent through a
        socket that takes nothing, so the utterances are counted and logged as
        ``listener_stalled``, and the door drops the connection."""
        self._not_reading = True
        stall = self.limits.stall_timeout_seconds
        current = asyncio.current_task()
        for voicing in list(self._live.values()):
            voicing.speech.end_stalled("not_reading")
            # Not awaited: the one sending may be this very task, and nothing follows.
            if voicing.task is not None and voicing.task is not current:
                voicing.task.cancel()
            voicing.speech.drop_queued()
            self._forget(voicing)
        log.info("session %s: the client took no audio for %g s; dropping the connection", self.id, stall)
        return ListenerStalled(f"the client took no audio for {stall:g} s (stall_timeout_seconds)")

    def _check_reading(self) -> None:
        if self._not_reading:
            raise ListenerStalled("the client takes no audio")

    # -- transport ---------------------------------------------------------------------------

    async def _send(self, message: str | bytes) -> None:
        """Send one frame, waiting at most the stall timeout for the socket to take it.
        A client that stops reading fills the socket's buffers and then a send waits for
        as long as it does (the transport's write buffer is full): unbounded, it would
        hold this utterance, every other one on the socket and their slots for ever."""
        if self._closed:
            raise ConnectionError("session closed")
        async with self._send_lock:
            self._check_reading()
            now = time.monotonic()
            # A player that reads only as it plays leaves the buffers full while it has
            # audio in hand; it has stalled only once all it was sent could have played.
            wait = max(now, self._playing_until) + self.limits.stall_timeout_seconds - now
            try:
                async with asyncio.timeout(wait):
                    if isinstance(message, str):
                        await self._send_text(message)
                    else:
                        await self._send_bytes(message)
            except TimeoutError:
                raise self._listener_stalled() from None

    async def fail_all(self, code: str, message: str) -> None:
        """Stop every utterance, telling its client why (a shutdown past its deadline)."""
        for voicing in list(self._live.values()):
            await self._stop(voicing, "failed", code)
            await self._send(protocol.error(code, message, voicing.ctx, terminal=True))

    async def close(self) -> None:
        """The socket is gone: stop every utterance, so no computation outlives it."""
        self._closed = True
        for voicing in list(self._live.values()):
            await self._stop(voicing, "disconnected")

    @property
    def active(self) -> int:
        return len(self._live)


def _protocol_error(refused: Refused, ctx: str | None) -> ProtocolError:
    retry = {"retry_after_ms": refused.retry_after_ms} if refused.retry_after_ms else {}
    return ProtocolError(refused.code, refused.message, ctx, **retry)

