"""The result cache: repeats stream from memory, bounded by bytes, never stale."""

import asyncio
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from voxwire.engine.base import WordTimings
from voxwire.server.cache import REPLAY_SLICE_SECONDS, CachedAudio, ResultCache
from voxwire.server.config import ServerConfig
from voxwire.server.framing import Framer
from voxwire.server.speech import Speech, UtteranceRequest
from tests.conftest import RunningServer, run_server
from tests.server.codec_checks import decode
from tests.fixtures.waiting import wait_until
from voxwire_client import Client
from voxwire_client.sync import synthesize_async

TEXT = "Caching this sentence saves the engine some work."


async def test_a_repeat_streams_from_the_cache_and_says_so():
    with run_server(ServerConfig(cache_mb=16)) as s:
        first = await synthesize_async(TEXT, s.ws, sample_rate=16000)
        steps = s.service.worker.stats.steps
        again = await synthesize_async("  " + TEXT, s.ws, sample_rate=16000)  # the same once normalised
        other_format = await synthesize_async(TEXT, s.ws, sample_rate=24000, format="pcm_f32le")
        assert first.done["cached"] is False and first.done["engine_steps"] > 0
        assert again.done["cached"] is True and again.done["engine_steps"] == 0
        assert s.service.worker.stats.steps == steps  # the engine did nothing for them
        assert again.data == first.data  # the same audio, sample for sample
        assert other_format.done["cached"] is True and other_format.sample_rate == 24000
        assert abs(other_format.duration - first.duration) < 0.01
        assert again.done["segments"] == first.done["segments"]
        different = await synthesize_async(TEXT, s.ws, speed=1.3)
        assert different.done["cached"] is False  # speed is part of the key
        # So is the schedule a request chose (Piper ignores it, the cache does not).
        fast = await synthesize_async(TEXT, s.ws, fast_start=True)
        fast_again = await synthesize_async(TEXT, s.ws, fast_start=True)
        assert fast.done["cached"] is False and fast_again.done["cached"] is True


async def test_it_can_be_switched_off():
    with run_server(ServerConfig(cache_mb=0)) as s:
        await synthesize_async(TEXT, s.ws)
        again = await synthesize_async(TEXT, s.ws)
        assert again.done["cached"] is False and again.done["engine_steps"] > 0


def test_lru_by_bytes_and_voice_invalidation():
    cache = ResultCache(max_bytes=4 * 4000 * 4)  # four 4000-sample entries; each <= a quarter
    audio = lambda: CachedAudio(np.zeros(4000, np.float32), 1)  # noqa: E731
    keys = [cache.key("e", "v1" if i % 2 else "v2", 1.0, f"text {i}") for i in range(5)]
    for k in keys[:4]:
        cache.put(k, audio())
    assert cache.get(keys[0]) is not None  # now the most recent
    cache.put(keys[4], audio())  # evicts the least recently used: keys[1]
    assert cache.get(keys[1]) is None and cache.get(keys[0]) is not None
    assert cache.bytes <= cache.max_bytes and len(cache) == 4
    cache.put(cache.key("e", "v1", 1.0, "big"), CachedAudio(np.zeros(8000, np.float32), 1))  # over a quarter: not kept
    assert len(cache) == 4
    cache.invalidate_voice("v1")
    assert all(k.voice == "v2" for k in cache._entries) and cache.get(keys[3]) is None


# About half a minute of speech: a replay long enough to take many slices and frames.
LONG_TEXT = " ".join(
    f"Sentence number {i} of this long reply is here to keep the encoder busy for a while." for i in range(6)
)


@pytest.fixture(scope="module")
def cached_server() -> Iterator[RunningServer]:
    with run_server(ServerConfig(cache_mb=64)) as s:
        yield s


