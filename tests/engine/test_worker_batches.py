"""Continuous batching in the worker: every runnable utterance advances in one engine
step, newcomers join between steps, and one member's end never disturbs the others.

Steps are counted, never timed: the batching tone engine records which streams each
step advanced, and with ``gated`` a step runs only when the test hands it a permit.
``together`` makes utterances arrive at the same moment for the worker: while it waits
inside the step of a one-word blocker, so all of them join the step after it."""

import asyncio

import numpy as np
import pytest

from voxwire.engine.audio_queue import Done, Failed
from voxwire.engine.base import SynthesisParams
from voxwire.engine.worker import Worker
from voxwire.engine.worker_options import WorkerOptions
from tests.fixtures.waiting import drain, wait_until
from tests.fixtures.engines import RATE, WORD_SECONDS, BatchToneEngine, dominant_pitches, word_pitch

TONE = SynthesisParams(voice="tone")
WORD = int(RATE * WORD_SECONDS)


def start(engine: BatchToneEngine, **kwargs) -> Worker:
    w = Worker(lambda: engine, WorkerOptions(max_queue_seconds=30.0, warmup=False, **kwargs)).start()
    w.wait_ready(10)
    return w


@pytest.fixture
def stopping():
    workers: list[tuple[Worker, BatchToneEngine]] = []
    yield workers
    for w, engine in workers:
        engine.gated = False
        engine.permits.release(1000)
        w.stop()


def speak(worker: Worker, text: str):
    u = worker.submit(TONE, asyncio.get_running_loop())
    u.feed(text, final=True)
    return u


async def together(worker: Worker, engine: BatchToneEngine, texts: list[str]) -> list:
    """Submit ``texts`` while the worker waits inside a one-word blocker's step, then let
    that one step run: the worker then opens them all and waits inside the next step,
    which they share. The blocker's is ``engine.batches[0]``."""
    engine.gated = True
    blocker = speak(worker, "hold.")
    await wait_until(lambda: engine.entered == 1)
    us = [speak(worker, t) for t in texts]
    engine.permits.release(1)
    await drain(blocker)
    return us


async def run_together(worker: Worker, engine: BatchToneEngine, texts: list[str]) -> list:
    """``together``, run to the end; each utterance's audio and end marker."""
    us = await together(worker, engine, texts)
    engine.permits.release(1000)
    return list(await asyncio.gather(*(drain(u) for u in us)))


def pitches_of(text: str) -> list[float]:
    return [word_pitch(w.strip(".,!?")) for w in text.split()]


async def test_utterances_that_arrive_together_advance_in_one_step(stopping):
    engine = BatchToneEngine(max_batch=4, gated=True)
    worker = start(engine)
    stopping.append((worker, engine))
    texts = ["alpha beta gamma.", "delta epsilon.", "zeta eta theta iota.", "kappa."]
    results = await run_together(worker, engine, texts)
    for text, (audio, end) in zip(texts, results):
        assert isinstance(end, Done)
        assert audio.size == len(text.split()) * WORD
        assert dominant_pitches(audio) == pytest.approx(pitches_of(text), abs=15)
    # Four words for the longest, so four steps (after the blocker's) advanced all of
    # them: the first one all four.
    assert len(engine.batches[1]) == 4
    assert worker.stats.steps == 1 + 4 and worker.stats.batch_sizes[4] == 1
    assert sum(n * k for n, k in worker.stats.batch_sizes.items()) == 1 + sum(len(t.split()) for t in texts)


async def test_an_idle_worker_lets_a_burst_gather_into_its_first_step(stopping):
    # A wide window, so that the arrivals below (50 ms apart) are surely inside it.
    engine = BatchToneEngine(max_batch=4)
    worker = start(engine, gather_seconds=0.5)
    stopping.append((worker, engine))
    burst = [speak(worker, "one two.")]
    for text in ("three four.", "five six."):
        await asyncio.sleep(0.05)
        assert engine.entered == 0  # each arrival keeps the window open
        burst.append(speak(worker, text))
    await asyncio.gather(*(drain(u) for u in burst))
    assert [len(b) for b in engine.batches] == [3, 3]

    # Without the window the first arrival is stepped alone, and the rest join later.
    engine2 = BatchToneEngine(max_batch=4, gated=True)
    worker2 = start(engine2, gather_seconds=0.0)
    stopping.append((worker2, engine2))
    first = speak(worker2, "one two.")
    await wait_until(lambda: engine2.entered == 1)
    rest = [speak(worker2, "three four."), speak(worker2, "five six.")]
    engine2.permits.release(100)
    await asyncio.gather(drain(first), *(drain(u) for u in rest))
    assert len(engine2.batches[0]) == 1


async def test_a_newcomer_joins_between_steps_and_max_batch_1_turns_batching_off(stopping):
    engine = BatchToneEngine(max_batch=4, gated=True)
    worker = start(engine, max_batch=1)
    stopping.append((worker, engine))
    assert worker.max_batch == 1
    a, b = speak(worker, "one two three."), speak(worker, "four five.")
    engine.permits.release(100)
    await asyncio.gather(drain(a), drain(b))
    assert all(len(batch) == 1 for batch in engine.batches)

    engine2 = BatchToneEngine(max_batch=4, gated=True)
    worker2 = start(engine2)
    stopping.append((worker2, engine2))
    first = speak(worker2, "one two three four five.")
    await wait_until(lambda: first.stream is not None)
    engine2.permits.release(2)
    await wait_until(lambda: first.steps == 2)
    # The worker waits inside step 3, which began without the newcomer: it joins at 4.
    late = speak(worker2, "six seven.")
    engine2.permits.release(100)
    await asyncio.gather(drain(first), drain(late))
    assert [len(b) for b in engine2.batches] == [1, 1, 1, 2, 2]


