"""A real server with a real multi-speaker Piper voice (made by piper-tts's training code,
tests/fixtures/piper_voices.py) speaks each speaker as piper-tts itself does, on every
door: protocol v1, the OpenAI route and Wyoming."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from wyoming.client import AsyncTcpClient
from wyoming.info import Describe, Info
from wyoming.tts import Synthesize, SynthesizeVoice

from voxwire.engine.registry import EngineOptions
from voxwire.server.config import ServerConfig
from tests.conftest import RunningServer, run_server
from tests.server.doors.test_wyoming import hear, port, read
from tests.server.test_pipeline import speak_v1

import websockets

TEXT = "The museum opens at nine, and the tours start at ten."
SPEAKERS = ("alice", "bob", "carol", "dave")
RATE = 22050


@pytest.fixture(scope="module")
def voice(reference_voices, tmp_path_factory) -> Path:
    """The four-speaker reference voice, its noise off: then each speaker's audio is a
    function of the text alone, and can be compared with Piper's."""
    folder = tmp_path_factory.mktemp("quiet-voice")
    model = folder / "speakers.onnx"
    shutil.copy(reference_voices["speakers"], model)
    config = json.loads(Path(f"{reference_voices['speakers']}.json").read_text(encoding="utf-8"))
    config["inference"] = {"noise_scale": 0.0, "length_scale": 1.0, "noise_w": 0.0}
    Path(f"{model}.json").write_text(json.dumps(config), encoding="utf-8")
    return model


@pytest.fixture(scope="module")
def server(voice) -> Iterator[RunningServer]:
    options = EngineOptions(name="piper", piper_voices=(voice,), precision="fp32")
    with run_server(ServerConfig(engine=options, cache_mb=0, wyoming_port=0, step_timeout=300)) as s:
        yield s


@pytest.fixture(scope="module")
def piper_says(voice) -> dict[int, np.ndarray]:
    """piper-tts's own audio of TEXT for each speaker id."""
    from piper import PiperVoice
    from piper.config import SynthesisConfig

    piper = PiperVoice.load(voice)
    out = {}
    for sid in range(len(SPEAKERS)):
        syn = SynthesisConfig(speaker_id=sid, noise_scale=0.0, noise_w_scale=0.0, length_scale=1.0)
        out[sid] = np.concatenate([
            np.asarray(piper.phoneme_ids_to_audio(piper.phonemes_to_ids(p), syn), dtype=np.float32).reshape(-1)
            for p in piper.phonemize(TEXT)
        ])
    return out


def likeness(a: np.ndarray, b: np.ndarray) -> float:
    """SNR in dB of ``a`` against ``b`` over their common length, after the one gain that
    fits best: the server scales each voice by a gain of its own."""
    n = min(a.size, b.size)
    a, b = a[:n].astype(np.float64), b[:n].astype(np.float64)
    fitted = b * (a @ b) / (b @ b)
    return float(10 * np.log10((a @ a) / max(((a - fitted) ** 2).sum(), 1e-30)))


def whose(audio: np.ndarray, piper_says: dict[int, np.ndarray]) -> int:
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
    assert [(v["id"], v["speakers"], v["sample_rate"]) for v in listed] == [("speakers", list(SPEAKERS), RATE)]


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
    for speaker, sid in (("dave", 3), ("1", 1)):
        async with AsyncTcpClient("127.0.0.1", port(server)) as client:
            await client.write_event(Synthesize(text=TEXT, voice=SynthesizeVoice(name="speakers", speaker=speaker)).event())
            heard = await hear(client)
        assert heard.start is not None and heard.start.rate == RATE
        assert whose(heard.audio, piper_says) == sid
