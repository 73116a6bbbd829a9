"""The OpenAI route through the stock OpenAI plugins of the voice-agent frameworks, as a
user who changes only the base URL runs them: LiveKit's ``livekit.plugins.openai.TTS``
(which asks for ``stream_format: "sse"`` unless the model is tts-1 or tts-1-hd) and
Pipecat's ``OpenAITTSService`` (raw PCM, and only OpenAI's own voice names), against a
real server (Piper) on loopback. Each speaks at 24 kHz, and each cancels: the server lets
go of the utterance when the client does."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

pytest.importorskip("livekit.plugins.openai", reason="the test extra (make test installs it)")
pytest.importorskip("pipecat.services.openai.tts", reason="the client's pipecat extra (make test installs it)")

from livekit import rtc
from livekit.agents import APIConnectOptions
from livekit.plugins import openai as livekit_openai
from pipecat.frames.frames import InterruptionFrame, TTSAudioRawFrame, TTSSpeakFrame, TTSStoppedFrame
from pipecat.pipeline.worker import PipelineParams
from pipecat.services.openai.tts import OpenAITTSService
from pipecat.tests.utils import run_test

from tests.clients.python.test_pipecat import errors, running, until
from tests.server.test_stream import ONE_LONG_SENTENCE, SENTENCE, assert_speech

pytestmark = pytest.mark.timeout(120)

NO_RETRY = APIConnectOptions(max_retry=0, timeout=30)


def livekit_tts(server, **options) -> livekit_openai.TTS:
    return livekit_openai.TTS(base_url=server.http + "/v1", api_key="unused", **options)


def livekit_samples(frame: rtc.AudioFrame) -> np.ndarray:
    return np.frombuffer(frame.data, dtype=np.int16).astype(np.float32) / 32768


async def server_lets_go(server) -> None:
    service = server.service
    deadline = time.monotonic() + 30
    while not (service.worker.active == 0 and service.admission.utterances == 0):
        assert time.monotonic() < deadline, "the server kept the utterance"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize(
    "options",
    [
        {},  # its defaults: gpt-4o-mini-tts, so stream_format "sse", and mp3
        {"model": "gpt-4o-mini-tts", "response_format": "pcm", "voice": "nova"},
        {"model": "tts-1", "response_format": "pcm"},  # stream_format "audio"
        {"model": "tts-1", "response_format": "mp3", "voice": "joe"},
    ],
)
async def test_livekits_stock_openai_plugin_speaks(piper_server, options):
    tts = livekit_tts(piper_server, **options)
    try:
        frame = await tts.synthesize(SENTENCE, conn_options=NO_RETRY).collect()
    finally:
        await tts.aclose()
    assert (frame.sample_rate, frame.num_channels) == (24000, 1)
    assert_speech(livekit_samples(frame), 24000, words=9)


@pytest.mark.parametrize("model", ["gpt-4o-mini-tts", "tts-1"])
async def test_livekits_stock_openai_plugin_cancels(piper_server, model):
    tts = livekit_tts(piper_server, model=model, response_format="pcm")
    stream = tts.synthesize(" ".join([ONE_LONG_SENTENCE] * 3), conn_options=NO_RETRY)
    try:
        async for event in stream:
            if event.frame.samples_per_channel:
                break
        assert piper_server.service.admission.utterances == 1  # still speaking: a minute of speech
        await stream.aclose()
        await server_lets_go(piper_server)
    finally:
        await tts.aclose()


async def test_pipecats_stock_openai_service_speaks_an_openai_voice_name(piper_server):
    # Pipecat checks the name against OpenAI's list before it sends anything; the server
    # speaks it with its default voice (or the one --openai-voice maps it to).
    service = OpenAITTSService(
        api_key="unused", base_url=piper_server.http + "/v1", settings=OpenAITTSService.Settings(voice="nova", model="tts-1"),
    )
    down, up = await run_test(
        service, frames_to_send=[TTSSpeakFrame(SENTENCE)],
        pipeline_params=PipelineParams(audio_out_sample_rate=24000), start_timeout=30,
    )
    assert not errors(up)
    audio = b"".join(f.audio for f in down if isinstance(f, TTSAudioRawFrame))
    assert {f.sample_rate for f in down if isinstance(f, TTSAudioRawFrame)} == {24000}
    assert_speech(np.frombuffer(audio, "<i2").astype(np.float32) / 32767, 24000, words=9)
    assert any(isinstance(f, TTSStoppedFrame) for f in down)


async def test_pipecats_stock_openai_service_cancels_at_an_interruption(piper_server):
    service = OpenAITTSService(
        api_key="unused", base_url=piper_server.http + "/v1", settings=OpenAITTSService.Settings(voice="alloy", model="tts-1"),
    )
    async with running(service, 24000) as (worker, up, down):
        await worker.queue_frame(TTSSpeakFrame(" ".join([ONE_LONG_SENTENCE] * 3)))
        await until(lambda: any(isinstance(f, TTSAudioRawFrame) for f in down.seen()), "the first audio")
        assert piper_server.service.admission.utterances == 1
        await worker.queue_frame(InterruptionFrame())
        await server_lets_go(piper_server)
