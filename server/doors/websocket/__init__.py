"""The first door: protocol v1 over a WebSocket (``/v1/stream``), docs/protocol.md.

The door accepts a socket, checks its origin and key and the gate, and then reads
messages into a ``Session`` (session.py): the protocol's state for one connection, which
never touches the socket itself. server/protocol.py parses and builds the messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import MutableMapping
from typing import Any

from starlette.routing import BaseRoute, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from voxwire.engine.errors import ErrorCode
from voxwire.server import auth
from voxwire.server.doors.base import Conversation, Door, Flooded, ListenerStalled
from voxwire.server.doors.websocket.session import Session
from voxwire.server.sockets import GOODBYE_SECONDS

log = logging.getLogger(__name__)

# WebSocket close codes (RFC 6455 section 7.4.1, and the IANA registry for 1013).
CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_POLICY = 1008
CLOSE_TRY_AGAIN_LATER = 1013
# A connection the gate refuses is closed with the code that says whether to come back.
GATE_CLOSE_CODES: dict[str, int] = {ErrorCode.SHUTTING_DOWN: CLOSE_GOING_AWAY}


def gate_close_code(reason: str) -> int:
    """The close code for a connection the gate refused for ``reason``."""
    return GATE_CLOSE_CODES.get(reason, CLOSE_TRY_AGAIN_LATER)

Message = MutableMapping[str, Any]
DISCONNECT: Message = {"type": "websocket.disconnect"}


class WebSocketDoor(Door):
    name = "ws"

    def routes(self) -> list[BaseRoute]:
        return [WebSocketRoute("/v1/stream", self.serve)]

    async def serve(self, ws: WebSocket) -> None:
        subprotocols = list(ws.scope.get("subprotocols", []))
        await ws.accept(subprotocol=auth.chosen_subprotocol(subprotocols))
        if not auth.origin_is_allowed(self.config.auth, ws.headers.get("origin")):
            self.refuse_connection("origin", CLOSE_POLICY)
            await ws.close(CLOSE_POLICY, auth.ORIGIN_REFUSED)
            return
        if not auth.presents_valid_key(self.config.auth, ws.headers, ws.query_params, subprotocols):
            self.refuse_connection(ErrorCode.UNAUTHORIZED, CLOSE_POLICY)
            await ws.close(CLOSE_POLICY, auth.KEY_REFUSED)
            return
        # Per client: its address, or the one a trusted proxy forwards (uvicorn's proxy headers).
        client = ws.client.host if ws.client else None
        refusal = self.admit(client, gate_close_code)
        if refusal is not None:
            await ws.close(gate_close_code(refusal.code), refusal.message)
            return
        session = Session(self, self.defaults(), ws.send_text, ws.send_bytes)
        connection = _Connection(ws, session, self.limits.idle_timeout_seconds)

        async def shutdown() -> None:
            await session.fail_all(ErrorCode.SHUTTING_DOWN, "the server is shutting down")
            await connection.close(CLOSE_GOING_AWAY, "the server is shutting down")

        async with self.connection(session, shutdown, client):
            try:
                await ws.send_text(session.ready_message())
                await self.converse(connection, connection.receive)
            except ListenerStalled:
                pass  # its utterances have ended; nothing, not even a close frame, would reach it
            except (WebSocketDisconnect, RuntimeError):
                pass  # the socket went away (RuntimeError: a send after the close)
            finally:
                await session.close()


class _Connection(Conversation[Message]):
    """One socket's messages into its session, and its closing words."""

    def __init__(self, ws: WebSocket, session: Session, idle_seconds: float) -> None:
        super().__init__()
        self.ws = ws
        self.session = session
        self._idle_seconds = idle_seconds
        self._gone = False

    async def receive(self) -> Message:
        # Once the client has gone, the socket may not be read again: say so again instead.
        if self._gone:
            return DISCONNECT
        message = await self.ws.receive()
        self._gone = message["type"] == "websocket.disconnect"
        return message

    async def handle(self, message: Message) -> bool:
        if message["type"] == "websocket.disconnect":
            return False
        data = message.get("text")
        try:
            await self.session.handle(data if data is not None else message.get("bytes") or b"")
        except Flooded as e:
            log.info("session %s: closing a connection that floods: %s", self.session.id, e)
            await self.close(CLOSE_POLICY, str(e))
            return False
        return True

    def idle_in(self, now: float) -> float:
        return self.session.idle_in(now)

    def wake_in(self, now: float) -> float:
        return self.session.open_utterance_expires_in(now)

    async def tick(self, now: float) -> None:
        await self.session.end_waiting_utterances(now)

    async def idle(self) -> None:
        await self.close(CLOSE_NORMAL, f"idle for {self._idle_seconds:g} s")

    async def close(self, code: int, reason: str) -> None:
        # A close frame waits for the socket to take it: a client that reads nothing must
        # not hold a drain (or this task) on it. The kernel drops it in the end.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(GOODBYE_SECONDS):
                await self.ws.close(code, reason)

