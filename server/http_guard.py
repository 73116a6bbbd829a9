"""The HTTP port's connections, each with deadlines and all of them with a bound.

uvicorn times out nothing before a request has arrived: connections that sent nothing,
half their headers or half a declared body were kept for as long as their clients liked,
until they had taken every file descriptor and the probes were reset. Here each one has a
deadline (``GuardedH11Protocol``) and their number a bound (``HttpConnections``). The
parser is always h11, uvicorn's own dependency, made strict where parsers differ on how a
request is framed (``StrictH11Connection``): with ``http="auto"`` the parser was whichever
happened to be installed (httptools only came with the ``ray`` extra), so a server ran
h11's lenient one in production and another one under test.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)

SHED_LOG_SECONDS = 60.0
"""At most one line per this long about connections shed: a flood must not flood the log."""
REQUEST_TIMEOUT = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
BARE_LF = re.compile(rb"(?<!\r)\n")


class StrictH11Connection(h11.Connection):
    """h11, refusing two requests that it frames one way and other parsers (a proxy in
    front) may frame another, the ground of request smuggling (RFC 9112 section 11.2):

    - a request with both Content-Length and Transfer-Encoding: h11 goes by the chunked
      coding and keeps the connection, so what follows the chunks is a second request;
      RFC 9112 section 6.1 lets a server reject it, and says the connection must close;
    - a head with a bare LF for a line end, which h11 takes and others do not (section 2.2
      leaves it to the recipient).

    Either raises ``RemoteProtocolError``, which uvicorn answers with 400 and a close."""

    def next_event(self) -> h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]:
        # The head is what a request's event takes from the buffer: known only after.
        before = self.trailing_data[0] if self.their_state is h11.IDLE else None
        event = super().next_event()
        if isinstance(event, h11.Request):
            names = {name for name, _ in event.headers}
            if b"content-length" in names and b"transfer-encoding" in names:
                raise h11.RemoteProtocolError("both Content-Length and Transfer-Encoding", error_status_hint=400)
            if before is not None:
                head = before[: len(before) - len(self.trailing_data[0])]
                if BARE_LF.search(head):
                    raise h11.RemoteProtocolError("a line of the head ends in a bare LF", error_status_hint=400)
        return event


class HttpConnections:
    """The HTTP port's open connections in this process, at most ``limit``: each holds a
    file descriptor, and a process out of them accepts nothing, /healthz included.

    A newcomer over the bound closes, rather than being refused, the connection that has
    waited longest on its client, for a request's head (silent, part-way, kept alive) or
    for the rest of its body: connections held open sending nothing go first, and a probe,
    whose request follows its connection at once, still gets in. Only when every one is
    being answered is the newcomer closed. A WebSocket leaves the count when it is
    upgraded: the gate bounds those (``max_connections``)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open: set[GuardedH11Protocol] = set()
        self._waiting: dict[GuardedH11Protocol, None] = {}
        """Those waiting on their client, the one that sent nothing for longest first (a
        dict keeps its insertion order)."""
        self._shed = 0
        self._logged_at = -math.inf

    def admit(self, connection: GuardedH11Protocol) -> bool:
        """Count a new connection in, making room; False: there is none, close it."""
        if len(self.open) >= self.limit:
            longest = next(iter(self._waiting), None)
            self._note_shed(refused=longest is None)
            if longest is None:
                return False
            self.leave(longest)
            longest.shed()
        self.open.add(connection)
        self._waiting[connection] = None
        return True

    def waiting(self, connection: GuardedH11Protocol, heard: bool) -> None:
        """``connection`` waits on its client, which has just sent something (``heard``)."""
        if connection not in self.open:
            return
        if heard:
            self._waiting.pop(connection, None)  # to the back of the queue
        self._waiting.setdefault(connection, None)

    def busy(self, connection: GuardedH11Protocol) -> None:
        """``connection``'s request is being answered: it waits on the server, not its client."""
        self._waiting.pop(connection, None)

    def leave(self, connection: GuardedH11Protocol) -> None:
        self.open.discard(connection)
        self._waiting.pop(connection, None)

    def _note_shed(self, refused: bool) -> None:
        self._shed += 1
        now = time.monotonic()
        if now - self._logged_at >= SHED_LOG_SECONDS:
            log.warning(
                "%d HTTP connection(s) shed since the last such line: %d open, the most this process keeps "
                "(--max-http-connections); %s", self._shed, len(self.open),
                "every one was being answered, so the newcomer was closed" if refused
                else "the one that waited longest on its client is closed for each newcomer",
            )
            self._shed, self._logged_at = 0, now


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with deadlines uvicorn lacks: a request's head must arrive
    whole within ``head_timeout`` of the connection opening, or of its first byte on a
    kept-alive connection (one that sent some is told 408); a body must not pause for
    ``body_timeout`` while the app waits for it. A kept-alive connection with nothing
    sent is uvicorn's own keep-alive timeout's. Each connection takes its place in the
    port's ``HttpConnections``. ``guarded_protocol`` makes the class a server uses."""

    connections_bound: ClassVar[HttpConnections]
    head_timeout: ClassVar[float]
    body_timeout: ClassVar[float]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        size = self.config.h11_max_incomplete_event_size
        self.conn = StrictH11Connection(h11.SERVER) if size is None else StrictH11Connection(h11.SERVER, size)
        self._timer: asyncio.TimerHandle | None = None
        self._counted = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if not self.connections_bound.admit(self):
            transport.close()
            return
        self._counted = True
        self._timer = self.loop.call_later(self.head_timeout, self._head_late)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch(heard=True)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch(heard=False)

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        self._leave()
        super().handle_websocket_upgrade(event)

    def connection_lost(self, exc: Exception | None) -> None:
        self._leave()
        super().connection_lost(exc)

    def shed(self) -> None:
        """Closed to make room for a newcomer (``HttpConnections.admit``)."""
        self._leave()
        self.transport.close()

    def _watch(self, heard: bool) -> None:
        """Set the deadline, and the place in the bound, that the connection's state calls
        for, after the client sent something (``heard``) or a response ended."""
        if not self._counted or self.transport.is_closing():
            return
        state = self.conn.their_state
        if state is h11.IDLE:
            self.connections_bound.waiting(self, heard)
            # A head under way is due from its first byte; none begun: keep-alive's business.
            if self._timer is None and self.conn.trailing_data[0]:
                self._timer = self.loop.call_later(self.head_timeout, self._head_late)
            return
        self._cancel()
        if state is h11.SEND_BODY:  # from the head, or the last piece of body
            self.connections_bound.waiting(self, heard)
            self._timer = self.loop.call_later(self.body_timeout, self._body_late)
        else:
            self.connections_bound.busy(self)

    def _head_late(self) -> None:
        self._timer = None
        if self.conn.their_state is not h11.IDLE or self.transport.is_closing():
            return
        if self.conn.trailing_data[0]:
            self.transport.write(REQUEST_TIMEOUT)
        self.transport.close()

    def _body_late(self) -> None:
        self._timer = None
        if self.conn.their_state is not h11.SEND_BODY or self.transport.is_closing():
            return
        if self.flow.read_paused:
            # The app has not taken what came (flow control): the wait is not the client's.
            self._timer = self.loop.call_later(self.body_timeout, self._body_late)
            return
        self.transport.close()  # the app's receive() hears a disconnect

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _leave(self) -> None:
        self._cancel()
        if self._counted:
            self._counted = False
            self.connections_bound.leave(self)


def guarded_protocol(bound: HttpConnections, head_timeout: float, body_timeout: float) -> type[GuardedH11Protocol]:
    """The protocol class of one server: its connections' bound and deadlines."""
    attributes = {"connections_bound": bound, "head_timeout": head_timeout, "body_timeout": body_timeout}
    return type("GuardedH11Protocol", (GuardedH11Protocol,), attributes)
