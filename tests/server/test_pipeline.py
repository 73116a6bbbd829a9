"""The utterance pipeline: one utterance through each door, accounted the same way,
cached the same way, and its first frame out after the first engine step; a
multi-speaker voice's speaker checked before any work, spoken, and cached apart."""

from __future__ import annotations

import asyncio
import logging

import httpx
import msgpack
import numpy as np
import orjson
import pytest
import websockets

from voxwire.server.config import ServerConfig
from tests.conftest import run_server
from tests.fixtures.engines import RATE as TONE_RATE
from tests.fixtures.engines import ToneEngine, dominant_pitches, speaker_pitch
from tests.server.test_metrics import scrape
from voxwire_client.sync import synthesize_async


async def test_both_doors_account_for_an_utterance_the_same_way(caplog):
    text = "la la la la la la."
    with run_server(ServerConfig(cache_mb=16), engine=lambda: ToneEngine()) as s:
        before = scrape(s)
        with caplog.at_level(logging.INFO, logger="voxwire.utterance"):
            ws = await synthesize_async(text, s.ws, sample_rate=24000)
            async with httpx.AsyncClient(timeout=30) as http:
                r = await http.post(f"{s.http}/v1/audio/speech", json={
                    "model": "tts-1", "input": text + " la.", "voice": "tone", "response_format": "pcm"})
        after = scrape(s)
        lines = [r.__dict__ for r in caplog.records if r.name == "voxwire.utterance"]
    assert r.status_code == 200 and abs(len(r.content) - 2 * 24000 * 0.7) <= 4  # 7 words of 0.1 s, 24 kHz s16
    assert abs(ws.done["samples"] - 24000 * 0.6) <= 2
    for door in ("ws", "http"):
        key = f"voxwire_utterances_total{{code=,door={door},outcome=done}}"
        assert after[key] == before[key] + 1, door
        ttfa = f"voxwire_ttfa_seconds_count{{door={door}}}"
        assert after[ttfa] == before[ttfa] + 1, door
    assert [line["door"] for line in lines] == ["ws", "http"]
    for line in lines:
        assert line["outcome"] == "done" and line["voice"] == "tone"
        for figure in ("ttfa_ms", "audio_ms", "compute_ms", "rtf", "chunks", "samples", "segments", "cached"):
            assert figure in line, figure
        assert "text_digest" in line and "text" not in line
    # The same capped capture behind both: each door's result is now a cache hit at the other.
    with run_server(ServerConfig(cache_mb=16), engine=lambda: ToneEngine()) as s:
        first = await synthesize_async(text, s.ws)
        async with httpx.AsyncClient(timeout=30) as http:
            r = await http.post(f"{s.http}/v1/audio/speech", json={"model": "m", "input": text, "voice": "tone"})
            r2 = await http.post(f"{s.http}/v1/audio/speech", json={"model": "m", "input": "la la.", "voice": "tone"})
        again_ws = await synthesize_async("la la.", s.ws)
    assert first.done["cached"] is False and r.headers["x-voxwire-cached"] == "1"
    assert r2.headers["x-voxwire-cached"] == "0" and again_ws.done["cached"] is True


async def test_the_cache_caps_what_either_door_keeps():
    # 16 kB of cache: a quarter (4 kB, 1000 float32 samples) per entry, less than one word.
    with run_server(ServerConfig(cache_mb=16 / 1024), engine=lambda: ToneEngine()) as s:
        await synthesize_async("la la.", s.ws)
        async with httpx.AsyncClient(timeout=30) as http:
            await http.post(f"{s.http}/v1/audio/speech", json={"model": "m", "input": "lo lo.", "voice": "tone"})
            r = await http.post(f"{s.http}/v1/audio/speech", json={"model": "m", "input": "la la.", "voice": "tone"})
        again = await synthesize_async("lo lo.", s.ws)
        assert len(s.service.cache) == 0
    assert r.headers["x-voxwire-cached"] == "0" and again.done["cached"] is False



