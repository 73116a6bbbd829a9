"""The Wyoming door, with the ``wyoming`` package's own client against a real server."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import logging
from collections.abc import Iterator

import numpy as np
import pytest
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event, async_read_event, write_event
from wyoming.info import Describe, Info
from wyoming.ping import Ping, Pong
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped, SynthesizeVoice

from voxwire.server import config_loader
from voxwire.server.config import AuthConfig, ServerConfig
from voxwire.server.limits import Limits
from voxwire.server.doors.base import Host
from voxwire.server.doors.wyoming import WyomingDoor, wyoming_host
from voxwire.server.doors.wyoming.wire import read_event
from tests.conftest import RunningServer, run_server
from tests.fixtures.engines import RATE as TONE_RATE
from tests.fixtures.engines import SPEAKERS, dominant_pitches, speaker_pitch, word_pitch
from tests.server.test_stream import ONE_LONG_SENTENCE, SENTENCE, assert_speech

pytestmark = pytest.mark.timeout(600)  # a Piper server of its own loads on a busy 2-core machine

IDLE_SECONDS = 2.0  # short, so a slowloris is cut off within the test
MAX_EVENT_BYTES = 64 * 1024
# Three sentences, so three segments; short, so each test speaks little.
THREE = "Speech starts at once. The rest is on its way. Nobody waits."
THREE_WORDS = 12


@pytest.fixture
def server(piper_wyoming_server: RunningServer) -> RunningServer:
    return piper_wyoming_server


@contextlib.contextmanager
def tone_server(limits: Limits) -> Iterator[RunningServer]:
    """The scripted tone engine (each word a pitch) with the Wyoming door, under ``limits``."""
    from tests.fixtures.engines import ToneEngine

    config = ServerConfig(cache_mb=0, limits=limits, wyoming_port=0)
    with run_server(config, engine=lambda: ToneEngine(step_delay=0.02)) as s:
        yield s


@pytest.fixture(scope="module")
def tone() -> Iterator[RunningServer]:
    """Small limits to run into."""
    with tone_server(Limits(idle_timeout_seconds=IDLE_SECONDS, max_message_bytes=MAX_EVENT_BYTES, max_text_chars=300)) as s:
        yield s


def port(server: RunningServer) -> int:
    assert server.service.doors["wyoming"].sock is not None
    return server.service.doors["wyoming"].port


async def read(client: AsyncTcpClient) -> Event:
    event = await asyncio.wait_for(client.read_event(), 60)
    assert event is not None, "the server closed the connection"
    return event


class Heard:
    def __init__(self) -> None:
        self.start: AudioStart | None = None
        self.chunks: list[AudioChunk] = []
        self.types: list[str] = []

    @property
    def audio(self) -> np.ndarray:
        pcm = b"".join(c.audio for c in self.chunks)
        return np.frombuffer(pcm, "<i2").astype(np.float32) / 32767

    def take(self, event: Event) -> None:
        """Note one event of a reply, which must not be an error."""
        self.types.append(event.type)
        assert not Error.is_type(event.type), Error.from_event(event)
        if AudioStart.is_type(event.type):
            self.start = AudioStart.from_event(event)
        elif AudioChunk.is_type(event.type):
            self.chunks.append(AudioChunk.from_event(event))


async def hear(client: AsyncTcpClient, until: str = AudioStop().event().type) -> Heard:
    """Every event up to and including ``until``."""
    heard = Heard()
    while True:
        event = await read(client)
        heard.take(event)
        if event.type == until:
            return heard


def utterance_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "voxwire.utterance" and getattr(r, "door", None) == "wyoming"]


async def wait_until_idle(server: RunningServer) -> None:
    worker, admission = server.service.worker, server.service.admission
    for _ in range(1000):
        if worker.active == 0 and admission.utterances == 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the utterance did not end")


# -- describe, synthesize, the streaming form -------------------------------------------------


async def test_describe_lists_the_engines_voices(server):
    async with AsyncTcpClient("127.0.0.1", port(server)) as client:
        await client.write_event(Describe().event())
        event = await read(client)
    assert Info.is_type(event.type)
    (program,) = Info.from_event(event).tts
    assert program.supports_synthesize_streaming
    engine = server.service.worker.loaded_engine()
    assert [(v.name, v.languages) for v in program.voices] == [(v.id, [v.language]) for v in engine.voices()]
    assert "joe" in [v.name for v in program.voices]


async def test_synthesize_streams_speech_before_the_engine_has_finished(server, caplog):
    caplog.set_level(logging.INFO, logger="voxwire.utterance")
    async with AsyncTcpClient("127.0.0.1", port(server)) as client:
        await client.write_event(Synthesize(text=THREE, voice=SynthesizeVoice(name="joe")).event())
        heard = await hear(client)
    rate = server.service.worker.loaded_engine().sample_rate
    assert heard.types[0] == "audio-start" and heard.types[-1] == "audio-stop"
    assert heard.start is not None and (heard.start.rate, heard.start.width, heard.start.channels) == (rate, 2, 1)
    assert all((c.rate, c.width, c.channels) == (rate, 2, 1) for c in heard.chunks)
    # Chunks of the server's duration (200 ms), as they were made; the first may be shorter.
    frame = rate // 5
    assert all(len(c.audio) == 2 * frame for c in heard.chunks[1:-1])
    offsets = np.cumsum([0] + [len(c.audio) // 2 for c in heard.chunks[:-1]])
    assert [c.timestamp for c in heard.chunks] == [int(o) * 1000 // rate for o in offsets]  # ms into the utterance
    assert_speech(heard.audio, rate, words=THREE_WORDS)
    # The pipeline's own log line: its first chunk went out when the engine had done fewer
    # steps than the whole text took.
    await asyncio.sleep(0.1)
    (line,) = utterance_lines(caplog)
    assert line.outcome == "done" and line.segments == 3
    assert line.engine_steps_at_first_chunk < line.engine_steps
    assert line.samples == heard.audio.size


async def test_text_in_pieces_gives_the_same_segments_as_the_whole(server, caplog):
    caplog.set_level(logging.INFO, logger="voxwire.utterance")
    async with AsyncTcpClient("127.0.0.1", port(server)) as client:
        await client.write_event(Synthesize(text=THREE).event())
        whole = await hear(client)
    async with AsyncTcpClient("127.0.0.1", port(server)) as client:
        await client.write_event(SynthesizeStart(voice=SynthesizeVoice(name="joe")).event())
        for word in THREE.split(" "):
            await client.write_event(SynthesizeChunk(text=word + " ").event())
        # Home Assistant sends the whole text once more, for servers that do not stream.
        await client.write_event(Synthesize(text=THREE).event())
        await client.write_event(SynthesizeStop().event())
        pieces = await hear(client, until=SynthesizeStopped().event().type)
    assert pieces.types[0] == "audio-start" and pieces.types[-2:] == ["audio-stop", "synthesize-stopped"]
    await asyncio.sleep(0.1)
    first, second = utterance_lines(caplog)
    assert first.segments == second.segments == 3
    assert second.text_chars == len(THREE) + 1  # each word with its space: spoken once, not twice
    # Piper's durations are stochastic (noise_w): equal text gives similar, not equal, length.
    assert pieces.audio.size == pytest.approx(whole.audio.size, rel=0.15)
    assert_speech(pieces.audio, whole.start.rate, words=THREE_WORDS)  # type: ignore[union-attr]


async def test_inline_phonemes_speak_whole_and_streamed(server):
    ten = "/wˈʌn tˈuː θɹˈiː fˈɔːɹ fˈaɪv sˈɪks sˈɛvən ˈeɪt nˈaɪn tˈɛn/"
    async with AsyncTcpClient("127.0.0.1", port(server)) as client:
        await client.write_event(Synthesize(text="I use Postgres daily.").event())
        plain = await hear(client)
        await client.write_event(Synthesize(text=f"I use [Postgres]({ten}) daily.").event())
        whole = await hear(client)
    async with AsyncTcpClient("127.0.0.1", port(server)) as client:
        await client.write_event(SynthesizeStart().event())
        for piece in ["I use [Post", f"gres]({ten[:9]}", f"{ten[9:]}) daily."]:  # cut inside the markup
            await client.write_event(SynthesizeChunk(text=piece).event())
        await client.write_event(SynthesizeStop().event())
        streamed = await hear(client, until=SynthesizeStopped().event().type)
    rate = server.service.worker.loaded_engine().sample_rate
    for said in (whole, streamed):
        assert said.audio.size > plain.audio.size + 1.5 * rate  # the markup's ten words, heard
        assert_speech(said.audio, rate, words=13)


async def test_ping_and_an_unknown_event_leave_the_connection_open(server):
    async with AsyncTcpClient("127.0.0.1", port(server)) as client:
        await client.write_event(Event(type="transcribe", data={"language": "en"}))
        event = await read(client)
        assert Error.is_type(event.type) and Error.from_event(event).code == "unknown_event"
        await client.write_event(SynthesizeChunk(text="no stream open").event())
        assert Error.from_event(await read(client)).code == "no_stream"
        await client.write_event(Ping(text="hi").event())
        assert Pong.from_event(await read(client)).text == "hi"
        await client.write_event(Describe().event())
        assert Info.is_type((await read(client)).type)


async def test_an_unknown_voice_is_an_error_then_a_close(server):
    async with AsyncTcpClient("127.0.0.1", port(server)) as client:
        await client.write_event(Synthesize(text=SENTENCE, voice=SynthesizeVoice(name="nobody")).event())
        event = await read(client)
        assert Error.from_event(event).code == "unknown_voice"
        # A client that ignores error events (waiting for audio-stop) sees the end instead.
        assert await asyncio.wait_for(client.read_event(), 30) is None


# -- disconnection ------------------------------------------------------------------------


async def test_a_client_gone_mid_utterance_has_its_stream_closed_and_others_carry_on(server, caplog):
    caplog.set_level(logging.INFO, logger="voxwire.utterance")
    worker = server.service.worker
    closed_before = worker.stats.streams_closed
    leaving = AsyncTcpClient("127.0.0.1", port(server))
    await leaving.connect()
    # One unsplittable sentence of ~20 s: at its first chunk the worker is inside the
    # segment, so an open generator is what the disconnect has to close.
    await leaving.write_event(Synthesize(text=ONE_LONG_SENTENCE).event())
    async with AsyncTcpClient("127.0.0.1", port(server)) as staying:
        await staying.write_event(Synthesize(text=SENTENCE).event())
        while not AudioChunk.is_type((await read(leaving)).type):
            pass
        assert leaving._writer is not None
        leaving._writer.transport.abort()  # no goodbye: the client just vanishes
        heard = await hear(staying)
    assert_speech(heard.audio, heard.start.rate, words=9)  # type: ignore[union-attr]
    await wait_until_idle(server)
    assert worker.stats.streams_closed >= closed_before + 1
    await asyncio.sleep(0.1)
    outcomes = sorted(r.outcome for r in utterance_lines(caplog))
    assert outcomes == ["disconnected", "done"]


# -- hostile input --------------------------------------------------------------------------


async def raw_exchange(server: RunningServer, data: bytes, eof: bool = False) -> list[Event]:
    """Send bytes as they are; the events the server answers until it closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port(server))
    writer.write(data)
    if eof:
        writer.write_eof()
    await writer.drain()
    events = []
    while (event := await asyncio.wait_for(async_read_event(reader), 30)) is not None:
        events.append(event)
    writer.close()
    return events


