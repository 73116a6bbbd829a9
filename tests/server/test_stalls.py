"""Stalled listeners are reclaimed (stall_timeout_seconds), real readers never are.

A listener is stalled when the server has audio for it that it does not take: its socket
accepts nothing (it stopped reading), or, once it reports playback progress, it reports
none while the flow window holds its utterance. Each case runs on a real server on
loopback, with raw ``websockets`` clients; a client that stops reading has small receive
buffers (SO_RCVBUF, ``max_queue=1``), so the server's sends block within a second or two.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import msgpack
import orjson
import pytest
import websockets

from voxwire.server.config import ServerConfig
from voxwire.server.limits import Limits
from tests.conftest import Loopback, RunningServer, run_server
from tests.fixtures.engines import RATE, WORD_SECONDS, ToneEngine
from tests.server.test_metrics import scrape
from voxwire_client import Client

pytestmark = pytest.mark.slow  # waits out stall timeouts, about 40 s

STALL_S = 2.0
WINDOW_S = 1.0
LONG = "word " * 2999 + "word."  # 300 s of audio: far beyond every buffer and the window
NOT_READING = "voxwire_listeners_stalled_total{door=ws,reason=not_reading}"
NO_PROGRESS = "voxwire_listeners_stalled_total{door=ws,reason=no_progress}"
FAILED_STALLED = "voxwire_utterances_total{code=listener_stalled,door=ws,outcome=failed}"


def message(**fields: object) -> str:
    return orjson.dumps(fields).decode()


def speak(ctx: str, text: str, fmt: str = "pcm_f32le", rate: int = 48000) -> str:
    return message(type="speak", ctx=ctx, text=text, format=fmt, sample_rate=rate)


async def until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def deaf_client(s: Loopback) -> websockets.ClientConnection:
    """A client that reads its ``ready`` and then nothing: its small buffers fill at once,
    so the server's sends to it block (TCP's receive window is full)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((s.host, s.port))
    # Uncompressed, or the tone's frames would shrink to almost nothing on the wire; no
    # keepalive pings, which it would time out itself, being deaf.
    ws = await websockets.connect(s.ws, sock=sock, max_queue=1, compression=None, ping_interval=None)
    await ws.recv()
    return ws


@dataclass
class Reader:
    """A client that reads every message as it comes, in a task of its own."""

    ws: websockets.ClientConnection
    events: list[dict] = field(default_factory=list)
    samples: dict[str, int] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None

    @classmethod
    async def connect(cls, s: Loopback) -> Reader:
        reader = cls(await websockets.connect(s.ws))
        await reader.ws.recv()
        reader.task = asyncio.create_task(reader._read())
        return reader

    async def _read(self) -> None:
        try:
            async for raw in self.ws:
                if isinstance(raw, bytes):
                    frame = msgpack.unpackb(raw)
                    self.samples[frame["ctx"]] = self.samples.get(frame["ctx"], 0) + frame["samples"]
                else:
                    self.events.append(orjson.loads(raw))
        except websockets.ConnectionClosed:
            pass

    def last(self, ctx: str) -> dict | None:
        """The last control message for ``ctx``."""
        return next((e for e in reversed(self.events) if e.get("ctx") == ctx), None)

    async def ended(self, ctx: str, timeout: float) -> dict:
        """Its ``done`` or terminal error."""
        def over() -> bool:
            e = self.last(ctx)
            return e is not None and (e["type"] == "done" or e["type"] == "error" and e.get("terminal"))

        await until(over, timeout, f"the end of {ctx}")
        return self.last(ctx)  # type: ignore[return-value]

    async def close(self) -> None:
        await self.ws.close()
        if self.task is not None:
            await self.task


async def read_to_the_end(ws: websockets.ClientConnection, timeout: float) -> list[dict]:
    """Everything left for a client that starts reading again, up to the connection's end."""
    events = []
    async with asyncio.timeout(timeout):
        try:
            while True:
                raw = await ws.recv()
                if isinstance(raw, str):
                    events.append(orjson.loads(raw))
        except websockets.ConnectionClosed:
            return events


@pytest.fixture
def stalls() -> RunningServer:
    # Six slots in all; the idle timeout of the report (3 s) plays no part while audio waits.
    limits = Limits(
        max_utterances_total=6, stall_timeout_seconds=STALL_S, flow_window_seconds=WINDOW_S, idle_timeout_seconds=3.0,
    )
    with run_server(ServerConfig(limits=limits, cache_mb=0), engine=lambda: ToneEngine(step_delay=0.002)) as s:
        yield s


