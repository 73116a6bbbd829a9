"""A real server with three real Piper voices of two rates, one multi-speaker and one
German (made by piper-tts's training code, tests/fixtures/piper_voices.py), speaks each
voice and speaker as piper-tts itself does, on every door: protocol v1, the OpenAI route
and Wyoming; a Hebrew voice through piper-tts's own Hebrew phonemizer; a folder of
voices; and more voices than stay loaded (--piper-loaded-voices)."""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgpack
import numpy as np
import orjson
import pytest
from wyoming.client import AsyncTcpClient
from wyoming.info import Describe, Info
from wyoming.tts import Synthesize, SynthesizeVoice

from voxwire.engine.registry import EngineOptions, preflight
from voxwire_client import Client, ServerError
from voxwire.server.config import ServerConfig
from tests.conftest import RunningServer, run_server
from tests.server.doors.test_wyoming import hear, port, read
from tests.server.test_pipeline import speak_v1

import websockets

TEXT = "The museum opens at nine, and the tours start at ten."
SPEAKERS = ("alice", "bob", "carol", "dave")
RATE = 22050  # the multi-speaker voice's, the server's default
X_LOW_RATE = 16000


@pytest.fixture(scope="module")
def quiet_voices(reference_voices, tmp_path_factory) -> dict[str, Path]:
    """The four-speaker reference voice and the x_low one, their noise off: then each
    speaker's audio is a function of the text alone, and can be compared with Piper's."""
    folder = tmp_path_factory.mktemp("quiet-voices")
    out = {}
    for name in ("speakers", "x_low", "german"):
        model = folder / f"{name}.onnx"
        shutil.copy(reference_voices[name], model)
        config = json.loads(Path(f"{reference_voices[name]}.json").read_text(encoding="utf-8"))
        config["inference"] = {"noise_scale": 0.0, "length_scale": 1.0, "noise_w": 0.0}
        Path(f"{model}.json").write_text(json.dumps(config), encoding="utf-8")
        out[name] = model
    return out


@pytest.fixture(scope="module")
def server(quiet_voices) -> Iterator[RunningServer]:
    options = EngineOptions(name="piper", piper_voices=tuple(quiet_voices.values()), precision="fp32")
    with run_server(ServerConfig(engine=options, cache_mb=0, wyoming_port=0, step_timeout=300)) as s:
        yield s


def said_by_piper(model: Path, speaker_ids: list[int | None], text: str = TEXT) -> dict[int | None, np.ndarray]:
    """piper-tts's own audio of ``text``, for each speaker id."""
    from piper import PiperVoice
    from piper.config import SynthesisConfig

    piper = PiperVoice.load(model)
    out = {}
    for sid in speaker_ids:
        syn = SynthesisConfig(speaker_id=sid, noise_scale=0.0, noise_w_scale=0.0, length_scale=1.0)
        out[sid] = np.concatenate([
            np.asarray(piper.phoneme_ids_to_audio(piper.phonemes_to_ids(p), syn), dtype=np.float32).reshape(-1)
            for p in piper.phonemize(text)
        ])
    return out


@pytest.fixture(scope="module")
def piper_says(quiet_voices) -> dict[int | None, np.ndarray]:
    return said_by_piper(quiet_voices["speakers"], list(range(len(SPEAKERS))))


@pytest.fixture(scope="module")
def x_low_says(quiet_voices) -> np.ndarray:
    return said_by_piper(quiet_voices["x_low"], [None])[None]


def likeness(a: np.ndarray, b: np.ndarray) -> float:
    """SNR in dB of ``a`` against ``b`` over their common length, after the one gain that
    fits best: the server scales each voice by a gain of its own."""
    n = min(a.size, b.size)
    a, b = a[:n].astype(np.float64), b[:n].astype(np.float64)
    fitted = b * (a @ b) / (b @ b)
    return float(10 * np.log10((a @ a) / max(((a - fitted) ** 2).sum(), 1e-30)))


