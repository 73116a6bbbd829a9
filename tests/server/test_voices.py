"""Voice registration over HTTP and cloned voices over the socket, with CosyVoice2 on a
tiny random-weight model (the real architecture, reduced), through a real server; and
the voice list, with a multi-speaker voice's speakers (the scripted tone engine)."""

from __future__ import annotations

import asyncio
import io
import threading

import httpx
import numpy as np
import pytest
import soundfile

from voxwire.engine.base import EngineError
from voxwire.server import voices
from voxwire.server.voices import MAX_DECODED_SAMPLES, MAX_DECODED_SECONDS, decode_audio
from tests.engine.cosyvoice2.test_schedule import no_early_stop
from tests.server.test_bodies import HUGE_UPLOAD, SENT_BOUND, multipart_body, send_until_answered
from tests.server.doors.test_openai import (  # server_log is a fixture, used by name
    assert_logged_as_ordinary,
    disconnect_records,
    hang_up_mid_body,
    server_log,  # noqa: F401
    wait_for_disconnect_record,
)
from voxwire_client import Client, ServerError

RATE = 16000


def reference_wav(seconds: float = 3.0, f0: float = 150.0, fmt: str = "WAV") -> bytes:
    t = np.arange(int(RATE * seconds)) / RATE
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 3 * t) ** 2
    audio = (0.3 * envelope * np.sin(2 * np.pi * f0 * t + 2 * np.sin(2 * np.pi * 4 * t))).astype(np.float32)
    buf = io.BytesIO()
    soundfile.write(buf, audio, RATE, format=fmt)
    return buf.getvalue()


async def register(server, audio: bytes, transcript: str = "Hello, this is my voice.", name: str = "me", **form: str):
    async with httpx.AsyncClient(base_url=server.http, timeout=120) as http:
        return await http.post(
            "/v1/voices", files={"audio": ("ref.wav", audio, "audio/wav")},
            data={"transcript": transcript, "name": name, **form},
        )


def engine(server):
    return server.service.worker.loaded_engine()


async def test_register_then_speak_with_the_cloned_voice(cosyvoice_server):
    runs = engine(cosyvoice_server).stats.frontend_runs
    first = await register(cosyvoice_server, reference_wav(f0=140))
    assert first.status_code == 201, first.text
    voice = first.json()
    assert voice["cached"] is False and voice["sample_rate"] == 24000
    assert engine(cosyvoice_server).stats.frontend_runs == runs + 1
    # The same content again: the cached voice, and no frontend run.
    again = await register(cosyvoice_server, reference_wav(f0=140))
    assert again.status_code == 200 and again.json()["id"] == voice["id"] and again.json()["cached"] is True
    assert engine(cosyvoice_server).stats.frontend_runs == runs + 1
    listed = httpx.get(f"{cosyvoice_server.http}/v1/voices").json()["voices"]
    assert voice["id"] in [v["id"] for v in listed]

    async with await Client.connect(cosyvoice_server.ws) as client:
        assert client.ready["engine"] == "cosyvoice2" and client.ready["sample_rate"] == 24000
        for _ in range(2):  # a second request with the same voice skips the frontend entirely
            u = await client.speak("Hello there, how are you?", voice=voice["id"], sample_rate=24000)
            frames, done = await u.collect()
            audio = np.concatenate([f.to_float32() for f in frames])
            assert done["samples"] == audio.size > 0.2 * 24000
            assert np.sqrt(np.mean(audio**2)) > 1e-3  # random weights: not speech, but not silence
            assert 3600 <= frames[0].samples <= 4800 and all(f.samples == 4800 for f in frames[1:-1])
    assert engine(cosyvoice_server).stats.frontend_runs == runs + 1


async def first_audio(u) -> None:
    async for item in u:
        if getattr(item, "type", None) is None:  # an audio frame, not an event
            return
    raise AssertionError("the utterance ended before its first audio")


async def steps_within(stats, seconds: float) -> int:
    """How many LM steps run in the next ``seconds`` (polled; returns at the first one)."""
    start, end = stats.lm_steps, asyncio.get_running_loop().time() + seconds
    while stats.lm_steps == start and asyncio.get_running_loop().time() < end:
        await asyncio.sleep(0.005)
    return stats.lm_steps - start


