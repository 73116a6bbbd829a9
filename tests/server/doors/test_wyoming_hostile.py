"""The Wyoming door with clients that half-close, stop reading, reset, or send a voice of
the wrong shape: raw sockets against a real server on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import socket
import struct
from collections.abc import Iterator

import pytest
from wyoming.audio import AudioChunk
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event, async_read_event, write_event
from wyoming.info import Describe
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped, SynthesizeVoice

from voxwire.server.limits import Limits
from tests.conftest import RunningServer
from tests.fixtures.engines import RATE as TONE_RATE
from tests.fixtures.engines import WORD_SECONDS
from tests.server.test_stream import assert_speech
from tests.server.test_metrics import scrape
from tests.fixtures.waiting import wait_until
from tests.server.doors.test_wyoming import (
    THREE, THREE_WORDS, TONE_TEXT, Heard, assert_tones, hear, port, tone_server, utterance_lines,
)

pytestmark = pytest.mark.timeout(600)  # a Piper server of its own loads on a busy 2-core machine

STALLED = "voxwire_listeners_stalled_total{door=wyoming,reason=not_reading}"
STALL_SECONDS = 2.0  # short, so a client that stops reading is cut off within the test
# Far more audio than the socket buffers and the worker's queue hold together (~130 s
# of tone): a client that reads none of it stalls the server's sends.
LONG_TONE_TEXT = " ".join(["alpha", "bravo", "charlie", "delta"] * 100) + "."
LONG_TONE_WORDS = 400


@pytest.fixture
def server(piper_wyoming_server: RunningServer) -> RunningServer:
    return piper_wyoming_server


@pytest.fixture(scope="module")
def tone() -> Iterator[RunningServer]:
    """A short stall timeout."""
    with tone_server(Limits(stall_timeout_seconds=STALL_SECONDS, max_text_chars=5000)) as s:
        yield s


def framed(*events: Event) -> bytes:
    """Events as the ``wyoming`` package writes them (header line, data, payload)."""
    buffer = io.BytesIO()
    for event in events:
        write_event(event, buffer)
    return buffer.getvalue()


async def half_closed(server: RunningServer, *events: Event) -> list[Event]:
    """Send ``events``, shut the write side (as ``nc -N`` does), and read what the server
    answers until it closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port(server))
    try:
        writer.write(framed(*events))
        writer.write_eof()
        await writer.drain()
        answers = []
        while (event := await asyncio.wait_for(async_read_event(reader), 60)) is not None:
            answers.append(event)
        return answers
    finally:
        writer.close()


def heard_from(events: list[Event]) -> Heard:
    heard = Heard()
    for event in events:
        heard.take(event)
    return heard


def assert_whole_reply(heard: Heard, rate: int, streamed: bool) -> None:
    """audio-start, audio-chunks in the door's format, audio-stop (and synthesize-stopped):
    nothing more, then the close."""
    end = ["audio-stop", "synthesize-stopped"] if streamed else ["audio-stop"]
    assert heard.types[0] == "audio-start" and heard.types[-len(end) :] == end
    assert set(heard.types[1 : -len(end)]) == {"audio-chunk"}
    assert heard.start is not None and (heard.start.rate, heard.start.width, heard.start.channels) == (rate, 2, 1)
    assert all((c.rate, c.width, c.channels) == (rate, 2, 1) for c in heard.chunks)


async def wait_for_slots(server: RunningServer) -> None:
    """Until the server holds no connection and no utterance (every client of this module
    has closed or been closed by then)."""
    admission, worker = server.service.admission, server.service.worker
    for _ in range(6000):  # a minute
        if admission.connections == 0 and admission.utterances == 0 and worker.active == 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(
        f"slots still held: {admission.connections} connections, {admission.utterances} utterances, "
        f"{worker.active} in the worker"
    )


async def logged(caplog: pytest.LogCaptureFixture, n: int) -> list[tuple[str, str | None]]:
    """The (outcome, code) of the door's utterance log lines, once there are ``n``."""
    for _ in range(1000):
        lines = utterance_lines(caplog)
        if len(lines) >= n:
            return [(r.outcome, getattr(r, "code", None)) for r in lines]
        await asyncio.sleep(0.01)
    raise AssertionError(f"{len(utterance_lines(caplog))} utterance lines, not {n}")


# -- half-close: the request is spoken, then the connection closes (real speech) ---------------


async def test_a_half_closed_synthesize_gets_all_its_audio_then_the_close(server, caplog):
    caplog.set_level(logging.INFO, logger="voxwire.utterance")
    rate = server.service.worker.loaded_engine().sample_rate
    async with AsyncTcpClient("127.0.0.1", port(server)) as client:
        await client.write_event(Synthesize(text=THREE).event())
        whole = await hear(client)
    heard = heard_from(await half_closed(server, Synthesize(text=THREE, voice=SynthesizeVoice(name="joe")).event()))
    assert_whole_reply(heard, rate, streamed=False)
    assert_speech(heard.audio, rate, words=THREE_WORDS)
    # Piper's durations are stochastic (noise_w): the same text gives a similar length.
    assert heard.audio.size == pytest.approx(whole.audio.size, rel=0.15)
    assert await logged(caplog, 2) == [("done", None), ("done", None)]


