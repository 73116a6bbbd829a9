"""The sans-I/O frame stream (server/framing.py), fed synthetic queue items as the
worker would: frames cut, numbered and offset, word timings placed, markers and the
capture for the cache."""

from __future__ import annotations

import numpy as np
import pytest

from voxwire.engine.audio_queue import Done, Failed, Flushed
from voxwire.engine.base import WordTiming, WordTimings
from voxwire.server.framing import AudioFrame, FailedEvent, FlushedEvent, Framer, Words
from voxwire.server.protocol import StreamSettings

RATE = 16000


def settings(**kw: object) -> StreamSettings:
    return StreamSettings(**{"voice": "v", "sample_rate": RATE, "chunk_ms": 200, **kw})  # type: ignore[arg-type]


def tone(seconds: float) -> np.ndarray:
    t = np.arange(int(RATE * seconds)) / RATE
    return (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


def test_frames_are_cut_numbered_and_offset_from_pieces_of_any_size():
    stream = Framer(RATE, settings())
    events = []
    for seconds in (0.05, 0.12, 0.5, 0.01, 0.33):  # 1.01 s in uneven pieces
        events += stream.receive(tone(seconds))
    events += stream.receive(Done())
    frames = [e for e in events if isinstance(e, AudioFrame)]
    assert frames[0].samples == int(RATE * 0.05) + int(RATE * 0.12)  # the first leaves once it holds 150 ms
    assert all(f.samples == RATE * 200 // 1000 for f in frames[1:-1])
    assert [f.seq for f in frames] == list(range(len(frames)))
    assert [f.offset for f in frames] == list(np.cumsum([0] + [f.samples for f in frames[:-1]]))
    assert sum(f.samples for f in frames) == int(RATE * 0.05) + int(RATE * 0.12) + int(RATE * 0.5) + int(RATE * 0.01) + int(RATE * 0.33)
    assert all(len(f.data) == 2 * f.samples for f in frames)  # pcm_s16le
    assert stream.finished and stream.frames == len(frames)


def test_words_go_just_ahead_of_the_frame_they_start_in_on_the_stream_timeline():
    stream = Framer(RATE, settings(sample_rate=8000, timestamps=True))
    words = WordTimings((WordTiming("one", 100, 3000), WordTiming("two", 9000, 12000)))
    events = stream.receive(words) + stream.receive(tone(1.0)) + stream.receive(Done())
    kinds = [type(e).__name__ for e in events]
    # "one" starts in frame 0; "two" at 9000/16000 s = 4500 at 8 kHz, in frame 2 (2800..4400..6000).
    assert kinds[:2] == ["Words", "AudioFrame"] and kinds.count("Words") == 2
    second = next(e for e in events if isinstance(e, Words) and e.words[0]["word"] == "two")
    frame_after = events[events.index(second) + 1]
    assert isinstance(frame_after, AudioFrame) and frame_after.offset <= 4500 < frame_after.offset + frame_after.samples
    assert second.words[0]["start_ms"] == pytest.approx(562.5)


def test_flush_sends_what_is_buffered_then_the_marker_and_failure_is_an_event():
    stream = Framer(RATE, settings())
    assert stream.receive(tone(0.1)) == []  # under 150 ms: held for the first frame
    flushed = stream.receive(Flushed())
    assert isinstance(flushed[0], AudioFrame) and flushed[0].samples == RATE // 10
    assert isinstance(flushed[-1], FlushedEvent)
    assert stream.receive(Failed("engine_error", "it broke")) == [FailedEvent("engine_error", "it broke")]


def test_capture_for_the_cache_is_capped_and_keeps_words_only_when_asked():
    small = Framer(RATE, settings(timestamps=True), capture_bytes=RATE * 4)  # one second of float32
    small.receive(WordTimings((WordTiming("a", 0, 10),)))
    small.receive(tone(0.6))
    small.receive(Done())
    entry = small.captured(segments=1)
    assert entry is not None and entry.audio.size == int(RATE * 0.6) and entry.words == (WordTiming("a", 0, 10),)
    big = Framer(RATE, settings(), capture_bytes=RATE * 4)
    big.receive(tone(0.6))
    big.receive(tone(0.6))  # now over the cap: nothing is kept
    big.receive(Done())
    assert big.captured(segments=1) is None
    plain = Framer(RATE, settings(), capture_bytes=RATE * 4)
    plain.receive(tone(0.2))
    plain.receive(Done())
    assert plain.captured(segments=1).words is None  # type: ignore[union-attr]


@pytest.mark.parametrize("rate", [8000, 16000, 22050, 24000, 44100, 48000])
def test_a_first_piece_of_150_ms_makes_a_first_frame_at_every_rate(rate):
    # Piper's first piece is 162.5 ms at 22.05 kHz; the resampler keeps some of it back.
    piece = np.sin(np.arange(int(22050 * 1.1625)) * 0.05).astype(np.float32) * 0.3
    stream = Framer(22050, settings(sample_rate=rate))
    first = stream.receive(piece[: int(22050 * 0.1625)])
    frames = [e for e in first if isinstance(e, AudioFrame)]
    assert len(frames) == 1 and frames[0].samples >= rate * 0.13
    rest = stream.receive(piece[int(22050 * 0.1625) :]) + stream.receive(Done())
    total = sum(e.samples for e in first + rest if isinstance(e, AudioFrame))
    assert abs(total - rate * (0.1625 + 1.0)) <= 2  # nothing lost to the early first frame
