"""A new door is one class and one registration: a toy door, written here as a newcomer
would write one, shares admission, the idle timeout, accounting (its own ``door`` label,
zero-initialised) and the log line with the built-in doors, with no change to server code.

The toy door: a line of text over TCP in, its speech out as raw 16-bit PCM, then the
connection closes; an error is one line, ``error <code>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from dataclasses import replace

import numpy as np
import pytest

from tests.conftest import run_server
from tests.fixtures.engines import RATE, WORD_SECONDS, ToneEngine, dominant_pitches, word_pitch
from tests.server.test_metrics import scrape
from voxwire.server.config import ServerConfig
from voxwire.server.doors import DOORS
from voxwire.server.doors.base import Conversation, Door, ListenerStalled, Sender
from voxwire.server.limits import Limits
from voxwire.server.framing import AudioFrame, Event
from voxwire.server.pipeline import Refused

IDLE_SECONDS = 1.0


class LineDoor(Door):
    name = "line"

    def bind(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.setblocking(False)

    async def start(self) -> None:
        self.server = await asyncio.start_server(self.serve, sock=self.sock)

    def close(self) -> None:
        self.server.close()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        refusal = self.admit()
        if refusal is None:
            line = LineConversation(self, writer)
            async with self.connection(line, line.shutdown):
                await self.converse(line, reader.readline)
        else:
            writer.write(f"error {refusal.code}\n".encode())
            # A lingering close: closed with the client's line unread, the socket resets
            # the connection, and the reset can reach the client before the refusal.
            writer.write_eof()
            with contextlib.suppress(asyncio.TimeoutError, ConnectionError):
                await asyncio.wait_for(reader.read(), 1.0)
        await writer.drain()
        writer.close()


class LineConversation(Conversation[bytes]):
    def __init__(self, door: LineDoor, writer: asyncio.StreamWriter) -> None:
        super().__init__()
        self.door = door
        self.writer = writer
        self.opened_at = time.monotonic()
        self.budget = door.budget()
        self.sender = door.sender(self.write, on_stall=self.closing.set)

    async def handle(self, line: bytes) -> bool:
        if line:
            settings = replace(self.door.defaults(), format="pcm_s16le")
            try:
                speech = self.door.open_utterance(line.decode().strip(), True, settings, {"line": "1"}, self.budget)
            except Refused as e:
                self.writer.write(f"error {e.code}\n".encode())
                return False

            async def deliver(event: Event) -> None:
                if isinstance(event, AudioFrame):
                    await self.sender.send(event.data, audio_of=speech)

            await self.door.speak(speech, deliver, "line-utterance")
        return False

    async def write(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    def idle_in(self, now: float) -> float:
        return self.opened_at + self.door.limits.idle_timeout_seconds - now

    async def idle(self) -> None:
        self.writer.write(b"error idle_timeout\n")

    async def shutdown(self) -> None:
        self.writer.close()


@pytest.fixture(scope="module")
def line_server():
    limits = Limits(max_connections=2, idle_timeout_seconds=IDLE_SECONDS)
    with run_server(ServerConfig(limits=limits, cache_mb=0), engine=ToneEngine, doors=(*DOORS, LineDoor)) as s:
        yield s


def door_of(server) -> LineDoor:
    door = server.service.doors["line"]
    assert isinstance(door, LineDoor)
    return door


async def talk(server, text: str | None) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", door_of(server).sock.getsockname()[1])
    if text is not None:
        writer.write(text.encode() + b"\n")
        await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()


async def test_the_toy_door_speaks_and_is_counted_under_its_own_name(line_server, caplog):
    before = scrape(line_server)
    # Zero-initialised from the start for every door the server opens, Wyoming's among
    # them (without a Wyoming port, its series are still there).
    for door in ("ws", "http", "wyoming", "line"):
        assert before[f"voxwire_utterances_total{{code=,door={door},outcome=done}}"] == 0
    done = "voxwire_utterances_total{code=,door=line,outcome=done}"
    assert "voxwire_ttfa_seconds_count{door=line}" in before
    assert "voxwire_listeners_stalled_total{door=line,reason=not_reading}" in before
    words = ["toy", "door", "speaks"]
    with caplog.at_level(logging.INFO, logger="voxwire"):
        audio = await talk(line_server, " ".join(words))
    samples = np.frombuffer(audio, "<i2").astype(np.float32) / 32768
    assert samples.size == len(words) * round(RATE * WORD_SECONDS)
    assert np.abs(samples).max() > 0.3  # speech, not silence
    pitches = dominant_pitches(samples)
    assert [round(p / 10) for p in pitches] == [round(word_pitch(w) / 10) for w in words]
    after = scrape(line_server)
    assert after[done] == before[done] + 1
    assert after["voxwire_ttfa_seconds_count{door=line}"] == before["voxwire_ttfa_seconds_count{door=line}"] + 1
    lines = [r for r in caplog.records if r.name == "voxwire.utterance" and getattr(r, "door", None) == "line"]
    assert [(r.outcome, r.text_chars) for r in lines] == [("done", len(" ".join(words)))]


async def test_the_toy_door_shares_admission_with_every_door(line_server, caplog):
    before = scrape(line_server)
    refused = "voxwire_connections_refused_total{reason=at_capacity}"
    holders = [await asyncio.open_connection("127.0.0.1", door_of(line_server).sock.getsockname()[1])
               for _ in range(2)]
    try:
        await asyncio.sleep(0.2)  # both admitted: the server's two connections are taken
        assert line_server.service.admission.connections == 2
        with caplog.at_level(logging.INFO, logger="voxwire"):
            assert await talk(line_server, "one more") == b"error at_capacity\n"
    finally:
        for _, writer in holders:
            writer.close()
    assert scrape(line_server)[refused] == before.get(refused, 0) + 1
    lines = [r for r in caplog.records if r.name == "voxwire.connection"]
    assert [(r.door, r.reason) for r in lines] == [("line", "at_capacity")]
    deadline = time.monotonic() + 10
    while line_server.service.admission.connections and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert line_server.service.admission.connections == 0  # each slot given back


async def test_the_toy_door_shares_the_idle_timeout(line_server):
    started = time.monotonic()
    assert await talk(line_server, None) == b"error idle_timeout\n"
    assert IDLE_SECONDS <= time.monotonic() - started < IDLE_SECONDS + 10


# -- the one stall rule ---------------------------------------------------------------------


class Heard:
    """What the sender reads of a speech: when its audio sent so far will have been heard."""

    def __init__(self, in_seconds: float) -> None:
        self.heard_by = time.monotonic() + in_seconds


async def sleep_for(seconds: float) -> None:
    await asyncio.sleep(seconds)


async def test_a_send_may_wait_the_stall_timeout_beyond_when_the_audio_sent_is_heard():
    stalls: list[str] = []
    sender = Sender(sleep_for, stall_seconds=0.3, on_stall=lambda: stalls.append("stalled"))
    await sender.send(0.0, audio_of=Heard(0.6))  # type: ignore[arg-type]
    await sender.send(0.6)  # its listener still plays what it was sent: not stalled
    assert not stalls and not sender.stalled
    with pytest.raises(ListenerStalled):
        await sender.send(1.0)  # all of it could have played 0.3 s ago
    assert stalls == ["stalled"] and sender.stalled
    with pytest.raises(ListenerStalled):  # nothing more is sent, and on_stall ran once
        await sender.send(0.0)
    assert stalls == ["stalled"]


async def test_a_transport_that_times_out_itself_is_a_client_gone_not_a_stall():
    async def timed_out(message: object) -> None:
        raise TimeoutError("ETIMEDOUT")

    sender = Sender(timed_out, stall_seconds=5, on_stall=lambda: None)
    with pytest.raises(TimeoutError):
        await sender.send(b"")
    assert not sender.stalled