async def test_a_half_closed_stream_gets_all_its_audio_and_synthesize_stopped(server, caplog):
    caplog.set_level(logging.INFO, logger="voxwire.utterance")
    rate = server.service.worker.loaded_engine().sample_rate
    pieces = [SynthesizeChunk(text=word + " ").event() for word in THREE.split(" ")]
    events = [SynthesizeStart(voice=SynthesizeVoice(name="joe")).event(), *pieces, SynthesizeStop().event()]
    heard = heard_from(await half_closed(server, *events))
    assert_whole_reply(heard, rate, streamed=True)
    assert_speech(heard.audio, rate, words=THREE_WORDS)
    assert await logged(caplog, 1) == [("done", None)]


# -- half-close with the tone engine: every word, in order ----------------------------------------


async def test_a_half_closed_synthesize_of_the_tone_engine_is_every_word(tone, caplog):
    caplog.set_level(logging.INFO, logger="voxwire.utterance")
    heard = heard_from(await half_closed(tone, Synthesize(text=TONE_TEXT).event()))
    assert_whole_reply(heard, TONE_RATE, streamed=False)
    assert_tones(heard)
    assert await logged(caplog, 1) == [("done", None)]


@pytest.mark.parametrize("stop", [True, False], ids=["with-synthesize-stop", "eof-ends-the-text"])
async def test_a_half_closed_stream_speaks_all_the_text_that_arrived(tone, caplog, stop):
    caplog.set_level(logging.INFO, logger="voxwire.utterance")
    # The last word has no sentence end: without synthesize-stop, only the EOF says it is
    # the end of the text.
    text = "alpha bravo charlie delta echo"
    events = [SynthesizeStart().event(), *[SynthesizeChunk(text=w + " ").event() for w in text.split()]]
    heard = heard_from(await half_closed(tone, *events, *([SynthesizeStop().event()] if stop else [])))
    # EOF ends a stream as synthesize-stop would have: the same events, the same audio.
    assert_whole_reply(heard, TONE_RATE, streamed=True)
    assert_tones(heard, text)
    assert heard.audio.size == len(text.split()) * round(TONE_RATE * WORD_SECONDS)
    assert await logged(caplog, 1) == [("done", None)]


# -- a half-closed client that then stops reading, or one that resets ------------------------------


@pytest.mark.slow  # waits out the stall timeout
@pytest.mark.parametrize("shut", [True, False], ids=["half-closed", "open"])
async def test_a_client_that_reads_nothing_is_cut_off_after_the_stall_timeout(tone, caplog, shut):
    caplog.set_level(logging.INFO, logger="voxwire.utterance")
    engine = tone.service.worker.engine
    steps_before = engine.steps
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # full at once
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, ("127.0.0.1", port(tone)))
        await loop.sock_sendall(sock, framed(Synthesize(text=LONG_TONE_TEXT).event()))
        if shut:
            sock.shutdown(socket.SHUT_WR)
        # Never read: the server's sends wait, then the worker's queue fills and it skips the
        # utterance; after the stall timeout the server ends it and frees both slots.
        before = scrape(tone).get(STALLED, 0)
        await wait_for_slots(tone)
        assert await logged(caplog, 1) == [("failed", "listener_stalled")]
        assert scrape(tone)[STALLED] == before + 1
        assert engine.steps - steps_before < LONG_TONE_WORDS  # not computed to the end for nobody
        # The connection is gone: whatever was in flight, then the end (or a reset).
        with contextlib.suppress(ConnectionError):
            while await asyncio.wait_for(loop.sock_recv(sock, 65536), 30):
                pass
    finally:
        sock.close()
    async with AsyncTcpClient("127.0.0.1", port(tone)) as client:  # others are served
        await client.write_event(Synthesize(text=TONE_TEXT).event())
        assert_tones(await hear(client))


@pytest.mark.parametrize("shut", [True, False], ids=["half-closed", "open"])
async def test_a_client_that_resets_mid_stream_is_disconnected_and_frees_its_slot(tone, caplog, shut):
    caplog.set_level(logging.INFO, logger="voxwire.utterance")
    worker = tone.service.worker
    steps_before, closed_before = worker.engine.steps, worker.stats.streams_closed
    reader, writer = await asyncio.open_connection("127.0.0.1", port(tone))
    writer.write(framed(Synthesize(text=LONG_TONE_TEXT).event()))
    if shut:
        writer.write_eof()
    await writer.drain()
    while True:  # until the audio is flowing
        event = await asyncio.wait_for(async_read_event(reader), 60)
        assert event is not None and event.type in ("audio-start", "audio-chunk"), event
        if AudioChunk.is_type(event.type):
            break
    # SO_LINGER 0: close() sends a reset, not a FIN.
    writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
    await wait_for_slots(tone)
    assert await logged(caplog, 1) == [("disconnected", None)]
    assert worker.engine.steps - steps_before < LONG_TONE_WORDS
    assert worker.stats.streams_closed >= closed_before + 1