async def test_cancel_stops_the_lm_loop(cosyvoice_server):
    voice = (await register(cosyvoice_server, reference_wav(f0=170), name="cancel")).json()["id"]
    stats = engine(cosyvoice_server).stats
    worker = cosyvoice_server.service.worker
    long_text = "This is a long sentence that keeps on going. " * 20  # many seconds of LM steps
    async with await Client.connect(cosyvoice_server.ws) as client:
        # First, how long the LM takes for a step on this machine now, not cancelled:
        # the window in which a cancelled utterance must take none is ten such steps.
        control = await client.speak(long_text, voice=voice)
        await first_audio(control)
        start = asyncio.get_running_loop().time()
        assert await steps_within(stats, 30.0) > 0
        quiet = max(1.0, 10 * (asyncio.get_running_loop().time() - start))
        await control.cancel()
        async for item in control:
            pass
        assert item.type == "cancelled"
        for _ in range(500):  # the worker closes the control's generator on its own thread
            if worker.active == 0:
                break
            await asyncio.sleep(0.01)

        closed = stats.utterances_closed
        u = await client.speak(long_text, voice=voice)
        await first_audio(u)
        await u.cancel()
        async for item in u:
            pass
        assert item.type == "cancelled"
        for _ in range(500):
            if worker.active == 0:
                break
            await asyncio.sleep(0.01)
        assert stats.utterances_closed == closed + 1  # the generator was closed mid-utterance
        # Once the cancel is answered, the LM does not take one more step for it.
        assert await steps_within(stats, quiet) == 0


@pytest.mark.parametrize(
    "audio,transcript,code,status",
    [
        (b"definitely not audio", "words", "bad_audio", 400),
        (reference_wav(seconds=0.3), "words", "audio_too_short", 400),
        (reference_wav(seconds=31), "words", "audio_too_long", 400),
        (reference_wav(seconds=61, fmt="FLAC"), "words", "audio_too_long", 400),  # refused before decoding
        (reference_wav(), "", "transcript_missing", 400),
    ],
)
async def test_bad_uploads_get_clear_errors(cosyvoice_server, audio, transcript, code, status):
    r = await register(cosyvoice_server, audio, transcript)
    assert (r.status_code, r.json()["error"]["code"]) == (status, code)
    assert r.json()["error"]["message"]


async def test_upload_shape_errors(cosyvoice_server):
    async with httpx.AsyncClient(base_url=cosyvoice_server.http) as http:
        r = await http.post("/v1/voices", json={"audio": "x"})
        assert (r.status_code, r.json()["error"]["code"]) == (400, "bad_request")
        r = await http.post("/v1/voices", data={"transcript": "no file"}, files={"other": ("x", b"1")})
        assert (r.status_code, r.json()["error"]["code"]) == (400, "bad_request")
    # Refused by its Content-Length, unread, and the connection closed under the client's
    # send: httpx's blocking client reads the answer then, its asyncio one cannot (the
    # transport is torn down on the failed send).
    big = b"x" * (17 * 1024 * 1024)
    r = httpx.post(f"{cosyvoice_server.http}/v1/voices", content=big, headers={"content-type": "multipart/form-data; boundary=x"})
    assert (r.status_code, r.json()["error"]["code"]) == (413, "upload_too_large") and r.headers["connection"] == "close"


def test_a_chunked_upload_over_the_limit_is_refused_as_it_arrives(cosyvoice_server):
    """No Content-Length to refuse it by: counted as it arrives, and refused once past
    16 MiB, instead of spooled whole (2 GiB here) before its size is known."""
    answer = send_until_answered(cosyvoice_server.port, "/v1/voices", "multipart/form-data; boundary=cut", multipart_body(HUGE_UPLOAD))
    assert answer.status == 413, answer
    assert answer.json()["error"]["code"] == "upload_too_large" and "16 MiB" in answer.json()["error"]["message"]
    assert answer.headers.get("connection") == "close"  # the rest of it was never read
    assert answer.sent < SENT_BOUND, answer.sent


async def test_a_chunked_upload_within_the_limit_registers(cosyvoice_server):
    form = httpx.Request(
        "POST", f"{cosyvoice_server.http}/v1/voices", files={"audio": ("ref.wav", reference_wav(f0=280), "audio/wav")},
        data={"transcript": "Hello, this is my voice.", "name": "chunked"},
    )
    content = form.read()

    async def pieces():  # no length known in advance: sent chunked
        for start in range(0, len(content), 4096):
            yield content[start : start + 4096]

    async with httpx.AsyncClient(timeout=120) as http:
        r = await http.post(form.url, content=pieces(), headers={"content-type": form.headers["content-type"]})
    assert r.status_code == 201 and r.json()["name"] == "chunked", r.text


