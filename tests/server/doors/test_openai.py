"""``POST /v1/audio/speech`` with the real OpenAI SDK pointed at a real server."""

from __future__ import annotations

import base64
import io
import logging
import re
import socket
import time
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import orjson
import pytest
import soundfile

from voxwire.engine.base import Engine, Voice
from voxwire.server.doors import openai as openai_speech
from voxwire.server.doors.openai import voices as openai_voices
from voxwire.server.config import AuthConfig, ServerConfig
from tests.conftest import run_server
from tests.fixtures.engines import SpeakersToneEngine, dominant_pitches, speaker_pitch
from tests.fixtures.g711 import reference_levels
from tests.server.codec_checks import decode
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
        ({"voice": {"name": "joe"}}, "invalid_voice", "voice"),
        ({"response_format": "ogg"}, "invalid_format", "response_format"),
        ({"speed": 5.0}, "invalid_speed", "speed"),
        ({"speed": 0.2}, "invalid_speed", "speed"),
        # Inside OpenAI's 0.25-4.0 but outside what the engines speak: said so, not clamped.
        ({"speed": 0.25}, "unsupported_speed", "speed"),
        ({"speed": 3.0}, "unsupported_speed", "speed"),
        ({"input": ""}, "missing_field", "input"),
        ({"model": ""}, "missing_field", "model"),
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


def _post(server, **fields) -> httpx.Response:
    body = {"model": "tts-1", "voice": "joe", "input": "Hi there.", "response_format": "pcm", **fields}
    return httpx.post(f"{server.http}/v1/audio/speech", json=body, timeout=60)


def _error(r: httpx.Response) -> dict:
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    return error


@pytest.mark.parametrize(
    "fields",
    [
        # OpenAI's newer voices speak with the default voice, as the older ones do.
        {"voice": "marin"},
        {"voice": "cedar"},
        # OpenAI's voice object, its form for custom voices: the id is the voice.
        {"voice": {"id": "joe"}},
        {"voice": {"id": "alloy"}},
        # null is how many clients leave an optional field unset.
        {"response_format": None, "speed": None, "instructions": None, "stream_format": None},
        {"stream_format": "audio"},
        # Taken and ignored: the engine has no instruction-following model.
        {"instructions": "Speak in a cheerful tone."},
        # Any model name: the loaded engine speaks.
        {"model": "gpt-4o-mini-tts-2025-12-15"},
        {"model": "piper"},
        {"speed": 2.0},
    ],
)
def test_what_openai_accepts_is_spoken(piper_server, fields):
    r = _post(piper_server, **fields)
    assert r.status_code == 200, r.text
    # null is OpenAI's default: mp3.
    mp3 = fields.get("response_format", "pcm") is None
    assert r.headers["content-type"] == ("audio/mpeg" if mp3 else "audio/pcm")
    assert len(r.content) > (2000 if mp3 else 4800)  # at least 0.1 s of 16-bit audio, or 0.25 s of mp3


def test_unsupported_speeds_name_the_range_this_server_speaks(piper_server):
    error = _error(_post(piper_server, speed=3.0))
    assert (error["code"], error["param"]) == ("unsupported_speed", "speed")
    assert "0.5 to 2.0" in error["message"]


@pytest.mark.parametrize(
    "fields,code,param",
    [
        # Wrong types get a plain 400, not a crash, and no Python names in the message.
        ({"response_format": ["wav"]}, "invalid_format", "response_format"),
        ({"speed": "fast"}, "invalid_speed", "speed"),
        ({"speed": True}, "invalid_speed", "speed"),
        ({"instructions": 42}, "invalid_instructions", "instructions"),
        ({"voice": {"id": 7}}, "invalid_voice", "voice"),
        ({"voice": None}, "missing_field", "voice"),
        ({"model": 1}, "missing_field", "model"),
        ({"stream_format": 1}, "invalid_stream_format", "stream_format"),
        ({"stream_format": "events"}, "invalid_stream_format", "stream_format"),
    ],
)
def test_wrong_values_are_refused_plainly(piper_server, fields, code, param):
    error = _error(_post(piper_server, **fields))
    assert (error["code"], error["param"]) == (code, param)
    # A wrong type gets a 400 (not a crash) whose message a person can act on: no Python.
    assert not re.search(r"\b(list|int|bool|str|dict|None|NoneType|True|False)\b|\[", error["message"]), error