def whose(audio: np.ndarray, piper_says: dict[int | None, np.ndarray]) -> int | None:
    """The speaker id whose Piper audio ``audio`` is, asserting it is that one's and no
    other's. Random-weight speakers differ by little (14-20 dB apart, measured), the same
    one through 16-bit PCM by far less."""
    scores = {sid: likeness(audio, ref) for sid, ref in piper_says.items()}
    best = max(scores, key=lambda sid: scores[sid])
    assert scores[best] > 40.0, scores
    assert abs(audio.size - piper_says[best].size) <= 256, (audio.size, piper_says[best].size)
    assert all(s < 30.0 for sid, s in scores.items() if sid != best), scores
    return best


@pytest.mark.parametrize("settings, speaker_id", [({"speaker": "bob"}, 1), ({"speaker": 3}, 3), ({}, 0)])
async def test_protocol_v1_speaks_each_speaker_as_piper_does(server, piper_says, settings, speaker_id):
    async with websockets.connect(server.ws) as ws:
        await ws.recv()  # ready
        events, audio = await speak_v1(ws, "u1", TEXT, voice="speakers", sample_rate=RATE, **settings)
        refused, _ = await speak_v1(ws, "u2", TEXT, voice="speakers", sample_rate=RATE, speaker="erin")
    assert events[-1]["type"] == "done"
    assert whose(audio, piper_says) == speaker_id
    assert refused[0]["code"] == "unknown_speaker"


async def test_the_voice_list_names_the_speakers(server):
    async with httpx.AsyncClient() as http:
        listed = (await http.get(f"{server.http}/v1/voices")).json()["voices"]
    assert [(v["id"], v["speakers"], v["sample_rate"]) for v in listed] == [
        ("speakers", list(SPEAKERS), RATE), ("x_low", [], X_LOW_RATE), ("german", [], X_LOW_RATE)]


async def test_the_openai_route_speaks_voice_colon_speaker(server, piper_says):
    async with httpx.AsyncClient(timeout=120) as http:
        answers = {
            speaker: await http.post(f"{server.http}/v1/audio/speech", json={
                "model": "tts-1", "input": TEXT, "voice": f"speakers:{speaker}", "response_format": "pcm"})
            for speaker in ("carol", "0")
        }
        unknown = await http.post(f"{server.http}/v1/audio/speech", json={
            "model": "tts-1", "input": TEXT, "voice": "speakers:erin", "response_format": "pcm"})
    carol, alice = (np.frombuffer(answers[s].content, "<i2").astype(np.float32) / 32767 for s in ("carol", "0"))
    # OpenAI's pcm is 24 kHz: the voice's 22.05 kHz resampled, so lengths, not samples, compare.
    for audio, sid in ((carol, 2), (alice, 0)):
        assert audio.size == pytest.approx(piper_says[sid].size * 24000 / RATE, rel=0.02)
        assert np.abs(audio).max() > 0.05
    assert likeness(carol, alice) < 30.0
    assert unknown.status_code == 400
    assert unknown.json()["error"]["code"] == "unknown_speaker"


async def test_wyoming_lists_and_speaks_each_speaker(server, piper_says):
    async with AsyncTcpClient("127.0.0.1", port(server)) as client:
        await client.write_event(Describe().event())
        (program,) = Info.from_event(await read(client)).tts
    assert [s.name for s in program.voices[0].speakers or []] == list(SPEAKERS)
    assert program.voices[1].name == "x_low" and program.voices[1].speakers is None
    for speaker, sid in (("dave", 3), ("1", 1)):
        async with AsyncTcpClient("127.0.0.1", port(server)) as client:
            await client.write_event(Synthesize(text=TEXT, voice=SynthesizeVoice(name="speakers", speaker=speaker)).event())
            heard = await hear(client)
        assert heard.start is not None and heard.start.rate == RATE
        assert whose(heard.audio, piper_says) == sid


