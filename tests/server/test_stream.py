"""Protocol v1 end to end: the real Piper engine behind a real uvicorn server on
loopback, spoken to by the real Python client and by raw WebSocket connections."""

from __future__ import annotations

import asyncio

import httpx
import msgpack
import numpy as np
import orjson
import pytest
import websockets

from voxwire.engine.precision import resolve

from voxwire_client import Audio, Client
from voxwire_client.sync import synthesize_async

SENTENCE = "The quick brown fox jumps over the lazy dog."
ONE_LONG_SENTENCE = (
    "The old lighthouse keeper climbed the spiral stairs every single evening long after "
    "the ships had stopped needing his lamp and he polished the brass and wound the "
    "clockwork and watched the horizon turn from orange to violet while the visitors "
    "below wondered why he still bothered to keep the light burning through the night."
)
SEVERAL = (
    "Streaming speech should start at once. The rest of the text is still being computed. "
    "Then the last sentence arrives, and the listener never waits."
)


def rms_db(x: np.ndarray) -> float:
    return 20 * np.log10(np.sqrt(np.mean(x.astype(np.float64) ** 2)) + 1e-12)


def assert_speech(audio: np.ndarray, rate: int, words: int) -> None:
    """Not silent, a plausible duration, and the shape of speech: loud syllables and
    quiet gaps, with its energy in the speech band."""
    seconds = audio.size / rate
    assert 0.15 * words <= seconds <= 0.8 * words + 0.5, seconds
    assert rms_db(audio) > -35
    frame = rate // 50
    energies = np.array([rms_db(audio[i : i + frame]) for i in range(0, audio.size - frame, frame)])
    assert np.percentile(energies, 90) - np.percentile(energies, 10) > 15  # syllables and gaps
    spectrum = np.abs(np.fft.rfft(audio)) ** 2
    freqs = np.fft.rfftfreq(audio.size, 1 / rate)
    band = spectrum[(freqs > 80) & (freqs < 4000)].sum() / spectrum.sum()
    assert band > 0.6, band


# -- real speech in every format and rate ---------------------------------------------


@pytest.mark.parametrize("fmt", ["pcm_s16le", "pcm_f32le", "mulaw", "alaw"])
@pytest.mark.parametrize("rate", [8000, 16000, 24000, 48000])
async def test_real_speech_in_every_format_and_rate(piper_server, fmt, rate):
    result = await synthesize_async(SENTENCE, piper_server.ws, format=fmt, sample_rate=rate)
    assert (result.format, result.sample_rate) == (fmt, rate)
    width = {"pcm_s16le": 2, "pcm_f32le": 4, "mulaw": 1, "alaw": 1}[fmt]
    assert len(result.data) == width * result.done["samples"]
    assert_speech(result.audio, rate, words=9)
    assert result.done["audio_ms"] == pytest.approx(1000 * result.duration, abs=1)


async def test_streaming_is_real_first_chunk_before_the_engine_finishes(piper_server):
    async with await Client.connect(piper_server.ws) as client:
        u = await client.speak(SEVERAL, chunk_ms=200, sample_rate=24000)
        frames, done = await u.collect()
    assert done["segments"] == 3
    # The first frame went out when the engine had done fewer steps than the whole text.
    assert done["engine_steps_at_first_chunk"] < done["engine_steps"]
    assert 3200 <= frames[0].samples <= 4800  # once the engine made 150 ms, less the resampler's delay
    assert all(f.samples == 4800 for f in frames[1:-1])  # then 200 ms at 24 kHz
    assert 0 < frames[-1].samples <= 4800
    assert [f.seq for f in frames] == list(range(len(frames)))
    assert [f.offset for f in frames] == list(np.cumsum([0] + [f.samples for f in frames[:-1]]))
    assert_speech(np.concatenate([f.to_float32() for f in frames]), 24000, words=27)