async def test_speaking_with_an_unregistered_voice_is_refused(cosyvoice_server):
    async with await Client.connect(cosyvoice_server.ws) as client:
        with pytest.raises(ServerError) as e:
            await (await client.speak("Hi.", voice="not-registered")).collect()
        assert e.value.code == "unknown_voice"


def test_an_upload_cut_off_mid_body_is_an_ordinary_event(cosyvoice_server, server_log):
    partial = b'--cut\r\nContent-Disposition: form-data; name="audio"; filename="me.wav"\r\n\r\n' + reference_wav()[:1000]
    hang_up_mid_body(cosyvoice_server, "/v1/voices", "multipart/form-data; boundary=cut", partial)
    wait_for_disconnect_record(server_log)
    assert httpx.get(f"{cosyvoice_server.http}/v1/voices").status_code == 200  # and the server goes on serving
    assert_logged_as_ordinary(disconnect_records(server_log))


# One segment (no clause boundary for the server to split at), 48 tokens: the LM may not
# stop before 96, long after either schedule's first chunk.
ONE_SEGMENT = "This is a long sentence that keeps on going without a pause."


class FirstAudioSpy:
    """Wraps a running server's engine: for each stream the worker opens, the request's
    ``fast_start`` and the engine steps the stream took part in up to and including its
    first audio (for CosyVoice2 one LM token each). Counters, read once an utterance is done."""

    def __init__(self, engine, monkeypatch: pytest.MonkeyPatch) -> None:
        self._open, self._step = engine.open, engine.step
        self.opened: list[tuple[object, object]] = []
        self._steps: dict[object, int] = {}
        self._first: dict[object, int] = {}
        monkeypatch.setattr(engine, "open", self.open)
        monkeypatch.setattr(engine, "step", self.step)

    def open(self, text, params):
        stream = self._open(text, params)
        self.opened.append((params, stream))
        return stream

    def step(self, streams):
        results = self._step(streams)
        for stream, result in zip(streams, results):
            if stream in self._first:
                continue
            self._steps[stream] = self._steps.get(stream, 0) + 1
            if not isinstance(result, Exception) and any(isinstance(p, np.ndarray) and p.size for p in result.pieces):
                self._first[stream] = self._steps[stream]
        return results

    async def speak(self, client: Client, **settings) -> tuple[bool | None, int, object]:
        """Speak ONE_SEGMENT: what the engine was asked (``fast_start``), the steps to its
        first audio, and what ``started`` reported."""
        opened = len(self.opened)
        u = await client.speak(ONE_SEGMENT, **settings)
        frames, done = await u.collect()
        assert frames and done["samples"] > 0 and len(self.opened) == opened + 1
        self.frames = frames
        params, stream = self.opened[-1]
        return params.fast_start, self._first[stream], u.started["fast_start"]


def official_steps(server, voice_id: str) -> int:
    """The official schedule's first chunk: 25 + pad + 3 LM tokens (engine/cosyvoice2/pipeline.py)."""
    n_prompt = len(engine(server).store.get(voice_id).prompt.speech_tokens)
    return 25 + (-n_prompt % 25) + 3


async def test_fast_start_per_request_per_session_and_per_voice(cosyvoice_server, monkeypatch):
    plain = await register(cosyvoice_server, reference_wav(f0=190), name="plain")
    quick = await register(cosyvoice_server, reference_wav(f0=210), name="quick", fast_start="true")
    assert (plain.status_code, quick.status_code) == (201, 201)
    assert plain.json()["fast_start"] is None and quick.json()["fast_start"] is True
    plain_id, quick_id = plain.json()["id"], quick.json()["id"]
    listed = {v["id"]: v for v in httpx.get(f"{cosyvoice_server.http}/v1/voices").json()["voices"]}
    assert (listed[plain_id]["fast_start"], listed[quick_id]["fast_start"]) == (None, True)
    plain_official, quick_official = official_steps(cosyvoice_server, plain_id), official_steps(cosyvoice_server, quick_id)
    assert min(plain_official, quick_official) > 13
    spy = FirstAudioSpy(engine(cosyvoice_server), monkeypatch)
    with no_early_stop(engine(cosyvoice_server)):
        async with await Client.connect(cosyvoice_server.ws) as client:
            # The server's default (the official schedule), and a request's own choice.
            assert await spy.speak(client, voice=plain_id) == (None, plain_official, None)
            assert await spy.speak(client, voice=plain_id, fast_start=True) == (True, 13, True)
            # The voice's default, and a request's explicit false over it.
            assert await spy.speak(client, voice=quick_id) == (None, 13, None)
            assert await spy.speak(client, voice=quick_id, fast_start=False) == (False, quick_official, False)
            # A session's choice, and null in a speak back to the voice's default.
            assert (await client.configure(fast_start=True))["fast_start"] is True
            assert await spy.speak(client, voice=plain_id) == (True, 13, True)
            assert await spy.speak(client, voice=plain_id, fast_start=None) == (None, plain_official, None)
            with pytest.raises(ServerError) as e:
                await (await client.speak("Hi.", voice=plain_id, fast_start="yes")).collect()
            assert e.value.code == "invalid_field"


