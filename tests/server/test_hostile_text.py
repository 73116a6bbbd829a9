"""Hostile text on every door: it must not stall anyone else, nor make more speech than
its letters could, nor run past the longest utterance the server allows."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from wyoming.audio import AudioChunk
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.tts import Synthesize

from voxwire.server.config import ServerConfig
from voxwire.server.limits import Limits
from tests.conftest import RunningServer, run_server
from tests.fixtures.engines import ToneEngine
from tests.server.test_stream import ONE_LONG_SENTENCE
from voxwire_client import Audio, Client

pytestmark = pytest.mark.timeout(600)  # a Piper server of its own loads on a busy 2-core machine

PREBUFFER_SECONDS = 1.0
"""What a real-time player holds before it starts: a gap in arrivals longer than this,
beyond the audio already received, is a gap the listener hears."""
PROBE_TIMEOUT_SECONDS = 1.0
"""Kubernetes' default probe timeout: a /healthz slower than this restarts the pod."""
HOSTILE = {
    "abbreviations": "Dr. " * 5000,  # 20,000 characters: once 21 s of segmenting on the event loop
    "initials": "A. " * 6600,
    "marks": "x" + "\u0301" * 4095,  # the OpenAI route's longest input
}


@pytest.fixture
def server(piper_wyoming_server: RunningServer) -> RunningServer:
    return piper_wyoming_server


def underruns(frames: list[Audio]) -> list[float]:
    """Seconds a real-time player, started PREBUFFER_SECONDS after the first frame, waited
    for each frame that came later than it was due."""
    start = frames[0].received_at + PREBUFFER_SECONDS
    due, late = start, []
    for f in frames:
        if f.received_at > due:
            late.append(f.received_at - due)
        due += f.samples / f.sample_rate
    return late


async def first_audio_over_websocket(server: RunningServer, text: str) -> int:
    async with await Client.connect(server.ws) as client:
        u = await client.speak(text)
        async for item in u:
            if isinstance(item, Audio):
                await u.cancel()
                return item.samples
    return 0


async def first_audio_over_openai(server: RunningServer, text: str) -> int:
    body = {"model": "tts-1", "input": text, "voice": "joe", "response_format": "pcm"}
    async with httpx.AsyncClient(timeout=120) as http:
        async with http.stream("POST", f"{server.http}/v1/audio/speech", json=body) as r:
            assert r.status_code == 200
            async for chunk in r.aiter_bytes():
                return len(chunk) // 2
    return 0


async def first_audio_over_wyoming(server: RunningServer, text: str) -> int:
    assert server.service.doors["wyoming"].sock is not None
    async with AsyncTcpClient("127.0.0.1", server.service.doors["wyoming"].port) as client:
        await client.write_event(Synthesize(text=text).event())
        while (event := await asyncio.wait_for(client.read_event(), 120)) is not None:
            if AudioChunk.is_type(event.type):
                return len(AudioChunk.from_event(event).audio) // 2
            assert not Error.is_type(event.type), event
    return 0


@pytest.mark.slow  # about 7 s
async def test_hostile_text_on_every_door_stalls_neither_a_listener_nor_the_probes(server):
    """While a listener plays a long answer in real time, the worst texts arrive on all
    three doors at once: its player never runs dry, and /healthz keeps answering."""
    async with await Client.connect(server.ws) as client:
        listener = await client.speak(" ".join([ONE_LONG_SENTENCE] * 3))
        frames: list[Audio] = []
        probes: list[float] = []
        hostile_done = asyncio.Event()

        async def probe() -> None:
            async with httpx.AsyncClient(timeout=120) as http:
                while not hostile_done.is_set():
                    sent = time.perf_counter()
                    assert (await http.get(f"{server.http}/healthz")).status_code == 200
                    probes.append(time.perf_counter() - sent)
                    await asyncio.sleep(0.02)

        async def hostile() -> list[int]:
            try:
                return await asyncio.gather(
                    first_audio_over_websocket(server, HOSTILE["abbreviations"]),
                    first_audio_over_wyoming(server, HOSTILE["initials"]),
                    first_audio_over_openai(server, HOSTILE["marks"]),
                )
            finally:
                hostile_done.set()

        attacks = probing = None
        async for item in listener:
            if isinstance(item, Audio):
                frames.append(item)
                if attacks is None:  # the listener is playing: now the attack
                    attacks = asyncio.create_task(hostile())
                    probing = asyncio.create_task(probe())
        assert item.type == "done"
        assert attacks is not None and probing is not None
        got = await attacks
        await probing

    assert all(samples > 0 for samples in got), got  # each hostile text was spoken too
    assert frames and sum(f.samples for f in frames) / frames[0].sample_rate > 30
    assert underruns(frames) == []
    assert probes and max(probes) < PROBE_TIMEOUT_SECONDS, max(probes)


async def spoken_seconds(server: RunningServer, text: str) -> float:
    async with await Client.connect(server.ws) as client:
        audio, end = await (await client.speak(text)).collect()
    assert end.type == "done"
    return sum(a.samples for a in audio) / audio[0].sample_rate


