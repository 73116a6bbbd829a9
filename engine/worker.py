"""One inference thread per device: it owns the engine and advances every utterance.

Each utterance keeps its model state in an engine ``Stream`` between steps, so many
utterances are alive at once. Each step advances a batch of them together: the ones
engine/scheduler.py picks, up to the engine's batch size, step budget and memory budget
(continuous batching: newcomers join between steps, finished ones leave). Callers on the
event loop only append text, flush, cancel or abort, under the worker's lock
(engine/worker_lock.py); the worker alone touches streams, so a cancelled utterance's
stream is closed on the thread that runs it, before its next step, while the rest of its
batch carries on. Text is segmented here too, on this thread and outside the lock: text
processing, however long, never holds up the event loop that every connection shares.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TypeVar

import numpy as np

from voxwire.engine import scheduler
from voxwire.engine.audio_queue import AudioQueue, Done, Failed, Flushed
from voxwire.engine.base import Engine, EngineError, Step, Stream, SynthesisParams, WordTimings
from voxwire.engine.errors import ErrorCode
from voxwire.engine.memory_budget import MemoryBudget
from voxwire.engine.text.lexicon import Lexicon
from voxwire.engine.text.ssml import Break, Rate
from voxwire.engine.utterance import ENDED, State, Utterance
from voxwire.engine.worker_lock import WorkerLock
from voxwire.engine.worker_options import GATHER_CAP, WorkerOptions

log = logging.getLogger(__name__)
T = TypeVar("T")

RESTARTED = Failed(ErrorCode.ENGINE_RESTARTED, "the engine was restarted after a fault; please retry")


@dataclass
class WorkerStats:
    steps: int = 0
    """Engine step calls; each advances a batch."""
    streams_closed: int = 0
    """Streams closed before their segment was done (cancel, disconnect, failure)."""
    failures: int = 0
    busy_seconds: float = 0.0
    batch_sizes: Counter[int] = field(default_factory=Counter)
    """Steps by the number of utterances they advanced."""
    memory_waits: int = 0
    """Times a stream that was due to run waited because the memory budget was spent."""
    cpu_threads: int = 0
    """The CPU threads the last step ran with (the options' thread policy: fewer while
    other processes keep the cores busy)."""


# A newcomer whose stream is open is behind once it has waited this many of the worker's
# recent steps for its first audio, and at least a second: a first step is one step, and
# a burst shares a few; an engine whose steps take seconds (CosyVoice2 on a CPU) gets as
# many of its own.
FIRST_AUDIO_ALLOWANCE_STEPS = 4
FIRST_AUDIO_ALLOWANCE_SECONDS = 1.0
STEP_SECONDS_WEIGHT = 0.1

# A voice's compute per second of audio is a running ratio of decayed sums, so recent
# steps count most and each step counts by the audio it made: a first piece's short,
# dear step does not stand for the whole of a stream.
COST_DECAY = 0.95
# An utterance is judged by its own figure once it has made this much audio (its speed,
# its text's make-up), before that by its voice's.
OWN_COST_AFTER_SECONDS = 2.0


class Worker:
    """Owns an engine on one device and runs the scheduling loop on its own thread."""

    def __init__(self, engine_factory: Callable[[], Engine], options: WorkerOptions = WorkerOptions()) -> None:
        self.options = options
        self.gather_seconds = options.gather_seconds if options.max_batch != 1 else 0.0
        self.stats = WorkerStats()
        self.on_step: Callable[[float, int], None] | None = None
        """Called on this thread with each engine step's duration and batch size (a
        metrics hook)."""
        self.ready = threading.Event()
        self.load_error: BaseException | None = None
        self.engine: Engine | None = None
        self.max_batch = 1
        self.memory = MemoryBudget()
        """The engine memory its streams hold; its limit is set once the engine loads."""
        self._factory = engine_factory
        self._lock = WorkerLock()
        self._utterances: list[Utterance] = []
        self._stopping = False
        self._calls: deque[tuple[Callable[[Engine], object], Future[object]]] = deque()
        self._stepping: list[Utterance] = []
        self._calling: Future[object] | None = None
        self._step_started_at: float | None = None
        self._step_seconds = 0.0
        """A running mean of its steps' durations (exponentially weighted)."""
        self._costs: dict[str | None, tuple[float, float]] = {}
        """Compute seconds and audio seconds, decayed (``COST_DECAY``), by voice; None for
        every voice together. Written by this thread, read by ``load``, under the lock."""
        self._loader: ThreadPoolExecutor | None = None
        self._loading: dict[str, Future[None]] = {}
        """Voices being loaded off this thread (``Engine.load_voice``), by id."""
        self._thread = threading.Thread(target=self._main, name=options.name, daemon=True)
        self._lock.thread = self._thread

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
        with self._lock:
            self._stopping = True
            self._lock.changed()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def sample_rate(self) -> int:
        assert self.engine is not None
        return self.engine.sample_rate

    @property
    def active(self) -> int:
        with self._lock:
            return len(self._utterances)

    # -- submission (event loop) --------------------------------------------------------

    def loaded_engine(self) -> Engine:
        """The engine, or an EngineError a client can be told while it is not usable."""
        if self.ready.is_set() and self.load_error is None and self.engine is not None and not self._stopping:
            return self.engine
        if self._stopping:
            raise EngineError(ErrorCode.SHUTTING_DOWN, "the engine is stopping")
        raise EngineError(ErrorCode.NOT_READY, "the engine is loading; try again shortly")

    def behind_seconds(self) -> float:
        """How long the listener worst served has been out of audio this worker still has
        to compute (0: none is): a playing one past its playback deadline, or a newcomer
        whose stream has waited for its first audio longer than a first step should take
        (a few of this worker's recent steps, at least a second). Above zero the worker
        cannot keep up with the listeners it has: the measure admission refuses
        newcomers by (server/pipeline.py). Any thread; takes the lock."""
        allowance = max(FIRST_AUDIO_ALLOWANCE_SECONDS, FIRST_AUDIO_ALLOWANCE_STEPS * self._step_seconds)
        now, behind = time.monotonic(), 0.0
        with self._lock:
            for u in self._utterances:
                # runnable() is False for a cancelled one: its audio is wanted by nobody.
                if not u.runnable() or u.backlogged():
                    continue
                if u.first_audio_at is not None:
                    behind = max(behind, now - scheduler.playback_deadline(u))
                elif u.ready_at is not None:
                    behind = max(behind, now - u.ready_at - allowance)
        return behind

    def load(self) -> float:
        """The share of this worker's time its listeners need to be heard in real time:
        the sum, over the utterances with work left, of their compute per second of audio
        (an utterance's own once it has made ``OWN_COST_AFTER_SECONDS`` of audio, else
        ``stream_cost`` of its voice). Past 1 the worker falls behind its listeners. Where
        a wider step costs as much more time as it is wider (a CPU), one more stream adds
        its cost; on a GPU it adds less. Any thread; takes the lock."""
        with self._lock:
            total = 0.0
            for u in self._utterances:
                if not u.runnable():  # ended, cancelled, or waiting for text: costs nothing now
                    continue
                made = u.produced_seconds
                total += u.compute_seconds / made if made >= OWN_COST_AFTER_SECONDS else self._cost(u.params.voice)
        return total

    def stream_cost(self, voice: str) -> float:
        """What a stream of ``voice`` has cost of late, in compute seconds per second of
        audio: its voice's figure, else every voice's, else 0 (nothing measured yet)."""
        with self._lock:
            return self._cost(voice)

    def _cost(self, voice: str) -> float:
        spent, made = self._costs.get(voice) or self._costs.get(None) or (0.0, 0.0)
        return spent / made if made > 0 else 0.0

    def utterances(self) -> list[Utterance]:
        with self._lock:
            return list(self._utterances)

    def step_running_for(self) -> float:
        """How long the step in progress has run (0 when idle): what a watchdog reads."""
        started = self._step_started_at
        return 0.0 if started is None else time.monotonic() - started

    def abandon(self, code: ErrorCode, message: str) -> None:
        """Give up on a stuck thread: fail the utterances in its step with ``code`` and
        every other one with ``engine_restarted``, then let the thread exit if it ever
        returns. Called from another thread; the stuck one cannot be interrupted."""
        with self._lock:
            self._stopping = True
            stuck, leftover, self._utterances = list(self._stepping), self._utterances, []
            calls, self._calls = list(self._calls), deque()
            running_call, self._calling = self._calling, None
            for u in leftover:
                if u.state in ENDED:
                    continue  # aborted: its own Failed is its last item
                u.state = State.FAILED
                self.stats.failures += 1
                # The stuck thread may yet put audio: end_with drops it.
                u.queue.end_with(Failed(code, message) if u in stuck else RESTARTED)
            self._lock.changed()
        if running_call is not None and not running_call.done():
            running_call.set_exception(EngineError(code, message))
        for _, future in calls:
            future.set_exception(
                EngineError(ErrorCode.ENGINE_RESTARTED, "the engine was restarted after a fault; retry"),
            )

    def submit(
        self, params: SynthesisParams, loop: asyncio.AbstractEventLoop, first_clause_words: int | None = None
    ) -> Utterance:
        """``first_clause_words``: this utterance's own choice (SegmenterLimits), else the worker's."""
        engine = self.loaded_engine()
        voice = engine.voice(params.voice)
        rate = voice.sample_rate if voice is not None else engine.sample_rate
        queue = AudioQueue(
            loop, int(self.options.max_queue_seconds * rate), on_drain=self._wake, producer=self._lock,
        )
        limits = self.options.segmenter_limits
        if first_clause_words is not None:
            limits = replace(limits, first_clause_words=first_clause_words)
        u = Utterance(self._lock, rate, params, queue, limits)
        u.lexicon_unchecked = bool(params.lexicon) and voice is not None and not voice.installed
        with self._lock:
            if self._stopping:
                raise EngineError(ErrorCode.SHUTTING_DOWN, "the server is shutting down")
            self._utterances.append(u)
            self._lock.changed()
        return u

    def call(self, fn: Callable[[Engine], T]) -> Future[T]:
        """Run ``fn(engine)`` on the inference thread, between two steps: engines are
        only ever touched from their own thread (voice registration, for one)."""
        self.loaded_engine()
        future: Future[T] = Future()
        with self._lock:
            if self._stopping:
                raise EngineError(ErrorCode.SHUTTING_DOWN, "the engine is stopping")
            self._calls.append((fn, future))  # type: ignore[arg-type]
            self._lock.changed()
        return future

    def _wake(self) -> None:
        with self._lock:
            self._lock.changed()

    # -- the inference thread -----------------------------------------------------------

    def _main(self) -> None:
        try:
            self.engine = self._factory()
            if self.options.warmup:
                self.engine.warmup()
        except BaseException as e:  # reported to whoever waits for readiness
            log.exception("engine failed to load")
            self.load_error = e
            self.ready.set()
            return
        engine = self.engine
        self.max_batch = max(1, min(engine.max_batch, self.options.max_batch or engine.max_batch))
        self.memory.limit = self.options.memory_budget or engine.memory_budget
        self.ready.set()
        try:
            self._loop(engine)
        finally:
            with self._lock:
                leftover, self._utterances = self._utterances, []
            for u in leftover:
                self._end(u, State.CANCELLED, None)
            if self._loader is not None:
                self._loader.shutdown(wait=False, cancel_futures=True)
            engine.close()

    def _loop(self, engine: Engine) -> None:
        seen = -1
        while True:
            with self._lock:
                idle = False
                while self._lock.changes == seen and not self._stopping:
                    self._lock.wait()  # nothing could run, and nothing has changed since
                    idle = True
                if idle and self.gather_seconds > 0 and all(u.stream is None for u in self._utterances):
                    self._gather()
                if self._stopping:
                    return
                seen = self._lock.changes
                # Cancelled, or aborted by the server (ended, its stream maybe still open):
                # each stays counted in `active` until _end has closed its stream.
                cancelled = [u for u in self._utterances if u.state is State.CANCELLING or u.state in ENDED]
                call = self._calls.popleft() if self._calls else None
            for u in cancelled:
                self._end(u, State.CANCELLED, None)
            if call is not None:
                self._run_call(engine, *call)
                seen = -1
                continue
            opened = self._between_segments(engine)
            batch = self._choose()
            if batch:
                self._step(engine, batch)
            if batch or opened or cancelled:
                seen = -1  # made progress: look again at once

    def _gather(self) -> None:
        """Woken from idle by a newcomer: wait for the rest of its burst, until no request
        has come for ``gather_seconds`` (at most GATHER_CAP times that), so that all of
        them share the first step instead of queueing behind a step of one. Called
        holding the lock, which ``wait`` releases."""
        now = time.monotonic()
        quiet_until, cap = now + self.gather_seconds, now + GATHER_CAP * self.gather_seconds
        while not self._stopping and (left := min(quiet_until, cap) - time.monotonic()) > 0:
            changes = self._lock.changes
            self._lock.wait(left)
            if self._lock.changes != changes:  # another arrived: the burst may go on
                quiet_until = time.monotonic() + self.gather_seconds

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

    def _between_segments(self, engine: Engine) -> bool:
        """For each utterance with no stream, do what comes next: pass on a flush marker,
        finish it once all its text is spoken, or open its next segment's stream (cheap:
        no model work). Whether anything happened."""
        with self._lock:
            idle = [u for u in self._utterances if u.stream is None and u.runnable() and not u.backlogged()]
        acted = False
        for u in idle:
            if u.state in ENDED or not self._voice_ready(engine, u):
                continue
            while u.state in (State.OPEN, State.COMPLETE):
                segment = u.take()
                if segment is None:
                    if u.all_spoken():
                        self._end(u, State.FINISHED, Done())
                        acted = True
                    break
                acted = True
                if isinstance(segment, Flushed):
                    u.queue.put(segment)
                    continue
                if isinstance(segment, Rate):
                    u.speed = segment.speed
                    continue
                if isinstance(segment, Break):
                    # Exact silence at the voice's rate, on the utterance's timeline: the
                    # words after it are timed after it.
                    self._deliver(u, Step([np.zeros(round(segment.seconds * u.sample_rate), np.float32)], done=False))
                    continue
                self._open(engine, u, segment)
                break
        return acted

    def _voice_ready(self, engine: Engine, u: Utterance) -> bool:
        """Whether ``u``'s voice is loaded. If not, it is loaded on a thread of its own,
        once for all who wait for it, while the steps of every other voice go on; ``u``
        waits, and is failed with the load's error if it fails."""
        voice = u.params.voice
        if engine.voice_loaded(voice):
            self._loading.pop(voice, None)
            return True
        loading = self._loading.get(voice)
        if loading is None or (loading.done() and loading.exception() is None):
            # Not asked for yet; or its load found it loaded, and it has been unloaded
            # since (the bound is below the voices in use): load it again.
            if self._loader is None:
                self._loader = ThreadPoolExecutor(1, thread_name_prefix=f"{self.options.name}-voices")
            log.info("loading voice %s", voice)
            loading = self._loading[voice] = self._loader.submit(engine.load_voice, voice)
            loading.add_done_callback(lambda _: self._wake())
            return False
        if not loading.done():
            return False
        error = loading.exception()
        assert error is not None
        del self._loading[voice]  # the next request tries again
        with self._lock:
            waiting = [w for w in self._utterances if w.params.voice == voice and w.stream is None]
        for w in waiting:
            self._fail(w, error if isinstance(error, Exception) else RuntimeError(error))
        return False

    def _open(self, engine: Engine, u: Utterance, segment: str) -> None:
        try:
            text, inline = u.written(segment)
            params = u.params if u.speed is None else replace(u.params, speed=u.speed)
            voice = engine.voice(params.voice) if inline or u.lexicon_unchecked else None
            if u.lexicon_unchecked and voice is not None and voice.installed and params.lexicon:
                # Its voice was downloaded for it: the lexicon is checked now that the
                # voice's phonemes are known.
                voice.check_lexicon(params.lexicon)
                u.lexicon_unchecked = False
            if inline:  # its own inline phonemes, over the lexicon the request has
                if voice is not None:
                    voice.check_lexicon(inline, what="inline phonemes for")
                params = replace(params, lexicon=(params.lexicon or Lexicon()) | inline)
            began = time.perf_counter()
            stream = engine.open(text, params)
        except Exception as e:  # contained: this utterance fails, the others go on
            self._fail(u, e)
            return
        u.compute_seconds += time.perf_counter() - began  # its text's processing is its compute too
        u.begin_segment(stream)
        refusal = self.memory.refusal(stream.memory_bytes)
        if refusal is not None:
            self._end(u, State.FAILED, refusal)

    def _choose(self) -> list[Utterance]:
        """The next step's batch, by the one policy in engine/scheduler.py; streams that
        join now are admitted against the memory budget."""
        with self._lock:
            candidates = [u for u in self._utterances if u.stream is not None and u.state not in ENDED]
        assert self.engine is not None
        batch = scheduler.pick(candidates, limit=self.max_batch, budget=self.engine.step_budget,
                               memory_left=self.memory.left(), one_kind=self.engine.width_costs_time)
        for u in batch:
            if not u.admitted:
                self.memory.admit(u.admit())
        left = self.memory.left()
        if left is not None and any(u.memory_needed() > left and u.runnable() and not u.backlogged() for u in candidates):
            self.stats.memory_waits += 1
        return batch

    def _step(self, engine: Engine, batch: list[Utterance]) -> None:
        """One engine step for the whole batch, timed and contained: an engine error
        fails its own utterance alone, and the rest of the batch takes its pieces. A step
        that raises for the whole batch is retried here, each stream alone, to find the one
        at fault (engines leave that retry to the worker: engine/base.py, ``Engine.step``)."""
        streams = [u.stream for u in batch]
        assert all(s is not None for s in streams)
        self.stats.cpu_threads = self.options.cpu_threads()
        start = time.perf_counter()
        self._stepping, self._step_started_at = batch, time.monotonic()
        try:
            try:
                results = engine.step(streams)  # type: ignore[arg-type]
                if len(results) != len(batch):
                    raise RuntimeError(f"the engine returned {len(results)} results for {len(batch)} streams")
            except Exception as e:
                if len(batch) == 1:
                    results = [e]
                else:  # one of them is at fault: find it by stepping each alone
                    log.warning("a batched step failed (%s); stepping its %d streams one by one", e, len(batch))
                    results = [self._step_alone(engine, s) for s in streams]  # type: ignore[arg-type]
        finally:
            self._stepping, self._step_started_at = [], None
            elapsed = time.perf_counter() - start
            self.stats.steps += 1
            self.stats.batch_sizes[len(batch)] += 1
            self.stats.busy_seconds += elapsed
            self._step_seconds += STEP_SECONDS_WEIGHT * (elapsed - self._step_seconds)
            if self.on_step is not None:
                self.on_step(elapsed, len(batch))
        self._count_cost(batch, results, elapsed)
        for u, result in zip(batch, results):
            u.compute_seconds += elapsed / len(batch)
            u.steps += 1
            if u.state in ENDED:  # abandoned while this step ran: its audio goes nowhere
                self._end(u, State.FAILED, None)
            elif isinstance(result, Exception):
                self._fail(u, result)
            else:
                self._deliver(u, result)

    def _count_cost(self, batch: list[Utterance], results: list[Step | Exception], elapsed: float) -> None:
        """Adds a step's time, shared evenly over its batch, and its audio to the figures
        ``load`` reads."""
        share = elapsed / len(batch)
        made: dict[str | None, tuple[float, float]] = {}
        for u, result in zip(batch, results):
            if isinstance(result, Exception):
                continue
            seconds = sum(np.size(p) for p in result.pieces if not isinstance(p, WordTimings)) / u.sample_rate
            for key in (u.params.voice, None):
                spent, audio = made.get(key, (0.0, 0.0))
                made[key] = (spent + share, audio + seconds)
        with self._lock:
            for key, (spent, audio) in made.items():
                old_spent, old_audio = self._costs.get(key, (0.0, 0.0))
                self._costs[key] = (COST_DECAY * old_spent + spent, COST_DECAY * old_audio + audio)

    @staticmethod
    def _step_alone(engine: Engine, stream: Stream) -> Step | Exception:
        try:
            (result,) = engine.step([stream])
            return result
        except Exception as e:
            return e

    def _deliver(self, u: Utterance, step: Step) -> None:
        for piece in step.pieces:
            if isinstance(piece, WordTimings):
                u.queue.put(u.on_utterance_timeline(piece))
                continue
            audio = np.asarray(piece, dtype=np.float32).reshape(-1)
            left = self._samples_left(u)
            too_long = audio.size > left
            audio = audio[:left]
            if audio.size:
                if u.first_audio_at is None:
                    u.first_audio_at = time.monotonic()
                u.produced_samples += audio.size
                u.queue.put(audio)
            if too_long:
                limit = self.options.max_utterance_seconds
                self._end(u, State.FAILED, Failed(
                    ErrorCode.UTTERANCE_TOO_LONG,
                    f"this text would be spoken for longer than {limit:g} s, the most one utterance may last; "
                    f"it was stopped there: send it as several utterances",
                ))
                return
        if step.done:
            _, freed = u.close_stream()
            self.memory.release(freed)

    def _samples_left(self, u: Utterance) -> int:
        """Samples ``u`` may still produce under ``max_utterance_seconds``."""
        limit = self.options.max_utterance_seconds
        if limit is None:
            return np.iinfo(np.int64).max
        return max(0, round(limit * u.sample_rate) - u.produced_samples)

    def _fail(self, u: Utterance, error: Exception) -> None:
        if isinstance(error, EngineError):
            self._end(u, State.FAILED, Failed(error.code, error.message))
            return
        log.error("engine error in utterance", exc_info=error)
        # The message is for the listener; the exception and its trace are in the log.
        failed = Failed(ErrorCode.ENGINE_ERROR, "the engine failed on this utterance; the others go on")
        self._end(u, State.FAILED, failed)

    def _end(self, u: Utterance, state: State, item: Done | Failed | None) -> None:
        closed, freed = u.close_stream()
        self.memory.release(freed)
        if closed:
            self.stats.streams_closed += 1
        with self._lock:
            if u in self._utterances:
                self._utterances.remove(u)
            if u.state in ENDED:
                return  # already ended and reported: aborted by the server, or abandoned by a watchdog
            u.state = state  # under the lock: an abort from now on finds it ended, and its item stands
        if state is State.FAILED:
            self.stats.failures += 1
        if item is not None:
            u.queue.put(item)