async def test_a_voice_keeps_the_fast_start_it_was_registered_with(cosyvoice_server):
    first = await register(cosyvoice_server, reference_wav(f0=230), name="kept", fast_start="false")
    assert first.status_code == 201 and first.json()["fast_start"] is False
    for form, status in (({"fast_start": "false"}, 200), ({}, 200), ({"fast_start": "true"}, 409)):
        r = await register(cosyvoice_server, reference_wav(f0=230), name="kept", **form)
        assert r.status_code == status, r.text
        if status == 200:
            assert r.json()["cached"] is True and r.json()["fast_start"] is False
        else:
            assert r.json()["error"]["code"] == "voice_exists" and "fast_start" in r.json()["error"]["message"]
    runs = engine(cosyvoice_server).stats.frontend_runs
    r = await register(cosyvoice_server, reference_wav(f0=240), name="bad", fast_start="maybe")
    assert (r.status_code, r.json()["error"]["code"]) == (400, "bad_request") and "fast_start" in r.json()["error"]["message"]
    assert engine(cosyvoice_server).stats.frontend_runs == runs  # refused before the frontend ran


async def test_piper_ignores_fast_start(piper_server, monkeypatch):
    """fast_start is CosyVoice2's first-chunk schedule. Piper is handed it like any engine
    (and ``started`` echoes it), but speaks the same whatever it says: its first audio comes
    at the same engine step, and it is speech of the same length (Piper's noise varies it a
    little)."""
    spy = FirstAudioSpy(engine(piper_server), monkeypatch)
    firsts, seconds = [], []
    async with await Client.connect(piper_server.ws) as client:
        for fast_start in (None, True, False):
            settings = {} if fast_start is None else {"fast_start": fast_start}
            asked, first, started = await spy.speak(client, **settings)
            assert asked is fast_start and started is fast_start
            audio = np.concatenate([f.to_float32() for f in spy.frames])
            assert np.sqrt(np.mean(audio**2)) > 0.01  # speech, not silence
            firsts.append(first)
            seconds.append(audio.size / spy.frames[0].sample_rate)
    assert firsts == [firsts[0]] * 3, firsts
    assert min(seconds) > 2.0 and max(seconds) < 1.25 * min(seconds), seconds  # ONE_SEGMENT: about 3 s


async def test_piper_cannot_clone(piper_server):
    r = await register(piper_server, reference_wav())
    assert (r.status_code, r.json()["error"]["code"]) == (501, "voice_registration_unsupported")
    assert "connection" not in r.headers  # an upload within the limit is read and dropped: the connection stays


def test_piper_answers_an_upload_over_the_limit_without_reading_it(piper_server):
    """Declared over 16 MiB: 501 before a byte of it is read, and the connection closes."""
    size = 17 * 1024 * 1024
    answer = send_until_answered(
        piper_server.port, "/v1/voices", "multipart/form-data; boundary=cut", multipart_body(size),
        length=sum(map(len, multipart_body(size))),
    )
    assert (answer.status, answer.json()["error"]["code"]) == (501, "voice_registration_unsupported"), answer
    assert answer.headers.get("connection") == "close"
    assert answer.sent < size


def test_decode_audio_reads_any_libsndfile_format_to_mono():
    for fmt in ("WAV", "FLAC", "OGG"):
        audio, rate = decode_audio(reference_wav(seconds=1.0, fmt=fmt))
        assert rate == RATE and audio.ndim == 1 and abs(audio.size - RATE) < 1000
    with pytest.raises(Exception) as e:
        decode_audio(b"RIFF....WAVEjunk")
    assert getattr(e.value, "code", None) == "bad_audio"


