"""Opus, MP3, AAC and FLAC through both doors, with real speech (Piper) on a real server:
the WebSocket protocol (Python client and raw frames) and the OpenAI route (the real
``openai`` SDK). Each decodes with PyAV to the speech of the PCM stream of the same text;
so do G.711's mu-law and A-law on the socket, at the telephone rates.

Piper's durations are stochastic, so the server here keeps a result cache: the PCM and
each compressed stream of one text are then made from the very same engine audio, and
can be compared sample by sample. Streaming and cancellation use texts not yet cached.
"""

from __future__ import annotations

import asyncio

import av
import msgpack
import numpy as np
import openai
import orjson
import pytest
import soxr
import websockets

from voxwire.engine.registry import EngineOptions
from voxwire.server.audio import encode
from voxwire.server.config import ServerConfig
from tests.conftest import run_server
from tests.server.codec_checks import assert_matches_pcm, decode
from tests.server.test_stream import SENTENCE, SEVERAL, assert_speech
from voxwire_client import Client
from voxwire_client.formats import to_float32
from voxwire_client.sync import synthesize_async

COMPRESSED = ("opus", "mp3", "aac", "flac")
CONTENT_TYPES = {"mp3": "audio/mpeg", "opus": "audio/ogg; codecs=opus", "aac": "audio/aac", "flac": "audio/flac"}


@pytest.fixture(scope="module")
def server():
    with run_server(ServerConfig(engine=EngineOptions(name="piper"), cache_mb=64)) as s:
        yield s


def s16(data: bytes) -> np.ndarray:
    return np.frombuffer(data, "<i2").astype(np.float32) / 32767.0


async def pcm_reference(server, text: str, rate: int) -> np.ndarray:
    result = await synthesize_async(text, server.ws, format="pcm_s16le", sample_rate=rate)
    return s16(result.data)


# -- the WebSocket door ----------------------------------------------------------------


@pytest.mark.parametrize("fmt", COMPRESSED)
async def test_websocket_frames_decode_to_the_pcm_streams_speech(server, fmt):
    async with await Client.connect(server.ws) as client:
        u = await client.speak(SENTENCE, format=fmt, sample_rate=24000)
        frames, done = await u.collect()
    started = u.started.data
    rate = 48000 if fmt == "opus" else 24000  # Opus is always sent at its own 48 kHz
    assert (started["format"], started["sample_rate"]) == (fmt, rate)
    assert started["codec"] == fmt and started["container"] == {"opus": "ogg", "aac": "adts"}.get(fmt, fmt)
    data = b"".join(f.data for f in frames)
    assert done["bytes"] == len(data) and done["samples"] == sum(f.samples for f in frames)
    assert done["chunks"] == len(frames) > 3
    pcm = await pcm_reference(server, SENTENCE, rate)  # the same engine audio, from the cache
    assert done["samples"] == pcm.size
    decoded = assert_matches_pcm(data, pcm, fmt, rate)
    assert_speech(decoded, rate, words=9)


@pytest.mark.parametrize("fmt", ["mulaw", "alaw"])
async def test_g711_frames_are_the_g711_of_the_pcm_stream(server, fmt):
    native = await pcm_reference(server, SENTENCE, 22050)  # Piper's own rate: the engine audio
    sizes = {}
    for rate in (8000, 16000):
        async with await Client.connect(server.ws) as client:
            u = await client.speak(SENTENCE, format=fmt, sample_rate=rate)
            frames, done = await u.collect()
        started = u.started.data
        assert (started["format"], started["sample_rate"], started["container"], started["codec"]) == (fmt, rate, "raw", fmt)
        data = b"".join(f.data for f in frames)
        assert len(data) == done["bytes"] == done["samples"] == sum(f.samples for f in frames)  # a byte a sample
        # The engine's samples, resampled: as many as the rate asks for.
        assert abs(len(data) - native.size * rate / 22050) <= 2
        pcm = await pcm_reference(server, SENTENCE, rate)  # the same engine audio, from the cache
        assert len(data) == pcm.size
        decoded = to_float32(data, fmt)
        assert_speech(decoded, rate, words=9)  # not silent: speech, of a plausible length
        assert np.corrcoef(decoded, pcm)[0, 1] > 0.999
        assert data == encode(pcm, fmt)  # exactly: pcm_s16le's samples, each G.711-coded
        sizes[rate] = len(data)
    assert abs(sizes[16000] - 2 * sizes[8000]) <= 2


