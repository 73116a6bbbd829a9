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
result cache, the metrics and the log line are the other doors'. ``WyomingSession``
(session.py) is the event handling without sockets (events in, events sent through a
coroutine it is given); wire.py reads and writes the events; ``WyomingDoor`` is the TCP
listener around them, bound when the service loads.
deploy/home-assistant.md says how to point Home Assistant at it; Wyoming has no
authentication (see ``wyoming_host``).
"""

from __future__ import annotations

import asyncio
import logging
import socket

from wyoming.event import Event, async_write_event

from voxwire.engine.errors import ErrorCode
from voxwire.server.doors.base import Door, Host
from voxwire.server.doors.wyoming.session import Received, WyomingSession
from voxwire.server.doors.wyoming.wire import BadEvent, error, read_event
from voxwire.server.net import unauthenticated_host
from voxwire.server.sockets import GOODBYE_SECONDS, handed, listening_socket

log = logging.getLogger(__name__)


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
            await _say_and_close(writer, error(refusal.code, refusal.message), unread=reader)
            return
        session = WyomingSession(self, self.defaults(), lambda event: async_write_event(event, writer))

        async def shutdown() -> None:
            await session.close("failed", ErrorCode.SHUTTING_DOWN)
            await _say_and_close(writer, error(ErrorCode.SHUTTING_DOWN, "the server is shutting down"))

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


LINGER_READ_BYTES = 65536


async def _say_and_close(writer: asyncio.StreamWriter, event: Event, unread: asyncio.StreamReader | None = None) -> None:
    """Write ``event`` and close. With ``unread`` (a connection nobody reads, as a refused
    one), the close lingers: the write side is shut and what the client still sends is
    read and dropped until it closes, because a socket closed with unread bytes resets
    the connection, and the reset can reach the client before the event does."""
    try:
        # A farewell to a client that reads nothing must not hold a shutdown.
        async with asyncio.timeout(GOODBYE_SECONDS):
            await async_write_event(event, writer)
            if unread is not None:
                writer.write_eof()
                while await unread.read(LINGER_READ_BYTES):
                    pass
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
