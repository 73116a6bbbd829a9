"""One WebSocket connection: protocol dispatch, its defaults and its utterances by ``ctx``.

The session turns parsed protocol messages into pipeline calls (server/pipeline.py) and
runs one task per utterance (``Door.speak``), which sends the utterance's events as
protocol v1 messages. It never touches a socket itself: it is given two coroutines that
send text and bytes, so the same session serves any transport and is easy to test.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from voxwire.engine.errors import ErrorCode
from voxwire.server import protocol
from voxwire.server.audio import describe
from voxwire.server.doors.base import FLOOD_WINDOW_SECONDS, Door, Flooded
from voxwire.server.framing import AudioFrame, DoneEvent, Event, FailedEvent, FlushedEvent, Words
from voxwire.server.pipeline import Refused
from voxwire.server.protocol import Cancel, Configure, Flush, Progress, ProtocolError, Speak, StreamSettings
from voxwire.server.speech import Speech

log = logging.getLogger(__name__)

SendText = Callable[[str], Awaitable[None]]
SendBytes = Callable[[bytes], Awaitable[None]]

ENDED_CTX_REMEMBERED = 4096
"""Ended ctx ids a connection remembers: a late cancel for one is not an error, and text
for one is refused (ctx_finished) instead of opening a new utterance under its name."""


@dataclass
class ActiveUtterance:
    """One utterance of this connection: its ``ctx``, its speech and the task sending it."""

    ctx: str
    speech: Speech
    last_text_at: float
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    waiting_since: float | None = field(default_factory=time.monotonic)
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
    def __init__(self, door: Door, defaults: StreamSettings, send_text: SendText, send_bytes: SendBytes) -> None:
        self.door = door
        self.pipeline = door.pipeline
        self.defaults = defaults
        self.limits = door.limits
        self._send_text = send_text
        self._send_bytes = send_bytes
        # Several utterance tasks share one socket: the sender takes one message at a time.
        self._sender = door.sender(self._transmit, self._listener_stalled)
        self._live: dict[str, ActiveUtterance] = {}
        self._ended: OrderedDict[str, None] = OrderedDict()  # a bounded set, oldest first
        self._auto_ctx = 0
        self._closed = False
        self._budget = door.budget()
        self.id = secrets.token_hex(6)
        self.last_message_at = time.monotonic()

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
        self._sender.check()
        self.last_message_at = time.monotonic()
        try:
            message = protocol.parse(data)
            # Parsed first, so the refusal can name the utterance whose text was dropped. A
            # cancel of an active utterance is never dropped: it only gives work back.
            stops = isinstance(message, Cancel) and message.ctx in self._live
            if not stops and not self._budget.take_message():
                await self._drop(message)
                return
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
            await self._send(protocol.error(e.code, e.message, e.ctx, **self._terminal_field(e), **e.extra))

    async def _drop(self, message: protocol.Message) -> None:
        """Answer a message the rate limit dropped. Text dropped from an utterance leaves
        it with a hole the client cannot see, or open for ever when the dropped one was its
        last: so the utterance ends (terminal), and a ctx whose first text was dropped is
        spent. Raises ``Flooded`` once the client keeps sending far over the rate."""
        if not self._budget.tolerate_drop():
            raise Flooded(
                f"more than {self.limits.max_dropped_messages} messages dropped in {FLOOD_WINDOW_SECONDS:g} s "
                f"(over {self.limits.messages_per_second:g} per second)"
            )
        ctx = getattr(message, "ctx", None)
        said = f"more than {self.limits.messages_per_second:g} messages per second; this message was dropped"
        if isinstance(message, Speak):
            active = self._live.get(ctx) if ctx is not None else None
            if active is not None and not active.speech.complete:
                await self._stop(active, "failed", ErrorCode.RATE_LIMITED)
                said += ", and its utterance has ended: its text would have had a hole"
            elif active is None and ctx is not None:
                self._remember_ended(ctx)
        dropped = ProtocolError(ErrorCode.RATE_LIMITED, said, ctx)
        dropped.message_type = "progress" if isinstance(message, Progress) else None
        await self._send(protocol.error(dropped.code, dropped.message, ctx, **self._terminal_field(dropped)))

    def _terminal_field(self, e: ProtocolError) -> dict[str, bool]:
        return {"terminal": self._terminal(e)} if e.ctx is not None else {}

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
            # The voice is checked only when this config names one, or a speaker of it:
            # with no voice yet (a cloning engine), the other settings still apply.
            names = "voice" in message.settings or message.settings.get("speaker") is not None
            self.pipeline.resolve(settings, check_voice=names)
        except Refused as e:
            raise _protocol_error(e, None) from None
        self.defaults = settings
        await self._send(protocol.event("configured", **self._shown(settings)))

    async def _speak(self, message: Speak) -> None:
        ctx = message.ctx
        active = self._live.get(ctx) if ctx is not None else None
        if active is not None:
            await self._continue(active, message)
            return
        if ctx is not None and ctx in self._ended:
            # Text that was on its way when the client cancelled (a barge-in) must not
            # open a new utterance, or it would be spoken at the start of the next turn.
            raise ProtocolError(
                ErrorCode.CTX_FINISHED, f"utterance {ctx!r} has ended; start a new utterance with a new ctx", ctx
            )
        ctx = ctx if ctx is not None else self._auto_name()
        settings = protocol.with_overrides(self.defaults, message.settings)
        ids = {"session": self.id, "ctx": ctx}
        try:
            speech = self.door.open_utterance(
                message.text, message.final, settings, ids, self._budget, refusal=self._too_many(),
            )
        except Refused as e:
            raise _protocol_error(e, ctx) from None
        active = self._live[ctx] = ActiveUtterance(ctx, speech, last_text_at=time.monotonic())
        # The container and codec, so a client knows how to read the frames' bytes.
        started = {**speech.settings.to_dict(), **describe(speech.settings.format)}
        if speech.ignored:  # said once: what of its SSML this server does not read
            started["ssml_ignored"] = list(speech.ignored)
        await self._send(protocol.event("started", ctx=ctx, **started))
        active.task = self.door.speak(
            speech, lambda event: self._deliver(active, event), f"utterance-{ctx}",
            on_end=lambda: self._forget(active),
        )

    async def _continue(self, active: ActiveUtterance, message: Speak) -> None:
        """More text for a streamed utterance."""
        ctx = active.ctx
        if active.speech.complete:
            raise ProtocolError(ErrorCode.CTX_FINISHED, f"utterance {ctx!r} already received its final text", ctx)
        if message.settings:
            refused = " and ".join(f'"{name}"' for name in message.settings)
            raise ProtocolError(
                ErrorCode.INVALID_FIELD, f"{refused} can only be set in the first speak of an utterance", ctx
            )
        try:
            self.door.feed(active.speech, message.text, message.final, self._budget)
        except Refused as e:
            raise _protocol_error(e, ctx) from None
        active.last_text_at = time.monotonic()

    def _too_many(self) -> Refused | None:
        """This connection's own limit on a new utterance: its active ones."""
        if len(self._live) < self.limits.max_utterances_per_socket:
            return None
        return Refused(
            ErrorCode.TOO_MANY_UTTERANCES,
            f"at most {self.limits.max_utterances_per_socket} utterances may be active on one connection",
        )

    async def _flush(self, ctx: str) -> None:
        # Ended, or ending, while the flush was on its way: all its audio was sent, which
        # is what flushed says.
        if ctx in self._ended or not self._get(ctx).speech.flush():
            await self._send(protocol.event("flushed", ctx=ctx))

    async def _cancel(self, ctx: str) -> None:
        active = self._live.get(ctx)
        if active is None:
            if ctx in self._ended:
                return  # it finished while the cancel was on its way: nothing to stop
            raise ProtocolError(ErrorCode.UNKNOWN_CTX, f"no active utterance {ctx!r}", ctx)
        await self._stop(active, "cancelled")
        speech = active.speech
        heard = {"text_sent": speech.text_sent, "text_played": speech.text_played}
        await self._send(protocol.event(
            "cancelled", ctx=ctx, samples_sent=speech.samples_sent, frames=speech.frames_sent,
            **{k: v for k, v in heard.items() if v is not None},
        ))

    def _progress(self, message: Progress) -> None:
        """Playback progress: from now on this utterance is computed at most the flow
        window ahead of what the client has played (docs/protocol.md, flow control)."""
        active = self._live.get(message.ctx)
        # Not active: a player reporting the tail of an ended utterance, or one refused
        # while its first report was on the way. Progress is advice, so it is no error.
        if active is not None:
            played = min(message.played, active.speech.samples_sent)
            if active.progress_at is None or played > active.played:
                active.progress_at, active.played = time.monotonic(), played
            active.speech.played(message.played, self.limits.flow_window_seconds)

    def _shown(self, settings: StreamSettings) -> dict[str, object]:
        """Settings as a client is told them: the default voice by its current name
        (null while the engine has none)."""
        shown = settings.to_dict()
        if not settings.voice:
            shown["voice"] = self.pipeline.engine().default_voice()
        return shown

    def _get(self, ctx: str) -> ActiveUtterance:
        active = self._live.get(ctx)
        if active is None:
            raise ProtocolError(ErrorCode.UNKNOWN_CTX, f"no active utterance {ctx!r}", ctx)
        return active

    def _auto_name(self) -> str:
        """A ctx for a speak that named none: never one the client uses or used here."""
        while True:
            self._auto_ctx += 1
            ctx = f"auto-{self._auto_ctx}"
            if ctx not in self._live and ctx not in self._ended:
                return ctx

    # -- one utterance ----------------------------------------------------------------------

    async def _deliver(self, active: ActiveUtterance, event: Event) -> None:
        """One of the utterance's events, sent as protocol v1 has it. Between two, its
        task waits: the time a listener that reports progress can hold the engine back."""
        ctx = active.ctx
        active.waiting_since = None
        if isinstance(event, AudioFrame):
            await self._send(protocol.audio_frame(ctx, event.seq, event.offset, event.samples, event.data), active.speech)
            # A send into a socket with room does not suspend; yield anyway, so a cancel
            # waiting on this connection is read between two frames.
            await asyncio.sleep(0)
        elif isinstance(event, Words):
            await self._send(protocol.event("timestamps", ctx=ctx, words=list(event.words)))
        elif isinstance(event, FlushedEvent):
            await self._send(protocol.event("flushed", ctx=ctx))
        elif isinstance(event, DoneEvent):
            await self._send(protocol.event("done", ctx=ctx, **event.figures.to_dict()))
        elif isinstance(event, FailedEvent):
            await self._send(protocol.error(event.code, event.message, ctx, terminal=True))
        active.waiting_since = time.monotonic()

    def _forget(self, active: ActiveUtterance) -> None:
        if self._live.get(active.ctx) is active:
            del self._live[active.ctx]
            self._remember_ended(active.ctx)

    def _remember_ended(self, ctx: str) -> None:
        self._ended[ctx] = None
        if len(self._ended) > ENDED_CTX_REMEMBERED:
            self._ended.popitem(last=False)

    async def _stop(self, active: ActiveUtterance, outcome: str, code: str | None = None) -> None:
        """End an utterance from this side (cancel, idle, shutdown, socket gone): its
        computation stops and its queued audio goes, before anything else is sent."""
        await self.door.stop(active.speech, active.task, outcome, code)
        self._forget(active)

    # -- idleness ------------------------------------------------------------------------------

    def idle_in(self, now: float) -> float:
        """Seconds until this connection is idle (0 or less: it is), as protocol.md defines
        it: no message and nothing playing for the idle timeout, where playing lasts until
        the audio sent has been heard. Infinite while an utterance with all its text is
        still being computed or sent, or while one waits for text: that one ends first, with
        its own idle_timeout error, so the close never overtakes the error."""
        if self._live:
            return math.inf
        quiet_since = max(self.last_message_at, self._sender.playing_until)
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
        self._sender.check()
        await self._end_stalled_listeners(now)
        idle = self.limits.idle_timeout_seconds
        for active in list(self._live.values()):
            if not active.speech.complete and now - active.last_text_at >= idle:
                await self._stop(active, "failed", ErrorCode.IDLE_TIMEOUT)
                await self._send(
                    protocol.error(
                        ErrorCode.IDLE_TIMEOUT,
                        f"utterance {active.ctx!r} received no text for {idle:g} s and has ended",
                        active.ctx, terminal=True,
                    )
                )

    # -- stalled listeners ----------------------------------------------------------------------

    async def _end_stalled_listeners(self, now: float) -> None:
        """End each utterance whose client reports progress but has reported none for the
        stall timeout while the engine waited for it (the flow window in hand): behind a
        proxy that buffers without bound it is the only sign that nobody listens. A client
        that stops reading altogether is caught by the send itself (``_send``)."""
        stall = self.limits.stall_timeout_seconds
        for active in list(self._live.values()):
            since = active.quiet_listener_since()
            if since is None or now - since < stall:
                continue
            active.speech.end_stalled("no_progress")
            await self._stop(active, "failed", ErrorCode.LISTENER_STALLED)
            log.info("session %s: utterance %s: no playback progress for %g s", self.id, active.ctx, stall)
            await self._send(
                protocol.error(
                    ErrorCode.LISTENER_STALLED,
                    f"utterance {active.ctx!r} has ended: its audio waited {stall:g} s "
                    "(stall_timeout_seconds) with no playback progress reported",
                    active.ctx, terminal=True,
                )
            )

    def _listener_stalled(self) -> None:
        """The socket took nothing for the stall timeout (the sender raises
        ``ListenerStalled`` next): every utterance on it ends now (slot, computation and
        queued audio given back). No error can be sent through a socket that takes nothing,
        so the utterances are counted and logged as ``listener_stalled``, and the door
        drops the connection."""
        stall = self.limits.stall_timeout_seconds
        current = asyncio.current_task()
        for active in list(self._live.values()):
            active.speech.end_stalled("not_reading")
            # Not awaited: the one sending may be this very task, and nothing follows.
            if active.task is not None and active.task is not current:
                active.task.cancel()
            active.speech.drop_queued()
            self._forget(active)
        log.info("session %s: the client took no audio for %g s; dropping the connection", self.id, stall)

    # -- transport ---------------------------------------------------------------------------

    async def _send(self, message: str | bytes, audio_of: Speech | None = None) -> None:
        """Send one message, bounded by the stall rule (``Sender``; ``audio_of``: the
        speech whose audio it carries). Raises ``ListenerStalled`` once the socket takes
        nothing."""
        if self._closed:
            raise ConnectionError("session closed")
        await self._sender.send(message, audio_of)

    async def _transmit(self, message: str | bytes) -> None:
        if isinstance(message, str):
            await self._send_text(message)
        else:
            await self._send_bytes(message)

    async def fail_all(self, code: str, message: str) -> None:
        """Stop every utterance, telling its client why (a shutdown past its deadline)."""
        for active in list(self._live.values()):
            await self._stop(active, "failed", code)
            await self._send(protocol.error(code, message, active.ctx, terminal=True))

    async def close(self) -> None:
        """The socket is gone: stop every utterance, so no computation outlives it."""
        self._closed = True
        for active in list(self._live.values()):
            await self._stop(active, "disconnected")


def _protocol_error(refused: Refused, ctx: str | None) -> ProtocolError:
    retry = {"retry_after_ms": refused.retry_after_ms} if refused.retry_after_ms else {}
    return ProtocolError(refused.code, refused.message, ctx, **retry)