TONE_TEXT = "alpha bravo charlie delta."


def assert_tones(heard: Heard, text: str = TONE_TEXT) -> None:
    """The tone engine's audio for ``text``: each word its own pitch, in order."""
    words = text.strip(".").split()
    assert dominant_pitches(heard.audio, TONE_RATE) == pytest.approx([word_pitch(w) for w in words], abs=15)


async def still_serving(server: RunningServer) -> None:
    async with AsyncTcpClient("127.0.0.1", port(server)) as client:
        await client.write_event(Synthesize(text=TONE_TEXT).event())
        assert_tones(await hear(client))


HOSTILE = [
    (b"\x00\xff garbage \x13\x37 not json\n", "invalid_event"),
    (b'["a list"]\n', "invalid_event"),
    (b'{"type": "synthesize", "data_length": -4}\n', "invalid_event"),
    # A header that claims a 2 GB payload is refused at once, not waited for.
    (b'{"type": "synthesize", "data": {"text": "hi"}, "payload_length": 2147483648}\n', "event_too_large"),
    (b'{"type": "synthesize", "data_length": 2147483648}\n', "event_too_large"),
    # A header line with no end, longer than any event may be.
    (b'{"type": "synthesize", "data": {"text": "' + b"a" * (2 * MAX_EVENT_BYTES), "event_too_large"),
    # Data that is not JSON, where its length said JSON would be.
    (b'{"type": "synthesize", "data_length": 5}\nhello', "invalid_event"),
]


