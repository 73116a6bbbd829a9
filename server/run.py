"""Running the app under uvicorn, with a graceful drain on SIGTERM.

uvicorn's own shutdown closes every WebSocket at once (1012). A TTS server should
rather stop taking work, let the utterances in flight finish up to a deadline, and only
then end every connection, whichever door it came through (a WebSocket closes with 1001,
going away), so a deploy does not cut speech mid-word (``Service.drain``).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from types import FrameType

import uvicorn
from starlette.applications import Starlette

from voxwire.server.service import Service
from voxwire.server.sockets import listening_socket

log = logging.getLogger(__name__)


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, service: Service, drain_seconds: float) -> None:
        super().__init__(config)
        self.service = service
        self.drain_seconds = drain_seconds
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain: asyncio.Future[None] | None = None

    async def startup(self, sockets: list | None = None) -> None:  # type: ignore[type-arg]
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)

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


def serve(
    app: Starlette, host: str, port: int, log_level: str = "info", sockets: list[socket.socket] | None = None
) -> None:
    service: Service = app.state.service
    limits = service.config.limits
    sockets = sockets or [listening_socket(host, port, stall_timeout_seconds=limits.stall_timeout_seconds)]
    config = uvicorn.Config(
        app, host=host, port=port, ws_max_size=limits.max_message_bytes, log_level=log_level, lifespan="on",
        timeout_graceful_shutdown=5, log_config=None,  # our handler and format (server/logs.py)
        proxy_headers=True, forwarded_allow_ips=service.config.forwarded_allow_ips,
    )
    DrainingServer(config, service, service.config.drain_seconds).run(sockets=sockets)