@pytest.fixture
def server_log(caplog) -> Iterator[pytest.LogCaptureFixture]:
    """Every record the in-process test server logs, at INFO and above. uvicorn's own
    loggers do not propagate to the root logger, where caplog listens, so its handler is
    added to them too: that is where "Exception in ASGI application" goes."""
    caplog.set_level(logging.INFO)
    uvicorn_log = logging.getLogger("uvicorn.error")
    uvicorn_log.addHandler(caplog.handler)
    try:
        yield caplog
    finally:
        uvicorn_log.removeHandler(caplog.handler)


def hang_up_mid_body(server, path: str, content_type: str, partial: bytes) -> None:
    """A raw request that promises more body than it sends, then closes the connection."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {server.host}:{server.port}\r\n"
        f"Content-Type: {content_type}\r\nContent-Length: {len(partial) + 10_000}\r\n\r\n"
    )
    with socket.create_connection((server.host, server.port), timeout=30) as s:
        s.sendall(head.encode() + partial)


def wait_for_disconnect_record(log: pytest.LogCaptureFixture) -> None:
    """Until the server has logged something about the hang-up: its INFO line, or uvicorn's error."""
    for _ in range(1000):
        if any("disconnect" in r.getMessage() or r.levelno >= logging.ERROR for r in log.records):
            return
        time.sleep(0.01)


