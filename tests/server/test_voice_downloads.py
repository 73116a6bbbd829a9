"""``--download-voices``: a real server lists every voice of a local copy of Piper's
catalog (benchmarks/catalog_mirror.py) and downloads one on its first request, as
wyoming-piper does. Each downloaded voice then speaks as piper-tts itself does, on every
door; a slow download holds only its own utterances; a 404, a truncated file and a voice
whose config belies its quality fail with a code and leave nothing behind; a lexicon is
checked once its voice is here; and ``--voice`` names a voice downloaded before the
server serves."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from wyoming.client import AsyncTcpClient
from wyoming.info import Describe, Info
from wyoming.tts import Synthesize, SynthesizeVoice

from tests.conftest import RunningServer, run_server
from voxwire.benchmarks.catalog_mirror import CatalogServer, add_voice, serve, write_catalog
from tests.server.doors.test_wyoming import hear, port, read
from tests.server.test_piper_voices import (  # noqa: F401 (fixtures)
    RATE, SPEAKERS, TEXT, X_LOW_RATE, piper_says, quiet_voices, whose, x_low_says,
)
from voxwire.engine.registry import EngineOptions
from voxwire.server.config import ServerConfig
from voxwire_client import Client, ServerError

QUIET, CHORUS = "en_US-quiet-x_low", "en_US-chorus-medium"


def model_path(key: str) -> str:
    language, name, grade = key.split("-", 2)
    return f"{language.split('_')[0]}/{language}/{name}/{grade}/{key}.onnx"


@pytest.fixture(scope="module")
def catalog(quiet_voices, tmp_path_factory) -> Iterator[CatalogServer]:
    root = tmp_path_factory.mktemp("catalog")
    voices: dict = {}
    for key in (QUIET, "en_US-slow-x_low", "en_US-lexicon-x_low", "en_US-gone-x_low", "en_US-cut-x_low"):
        add_voice(root, voices, key, quiet_voices["x_low"])
    add_voice(root, voices, CHORUS, quiet_voices["speakers"], speakers=SPEAKERS)
    # Graded "low" (16 kHz), its config 22.05 kHz: the catalog's word is taken until it is here.
    add_voice(root, voices, "en_US-mislabelled-low", quiet_voices["speakers"], speakers=SPEAKERS)
    (root / model_path("en_US-gone-x_low")).unlink()  # listed, and a 404
    cut = root / model_path("en_US-cut-x_low")
    cut.write_bytes(cut.read_bytes()[:5000])
    write_catalog(root, voices)
    with serve(root) as served:
        yield served


def options(catalog: CatalogServer, folder: Path) -> EngineOptions:
    return EngineOptions(name="piper", piper_voices_dir=folder, download_voices=True, piper_voices_url=catalog.base,
                         precision="fp32")


@pytest.fixture(scope="module")
def server(catalog, tmp_path_factory) -> Iterator[RunningServer]:
    folder = tmp_path_factory.mktemp("downloads")  # empty: the embedded voice is the default
    config = ServerConfig(engine=options(catalog, folder), cache_mb=0, wyoming_port=0, step_timeout=300)
    with run_server(config) as s:
        s.folder = folder  # type: ignore[attr-defined]
        yield s


async def listed(server: RunningServer) -> dict[str, dict]:
    async with httpx.AsyncClient() as http:
        return {v["id"]: v for v in (await http.get(f"{server.http}/v1/voices")).json()["voices"]}


async def test_every_catalog_voice_is_listed_with_its_rate_and_speakers_before_it_is_here(server):
    voices = await listed(server)
    assert voices["joe"]["installed"] is True and next(iter(voices)) == "joe"  # still the default
    chorus, quiet = voices[CHORUS], voices[QUIET]
    assert (chorus["installed"], chorus["sample_rate"], chorus["speakers"], chorus["quality"]) == (
        False, RATE, list(SPEAKERS), "medium")
    assert (quiet["installed"], quiet["sample_rate"], quiet["language"], quiet["phonemes"]) == (
        False, X_LOW_RATE, "en_US", "")
    async with AsyncTcpClient("127.0.0.1", port(server)) as client:
        await client.write_event(Describe().event())
        (program,) = Info.from_event(await read(client)).tts
    described = {v.name: v for v in program.voices}
    # Listed as installed, as wyoming-piper lists them: Home Assistant offers only those.
    assert described[CHORUS].installed and [s.name for s in described[CHORUS].speakers or []] == list(SPEAKERS)
    assert set(described) == set(voices)


async def test_a_voice_is_downloaded_on_its_first_request_and_speaks_as_piper_does(server, catalog, x_low_says):
    async with await Client.connect(server.ws) as client:
        for _ in range(2):
            u = await client.speak(TEXT, voice=QUIET, sample_rate=X_LOW_RATE)
            frames, done = await u.collect()
            assert done["type"] == "done"
            assert whose(np.concatenate([f.to_float32() for f in frames]), {None: x_low_says}) is None
    assert catalog.fetched[model_path(QUIET)] == 1  # once: then it is here
    assert sorted(p.name for p in server.folder.iterdir()) == [f"{QUIET}.onnx", f"{QUIET}.onnx.json", "voices.json"]
    now = (await listed(server))[QUIET]
    assert now["installed"] is True and now["language"] == "en-us" and "ə" in now["phonemes"]


async def test_a_downloaded_speaker_speaks_on_wyoming_and_the_openai_route(server, piper_says):
    async with AsyncTcpClient("127.0.0.1", port(server)) as client:
        await client.write_event(Synthesize(text=TEXT, voice=SynthesizeVoice(name=CHORUS, speaker="dave")).event())
        heard = await hear(client)
    assert heard.start is not None and heard.start.rate == RATE
    assert whose(heard.audio, piper_says) == 3
    async with httpx.AsyncClient(timeout=120) as http:
        answer = await http.post(f"{server.http}/v1/audio/speech", json={
            "model": "tts-1", "input": TEXT, "voice": f"{CHORUS}:carol", "response_format": "pcm"})
    pcm = np.frombuffer(answer.content, "<i2").astype(np.float32) / 32767
    assert pcm.size == pytest.approx(piper_says[2].size * 24000 / RATE, rel=0.02)
    assert np.abs(pcm).max() > 0.05


async def test_a_slow_download_holds_only_the_utterances_that_wait_for_it(server, catalog):
    """The catalog's server answers the model 4 s late. Two utterances wait for that one
    download; one in another voice, asked after them, has its first audio before the
    download can have ended: the worker steps on while the voice downloads."""
    delay = 4.0
    catalog.delays[model_path("en_US-slow-x_low")] = delay
    async with await Client.connect(server.ws) as client:
        asked = time.perf_counter()
        waiting = [await client.speak(TEXT, voice="en_US-slow-x_low", sample_rate=X_LOW_RATE) for _ in range(2)]
        other_frames, other_done = await (await client.speak(TEXT, voice="joe", sample_rate=RATE)).collect()
        for u in waiting:
            frames, done = await u.collect()
            assert done["type"] == "done" and np.abs(np.concatenate([f.to_float32() for f in frames])).max() > 0.05
            assert frames[0].received_at - asked >= delay
    assert other_done["type"] == "done" and other_frames[0].received_at - asked < delay
    assert catalog.fetched[model_path("en_US-slow-x_low")] == 1  # one download for both


@pytest.mark.parametrize("key, says", [("en_US-gone-x_low", "HTTP 404"), ("en_US-cut-x_low", "5000 bytes where")])
async def test_a_failed_download_fails_its_utterance_with_a_code_and_leaves_nothing(server, catalog, key, says):
    async with await Client.connect(server.ws) as client:
        for attempt in (1, 2):  # and again: the next request downloads again
            u = await client.speak(TEXT, voice=key, sample_rate=X_LOW_RATE)
            with pytest.raises(ServerError) as failed:
                await u.collect()
            assert failed.value.code == "voice_download_failed" and says in failed.value.message
            assert catalog.fetched[model_path(key)] == attempt
        frames, done = await (await client.speak(TEXT, voice="joe", sample_rate=RATE)).collect()
    assert done["type"] == "done" and frames
    assert not [p.name for p in server.folder.iterdir() if key in p.name or p.name.endswith(".part")]
    assert (await listed(server))[key]["installed"] is False


async def test_a_voice_whose_config_belies_its_quality_is_spoken_at_its_own_rate_once_here(server, piper_says):
    key = "en_US-mislabelled-low"
    assert (await listed(server))[key]["sample_rate"] == X_LOW_RATE
    async with await Client.connect(server.ws) as client:
        u = await client.speak(TEXT, voice=key, speaker="bob", sample_rate=RATE)
        with pytest.raises(ServerError) as failed:
            await u.collect()
        assert failed.value.code == "engine_error" and "ask again" in failed.value.message
        frames, done = await (await client.speak(TEXT, voice=key, speaker="bob", sample_rate=RATE)).collect()
    assert done["type"] == "done"
    assert whose(np.concatenate([f.to_float32() for f in frames]), piper_says) == 1
    assert (await listed(server))[key]["sample_rate"] == RATE


async def test_a_lexicon_is_checked_against_the_voice_once_it_is_downloaded(server):
    key = "en_US-lexicon-x_low"
    async with await Client.connect(server.ws) as client:
        u = await client.speak(TEXT, voice=key, sample_rate=X_LOW_RATE, lexicon={"museum": "/ЖЖ/"})
        with pytest.raises(ServerError) as failed:
            await u.collect()
        assert failed.value.code == "invalid_lexicon" and "'museum'" in failed.value.message
        frames, done = await (await client.speak(TEXT, voice=key, sample_rate=X_LOW_RATE,
                                                 lexicon={"museum": "/mjuːzˈiːəm/"})).collect()
    assert done["type"] == "done" and frames


def test_the_default_voice_is_downloaded_before_the_server_serves(catalog, tmp_path):
    config = ServerConfig(engine=options(catalog, tmp_path), cache_mb=0, default_voice=CHORUS, step_timeout=300)
    with run_server(config) as s:
        assert (tmp_path / f"{CHORUS}.onnx").is_file()
        voices = asyncio.run(listed(s))
    assert voices[CHORUS]["installed"] is True
