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
result cache, the metrics and the log line are the other doors'. ``WyomingDoor`` is the
event handling without sockets (events in, events sent through a coroutine it is given);
``WyomingHandler`` and ``WyomingServer`` are the TCP around it.
deploy/home-assistant.md says how to point Home Assistant at it; Wyoming has no
authentication (see ``wyoming_host``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from importlib import metadata
from typing import Protocol

import orjson
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event, async_write_event
from wyoming.info import Attribution, Describe, Info, TtsProgram, TtsVoice
from wyoming.ping import Ping, Pong
from wyoming.server import AsyncEventHandler, AsyncServer
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped

from voxwire.engine.base import Engine, EngineError
from voxwire.server.config import ServerConfig
from voxwire.server.limits import Admission, Limits, TokenBucket
from voxwire.server.pipeline import AudioFrame, Done, FailedEvent, Pipeline, Refused, Speech, UtteranceRequest
from voxwire.server.protocol import StreamSettings
from voxwire.server.sockets import GOODBYE_SECONDS, listening_socket

log = logging.getLogger(__name__)

DOOR = "wyoming"
WIDTH = 2  # bytes per sample: 16-bit PCM, the format every Wyoming client plays
CHANNELS = 1
LOOPBACK = ("127.0.0.1", "localhost", "::1")

Send = Callable[[Event], Awaitable[None]]


class Service(Protocol):
    """What the door uses of server/service.py's Service (named here, not imported:
    the service is what starts this door)."""

    config: ServerConfig
    pipeline: Pipeline
    admission: Admission
    defaults: StreamSettings | None
    draining: bool
    connections: dict[object, Callable[[], Awaitable[None]]]

    def ready(self) -> bool: ...


class BadField(ValueError):
    """An event whose fields have the wrong shape: answered, and the connection goes on."""


class Stalled(ConnectionError):
    """The client has read nothing for the stall timeout while audio waited to be sent."""


class BadEvent(Exception):
    """Input that cannot be read as a Wyoming event: the connection cannot go on."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


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


class WyomingDoor:
    """One Wyoming connection's events: answered, and turned into pipeline utterances.

    One utterance at a time, as Wyoming clients ask for them. ``handle`` returns False
    when the connection should close: after an error that ends a request (a client that
    does not know ``error`` events, Home Assistant's among them, would otherwise wait for
    an ``audio-stop`` that never comes; a closed connection it does understand).
    """

    def __init__(self, pipeline: Pipeline, defaults: StreamSettings, limits: Limits, send: Send) -> None:
        self.pipeline = pipeline
        self.limits = limits
        # Wyoming audio is 16-bit mono; rate and chunk duration are the server's defaults
        # (the engine's own rate unless the operator set --sample-rate).
        self.settings = replace(defaults, format="pcm_s16le", timestamps=False)
        self._send = send
        self._send_lock = asyncio.Lock()
        self.id = secrets.token_hex(6)
        self._bucket = TokenBucket(limits.messages_per_second, limits.message_burst)
        self._count = 0
        self._session_chars = 0
        self.speech: Speech | None = None
        self._task: asyncio.Task[None] | None = None
        self._streaming = False
        """Between synthesize-start and synthesize-stop."""
        self.last_active_at = time.monotonic()
        self.closing = asyncio.Event()
        """Set when the connection should close: a request failed, or the client is gone."""
        self.stalled = False
        """A send waited the idle timeout: the client reads nothing, and cannot be told."""

    # -- events --------------------------------------------------------------------------------

    async def handle(self, event: Event) -> bool:
        """Act on one event; False: close the connection."""
        self.last_active_at = time.monotonic()
        if not self._bucket.take():
            await self.send(error(
                "rate_limited", f"more than {self.limits.messages_per_second:g} events per second; this one was dropped",
            ))
            return True
        try:
            return await self._dispatch(event)
        except BadField as e:
            await self.send(error("invalid_event", str(e)))
            return True
        except (KeyError, TypeError, ValueError, AttributeError):
            # The event classes read fields as they find them; a wrong shape is the client's.
            await self.send(error("invalid_event", f"a {event.type!r} event with fields of the wrong shape"))
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
            await self.send(error("unknown_event", f"this server does not answer {event.type!r} events"))
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
                self.pipeline.refused(DOOR, refusal.code, ids, settings.voice, text)
                raise refusal
            speech = self.pipeline.open(UtteranceRequest(DOOR, text, final, settings, ids))
        except Refused as e:
            await self.send(error(e.code, e.message))
            return False
        self._session_chars += len(text)
        self.speech = speech
        await self.send(AudioStart(rate=speech.settings.sample_rate, width=WIDTH, channels=CHANNELS, timestamp=0).event())
        self._task = asyncio.create_task(self._stream(speech, streamed=not final), name=f"wyoming-{self.id}")
        return True

    def _refusal(self, text: str, text_format: object) -> Refused | None:
        """This door's own limits on a new utterance's text."""
        if text_format not in (None, "text"):
            return Refused("unsupported_text_format", "this server speaks plain text; SSML is not supported")
        return self._text_refusal(text, 0)

    def _text_refusal(self, text: str, so_far: int) -> Refused | None:
        if so_far + len(text) > self.limits.max_text_chars:
            return Refused("text_too_long", f"text is limited to {self.limits.max_text_chars} characters per utterance")
        if self._session_chars + len(text) > self.limits.max_session_chars:
            return Refused(
                "session_text_limit",
                f"a connection may send at most {self.limits.max_session_chars} characters; open a new one",
            )
        return None

    async def _feed(self, text: str, final: bool) -> bool:
        speech = self.speech
        if not self._streaming or speech is None:
            kind = "synthesize-stop" if final else "synthesize-chunk"
            await self.send(error("no_stream", f"{kind} comes between synthesize-start and synthesize-stop"))
            return True
        refusal = self._text_refusal(text, speech.text_chars)
        if refusal is not None:
            speech.end("failed", refusal.code)
            await self.send(error(refusal.code, refusal.message))
            return False
        self._session_chars += len(text)
        speech.feed(text, final)
        if final:
            self._streaming = False
        return True

    async def end_of_input(self) -> asyncio.Task[None] | None:
        """The client has finished writing (EOF on read): the utterance in flight, to be
        finished and sent before the connection closes; None when there is none.

        A stream that never got synthesize-stop ends with the text that arrived, answered
        as if synthesize-stop had come (audio-stop, synthesize-stopped): the client can send
        nothing more, and it asked for that text to be spoken."""
        if self.speech is None:
            return None
        if self._streaming:
            await self._feed("", final=True)
        return self._task

    # -- one utterance ---------------------------------------------------------------------------

    async def _stream(self, speech: Speech, streamed: bool) -> None:
        rate = speech.settings.sample_rate
        try:
            async for event in speech.events():
                if isinstance(event, AudioFrame):
                    await self.send(AudioChunk(
                        rate=rate, width=WIDTH, channels=CHANNELS, audio=event.data,
                        timestamp=event.offset * 1000 // rate,
                    ).event())
                elif isinstance(event, Done):
                    speech.end("done")
                    await self.send(AudioStop(timestamp=speech.stream.samples * 1000 // rate).event())
                    if streamed:
                        await self.send(SynthesizeStopped().event())
                elif isinstance(event, FailedEvent):
                    speech.end("failed", event.code)
                    await self.send(error(event.code, event.message))
                    self.closing.set()
        except asyncio.CancelledError:
            raise
        except Stalled:
            speech.end_stalled("not_reading")
        except Exception:
            # A send that fails means the client is gone; its utterance stops here.
            log.debug("wyoming utterance stopped: connection closed", exc_info=True)
            speech.end("disconnected")
            self.closing.set()
        finally:
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

    async def end_idle(self) -> None:
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
        """Send one event; raises ``Stalled`` when the client has read nothing for the stall
        timeout. Every send is bounded: a client that stops reading (half-closed or not)
        would otherwise hold its connection and utterance slot for ever. The worker has
        stopped computing for it long before (its queue is full: backpressure)."""
        # The utterance task and the event handling share the connection.
        async with self._send_lock:
            if self.stalled:
                raise Stalled("the client stopped reading")
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
                raise Stalled("the client stopped reading") from None


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


class WyomingHandler(AsyncEventHandler):
    """One TCP connection: reads bounded events, hands them to a ``WyomingDoor``, and
    closes on idleness, bad input or a failed request."""

    def __init__(self, service: Service, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        super().__init__(reader, writer)
        self.service = service
        self.door: WyomingDoor | None = None

    async def handle_event(self, event: Event) -> bool:
        assert self.door is not None
        return await self.door.handle(event)

    async def run(self) -> None:
        service = self.service
        refusal = self._refusal()
        if refusal is not None:
            reason, message = refusal
            service.pipeline.accounting.connection_refused(reason, 0)
            await self._say_and_close(error(reason, message))
            return
        assert service.defaults is not None
        door = self.door = WyomingDoor(service.pipeline, service.defaults, service.config.limits, self.write_event)

        async def shutdown() -> None:
            await door.close("failed", "shutting_down")
            await self._say_and_close(error("shutting_down", "the server is shutting down"))

        service.connections[self] = shutdown
        try:
            await self._serve(door)
        except (ConnectionError, OSError):
            pass  # the client went away, or stopped reading (Stalled)
        finally:
            service.connections.pop(self, None)
            await door.close()
            service.admission.disconnect()
            if door.stalled:
                # A graceful close would wait for the client to read what is buffered.
                self.writer.transport.abort()
            else:
                self.writer.close()

    async def _serve(self, door: WyomingDoor) -> None:
        max_bytes = self.service.config.limits.max_message_bytes
        closing = asyncio.ensure_future(door.closing.wait())
        receive: asyncio.Future[Event | None] | None = None
        finishing: asyncio.Task[None] | None = None
        """After EOF on read: the utterance still being spoken, waited for instead of events."""
        try:
            while not door.closing.is_set():
                idle_in = door.idle_in(time.monotonic())
                if idle_in <= 0:
                    await door.end_idle()
                    return
                if finishing is None:
                    # One read outlives the idle checks: cancelling it could lose half an event.
                    receive = receive or asyncio.ensure_future(read_event(self.reader, max_bytes))
                waiting = finishing or receive
                assert waiting is not None
                await asyncio.wait({waiting, closing}, timeout=min(idle_in, 1.0), return_when=asyncio.FIRST_COMPLETED)
                if not waiting.done():
                    continue
                if finishing is not None:
                    return  # spoken (or ended); the client sends nothing more
                assert receive is not None
                try:
                    event = receive.result()
                except BadEvent as e:
                    await door.send(error(e.code, e.message))
                    return
                receive = None
                if event is None:
                    # EOF is a client that has finished writing (a half-close), not one that
                    # has gone: a reset raises from the read instead, and a client gone
                    # without one is found when a write fails.
                    finishing = await door.end_of_input()
                    if finishing is None:
                        return
                elif not await self.handle_event(event):
                    return
        finally:
            closing.cancel()
            if receive is not None:
                receive.cancel()

    def _refusal(self) -> tuple[str, str] | None:
        service = self.service
        if service.draining:
            return "shutting_down", "the server is shutting down"
        if not service.ready():
            return "not_ready", "the server is not ready; try again shortly"
        if not service.admission.try_connect():
            return "at_capacity", "the server is at capacity; try again in a second"
        return None

    async def _say_and_close(self, event: Event) -> None:
        try:
            # A farewell to a client that reads nothing must not hold a shutdown.
            async with asyncio.timeout(GOODBYE_SECONDS):
                await self.write_event(event)
        except TimeoutError:
            self.writer.transport.abort()
        except (ConnectionError, OSError):
            pass
        self.writer.close()

    async def write_event(self, event: Event) -> None:
        await async_write_event(event, self.writer)


class WyomingServer(AsyncServer):
    """The Wyoming TCP listener beside the HTTP one, in the same process and loop.

    The socket is bound when the service loads (so a port in use ends startup with one
    line), and served once the loop runs. With ``--workers``, every worker binds the same
    port with SO_REUSEPORT, as the HTTP port is, and the kernel spreads connections.
    """

    def __init__(self, service: Service, sock: socket.socket) -> None:
        super().__init__()
        self.service = service
        self.sock = sock
        self._server: asyncio.AbstractServer | None = None

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    async def run(self, handler_factory: Callable[..., AsyncEventHandler] | None = None) -> None:
        await self.start()
        assert self._server is not None
        await self._server.serve_forever()

    async def start(self, handler_factory: Callable[..., AsyncEventHandler] | None = None) -> None:
        factory = handler_factory or (lambda reader, writer: WyomingHandler(self.service, reader, writer))
        self._server = await asyncio.start_server(
            functools.partial(self._handler_callback, factory),
            sock=self.sock, limit=self.service.config.limits.max_message_bytes,
        )

    def close(self) -> None:
        """Stop listening and end every connection's reading (their utterances end with it)."""
        if self._server is not None:
            self._server.close()
        else:
            self.sock.close()
        for task in list(self._handlers):
            task.cancel()


def wyoming_host(host: str, api_keys_set: bool, allow_unauthenticated: bool) -> str:
    """Where the Wyoming port listens. Wyoming has no authentication: with API keys set,
    anyone reaching it would bypass them, so it stays on loopback unless the operator
    allows it explicitly."""
    if api_keys_set and not allow_unauthenticated and host not in LOOPBACK:
        log.warning(
            "API keys are set and Wyoming has no authentication: the Wyoming port listens on 127.0.0.1 only "
            "(--wyoming-allow-unauthenticated to listen on %s)", host,
        )
        return "127.0.0.1"
    return host


def bind(service: Service) -> WyomingServer | None:
    """The Wyoming listener of ``service``'s config, bound; None when it is off.
    Raises OSError when the port cannot be bound."""
    config = service.config
    if config.wyoming_port is None:
        return None
    host = wyoming_host(config.host, config.auth.required, config.wyoming_allow_unauthenticated)
    sock = listening_socket(
        host, config.wyoming_port, reuse_port=config.workers > 1, stall_timeout_seconds=config.limits.stall_timeout_seconds
    )
    sock.listen(config.limits.max_connections)
    sock.setblocking(False)
    log.info("Wyoming protocol on %s:%d", host, sock.getsockname()[1])
    return WyomingServer(service, sock)