@pytest.mark.parametrize("data,code", HOSTILE)
async def test_bad_bytes_get_an_error_then_a_close(tone, data, code):
    events = await raw_exchange(tone, data)
    assert [(e.type, e.data.get("code")) for e in events] == [("error", code)]
    assert Error.from_event(events[0]).text  # a message for people
    async with AsyncTcpClient("127.0.0.1", port(tone)) as client:  # the next connection is answered
        await client.write_event(Describe().event())
        assert Info.is_type((await read(client)).type)


async def test_hostile_connections_leave_an_utterance_in_flight_unharmed(tone):
    async with AsyncTcpClient("127.0.0.1", port(tone)) as client:
        await client.write_event(Synthesize(text=TONE_TEXT).event())
        assert AudioStart.is_type((await read(client)).type)
        answers = await asyncio.gather(*(raw_exchange(tone, data) for data, _ in HOSTILE * 3))
        heard = await hear(client)
    assert [[e.data.get("code") for e in events] for events in answers] == [[code] for _, code in HOSTILE * 3]
    assert_tones(heard)


async def test_a_payload_shorter_than_claimed_ends_with_the_connection(tone):
    data = b'{"type": "synthesize", "data": {"text": "hi"}, "payload_length": 1000}\nshort'
    events = await raw_exchange(tone, data, eof=True)
    assert [(e.type, e.data.get("code")) for e in events] == [("error", "invalid_event")]


