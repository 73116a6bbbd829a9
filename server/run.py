"""Running the app under uvicorn, with a graceful drain on SIGTERM.

uvicorn's own shutdown closes every WebSocket at once (1012). A TTS server should
rather stop taking work, let the utterances in flight finish up to a deadline, and only
then end every connection, whichever door it came through (a WebSocket closes with 1001,
going away), so a deploy does not cut speech mid-word (``Service.drain``).

The HTTP port's connections have deadlines and a bound (server/http_guard.py).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from types import FrameType

import uvicorn
from starlette.applications import Starlette

from voxwire.server.http_guard import HttpConnections, guarded_protocol
from voxwire.server.service import Service
from voxwire.server.sockets import fit_descriptors, listening_socket

log = logging.getLogger(__name__)


def listening_line(host: str, port: int, others: dict[str, tuple[str, int]]) -> str:
    """``listening on http://HOST:PORT (ws://HOST:PORT/v1/stream)``, and each door that
    listens on its own port (Wyoming's), for the operator to copy."""
    address = f"{_bracketed(host)}:{port}"
    line = f"listening on http://{address} (ws://{address}/v1/stream)"
    for name, (door_host, door_port) in others.items():
        line += f", {name} on tcp://{_bracketed(door_host)}:{door_port}"
    return line


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, service: Service, drain_seconds: float) -> None:
        super().__init__(config)
        self.service = service
        self.drain_seconds = drain_seconds
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain: asyncio.Future[None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)
        if self.started and sockets:
            port = sockets[0].getsockname()[1]
            own = {door.name: sock.getsockname()[:2] for door in self.service.doors.values()
                   if isinstance(sock := getattr(door, "sock", None), socket.socket)}
            log.info(listening_line(self.config.host, port, own))

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # A second signal, or one before the loop runs, falls back to uvicorn's own exit.
        if self._drain is not None or self._loop is None or sig == signal.SIGINT and self.should_exit:
            super().handle_exit(sig, frame)
            return
        self._captured_signals.append(sig)
        log.info("signal %d: draining for up to %.0f s", sig, self.drain_seconds)
        self._drain = asyncio.run_coroutine_threadsafe(self._drain_then_exit(), self._loop)  # type: ignore[assignment]

    async def _drain_then_exit(self) -> None:
        try:
            await self.service.drain(self.drain_seconds)
        finally:
            self.should_exit = True


def http_server(app: Starlette, host: str, port: int, log_level: str = "info") -> DrainingServer:
    """The server ``serve`` runs, for a caller to run on sockets of its own (tests do)."""
    service: Service = app.state.service
    config = service.config
    limits = config.limits
    # The gate's connections (WebSocket, Wyoming, the speech route) take descriptors too.
    bound = HttpConnections(fit_descriptors(config.max_http_connections, reserved=limits.max_connections))
    if bound.limit < config.max_http_connections:
        log.warning("the descriptor limit (ulimit -n) leaves room for %d HTTP connections, not %d",
                    bound.limit, config.max_http_connections)
    uvicorn_config = uvicorn.Config(
        app, host=host, port=port, ws_max_size=limits.max_message_bytes, log_level=log_level, lifespan="on",
        timeout_graceful_shutdown=5, log_config=None,  # our handler and format (server/logs.py)
        proxy_headers=True, forwarded_allow_ips=config.forwarded_allow_ips,
        http=guarded_protocol(bound, config.header_timeout_seconds, config.body_timeout_seconds),
    )
    return DrainingServer(uvicorn_config, service, config.drain_seconds)


def serve(
    app: Starlette, host: str, port: int, log_level: str = "info", sockets: list[socket.socket] | None = None
) -> None:
    limits = app.state.service.config.limits
    sockets = sockets or [listening_socket(host, port, stall_timeout_seconds=limits.stall_timeout_seconds)]
    http_server(app, host, port, log_level).run(sockets=sockets)
