"""The thread contract between the event loop and the worker (engine/worker_lock.py),
through a real pipeline and worker: what a door asks of a speech on the event loop
(whether its listener holds it up, an abort) reaches the worker's side only under its
lock, and an aborted utterance ends failed, never done."""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from collections.abc import AsyncIterator, Callable

import pytest

from voxwire.engine import worker as worker_module
from voxwire.engine.audio_queue import AudioQueue
from voxwire.engine.worker import Worker
from voxwire.engine.worker_options import WorkerOptions
from voxwire.server.config import ServerConfig
from voxwire.server.doors import DOORS
from voxwire.server.protocol import StreamSettings
from voxwire.server.service import Service
from voxwire.server.speech import Speech, UtteranceRequest
from tests.fixtures.engines import RATE, ToneEngine
from tests.fixtures.waiting import wait_until

Utterance = worker_module.Utterance
ABORT = ("shutting_down", "the server stopped before this utterance was done")


@contextlib.asynccontextmanager
async def tone_service(max_queue_seconds: float = 0.2) -> AsyncIterator[Service]:
    """A service around the tone engine, its worker started and no door bound."""
    service = Service(
        ServerConfig(cache_mb=0), DOORS, lambda: Worker(ToneEngine, WorkerOptions(max_queue_seconds=max_queue_seconds)),
    )
    service.supervisor.start()
    try:
        await asyncio.to_thread(service.supervisor.wait_ready, 30)
        yield service
    finally:
        service.supervisor.stop()


def speak(service: Service, text: str) -> Speech:
    return service.pipeline.open(UtteranceRequest("ws", text, True, StreamSettings(voice="tone", sample_rate=RATE), {}))


async def last_event(speech: Speech) -> str:
    """Read its events to the end: the name of the last one."""
    name = ""
    async for event in speech.events():
        name = type(event).__name__
    return name


def spy(monkeypatch: pytest.MonkeyPatch, cls: type, name: str, seen: Callable[[object], None]) -> None:
    real = getattr(cls, name)

    def wrapped(self: object, *args: object, **kwargs: object) -> object:
        seen(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(cls, name, wrapped)


async def test_held_by_listener_and_abort_reach_the_worker_only_under_its_lock(monkeypatch):
    loop_thread = threading.current_thread()
    watching = False
    wrong: list[str] = []  # worker-thread methods that ran on the event loop without the lock

    def on_loop_unlocked(what: str) -> Callable[[object], None]:
        def seen(obj: object) -> None:
            lock = getattr(obj, "_lock", None)
            held = getattr(lock, "held", lambda: False)()
            if watching and threading.current_thread() is loop_thread and not held:
                wrong.append(what)
        return seen

    spy(monkeypatch, Utterance, "runnable", on_loop_unlocked("Utterance.runnable"))
    spy(monkeypatch, AudioQueue, "put", on_loop_unlocked("AudioQueue.put"))
    async with tone_service() as service:
        speech = speak(service, "word " * 60 + "end.")  # 6 s of audio; its queue holds 0.2 s
        events = speech.events()
        await anext(events)  # its first audio is out; then nobody reads
        watching = True
        await wait_until(lambda: speech.held_by_listener)
        speech.abort(*ABORT)
        last = ""
        async for event in events:
            last = type(event).__name__
        watching = False
        speech.end("failed", ABORT[0])
    assert last == "FailedEvent"
    assert wrong == []


async def test_an_utterance_aborted_as_its_worker_finishes_it_ends_failed_not_done(monkeypatch):
    """The worker has found all of it spoken and is about to end it when the abort comes:
    the abort wins, so nothing the worker then puts follows or precedes its Failed."""
    at_the_end, go = threading.Event(), threading.Event()
    real_all_spoken, real_clear = Utterance.all_spoken, AudioQueue.clear

    def all_spoken(self: Utterance) -> bool:
        spoken = real_all_spoken(self)
        if spoken and not at_the_end.is_set():
            at_the_end.set()
            go.wait(5)  # hold the worker here, its decision made, until the abort is in
        return spoken

    def clear(self: AudioQueue) -> int:
        # A worker that puts between an abort's clear and its Failed gets its chance here.
        dropped = real_clear(self)
        if at_the_end.is_set() and not go.is_set():
            go.set()
            threading.Event().wait(0.3)
        return dropped

    monkeypatch.setattr(Utterance, "all_spoken", all_spoken)
    monkeypatch.setattr(AudioQueue, "clear", clear)
    async with tone_service(max_queue_seconds=30.0) as service:
        speech = speak(service, "one two.")
        await asyncio.to_thread(at_the_end.wait, 10)
        speech.abort(*ABORT)
        go.set()
        last = await last_event(speech)
        speech.end("failed", ABORT[0])
    assert last == "FailedEvent"


async def test_under_load_an_aborted_utterance_ends_as_its_worker_says():
    """Many utterances, each aborted at a random moment of its life: one aborted before
    it ended ends failed; one that finished first ends done. The event the door sees and
    the worker's outcome always agree, and nothing follows a Failed."""
    rng = random.Random(46)
    outcomes: set[tuple[str, str | None]] = set()
    async with tone_service(max_queue_seconds=30.0) as service:
        worker = service.worker
        submitted: list[Utterance] = []
        submit = worker.submit

        def recording_submit(*args: object, **kwargs: object) -> Utterance:
            submitted.append(submit(*args, **kwargs))  # type: ignore[arg-type]
            return submitted[-1]

        worker.submit = recording_submit  # type: ignore[method-assign]
        for _ in range(150):
            speech = speak(service, rng.choice(["one.", "one two.", "one two three."]))
            utterance = submitted[-1]
            await asyncio.sleep(rng.uniform(0, 0.004))
            speech.abort(*ABORT)
            last = await last_event(speech)
            speech.end("done" if last == "DoneEvent" else "failed", None if last == "DoneEvent" else ABORT[0])
            await wait_until(lambda: utterance.outcome is not None)
            outcomes.add((last, utterance.outcome))
    assert outcomes <= {("DoneEvent", "finished"), ("FailedEvent", "failed")}