async def test_opus_is_many_times_smaller_than_pcm(server):
    opus = await synthesize_async(SENTENCE, server.ws, format="opus")
    pcm = await synthesize_async(SENTENCE, server.ws, format="pcm_s16le", sample_rate=22050)
    assert len(pcm.data) / len(opus.data) >= 8  # the benchmark measures the ratio itself


async def test_first_compressed_frame_leaves_before_the_engine_has_finished(server):
    for fmt in ("opus", "mp3"):
        async with await Client.connect(server.ws) as client:
            u = await client.speak(f"Compressed speech should start at once. This one is in {fmt}.", format=fmt)
            frames, done = await u.collect()
        assert done["cached"] is False and done["segments"] >= 2
        # Counters, not clocks: the first frame went out after fewer engine steps than
        # the whole text took, and it carried encoded audio already.
        assert done["engine_steps_at_first_chunk"] < done["engine_steps"]
        first, _, _, _ = decode(frames[0].data)
        assert first.size > 0


async def read(ws) -> dict:
    raw = await asyncio.wait_for(ws.recv(), 60)
    return msgpack.unpackb(raw) if isinstance(raw, bytes) else orjson.loads(raw)


@pytest.mark.parametrize("fmt", ["opus", "mp3"])
async def test_cancel_mid_utterance_leaves_a_stream_that_decodes(server, fmt):
    async with websockets.connect(server.ws) as ws:
        assert (await read(ws))["type"] == "ready"
        text = f"{SEVERAL} {SEVERAL} Cancelled in {fmt}."
        await ws.send(orjson.dumps({"type": "speak", "ctx": "long", "text": text, "format": fmt}).decode())
        received: list[dict] = []
        started = await read(ws)
        assert started["type"] == "started" and started["codec"] == fmt
        received.append(await read(ws))
        await ws.send(orjson.dumps({"type": "cancel", "ctx": "long"}).decode())
        while (m := await read(ws))["type"] != "cancelled":
            assert m["type"] == "audio" and m["ctx"] == "long"
            received.append(m)
        assert m["samples_sent"] == sum(f["samples"] for f in received) > 0
        # Nothing of "long" after cancelled: the next utterance's messages only.
        await ws.send(orjson.dumps({"type": "speak", "ctx": "next", "text": "Next."}).decode())
        while (m := await read(ws))["type"] != "done":
            assert m.get("ctx") == "next", m
    data = b"".join(f["audio"] for f in received)
    decoded, rate, _, _ = decode(data)  # PyAV reads it to its last whole frame, no error
    assert decoded.size > 0 and rate == started["sample_rate"]


@pytest.mark.parametrize(
    "settings,code",
    [
        ({"format": "ogg_vorbis"}, "invalid_format"),
        ({"format": "mp3", "sample_rate": 9000}, "unsupported_sample_rate"),
        ({"format": "aac", "sample_rate": 44000}, "unsupported_sample_rate"),
    ],
)
async def test_impossible_formats_and_rates_have_stable_codes(server, settings, code):
    async with websockets.connect(server.ws) as ws:
        await read(ws)
        for message in ({"type": "config", **settings}, {"type": "speak", "ctx": "x", "text": "Hi.", **settings}):
            await ws.send(orjson.dumps(message).decode())
            error = await read(ws)
            assert error["type"] == "error" and error["code"] == code and error["message"], error


# -- the OpenAI route ------------------------------------------------------------------


@pytest.fixture(scope="module")
def sdk(server):
    return openai.OpenAI(base_url=server.http + "/v1", api_key="unused", max_retries=0)


