"""Word timestamps: from Piper's durations, per chunk, in the stream's own timeline."""

import logging

import orjson
import pytest
import websockets

from voxwire_client import Client
from tests.server.test_stream import read

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


# -- the words heard, at a cancel ----------------------------------------------------------------


LONG = " ".join([TEXT] * 6)
WORDS_OF_LONG = WORDS * 6


async def _cancel_after(server, seconds: float, played: float | None, **settings) -> tuple[dict, list[dict], int]:
    """Speak LONG, take ``seconds`` of its audio, report ``played`` seconds played (None:
    no report), cancel: the ``cancelled`` reply, the words timed, and the stream's rate."""
    async with websockets.connect(server.ws) as ws:
        await read(ws)  # ready
        await ws.send(orjson.dumps({"type": "speak", "ctx": "c", "text": LONG, **settings}).decode())
        words, samples, rate = [], 0, 0
        while samples < seconds * (rate or 1e9):
            m = await read(ws)
            if m["type"] == "started":
                rate = m["sample_rate"]
            elif m["type"] == "timestamps":
                words += m["words"]
            elif m["type"] == "audio":
                samples += m["samples"]
        if played is not None:
            await ws.send(orjson.dumps({"type": "progress", "ctx": "c", "played": round(played * rate)}).decode())
        await ws.send(orjson.dumps({"type": "cancel", "ctx": "c"}).decode())
        while (m := await read(ws))["type"] != "cancelled":
            if m["type"] == "timestamps":
                words += m["words"]
        return m, words, rate


def _begun(words: list[dict], samples: int, rate: int) -> str:
    return " ".join(w["word"] for w in words if w["start_ms"] < samples * 1000 / rate)


async def test_a_cancel_says_the_words_whose_audio_was_sent_and_played(piper_server):
    cancelled, words, rate = await _cancel_after(piper_server, 1.5, played=0.8, timestamps=True)
    sent, played = cancelled["text_sent"], cancelled["text_played"]
    # The words that begin within the audio sent, as the timestamps the client had say.
    assert sent == _begun(words, cancelled["samples_sent"], rate)
    assert played == _begun(words, round(0.8 * rate), rate)
    assert LONG.replace(".", "").startswith(sent) and sent.startswith(played)
    assert 1 <= len(played.split()) < len(sent.split()) < len(LONG.split()) / 2


async def test_the_words_heard_come_with_word_timings_asked_for_and_played_only_once_reported(piper_server):
    # Timing words costs Piper a few ms a segment (each word phonemized alone), so it is
    # done where timestamps are asked for, and only then does a cancel know the words.
    cancelled, words, _ = await _cancel_after(piper_server, 1.0, played=None)
    assert words == [] and cancelled["samples_sent"] > 0
    assert "text_sent" not in cancelled and "text_played" not in cancelled
    cancelled, words, _ = await _cancel_after(piper_server, 1.0, played=None, timestamps=True)
    assert "text_played" not in cancelled
    sent = cancelled["text_sent"].split()
    assert sent and sent == WORDS_OF_LONG[: len(sent)]


async def test_an_engine_that_times_no_words_says_no_text(tone_server):
    cancelled, _, _ = await _cancel_after(tone_server, 0.3, played=0.1)
    assert cancelled["samples_sent"] > 0 and "text_sent" not in cancelled and "text_played" not in cancelled


async def test_a_cut_utterances_log_line_counts_the_words_heard_and_shows_them_only_with_log_text(piper_server, caplog):
    caplog.set_level(logging.INFO, "voxwire.utterance")
    cancelled, _, _ = await _cancel_after(piper_server, 1.0, played=0.5, timestamps=True)
    [record] = [r for r in caplog.records if getattr(r, "outcome", None) == "cancelled"]
    assert record.words_sent == len(cancelled["text_sent"].split()) > 0
    assert record.words_played == len(cancelled["text_played"].split())
    assert not hasattr(record, "text_sent") and not hasattr(record, "text")
