"""Word timestamps: from Piper's durations, per chunk, in the stream's own timeline."""

import pytest

from voxwire_client import Client

TEXT = "The quick brown fox jumps over the lazy dog. Then it sleeps."
WORDS = ["The", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "Then", "it", "sleeps"]


@pytest.mark.parametrize("rate", [16000, 48000])
async def test_words_and_times_arrive_with_the_chunks(piper_server, rate):
    async with await Client.connect(piper_server.ws) as client:
        u = await client.speak(TEXT, timestamps=True, sample_rate=rate)
        order = []
        async for item in u:
            order.append(getattr(item, "type", "audio"))
        done = item
    words = u.words
    assert [w["word"] for w in words] == WORDS
    duration_ms = done["audio_ms"]
    starts = [w["start_ms"] for w in words]
    assert starts == sorted(starts) and all(w["end_ms"] > w["start_ms"] for w in words)
    assert 0 <= starts[0] < 300 and words[-1]["end_ms"] <= duration_ms + 1
    # Words of the second sentence start after the first sentence's last word ends.
    assert words[9]["start_ms"] >= words[8]["end_ms"]
    # Sent as it goes: timestamps events between audio frames, not all at the end.
    first_ts = order.index("timestamps")
    assert order.index("audio") > first_ts and order.count("timestamps") >= 2
    assert "audio" in order[first_ts + 1 :]


async def test_no_timestamps_unless_asked(piper_server):
    async with await Client.connect(piper_server.ws) as client:
        u = await client.speak(TEXT)
        frames, done = await u.collect()
    assert u.words == [] and frames
