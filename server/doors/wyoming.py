"""The third door: the Wyoming protocol, so Home Assistant's Assist speaks through Voxwire.

Wyoming is a JSON-lines-plus-binary protocol over TCP (the ``wyoming`` package on PyPI).
This door answers, with that package's own event classes:

- ``describe`` with ``info``: one TTS program, the engine's voices, streaming supported;
- ``synthesize`` with ``audio-start``, ``audio-chunk``s as the engine makes them (the
  server's chunk duration, 16-bit mono), then ``audio-stop``;
- ``synthesize-start``, ``synthesize-chunk``..., ``synthesize-stop`` (text arriving in
  pieces, fed into the same incremental segmenter as protocol v1's streamed text) with
  the same audio events, then ``synthesize-stopped``;
- ``ping`` with ``pong``.

A client that half-closes (shuts its write side after its request, as ``nc -N`` does)
has finished writing, not gone: what it asked for is still spoken to it, then the
connection closes. A client that has gone is found by a write failing.

Every utterance goes through the one pipeline (server/pipeline.py), so admission, the
result cache, the metrics and the log line are the other doors'. ``WyomingSession`` is
the event handling without sockets (events in, events sent through a coroutine it is
given); ``WyomingDoor`` is the TCP listener around it, bound when the service loads.
deploy/home-assistant.md says how to point Home Assistant at it; Wyoming has no
authentication (see ``wyoming_host``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from importlib import metadata

import orjson
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event, async_write_event
from wyoming.info import Attribution, Describe, Info, TtsProgram, TtsVoice
from wyoming.ping import Ping, Pong
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped

from voxwire.engine.base import Engine, EngineError
from voxwire.engine.errors import CodedError, quoted
from voxwire.server.doors.base import Conversation, Door, Host, ListenerStalled
from voxwire.server.net import unauthenticated_host
from voxwire.server.pipeline import AudioFrame, Done, Event as SpeechEvent, FailedEvent, Refused, Speech
from voxwire.server.protocol import StreamSettings
from voxwire.server.sockets import GOODBYE_SECONDS, handed, listening_socket

log = logging.getLogger(__name__)

WIDTH = 2  # bytes per sample: 16-bit PCM, the format every Wyoming client plays
CHANNELS = 1

Send = Callable[[Event], Awaitable[None]]


class BadField(ValueError):
    """An event whose fields have the wrong shape: answered, and the connection goes on."""


class BadEvent(CodedError):
    """Input that cannot be read as a Wyoming event: the connection cannot go on."""


# -- reading events, with bounds -----------------------------------------------------------


async def read_event(reader: asyncio.StreamReader, max_bytes: int) -> Event | None:
    """The next event, or None at the end of the stream. Raises ``BadEvent``.

    The format is the ``wyoming`` package's (a JSON header line, then ``data_length``
    bytes of JSON merged into its data, then ``payload_length`` bytes), but its own
    reader believes the lengths a header claims: a header saying 2 GB makes it wait for
    2 GB. Here an event is at most ``max_bytes`` in all, and the header line is bounded by
    the reader's limit (set to the same when the connection is accepted).
    """
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as e:
        if not e.partial.strip():
            return None
        raise BadEvent("invalid_event", "the connection ended inside an event header") from None
    except asyncio.LimitOverrunError:
        raise BadEvent("event_too_large", f"an event header is limited to {max_bytes} bytes") from None
    try:
        header = orjson.loads(line)
    except orjson.JSONDecodeError:
        raise BadEvent("invalid_event", "an event header must be one line of JSON") from None
    if not isinstance(header, dict) or not isinstance(header.get("type"), str):
        raise BadEvent("invalid_event", "an event header must be a JSON object with a string 'type'")
    data = header.get("data") or {}
    if not isinstance(data, dict):
        raise BadEvent("invalid_event", "an event's 'data' must be a JSON object")
    data_length, payload_length = _length(header, "data_length"), _length(header, "payload_length")
    if len(line) + data_length + payload_length > max_bytes:
        raise BadEvent("event_too_large", f"an event is limited to {max_bytes} bytes; this one claims more")
    try:
        if data_length:
            extra = orjson.loads(await reader.readexactly(data_length))
            if not isinstance(extra, dict):
                raise BadEvent("invalid_event", "an event's data must be a JSON object")
            data.update(extra)
        payload = await reader.readexactly(payload_length) if payload_length else None
    except asyncio.IncompleteReadError:
        raise BadEvent("invalid_event", "the connection ended inside an event") from None
    except orjson.JSONDecodeError:
        raise BadEvent("invalid_event", "an event's data must be JSON") from None
    return Event(type=header["type"], data=data, payload=payload)


def _length(header: dict[str, object], name: str) -> int:
    value = header.get(name)
    if value is None:
        return 0
    # true is an int to Python, not a length to a client.
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadEvent("invalid_event", f"'{name}' must be a non-negative integer")
    return value


# -- what the door says ------------------------------------------------------------------------


def _version() -> str | None:
    try:
        return metadata.version("voxwire")
    except metadata.PackageNotFoundError:
        return None


def info(engine: Engine) -> Info:
    """``info``: one TTS program, with the engine's voices by id and language."""
    attribution = Attribution(name="Voxwire", url="")
    voices = [
        TtsVoice(
            name=v.id, attribution=attribution, installed=True, description=v.name or v.id, version=None,
            languages=[v.language] if v.language else [],
        )
        for v in engine.voices()
    ]
    program = TtsProgram(
        name="voxwire", attribution=attribution, installed=True,
        description=f"Voxwire streaming text-to-speech ({engine.name} engine)", version=_version(),
        voices=voices, supports_synthesize_streaming=True,
    )
    return Info(tts=[program])


