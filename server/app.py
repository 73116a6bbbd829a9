"""The Starlette application: the WebSocket endpoint and the HTTP routes beside it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from urllib.parse import urlencode

from starlette.applications import Starlette
from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketDisconnect

from voxwire.engine.base import EngineError
from voxwire.engine.worker import Worker
from voxwire.server import auth, openai_speech, voices
from voxwire.server.client_files import ClientFiles
from voxwire.server.config import ServerConfig
from voxwire.server.service import Service
from voxwire.server.session import ListenerStalled, Session
from voxwire.server.sockets import GOODBYE_SECONDS

log = logging.getLogger(__name__)

JS_CLIENT_DIR = Path(__file__).resolve().parent.parent / "clients" / "js"

# WebSocket close codes (RFC 6455 section 7.4.1, and the IANA registry for 1013).
CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_POLICY = 1008
CLOSE_TRY_AGAIN_LATER = 1013


def _authorised(service: Service, conn: HTTPConnection, subprotocols: list[str]) -> bool:
    key = auth.presented_key(conn.headers, conn.query_params, subprotocols)
    return auth.key_is_valid(service.config.auth, key)


def create_app(config: ServerConfig | None = None, make_worker: Callable[[], Worker] | None = None) -> Starlette:
    service = Service(config or ServerConfig(), make_worker)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await service.start()
        try:
            yield
        finally:
            service.stop()

    async def stream(ws: WebSocket) -> None:
        subprotocols = list(ws.scope.get("subprotocols", []))
        await ws.accept(subprotocol=auth.chosen_subprotocol(subprotocols))
        refusal = _connection_refusal(service, ws, subprotocols)
        if refusal is not None:
            reason, code, message = refusal
            service.pipeline.accounting.connection_refused(reason, code)
            await ws.close(code, message)
            return
        assert service.defaults is not None
        session = Session(service.pipeline, service.defaults, service.config.limits, ws.send_text, ws.send_bytes)

        async def close(code: int, reason: str) -> None:
            # A close frame waits for the socket to take it: a client that reads nothing
            # must not hold a drain (or this task) on it. The kernel drops it in the end.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(GOODBYE_SECONDS):
                    await ws.close(code, reason)

        async def shutdown() -> None:
            await session.fail_all("shutting_down", "the server is shutting down")
            await close(CLOSE_GOING_AWAY, "the server is shutting down")

        service.connections[session] = shutdown
        idle = service.config.limits.idle_timeout_seconds
        receive: asyncio.Future[dict] | None = None
        try:
            await ws.send_text(session.ready_message())
            while True:
                now = time.monotonic()
                await session.end_waiting_utterances(now)
                idle_in = session.idle_in(now)
                if idle_in <= 0:
                    await close(CLOSE_NORMAL, f"idle for {idle:g} s")
                    break
                # Wake when the connection or a waiting utterance would time out; while
                # audio is being made, look again within the timeout (or a second).
                wake = min(idle_in, session.open_utterance_expires_in(now))
                timeout = min(idle, 1.0) if math.isinf(wake) else max(wake, 0.01)
                # One receive outlives the idle checks: cancelling it could lose a message.
                receive = receive or asyncio.ensure_future(ws.receive())
                done, _ = await asyncio.wait({receive}, timeout=timeout)
                if not done:
                    continue
                message, receive = receive.result(), None
                if message["type"] == "websocket.disconnect":
                    break
                # Read on while this message is handled: behind a proxy (Ray Serve) a
                # disconnect reaches the app only through a pending receive().
                receive = asyncio.ensure_future(ws.receive())
                data = message.get("text")
                await session.handle(data if data is not None else message.get("bytes") or b"")
        except ListenerStalled:
            pass  # its utterances have ended; nothing, not even a close frame, would reach it
        except (WebSocketDisconnect, RuntimeError):
            pass  # the socket went away (RuntimeError: a send after the close)
        finally:
            if receive is not None:
                receive.cancel()
            service.connections.pop(session, None)
            await session.close()
            service.admission.disconnect()

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        if not service.ready():
            status = "draining" if service.draining else "not ready"
            return JSONResponse({"status": status}, status_code=503)
        engine = service.worker.loaded_engine()
        return JSONResponse({"status": "ready", "engine": engine.name, "device": engine.device,
                             "precision": engine.precision, "pid": os.getpid()})

    def refused(request: Request) -> Response | None:
        if not _authorised(service, request, []):
            return JSONResponse(
                {"error": {"code": "unauthorized", "message": "a valid API key is required"}},
                status_code=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        if service.defaults is None:
            return JSONResponse({"error": {"code": "not_ready", "message": "the engine is loading"}}, status_code=503)
        return None

    async def voices_route(request: Request) -> Response:
        if (r := refused(request)) is not None:
            return r
        if request.method == "POST":
            try:
                engine = service.worker.loaded_engine()
            except EngineError as e:
                return voices.error(e.code, e.message)
            if not engine.clones_voices:  # nothing the upload holds could change the answer
                return await voices.cannot_clone(request, engine)
            return await voices.register_voice(request, service.worker, service.cache)
        assert service.defaults is not None
        engine = service.worker.loaded_engine()
        return voices.list_voices(engine, service.defaults.voice or engine.default_voice())

    async def audio_speech(request: Request) -> Response:
        if not _authorised(service, request, []):
            return openai_speech.openai_error(401, "a valid API key is required", "unauthorized")
        if service.defaults is None:
            return openai_speech.openai_error(503, "the engine is loading", "not_ready")
        return await openai_speech.speech(
            request, service.pipeline, service.defaults.voice, service.config.limits.stall_timeout_seconds
        )

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

    routes = [
        WebSocketRoute("/v1/stream", stream),
        Route("/healthz", healthz),
        Route("/readyz", readyz),
        Route("/v1/voices", voices_route, methods=["GET", "POST"]),
        Route("/v1/audio/speech", audio_speech, methods=["POST"]),
        Route("/metrics", metrics),
    ]
    if (JS_CLIENT_DIR / "demo.html").is_file():
        routes += [Route("/", index), Mount("/client", ClientFiles(JS_CLIENT_DIR), name="client")]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.router.default = _not_found
    app.state.service = service
    return app


def _connection_refusal(service: Service, ws: WebSocket, subprotocols: list[str]) -> tuple[str, int, str] | None:
    """Why a new connection may not speak: (reason, close code, message), or None."""
    if not auth.origin_is_allowed(service.config.auth, ws.headers.get("origin")):
        return "origin", CLOSE_POLICY, auth.ORIGIN_REFUSED
    if not _authorised(service, ws, subprotocols):
        return "unauthorized", CLOSE_POLICY, auth.KEY_REFUSED
    if service.draining:
        return "shutting_down", CLOSE_GOING_AWAY, "the server is shutting down"
    if not service.ready():
        return "not_ready", CLOSE_TRY_AGAIN_LATER, "the server is not ready; try again shortly"
    if not service.admission.try_connect():
        return "at_capacity", CLOSE_TRY_AGAIN_LATER, "the server is at capacity; try again in a second"
    return None


async def _not_found(scope: Scope, receive: Receive, send: Send) -> None:
    """404 for an unknown path, WebSocket handshakes included: without it the handshake
    is refused with 403, which reads like an authentication failure."""
    response = JSONResponse({"error": {"code": "not_found", "message": "no such path"}}, status_code=404)
    if scope["type"] == "websocket":
        websocket = WebSocket(scope, receive, send)
        if "websocket.http.response" in scope.get("extensions", {}):
            await websocket.send_denial_response(response)
        else:  # a server without the denial extension can only refuse (403)
            await websocket.close()
        return
    await response(scope, receive, send)