def silence(seconds: int, rate: int, channels: int = 1, fmt: str = "FLAC") -> bytes:
    """A long upload in a few kilobytes (FLAC of silence), written a second at a time."""
    buf = io.BytesIO()
    with soundfile.SoundFile(buf, "w", rate, channels, format=fmt) as f:
        second = np.zeros((rate, channels), np.float32)
        for _ in range(seconds):
            f.write(second)
    return buf.getvalue()


@pytest.fixture
def decoded(monkeypatch) -> list[int]:
    """The frames libsndfile decodes, per read, from now on."""
    counts: list[int] = []
    read = soundfile.SoundFile.read

    def counted(self, *args, **kwargs):
        out = read(self, *args, **kwargs)
        counts.append(len(out))
        return out

    monkeypatch.setattr(soundfile.SoundFile, "read", counted)
    return counts


def test_decode_audio_reads_no_more_than_a_reference_could_need(decoded):
    # Ten minutes: far past any reference, in 30 kB; and 8 channels at 192 kHz for 20 s,
    # within 60 s but more samples than 60 s of 192 kHz stereo.
    for upload, said in ((silence(600, RATE), "600.0 s"), (silence(20, 192000, channels=8), "8-channel")):
        with pytest.raises(EngineError) as e:
            decode_audio(upload)
        assert e.value.code == "audio_too_long" and said in e.value.message and f"{MAX_DECODED_SECONDS} s" in e.value.message
    assert sum(decoded) == 0  # refused on its length, before decoding any of it
    # Up to the limit, all of it is decoded: how long a reference may be is the engine's to say.
    audio, rate = decode_audio(silence(MAX_DECODED_SECONDS, RATE, channels=2))
    assert (rate, audio.shape) == (RATE, (MAX_DECODED_SECONDS * RATE,)) and decoded == [MAX_DECODED_SECONDS * RATE]
    assert MAX_DECODED_SECONDS * RATE * 2 <= MAX_DECODED_SAMPLES


def streamed_wav(seconds: float, size: int) -> bytes:
    """A 16-bit WAV as a stream writes it: ``size`` (0 or 0xFFFFFFFF, "length unknown")
    where its RIFF and data chunks' sizes should be."""
    wav = bytearray(reference_wav(seconds))
    data = wav.index(b"data")
    wav[4:8] = wav[data + 4 : data + 8] = size.to_bytes(4, "little")
    return bytes(wav)


def streamed_flac(audio: np.ndarray, rate: int) -> bytes:
    """A FLAC as Voxwire's own FLAC output streams it: STREAMINFO says 0 samples (unknown)."""
    from voxwire.server.codecs import CompressedEncoder

    encoder = CompressedEncoder("flac", rate)
    return encoder.push(audio) + encoder.finish()


@pytest.mark.parametrize("size", [0, 0xFFFFFFFF])
def test_a_streamed_wav_whose_header_gives_no_length_is_measured_from_its_data(size):
    heard, _ = decode_audio(reference_wav(2.0))
    audio, rate = decode_audio(streamed_wav(2.0, size))
    assert rate == RATE and np.array_equal(audio, heard)  # every sample, none invented
    with pytest.raises(EngineError) as e:
        decode_audio(streamed_wav(70.0, size))
    assert e.value.code == "audio_too_long"
    assert "holds 70.0 s of audio" in e.value.message and f"at most {MAX_DECODED_SECONDS} s" in e.value.message


def test_a_streamed_flac_whose_header_gives_no_length_is_decoded_up_to_the_limit(decoded):
    reference, _ = decode_audio(reference_wav(2.0))
    with soundfile.SoundFile(io.BytesIO(streamed_flac(reference, RATE))) as f:
        assert f.frames == voices.UNKNOWN_FRAMES  # what libsndfile makes of its header
    audio, rate = decode_audio(streamed_flac(reference, RATE))
    assert rate == RATE and audio.size == reference.size and np.abs(audio - reference).max() < 1e-3
    decoded.clear()  # what follows: decoded no further than it takes to know
    with pytest.raises(EngineError) as e:
        decode_audio(streamed_flac(np.zeros(RATE * (MAX_DECODED_SECONDS + 30), np.float32), RATE))
    assert e.value.code == "audio_too_long"
    assert f"holds more than {MAX_DECODED_SECONDS:.1f} s of audio" in e.value.message, e.value.message
    assert decoded == [MAX_DECODED_SECONDS * RATE + 1]  # decoded no further than it takes to know


