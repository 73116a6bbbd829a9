"""``POST /v1/audio/speech`` with the real OpenAI SDK pointed at a real server."""

from __future__ import annotations

import io
import time

import httpx
import numpy as np
import openai
import pytest
import soundfile

from server.config import AuthConfig, ServerConfig
from tests.conftest import run_server
from tests.server.test_stream import SENTENCE, assert_speech


@pytest.fixture(scope="module")
def sdk(piper_server):
    return openai.OpenAI(base_url=piper_server.http + "/v1", api_key="unused", max_retries=0)


def test_wav_streams_chunk_by_chunk(sdk):
    chunks = []
    with sdk.audio.speech.with_streaming_response.create(
        model="tts-1", voice="joe", input=SENTENCE + " And then it ran away.", response_format="wav"
    ) as response:
        assert response.headers["content-type"] == "audio/wav"
        chunks = list(response.iter_bytes())
    assert len(chunks) > 3  # many body chunks, not one: it was streamed
    audio, rate = soundfile.read(io.BytesIO(b"".join(chunks)), dtype="float32")
    assert rate == 24000
    assert_speech(audio, rate, words=14)


def _body(sdk, text: str, voice: str = "joe", **kw) -> bytes:
    with sdk.audio.speech.with_streaming_response.create(model="tts-1", voice=voice, input=text, **kw) as r:
        return r.read()


def test_pcm_is_raw_16_bit_24khz(sdk):
    pcm = _body(sdk, SENTENCE, response_format="pcm")
    audio = np.frombuffer(pcm, "<i2").astype(np.float32) / 32767
    assert len(pcm) % 2 == 0
    assert_speech(audio, 24000, words=9)


def test_openai_voice_names_and_speed(sdk):
    normal = np.frombuffer(_body(sdk, SENTENCE, response_format="pcm", voice="alloy"), "<i2")
    fast = np.frombuffer(
        _body(sdk, SENTENCE, response_format="pcm", speed=1.5),
        "<i2",
    )
    assert 0.5 < fast.size / normal.size < 0.85  # a faster rate gives shorter audio


@pytest.mark.parametrize(
    "kwargs,code,param",
    [
        ({"voice": "nobody"}, "unknown_voice", "voice"),
        ({"response_format": "mp3"}, "invalid_format", "response_format"),
        ({"speed": 3.0}, "invalid_speed", "speed"),
        ({"input": ""}, "missing_field", "input"),
    ],
)
def test_errors_come_in_openai_shape(sdk, kwargs, code, param):
    args = {"model": "tts-1", "voice": "joe", "input": "Hello.", **kwargs}
    with pytest.raises(openai.BadRequestError) as e:
        sdk.audio.speech.create(**args)
    assert e.value.status_code == 400
    body = e.value.body
    assert body["code"] == code and body["param"] == param and body["type"] == "invalid_request_error"
    assert body["message"]


def test_a_client_that_leaves_mid_stream_frees_its_slot(piper_server):
    admission = piper_server.service.admission
    with httpx.stream(
        "POST", f"{piper_server.http}/v1/audio/speech",
        json={"model": "tts-1", "voice": "joe", "input": SENTENCE * 8, "response_format": "pcm"}, timeout=60,
    ) as r:
        next(r.iter_bytes())
    for _ in range(500):
        if admission.utterances == 0 and piper_server.service.worker.active == 0:
            break
        time.sleep(0.01)
    assert admission.utterances == 0 and piper_server.service.worker.active == 0


def test_api_key_is_required_when_configured():
    with run_server(ServerConfig(auth=AuthConfig(api_keys=("sk-test-1",)))) as s:
        bad = openai.OpenAI(base_url=s.http + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.audio.speech.create(model="tts-1", voice="joe", input="Hi.")
        good = openai.OpenAI(base_url=s.http + "/v1", api_key="sk-test-1", max_retries=0)
        assert len(good.audio.speech.create(model="tts-1", voice="joe", input="Hi.", response_format="pcm").read()) > 1000
