"""A real server on the Kokoro engine (Kokoro-82M's int8 graph from the voxwire[kokoro]
wheels, its packaged voices), streaming in windows, answers every door: protocol v1 (with word timings and a
cancel), the OpenAI route by voice name, Wyoming with its voices described, and
GET /v1/voices; a bad voice or blend is a coded refusal."""

from __future__ import annotations

import asyncio

import httpx
import msgpack
import numpy as np
import orjson
import pytest
import websockets
from wyoming.client import AsyncTcpClient
from wyoming.info import Describe, Info
from wyoming.tts import Synthesize, SynthesizeVoice

from tests.server.doors.test_wyoming import hear, port, read
from tests.server.test_pipeline import speak_v1

TEXT = "The museum opens at nine, and the guided tours start at ten."
RATE = 24000
VOICES = ["jf_alpha", "jf_gongitsune", "jf_nezumi", "jf_tebukuro", "jm_kumo"]


def _speech(audio: np.ndarray, seconds: tuple[float, float]) -> None:
    assert seconds[0] * RATE < audio.size < seconds[1] * RATE, audio.size / RATE
    assert 0.03 < float(np.sqrt((audio**2).mean())) < 0.5


async def test_protocol_v1_speaks_a_kokoro_voice_with_word_timings(kokoro_server):
    async with websockets.connect(kokoro_server.ws) as ws:
        ready = orjson.loads(await ws.recv())
        events, audio = await speak_v1(ws, "u1", TEXT, voice="jm_kumo", sample_rate=RATE, timestamps=True)
    assert ready["type"] == "ready"
    assert events[-1]["type"] == "done", events[-1]
    _speech(audio, (2.5, 6.0))
    words = [w for e in events if e["type"] == "timestamps" for w in e["words"]]
    assert [w["word"] for w in words] == [w.strip(",.") for w in TEXT.split()]
    starts = [w["start_ms"] for w in words]
    assert starts == sorted(starts) and words[-1]["end_ms"] <= 1000 * audio.size / RATE + 1


async def test_a_lexicon_says_a_word_in_kokoros_phonemes_and_the_timings_keep_the_written_word(kokoro_server):
    text = "I use Postgres daily."
    ten = "/wˈʌn tˈu θɹˈi fˈɔɹ fˈIv sˈɪks sˈɛvən ˈAt nˈIn tˈɛn/"  # misaki's set: I, A for the diphthongs
    async with websockets.connect(kokoro_server.ws) as ws:
        await ws.recv()
        plain, plain_audio = await speak_v1(ws, "p", text, voice="jm_kumo", sample_rate=RATE, timestamps=True)
        said, said_audio = await speak_v1(ws, "s", text, voice="jm_kumo", sample_rate=RATE, timestamps=True,
                                          lexicon={"postgres": ten})
        refused, _ = await speak_v1(ws, "r", text, voice="jm_kumo", lexicon={"postgres": "/pˈOstʘ/"})
        # Inline, with misaki's ᵊ, which NFKC would have made an ə on the way.
        inline, inline_audio = await speak_v1(ws, "i", f"I use [Postgres]({ten[:-1]} ᵊ/) daily.", voice="jm_kumo",
                                              sample_rate=RATE, timestamps=True)
    timed = [[w["word"] for e in events if e["type"] == "timestamps" for w in e["words"]]
             for events in (plain, said, inline)]
    assert timed == [["I", "use", "Postgres", "daily"]] * 3
    assert said_audio.size > plain_audio.size + 1.5 * RATE  # nine more words heard
    assert inline_audio.size > plain_audio.size + 1.5 * RATE
    assert refused[-1]["code"] == "invalid_lexicon" and "'ʘ'" in refused[-1]["message"]


@pytest.mark.parametrize("voice, code", [
    ("nobody", "unknown_voice"), ("jf_alpha+nobody", "unknown_voice"), ("jf_alpha*-2", "invalid_voice_blend"),
])
async def test_a_bad_voice_or_blend_is_refused_with_its_code(kokoro_server, voice, code):
    async with websockets.connect(kokoro_server.ws) as ws:
        await ws.recv()
        events, audio = await speak_v1(ws, "u1", TEXT, voice=voice, sample_rate=RATE)
        after, heard = await speak_v1(ws, "u2", "Still here.", voice="jf_alpha*0.6+jm_kumo*0.4", sample_rate=RATE)
    assert events[-1]["type"] == "error" and events[-1]["code"] == code, events
    assert audio.size == 0
    assert after[-1]["type"] == "done"  # the socket and a blend both still work
    _speech(heard, (0.5, 2.5))


