"""The Starlette application: the WebSocket endpoint and the HTTP routes beside it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.websockets import WebSocket, WebSocketDisconnect

from engine.registry import EngineOptions, engine_factory
from engine.worker import Worker
from server.limits import Admission, Limits
from server.protocol import StreamSettings
from server.session import Session

log = logging.getLogger(__name__)

JS_CLIENT_DIR = Path(__file__).resolve().parent.parent / "clients" / "js"

# WebSocket close codes (RFC 6455 section 7.4.1, and the IANA registry for 1013).
CLOSE_GOING_AWAY = 1001
CLOSE_POLICY = 1008
CLOSE_TOO_BIG = 1009
CLOSE_TRY_AGAIN_LATER = 1013


@dataclass(frozen=True)
class ServerConfig:
    engine: EngineOptions = field(default_factory=EngineOptions)
    limits: Limits = field(default_factory=Limits)
    default_voice: str | None = None
    default_format: str = "pcm_s16le"
    default_sample_rate: int | None = None
    """None: the engine's own rate, so nothing is resampled unless a client asks."""
    default_chunk_ms: int = 200


class Service:
    """What every connection shares: the worker, the admission counters, the defaults."""

    def __init__(self, config: ServerConfig, worker: Worker | None = None) -> None:
        self.config = config
        self.admission = Admission(config.limits)
        self.worker = worker or Worker(engine_factory(config.engine), max_queue_seconds=config.limits.max_queue_seconds)
        self.defaults: StreamSettings | None = None
        self.draining = False

    async def start(self) -> None:
        self.worker.start()
        engine = await asyncio.to_thread(self.worker.wait_ready)
        voices = engine.voices()
        voice = self.config.default_voice or (voices[0].id if voices else "")
        self.defaults = StreamSettings(
            voice=voice,
            format=self.config.default_format,
            sample_rate=self.config.default_sample_rate or engine.sample_rate,
            chunk_ms=self.config.default_chunk_ms,
        )
        log.info("engine %s ready on %s with voices %s", engine.name, engine.device, [v.id for v in voices])

    def stop(self) -> None:
        self.draining = True
        self.worker.stop()

    def ready(self) -> bool:
        return self.defaults is not None and self.worker.alive and not self.draining


def create_app(config: ServerConfig | None = None, worker: Worker | None = None) -> Starlette:
    service = Service(config or ServerConfig(), worker)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await service.start()
        try:
            yield
        finally:
            service.stop()

    async def stream(ws: WebSocket) -> None:
        await ws.accept()
        if not service.ready():
            await ws.close(CLOSE_TRY_AGAIN_LATER, "the server is not ready; try again shortly")
            return
        if not service.admission.try_connect():
            await ws.close(CLOSE_TRY_AGAIN_LATER, "the server is at capacity; try again in a second")
            return
        assert service.defaults is not None
        session = Session(service.worker, service.admission, ws.send_text, ws.send_bytes, service.defaults)
        try:
            await ws.send_text(session.ready_message())
            while True:
                message = await ws.receive()
                if message["type"] == "websocket.disconnect":
                    break
                data = message.get("text")
                await session.handle(data if data is not None else message.get("bytes") or b"")
        except WebSocketDisconnect:
            pass
        finally:
            await session.close()
            service.admission.disconnect()

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        if not service.ready():
            return JSONResponse({"status": "not ready"}, status_code=503)
        engine = service.worker.wait_ready(0)
        return JSONResponse({"status": "ready", "engine": engine.name, "device": engine.device})

    async def voices(request: Request) -> Response:
        if service.defaults is None:
            return JSONResponse({"error": {"code": "not_ready", "message": "the engine is loading"}}, status_code=503)
        engine = service.worker.wait_ready(0)
        return JSONResponse({"voices": [v.to_dict() for v in engine.voices()], "default": service.defaults.voice})

    async def index(request: Request) -> Response:
        return RedirectResponse("/client/demo.html")

    routes = [
        WebSocketRoute("/v1/stream", stream),
        Route("/healthz", healthz),
        Route("/readyz", readyz),
        Route("/v1/voices", voices),
    ]
    if (JS_CLIENT_DIR / "demo.html").is_file():
        routes += [Route("/", index), Mount("/client", StaticFiles(directory=JS_CLIENT_DIR), name="client")]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.service = service
    return app