# -- the voice's shape ------------------------------------------------------------------------------

BAD_VOICES = [
    pytest.param("tone", id="a-bare-string"),
    pytest.param({"name": 5}, id="name-a-number"),
    pytest.param({"name": {}}, id="name-an-object"),
    pytest.param({"name": ["tone"]}, id="name-a-list"),
    pytest.param(["tone"], id="a-list"),
    pytest.param(7, id="a-number"),
    pytest.param(True, id="true"),
]


@pytest.mark.parametrize("voice", BAD_VOICES)
@pytest.mark.parametrize("kind", ["synthesize", "synthesize-start"])
async def test_a_voice_of_the_wrong_shape_is_invalid_event_and_the_connection_goes_on(tone, caplog, kind, voice):
    caplog.set_level(logging.INFO, logger="voxwire.utterance")
    data: dict[str, object] = {"voice": voice}
    if kind == "synthesize":
        data["text"] = TONE_TEXT
    async with AsyncTcpClient("127.0.0.1", port(tone)) as client:
        await client.write_event(Event(type=kind, data=data))
        event = await asyncio.wait_for(client.read_event(), 60)
        assert event is not None and Error.is_type(event.type), event  # not audio in another voice
        answer = Error.from_event(event)
        assert answer.code == "invalid_event"
        assert "'voice" in (answer.text or ""), answer.text  # a message that names what is wrong
        # Nothing was opened; the connection is still answered.
        await client.write_event(SynthesizeChunk(text="alpha").event())
        assert Error.from_event(await asyncio.wait_for(client.read_event(), 60)).code == "no_stream"
        await client.write_event(Synthesize(text=TONE_TEXT, voice=SynthesizeVoice(name="tone")).event())
        assert_tones(await hear(client))
    assert await logged(caplog, 1) == [("done", None)]


# A speaker is no longer ignored: one the voice lacks is unknown_speaker (test_wyoming.py).
@pytest.mark.parametrize(
    "voice", [None, {}, {"name": None}, {"language": "xx"}, {"name": "tone", "speaker": ""}],
    ids=["null", "empty", "name-null", "language-only", "name-and-empty-speaker"],
)
async def test_a_voice_without_a_name_speaks_the_default_voice(tone, voice):
    async with AsyncTcpClient("127.0.0.1", port(tone)) as client:
        await client.write_event(Event(type="synthesize", data={"text": TONE_TEXT, "voice": voice}))
        assert_tones(await hear(client))


async def test_a_dropped_chunk_of_streamed_text_ends_the_utterance_and_the_connection():
    """A chunk (or synthesize-stop) the rate limit drops would leave a hole in the text, or
    the utterance open: it fails, and the client is told before the connection closes."""
    limits = Limits(messages_per_second=0.5, message_burst=3)
    with tone_server(limits) as s:
        answers = await half_closed(
            s, SynthesizeStart().event(), SynthesizeChunk(text="one two ").event(),
            SynthesizeChunk(text="three ").event(), SynthesizeChunk(text="four.").event(), SynthesizeStop().event(),
        )
        errors = [Error.from_event(e) for e in answers if Error.is_type(e.type)]
        assert errors and errors[0].code == "rate_limited" and "ended" in errors[0].text
        assert not any(SynthesizeStopped.is_type(e.type) for e in answers)
        await wait_until(lambda: s.service.pipeline.admission.utterances == 0)


async def test_a_wyoming_client_that_keeps_flooding_is_cut():
    limits = Limits(messages_per_second=1, message_burst=1, max_dropped_messages=20)
    with tone_server(limits) as s:
        answers = await half_closed(s, *[Describe().event()] * 500)
        codes = [Error.from_event(e).code for e in answers if Error.is_type(e.type)]
        assert codes == ["rate_limited"] * 21  # the 21st drop is the flood: answered, then cut


async def test_a_refused_client_that_spoke_first_hears_why_not_a_reset():
    """A client refused at capacity has often written its synthesize already: the door
    reads and drops it before closing, or the unread bytes would reset the connection,
    and the reset can overtake the refusal."""
    with tone_server(Limits(max_connections=1)) as s:
        _, holder = await asyncio.open_connection("127.0.0.1", port(s))
        try:
            await wait_until(lambda: s.service.admission.connections == 1)
            for _ in range(20):  # the reset was a race: one try in several lost it
                reader, writer = await asyncio.open_connection("127.0.0.1", port(s))
                try:
                    writer.write(framed(Synthesize(text=TONE_TEXT).event()))
                    await writer.drain()
                    answers = []
                    while (event := await asyncio.wait_for(async_read_event(reader), 10)) is not None:
                        answers.append(event)
                finally:
                    writer.close()
                assert [Error.from_event(e).code for e in answers] == ["at_capacity"]
        finally:
            holder.close()
