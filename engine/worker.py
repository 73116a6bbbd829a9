"""One inference thread per device: it owns the engine and advances every utterance.

Each utterance keeps its model state in the engine's generator between steps, so many
utterances are alive at once while the thread advances one of them at a time, in the
order engine/scheduler.py decides. Callers on the event loop only append text, flush or
cancel, under the worker's lock; the worker alone touches generators, so a cancelled
utterance's generator is closed on the thread that runs it, before its next step.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, replace
from enum import Enum
from typing import TypeVar

import numpy as np

from engine import scheduler
from engine.base import Engine, EngineError, SynthesisParams, WordTimings
from engine.audio_queue import AudioQueue, Failed, Finished, Flushed
from engine.text.segment import Segmenter, SegmenterLimits

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class WorkerStats:
    steps: int = 0
    generators_closed: int = 0
    failures: int = 0
    busy_seconds: float = 0.0


class State(Enum):
    """Where an utterance is in its life. The first three are alive; the last three are
    ended, each once, by the worker (or by a watchdog that gives up on its thread)."""

    OPEN = "open"
    """Text may still come."""
    COMPLETE = "complete"
    """All its text has arrived; it is being spoken."""
    CANCELLING = "cancelling"
    """Its session cancelled it; the worker closes its generator before its next step."""
    FINISHED = "finished"
    CANCELLED = "cancelled"
    FAILED = "failed"


ENDED = frozenset({State.FINISHED, State.CANCELLED, State.FAILED})


class Utterance:
    """One utterance's state, shared between its session and the worker. The session
    feeds, flushes and cancels; the worker takes segments and steps them, through the
    methods below, under the worker's lock where the two meet."""

    def __init__(self, worker: Worker, params: SynthesisParams, queue: AudioQueue, limits: SegmenterLimits) -> None:
        self.params = params
        self.queue = queue
        self.submitted_at = time.monotonic()
        self.first_audio_at: float | None = None
        self.produced_samples = 0
        self.steps = 0
        self.segments = 0
        self.compute_seconds = 0.0
        self.state = State.OPEN
        self._worker = worker
        self._segmenter = Segmenter(limits)
        self._todo: deque[str | Flushed] = deque()
        self._current: Iterator[np.ndarray | WordTimings] | None = None
        self._segment_start = 0

    # -- called by the session, on the event loop ---------------------------------------

    def feed(self, text: str, final: bool = False) -> None:
        """Add text; ``final`` says no more follows."""
        with self._worker._cond:
            self._todo.extend(self._segmenter.push(text))
            if final:
                self._todo.extend(self._segmenter.flush())
                if self.state is State.OPEN:
                    self.state = State.COMPLETE
            self._worker._cond.notify()

    def flush(self) -> None:
        """Synthesise what is buffered now, then mark the point with ``Flushed``."""
        with self._worker._cond:
            self._todo.extend(self._segmenter.flush())
            self._todo.append(Flushed())
            self._worker._cond.notify()

    def cancel(self) -> None:
        with self._worker._cond:
            if self.state in (State.OPEN, State.COMPLETE):
                self.state = State.CANCELLING
            self._worker._cond.notify()

    @property
    def complete(self) -> bool:
        """No more text will come (all of it arrived, or it was cancelled or ended)."""
        return self.state is not State.OPEN

    @property
    def outcome(self) -> str | None:
        """``finished``, ``cancelled`` or ``failed`` once it has ended; None before."""
        return self.state.value if self.state in ENDED else None

    @property
    def generator_closed(self) -> bool:
        """It has ended and no engine generator of its is left open."""
        return self.state in ENDED and self._current is None

    @property
    def produced_seconds(self) -> float:
        return self.produced_samples / self._worker.sample_rate

    # -- scheduling (under the worker's lock) -------------------------------------------

    def runnable(self) -> bool:
        return self.state is State.COMPLETE or (
            self.state is State.OPEN and (self._current is not None or bool(self._todo))
        )

    # -- the worker's side (on the inference thread) ------------------------------------

    @property
    def in_segment(self) -> bool:
        return self._current is not None

    def take(self) -> str | Flushed | None:
        """What to do next between segments: a segment's text, a flush marker, or None
        when every segment has been spoken."""
        with self._worker._cond:
            return self._todo.popleft() if self._todo else None

    def begin_segment(self, pieces: Iterator[np.ndarray | WordTimings]) -> None:
        self.segments += 1
        self._segment_start = self.produced_samples
        self._current = pieces

    def next_piece(self) -> np.ndarray | WordTimings | None:
        """The segment's next piece; None when the segment is done."""
        assert self._current is not None
        try:
            return next(self._current)
        except StopIteration:
            self._current = None
            return None

    def on_utterance_timeline(self, words: WordTimings) -> WordTimings:
        """Segment-relative word timings from the engine, on the utterance's timeline."""
        shift = self._segment_start
        return WordTimings(tuple(replace(w, start=w.start + shift, end=w.end + shift) for w in words.words))

    def close_generator(self) -> bool:
        """Close the engine generator in progress, if any; True if there was one."""
        if self._current is None:
            return False
        try:
            self._current.close()
        except Exception:
            log.exception("engine generator failed to close")
        self._current = None
        return True

    def backlogged(self) -> bool:
        return self.queue.full()