async def test_where_width_costs_time_a_newcomer_has_its_first_step_to_itself(stopping):
    engine = BatchToneEngine(max_batch=4, gated=True)
    engine.width_costs_time = True
    worker = start(engine)
    stopping.append((worker, engine))
    # Slow speech (a second a word) keeps the first far ahead of its listener.
    first = worker.submit(SynthesisParams(voice="tone", speed=0.1), asyncio.get_running_loop())
    first.feed("one two three four five.", final=True)
    await wait_until(lambda: first.stream is not None)
    engine.permits.release(2)
    await wait_until(lambda: first.steps == 2)
    late = worker.submit(first.params, asyncio.get_running_loop())
    late.feed("six seven.", final=True)
    engine.permits.release(100)
    await asyncio.gather(drain(first), drain(late))
    # Step 4 is the newcomer's first chunk alone; then the two share steps.
    assert [len(b) for b in engine.batches] == [1, 1, 1, 1, 2, 1]


async def test_a_cancelled_member_leaves_before_the_next_step_and_the_others_finish(stopping):
    engine = BatchToneEngine(max_batch=4, gated=True)
    worker = start(engine)
    stopping.append((worker, engine))
    texts = ["red orange yellow green blue.", "cancel me now please now.", "sun moon star comet planet."]
    us = await together(worker, engine, texts)
    engine.permits.release(2)
    await wait_until(lambda: all(u.steps == 2 for u in us))
    victim = us[1].stream.name
    us[1].cancel()  # while the worker waits inside step 3, which it began with the victim
    engine.permits.release(100)
    (a_audio, a_end), (c_audio, c_end) = await asyncio.gather(drain(us[0]), drain(us[2]))
    assert isinstance(a_end, Done) and isinstance(c_end, Done)
    # A cancelled utterance's queue gets no end marker: its session says "cancelled".
    assert us[1].outcome == "cancelled" and us[1].stream_closed and us[1].steps == 3
    batches = engine.batches[1:]  # after the blocker's
    assert [victim in b for b in batches] == [True] * 3 + [False] * (len(batches) - 3)
    for text, audio in ((texts[0], a_audio), (texts[2], c_audio)):
        assert dominant_pitches(audio) == pytest.approx(pitches_of(text), abs=15)


async def test_an_engine_error_fails_its_own_member_and_the_batch_carries_on(stopping):
    engine = BatchToneEngine(max_batch=4, gated=True)
    worker = start(engine)
    stopping.append((worker, engine))
    texts = ["one two three.", "four explode five.", "six seven eight."]
    results = await run_together(worker, engine, texts)
    failed_audio, failed = results[1]
    assert isinstance(failed, Failed) and failed.code == "engine_error"
    assert failed_audio.size == WORD  # "four", then it failed on the step that exploded
    for i in (0, 2):
        audio, end = results[i]
        assert isinstance(end, Done) and dominant_pitches(audio) == pytest.approx(pitches_of(texts[i]), abs=15)
    assert worker.stats.failures == 1


async def test_a_whole_batch_failure_is_pinned_on_its_member_by_stepping_alone(stopping):
    engine = BatchToneEngine(max_batch=4, gated=True)
    worker = start(engine)
    stopping.append((worker, engine))
    texts = ["one two three.", "four boom five.", "six seven eight."]
    results = await run_together(worker, engine, texts)
    assert isinstance(results[1][1], Failed) and results[1][1].code == "engine_error"
    for i in (0, 2):
        audio, end = results[i]
        assert isinstance(end, Done) and dominant_pitches(audio) == pytest.approx(pitches_of(texts[i]), abs=15)
    # The failed batch of three, then each of its members alone, then the two survivors.
    sizes = [len(b) for b in engine.batches[1:]]
    assert sizes[:5] == [3, 3, 1, 1, 1]


async def test_the_memory_budget_makes_newcomers_wait_and_then_complete(stopping):
    # Each stream holds 100 bytes per word; the budget fits two three-word streams.
    engine = BatchToneEngine(max_batch=8, memory_per_word=100)
    worker = start(engine, memory_budget=600)
    stopping.append((worker, engine))
    texts = ["a b c.", "d e f.", "g h i.", "j k l."]
    results = await run_together(worker, engine, texts)
    for text, (audio, end) in zip(texts, results):
        assert isinstance(end, Done) and audio.size == 3 * WORD
    assert max(len(b) for b in engine.batches) == 2  # never more than the budget holds
    assert worker.stats.memory_waits >= 1
    assert worker.memory.used == 0  # every admitted stream gave its memory back


async def test_a_segment_larger_than_the_whole_budget_fails_clearly(stopping):
    engine = BatchToneEngine(max_batch=8, memory_per_word=100)
    worker = start(engine, memory_budget=250)
    stopping.append((worker, engine))
    (_, big_end), (audio, small_end) = await run_together(worker, engine, ["far too many words here.", "ok."])
    assert isinstance(big_end, Failed) and big_end.code == "over_memory_budget"
    assert "MiB" in big_end.message
    assert isinstance(small_end, Done) and audio.size == WORD