async def test_two_voices_of_two_rates_speak_at_once_each_as_piper_does(server, piper_says, x_low_says):
    """On one socket, an utterance of each voice at the same time; the 16 kHz voice asked
    at its own rate, and at the server's default (22.05 kHz: resampled)."""
    async with websockets.connect(server.ws) as ws:
        await ws.recv()  # ready
        asked = {"a": {"voice": "speakers", "speaker": "bob", "sample_rate": RATE},
                 "b": {"voice": "x_low", "sample_rate": X_LOW_RATE}}
        for ctx, settings in asked.items():
            await ws.send(orjson.dumps({"type": "speak", "ctx": ctx, "text": TEXT, "format": "pcm_s16le", **settings}).decode())
        pcm, started, ended = {"a": b"", "b": b""}, {}, {}
        while len(ended) < 2:
            m = await asyncio.wait_for(ws.recv(), 60)
            if isinstance(m, bytes):
                frame = msgpack.unpackb(m)
                pcm[frame["ctx"]] += frame["audio"]
                continue
            event = orjson.loads(m)
            if event["type"] == "started":
                started[event["ctx"]] = time.monotonic()
            elif event["type"] in ("done", "error"):
                assert event["type"] == "done", event
                ended[event["ctx"]] = time.monotonic()
        events, upsampled = await speak_v1(ws, "c", TEXT, voice="x_low", sample_rate=RATE)
    bob, x_low = (np.frombuffer(pcm[c], "<i2").astype(np.float32) / 32767 for c in "ab")
    assert max(started.values()) < min(ended.values())  # both were spoken at once
    assert whose(bob, piper_says) == 1
    assert whose(x_low, {None: x_low_says}) is None
    assert events[0]["sample_rate"] == RATE
    assert upsampled.size == pytest.approx(x_low_says.size * RATE / X_LOW_RATE, abs=RATE * 0.02)
    assert events[-1]["audio_ms"] == pytest.approx(1000 * x_low_says.size / X_LOW_RATE, abs=20)


async def test_wyoming_and_openai_speak_the_16_khz_voice_at_their_rates(server, x_low_says):
    async with AsyncTcpClient("127.0.0.1", port(server)) as client:
        await client.write_event(Synthesize(text=TEXT, voice=SynthesizeVoice(name="x_low")).event())
        heard = await hear(client)
    assert heard.start is not None and heard.start.rate == RATE  # the server's default rate
    assert heard.audio.size == pytest.approx(x_low_says.size * RATE / X_LOW_RATE, abs=RATE * 0.02)
    async with httpx.AsyncClient(timeout=120) as http:
        answer = await http.post(f"{server.http}/v1/audio/speech", json={
            "model": "tts-1", "input": TEXT, "voice": "x_low", "response_format": "pcm"})
    pcm = np.frombuffer(answer.content, "<i2")
    assert pcm.size == pytest.approx(x_low_says.size * 24000 / X_LOW_RATE, abs=24000 * 0.02)
    assert np.abs(pcm).max() > 0.05 * 32767


GERMAN = "Guten Tag! Das kostet 25 Euro, nicht 30. Um 9 Uhr geht es los."


async def test_a_german_voice_speaks_german_as_piper_does_with_no_english_normalisation(server, quiet_voices):
    """espeak-ng's "de" reads the numbers in German; nothing of Voxwire's rewrites the
    text in English first (had "25" become "twenty-five", the phonemes, and so the audio,
    would differ from piper-tts's). The segmenter cuts the three sentences, and each is
    spoken as piper-tts speaks it."""
    expected = said_by_piper(quiet_voices["german"], [None], GERMAN)[None]
    async with websockets.connect(server.ws) as ws:
        await ws.recv()  # ready
        events, audio = await speak_v1(ws, "de", GERMAN, voice="german", sample_rate=X_LOW_RATE)
    assert events[-1]["type"] == "done" and events[-1]["segments"] >= 3
    assert whose(audio, {None: expected}) is None