class QueueSpy:
    """What each Framer of the server is given by its utterance's queue, in order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.items: list[np.ndarray | WordTimings] = []
        receive = Framer.receive

        def spy(stream: Framer, item: object) -> list[object]:
            if isinstance(item, (np.ndarray, WordTimings)):
                self.items.append(item)
            return receive(stream, item)

        monkeypatch.setattr(Framer, "receive", spy)

    def taken(self) -> list[np.ndarray | WordTimings]:
        items, self.items = self.items, []
        return items


async def test_a_replay_gives_its_audio_in_slices_words_first(cached_server, monkeypatch):
    spy = QueueSpy(monkeypatch)
    text = " ".join([TEXT] * 3)  # three sentences: three sets of word timings
    fresh = await synthesize_async(text, cached_server.ws, sample_rate=16000, timestamps=True)
    fresh_items = spy.taken()
    async with await Client.connect(cached_server.ws) as client:
        u = await client.speak(text, sample_rate=16000, timestamps=True)
        order = [item async for item in u]
    replayed = spy.taken()
    assert fresh.done["cached"] is False and order[-1]["cached"] is True

    # The engine's audio again, sample for sample, but in slices of at most 200 ms.
    slices = [x for x in replayed if isinstance(x, np.ndarray)]
    engine_rate = cached_server.service.worker.loaded_engine().sample_rate
    assert len(slices) > 5 and all(0 < s.size <= round(engine_rate * REPLAY_SLICE_SECONDS) for s in slices)
    fresh_audio = np.concatenate([x for x in fresh_items if isinstance(x, np.ndarray)])
    assert np.array_equal(np.concatenate(slices), fresh_audio)
    # Each word timing comes just ahead of the slice its word starts in.
    position, ahead = 0, []
    for item in replayed:
        if isinstance(item, WordTimings):
            ahead += item.words
            continue
        assert all(position <= w.start < position + item.size for w in ahead)
        position, ahead = position + item.size, []
    assert not ahead
    replay_words = [w for x in replayed if isinstance(x, WordTimings) for w in x.words]
    assert replay_words == [w for x in fresh_items if isinstance(x, WordTimings) for w in x.words]

    # What the client hears: the same words, each sent before the frame it starts in.
    assert u.words == fresh.words and len(u.words) == len(text.split())
    words_waiting: list[dict] = []
    for item in order:
        kind = getattr(item, "type", "audio")
        if kind == "timestamps":
            words_waiting += item["words"]
        elif kind == "audio":
            end_ms = (item.offset + item.samples) * 1000 / 16000
            assert all(w["start_ms"] < end_ms for w in words_waiting)
            words_waiting = []


async def test_a_long_replay_takes_turns_with_the_rest_of_the_event_loop(cached_server, monkeypatch):
    pipeline = cached_server.service.pipeline
    open_speech = pipeline.open
    seen: list[int] = []  # the replay's frames encoded so far, at each of the ticker's turns
    tickers: list[asyncio.Task[None]] = []

    async def ticker(speech: Speech) -> None:
        while speech.outcome is None:
            seen.append(speech.frames_sent)
            await asyncio.sleep(0)
        seen.append(speech.frames_sent)

    def watched(request: UtteranceRequest) -> Speech:
        speech = open_speech(request)
        if speech.cached:  # started on the server's event loop, beside the replay
            tickers.append(asyncio.get_running_loop().create_task(ticker(speech)))
        return speech

    async with httpx.AsyncClient(base_url=cached_server.http, timeout=120) as http:
        request = {"model": "tts-1", "voice": "joe", "input": LONG_TEXT, "response_format": "opus"}
        fresh = await http.post("/v1/audio/speech", json=request)
        monkeypatch.setattr(pipeline, "open", watched)
        replay = await http.post("/v1/audio/speech", json=request)
    assert fresh.headers["x-voxwire-cached"] == "0" and replay.headers["x-voxwire-cached"] == "1"
    # The same Opus stream (but for its random serial number): the same samples decoded.
    assert np.array_equal(decode(replay.content)[0], decode(fresh.content)[0])
    await wait_until(lambda: len(tickers) == 1 and tickers[0].done())
    frames = seen[-1]
    assert frames > 50  # about half a minute of audio
    # Between most two frames of the replay, the rest of the event loop had a turn; a
    # replay encoded in one go would let the ticker see only its start and its end.
    assert len(set(seen)) > frames // 2