async def test_text_with_nothing_to_say_ends_done_with_no_audio_and_no_error(kokoro_server):
    """Punctuation alone (which Kokoro would breathe half a second of) says nothing, as in
    Piper: ``done`` with 0 samples (docs/protocol.md), and the next utterance speaks."""
    async with websockets.connect(kokoro_server.ws) as ws:
        await ws.recv()
        events, audio = await speak_v1(ws, "dots", "... —", voice="jf_alpha", sample_rate=RATE)
        after, heard = await speak_v1(ws, "hi", "Hi... there.", voice="jf_alpha", sample_rate=RATE)
    assert [e["type"] for e in events] == ["started", "done"] and events[-1]["samples"] == 0 and audio.size == 0
    assert events[-1]["ttfa_ms"] is None
    assert after[-1]["type"] == "done" and after[-1]["samples"] == heard.size
    _speech(heard, (0.5, 2.5))


async def test_a_cancel_stops_the_audio(kokoro_server):
    async with websockets.connect(kokoro_server.ws) as ws:
        await ws.recv()
        await ws.send(orjson.dumps({"type": "speak", "ctx": "c", "text": TEXT * 3, "voice": "jf_alpha",
                                    "format": "pcm_s16le", "sample_rate": RATE}).decode())
        frames = 0
        while frames < 2:
            m = await asyncio.wait_for(ws.recv(), 60)
            frames += isinstance(m, bytes)
        await ws.send(orjson.dumps({"type": "cancel", "ctx": "c"}).decode())
        after = 0
        while True:
            m = await asyncio.wait_for(ws.recv(), 60)
            if isinstance(m, bytes):
                after += len(msgpack.unpackb(m)["audio"])
                continue
            event = orjson.loads(m)
            if event["type"] in ("cancelled", "done", "error"):
                break
    assert event["type"] == "cancelled", event
    assert event["samples_sent"] < 10 * RATE  # far less than the ~15 s the text holds
    assert after / 2 / RATE < 1.5  # what was already on its way, no more


async def test_the_openai_route_speaks_by_voice_name(kokoro_server):
    async with httpx.AsyncClient(timeout=120) as http:
        answer = await http.post(f"{kokoro_server.http}/v1/audio/speech", json={
            "model": "tts-1", "input": TEXT, "voice": "jf_nezumi", "response_format": "pcm"})
        unknown = await http.post(f"{kokoro_server.http}/v1/audio/speech", json={
            "model": "tts-1", "input": TEXT, "voice": "jf_alpha+nobody", "response_format": "pcm"})
    assert answer.status_code == 200
    _speech(np.frombuffer(answer.content, "<i2").astype(np.float32) / 32767, (2.5, 6.0))
    assert unknown.status_code == 400 and unknown.json()["error"]["code"] == "unknown_voice"


async def test_wyoming_describes_and_speaks_the_voices(kokoro_server):
    async with AsyncTcpClient("127.0.0.1", port(kokoro_server)) as client:
        await client.write_event(Describe().event())
        (program,) = Info.from_event(await read(client)).tts
    assert [v.name for v in program.voices] == VOICES
    assert all(v.languages == ["en-us"] for v in program.voices)  # what they speak without pyopenjtalk
    async with AsyncTcpClient("127.0.0.1", port(kokoro_server)) as client:
        await client.write_event(Synthesize(text=TEXT, voice=SynthesizeVoice(name="jf_tebukuro")).event())
        heard = await hear(client)
    assert heard.start is not None and heard.start.rate == RATE
    _speech(heard.audio, (2.5, 6.0))


async def test_the_voice_list_names_each_voice_and_language(kokoro_server):
    async with httpx.AsyncClient() as http:
        listed = (await http.get(f"{kokoro_server.http}/v1/voices")).json()["voices"]
    assert [(v["id"], v["sample_rate"]) for v in listed] == [(v, RATE) for v in VOICES]
    assert all("Japanese" in v["description"] for v in listed)