@pytest.mark.parametrize("rate", [8000, 16000, 24000, 44100, 48000])
async def test_the_first_frame_leaves_after_the_first_engine_step_through_both_doors(piper_server, rate, caplog):
    text = "The first audio should not wait for a second engine step at any rate."
    with caplog.at_level(logging.INFO, logger="voxwire.utterance"):
        ws = await synthesize_async(text, piper_server.ws, sample_rate=rate, format="mulaw" if rate == 8000 else "pcm_s16le")
        async with httpx.AsyncClient(timeout=60) as http:
            r = await http.post(f"{piper_server.http}/v1/audio/speech",
                                json={"model": "tts-1", "input": text + " Again.", "voice": "joe", "response_format": "pcm"})
    assert r.status_code == 200
    assert ws.done["engine_steps_at_first_chunk"] == 1
    (http_line,) = [rec for rec in caplog.records if rec.name == "voxwire.utterance" and rec.door == "http"]
    assert http_line.engine_steps_at_first_chunk == 1  # 24 kHz, the OpenAI route's rate


# -- a multi-speaker voice's speaker: checked before any work, spoken, cached apart ----------


SPEAKER_TEXT = "alpha bravo charlie."


async def speak_v1(ws, ctx: str, text: str = SPEAKER_TEXT, **settings) -> tuple[list[dict], np.ndarray]:
    """One utterance on protocol v1: its control messages up to ``done`` or an error, and
    its audio (16-bit PCM at the tone engine's rate)."""
    await ws.send(orjson.dumps({"type": "speak", "ctx": ctx, "text": text, "format": "pcm_s16le",
                                "sample_rate": TONE_RATE, **settings}).decode())
    events, pcm = [], b""
    while True:
        m = await asyncio.wait_for(ws.recv(), 30)
        if isinstance(m, bytes):
            pcm += msgpack.unpackb(m)["audio"]
            continue
        event = orjson.loads(m)
        if event.get("ctx") != ctx:
            continue
        events.append(event)
        if event["type"] in ("done", "error"):
            return events, np.frombuffer(pcm, "<i2").astype(np.float32) / 32767


async def config_v1(ws, **settings) -> dict:
    await ws.send(orjson.dumps({"type": "config", **settings}).decode())
    return orjson.loads(await asyncio.wait_for(ws.recv(), 30))


def spoken_by(audio: np.ndarray, speaker_id: int, text: str = SPEAKER_TEXT) -> bool:
    """Whether ``audio`` is ``text`` as speaker ``speaker_id`` of "chorus" says it."""
    expected = [speaker_pitch(w, speaker_id) for w in text.strip(".").split()]
    return dominant_pitches(audio) == pytest.approx(expected, abs=15)


@pytest.mark.parametrize(
    "settings, speaker_id, shown",
    [
        ({"speaker": "bob"}, 1, "bob"),
        ({"speaker": 2}, 2, "2"),  # its id, as a number
        ({"speaker": "2"}, 2, "2"),  # its id, as a string
        ({}, 0, None),  # none named: the voice's default speaker
        ({"speaker": None}, 0, None),
    ],
)
async def test_protocol_v1_speaks_the_speaker_named_by_name_or_id(speakers_server, settings, speaker_id, shown):
    async with websockets.connect(speakers_server.ws) as ws:
        await ws.recv()  # ready
        events, audio = await speak_v1(ws, "u1", voice="chorus", **settings)
    started, done = events[0], events[-1]
    assert (started["type"], done["type"]) == ("started", "done")
    assert started["voice"] == "chorus" and started["speaker"] == shown
    assert spoken_by(audio, speaker_id)


async def test_a_configured_speaker_holds_for_the_session_until_a_speak_or_null_says_otherwise(speakers_server):
    async with websockets.connect(speakers_server.ws) as ws:
        ready = orjson.loads(await ws.recv())
        assert ready["defaults"]["speaker"] is None
        configured = await config_v1(ws, voice="chorus", speaker="carol")
        assert configured["type"] == "configured" and configured["speaker"] == "carol"
        _, carol = await speak_v1(ws, "a")
        events, bob = await speak_v1(ws, "b", speaker="bob")  # for this utterance alone
        assert events[0]["speaker"] == "bob"
        _, default = await speak_v1(ws, "c", speaker=None)  # null: the voice's default, for this one
        _, carol_again = await speak_v1(ws, "d")
        assert (await config_v1(ws, speaker=None))["speaker"] is None  # null: back to the default
        _, reset = await speak_v1(ws, "e")
    assert spoken_by(carol, 2) and spoken_by(bob, 1) and spoken_by(default, 0) and spoken_by(carol_again, 2)
    assert spoken_by(reset, 0)