class Worker:
    """Owns an engine on one device and runs the scheduling loop on its own thread."""

    def __init__(
        self,
        engine_factory: Callable[[], Engine],
        max_queue_seconds: float = 5.0,
        segmenter_limits: SegmenterLimits = SegmenterLimits(),
        name: str = "voxwire-worker",
        warmup: bool = True,
    ) -> None:
        self.stats = WorkerStats()
        self.on_step: Callable[[float], None] | None = None
        """Called on this thread with each engine step's duration (a metrics hook)."""
        self.max_queue_seconds = max_queue_seconds
        self.segmenter_limits = segmenter_limits
        self.ready = threading.Event()
        self.load_error: BaseException | None = None
        self.engine: Engine | None = None
        self._factory = engine_factory
        self._warmup = warmup
        self._cond = threading.Condition()
        self._utterances: list[Utterance] = []
        self._stopping = False
        self._calls: deque[tuple[Callable[[Engine], object], Future[object]]] = deque()
        self._stepping: Utterance | None = None
        self._calling: Future[object] | None = None
        self._step_started_at: float | None = None
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> Worker:
        if not self._thread.is_alive() and not self.ready.is_set():
            self._thread.start()
        return self

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def wait_ready(self, timeout: float | None = None) -> Engine:
        """Block until the engine is loaded and warm; re-raise a load failure."""
        if not self.ready.wait(timeout):
            raise TimeoutError("engine did not load in time")
        if self.load_error is not None:
            raise self.load_error
        assert self.engine is not None
        return self.engine

    def stop(self, timeout: float = 10.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def sample_rate(self) -> int:
        assert self.engine is not None
        return self.engine.sample_rate

    @property
    def active(self) -> int:
        with self._cond:
            return len(self._utterances)

    # -- submission (event loop) --------------------------------------------------------

    def loaded_engine(self) -> Engine:
        """The engine, or an EngineError a client can be told while it is not usable."""
        if self.ready.is_set() and self.load_error is None and self.engine is not None and not self._stopping:
            return self.engine
        if self._stopping:
            raise EngineError("shutting_down", "the engine is stopping")
        raise EngineError("not_ready", "the engine is loading; try again shortly")

    def utterances(self) -> list[Utterance]:
        with self._cond:
            return list(self._utterances)

    def step_running_for(self) -> float:
        """How long the step in progress has run (0 when idle): what a watchdog reads."""
        started = self._step_started_at
        return 0.0 if started is None else time.monotonic() - started

    def abandon(self, code: str, message: str) -> None:
        """Give up on a stuck thread: fail the utterance in its step with ``code`` and
        every other one with ``engine_restarted``, then let the thread exit if it ever
        returns. Called from another thread; the stuck one cannot be interrupted."""
        with self._cond:
            self._stopping = True
            stuck, leftover, self._utterances = self._stepping, self._utterances, []
            calls, self._calls = list(self._calls), deque()
            running_call, self._calling = self._calling, None
            self._cond.notify()
        if running_call is not None and not running_call.done():
            running_call.set_exception(EngineError(code, message))
        for _, future in calls:
            future.set_exception(EngineError("engine_restarted", "the engine was restarted after a fault; retry"))
        for u in leftover:
            u.state = State.FAILED
            self.stats.failures += 1
            if u is stuck:
                u.queue.put(Failed(code, message))
            else:
                u.queue.put(Failed("engine_restarted", "the engine was restarted after a fault; please retry"))

    def submit(self, params: SynthesisParams, loop: asyncio.AbstractEventLoop) -> Utterance:
        engine = self.loaded_engine()
        queue = AudioQueue(loop, int(self.max_queue_seconds * engine.sample_rate), on_drain=self._wake)
        u = Utterance(self, params, queue, self.segmenter_limits)
        with self._cond:
            if self._stopping:
                raise EngineError("shutting_down", "the server is shutting down")
            self._utterances.append(u)
            self._cond.notify()
        return u

    def call(self, fn: Callable[[Engine], T]) -> Future[T]:
        """Run ``fn(engine)`` on the inference thread, between two steps: engines are
        only ever touched from their own thread (voice registration, for one)."""
        self.loaded_engine()
        future: Future[T] = Future()
        with self._cond:
            if self._stopping:
                raise EngineError("shutting_down", "the engine is stopping")
            self._calls.append((fn, future))  # type: ignore[arg-type]
            self._cond.notify()
        return future

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify()

    # -- the inference thread -----------------------------------------------------------

    def _main(self) -> None:
        try:
            self.engine = self._factory()
            if self._warmup:
                self.engine.warmup()
        except BaseException as e:  # reported to whoever waits for readiness
            log.exception("engine failed to load")
            self.load_error = e
            self.ready.set()
            return
        self.ready.set()
        try:
            self._loop(self.engine)
        finally:
            with self._cond:
                leftover, self._utterances = self._utterances, []
            for u in leftover:
                self._end(u, State.CANCELLED, None)
            self.engine.close()

    def _loop(self, engine: Engine) -> None:
        while True:
            with self._cond:
                while True:
                    if self._stopping:
                        return
                    cancelled = [u for u in self._utterances if u.state is State.CANCELLING]
                    for u in cancelled:
                        self._utterances.remove(u)
                    call = self._calls.popleft() if self._calls else None
                    chosen = [] if call else scheduler.pick(self._utterances)
                    if chosen or cancelled or call:
                        break
                    self._cond.wait()
            for u in cancelled:
                self._end(u, State.CANCELLED, None)
            if call is not None:
                self._run_call(engine, *call)
            if chosen:
                self._advance(engine, chosen[0])

    def _run_call(self, engine: Engine, fn: Callable[[Engine], object], future: Future[object]) -> None:
        if not future.set_running_or_notify_cancel():
            return
        self._calling, self._step_started_at = future, time.monotonic()
        try:
            result = fn(engine)
        except BaseException as e:  # handed to the caller, who decides what it means
            if not future.done():
                future.set_exception(e)
        else:
            if not future.done():  # a watchdog may have failed it already
                future.set_result(result)
        finally:
            self._calling, self._step_started_at = None, None

    def _advance(self, engine: Engine, u: Utterance) -> None:
        """One engine step for ``u``: start its next segment if none is in progress, take
        one piece from it, and hand the piece to its queue."""
        segment = None
        if not u.in_segment:
            segment = u.take()
            if segment is None:  # complete, and every segment has been spoken
                self._end(u, State.FINISHED, Finished())
                return
            if isinstance(segment, Flushed):
                u.queue.put(segment)
                return
        piece = self._step(engine, u, segment)
        if piece is not None:
            self._deliver(u, piece)

    def _step(self, engine: Engine, u: Utterance, segment: str | None) -> np.ndarray | WordTimings | None:
        """Run the engine for one piece, timed and contained: an engine error fails this
        utterance alone. None when there is nothing to deliver."""
        start = time.perf_counter()
        self._stepping, self._step_started_at = u, time.monotonic()
        try:
            if segment is not None:
                u.begin_segment(iter(engine.synthesize(segment, u.params)))
            piece = u.next_piece()
        except EngineError as e:
            self._end(u, State.FAILED, Failed(e.code, e.message))
            return None
        except Exception:  # contained: this utterance fails, the others go on
            log.exception("engine error in utterance")
            # The message is for the listener; the exception and its trace are in the log.
            self._end(u, State.FAILED, Failed("engine_error", "the engine failed on this utterance; the others go on"))
            return None
        finally:
            self._stepping, self._step_started_at = None, None
            elapsed = time.perf_counter() - start
            u.compute_seconds += elapsed
            u.steps += 1
            self.stats.steps += 1
            self.stats.busy_seconds += elapsed
            if self.on_step is not None:
                self.on_step(elapsed)
        if u.state in ENDED:  # abandoned while this step ran: its audio goes nowhere
            self._end(u, State.FAILED, None)
            return None
        return piece

    def _deliver(self, u: Utterance, piece: np.ndarray | WordTimings) -> None:
        if isinstance(piece, WordTimings):
            u.queue.put(u.on_utterance_timeline(piece))
            return
        audio = np.asarray(piece, dtype=np.float32).reshape(-1)
        if audio.size:
            if u.first_audio_at is None:
                u.first_audio_at = time.monotonic()
            u.produced_samples += audio.size
            u.queue.put(audio)

    def _end(self, u: Utterance, state: State, item: Finished | Failed | None) -> None:
        if u.close_generator():
            self.stats.generators_closed += 1
        if u.state in ENDED:
            return  # already ended and reported (abandoned by a watchdog)
        u.state = state
        if state is State.FAILED:
            self.stats.failures += 1
        with self._cond:
            if u in self._utterances:
                self._utterances.remove(u)
        if item is not None:
            u.queue.put(item)