async def test_stalled_listeners_are_reclaimed_and_the_server_serves_again(stalls):
    """Voxwire issue 29, case 5, scaled down: two sockets that stop reading (two
    utterances each) and two that report `played: 0` once and never again take every
    slot; within the stall timeout (and the audio a player would still have in hand) all
    six end as `listener_stalled`, their slots come back, and a new client is served."""
    s = stalls
    admission = s.service.admission
    before = scrape(s)
    deaf = [await deaf_client(s) for _ in range(2)]
    for i, ws in enumerate(deaf):
        for part in ("a", "b"):
            await ws.send(speak(f"deaf{i}{part}", LONG))
    quiet = [await Reader.connect(s) for _ in range(2)]
    for i, r in enumerate(quiet):
        await r.ws.send(speak(f"quiet{i}", LONG))
        await r.ws.send(message(type="progress", ctx=f"quiet{i}", played=0))
    await until(lambda: admission.utterances == 6, 10, "six utterances admitted")
    # What the issue saw: the server is full, and a new socket is turned away.
    async with websockets.connect(s.ws) as extra:
        with pytest.raises(websockets.ConnectionClosed) as refused:
            await asyncio.wait_for(extra.recv(), 10)
    assert refused.value.rcvd is not None and refused.value.rcvd.code == 1013

    # The two that still read are told why their utterance ended; nothing follows for it.
    for i, r in enumerate(quiet):
        end = await r.ended(f"quiet{i}", 30)
        assert end["type"] == "error" and end["code"] == "listener_stalled" and end["terminal"] is True, end
        assert f"quiet{i}" in end["message"] and f"{STALL_S:g} s" in end["message"]
        assert r.samples[f"quiet{i}"] <= (WINDOW_S + 2 * WORD_SECONDS) * 48000  # held at the window all along
    # The deaf sockets could be told nothing: their utterances ended, and their connections.
    await until(lambda: admission.utterances == 0, 30, "every slot given back")
    await until(lambda: admission.connections == 2, 30, "the deaf connections dropped")
    await until(lambda: not s.service.worker.utterances(), 10, "the worker letting go")

    after = scrape(s)
    assert after[NOT_READING] - before[NOT_READING] == 4
    assert after[NO_PROGRESS] - before[NO_PROGRESS] == 2
    assert after[FAILED_STALLED] - before.get(FAILED_STALLED, 0) == 6

    # A new client is admitted and gets its audio, in full.
    async with await Client.connect(s.ws) as client:
        frames, done = await asyncio.wait_for((await client.speak("quick brown fox jumps.")).collect(), 30)
    assert done["samples"] == sum(f.samples for f in frames) == round(4 * WORD_SECONDS * RATE)
    # A stalled utterance ends that utterance only: its session speaks on.
    await quiet[0].ws.send(speak("again", "one two three.", fmt="pcm_s16le", rate=RATE))
    end = await quiet[0].ended("again", 30)
    assert end["type"] == "done" and quiet[0].samples["again"] == end["samples"] == round(3 * WORD_SECONDS * RATE)
    for r in quiet:
        await r.close()
    # A deaf client that reads again finds its connection ended, without any `done`.
    for ws in deaf:
        left = await read_to_the_end(ws, 30)
        assert not [e for e in left if e["type"] == "done"], left


@dataclass
class Played:
    """What a listener that keeps up got: its samples and its last control message."""

    samples: int = 0
    end: dict | None = None