async def test_combining_marks_make_no_more_speech_than_their_base_letter(server):
    """Once 1.6 KB of "a" and acute accents spoke for 219 s, one mark at a time."""
    plain = await spoken_seconds(server, "a")
    marked = {n: await spoken_seconds(server, "a" + "\u0301" * n) for n in (30, 450, 800)}
    assert plain > 0.1
    for n, seconds in marked.items():
        assert seconds < 2 * plain + 0.5, (n, seconds, plain)


async def test_combining_marks_over_the_openai_route_are_bounded_too(server):
    body = {"model": "tts-1", "input": "a" + "\u0301" * 4000, "voice": "joe", "response_format": "pcm"}
    async with httpx.AsyncClient(timeout=120) as http:
        r = await http.post(f"{server.http}/v1/audio/speech", json=body)
    assert r.status_code == 200
    seconds = len(r.content) / 2 / 24000
    assert 0.1 < seconds < 3, seconds


@pytest.fixture(scope="module")
def short_server() -> Iterator[RunningServer]:
    """Utterances may last 1 s; the tone engine speaks 0.1 s a word."""
    config = ServerConfig(cache_mb=0, wyoming_port=0, limits=Limits(max_utterance_seconds=1))
    with run_server(config, engine=ToneEngine) as s:
        yield s


LONG_TONES = "la " * 40 + "."  # 4 s of tone


async def test_an_utterance_past_the_ceiling_ends_with_utterance_too_long_on_the_socket(short_server):
    async with await Client.connect(short_server.ws) as client:
        with pytest.raises(Exception) as failure:
            await (await client.speak(LONG_TONES)).collect()
        assert failure.value.code == "utterance_too_long"
        audio, end = await (await client.speak("la la.")).collect()  # the connection goes on
        assert end.type == "done" and audio


async def test_an_utterance_past_the_ceiling_is_cut_on_the_openai_route(short_server):
    body = {"model": "tts-1", "input": LONG_TONES, "voice": "tone", "response_format": "pcm"}
    received = 0
    async with httpx.AsyncClient(timeout=60) as http:
        with pytest.raises(httpx.RemoteProtocolError):  # an incomplete body, not a short "whole" one
            async with http.stream("POST", f"{short_server.http}/v1/audio/speech", json=body) as r:
                assert r.status_code == 200
                async for chunk in r.aiter_bytes():
                    received += len(chunk)
    assert 0 < received <= 24000 * 2  # at most the ceiling's second, at 24 kHz 16-bit


async def test_an_utterance_past_the_ceiling_ends_with_utterance_too_long_over_wyoming(short_server):
    assert short_server.service.doors["wyoming"].sock is not None
    audio = bytearray()
    async with AsyncTcpClient("127.0.0.1", short_server.service.doors["wyoming"].port) as client:
        await client.write_event(Synthesize(text=LONG_TONES).event())
        while (event := await asyncio.wait_for(client.read_event(), 60)) is not None:
            if AudioChunk.is_type(event.type):
                chunk = AudioChunk.from_event(event)
                audio += chunk.audio
                rate = chunk.rate
            if Error.is_type(event.type):
                assert Error.from_event(event).code == "utterance_too_long"
                break
        else:
            pytest.fail("no error event")
    samples = np.frombuffer(bytes(audio), np.int16)
    assert 0 < samples.size <= rate and np.abs(samples).max() > 1000


# One character that normalisation makes eighteen: once 150 of them spoke for 577 s,
# counted as 150 characters against every length limit.
EXPANDING = "\ufdfa"


@pytest.fixture(scope="module")
def small_text_server() -> Iterator[RunningServer]:
    config = ServerConfig(cache_mb=0, wyoming_port=0, limits=Limits(max_text_chars=100))
    with run_server(config, engine=ToneEngine) as s:
        yield s


async def test_length_limits_count_text_as_normalisation_expands_it_on_every_door(small_text_server):
    s = small_text_server
    async with await Client.connect(s.ws) as client:
        with pytest.raises(Exception) as whole:  # 10 characters, 180 once expanded
            await (await client.speak(EXPANDING * 10)).collect()
        assert whole.value.code == "text_too_long"
        u = await client.speak("la la ", final=False)
        await u.send(EXPANDING * 5)  # 6 + 90 expanded: fits
        await u.send(EXPANDING)  # 6 + 108: refused, and the utterance goes on
        async for item in u:
            if getattr(item, "type", None) == "error":
                break
        assert item["code"] == "text_too_long" and item["terminal"] is False
        await u.send("la.", final=True)
        async for item in u:
            pass
        assert item.type == "done"
        audio, end = await (await client.speak("la " * 30)).collect()  # 90 plain characters fit
        assert end.type == "done" and audio
    body = {"model": "tts-1", "input": EXPANDING * 300, "voice": "tone", "response_format": "pcm"}
    async with httpx.AsyncClient(timeout=60) as http:
        r = await http.post(f"{s.http}/v1/audio/speech", json=body)
    assert r.status_code == 400 and r.json()["error"]["code"] == "text_too_long"
    async with AsyncTcpClient("127.0.0.1", s.service.doors["wyoming"].port) as wyoming:
        await wyoming.write_event(Synthesize(text=EXPANDING * 10).event())
        event = await asyncio.wait_for(wyoming.read_event(), 60)
        assert event is not None and Error.is_type(event.type) and Error.from_event(event).code == "text_too_long"