@pytest.mark.slow  # waits out a timeout
async def test_a_slowloris_is_cut_off_while_others_are_served(tone):
    reader, writer = await asyncio.open_connection("127.0.0.1", port(tone))
    header = b'{"type": "synthesize", "data": {"text": "' + b"a" * 1000

    async def trickle() -> None:
        for i in range(len(header)):  # a byte every 50 ms: never a whole event
            writer.write(header[i : i + 1])
            await writer.drain()
            await asyncio.sleep(0.05)

    async def answer() -> Event | None:
        return await asyncio.wait_for(async_read_event(reader), IDLE_SECONDS + 60)

    sender = asyncio.create_task(trickle())
    reply = asyncio.create_task(answer())
    try:
        await still_serving(tone)  # served in the meantime
        # The server closes it once it has been idle (no whole event) for the timeout.
        event = await reply
        assert event is not None and Error.from_event(event).code == "idle_timeout"
        with contextlib.suppress(ConnectionError):  # the trickle may have hit the closed socket
            assert await asyncio.wait_for(async_read_event(reader), 30) is None
        await asyncio.wait({sender}, timeout=30)
        assert isinstance(sender.exception(), ConnectionError)  # cut off before it finished its header
    finally:
        sender.cancel()
        reply.cancel()
        writer.close()
    await still_serving(tone)


async def test_events_written_by_the_wyoming_package_are_read_back_whole():
    events = [
        Synthesize(text="Grüße, 你好", voice=SynthesizeVoice(name="joe")).event(),
        AudioChunk(rate=22050, width=2, channels=1, audio=b"\x01\x02" * 500, timestamp=40).event(),
        Describe().event(),
    ]
    buffer = io.BytesIO()
    for event in events:
        write_event(event, buffer)
    reader = asyncio.StreamReader(limit=MAX_EVENT_BYTES)
    reader.feed_data(buffer.getvalue())
    reader.feed_eof()
    read_back = [await read_event(reader, MAX_EVENT_BYTES) for _ in events]
    assert [(e.type, e.data, e.payload) for e in read_back] == [(e.type, e.data, e.payload) for e in events]
    assert await read_event(reader, MAX_EVENT_BYTES) is None


# -- settings and where it listens --------------------------------------------------------------