async def test_a_streamed_wav_registers_and_a_long_one_is_refused_with_its_length(cosyvoice_server):
    registered = await register(cosyvoice_server, streamed_wav(3.0, 0), name="streamed")
    assert registered.status_code == 201, registered.json()
    refused = await register(cosyvoice_server, streamed_wav(70.0, 0xFFFFFFFF), name="too-long")
    assert (refused.status_code, refused.json()["error"]["code"]) == (400, "audio_too_long")
    assert "70.0 s" in refused.json()["error"]["message"]


async def test_decoding_an_upload_leaves_the_event_loop_to_everyone_else(cosyvoice_server, monkeypatch):
    decoding, release = threading.Event(), threading.Event()

    def held(data: bytes) -> tuple[np.ndarray, int]:
        decoding.set()
        release.wait(120)  # bounded: a failing test never holds the server for good
        return decode_audio(data)

    monkeypatch.setattr(voices, "decode_audio", held)
    upload = asyncio.create_task(register(cosyvoice_server, reference_wav(f0=260), name="held"))
    try:
        assert await asyncio.to_thread(decoding.wait, 120)
        # While an upload decodes, the server answers everyone else.
        async with httpx.AsyncClient(base_url=cosyvoice_server.http, timeout=20) as http:
            listed = await http.get("/v1/voices")
        assert listed.status_code == 200 and "held" not in [v["name"] for v in listed.json()["voices"]]
    finally:
        release.set()
    registered = await upload
    assert registered.status_code == 201 and registered.json()["name"] == "held"


async def test_one_registry_no_voice_yet_then_exactly_one_201(tmp_path):
    import orjson
    import websockets

    from voxwire.engine.cosyvoice2.tiny import make_tiny_model_dir
    from voxwire.engine.registry import EngineOptions
    from voxwire.server.config import ServerConfig
    from tests.conftest import run_server

    options = EngineOptions(
        name="cosyvoice2", model_dir=make_tiny_model_dir(tmp_path / "model"), voices_dir=tmp_path / "voices",
        extra={"cpu_threads": 1, "seed": 0},
    )
    with run_server(ServerConfig(engine=options, cache_mb=0)) as s:
        async with websockets.connect(s.ws) as ws:
            ready = orjson.loads(await ws.recv())
            assert ready["defaults"]["voice"] is None and ready["voices"] == []
            await ws.send(orjson.dumps({"type": "config", "sample_rate": 16000}).decode())
            assert orjson.loads(await ws.recv())["type"] == "configured"  # no voice needed for that
            await ws.send(orjson.dumps({"type": "speak", "ctx": "a", "text": "Hi."}).decode())
            error = orjson.loads(await ws.recv())
            assert error["code"] == "no_voice" and "POST /v1/voices" in error["message"]
        async with httpx.AsyncClient(base_url=s.http, timeout=60) as http:
            r = await http.post("/v1/audio/speech", json={"model": "m", "input": "Hi.", "voice": "alloy"})
            assert r.status_code == 400 and r.json()["error"]["code"] == "no_voice"

        answers = await asyncio.gather(*(register(s, reference_wav(), name="same") for _ in range(8)))
        assert sorted(r.status_code for r in answers) == [200] * 7 + [201]
        assert len({r.json()["id"] for r in answers}) == 1
        assert [r.json()["cached"] for r in answers].count(False) == 1
        renamed = await register(s, reference_wav(), name="another name")
        assert renamed.status_code == 409 and renamed.json()["error"]["code"] == "voice_exists"
        voice_id = answers[0].json()["id"]
        async with httpx.AsyncClient(base_url=s.http, timeout=60) as http:
            listed = (await http.get("/v1/voices")).json()
        assert listed["default"] == voice_id and [v["name"] for v in listed["voices"]] == ["same"]
        async with websockets.connect(s.ws) as ws:
            assert orjson.loads(await ws.recv())["defaults"]["voice"] == voice_id  # picked up without a restart


async def test_the_voice_list_and_ready_name_each_voices_speakers(speakers_server):
    async with httpx.AsyncClient(base_url=speakers_server.http, timeout=30) as http:
        listed = (await http.get("/v1/voices")).json()
    async with await Client.connect(speakers_server.ws) as client:
        ready = client.ready
    for voices in (listed["voices"], ready["voices"]):
        # At their speaker ids, which protocol v1 also takes; a one-speaker voice lists none.
        assert {v["id"]: v["speakers"] for v in voices} == {"tone": [], "chorus": ["alice", "bob", "carol"]}
