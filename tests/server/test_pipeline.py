"""The utterance pipeline: one utterance through each door, accounted the same way,
cached the same way, and its first frame out after the first engine step."""

from __future__ import annotations

import logging

import httpx
import pytest

from voxwire.server.config import ServerConfig
from tests.conftest import run_server
from tests.fixtures.engines import ToneEngine
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
