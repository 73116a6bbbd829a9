"""Faults through the real server: engine errors, hangs, slow readers, SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys

from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
import websockets

from voxwire.server.config import ServerConfig
from voxwire.server.limits import Limits
from tests.conftest import free_port, run_server
from tests.fixtures.engines import ToneEngine
from voxwire_client import Client, ServerError


async def test_engine_error_mid_utterance_fails_it_alone(tone_server):
    async with await Client.connect(tone_server.ws) as client:
        bad = await client.speak("one two explode four.", ctx="bad")
        good = await client.speak("five six seven eight.", ctx="good")
        with pytest.raises(ServerError) as e:
            await bad.collect()
        assert e.value.code == "engine_error"
        frames, done = await good.collect()
        assert done["samples"] == 4 * 1600  # four words, 100 ms each at 16 kHz
    async with await Client.connect(tone_server.ws) as client:
        frames, done = await (await client.speak("after.")).collect()
        assert done.type == "done"


async def test_hung_engine_is_replaced_and_service_continues():
    engines: list[ToneEngine] = []

    def factory():
        engines.append(ToneEngine())
        return engines[-1]

    try:
        with run_server(ServerConfig(step_timeout=0.5), engine=factory) as s:
            async with await Client.connect(s.ws) as client:
                hung = await client.speak("one stall three.", ctx="hung")
                with pytest.raises(ServerError) as e:
                    await hung.collect()
                assert e.value.code == "engine_timeout"
                for _ in range(200):
                    if s.service.ready():
                        break
                    await asyncio.sleep(0.05)
                frames, done = await (await client.speak("still here.", ctx="next")).collect()
                assert done["samples"] == 2 * 1600
            assert s.service.supervisor.restarts == 1 and len(engines) == 2
    finally:
        for e in engines:
            e.release.set()


@pytest.mark.slow  # about 10 s of a reader held back
async def test_slow_reader_is_bounded_and_others_are_unaffected():
    limits = Limits(max_queue_seconds=1.0)
    with run_server(ServerConfig(limits=limits), engine=ToneEngine) as s:
        # A reader that never reads: tiny buffers, so the socket backs up quickly.
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect((s.host, s.port))
        slow = await websockets.connect(s.ws, sock=sock, max_queue=1)
        await slow.recv()
        big = "word " * 3000 + "."  # 300 s of audio
        await slow.send(orjson.dumps({"type": "speak", "ctx": "slow", "text": big, "format": "pcm_f32le",
                                      "sample_rate": 48000}).decode())
        worker = s.service.worker
        # Kernel socket buffers absorb some audio first; wait until the stream is stuck.
        steps = -1
        for _ in range(100):
            us = worker.utterances()
            if us and us[0].backlogged() and us[0].steps == steps:
                break
            steps = us[0].steps if us else -1
            await asyncio.sleep(0.3)
        (u,) = worker.utterances()
        assert u.backlogged() and u.steps == steps
        # Another client is served in full meanwhile.
        async with await Client.connect(s.ws) as client:
            frames, done = await (await client.speak("quick brown fox jumps.")).collect()
            assert done["samples"] == 4 * 1600
        # The slow one stayed at its bound: no step was computed for it meanwhile.
        assert u.steps == steps
        assert u.queue.samples <= 1.0 * 16000 + 1600
        assert u.produced_samples < 0.2 * 3000 * 1600  # nowhere near the whole text
        await slow.close()


def _serve(port: int, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "voxwire", "serve", "--port", str(port), "--log-level", "warning", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


async def _wait_listening(url: str, proc: subprocess.Popen[str]) -> None:
    for _ in range(600):
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        try:
            async with websockets.connect(url) as ws:
                await ws.recv()
                return
        except OSError:
            await asyncio.sleep(0.1)
    raise AssertionError("server did not start")


@contextlib.asynccontextmanager
async def _speaking_then_sigterm(drain_seconds: str, ctx: str, text: str) -> AsyncIterator[tuple[Any, str]]:
    """A server process, a socket speaking ``text`` as ``ctx``, and SIGTERM once its first
    audio frame has arrived; the server must then exit by itself."""
    port = free_port()
    url = f"ws://127.0.0.1:{port}/v1/stream"
    proc = _serve(port, "--drain-seconds", drain_seconds)
    try:
        await _wait_listening(url, proc)
        async with websockets.connect(url) as ws:
            await ws.recv()
            await ws.send(orjson.dumps({"type": "speak", "ctx": ctx, "text": text}).decode())
            while not isinstance(await ws.recv(), bytes):
                pass
            os.kill(proc.pid, signal.SIGTERM)
            yield ws, url
        assert proc.wait(30) in (0, -signal.SIGTERM)
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow  # a spawned server, drained
async def test_sigterm_finishes_in_flight_then_closes_1001():
    text = "This sentence is spoken while the server stops. " * 3
    async with _speaking_then_sigterm("20", "a", text) as (ws, url):
        frames, events = 1, []
        with pytest.raises(websockets.ConnectionClosed) as closed:
            while True:
                m = await asyncio.wait_for(ws.recv(), 30)
                if isinstance(m, bytes):
                    frames += 1
                else:
                    events.append(orjson.loads(m)["type"])
                    if events[-1] == "done":
                        # Draining: a new connection is turned away.
                        async with websockets.connect(url) as late:
                            with pytest.raises(websockets.ConnectionClosed) as refused:
                                await late.recv()
                            assert refused.value.rcvd.code == 1001
        assert events == ["done"] and frames > 10  # "started" came before the first frame
        assert closed.value.rcvd.code == 1001


@pytest.mark.slow  # a spawned server, drained
async def test_sigterm_past_the_deadline_tells_the_client_and_closes_1001():
    text = "A very long answer that will not finish in half a second. " * 40
    async with _speaking_then_sigterm("0.5", "long", text) as (ws, _):
        last = None
        with pytest.raises(websockets.ConnectionClosed) as closed:
            while True:
                m = await asyncio.wait_for(ws.recv(), 30)
                if isinstance(m, str):
                    last = orjson.loads(m)
        assert last is not None and (last["code"], last["ctx"], last["terminal"]) == ("shutting_down", "long", True)
        assert closed.value.rcvd.code == 1001


@pytest.mark.slow  # a spawned server, drained
async def test_sigterm_cuts_an_http_stream_so_the_client_can_tell():
    port = free_port()
    url = f"ws://127.0.0.1:{port}/v1/stream"
    proc = _serve(port, "--drain-seconds", "0.5")
    text = "A very long answer that will not finish in half a second. " * 40
    try:
        await _wait_listening(url, proc)
        async with httpx.AsyncClient(timeout=60) as http:
            body = {"model": "tts-1", "input": text, "voice": "alloy", "response_format": "wav"}
            async with http.stream("POST", f"http://127.0.0.1:{port}/v1/audio/speech", json=body) as r:
                assert r.status_code == 200
                chunks = r.aiter_raw()
                received = len(await chunks.__anext__())
                os.kill(proc.pid, signal.SIGTERM)
                with pytest.raises(httpx.RemoteProtocolError):  # an incomplete body, not a short "whole" one
                    async for chunk in chunks:
                        received += len(chunk)
        assert proc.wait(30) in (0, -signal.SIGTERM)
        assert received < 2 * 24000 * 60  # far less than the minutes of audio asked for
    finally:
        proc.kill()
        proc.wait()
