"""The HTTP port against hostile connections, on a real server as ``voxwire serve`` runs it
(server/run.py's uvicorn settings), over raw sockets on loopback: connections that never
finish their request are closed, their number is bounded while the probes and the
WebSockets still get in, requests framed two ways are refused, one client cannot hold
every slot, and the speech route takes a slot like every door."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import orjson
import pytest
import websockets

from voxwire.engine.worker import Worker
from voxwire.engine.worker_options import WorkerOptions
from voxwire.server.app import create_app
from voxwire.server.config import ServerConfig
from voxwire.server.doors.base import Gate
from voxwire.server.limits import Limits
from voxwire.server.http_guard import HttpConnections
from voxwire.server.run import DrainingServer, http_server, listening_line
from voxwire.server.sockets import listening_socket
from tests.conftest import RunningServer, free_port
from tests.fixtures.engines import ToneEngine

SPEECH = {"model": "tts-1", "voice": "tone", "response_format": "pcm"}
CLOSED_WITHIN = 15.0
"""How long a test waits for a connection the server should close after about a second: a
bound on correctness (the server as it was never closed them), not a speed."""


@dataclass
class Guarded(RunningServer):
    server: DrainingServer

    @property
    def bound(self) -> HttpConnections:
        return self.server.config.http.connections_bound  # type: ignore[union-attr]


@contextlib.contextmanager
def guarded_server(config: ServerConfig) -> Iterator[Guarded]:
    """The server ``voxwire serve`` runs (``http_server``), around the tone engine, in a
    thread of the test process."""
    limits = config.limits
    app = create_app(config, lambda: Worker(ToneEngine, WorkerOptions(
        max_queue_seconds=limits.max_queue_seconds, max_utterance_seconds=limits.max_utterance_seconds,
    )))
    sock = listening_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = http_server(app, "127.0.0.1", port, "warning")
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    for _ in range(1200):
        if server.started or not thread.is_alive():
            break
        time.sleep(0.05)
    if not server.started:
        raise RuntimeError("the test server did not start")
    try:
        yield Guarded("127.0.0.1", port, app.state.service, server)
    finally:
        server.should_exit = True
        thread.join(30)


def connect(server: Guarded, sent: bytes = b"") -> socket.socket:
    s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    if sent:
        s.sendall(sent)
    return s


def until_closed(s: socket.socket, within: float = CLOSED_WITHIN) -> bytes | None:
    """All the server sent until it closed the connection; None if it was still open after ``within``."""
    s.settimeout(within)
    received = b""
    end = time.monotonic() + within
    try:
        while time.monotonic() < end:
            data = s.recv(65536)
            if not data:
                return received
            received += data
    except socket.timeout:
        return None
    except ConnectionResetError:
        return received
    return None


def eventually(predicate, within: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    end = time.monotonic() + within
    while not predicate():
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


def statuses(received: bytes) -> list[int]:
    """The status of each response received (these bodies never contain a status line)."""
    return [int(status) for status in re.findall(rb"HTTP/1\.1 (\d{3}) ", received)]


HALF_HEAD = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: "
HALF_BODY = (b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             b"Content-Length: 200\r\n\r\n{\"model\": ")


# -- connections that never finish their request ---------------------------------------------


@pytest.mark.slow  # waits out the timeouts
def test_connections_that_never_finish_their_request_are_closed_after_the_timeouts():
    """Silent, half a head, a head dribbled a byte at a time, half a declared body, and a
    kept-alive connection that starts a second head and stops: uvicorn closed none of
    them, in 330 s. Each is closed after its timeout, and one that sent part of a head
    is told 408."""
    config = ServerConfig(header_timeout_seconds=1.0, body_timeout_seconds=1.0, cache_mb=0)
    with guarded_server(config) as s:
        silent, half_head, half_body = connect(s), connect(s, HALF_HEAD), connect(s, HALF_BODY)
        kept = connect(s, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert kept.recv(4096).startswith(b"HTTP/1.1 200")
        kept.sendall(b"GET /healthz HT")
        dribbler = connect(s, b"G")
        end = time.monotonic() + 3  # three head timeouts of one byte every 0.2 s
        while time.monotonic() < end:
            try:
                dribbler.send(b"E")
            except OSError:
                break
            time.sleep(0.2)
        assert until_closed(silent) == b""
        for partial in (half_head, kept, dribbler):
            received = until_closed(partial)
            assert received is not None and statuses(received) == [408], received
        assert until_closed(half_body) is not None
        assert len(s.bound.open) == 0
        assert eventually(lambda: s.service.admission.connections == 0)  # the half body's request gave its slot back


def test_the_probes_and_a_websocket_get_in_past_hundreds_of_held_connections(caplog):
    """300 connections holding their requests open against a bound of 32: each newcomer
    closes the one that waited longest on its client, so the server keeps at most 32,
    /healthz answers and a WebSocket opens, and the shedding is logged once, not 268
    times. (Without the bound, 20,200 such sockets took every file descriptor.)"""
    config = ServerConfig(max_http_connections=32, header_timeout_seconds=60, body_timeout_seconds=60, cache_mb=0)
    with guarded_server(config) as s, caplog.at_level(logging.WARNING, logger="voxwire.server.http_guard"):
        held = [connect(s, (b"", HALF_HEAD, HALF_BODY)[i % 3]) for i in range(300)]
        assert httpx.get(f"{s.http}/healthz", timeout=10).status_code == 200

        async def ready() -> str:
            async with websockets.connect(s.ws, open_timeout=10) as ws:
                return orjson.loads(await ws.recv())["type"]

        assert asyncio.run(ready()) == "ready"
        assert len(s.bound.open) <= 32
        closed = sum(until_closed(sock, within=0.05) is not None for sock in held)
        assert closed >= 300 - 32
        shed = [r for r in caplog.records if "shed" in r.getMessage()]
        assert len(shed) == 1, [r.getMessage() for r in shed]
        for sock in held:
            sock.close()


def test_a_connection_is_shed_only_while_it_waits_on_its_client():
    """A request being answered is never the one closed for a newcomer: only those waiting
    on their client are, the one silent longest first."""
    bound = HttpConnections(2)

    class Conn:
        closed = False

        def shed(self) -> None:
            self.closed = True

    answering, silent, newcomer, last = Conn(), Conn(), Conn(), Conn()
    assert bound.admit(answering) and bound.admit(silent)  # type: ignore[arg-type]
    bound.busy(answering)  # type: ignore[arg-type]
    assert bound.admit(newcomer)  # type: ignore[arg-type]
    assert (answering.closed, silent.closed) == (False, True)
    bound.busy(newcomer)  # type: ignore[arg-type]
    assert not bound.admit(last)  # type: ignore[arg-type]  # both are being answered: the newcomer goes


# -- requests framed two ways ----------------------------------------------------------------


def test_content_length_with_transfer_encoding_is_refused_and_the_connection_closed():
    """h11 framed it as chunked, answered the request smuggled after the chunks, and kept
    the connection: RFC 9112 section 6.1 says close it."""
    with guarded_server(ServerConfig(cache_mb=0)) as s:
        for head in (b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n",
                     b"Transfer-Encoding: chunked\r\nContent-Length: 40\r\n"):
            smuggler = connect(s, b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                               + head + b"\r\n0\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            received = until_closed(smuggler)
            assert received is not None and statuses(received) == [400], received


@pytest.mark.parametrize("request_bytes", [
    b"GET /healthz HTTP/1.1\nHost: x\n\n",
    b"GET /healthz HTTP/1.1\r\nHost: x\nX-A: b\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nHost: x\r\n\n",
], ids=["every-line", "one-line", "the-blank-line"])
def test_a_head_with_a_bare_lf_is_refused_with_400(request_bytes):
    with guarded_server(ServerConfig(cache_mb=0)) as s:
        received = until_closed(connect(s, request_bytes))
        assert received is not None and statuses(received) == [400], received


def test_a_pipelined_head_with_a_bare_lf_is_refused_and_well_formed_ones_are_answered():
    with guarded_server(ServerConfig(cache_mb=0)) as s:
        good = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        received = until_closed(connect(s, good + b"GET /healthz HTTP/1.1\nHost: x\n\n"))
        assert received is not None and statuses(received) == [200, 400], received
        pipelined = connect(s, good + good + b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        received = until_closed(pipelined)
        assert received is not None and statuses(received) == [200, 200, 200], received
        # A body is not a head: line ends in it are the client's own.
        body = b'{"model": "tts-1",\n"voice": "tone",\n"input": "la.", "response_format": "pcm"}\n'
        speech = connect(s, b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        received = until_closed(speech)
        assert received is not None and statuses(received) == [200], received


# -- slots: per client, and the speech route's ---------------------------------------------------


async def test_one_address_cannot_hold_every_websocket_slot():
    """256 idle sockets from one address once locked everyone out for 300 s: now one
    address holds at most its share; another (here the address a trusted proxy forwards)
    still gets in, and a slot given back can be taken again."""
    limits = Limits(max_connections=8, max_connections_per_client=3)
    with guarded_server(ServerConfig(limits=limits, cache_mb=0)) as s:
        async with contextlib.AsyncExitStack() as stack:
            mine = [await stack.enter_async_context(websockets.connect(s.ws)) for _ in range(3)]
            for ws in mine:
                assert orjson.loads(await ws.recv())["type"] == "ready"
            async with websockets.connect(s.ws) as fourth:
                with pytest.raises(websockets.ConnectionClosed) as refused:
                    await fourth.recv()
            assert refused.value.rcvd is not None and refused.value.rcvd.code == 1013
            assert "3 connections" in refused.value.rcvd.reason
            headers = {"X-Forwarded-For": "203.0.113.9"}
            async with websockets.connect(s.ws, additional_headers=headers) as someone_else:
                assert orjson.loads(await someone_else.recv())["type"] == "ready"
            await mine[0].close()
            await asyncio.sleep(0.2)
            async with websockets.connect(s.ws) as again:
                assert orjson.loads(await again.recv())["type"] == "ready"
        assert s.service.admission.connections == 0 and not s.service.gate.clients


def test_the_default_share_of_one_client_is_a_quarter_of_the_connections():
    def gate(limits: Limits) -> Gate:
        from voxwire.server.limits import Admission

        return Gate(Admission(limits), None, lambda: True)  # type: ignore[arg-type]

    assert gate(Limits()).per_client == 64
    assert gate(Limits(max_connections=1000)).per_client == 250
    assert gate(Limits(max_connections=2)).per_client == 8  # a small server is not held to half a slot
    assert gate(Limits(max_connections_per_client=5)).per_client == 5


async def test_the_speech_route_takes_a_connection_slot_for_its_whole_request():
    """docs/doors.md says every door shares the connection slots; the speech route did
    not: it answered with every slot taken. Now it is refused (429, at_capacity), and a
    request holds a slot from before its body is read to the end of its response."""
    limits = Limits(max_connections=2)
    with guarded_server(ServerConfig(limits=limits, cache_mb=0)) as s:
        url = f"{s.http}/v1/audio/speech"
        async with httpx.AsyncClient(timeout=30) as http:
            async with websockets.connect(s.ws) as a, websockets.connect(s.ws) as b:
                await a.recv()
                await b.recv()
                refused = await http.post(url, json={**SPEECH, "input": "la."})
                assert refused.status_code == 429
                assert refused.json()["error"]["code"] == "at_capacity"
                assert refused.headers["retry-after"] == "1"
            await asyncio.sleep(0.2)
            engine = s.service.worker.engine
            assert isinstance(engine, ToneEngine)
            async with http.stream("POST", url, json={**SPEECH, "input": "la stall la."}) as r:
                assert r.status_code == 200
                assert s.service.admission.connections == 1  # its audio is still to come
                engine.release.set()
                assert len(await r.aread()) > 0
            assert (await http.post(url, json={**SPEECH, "input": "la."})).status_code == 200
        assert await asyncio.to_thread(eventually, lambda: s.service.admission.connections == 0)
        assert not s.service.gate.clients


async def test_the_speech_route_refuses_one_client_over_its_share_with_429():
    limits = Limits(max_connections=8, max_connections_per_client=1)
    with guarded_server(ServerConfig(limits=limits, cache_mb=0)) as s:
        async with websockets.connect(s.ws) as ws, httpx.AsyncClient(timeout=30) as http:
            await ws.recv()
            refused = await http.post(f"{s.http}/v1/audio/speech", json={**SPEECH, "input": "la."})
            assert refused.status_code == 429
            assert refused.json()["error"]["code"] == "client_at_capacity"


# -- where it listens ----------------------------------------------------------------------------


def test_the_listening_line_names_every_address():
    assert listening_line("127.0.0.1", 8000, {}) == "listening on http://127.0.0.1:8000 (ws://127.0.0.1:8000/v1/stream)"
    assert listening_line("::1", 8000, {"wyoming": ("::1", 10200)}) == (
        "listening on http://[::1]:8000 (ws://[::1]:8000/v1/stream), wyoming on tcp://[::1]:10200"
    )


@pytest.mark.slow  # a server in a process of its own
def test_serve_says_where_it_listens_once_it_is_ready():
    port, wyoming = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "voxwire", "serve", "--port", str(port), "--wyoming-port", str(wyoming),
         "--piper-backend", "onnx", "--log-format", "text"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        assert eventually(lambda: any("listening on" in line for line in lines), within=120), lines
        time.sleep(1)  # nothing says it twice
        said = [line for line in lines if "listening on" in line]
        assert len(said) == 1, lines
        assert (f"listening on http://127.0.0.1:{port} (ws://127.0.0.1:{port}/v1/stream), "
                f"wyoming on tcp://127.0.0.1:{wyoming}") in said[0]
        assert httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=10).status_code == 200  # ready when said
    finally:
        proc.terminate()
        proc.wait(60)