@pytest.mark.parametrize(
    "settings, said",
    [
        ({"voice": "chorus", "speaker": "dave"}, "alice, bob, carol"),  # the message names them
        ({"voice": "chorus", "speaker": 3}, "0 to 2"),  # past the last id
        ({"voice": "tone", "speaker": "alice"}, "one speaker"),  # a one-speaker voice takes none
        ({"voice": "tone", "speaker": 0}, "one speaker"),
        ({"speaker": "alice"}, "one speaker"),  # the default voice ("tone") has one speaker
    ],
)
async def test_an_unknown_speaker_is_refused_with_its_code_before_any_work(speakers_server, settings, said, caplog):
    engine = speakers_server.service.worker.loaded_engine()
    steps = engine.steps
    with caplog.at_level(logging.INFO, logger="voxwire.utterance"):
        async with websockets.connect(speakers_server.ws) as ws:
            await ws.recv()  # ready
            events, audio = await speak_v1(ws, "u1", **settings)
            refused_config = await config_v1(ws, **settings)
            # Refused, the session's defaults are what they were; the socket goes on.
            configured = await config_v1(ws)
            computed = engine.steps - steps
            followed, after = await speak_v1(ws, "u2", voice="chorus", speaker="bob")
    (error,) = events
    assert error["type"] == "error" and error["code"] == "unknown_speaker" and said in error["message"]
    assert error["ctx"] == "u1" and error["terminal"] is True and audio.size == 0
    assert refused_config["type"] == "error" and refused_config["code"] == "unknown_speaker"
    assert "ctx" not in refused_config
    assert configured["voice"] == "tone" and configured["speaker"] is None
    assert followed[-1]["type"] == "done" and spoken_by(after, 1)
    assert computed == 0  # refused before the engine saw it
    lines = [r for r in caplog.records if r.name == "voxwire.utterance" and r.ctx == "u1"]
    assert [(r.outcome, r.code, r.speaker) for r in lines] == [("refused", "unknown_speaker", str(settings["speaker"]))]


async def test_the_cache_never_answers_one_speaker_with_anothers_audio(speakers_server, caplog):
    text = "delta echo foxtrot."  # this test's own: nothing cached before it
    with caplog.at_level(logging.INFO, logger="voxwire.utterance"):
        async with websockets.connect(speakers_server.ws) as ws:
            await ws.recv()  # ready
            heard = [await speak_v1(ws, f"c{i}", text, voice="chorus", speaker=speaker)
                     for i, speaker in enumerate(["alice", "bob", None, "alice", "bob"])]
            async with httpx.AsyncClient(timeout=30) as http:
                r = await http.post(f"{speakers_server.http}/v1/audio/speech", json={
                    "model": "m", "input": text, "voice": "chorus:bob", "response_format": "pcm"})
    cached = [events[-1]["cached"] for events, _ in heard]
    assert cached == [False, False, False, True, True]
    for (_, audio), speaker_id in zip(heard, [0, 1, 0, 0, 1]):
        assert spoken_by(audio, speaker_id, text)
    assert r.headers["x-voxwire-cached"] == "1"  # bob's, from the socket's utterance
    pcm = np.frombuffer(r.content, "<i2").astype(np.float32) / 32767
    assert dominant_pitches(pcm, 24000) == pytest.approx([speaker_pitch(w, 1) for w in ("delta", "echo", "foxtrot")], abs=15)
    # The log line of each names its speaker (none for the default one).
    lines = [r for r in caplog.records if r.name == "voxwire.utterance" and r.door == "ws"]
    assert [getattr(r, "speaker", None) for r in lines] == ["alice", "bob", None, "alice", "bob"]
