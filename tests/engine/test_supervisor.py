"""The watchdog: a hung engine step fails its utterance, and a fresh worker takes over."""

import asyncio

import numpy as np

from voxwire.engine.base import SynthesisParams
from voxwire.engine.audio_queue import Done, Failed
from voxwire.engine.supervisor import Supervisor
from voxwire.engine.worker import Worker
from voxwire.engine.worker_options import WorkerOptions
from tests.engine.test_worker import drain
from tests.fixtures.engines import ToneEngine

TONE = SynthesisParams(voice="tone")


async def test_hung_step_is_abandoned_and_a_new_worker_serves():
    engines: list[ToneEngine] = []

    def make() -> Worker:
        def factory():
            engines.append(ToneEngine())
            return engines[-1]

        return Worker(factory, WorkerOptions(warmup=False))

    sup = Supervisor(make, step_timeout=0.3).start()
    sup.wait_ready(10)
    loop = asyncio.get_running_loop()
    try:
        first = sup.worker
        hung = first.submit(TONE, loop)
        hung.feed("one stall three.", final=True)
        waiting = first.submit(TONE, loop)
        waiting.feed("patient words.", final=True)
        _, end = await drain(hung)
        assert isinstance(end, Failed) and end.code == "engine_timeout"
        _, end2 = await drain(waiting)
        # It may have finished before the stall, or been told to retry: never left hanging.
        assert isinstance(end2, Done) or (isinstance(end2, Failed) and end2.code == "engine_restarted")
        assert sup.restarts == 1 and sup.worker is not first
        sup.wait_ready(10)
        fresh = sup.worker.submit(TONE, loop)
        fresh.feed("after the restart.", final=True)
        audio, end3 = await drain(fresh)
        assert isinstance(end3, Done) and np.abs(audio).max() > 0.4
        # The stuck thread exits once its step returns, closing what it held.
        engines[0].release.set()
        first._thread.join(5)
        assert not first.alive
    finally:
        for e in engines:
            e.release.set()
        sup.stop()
