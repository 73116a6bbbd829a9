"""The result cache: repeats stream from memory, bounded by bytes, never stale."""

import numpy as np

from server.cache import CachedAudio, ResultCache
from server.config import ServerConfig
from tests.conftest import run_server
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