def test_the_port_comes_from_flag_environment_and_file(tmp_path):
    parser = argparse.ArgumentParser()
    config_loader.add_arguments(parser)
    assert config_loader.load(parser.parse_args([]), env={}).wyoming_port is None  # off by default
    assert config_loader.load(parser.parse_args(["--wyoming-port", "10200"]), env={}).wyoming_port == 10200
    assert config_loader.load(parser.parse_args([]), env={"VOXWIRE_WYOMING_PORT": "10300"}).wyoming_port == 10300
    path = tmp_path / "voxwire.toml"
    path.write_text("wyoming_port = 10400\nwyoming_allow_unauthenticated = true\n")
    config = config_loader.load(parser.parse_args(["--config", str(path)]), env={})
    assert (config.wyoming_port, config.wyoming_allow_unauthenticated) == (10400, True)
    with pytest.raises(config_loader.SettingsError, match="wyoming-port"):
        config_loader.load(parser.parse_args(["--wyoming-port", "70000"]), env={})


def test_with_api_keys_wyoming_stays_on_loopback_unless_allowed():
    assert wyoming_host("0.0.0.0", api_keys_set=False, allow_unauthenticated=False) == "0.0.0.0"
    assert wyoming_host("0.0.0.0", api_keys_set=True, allow_unauthenticated=False) == "127.0.0.1"
    assert wyoming_host("0.0.0.0", api_keys_set=True, allow_unauthenticated=True) == "0.0.0.0"
    keyed = ServerConfig(host="0.0.0.0", auth=AuthConfig(api_keys=("secret",)), wyoming_port=0)
    listener = WyomingDoor(Host(keyed, None, None, lambda: None))  # type: ignore[arg-type]
    listener.bind()
    try:
        assert listener.sock is not None and listener.sock.getsockname()[0] == "127.0.0.1"
    finally:
        listener.close()
    off = WyomingDoor(Host(ServerConfig(), None, None, lambda: None))  # type: ignore[arg-type]
    off.bind()
    assert off.sock is None


# -- one utterance at a time, and the door's own limits (the scripted tone engine) ---------------


async def test_a_second_request_while_one_is_spoken_is_busy_and_the_first_goes_on(tone, caplog):
    caplog.set_level(logging.INFO, logger="voxwire.utterance")
    words = " ".join(["alpha", "bravo", "charlie", "delta"] * 6) + "."
    async with AsyncTcpClient("127.0.0.1", port(tone)) as client:
        await client.write_event(Synthesize(text=words).event())
        assert AudioStart.is_type((await read(client)).type)
        await client.write_event(Synthesize(text="echo.").event())
        await client.write_event(SynthesizeStart().event())
        codes, chunks = [], 0
        while not AudioStop.is_type((event := await read(client)).type):
            if Error.is_type(event.type):
                codes.append(Error.from_event(event).code)
            chunks += AudioChunk.is_type(event.type)
        assert codes == ["busy", "busy"] and chunks > 0
        # Neither refused request left a stream open behind it.
        await client.write_event(SynthesizeChunk(text="foxtrot").event())
        assert Error.from_event(await read(client)).code == "no_stream"
    await wait_until_idle(tone)
    assert [r.outcome for r in utterance_lines(caplog)] == ["done"]


@pytest.mark.parametrize(
    "events,code",
    [
        ([Synthesize(text="*alpha*", text_format="markdown").event()], "unsupported_text_format"),
        ([Synthesize(text="<speak>alpha &</speak>", text_format="ssml").event()], "invalid_ssml"),
        ([Synthesize(text="alpha " * 60).event()], "text_too_long"),
        ([SynthesizeStart().event(), *[SynthesizeChunk(text="alpha " * 20).event()] * 3], "text_too_long"),
        ([Event(type="synthesize", data={"text": 42})], "invalid_event"),
    ],
)
async def test_requests_over_the_doors_limits_are_refused(tone, events, code):
    async with AsyncTcpClient("127.0.0.1", port(tone)) as client:
        for event in events:
            await client.write_event(event)
        while not Error.is_type((event := await read(client)).type):
            assert event.type in ("audio-start", "audio-chunk")
        assert Error.from_event(event).code == code
    await wait_until_idle(tone)


@pytest.mark.slow  # waits out the idle timeout
async def test_a_streamed_request_whose_text_stops_coming_ends_at_the_idle_timeout(tone, caplog):
    caplog.set_level(logging.INFO, logger="voxwire.utterance")
    async with AsyncTcpClient("127.0.0.1", port(tone)) as client:
        await client.write_event(SynthesizeStart().event())
        await client.write_event(SynthesizeChunk(text="alpha bravo").event())
        while not Error.is_type((event := await read(client)).type):
            pass
        assert Error.from_event(event).code == "idle_timeout"
        assert await asyncio.wait_for(client.read_event(), 30) is None
    await wait_until_idle(tone)
    assert [(r.outcome, r.code) for r in utterance_lines(caplog)] == [("failed", "idle_timeout")]


