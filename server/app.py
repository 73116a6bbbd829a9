"""The Starlette application: the service's routes, and the routes of every door."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from urllib.parse import urlencode

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket

from voxwire.engine.base import EngineError
from voxwire.engine.errors import ErrorCode
from voxwire.engine.worker import Worker
from voxwire.server import auth, voices
from voxwire.server.client_files import ClientFiles
from voxwire.server.config import ServerConfig
from voxwire.server.doors import DOORS
from voxwire.server.doors.base import Door
from voxwire.server.service import Service

# clients/js beside server/ in a checkout; installed from a wheel, voxwire/clients/js
# beside voxwire/server (pyproject.toml's package data), the same relative path.
JS_CLIENT_DIR = Path(__file__).resolve().parent.parent / "clients" / "js"


def create_app(
    config: ServerConfig | None = None, make_worker: Callable[[], Worker] | None = None,
    doors: Sequence[type[Door]] = DOORS,
) -> Starlette:
    """The server: the service's own routes (health, readiness, voices, metrics, the JS
    client) and each door's."""
    service = Service(config or ServerConfig(), doors, make_worker)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await service.start()
        try:
            yield
        finally:
            service.stop()

    routes = _service_routes(service)
    for door in service.doors.values():
        routes += door.routes()
    app = Starlette(routes=routes, lifespan=lifespan)
    app.router.default = _not_found
    app.state.service = service
    return app


def _service_routes(service: Service) -> list[BaseRoute]:
    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        if not service.ready():
            status = "draining" if service.draining else "not ready"
            return JSONResponse({"status": status}, status_code=503)
        engine = service.worker.loaded_engine()
        return JSONResponse({"status": "ready", "engine": engine.name, "device": engine.device,
                             "precision": engine.precision, "pid": os.getpid()})

    async def voices_route(request: Request) -> Response:
        if not auth.presents_valid_key(service.config.auth, request.headers, request.query_params):
            return JSONResponse(
                {"error": {"code": ErrorCode.UNAUTHORIZED, "message": auth.HTTP_KEY_REFUSED}},
                status_code=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        if service.defaults is None:
            return JSONResponse(
                {"error": {"code": ErrorCode.NOT_READY, "message": "the engine is loading"}}, status_code=503,
            )
        if request.method == "POST":
            try:
                engine = service.worker.loaded_engine()
            except EngineError as e:
                return voices.error(e.code, e.message)
            if not engine.clones_voices:  # nothing the upload holds could change the answer
                return await voices.cannot_clone(request, engine)
            return await voices.register_voice(request, service.worker, service.cache)
        engine = service.worker.loaded_engine()
        return voices.list_voices(engine, service.defaults.voice or engine.default_voice())

    async def metrics(request: Request) -> Response:
        body, media_type = service.metrics.render()
        return Response(body, media_type=media_type)

    async def index(request: Request) -> Response:
        # Keep the query (the demo page reads ?url= from it), but move a ?token= into the
        # fragment, which browsers never send: the redirected request carries no key.
        params = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
        query = f"?{urlencode(params)}" if params else ""
        token = request.query_params.get("token")
        fragment = f"#{urlencode({'token': token})}" if token else ""
        return RedirectResponse(f"/client/demo.html{query}{fragment}")

    routes: list[BaseRoute] = [
        Route("/healthz", healthz),
        Route("/readyz", readyz),
        Route("/v1/voices", voices_route, methods=["GET", "POST"]),
        Route("/metrics", metrics),
    ]
    if (JS_CLIENT_DIR / "demo.html").is_file():
        routes += [Route("/", index), Mount("/client", ClientFiles(JS_CLIENT_DIR), name="client")]
    return routes


async def _not_found(scope: Scope, receive: Receive, send: Send) -> None:
    """404 for an unknown path, WebSocket handshakes included: without it the handshake
    is refused with 403, which reads like an authentication failure."""
    response = JSONResponse({"error": {"code": ErrorCode.NOT_FOUND, "message": "no such path"}}, status_code=404)
    if scope["type"] == "websocket":
        websocket = WebSocket(scope, receive, send)
        if "websocket.http.response" in scope.get("extensions", {}):
            await websocket.send_denial_response(response)
        else:  # a server without the denial extension can only refuse (403)
            await websocket.close()
        return
    await response(scope, receive, send)