def error(code: str, message: str) -> Event:
    return Error(text=message, code=code).event()


# -- one connection, without the socket ----------------------------------------------------------


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
        self._send = send
        self._send_lock = asyncio.Lock()
        self.id = secrets.token_hex(6)
        self._budget = door.budget()
        self._count = 0
        self.speech: Speech | None = None
        self._task: asyncio.Task[None] | None = None
        self._streaming = False
        """Between synthesize-start and synthesize-stop."""
        self.last_active_at = time.monotonic()
        self.stalled = False
        """A send waited the stall timeout: the client reads nothing, and cannot be told."""

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
            await self.send(error("invalid_event", str(e)))
            return True
        except (KeyError, TypeError, ValueError, AttributeError):
            # The event classes read fields as they find them; a wrong shape is the client's.
            await self.send(error("invalid_event", f"a {quoted(event.type)} event with fields of the wrong shape"))
            return True

    async def _drop(self, event: Event) -> bool:
        """Answer an event the rate limit dropped; False: close. A dropped chunk of a
        streamed text, or its synthesize-stop, would leave a hole in the speech, or the
        speech open for ever: the utterance fails and the connection closes, as on any
        failure here. So does a client that keeps sending far over the rate."""
        said = f"more than {self.limits.messages_per_second:g} events per second; this one was dropped"
        if not self._budget.tolerate_drop():
            log.info("wyoming connection %s: closing a connection that floods", self.id)
            await self.send(error("rate_limited", f"{said}; closing a connection that keeps sending too fast"))
            return False
        streamed_text = SynthesizeChunk.is_type(event.type) or SynthesizeStop.is_type(event.type)
        if streamed_text and self._streaming:
            await self._stop("failed", "rate_limited")
            await self.send(error("rate_limited", f"{said}; it carried text, so its utterance has ended"))
            return False
        await self.send(error("rate_limited", said))
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
            text, voice = _text(event.data["text"]), _voice(event.data)
            if await self._busy():
                return True
            return await self._open(text, voice, event.data.get("text_format"), final=True)
        elif SynthesizeStart.is_type(event.type):
            voice = _voice(event.data)
            if await self._busy():
                return True
            if not await self._open("", voice, event.data.get("text_format"), final=False):
                return False
            self._streaming = True
        elif SynthesizeChunk.is_type(event.type):
            return await self._feed(_text(SynthesizeChunk.from_event(event).text), final=False)
        elif SynthesizeStop.is_type(event.type):
            return await self._feed("", final=True)
        else:
            await self.send(error("unknown_event", f"this server does not answer {quoted(event.type)} events"))
        return True

    async def _busy(self) -> bool:
        """An utterance is being spoken here: said so (the request is not taken)."""
        if self.speech is None:
            return False
        await self.send(error("busy", "one utterance at a time on a connection; open another for more"))
        return True

    async def _open(self, text: str, voice: str, text_format: object, final: bool) -> bool:
        """Open an utterance and start sending it; False (after an error): close."""
        self._count += 1
        ids = {"session": self.id, "utterance": str(self._count)}
        settings = replace(self.settings, voice=voice) if voice else self.settings
        try:
            refusal = self._refusal(text, text_format)
            if refusal is not None:
                self.door.refused(refusal.code, ids, settings.voice, text)
                raise refusal
            speech = self.door.open(text, final, settings, ids)
        except Refused as e:
            await self.send(error(e.code, e.message))
            return False
        self._budget.spend(text)
        self.speech = speech
        await self.send(AudioStart(rate=speech.settings.sample_rate, width=WIDTH, channels=CHANNELS, timestamp=0).event())
        self._task = self.door.speak(
            speech, lambda event: self._deliver(speech, event, streamed=not final), f"wyoming-{self.id}",
            on_gone=self.closing.set, on_end=lambda: self._ended(speech),
        )
        return True

    def _refusal(self, text: str, text_format: object) -> Refused | None:
        """This door's own limits on a new utterance's text."""
        if text_format not in (None, "text"):
            return Refused("unsupported_text_format", "this server speaks plain text; SSML is not supported")
        return self._budget.refusal(text)

    async def _feed(self, text: str, final: bool) -> bool:
        speech = self.speech
        if not self._streaming or speech is None:
            kind = "synthesize-stop" if final else "synthesize-chunk"
            await self.send(error("no_stream", f"{kind} comes between synthesize-start and synthesize-stop"))
            return True
        refusal = self._budget.refusal(text, speech.text_chars)
        if refusal is not None:
            speech.end("failed", refusal.code)
            await self.send(error(refusal.code, refusal.message))
            return False
        self._budget.spend(text)
        speech.feed(text, final)
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
            ).event())
        elif isinstance(event, Done):
            await self.send(AudioStop(timestamp=speech.framer.samples * 1000 // rate).event())
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
            await self._stop("failed", "idle_timeout")
        await self.send(error("idle_timeout", f"no event for {idle:g} s; closing the connection"))

    async def close(self, outcome: str = "disconnected", code: str | None = None) -> None:
        """The connection is ending: its utterance stops, so no computation outlives it."""
        if self.stalled and self.speech is not None:
            self.speech.end_stalled("not_reading")
        if self.speech is not None:
            await self._stop(outcome, code)

    async def _stop(self, outcome: str, code: str | None) -> None:
        speech, task = self.speech, self._task
        if speech is None:
            return
        speech.end(outcome, code)
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task})
        self.speech = None
        self._streaming = False

    async def send(self, event: Event) -> None:
        """Send one event; raises ``ListenerStalled`` when the client has read nothing for
        the stall timeout. Every send is bounded: a client that stops reading (half-closed
        or not) would otherwise hold its connection and utterance slot for ever. The worker
        has stopped computing for it long before (its queue is full: backpressure)."""
        # The utterance task and the event handling share the connection.
        async with self._send_lock:
            if self.stalled:
                raise ListenerStalled("the client stopped reading")
            stall = self.limits.stall_timeout_seconds
            try:
                async with asyncio.timeout(stall) as bound:
                    await self._send(event)
            except TimeoutError:
                if not bound.expired():
                    raise  # the socket's own (ETIMEDOUT): a client gone, not one not reading
                log.info("wyoming connection %s: the client read nothing for %g s; dropping it", self.id, stall)
                self.stalled = True
                self.closing.set()
                raise ListenerStalled("the client stopped reading") from None


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError("text must be a string")
    return value