# -- a voice of another phonemizer: piper-tts's Hebrew --------------------------------------------

HEBREW = "שלום, מה שלומך היום? אני בסדר גמור."


@pytest.fixture(scope="module")
def hebrew_voice(tmp_path_factory) -> Path:
    """A random-weight voice whose config asks for piper-tts's Hebrew phonemizer (Nakdimon
    diacritics, then rules to IPA: it ships in the wheel and runs offline), noise off."""
    from tests.fixtures.piper_voices import make_voice

    model = make_voice(tmp_path_factory.mktemp("hebrew"), "hebrew", "low", espeak_voice="he", seed=4)
    config = json.loads(Path(f"{model}.json").read_text(encoding="utf-8"))
    config["phoneme_type"] = "hebrew"
    config["inference"] = {"noise_scale": 0.0, "length_scale": 1.0, "noise_w": 0.0}
    Path(f"{model}.json").write_text(json.dumps(config), encoding="utf-8")
    return model


async def test_a_hebrew_voice_speaks_each_sentence_as_piper_does_with_its_words_timed(hebrew_voice):
    """The config's phonemizer, not espeak-ng's, and no English normalisation: each of the
    segmenter's two sentences is what piper-tts says for it, and each written word is
    timed, in order, within the audio."""
    sentences = ["שלום, מה שלומך היום?", "אני בסדר גמור."]
    expected = np.concatenate([said_by_piper(hebrew_voice, [None], s)[None] for s in sentences])
    options = EngineOptions(name="piper", piper_voices=(hebrew_voice,), precision="fp32")
    with run_server(ServerConfig(engine=options, cache_mb=0, step_timeout=300)) as server:
        async with websockets.connect(server.ws) as ws:
            await ws.recv()  # ready
            events, audio = await speak_v1(ws, "he", HEBREW, voice="hebrew", sample_rate=X_LOW_RATE, timestamps=True)
    assert events[-1]["type"] == "done" and events[-1]["segments"] == 2
    # This voice's chunked decoding matches its whole-sentence audio less closely than the
    # other voices' (34-42 dB, by seed, in espeak-ng's German as in Hebrew): the same
    # length to the sample, and far above another text's likeness, say it is piper's.
    assert audio.size == expected.size and likeness(audio, expected) > 30.0
    words = [w for e in events if e["type"] == "timestamps" for w in e["words"]]
    assert [w["word"] for w in words] == [w.strip(",.?") for w in HEBREW.split()]
    starts = [w["start_ms"] for w in words]
    assert starts == sorted(starts) and words[-1]["end_ms"] <= 1000 * audio.size / X_LOW_RATE + 1


MANDARIN = "你好，世界。我们今天去公园吧！"