async def paced_reader(s: RunningServer, fmt: str, rate: int, text: str, pause_at: float | None) -> Played:
    """A listener that reads no faster than it plays, through small buffers (the server's
    sends block on it all along), pausing once for less than the stall timeout."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((s.host, s.port))
    played = Played()
    async with websockets.connect(s.ws, sock=sock, max_queue=1, compression=None) as ws:
        await ws.recv()
        await ws.send(speak("long", text, fmt=fmt, rate=rate))
        started: float | None = None
        paused = 0.0
        while played.end is None:
            raw = await asyncio.wait_for(ws.recv(), 30)
            if isinstance(raw, str):
                event = orjson.loads(raw)
                if event["type"] in ("done", "error"):
                    played.end = event
                continue
            started = started or time.monotonic()
            played.samples += msgpack.unpackb(raw)["samples"]
            if pause_at is not None and not paused and played.samples >= pause_at * rate:
                paused = STALL_S / 2
                await asyncio.sleep(paused)
            # Read the next frame only once this one has played.
            await asyncio.sleep(max(0.0, started + paused + played.samples / rate - time.monotonic()))
    return played


async def progress_reader(s: RunningServer, text: str, pause_at: float) -> Played:
    """A listener that reads every frame at once (as a browser does, or a proxy) and
    reports what it has played, in real time, every 200 ms; once, its playback pauses
    (no progress) for less than the stall timeout."""
    played = Played()
    async with websockets.connect(s.ws) as ws:
        await ws.recv()
        await ws.send(speak("long", text, fmt="pcm_s16le", rate=RATE))
        await ws.send(message(type="progress", ctx="long", played=0))
        clock = 0.0  # seconds played
        last = time.monotonic()
        paused = False
        while played.end is None:
            try:
                raw = await asyncio.wait_for(ws.recv(), 0.2)
            except TimeoutError:
                raw = None
            if isinstance(raw, bytes):
                played.samples += msgpack.unpackb(raw)["samples"]
            elif isinstance(raw, str):
                event = orjson.loads(raw)
                if event["type"] in ("done", "error"):
                    played.end = event
            now = time.monotonic()
            clock = min(clock + now - last, played.samples / RATE)
            last = now
            if not paused and clock >= pause_at:
                paused = True
                await asyncio.sleep(STALL_S / 2)
                last = time.monotonic()
            await ws.send(message(type="progress", ctx="long", played=int(clock * RATE)))
    return played


async def test_listeners_that_keep_up_or_pause_briefly_are_never_stalled():
    """A long answer (30 s), heard in real time with a short stall timeout: by a reader
    of PCM that reads as it plays, by one of µ-law at 8 kHz (so few bytes a second that a
    send waits many seconds for the socket, though the listener keeps up), and by one
    that reports progress; each pauses once for half the stall timeout. None is touched."""
    limits = Limits(stall_timeout_seconds=STALL_S, flow_window_seconds=WINDOW_S, max_queue_seconds=1.0)
    text = "word " * 299 + "word."  # 30 s
    with run_server(ServerConfig(limits=limits, cache_mb=0), engine=lambda: ToneEngine(step_delay=0.002)) as s:
        before = scrape(s)
        readers: list[Awaitable[Played]] = [
            paced_reader(s, "pcm_s16le", RATE, text, pause_at=10.0),
            paced_reader(s, "mulaw", 8000, text, pause_at=10.0),
            progress_reader(s, text, pause_at=10.0),
        ]
        results = await asyncio.wait_for(asyncio.gather(*readers), 90)
        after = scrape(s)
    for played in results:
        assert played.end is not None and played.end["type"] == "done", played.end
        assert played.samples == played.end["samples"] > 29 * 8000
    assert after[NOT_READING] == before[NOT_READING] and after[NO_PROGRESS] == before[NO_PROGRESS]


async def test_an_http_reader_that_takes_nothing_is_cut_and_its_slot_freed():
    """``POST /v1/audio/speech`` has no progress messages: a reader that takes none of the
    body for the stall timeout (beyond what it could have played) has its response cut
    (an incomplete body, as a failure after the status line always is), its utterance
    ended ``listener_stalled`` and its slot given back."""
    limits = Limits(stall_timeout_seconds=STALL_S, max_utterances_total=1)
    with run_server(ServerConfig(limits=limits, cache_mb=0), engine=lambda: ToneEngine(step_delay=0.005)) as s:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect((s.host, s.port))
        text = "word " * 800  # 80 s of tone, within the route's 4096 characters
        body = orjson.dumps({"model": "tts-1", "input": text, "voice": "tone", "response_format": "pcm"})
        sock.sendall(
            f"POST /v1/audio/speech HTTP/1.1\r\nHost: {s.host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode() + body
        )
        try:
            # Never read: the one slot is held, then freed once the stall is seen.
            await until(lambda: s.service.admission.utterances == 1, 30, "the utterance to start")
            await until(lambda: s.service.admission.utterances == 0, 60, "the slot to come back")
            m = scrape(s)
            assert m["voxwire_listeners_stalled_total{door=http,reason=not_reading}"] == 1
            assert m["voxwire_utterances_total{code=listener_stalled,door=http,outcome=failed}"] == 1
            async with await Client.connect(s.ws) as client:  # the slot serves another
                audio, done = await (await client.speak("word word.")).collect()
            assert done.type == "done" and sum(a.samples for a in audio) > 0
        finally:
            sock.close()
