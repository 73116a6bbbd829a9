"""Flow control by playback progress (docs/protocol.md, ``progress``), on plain uvicorn.

Each client here reads every frame at once, as a proxy that buffers without bound would:
TCP never pushes back, so only the client's count of what it played can hold the server.
"""

from __future__ import annotations

import asyncio
import socket
import struct

import msgpack
import numpy as np
import orjson
import pytest
import websockets

from voxwire.engine.audio_queue import AudioQueue
from voxwire.server import protocol
from voxwire.server.config import ServerConfig
from voxwire.server.limits import Limits
from voxwire.server.protocol import ProtocolError
from tests.conftest import RunningServer, run_server
from tests.fixtures.engines import RATE, WORD_SECONDS, ToneEngine
from voxwire_client import Client

STEP = int(RATE * WORD_SECONDS)  # one word, one engine step
WINDOW_S = 1.0
WINDOW = int(WINDOW_S * RATE)


def words(n: int) -> str:
    """``n`` words: ``n`` engine steps of the tone engine, 0.1 s of audio each."""
    return "word " * (n - 1) + "word."


LONG = words(400)  # 40 s of audio: far beyond the window and the queue


# -- the queue's rule ----------------------------------------------------------------------


async def test_a_paced_queue_is_full_a_window_ahead_of_play_and_released_by_progress():
    drained: list[int] = []
    q = AudioQueue(asyncio.get_running_loop(), max_samples=10 * STEP, on_drain=lambda: drained.append(1))
    assert not q.full()
    q.pace(window=3 * STEP, played=0)
    for _ in range(3):
        q.put(np.zeros(STEP, np.float32))
    for _ in range(3):
        await q.get()  # the queue itself is empty: only the window holds it
    assert q.samples == 0 and q.ahead == 3 * STEP and q.full()
    q.pace(window=3 * STEP, played=STEP)
    assert not q.full() and drained == [1]  # the worker is woken
    q.pace(window=3 * STEP, played=0)  # an older count changes nothing
    assert q.ahead == 2 * STEP
    q.pace(window=3 * STEP, played=100 * STEP)  # more than was computed counts as all of it
    assert q.ahead == 0


async def test_an_unpaced_queue_is_bounded_by_its_samples_only():
    q = AudioQueue(asyncio.get_running_loop(), max_samples=2 * STEP)
    for _ in range(5):
        q.put(np.zeros(STEP, np.float32))
        await q.get()
    assert not q.full() and q.ahead == 5 * STEP


# -- the message --------------------------------------------------------------------------


def test_progress_parses_and_bad_ones_have_stable_codes():
    assert protocol.parse(orjson.dumps({"type": "progress", "ctx": "a", "played": 4800}).decode()) == protocol.Progress("a", 4800)
    for bad, code in [
        ({"type": "progress", "ctx": "a"}, "missing_field"),
        ({"type": "progress", "played": 1}, "missing_field"),
        ({"type": "progress", "ctx": "a", "played": -1}, "invalid_field"),
        ({"type": "progress", "ctx": "a", "played": 1.5}, "invalid_field"),
        ({"type": "progress", "ctx": "a", "played": True}, "invalid_field"),
        ({"type": "progress", "ctx": "a", "played": 1, "extra": 1}, "unknown_field"),
    ]:
        with pytest.raises(ProtocolError) as e:
            protocol.parse(orjson.dumps(bad).decode())
        assert e.value.code == code, bad


# -- a real server ----------------------------------------------------------------------------


@pytest.fixture
def paced_server():
    limits = Limits(flow_window_seconds=WINDOW_S, max_queue_seconds=5.0)
    with run_server(ServerConfig(limits=limits, cache_mb=0), engine=lambda: ToneEngine(step_delay=0.005)) as s:
        yield s


async def _speak(ws, ctx: str, text: str, progress: int | None) -> None:
    await ws.send(orjson.dumps({"type": "speak", "ctx": ctx, "text": text, "format": "pcm_f32le",
                                "sample_rate": RATE}).decode())
    if progress is not None:
        await ws.send(orjson.dumps({"type": "progress", "ctx": ctx, "played": progress}).decode())