def _voice(data: dict[str, object]) -> str:
    """The voice id a ``synthesize`` or ``synthesize-start`` asks for, "" for the default
    (no ``voice``, or one without a ``name``). Raises ``BadField``: a voice of the wrong
    shape is a mistake to be told, not a request for the default voice."""
    voice = data.get("voice")
    if voice is None:
        return ""
    if not isinstance(voice, dict):
        example = orjson.dumps({"name": voice[:40] if isinstance(voice, str) else "a voice id from info"}).decode()
        raise BadField(f"'voice' must be an object such as {example}, not {_kind(voice)}")
    name = voice.get("name")
    if name is None:
        return ""
    if not isinstance(name, str):
        raise BadField(f"'voice.name' must be a voice id from info (a string), not {_kind(name)}")
    return name


def _kind(value: object) -> str:
    """What a JSON value is, as a message names it."""
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, (int, float)):
        return "a number"
    return {str: "a string", list: "a list", dict: "an object"}.get(type(value), "null")


# -- TCP -----------------------------------------------------------------------------------------


class WyomingDoor(Door):
    """The Wyoming TCP listener beside the HTTP one, in the same process and loop.

    The socket is bound when the service loads (so a port in use ends startup with one
    line), and served once the loop runs. With ``--workers``, the parent claims the port
    for them all, as it does the HTTP port (``port_group``, server/sockets.py: a second
    server is refused it), and hands each worker its socket; a worker that replaces a dead
    one joins them with SO_REUSEPORT. The kernel spreads connections over the workers.
    Off (nothing bound) unless ``wyoming_port`` is set.
    """

    name = "wyoming"

    def __init__(self, host: Host) -> None:
        super().__init__(host)
        self.sock: socket.socket | None = None
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        assert self.sock is not None, "the Wyoming door is not bound"
        return int(self.sock.getsockname()[1])

    def bind(self) -> None:
        config = self.config
        if config.wyoming_port is None:
            return
        host = wyoming_host(config.host, config.auth.required, config.wyoming_allow_unauthenticated)
        try:
            sock = handed(config.wyoming_port) or listening_socket(
                host, config.wyoming_port, reuse_port=config.workers > 1,
                stall_timeout_seconds=self.limits.stall_timeout_seconds,
            )
        except OSError as e:
            raise OSError(e.errno, f"cannot listen for Wyoming on port {config.wyoming_port}: {e.strerror}") from None
        sock.listen(self.limits.max_connections)
        sock.setblocking(False)
        log.info("Wyoming protocol on %s:%d", host, sock.getsockname()[1])
        self.sock = sock

    async def start(self) -> None:
        if self.sock is not None:
            # The reader's limit bounds an event's header line (``read_event``).
            self._server = await asyncio.start_server(self._serve, sock=self.sock, limit=self.limits.max_message_bytes)

    def close(self) -> None:
        """Stop listening and end every connection's reading (their utterances end with it)."""
        if self._server is not None:
            self._server.close()
        elif self.sock is not None:
            self.sock.close()
        for task in list(self._connections):
            task.cancel()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One TCP connection: bounded events read into a ``WyomingSession``, closed on
        idleness, bad input or a failed request."""
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            await self._converse(reader, writer)
        finally:
            self._connections.discard(task)

    async def _converse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        refusal = self.admit()
        if refusal is not None:
            await _say_and_close(writer, error(refusal.code, refusal.message))
            return
        session = WyomingSession(self, self.defaults(), lambda event: async_write_event(event, writer))

        async def shutdown() -> None:
            await session.close("failed", "shutting_down")
            await _say_and_close(writer, error("shutting_down", "the server is shutting down"))

        async def receive() -> Received:
            try:
                return await read_event(reader, self.limits.max_message_bytes)
            except BadEvent as e:
                return e

        async with self.connection(session, shutdown):
            try:
                await self.converse(session, receive)
            except (ConnectionError, OSError):
                pass  # the client went away, or stopped reading (ListenerStalled)
            finally:
                await session.close()
                if session.stalled:
                    # A graceful close would wait for the client to read what is buffered.
                    writer.transport.abort()
                else:
                    writer.close()


async def _say_and_close(writer: asyncio.StreamWriter, event: Event) -> None:
    try:
        # A farewell to a client that reads nothing must not hold a shutdown.
        async with asyncio.timeout(GOODBYE_SECONDS):
            await async_write_event(event, writer)
    except TimeoutError:
        writer.transport.abort()
    except (ConnectionError, OSError):
        pass
    writer.close()


def wyoming_host(host: str, api_keys_set: bool, allow_unauthenticated: bool) -> str:
    """Where the Wyoming port listens. Wyoming has no authentication: with API keys set,
    anyone reaching it would bypass them, so it stays on loopback unless the operator
    allows it explicitly."""
    listen = unauthenticated_host(host, api_keys_set, allow_unauthenticated)
    if listen != host:
        log.warning(
            "API keys are set and Wyoming has no authentication: the Wyoming port listens on %s only "
            "(--wyoming-allow-unauthenticated to listen on %s)", listen, host,
        )
    return listen