async def test_a_mandarin_voice_times_each_character_and_a_cancel_says_them_unspaced(tmp_path):
    """espeak-ng's "cmn", as Piper's zh_CN voices use it: the segmenter ends a sentence at
    "。", and each character is a written word (docs/protocol.md), timed in order within
    the audio; punctuation is none."""
    from tests.fixtures.piper_voices import make_voice

    model = make_voice(tmp_path, "mandarin", "low", espeak_voice="cmn", seed=5)
    options = EngineOptions(name="piper", piper_voices=(model,), precision="fp32")
    with run_server(ServerConfig(engine=options, cache_mb=0, step_timeout=300)) as server:
        async with websockets.connect(server.ws) as ws:
            await ws.recv()  # ready
            events, audio = await speak_v1(ws, "zh", MANDARIN, voice="mandarin", sample_rate=X_LOW_RATE,
                                           timestamps=True)
            # The words heard at a cancel are written back as the text has them: no spaces.
            await ws.send(orjson.dumps({"type": "speak", "ctx": "c", "text": MANDARIN * 20, "voice": "mandarin",
                                        "format": "pcm_s16le", "sample_rate": X_LOW_RATE,
                                        "timestamps": True}).decode())
            frames = 0
            while frames < 3:
                frames += isinstance(await asyncio.wait_for(ws.recv(), 60), bytes)
            await ws.send(orjson.dumps({"type": "cancel", "ctx": "c"}).decode())
            while (m := await asyncio.wait_for(ws.recv(), 60)) and (isinstance(m, bytes)
                                                                     or orjson.loads(m)["type"] != "cancelled"):
                pass
            cancelled = orjson.loads(m)
    assert cancelled["text_sent"] and " " not in cancelled["text_sent"], cancelled
    assert "".join(ch for ch in MANDARIN * 20 if ch not in "，。！").startswith(cancelled["text_sent"])
    assert events[-1]["type"] == "done" and events[-1]["segments"] == 2
    assert audio.size > 0.5 * X_LOW_RATE
    words = [w for e in events if e["type"] == "timestamps" for w in e["words"]]
    assert [w["word"] for w in words] == [ch for ch in MANDARIN if ch not in "，。！"]
    starts = [w["start_ms"] for w in words]
    assert starts == sorted(starts) and all(w["end_ms"] > w["start_ms"] for w in words)
    assert words[-1]["end_ms"] <= 1000 * audio.size / X_LOW_RATE + 1


# -- a folder of voices: --piper-voices-dir ------------------------------------------------------


@pytest.fixture(scope="module")
def folder_server(reference_voices, tmp_path_factory) -> Iterator[RunningServer]:
    """The reference voices' folder, with a model whose config is missing beside them."""
    folder = tmp_path_factory.mktemp("voices-dir")
    for name, model in reference_voices.items():
        (folder / f"{name}.onnx").symlink_to(model)
        (folder / f"{name}.onnx.json").symlink_to(f"{model}.json")
    (folder / "orphan.onnx").symlink_to(reference_voices["x_low"])
    options = EngineOptions(name="piper", piper_voices_dir=folder, precision="fp32")
    with run_server(ServerConfig(engine=options, cache_mb=0, step_timeout=300)) as s:
        yield s


async def test_a_voices_folder_lists_every_voice_with_its_quality_rate_and_speakers(folder_server):
    async with httpx.AsyncClient() as http:
        listed = (await http.get(f"{folder_server.http}/v1/voices")).json()
    assert [(v["id"], v["quality"], v["sample_rate"], v["speakers"], v["language"]) for v in listed["voices"]] == [
        ("german", "low", X_LOW_RATE, [], "de"),
        ("high", "high", RATE, ["p225", "p226"], "en-us"),
        ("speakers", "medium", RATE, list(SPEAKERS), "en-us"),
        ("x_low", "x_low", X_LOW_RATE, [], "en-us"),
    ]  # in the order of their names; orphan.onnx, without its config, left out
    assert listed["default"] == "german"


async def test_each_voice_of_a_folder_speaks_on_the_socket(folder_server):
    async with await Client.connect(folder_server.ws) as client:
        for voice, speaker in [("german", None), ("high", "p226"), ("speakers", "carol"), ("x_low", None)]:
            u = await client.speak("Hello there, how are you?", voice=voice, speaker=speaker, sample_rate=24000)
            frames, done = await u.collect()
            audio = np.concatenate([f.to_float32() for f in frames])
            assert done["type"] == "done" and audio.size == pytest.approx(done["audio_ms"] * 24, abs=24)
            assert np.abs(audio).max() > 0.01  # random weights: sound, not speech


def test_a_folder_without_voices_or_two_voices_of_one_name_are_refused(reference_voices, tmp_path):
    assert "no Piper voice" in preflight(EngineOptions(name="piper", piper_voices_dir=tmp_path))
    assert "folder not found" in preflight(EngineOptions(name="piper", piper_voices_dir=tmp_path / "missing"))
    twice = EngineOptions(name="piper", piper_voices=(reference_voices["x_low"],),
                          piper_voices_dir=reference_voices["x_low"].parent)
    assert "two Piper voices are named 'x_low'" in preflight(twice)


