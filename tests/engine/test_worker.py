"""The worker thread: streaming, scheduling, backpressure, cancellation, failures."""

import asyncio
import threading
import time
from dataclasses import replace

import numpy as np
import pytest

from voxwire.engine import utterance as utterance_module
from voxwire.engine.base import SynthesisParams
from voxwire.engine.audio_queue import Done, Failed
from voxwire.engine.text.segment import Segmenter
from voxwire.engine.worker import Worker
from voxwire.engine.worker_options import WorkerOptions
from tests.fixtures.waiting import drain, wait_until
from tests.fixtures.engines import RATE, WORD_SECONDS, ToneEngine, dominant_pitches, word_pitch

TONE = SynthesisParams(voice="tone")


@pytest.fixture
def engine():
    return ToneEngine()


@pytest.fixture
def worker(engine):
    w = Worker(lambda: engine, WorkerOptions(max_queue_seconds=0.5, warmup=False)).start()
    w.wait_ready(10)
    yield w
    engine.release.set()
    w.stop()


async def test_utterance_audio_matches_its_words(worker):
    u = worker.submit(TONE, asyncio.get_running_loop())
    u.feed("alpha beta. gamma delta.", final=True)
    audio, end = await drain(u)
    assert isinstance(end, Done)
    assert audio.size == 4 * int(RATE * WORD_SECONDS)
    assert dominant_pitches(audio) == pytest.approx([word_pitch(w) for w in ["alpha", "beta", "gamma", "delta"]], abs=15)
    assert u.segments == 2 and u.stream_closed


async def test_streamed_text_waits_for_more_and_finishes_on_final(worker, engine):
    u = worker.submit(TONE, asyncio.get_running_loop())
    for word in ["one ", "two. ", "three ", "four."]:
        u.feed(word)
    await wait_until(lambda: u.produced_samples > 0)
    assert u.outcome is None  # still waiting: "four." may not be the end of a sentence
    u.feed("", final=True)
    audio, end = await drain(u)
    assert isinstance(end, Done)
    assert engine.segments == ["one two.", " three four."]


async def test_cancel_closes_the_generator_and_stops_computing(worker, engine):
    u = worker.submit(TONE, asyncio.get_running_loop())
    u.feed(" ".join(["word"] * 500) + ".", final=True)
    await wait_until(lambda: u.steps >= 3)
    u.cancel()
    await wait_until(lambda: u.stream_closed)
    steps = u.steps
    closed = worker.stats.streams_closed
    assert u.outcome == "cancelled" and closed >= 1
    # The worker is idle now; a second utterance runs to completion and the cancelled
    # one has not advanced by a single step meanwhile.
    v = worker.submit(TONE, asyncio.get_running_loop())
    v.feed("after.", final=True)
    await drain(v)
    assert u.steps == steps


async def test_engine_error_fails_only_its_utterance(worker):
    loop = asyncio.get_running_loop()
    bad = worker.submit(TONE, loop)
    good = worker.submit(TONE, loop)
    bad.feed("one explode three.", final=True)
    good.feed("fine words here.", final=True)
    _, bad_end = await drain(bad)
    audio, good_end = await drain(good)
    assert isinstance(bad_end, Failed) and bad_end.code == "engine_error"
    assert "RuntimeError" not in bad_end.message  # a message for people; the trace is in the log
    assert isinstance(good_end, Done) and audio.size == 3 * int(RATE * WORD_SECONDS)
    assert worker.stats.failures == 1


async def test_full_queue_is_skipped_and_others_go_on(worker):
    loop = asyncio.get_running_loop()
    slow = worker.submit(TONE, loop)  # nobody reads this one
    slow.feed(" ".join(["slow"] * 100) + ".", final=True)
    await wait_until(lambda: slow.backlogged())
    fast = worker.submit(TONE, loop)
    fast.feed("quick brown fox.", final=True)
    _, end = await drain(fast)
    assert isinstance(end, Done)
    # Backpressure: the unread utterance stopped at its bound (0.5 s) plus one step.
    assert slow.queue.samples <= int(0.5 * RATE) + int(RATE * WORD_SECONDS)
    steps = slow.steps
    await asyncio.sleep(0.1)
    assert slow.steps == steps
    # Reading resumes it, to the end.
    audio, end = await drain(slow)
    assert isinstance(end, Done) and slow.produced_samples == 100 * int(RATE * WORD_SECONDS)


