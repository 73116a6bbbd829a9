"""Continuous batching behind the real doors: newcomers on several sockets and on the
OpenAI route share engine steps, and each gets its own whole audio back."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest

from voxwire.server.config import ServerConfig
from tests.conftest import run_server
from tests.fixtures.waiting import wait_until
from tests.fixtures.engines import RATE, BatchToneEngine, dominant_pitches, word_pitch
from voxwire_client.sync import synthesize_async

TEXTS = ["alpha beta gamma delta.", "one two three four five.", "red green blue.", "north south east west."]


@pytest.fixture
def batching_server():
    engine = BatchToneEngine(max_batch=8)
    with run_server(ServerConfig(cache_mb=0), engine=lambda: engine) as s:
        yield s, engine
        engine.gated = False
        engine.permits.release(1000)


async def test_newcomers_through_both_doors_share_steps_and_get_their_own_audio(batching_server):
    server, engine = batching_server
    worker = server.service.worker
    engine.gated = True  # from here on, a step runs only with a permit
    before = len(engine.batches)

    async def openai(text: str) -> bytes:
        async with httpx.AsyncClient(timeout=60) as http:
            r = await http.post(f"{server.http}/v1/audio/speech",
                                json={"model": "tts-1", "input": text, "voice": "tone", "response_format": "pcm"})
            assert r.status_code == 200
            return r.content

    # A first utterance holds the worker inside a gated step, so that the four newcomers
    # all arrive while it waits, and all join the step after it.
    blocker = asyncio.create_task(synthesize_async("hold.", server.ws, sample_rate=RATE))
    await wait_until(lambda: engine.entered > before)
    sockets = [asyncio.create_task(synthesize_async(t, server.ws, sample_rate=RATE)) for t in TEXTS[:3]]
    http = asyncio.create_task(openai(TEXTS[3]))
    await wait_until(lambda: len(worker.utterances()) == 5)
    engine.permits.release(1000)
    await blocker
    results = await asyncio.gather(*sockets)
    body = await http

    assert len(engine.batches[before]) == 1 and len(engine.batches[before + 1]) == 4  # all four together
    assert worker.stats.batch_sizes[4] >= 1
    for text, r in zip(TEXTS, results):
        audio = np.frombuffer(r.data, dtype="<i2").astype(np.float32) / 32767
        assert dominant_pitches(audio) == pytest.approx([word_pitch(w.strip(".")) for w in text.split()], abs=15)
    # The OpenAI route speaks at 24 kHz: the tone's words come back resampled, in order.
    audio = np.frombuffer(body, dtype="<i2").astype(np.float32) / 32767
    words = TEXTS[3].rstrip(".").split()
    assert audio.size == pytest.approx(len(words) * 0.1 * 24000, abs=240)
    assert dominant_pitches(audio, rate=24000) == pytest.approx([word_pitch(w) for w in words], abs=15)