# -- a multi-speaker voice's speakers (the tone engine's "chorus") -------------------------------


def assert_spoken_by(heard: Heard, speaker_id: int, text: str = TONE_TEXT) -> None:
    """``text`` as speaker ``speaker_id`` of "chorus" says it: each word's pitch shifted by its id."""
    words = text.strip(".").split()
    assert dominant_pitches(heard.audio, TONE_RATE) == pytest.approx([speaker_pitch(w, speaker_id) for w in words], abs=15)


async def test_describe_lists_a_voices_speakers_as_wyoming_piper_does(speakers_server):
    async with AsyncTcpClient("127.0.0.1", port(speakers_server)) as client:
        await client.write_event(Describe().event())
        event = await read(client)
    (program,) = Info.from_event(event).tts
    voices = {v.name: v for v in program.voices}
    assert voices["tone"].speakers is None  # one speaker: none listed
    assert [s.name for s in voices["chorus"].speakers or []] == list(SPEAKERS)
    # As Home Assistant reads them off the wire.
    (chorus,) = [v for v in event.data["tts"][0]["voices"] if v["name"] == "chorus"]
    assert chorus["speakers"] == [{"name": name} for name in SPEAKERS]


@pytest.mark.parametrize(
    "voice, speaker_id",
    [
        (SynthesizeVoice(name="chorus", speaker="bob"), 1),
        (SynthesizeVoice(name="chorus", speaker="2"), 2),  # its id
        (SynthesizeVoice(name="chorus"), 0),  # none: the voice's default speaker
    ],
)
async def test_synthesize_speaks_the_voices_speaker(speakers_server, voice, speaker_id):
    async with AsyncTcpClient("127.0.0.1", port(speakers_server)) as client:
        await client.write_event(Synthesize(text=TONE_TEXT, voice=voice).event())
        assert_spoken_by(await hear(client), speaker_id)


async def test_the_streaming_form_speaks_the_voices_speaker(speakers_server):
    async with AsyncTcpClient("127.0.0.1", port(speakers_server)) as client:
        await client.write_event(SynthesizeStart(voice=SynthesizeVoice(name="chorus", speaker="carol")).event())
        for word in TONE_TEXT.split():
            await client.write_event(SynthesizeChunk(text=word + " ").event())
        await client.write_event(SynthesizeStop().event())
        heard = await hear(client, until=SynthesizeStopped().event().type)
    assert_spoken_by(heard, 2)


async def test_a_speakers_id_may_be_a_number_and_an_empty_one_is_the_default(speakers_server):
    for speaker, speaker_id in ((1, 1), ("", 0)):
        async with AsyncTcpClient("127.0.0.1", port(speakers_server)) as client:
            await client.write_event(Event(type="synthesize", data={
                "text": TONE_TEXT, "voice": {"name": "chorus", "speaker": speaker}}))
            assert_spoken_by(await hear(client), speaker_id)


@pytest.mark.parametrize(
    "voice",
    [SynthesizeVoice(name="chorus", speaker="dave"), SynthesizeVoice(name="tone", speaker="alice")],
)
async def test_an_unknown_speaker_is_an_error_then_a_close(speakers_server, voice):
    async with AsyncTcpClient("127.0.0.1", port(speakers_server)) as client:
        await client.write_event(Synthesize(text=TONE_TEXT, voice=voice).event())
        event = await read(client)
        assert Error.from_event(event).code == "unknown_speaker"
        assert await asyncio.wait_for(client.read_event(), 30) is None


async def test_a_speaker_of_the_wrong_shape_is_invalid_event(speakers_server):
    async with AsyncTcpClient("127.0.0.1", port(speakers_server)) as client:
        await client.write_event(Event(type="synthesize", data={
            "text": TONE_TEXT, "voice": {"name": "chorus", "speaker": ["bob"]}}))
        error = Error.from_event(await read(client))
        assert error.code == "invalid_event" and "voice.speaker" in (error.text or "")