async def test_new_utterance_gets_first_audio_before_a_long_one_continues(engine, worker):
    engine.step_delay = 0.005
    loop = asyncio.get_running_loop()
    long = worker.submit(TONE, loop)
    long.feed(" ".join(["long"] * 400) + ".", final=True)
    reader = asyncio.create_task(drain(long))  # a client that keeps up
    await wait_until(lambda: long.steps >= 5)
    # (long's steps, the newcomer's) as each step ends, read on the worker's thread: the
    # test's own polling can lag a few 5 ms steps behind on a busy machine.
    seen: list[tuple[int, int]] = []
    new = worker.submit(TONE, loop)
    worker.on_step = lambda _elapsed, _size: seen.append((long.steps, new.steps))
    steps_at_submit = long.steps
    new.feed("hi.", final=True)
    await wait_until(lambda: new.first_audio_at is not None and any(n for _, n in seen))
    # The step after the newcomer's first: long's count then is what it ran before it.
    long_before_newcomer = next(ls for ls, n in seen if n)
    # The newcomer waited for at most the one step in flight, not for the long one.
    assert long_before_newcomer - steps_at_submit <= 1
    assert long.outcome is None
    long.cancel()
    reader.cancel()


async def test_text_is_segmented_off_the_event_loop_which_keeps_turning(worker, engine, monkeypatch):
    """Text work of the text's size never runs on the event loop every connection shares:
    ``feed`` only hands the text over, and the inference thread segments it. A ticker on
    the loop counts its turns while a worst-case text (20,000 characters of abbreviations,
    once 21 s of segmenting on the loop) is segmented."""
    loop_thread = threading.get_ident()
    ticks = 0
    seen: list[tuple[int, int]] = []  # (thread, loop turns while it segmented)

    class Watched(Segmenter):
        def push(self, text: str, final: bool = False) -> list[str]:
            start = ticks
            # Segmenting takes as long as the loop needs for a few turns (bounded, so a
            # segmenter on the loop's own thread shows as 0 turns instead of a hang).
            for _ in range(200):
                if ticks >= start + 5:
                    break
                time.sleep(0.005)
            segments = super().push(text, final)
            seen.append((threading.get_ident(), ticks - start))
            return segments

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    monkeypatch.setattr(utterance_module, "Segmenter", Watched)
    counting = asyncio.create_task(ticker())
    try:
        u = worker.submit(TONE, asyncio.get_running_loop())
        u.feed("Dr. " * 5000, final=True)
        await wait_until(lambda: bool(seen) and bool(engine.segments))
        u.cancel()
        await wait_until(lambda: u.stream_closed)
    finally:
        counting.cancel()
    (thread, turns), = seen
    assert thread != loop_thread
    assert turns >= 5
    assert engine.segments[0].startswith("Dr. Dr.") and len(engine.segments[0]) <= 400


async def test_an_utterance_past_the_ceiling_ends_with_utterance_too_long(engine):
    w = Worker(lambda: engine, WorkerOptions(warmup=False, max_utterance_seconds=1.0)).start()
    w.wait_ready(10)
    try:
        loop = asyncio.get_running_loop()
        long, short = w.submit(TONE, loop), w.submit(TONE, loop)
        long.feed("la " * 39 + "la.", final=True)  # 4 s of tone
        short.feed("la " * 8 + "la.", final=True)  # 0.9 s: under the ceiling
        audio, end = await drain(long)
        assert isinstance(end, Failed) and end.code == "utterance_too_long"
        assert "1 s" in end.message
        assert audio.size == RATE  # exactly the ceiling's audio was delivered
        assert long.stream_closed
        audio, end = await drain(short)
        assert isinstance(end, Done) and audio.size == 9 * int(RATE * WORD_SECONDS)
    finally:
        w.stop()


async def test_load_counts_what_each_stream_with_work_left_costs():
    """0.1 s of tone a step of 0.02 s: a fifth of the worker's time a stream. Its voice's
    figure prices a newcomer; an utterance waiting for text costs nothing; one past 2 s
    of audio is priced by its own figure, and one that has ended is gone from the sum."""
    engine = ToneEngine(step_delay=0.02)
    worker = Worker(lambda: engine, WorkerOptions(warmup=False)).start()
    worker.wait_ready(10)
    try:
        assert worker.load() == 0 and worker.stream_cost("tone") == 0  # nothing measured yet
        loop = asyncio.get_running_loop()
        first = worker.submit(TONE, loop)
        first.feed("one two three.", final=True)
        await drain(first)
        cost = worker.stream_cost("tone")
        assert 0.2 <= cost < 0.4, cost
        assert worker.stream_cost("another") == cost  # a voice not yet heard: every voice's figure
        assert worker.load() == 0  # it has ended
        waiting = worker.submit(TONE, loop)
        waiting.feed("no end yet")  # no sentence to speak: it waits for text
        await wait_until(lambda: worker.load() == 0)  # once its text is read, nothing is left to compute
        long = worker.submit(replace(TONE, speed=2.0), loop)  # half the audio a step: twice the cost
        long.feed("la " * 80 + ".", final=True)
        await wait_until(lambda: long.produced_seconds >= 2.5)
        assert 2 * 0.2 <= worker.load() < 2 * 0.4 + 0.1, worker.load()
        long.cancel()
        waiting.cancel()
        await wait_until(lambda: worker.active == 0)
        assert worker.load() == 0
    finally:
        worker.stop()