# -- more voices than stay loaded: --piper-loaded-voices ----------------------------------------


@pytest.fixture(scope="module")
def lazy_server(quiet_voices, tmp_path_factory) -> Iterator[RunningServer]:
    """The quiet voices and one whose model cannot be read, with one voice loaded at a
    time: the first at start, each other when first asked for. Each load's voice and
    thread are recorded in ``loads``."""
    broken = tmp_path_factory.mktemp("broken-voice") / "broken.onnx"
    broken.write_bytes(b"not an ONNX model")
    shutil.copy(f"{quiet_voices['x_low']}.json", f"{broken}.json")
    options = EngineOptions(name="piper", piper_voices=(*quiet_voices.values(), broken), precision="fp32",
                            piper_loaded_voices=1)
    with run_server(ServerConfig(engine=options, cache_mb=0, step_timeout=300)) as s:
        engine = s.service.worker.loaded_engine()
        load = engine.load_voice
        s.loads = []  # type: ignore[attr-defined]

        def recorded(voice_id: str) -> None:
            s.loads.append((voice_id, threading.current_thread().name))  # type: ignore[attr-defined]
            load(voice_id)

        engine.load_voice = recorded  # type: ignore[method-assign]
        yield s


async def test_voices_beyond_the_bound_load_on_a_thread_of_their_own_while_others_speak(lazy_server, piper_says,
                                                                                        x_low_says):
    """Only the first voice is loaded at start, yet every voice is listed. An utterance in
    a voice not loaded waits for its load, off the worker's thread, while one in the
    loaded voice is spoken meanwhile; both are what piper-tts says. The bound holds: once
    the second voice is used, the first is unloaded, and its stream still ends right."""
    engine = lazy_server.service.worker.loaded_engine()
    assert list(engine._loaded) == ["speakers"]
    async with httpx.AsyncClient() as http:
        listed = (await http.get(f"{lazy_server.http}/v1/voices")).json()["voices"]
    assert [v["id"] for v in listed] == ["speakers", "x_low", "german", "broken"]
    async with await Client.connect(lazy_server.ws) as client:
        bob = await client.speak(TEXT, voice="speakers", speaker="bob", sample_rate=RATE)
        x_low = await client.speak(TEXT, voice="x_low", sample_rate=X_LOW_RATE)
        (bob_frames, bob_done), (x_low_frames, x_low_done) = await asyncio.gather(bob.collect(), x_low.collect())
    assert bob_done["type"] == "done" and x_low_done["type"] == "done"
    assert whose(np.concatenate([f.to_float32() for f in bob_frames]), piper_says) == 1
    assert whose(np.concatenate([f.to_float32() for f in x_low_frames]), {None: x_low_says}) is None
    worker_thread = lazy_server.service.worker._thread.name
    assert ("x_low", worker_thread) not in lazy_server.loads
    assert [voice for voice, _ in lazy_server.loads].count("x_low") >= 1
    assert len(engine._loaded) == 1


async def test_a_voice_that_cannot_load_fails_its_utterance_with_a_code_and_the_rest_go_on(lazy_server):
    async with await Client.connect(lazy_server.ws) as client:
        for _ in range(2):  # and a second time: the load is tried again, and fails again
            u = await client.speak(TEXT, voice="broken", sample_rate=X_LOW_RATE)
            with pytest.raises(ServerError) as failed:
                await u.collect()
            assert failed.value.code == "engine_error"
            assert "'broken' could not be loaded" in failed.value.message
        u = await client.speak(TEXT, voice="german", sample_rate=X_LOW_RATE)
        frames, done = await u.collect()
    assert done["type"] == "done"
    assert np.abs(np.concatenate([f.to_float32() for f in frames])).max() > 0.01