def disconnect_records(log: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """Every record at INFO or above since the test began."""
    return [r for r in log.records if r.levelno >= logging.INFO]


def assert_logged_as_ordinary(records: list[logging.LogRecord]) -> None:
    assert not [r for r in records if r.levelno >= logging.ERROR or r.exc_info], [r.getMessage() for r in records]
    lines = [r for r in records if "disconnected before sending the whole request body" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO


def test_a_client_that_hangs_up_mid_body_is_an_ordinary_event(piper_server, server_log):
    hang_up_mid_body(piper_server, "/v1/audio/speech", "application/json", b'{"model": "tts-1", "inp')
    wait_for_disconnect_record(server_log)
    r = _post(piper_server)  # and the server goes on serving
    assert r.status_code == 200 and len(r.content) > 4800
    # Checked after the next request, so that a traceback logged just after the line is seen too.
    assert_logged_as_ordinary(disconnect_records(server_log))


SPEECH = {"model": "tts-1", "voice": "joe", "input": "Hi there.", "response_format": "pcm"}


@pytest.mark.parametrize(
    "content_type,sent",
    [
        ("text/plain", "'text/plain'"),
        ("application/x-www-form-urlencoded", "'application/x-www-form-urlencoded'"),  # what curl -d sends
        ("multipart/form-data; boundary=x", "'multipart/form-data'"),
        (None, "no Content-Type"),
    ],
)
def test_only_json_is_parsed_and_the_refusal_says_what_to_send(piper_server, content_type, sent):
    headers = {} if content_type is None else {"content-type": content_type}
    r = httpx.post(f"{piper_server.http}/v1/audio/speech", content=orjson.dumps(SPEECH), headers=headers, timeout=60)
    assert r.status_code == 415, (r.status_code, r.headers["content-type"])
    error = r.json()["error"]
    assert (error["code"], error["type"], error["param"]) == ("unsupported_media_type", "invalid_request_error", None)
    assert "Content-Type: application/json" in error["message"] and sent in error["message"]
    assert "connection" not in r.headers  # a body this small is read and dropped: the connection stays


@pytest.mark.parametrize("content_type", ["application/json; charset=utf-8", "Application/JSON"])
def test_json_with_parameters_or_in_any_case_is_json(piper_server, content_type):
    r = httpx.post(f"{piper_server.http}/v1/audio/speech", content=orjson.dumps(SPEECH), headers={"content-type": content_type}, timeout=60)
    assert r.status_code == 200 and r.headers["content-type"] == "audio/pcm" and len(r.content) > 4800, r.text


def padded_request(size: int) -> Iterator[bytes]:
    """A valid request with one ignored field that makes its body ``size`` bytes longer."""
    yield orjson.dumps(SPEECH)[:-1] + b', "padding": "'
    for _ in range(size // 65536):
        yield b"x" * 65536
    yield b'"}'


@pytest.mark.parametrize("declared", [False, True], ids=["chunked", "content-length"])
def test_a_body_over_the_bound_gets_413_and_a_keep_alive_client_goes_on(piper_server, declared):
    # Far past the bound, and past what uvicorn reads ahead of the route (a 64 KiB buffer
    # and one read of up to 256 KiB), so the rest is surely left unread.
    size = 4 * 1024 * 1024
    headers = {"content-type": "application/json"}
    if declared:
        headers["content-length"] = str(sum(map(len, padded_request(size))))
    with httpx.Client(base_url=piper_server.http, timeout=60) as http:
        r = http.post("/v1/audio/speech", content=padded_request(size), headers=headers)
        assert r.status_code == 413, (r.status_code, r.headers["content-type"])
        error = r.json()["error"]
        assert (error["code"], error["type"]) == ("request_too_large", "invalid_request_error")
        assert "128 KiB" in error["message"] and "4096 characters" in error["message"]
        # The rest of the body was never read: the server says it closes, so the client
        # does not send its next request down a connection that still carries this body.
        assert r.headers["connection"] == "close"
        again = http.post("/v1/audio/speech", json=SPEECH)
        assert again.status_code == 200 and len(again.content) > 4800


def test_the_largest_body_the_fields_allow_is_within_the_bound(piper_server):
    """4096 characters of input, each one beyond the BMP and written as escapes, and as
    much of instructions: read and parsed whole. The speed is wrong on purpose, so the
    answer is about the fields (the body was parsed), without minutes of synthesis."""
    escaped = "\\ud83d\\ude00" * openai_speech.MAX_INPUT_CHARS  # 12 bytes of JSON a character
    body = (
        '{"model": "gpt-4o-mini-tts", "voice": {"id": "joe"}, "response_format": "pcm", "speed": 5.0, '
        f'"input": "{escaped}", "instructions": "{escaped}"}}'
    ).encode()
    assert len(orjson.loads(body)["input"]) == openai_speech.MAX_INPUT_CHARS
    assert len(body) <= openai_speech.MAX_BODY_BYTES
    error = _error(httpx.post(f"{piper_server.http}/v1/audio/speech", content=body, headers={"content-type": "application/json"}, timeout=60))
    assert (error["code"], error["param"]) == ("invalid_speed", "speed")


# -- a multi-speaker voice's speaker: "VOICE:SPEAKER" -------------------------------------------


SPEAKER_WORDS = ("golf", "hotel", "india")


def _pitches(r: httpx.Response) -> list[float]:
    assert r.status_code == 200, r.text
    return dominant_pitches(np.frombuffer(r.content, "<i2").astype(np.float32) / 32767, 24000)


@pytest.mark.parametrize(
    "voice, speaker_id",
    [
        ("chorus:bob", 1),
        ("chorus:2", 2),  # its id
        ({"id": "chorus:carol"}, 2),  # inside OpenAI's voice object
        ("chorus", 0),  # none named: the voice's default speaker
    ],
)
def test_voice_colon_speaker_speaks_that_speaker(speakers_server, voice, speaker_id):
    r = _post(speakers_server, voice=voice, input=" ".join(SPEAKER_WORDS) + ".")
    assert _pitches(r) == pytest.approx([speaker_pitch(w, speaker_id) for w in SPEAKER_WORDS], abs=15)


@pytest.mark.parametrize(
    "voice, said",
    [
        ("chorus:dave", "alice, bob, carol"),
        ("chorus:3", "0 to 2"),
        ("chorus:", "no speaker ''"),
        ("tone:alice", "one speaker"),
        ({"id": "tone:0"}, "one speaker"),
    ],
)
def test_an_unknown_speaker_is_a_400_about_the_voice(speakers_server, voice, said):
    error = _error(_post(speakers_server, voice=voice))
    assert (error["code"], error["param"]) == ("unknown_speaker", "voice")
    assert said in error["message"]


def test_an_unknown_voice_before_the_colon_is_an_unknown_voice(speakers_server):
    error = _error(_post(speakers_server, voice="nobody:bob"))
    assert (error["code"], error["param"]) == ("unknown_voice", "voice") and "'nobody'" in error["message"]


class _ColonVoices(Engine):
    name = "colons"
    sample_rate = 16000

    def voices(self) -> list[Voice]:
        return [Voice(id="en:narrow", name="", language="en", sample_rate=16000, speakers=("a", "b"))]


@pytest.mark.parametrize(
    "requested, split",
    [
        ("en:narrow", ("en:narrow", None)),  # a voice's own id, ':' and all, is that voice
        ("en:narrow:b", ("en:narrow", "b")),  # else the first ':' ends the voice
        ("en:wide", ("en", "wide")),
        ("joe", ("joe", None)),
        ("alloy:a", ("alloy", "a")),  # an OpenAI name is mapped afterwards, the speaker kept
    ],
)
def test_a_voice_id_with_a_colon_is_that_voice(requested, split):
    assert openai_voices.split_speaker(_ColonVoices(), requested) == split


# -- stream_format "sse": the audio inside OpenAI's events ----------------------------------------


def sse_events(r: httpx.Response) -> list[dict]:
    """The events of a text/event-stream body, each a ``data:`` line and a blank one."""
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    blocks = r.text.split("\n\n")
    assert blocks[-1] == ""  # the body ends with a whole event
    events = []
    for block in blocks[:-1]:
        assert block.startswith("data: ") and "\n" not in block, block
        events.append(orjson.loads(block[len("data: "):]))
    return events


def sse_audio(events: list[dict]) -> bytes:
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert events[-1]["type"] == "speech.audio.done" and len(deltas) == len(events) - 1
    return b"".join(base64.b64decode(e["audio"]) for e in deltas)


@pytest.mark.parametrize("fmt", ["pcm", "wav", "mp3", "opus", "aac", "flac"])
def test_sse_carries_every_format_openai_allows(piper_server, fmt):
    text = SENTENCE + " And then it ran away."
    events = sse_events(_post(piper_server, input=text, response_format=fmt, stream_format="sse"))
    assert len(events) > 4  # streamed in many events, not one
    audio, done = sse_audio(events), events[-1]
    if fmt == "pcm":
        samples, rate = np.frombuffer(audio, "<i2").astype(np.float32) / 32767, 24000
    elif fmt == "wav":
        samples, rate = soundfile.read(io.BytesIO(audio), dtype="float32")
    else:
        samples, rate, _, _ = decode(audio)
    assert rate == (48000 if fmt == "opus" else 24000)
    assert_speech(samples, rate, words=14)
    # The figures are the socket's done's, and they count the audio the events carried.
    assert done["voxwire"]["bytes"] == len(audio) - (len(openai_speech.wav_header(24000)) if fmt == "wav" else 0)
    if fmt in ("pcm", "wav"):
        assert done["voxwire"]["samples"] == samples.size
    usage = done["usage"]
    assert usage["input_tokens"] == len(text)
    assert usage["output_tokens"] == round(done["voxwire"]["audio_ms"]) > 2000
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_sse_names_the_audios_own_type_and_asks_proxies_not_to_buffer(piper_server):
    r = _post(piper_server, response_format="mp3", stream_format="sse")
    assert r.headers["x-audio-media-type"] == "audio/mpeg" and r.headers["x-accel-buffering"] == "no"
    assert r.headers["cache-control"] == "no-cache"
    plain = _post(piper_server, response_format="mp3")
    assert plain.headers["content-type"] == "audio/mpeg" and "x-audio-media-type" not in plain.headers


def test_the_sdk_reads_both_stream_formats(sdk):
    with sdk.audio.speech.with_streaming_response.create(
        model="gpt-4o-mini-tts", voice="alloy", input=SENTENCE, response_format="pcm", stream_format="sse",
    ) as r:
        lines = [line for line in r.iter_lines() if line]
    events = [orjson.loads(line.removeprefix("data: ")) for line in lines]
    from_events = np.frombuffer(sse_audio(events), "<i2").astype(np.float32) / 32767
    body = np.frombuffer(_body(sdk, SENTENCE, voice="alloy", response_format="pcm"), "<i2").astype(np.float32) / 32767
    assert_speech(from_events, 24000, words=9)
    # Piper's noise differs between two utterances, but not their length by much.
    assert abs(from_events.size - body.size) < 0.15 * body.size


def test_a_client_that_leaves_an_sse_stream_frees_its_slot(piper_server):
    admission = piper_server.service.admission
    body = {"model": "gpt-4o-mini-tts", "voice": "joe", "input": SENTENCE * 8, "response_format": "pcm",
            "stream_format": "sse"}
    with httpx.stream("POST", f"{piper_server.http}/v1/audio/speech", json=body, timeout=60) as r:
        first = next(r.iter_lines())
        assert orjson.loads(first.removeprefix("data: "))["type"] == "speech.audio.delta"
    for _ in range(500):
        if admission.utterances == 0 and piper_server.service.worker.active == 0:
            break
        time.sleep(0.01)
    assert admission.utterances == 0 and piper_server.service.worker.active == 0


@pytest.fixture(scope="module")
def mapped_server() -> Iterator:
    """The tone engine ("tone", and "chorus" with three speakers), OpenAI's names mapped."""
    config = ServerConfig(cache_mb=0, openai_voices=("nova=chorus:bob", "shimmer=chorus:2", "narrator=chorus"))
    engine = SpeakersToneEngine()
    with run_server(config, engine=lambda: engine) as s:
        s.engine = engine
        yield s


def test_a_failure_mid_sse_is_an_error_event_and_a_cut_body(mapped_server):
    body = {"model": "m", "voice": "tone", "input": "alpha beta gamma explode delta.", "response_format": "pcm",
            "stream_format": "sse"}
    blocks = []
    with pytest.raises(httpx.RemoteProtocolError):  # the body ends without its last chunk
        with httpx.stream("POST", f"{mapped_server.http}/v1/audio/speech", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line:
                    blocks.append(orjson.loads(line.removeprefix("data: ")))
    assert [b["type"] for b in blocks][-1] == "error"
    error = blocks[-1]["error"]
    assert error["code"] == "engine_error" and error["type"] == "server_error" and error["message"]
    assert all(b["type"] == "speech.audio.delta" for b in blocks[:-1])


@pytest.mark.parametrize(
    "voice, speaker_id",
    [
        ("nova", 1),  # mapped to a speaker
        ("shimmer", 2),  # to a speaker by its id
        ("narrator", 0),  # any name may be mapped: here to a voice, its default speaker
        ("chorus:bob", 1),  # the engine's own names still work
    ],
)
def test_the_voice_map_speaks_each_name_with_its_voice(mapped_server, voice, speaker_id):
    r = _post(mapped_server, voice=voice, input=" ".join(SPEAKER_WORDS) + ".")
    assert _pitches(r) == pytest.approx([speaker_pitch(w, speaker_id) for w in SPEAKER_WORDS], abs=15)


def test_an_openai_name_left_unmapped_speaks_with_the_default_voice(mapped_server):
    r = _post(mapped_server, voice="alloy", input=" ".join(SPEAKER_WORDS) + ".")
    # "tone" is the default: the one-speaker pitches, which are chorus's speaker 0's.
    assert _pitches(r) == pytest.approx([speaker_pitch(w, 0) for w in SPEAKER_WORDS], abs=15)
    assert mapped_server.engine.spoken[-1] == ("tone", None)


# -- G.711 and sample_rate: beyond OpenAI's formats, for telephony ------------------------------


@pytest.mark.parametrize("law, content_type", [("mulaw", "audio/PCMU"), ("alaw", "audio/PCMA")])
@pytest.mark.parametrize("rate", [None, 8000, 16000])
@pytest.mark.parametrize("stream_format", ["audio", "sse"])
def test_g711_at_telephonys_rate_unless_asked(piper_server, law, content_type, rate, stream_format):
    fields = {"response_format": law, "stream_format": stream_format} | ({"sample_rate": rate} if rate else {})
    r = _post(piper_server, input=SENTENCE, **fields)
    if stream_format == "sse":
        assert r.headers["x-audio-media-type"] == content_type
        codes = sse_audio(sse_events(r))
    else:
        assert r.status_code == 200 and r.headers["content-type"] == content_type
        codes = r.content
    audio = reference_levels(law)[np.frombuffer(codes, np.uint8)].astype(np.float32) / 32767
    assert_speech(audio, rate or 8000, words=9)


def test_sample_rate_sets_the_rate_of_pcm_and_of_a_wav_header(piper_server):
    pcm = {rate: _post(piper_server, input=SENTENCE, sample_rate=rate).content for rate in (16000, 48000)}
    ratio = len(pcm[48000]) / len(pcm[16000])
    assert 2.6 < ratio < 3.4  # the same speech at three times the rate (Piper's length varies a little)
    audio, rate = soundfile.read(io.BytesIO(_post(piper_server, response_format="wav", sample_rate=16000).content))
    assert rate == 16000
    assert_speech(audio.astype(np.float32), 16000, words=2)


@pytest.mark.parametrize(
    "fields, code",
    [
        ({"sample_rate": 7999}, "invalid_sample_rate"),
        ({"sample_rate": 16000.5}, "invalid_sample_rate"),
        ({"sample_rate": "16000"}, "invalid_sample_rate"),
        ({"sample_rate": True}, "invalid_sample_rate"),
        ({"response_format": "mp3", "sample_rate": 20000}, "unsupported_sample_rate"),
    ],
)
def test_a_sample_rate_out_of_reach_is_refused_naming_it(piper_server, fields, code):
    error = _error(_post(piper_server, **fields))
    assert (error["code"], error["param"]) == (code, "sample_rate") and error["message"]
