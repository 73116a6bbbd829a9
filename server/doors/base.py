"""What every door shares, so that a door is only its protocol.

A door is a way in: a protocol that clients speak (protocol v1 over WebSocket, OpenAI's
speech route, Wyoming over TCP). Each is a ``Door`` subclass in its own module under
server/doors/, registered once (server/doors/__init__.py), and built by the service with
a ``Host``: what the service lends every door. The base owns what no door should write
again:

- the connection gate (``Gate``): refused while draining, before the engine is ready and
  at capacity, each refusal counted and logged; a connection's slot given back, and its
  shutdown registered for the drain, by ``Door.connection``;
- the text budget (``TextBudget``): characters per utterance and per connection, and the
  token bucket on messages;
- the idle timeout and the receive loop around it (``Door.converse``);
- an utterance's life: opened within the text budget (``Door.open_utterance``), fed
  (``Door.feed``), run as a task (``Door.speak``, ``utterance_events``) that ends the
  speech itself, ``done``, ``failed``, or ``disconnected``, whatever happens, and stopped
  from the door's side (``Door.stop``);
- the bounded send (``Sender``): one stall rule for every door, counted from when the
  listener will have heard the audio already sent.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from starlette.routing import BaseRoute

from voxwire.engine.base import Engine
from voxwire.engine.errors import ErrorCode
from voxwire.engine.text import expanded_length
from voxwire.server.accounting import Accounting
from voxwire.server.config import ServerConfig
from voxwire.server.limits import MIN_CONNECTIONS_PER_CLIENT, Admission, Limits, TokenBucket
from voxwire.server.framing import DoneEvent, Event, FailedEvent
from voxwire.server.pipeline import Pipeline, Refused
from voxwire.server.protocol import StreamSettings
from voxwire.server.speech import Speech, UtteranceRequest

log = logging.getLogger(__name__)

Shutdown = Callable[[], Awaitable[None]]
"""Ends one connection at the drain deadline: tells its client, then closes it."""

Message = TypeVar("Message")

FLOOD_WINDOW_SECONDS = 10.0
"""The window ``Limits.max_dropped_messages`` counts over (as a token bucket's refill)."""


class ListenerStalled(ConnectionError):
    """The client takes none of its audio: a send waited the stall timeout beyond the time
    a player would have heard all it was sent. Its utterances end ``listener_stalled`` and
    its slots are free; the door drops the connection without waiting on it (nothing, a
    close included, can reach the client now). A ConnectionError, as a send on a
    connection that has gone is: either way the connection is unusable."""


class Flooded(Exception):
    """The client kept sending far over its message rate (``TextBudget.tolerate_drop``):
    the door closes the connection, saying why where its protocol can (1008 on a socket)."""


class Gate:
    """Who may connect, and who is connected, whichever door they came through."""

    def __init__(self, admission: Admission, accounting: Accounting, ready: Callable[[], bool]) -> None:
        self.admission = admission
        self.accounting = accounting
        self._ready = ready
        self.draining = False
        self.connections: dict[object, Shutdown] = {}
        """Every open connection, with what ends it at the drain deadline."""
        self.clients: collections.Counter[str] = collections.Counter()
        """Open connections by client address, in this process (``per_client``)."""

    @property
    def per_client(self) -> int:
        """The most connections one client address may hold: ``max_connections_per_client``,
        by default a quarter of ``max_connections`` (at least ``MIN_CONNECTIONS_PER_CLIENT``),
        so that one client cannot hold every slot and lock everyone else out."""
        limits = self.admission.limits
        return limits.max_connections_per_client or max(MIN_CONNECTIONS_PER_CLIENT, limits.max_connections // 4)

    def refusal(self, client: str | None = None) -> Refused | None:
        """Why a new connection may not speak now; None when it may, having taken a
        connection slot (given back by ``Door.connection``) and, from a ``client`` address,
        one of that client's (given back by ``leave``)."""
        if self.draining:
            return Refused(ErrorCode.SHUTTING_DOWN, "the server is shutting down")
        if not self._ready():
            return Refused(ErrorCode.NOT_READY, "the server is not ready; try again shortly")
        if client is not None and self.clients[client] >= self.per_client:
            return Refused(
                ErrorCode.CLIENT_AT_CAPACITY,
                f"this address has {self.per_client} connections open, the most one client may",
            )
        if not self.admission.try_connect():
            return Refused(ErrorCode.AT_CAPACITY, "the server is at capacity; try again in a second")
        if client is not None:
            self.clients[client] += 1
        return None

    def leave(self, client: str | None) -> None:
        """A connection admitted from ``client`` has ended (its slot is ``Door.connection``'s)."""
        if client is None:
            return
        self.clients[client] -= 1
        if self.clients[client] <= 0:
            del self.clients[client]


@dataclass(frozen=True)
class Host:
    """What the service lends every door."""

    config: ServerConfig
    pipeline: Pipeline
    gate: Gate
    defaults: Callable[[], StreamSettings | None]
    """The session defaults, settled against the engine once it has loaded (None before)."""


class TextBudget:
    """One connection's bounds on text: characters per utterance (summed over its pieces)
    and over the connection's life, and messages per second (a token bucket with a burst
    allowance: an LLM's token stream is bursty)."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.chars = 0
        """Characters this connection has had spoken so far."""
        self._bucket = TokenBucket(limits.messages_per_second, limits.message_burst)
        self._drops = TokenBucket(limits.max_dropped_messages / FLOOD_WINDOW_SECONDS, limits.max_dropped_messages)

    def take_message(self) -> bool:
        """One more message may be read now; False: it is to be dropped."""
        return self._bucket.take()

    def tolerate_drop(self) -> bool:
        """One more message was dropped; False: the connection has had more than
        ``max_dropped_messages`` dropped within ``FLOOD_WINDOW_SECONDS``, a flood, to be cut."""
        return self._drops.take()

    def refusal(self, text: str, utterance_chars: int = 0) -> Refused | None:
        """Why ``text`` may not join an utterance that has ``utterance_chars`` already.
        Characters count as normalisation expands them (``expanded_length``)."""
        chars = expanded_length(text)
        if utterance_chars + chars > self.limits.max_text_chars:
            return Refused(
                ErrorCode.TEXT_TOO_LONG, f"text is limited to {self.limits.max_text_chars} characters per utterance",
            )
        if self.chars + chars > self.limits.max_session_chars:
            return Refused(
                ErrorCode.SESSION_TEXT_LIMIT,
                f"a connection may send at most {self.limits.max_session_chars} characters; open a new one",
            )
        return None

    def spend(self, text: str) -> None:
        self.chars += expanded_length(text)


class Sender(Generic[Message]):
    """One connection's sends, each bounded by the stall rule every door shares.

    A send waits at most the stall timeout beyond the time the listener will have heard
    all the audio sent before it (``playing_until``): a player that reads only as it plays
    leaves the buffers full while it has audio in hand, and has stalled only once all it
    was sent could have played. Unbounded, a client that stops reading would hold its
    utterances and their slots for ever (the transport's buffers fill, and a send then
    waits as long as it does). Sends go one at a time: a connection's utterance tasks and
    its message handling may share it, and frames must not interleave mid-send."""

    def __init__(
        self, send: Callable[[Message], Awaitable[None]], stall_seconds: float, on_stall: Callable[[], None],
    ) -> None:
        self._send = send
        self.stall_seconds = stall_seconds
        self._on_stall = on_stall
        self._lock = asyncio.Lock()
        self.playing_until = 0.0
        """When the listener will have played every frame it was sent (monotonic clock)."""
        self.stalled = False
        """A send outlasted the stall timeout: the client takes nothing, nothing more is sent."""

    def check(self) -> None:
        """Raises ``ListenerStalled`` once a send has stalled."""
        if self.stalled:
            raise ListenerStalled("the client takes no audio")

    async def send(self, message: Message, audio_of: Speech | None = None) -> None:
        """Send ``message`` (with ``audio_of``, it carries that speech's audio, which counts
        as in the listener's hands once it is taken). A send that outlasts the bound marks
        the connection stalled, runs ``on_stall`` once, and raises ``ListenerStalled``."""
        async with self._lock:
            self.check()
            now = time.monotonic()
            try:
                async with asyncio.timeout(max(now, self.playing_until) + self.stall_seconds - now) as bound:
                    await self._send(message)
            except TimeoutError:
                if not bound.expired():
                    raise  # the socket's own (ETIMEDOUT): a client gone, not one not reading
                self.stalled = True
                self._on_stall()
                raise ListenerStalled(
                    f"the client took no audio for {self.stall_seconds:g} s (stall_timeout_seconds)"
                ) from None
            heard_by = None if audio_of is None else audio_of.heard_by
            if heard_by is not None:
                self.playing_until = max(self.playing_until, heard_by)


class Conversation(Generic[Message]):
    """One connection as the receive loop (``Door.converse``) sees it, whatever its
    protocol: messages handled in order, duties on a clock, an end when idle."""

    def __init__(self) -> None:
        self.closing = asyncio.Event()
        """Set when the connection should end now (a request failed, the client is gone)."""

    async def handle(self, message: Message) -> bool:
        """Act on one message; False: the conversation is over."""
        raise NotImplementedError

    def idle_in(self, now: float) -> float:
        """Seconds until the connection is idle (0 or less: it is)."""
        raise NotImplementedError

    async def idle(self) -> None:
        """Say goodbye to an idle client (the door closes the connection after)."""

    def wake_in(self, now: float) -> float:
        """Seconds until ``tick`` has something to do (infinite: nothing scheduled)."""
        return math.inf

    async def tick(self, now: float) -> None:
        """Duties on the clock, at least once a second while the connection is open."""


class Door:
    """A way in. A subclass names itself, and gives the app routes to mount or starts a
    listener of its own (``bind``, ``start``, ``close``); the rest is shared."""

    name: ClassVar[str]
    """The ``door`` label of the metrics and the log lines: ``ws``, ``http``, ``wyoming``."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.config = host.config
        self.limits = host.config.limits
        self.pipeline = host.pipeline
        self.gate = host.gate

    # -- the service's side ------------------------------------------------------------------

    def routes(self) -> list[BaseRoute]:
        """The HTTP and WebSocket routes this door adds to the app."""
        return []

    def check(self, engine: Engine) -> None:
        """Refuse, before serving, this door's settings that the loaded engine cannot
        honour (a voice it does not have): one line ends startup. Raises ValueError."""

    def bind(self) -> None:
        """Claim what the door listens on, before serving: a port that cannot be had ends
        startup with one line. Raises OSError."""

    async def start(self) -> None:
        """Start serving, on the server's loop."""

    def close(self) -> None:
        """Stop taking connections; those open are ended by the drain."""

    # -- what every door does alike ----------------------------------------------------------

    def defaults(self) -> StreamSettings:
        defaults = self.host.defaults()
        assert defaults is not None, "a door serves only once the service has loaded"
        return defaults

    def admit(self, client: str | None = None, close_code: Callable[[str], int] | None = None) -> Refused | None:
        """Admit a new connection, or say why not (counted and logged, with the close code
        the door answers with: ``close_code`` of the refusal's code, none by default). An
        admitted one holds a slot, and from a ``client`` address one of that client's,
        until ``connection`` ends."""
        refusal = self.gate.refusal(client)
        if refusal is not None:
            self.refuse_connection(refusal.code, close_code(refusal.code) if close_code is not None else 0)
        return refusal

    def refuse_connection(self, reason: str, close_code: int = 0) -> None:
        """Count and log a connection this door turned away: for its own reason (a key),
        or the gate's, with the close code it answers with (0: none)."""
        self.pipeline.accounting.connection_refused(self.name, reason, close_code)

    @contextlib.asynccontextmanager
    async def connection(self, key: object, shutdown: Shutdown, client: str | None = None) -> AsyncIterator[None]:
        """An admitted connection's life: the drain can end it (``shutdown``), and its
        slots (the server's, and the ``client`` address's it was admitted with) are
        given back however it ends."""
        self.gate.connections[key] = shutdown
        try:
            yield
        finally:
            self.gate.connections.pop(key, None)
            self.gate.admission.disconnect()
            self.gate.leave(client)

    def budget(self) -> TextBudget:
        return TextBudget(self.limits)

    def sender(self, send: Callable[[Message], Awaitable[None]], on_stall: Callable[[], None]) -> Sender[Message]:
        """A connection's bounded sends (``Sender``), under the server's stall timeout."""
        return Sender(send, self.limits.stall_timeout_seconds, on_stall)

    # -- an utterance's life -----------------------------------------------------------------

    def open_utterance(
        self, text: str, final: bool, settings: StreamSettings, ids: dict[str, str],
        budget: TextBudget | None = None, refusal: Refused | None = None,
    ) -> Speech:
        """Admit a new utterance: the door's own ``refusal`` of it (if any), then the
        connection's text ``budget`` (None: the door bounds its text itself), then the
        pipeline (a slot, the cache, the worker). Its text is spent from the budget once
        it is open. Raises ``Refused``, recorded under the door's name."""
        if refusal is None and budget is not None:
            refusal = budget.refusal(text)
        if refusal is not None:
            self.refused(refusal.code, ids, settings.voice, text, settings.speaker)
            raise refusal
        speech = self.pipeline.open(UtteranceRequest(self.name, text, final, settings, ids))
        if budget is not None:
            budget.spend(text)
        return speech

    def feed(self, speech: Speech, text: str, final: bool, budget: TextBudget) -> None:
        """More text for an open utterance, within the connection's text budget. Raises
        ``Refused`` (the text is not taken; what that does to the utterance is the door's)."""
        refusal = budget.refusal(text, speech.text_chars)
        if refusal is not None:
            raise refusal
        budget.spend(text)
        speech.feed(text, final)

    def refused(
        self, code: str, ids: dict[str, str], voice: str = "", text: str = "", speaker: str | None = None,
    ) -> None:
        """Record a new utterance this door turned away by its own rules (bad input, its limits)."""
        self.pipeline.refused(self.name, code, ids, voice, text, speaker)

    def speak(
        self, speech: Speech, deliver: Callable[[Event], Awaitable[None]], name: str,
        on_gone: Callable[[], None] | None = None, on_end: Callable[[], None] | None = None,
    ) -> asyncio.Task[None]:
        """The utterance's task: every event delivered in order, and the speech ended
        whatever happens (``utterance_events``). A delivery that raises
        ``ListenerStalled`` ends it ``listener_stalled``; any other error is a client gone
        (``disconnected``, then ``on_gone``). Whoever cancels the task ends the speech
        first, as they mean it to end. ``on_end`` runs last, however the task ends."""

        async def run() -> None:
            try:
                async for event in utterance_events(speech):
                    await deliver(event)
            except asyncio.CancelledError:
                raise
            except ListenerStalled:
                speech.end_stalled("not_reading")
            except Exception:
                log.debug("%s utterance stopped: the connection is gone", self.name, exc_info=True)
                speech.end("disconnected")
                if on_gone is not None:
                    on_gone()
            finally:
                speech.end("disconnected")  # cancelled: the canceller's own end, if any, stands
                if on_end is not None:
                    on_end()

        return asyncio.create_task(run(), name=name)

    async def stop(
        self, speech: Speech, task: asyncio.Task[None] | None, outcome: str, code: str | None = None,
    ) -> None:
        """End an utterance from the door's side (a cancel, idleness, a shutdown, the client
        gone) as ``outcome``: its computation stops, its task (``speak``'s) is cancelled and
        awaited, and its queued audio goes, before the door sends anything else."""
        speech.end(outcome, code)
        if task is not None and not task.done():
            task.cancel()
            # wait() rather than await: a cancel of the caller itself must propagate.
            await asyncio.wait({task})
        speech.drop_queued()

    async def converse(
        self, conversation: Conversation[Message], receive: Callable[[], Awaitable[Message]],
    ) -> None:
        """Read messages into ``conversation`` until it is over, closing, or idle (told).

        One receive outlives the idle checks: cancelling it could lose a message. The next
        one is started while a message is handled: behind a proxy (Ray Serve) a client's
        going reaches the app only through a pending receive."""
        idle = self.limits.idle_timeout_seconds
        closing = asyncio.ensure_future(conversation.closing.wait())
        pending: asyncio.Future[Message] | None = None
        try:
            while not conversation.closing.is_set():
                now = time.monotonic()
                await conversation.tick(now)
                idle_in = conversation.idle_in(now)
                if idle_in <= 0:
                    await conversation.idle()
                    return
                # Wake when the connection or a duty is due; with neither, look again
                # within the idle timeout (or a second).
                wake = min(idle_in, conversation.wake_in(now))
                timeout = min(idle, 1.0) if math.isinf(wake) else max(wake, 0.01)
                pending = pending or asyncio.ensure_future(receive())
                waiting: set[asyncio.Future[Any]] = {pending, closing}
                await asyncio.wait(waiting, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                if not pending.done():
                    continue
                message, pending = pending.result(), asyncio.ensure_future(receive())
                if not await conversation.handle(message):
                    return
        finally:
            closing.cancel()
            if pending is not None:
                pending.cancel()


async def utterance_events(speech: Speech) -> AsyncIterator[Event]:
    """The speech's events for a door to send, with the speech ended by them: ``done``
    before DoneEvent is yielded (so the slot is free and the figures are counted by the
    time the client hears of it), ``failed`` with its code before FailedEvent. A door that
    stops reading before either ends the speech itself (``Door.speak`` does)."""
    async for event in speech.events():
        if isinstance(event, DoneEvent):
            speech.end("done")
        elif isinstance(event, FailedEvent):
            speech.end("failed", event.code)
        yield event