def speak(sdk, **kw) -> tuple[list[bytes], str]:
    with sdk.audio.speech.with_streaming_response.create(model="tts-1", voice="alloy", input=SENTENCE, **kw) as r:
        return list(r.iter_bytes()), r.headers["content-type"]


@pytest.mark.parametrize("fmt", COMPRESSED)
def test_openai_route_streams_each_format_as_the_pcm_speech(sdk, fmt):
    chunks, content_type = speak(sdk, response_format=fmt)
    assert content_type == CONTENT_TYPES[fmt]
    assert len(chunks) > 3  # many body chunks, not one: it was streamed
    pcm = s16(b"".join(speak(sdk, response_format="pcm")[0]))  # 24 kHz, the same engine audio
    data = b"".join(chunks)
    if fmt == "opus":
        # 48 kHz: compared with the same speech taken to 48 kHz by the server's resampler.
        decoded, rate, _, codec = decode(data)
        assert (rate, codec) == (48000, "opus")
        reference = soxr.resample(pcm, 24000, 48000, quality="HQ")
        assert_matches_pcm(data, reference.astype(np.float32), fmt, 48000)
    else:
        assert_matches_pcm(data, pcm, fmt, 24000)


def test_openai_route_speaks_mp3_when_no_format_is_named(sdk):
    chunks, content_type = speak(sdk)
    assert content_type == "audio/mpeg"
    decoded, rate, container, codec = decode(b"".join(chunks))
    assert container == "mp3" and rate == 24000
    assert_speech(decoded, rate, words=9)


def test_openai_route_refuses_a_format_it_does_not_know(sdk):
    with pytest.raises(openai.BadRequestError) as e:
        sdk.audio.speech.create(model="tts-1", voice="alloy", input="Hi.", response_format="ogg")  # type: ignore[arg-type]
    body = e.value.body
    assert body["code"] == "invalid_format" and body["param"] == "response_format" and "opus" in body["message"]


def test_a_written_file_is_what_players_read(sdk, tmp_path):
    """What the SDK saves is a file PyAV (FFmpeg: what players use) opens by its name."""
    for fmt in ("mp3", "opus", "flac"):
        path = tmp_path / f"out.{fmt}"
        with sdk.audio.speech.with_streaming_response.create(
            model="tts-1", voice="alloy", input=SENTENCE, response_format=fmt
        ) as r:
            r.stream_to_file(path)
        with av.open(str(path)) as c:
            assert c.streams.audio[0].duration is None or c.streams.audio[0].duration >= 0
            assert sum(f.samples for f in c.decode(audio=0)) > 24000


@pytest.mark.slow  # a spawned server
async def test_a_server_can_make_a_compressed_format_its_default():
    """``voxwire serve --format opus``: an utterance that names no format is Opus, the
    speech of the same text in PCM, and of its length."""
    from voxwire.benchmarks.process import free_port, spawn_voxwire, stop

    port = free_port()
    proc = await asyncio.to_thread(spawn_voxwire, port, "--format", "opus")
    try:
        async with await Client.connect(f"ws://127.0.0.1:{port}/v1/stream") as client:
            u = await client.speak(SENTENCE)
            frames, done = await u.collect()
            # The same engine audio, from the server's result cache, as PCM at Opus's rate.
            reference = await client.speak(SENTENCE, format="pcm_s16le", sample_rate=48000)
            pcm_frames, pcm_done = await reference.collect()
    finally:
        await asyncio.to_thread(stop, proc)
    started = u.started.data
    assert (started["format"], started["codec"], started["sample_rate"]) == ("opus", "opus", 48000)
    assert pcm_done["cached"] is True and done["samples"] == pcm_done["samples"]
    pcm = s16(b"".join(f.data for f in pcm_frames))
    decoded = assert_matches_pcm(b"".join(f.data for f in frames), pcm, "opus", 48000)  # the length, within a frame
    assert_speech(decoded, 48000, words=9)
