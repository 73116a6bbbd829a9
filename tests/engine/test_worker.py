"""The worker thread: streaming, scheduling, backpressure, cancellation, failures."""

import asyncio

import numpy as np
import pytest

from engine.base import SynthesisParams
from engine.audio_queue import Failed, Finished
from engine.worker import Worker
from tests.fixtures.waiting import drain, wait_until
from tests.fixtures.engines import RATE, WORD_SECONDS, ToneEngine, dominant_pitches, word_pitch

TONE = SynthesisParams(voice="tone")


@pytest.fixture
def engine():
    return ToneEngine()


@pytest.fixture
def worker(engine):
    w = Worker(lambda: engine, max_queue_seconds=0.5, warmup=False).start()
    w.wait_ready(10)
    yield w
    engine.release.set()
    w.stop()


async def test_utterance_audio_matches_its_words(worker):
    u = worker.submit(TONE, asyncio.get_running_loop())
    u.feed("alpha beta. gamma delta.", final=True)
    audio, end = await drain(u)
    assert isinstance(end, Finished)
    assert audio.size == 4 * int(RATE * WORD_SECONDS)
    assert dominant_pitches(audio) == pytest.approx([word_pitch(w) for w in ["alpha", "beta", "gamma", "delta"]], abs=15)
    assert u.segments == 2 and u.generator_closed


async def test_streamed_text_waits_for_more_and_finishes_on_final(worker, engine):
    u = worker.submit(TONE, asyncio.get_running_loop())
    for word in ["one ", "two. ", "three ", "four."]:
        u.feed(word)
    await wait_until(lambda: u.produced_samples > 0)
    assert u.outcome is None  # still waiting: "four." may not be the end of a sentence
    u.feed("", final=True)
    audio, end = await drain(u)
    assert isinstance(end, Finished)
    assert engine.segments == ["one two.", " three four."]


async def test_cancel_closes_the_generator_and_stops_computing(worker, engine):
    u = worker.submit(TONE, asyncio.get_running_loop())
    u.feed(" ".join(["word"] * 500) + ".", final=True)
    await wait_until(lambda: u.steps >= 3)
    u.cancel()
    await wait_until(lambda: u.generator_closed)
    steps = u.steps
    closed = worker.stats.generators_closed
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
    assert isinstance(good_end, Finished) and audio.size == 3 * int(RATE * WORD_SECONDS)
    assert worker.stats.failures == 1


async def test_full_queue_is_skipped_and_others_go_on(worker):
    loop = asyncio.get_running_loop()
    slow = worker.submit(TONE, loop)  # nobody reads this one
    slow.feed(" ".join(["slow"] * 100) + ".", final=True)
    await wait_until(lambda: slow.backlogged())
    fast = worker.submit(TONE, loop)
    fast.feed("quick brown fox.", final=True)
    _, end = await drain(fast)
    assert isinstance(end, Finished)
    # Backpressure: the unread utterance stopped at its bound (0.5 s) plus one step.
    assert slow.queue.samples <= int(0.5 * RATE) + int(RATE * WORD_SECONDS)
    steps = slow.steps
    await asyncio.sleep(0.1)
    assert slow.steps == steps
    # Reading resumes it, to the end.
    audio, end = await drain(slow)
    assert isinstance(end, Finished) and slow.produced_samples == 100 * int(RATE * WORD_SECONDS)


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