@pytest.mark.parametrize("chunk_ms", [150, 250])
async def test_chunk_duration_is_honoured(piper_server, chunk_ms):
    result = await synthesize_async(SENTENCE, piper_server.ws, chunk_ms=chunk_ms, sample_rate=16000)
    frame = 16 * chunk_ms
    # Every frame full but the last, and the first, which may hold as little as 150 ms.
    assert result.chunks - 1 <= -(-result.done["samples"] // frame) <= result.chunks


async def test_streamed_words_speak_like_the_whole_text(piper_server):
    whole = await synthesize_async(SEVERAL, piper_server.ws)
    async with await Client.connect(piper_server.ws) as client:
        u = await client.speak("", ctx="llm", final=False)
        for word in SEVERAL.split(" "):
            await u.send(word + " ")
        await u.send("", final=True)
        frames, done = await u.collect()
    assert done["segments"] == whole.done["segments"] == 3
    # Piper's durations are stochastic (noise_w), so equal text gives similar, not equal, length.
    assert done["audio_ms"] == pytest.approx(whole.done["audio_ms"], rel=0.15)
    assert_speech(np.concatenate([f.to_float32() for f in frames]), whole.sample_rate, words=27)


# -- cancellation and disconnection ----------------------------------------------------


async def read(ws) -> dict:
    raw = await asyncio.wait_for(ws.recv(), 30)
    return msgpack.unpackb(raw) if isinstance(raw, bytes) else orjson.loads(raw)


async def test_cancel_stops_audio_and_computation(piper_server):
    worker = piper_server.service.worker
    async with websockets.connect(piper_server.ws) as ws:
        ready = await read(ws)
        assert ready["type"] == "ready" and ready["precision"] == worker.engine.precision
        await ws.send(orjson.dumps({"type": "speak", "ctx": "long", "text": SEVERAL * 4}).decode())
        while (await read(ws))["type"] != "audio":
            pass
        await ws.send(orjson.dumps({"type": "cancel", "ctx": "long"}).decode())
        while (m := await read(ws))["type"] != "cancelled":
            assert m["type"] == "audio" and m["ctx"] == "long"
        assert m["ctx"] == "long" and m["samples_sent"] > 0
        # The worker dropped the utterance and closed its generator.
        for _ in range(500):
            if worker.active == 0:
                break
            await asyncio.sleep(0.01)
        assert worker.active == 0
        steps_after_cancel = worker.stats.steps
        # Another utterance on the same socket: no frame of "long" comes after cancelled,
        # and the worker's steps grow by exactly the new utterance's own steps.
        await ws.send(orjson.dumps({"type": "speak", "ctx": "next", "text": "Next."}).decode())
        while (m := await read(ws))["type"] != "done":
            assert m.get("ctx") == "next", m
        assert worker.stats.steps - steps_after_cancel == m["engine_steps"]


async def test_disconnect_mid_stream_closes_generators_and_others_carry_on(piper_server):
    worker = piper_server.service.worker
    closed_before = worker.stats.streams_closed
    ws = await websockets.connect(piper_server.ws)
    await read(ws)
    # One unsplittable sentence of ~20 s per utterance: when the first frame arrives the
    # worker is certainly inside a segment (finishing it takes ~1 s of compute), so an
    # open generator is what the disconnect has to close. With short sentences the
    # abort could land between two segments, where there is no generator to close.
    for i in range(3):
        await ws.send(orjson.dumps({"type": "speak", "ctx": f"u{i}", "text": ONE_LONG_SENTENCE}).decode())
    while (await read(ws))["type"] != "audio":
        pass
    ws.transport.abort()  # no close handshake: the client just vanishes
    for _ in range(1000):
        if worker.active == 0 and piper_server.service.admission.utterances == 0:
            break
        await asyncio.sleep(0.01)
    assert worker.active == 0 and piper_server.service.admission.utterances == 0
    assert worker.stats.streams_closed >= closed_before + 1
    result = await synthesize_async(SENTENCE, piper_server.ws)
    assert_speech(result.audio, result.sample_rate, words=9)


# -- streamed text: starting at a clause ------------------------------------------------


@pytest.mark.parametrize("where", ["config", "speak"])
@pytest.mark.parametrize("words, segments", [(0, 1), (3, 2)])
async def test_streamed_text_starts_at_a_clause_when_the_connection_asks(tone_server, where, words, segments):
    # The first sentence arrives in pieces; with first_clause_words 3 its first clause (six
    # words) is spoken on its own, before the rest of the sentence has arrived.
    async with await Client.connect(tone_server.ws) as client:
        settings = {"first_clause_words": words}
        if where == "config":
            assert (await client.configure(**settings))["first_clause_words"] == words
            settings = {}
        u = await client.speak("Sure, the museum", final=False, **settings)
        assert u.started is None or u.started["first_clause_words"] == words
        for piece in [" opens at nine,", " and tours", " start at ten."]:
            await u.send(piece)
        await u.send("", final=True)
        frames, done = await u.collect()
    assert u.started["first_clause_words"] == words
    assert done["segments"] == segments and frames


# -- concurrency: several utterances on several sockets ---------------------------------


async def test_two_sockets_several_utterances_each_no_cross_talk(tone_server):
    from tests.fixtures.engines import RATE, dominant_pitches, word_pitch

    texts = {
        ("a", 0): "alpha bravo charlie.",
        ("a", 1): "delta echo.",
        ("a", 2): "foxtrot golf hotel india.",
        ("b", 0): "juliet kilo.",
        ("b", 1): "lima mike november.",
        ("b", 2): "oscar.",
    }

    async def one_socket(name: str) -> dict[str, np.ndarray]:
        async with await Client.connect(tone_server.ws) as client:
            us = {f"{name}{i}": await client.speak(texts[(name, i)], ctx=f"{name}{i}") for i in range(3)}
            results = await asyncio.gather(*(u.collect() for u in us.values()))
            out = {}
            for ctx, (frames, done) in zip(us, results):
                assert all(f.ctx == ctx for f in frames) and done["ctx"] == ctx
                out[ctx] = np.concatenate([f.to_float32() for f in frames])
            return out

    a, b = await asyncio.gather(one_socket("a"), one_socket("b"))
    for (name, i), text in texts.items():
        audio = {**a, **b}[f"{name}{i}"]
        words = text.strip(".").split()
        assert dominant_pitches(audio, RATE) == pytest.approx([word_pitch(w) for w in words], abs=15)


async def test_concurrent_piper_utterances_each_complete(piper_server):
    async def one(text: str) -> tuple[int, float]:
        result = await synthesize_async(text, piper_server.ws, sample_rate=16000)
        return len(text.split()), result.duration

    results = await asyncio.gather(*(one(t) for t in ["Yes.", SENTENCE, SEVERAL, "One more thing, please."]))
    for words, seconds in results:
        assert 0.15 * words <= seconds <= 0.8 * words + 0.5
    durations = [s for _, s in results]
    assert durations == sorted(durations) or durations[1] < durations[2]


# -- bad input: a clear error, and the session goes on -----------------------------------


BAD = [
    ("{not json", "invalid_json"),
    (b"\x00\xc1garbage\xff", "invalid_msgpack"),
    ('{"type": "sing"}', "unknown_type"),
    ('{"text": "hello"}', "missing_field"),
    ('{"type": "cancel"}', "missing_field"),
    ('{"type": "speak", "ctx": "x", "text": "hi", "voice": "nobody"}', "unknown_voice"),
    ('{"type": "speak", "ctx": "x", "text": "hi", "format": "ogg_vorbis"}', "invalid_format"),
    ('{"type": "speak", "ctx": "x", "text": "hi", "sample_rate": 96000}', "invalid_sample_rate"),
    ('{"type": "config", "chunk_ms": 1000}', "invalid_chunk_ms"),
    ('{"type": "flush", "ctx": "never-started"}', "unknown_ctx"),
]


async def test_bad_input_gets_a_stable_error_and_the_session_goes_on(tone_server):
    async with await Client.connect(tone_server.ws) as client:
        for data, code in BAD:
            await client.send_raw(data)
            err = await asyncio.wait_for(client.next_error(), 10)
            assert err["code"] == code, (data, err.data)
            assert err["message"]
        result_after = await client.speak("still working.", ctx="ok")
        frames, done = await result_after.collect()
        assert done["type"] == "done" and frames


async def test_per_utterance_errors_name_the_ctx(tone_server):
    async with websockets.connect(tone_server.ws) as ws:
        await read(ws)
        for data, code in BAD:
            if '"ctx": "x"' not in str(data):
                continue
            await ws.send(data)
            m = await read(ws)
            assert (m["type"], m["code"], m["ctx"], m["terminal"]) == ("error", code, "x", True)


async def test_text_too_long_and_too_many_utterances(tone_server):
    limits = tone_server.service.config.limits
    async with await Client.connect(tone_server.ws) as client:
        u = await client.speak("word " * (limits.max_text_chars // 5 + 1), ctx="big")
        with pytest.raises(Exception) as e:
            await u.collect()
        assert getattr(e.value, "code", None) == "text_too_long"
        # Streamed text counts too, and an over-long piece does not end the utterance.
        s = await client.speak("a few words ", ctx="stream", final=False)
        await s.send("word " * (limits.max_text_chars // 5), final=False)
        await s.send("the end.", final=True)
        items = [item async for item in s]
        errors = [i for i in items if not isinstance(i, Audio) and i.type == "error"]
        assert [e["code"] for e in errors] == ["text_too_long"] and errors[0]["terminal"] is False
        assert items[-1].type == "done"
        # More active utterances than a socket may hold.
        held = [await client.speak("hold ", ctx=f"h{i}", final=False) for i in range(limits.max_utterances_per_socket)]
        extra = await client.speak("one too many.", ctx="extra")
        with pytest.raises(Exception) as e:
            await extra.collect()
        assert e.value.code == "too_many_utterances"
        for h in held:
            await h.send("", final=True)
            await h.collect()


async def test_server_wide_utterance_limit_answers_overloaded(tone_server):
    limits = tone_server.service.config.limits
    clients = [await Client.connect(tone_server.ws) for _ in range(3)]
    try:
        held = []
        for i in range(limits.max_utterances_total):
            c = clients[i // limits.max_utterances_per_socket]
            held.append(await c.speak("hold ", ctx=f"h{i}", final=False))
            # Sockets are served concurrently: be sure this one holds its slot first.
            assert (await anext(aiter(held[-1]))).type == "started"
        extra = await clients[2].speak("no room.", ctx="extra")
        with pytest.raises(Exception) as e:
            await extra.collect()
        assert e.value.code == "overloaded"
        # Saturated: a new connection is told to come back later, with close code 1013.
        with pytest.raises(Exception) as e:
            await Client.connect(tone_server.ws)
        assert getattr(e.value, "code", None) == 1013
        # The OpenAI route: a 429 that OpenAI's SDKs retry after Retry-After, typed as the
        # service's load rather than a fault in the request.
        body = {"model": "tts-1", "voice": "tone", "input": "no room.", "response_format": "pcm"}
        async with httpx.AsyncClient(timeout=30) as http:
            r = await http.post(f"{tone_server.http}/v1/audio/speech", json=body)
        assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
        assert r.json()["error"]["type"] == "rate_limit_error"
        for h in held:
            await h.send("", final=True)
            await h.collect()
    finally:
        for c in clients:
            await c.close()


async def test_connections_over_the_limit_close_1013(tone_server):
    tone_server.service.admission.limits = limits = type(tone_server.service.config.limits)(max_connections=2)
    clients = [await Client.connect(tone_server.ws) for _ in range(limits.max_connections)]
    try:
        with pytest.raises(Exception) as e:
            await Client.connect(tone_server.ws)
        assert getattr(e.value, "code", None) == 1013 and "capacity" in e.value.reason
    finally:
        for c in clients:
            await c.close()
    # Once one leaves, there is room again.
    async with await Client.connect(tone_server.ws):
        pass


async def test_message_over_the_size_limit_closes_1009(tone_server):
    limit = tone_server.service.config.limits.max_message_bytes
    async with websockets.connect(tone_server.ws, max_size=None) as ws:
        await read(ws)
        await ws.send(orjson.dumps({"type": "speak", "ctx": "x", "text": "a" * limit}).decode())
        with pytest.raises(websockets.ConnectionClosed) as e:
            while True:
                await read(ws)
        assert e.value.rcvd.code == 1009


# -- HTTP beside the socket ---------------------------------------------------------------


async def test_health_ready_and_voices(piper_server):
    import httpx

    async with httpx.AsyncClient(base_url=piper_server.http) as http:
        assert (await http.get("/healthz")).json() == {"status": "ok"}
        ready = await http.get("/readyz")
        assert ready.status_code == 200 and ready.json()["engine"] == "piper"
        assert ready.json()["precision"] == resolve("auto", "cpu")  # the default setting, on this CPU
        voices = (await http.get("/v1/voices")).json()
        assert voices["default"] == "joe"
        assert voices["voices"][0]["sample_rate"] == 22050