async def _read_until_quiet(ws, quiet: float = 0.5) -> tuple[int, bool]:
    """Read every frame that comes until none has come for ``quiet`` s: (samples, done)."""
    samples, done = 0, False
    while not done:
        try:
            raw = await asyncio.wait_for(ws.recv(), quiet)
        except TimeoutError:
            break
        if isinstance(raw, bytes):
            samples += msgpack.unpackb(raw)["samples"]
        else:
            done = orjson.loads(raw)["type"] == "done"
    return samples, done


async def _steady(s: RunningServer) -> int:
    """The utterance's step count, once it has stopped changing."""
    (u,) = s.service.worker.utterances()
    steps = -1
    while u.steps != steps:
        steps = u.steps
        await asyncio.sleep(0.3)
    return steps


async def test_a_reader_that_reports_no_play_is_computed_only_the_window_ahead(paced_server):
    s = paced_server
    async with websockets.connect(s.ws) as ws:
        await ws.recv()
        await _speak(ws, "a", LONG, progress=0)
        sent, done = await _read_until_quiet(ws)
        assert not done
        steps = await _steady(s)
        (u,) = s.service.worker.utterances()
        # Everything computed was sent: the queue is empty, the window alone holds it.
        assert u.queue.samples == 0 and u.backlogged()
        assert WINDOW <= u.produced_samples <= WINDOW + STEP
        assert sent <= u.produced_samples
        # Progress releases it, by as much as was played.
        await ws.send(orjson.dumps({"type": "progress", "ctx": "a", "played": sent}).decode())
        more, done = await _read_until_quiet(ws)
        assert not done and 0.8 * sent <= more <= sent + 2 * STEP
        assert u.steps > steps and u.produced_samples <= sent + WINDOW + STEP
        await ws.send(orjson.dumps({"type": "cancel", "ctx": "a"}).decode())


async def test_a_reader_that_never_reports_keeps_todays_behaviour(paced_server):
    s = paced_server
    async with websockets.connect(s.ws) as ws:
        await ws.recv()
        await _speak(ws, "a", words(60), progress=None)  # 6 s: beyond the window
        samples, done = await _read_until_quiet(ws, quiet=5.0)
        assert done and samples == 60 * STEP


async def test_the_python_client_reports_what_its_consumer_has_taken(paced_server):
    s = paced_server
    async with await Client.connect(s.ws) as client:
        u = await client.speak(words(80), format="pcm_f32le", sample_rate=RATE)
        it = aiter(u)
        taken = 0
        while taken < 5 * STEP:  # a consumer that takes half a second, then stops for a while
            item = await anext(it)
            taken += getattr(item, "samples", 0)
        await _steady(s)
        (w,) = s.service.worker.utterances()
        assert w.produced_samples <= taken + WINDOW + 2 * STEP  # not the whole 8 s
        audio = []
        async for item in it:  # then takes the rest: all of it comes
            if hasattr(item, "samples"):
                audio.append(item.to_float32())
            elif item.type == "done":
                break
        total = taken + sum(a.size for a in audio)
        assert total == 80 * STEP
        assert np.abs(np.concatenate(audio)).max() > 0.1  # real tone, not silence


async def test_a_client_that_vanishes_stops_its_utterance_before_the_next_step():
    # A slow engine step (0.2 s), so "before the next step" is told apart from "soon".
    with run_server(ServerConfig(cache_mb=0), engine=lambda: ToneEngine(step_delay=0.2)) as s:
        sock = socket.create_connection((s.host, s.port))
        ws = await websockets.connect(s.ws, sock=sock)
        await ws.recv()
        await _speak(ws, "a", LONG, progress=None)
        while not isinstance(await ws.recv(), bytes):
            pass
        (u,) = s.service.worker.utterances()
        # An abort, not a close: RST, with no close frame (SO_LINGER 0).
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        steps_at_abort = u.steps
        sock.close()
        for _ in range(100):
            if u.stream_closed:
                break
            await asyncio.sleep(0.05)
        assert u.stream_closed and u.outcome == "cancelled"
        assert u.steps <= steps_at_abort + 1  # at most the step already running
