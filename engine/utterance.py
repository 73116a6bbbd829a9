"""One utterance as the worker sees it: its text, its state and its engine stream.

Two threads share it (engine/worker_lock.py). Its session, on the event loop, feeds
text, flushes, cancels, aborts and asks whether it is held by its listener, each under
the worker's lock. The worker, on its own thread, segments the text, opens and closes
the segments' engine streams and puts their audio in the utterance's queue.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, replace
from enum import Enum

from voxwire.engine.audio_queue import AudioQueue, Failed, Flushed
from voxwire.engine.base import EngineError, Stream, SynthesisParams, WordTimings
from voxwire.engine.errors import ErrorCode
from voxwire.engine.text.inline import InlineError, InlineReader
from voxwire.engine.text.lexicon import Lexicon
from voxwire.engine.text.segment import Segmenter, SegmenterLimits
from voxwire.engine.text.ssml import Boundary, Break, Rate, Script
from voxwire.engine.worker_lock import WorkerLock

log = logging.getLogger(__name__)


class State(Enum):
    """Where an utterance is in its life. The first three are alive; the last three are
    ended, each once, under the worker's lock: by the worker, by an abort from the server,
    or by a watchdog that gives up on the worker's thread."""

    OPEN = "open"
    """Text may still come."""
    COMPLETE = "complete"
    """All its text has arrived; it is being spoken."""
    CANCELLING = "cancelling"
    """Its session cancelled it; the worker closes its stream before its next step."""
    FINISHED = "finished"
    CANCELLED = "cancelled"
    FAILED = "failed"


ENDED = frozenset({State.FINISHED, State.CANCELLED, State.FAILED})


@dataclass(frozen=True)
class _Text:
    """A piece of an utterance's text as it arrived, waiting to be segmented."""

    text: str
    final: bool


Next = str | Flushed | Break | Rate
"""What ``take`` gives the worker: a segment's text, a flush marker, a pause to put in
the audio, or the speed of the segments that follow (an SSML script's)."""


class Utterance:
    """One utterance's state, shared between its session and the worker through the
    methods below: the session's take the worker's lock; the worker's are for its thread."""

    def __init__(
        self, lock: WorkerLock, sample_rate: int, params: SynthesisParams, queue: AudioQueue, limits: SegmenterLimits,
    ) -> None:
        self.params = params
        self.queue = queue
        self.submitted_at = time.monotonic()
        self.first_audio_at: float | None = None
        self.ready_at: float | None = None
        """When its first segment's stream opened: from then on only the worker holds up
        its first audio (streamed text may come long after it was submitted)."""
        self.produced_samples = 0
        self.steps = 0
        self.segments = 0
        self.lexicon_unchecked = False
        """Whether its lexicon waits to be checked against its voice, which was not
        installed when it was admitted (engine/worker.py checks it at its first segment)."""
        self.compute_seconds = 0.0
        """Its share of the steps it took part in (a step's time over its batch size)."""
        self.state = State.OPEN
        self._lock = lock
        self._sample_rate = sample_rate
        self._segmenter = Segmenter(limits)  # only ever touched on the worker's thread
        self._inline = InlineReader()  # likewise: it reads the text before the segmenter
        self._inbox: deque[_Text | Flushed | Script] = deque()
        """What the session sent, in order, not yet segmented."""
        self._todo: deque[Next] = deque()
        self._stream: Stream | None = None
        self._admitted = False  # its stream's memory is counted against the budget
        self._segment_start = 0
        self.speed: float | None = None
        """The speed an SSML script's ``Rate`` set for the segments that follow (None:
        the request's). The worker's thread alone."""

    # -- the session's side: any thread, under the worker's lock ------------------------

    def feed(self, text: str, final: bool = False) -> None:
        """Add text; ``final`` says no more follows. Constant time: the worker's thread
        segments it."""
        with self._lock:
            self._inbox.append(_Text(text, final))
            if final and self.state is State.OPEN:
                self.state = State.COMPLETE
            self._lock.changed()

    def feed_script(self, script: Script) -> None:
        """Its whole text, as an SSML document's script (engine/text/ssml.py)."""
        with self._lock:
            self._inbox.append(script)
            if self.state is State.OPEN:
                self.state = State.COMPLETE
            self._lock.changed()

    def flush(self) -> None:
        """Synthesise what is buffered now, then mark the point with ``Flushed``."""
        with self._lock:
            self._inbox.append(Flushed())
            self._lock.changed()

    def cancel(self) -> None:
        with self._lock:
            if self.state in (State.OPEN, State.COMPLETE):
                self.state = State.CANCELLING
            self._lock.changed()

    def abort(self, code: str, message: str) -> None:
        """End it failed from the server's side (a shutdown past its deadline): the
        worker puts nothing more, and ``Failed(code, message)`` is the last and only item
        its consumer gets, whatever was queued. Once it has ended on its own, its own
        last item stands. The worker closes its stream before its next step."""
        with self._lock:
            if self.state in ENDED:
                return
            self.state = State.FAILED
            self.queue.end_with(Failed(code, message))
            self._lock.changed()

    def held_by_listener(self) -> bool:
        """The engine has more to compute for it but waits for its listener: its queue is
        full, or the listener has the playback window in hand."""
        with self._lock:
            return self.queue.full() and self.runnable()

    @property
    def complete(self) -> bool:
        """No more text will come (all of it arrived, or it was cancelled or ended)."""
        return self.state is not State.OPEN

    @property
    def outcome(self) -> str | None:
        """``finished``, ``cancelled`` or ``failed`` once it has ended; None before."""
        return self.state.value if self.state in ENDED else None

    @property
    def stream_closed(self) -> bool:
        """It has ended and no engine stream of its is left open."""
        return self.state in ENDED and self._stream is None

    @property
    def produced_seconds(self) -> float:
        return self.produced_samples / self._sample_rate

    @property
    def sample_rate(self) -> int:
        """The rate of this utterance's pieces: its voice's."""
        return self._sample_rate

    def backlogged(self) -> bool:
        """Its listener is behind (engine/audio_queue.py, ``full``)."""
        return self.queue.full()

    # -- scheduling: the worker's thread, or under its lock -----------------------------

    def runnable(self) -> bool:
        self._lock.on_worker_thread_or_held("Utterance.runnable")
        return self.state is State.COMPLETE or (
            self.state is State.OPEN and (self._stream is not None or bool(self._todo) or bool(self._inbox))
        )

    # -- the worker's side: its thread alone --------------------------------------------

    @property
    def stream(self) -> Stream | None:
        """Its engine stream in progress. Any thread may look; only the worker's uses it."""
        return self._stream

    def cost(self) -> int:
        self._lock.on_worker_thread("Utterance.cost")
        return self._stream.cost() if self._stream is not None else 1

    def memory_needed(self) -> int:
        """Bytes its stream needs admitted before its first step; 0 once admitted."""
        self._lock.on_worker_thread("Utterance.memory_needed")
        return 0 if self._stream is None or self._admitted else self._stream.memory_bytes

    def take(self) -> Next | None:
        """What to do next between segments (``Next``), or None when nothing is waiting."""
        self._lock.on_worker_thread("Utterance.take")
        with self._lock:
            if self._todo:
                return self._todo.popleft()
            arrived, self._inbox = self._inbox, deque()
        todo = self._segment(arrived)  # outside the lock: the event loop may feed meanwhile
        with self._lock:
            self._todo.extend(todo)
            return self._todo.popleft() if self._todo else None

    def _segment(self, arrived: deque[_Text | Flushed | Script]) -> list[Next]:
        todo: list[Next] = []
        for item in arrived:
            if isinstance(item, Script):
                todo.extend(self._script(item))
                continue
            if isinstance(item, Flushed):
                todo.extend(self._segment_end())
                todo.append(item)
                continue
            todo.extend(self._segmenter.push(self._inline.push(item.text, final=item.final), final=item.final))
            if item.final:
                todo.extend(self._segmenter.flush())
        return todo

    def _script(self, script: Script) -> list[Next]:
        """A whole document's segments and what comes between them. The text between two
        boundaries is one run, segmented as a whole text is: a document of text alone is
        spoken as that text would be."""
        todo: list[Next] = []
        run: list[str] = []
        for part in [*script.items, Boundary()]:
            if not isinstance(part, (Boundary, Break, Rate)):
                run.append(part.text)
                continue
            if run:
                todo.extend(self._segmenter.push(self._inline.push("".join(run), final=True), final=True))
                run = []
            todo.extend(self._segment_end())
            if not isinstance(part, Boundary):
                todo.append(part)
        return todo

    def _segment_end(self) -> list[str]:
        """Whatever is pending, as segments: audio now, or a boundary an SSML script sets.
        A markup still open is text."""
        todo = []
        if held := self._inline.push("", final=True):
            todo.extend(self._segmenter.push(held))
        return todo + self._segmenter.flush()

    def written(self, segment: str) -> tuple[str, Lexicon]:
        """A segment as written, and the entries of its inline phonemes
        (engine/text/inline.py), in the order its segments are opened. Raises
        ``EngineError`` (``invalid_lexicon``) for a markup that cannot be read."""
        self._lock.on_worker_thread("Utterance.written")
        try:
            return self._inline.resolve(segment)
        except InlineError as e:
            raise EngineError(ErrorCode.INVALID_LEXICON, str(e)) from None

    def all_spoken(self) -> bool:
        """No more text can come and none is left to speak. Checked under the lock with
        the state: text fed with ``final`` just after ``take`` found nothing is not lost."""
        self._lock.on_worker_thread("Utterance.all_spoken")
        with self._lock:
            return self.state is State.COMPLETE and not self._inbox and not self._todo

    def begin_segment(self, stream: Stream) -> None:
        self._lock.on_worker_thread("Utterance.begin_segment")
        if self.ready_at is None:
            self.ready_at = time.monotonic()
        self.segments += 1
        self._segment_start = self.produced_samples
        self._stream, self._admitted = stream, False

    @property
    def admitted(self) -> bool:
        return self._admitted

    def admit(self) -> int:
        """Count its stream against the memory budget; the bytes it takes."""
        self._lock.on_worker_thread("Utterance.admit")
        assert self._stream is not None and not self._admitted
        self._admitted = True
        return self._stream.memory_bytes

    def on_utterance_timeline(self, words: WordTimings) -> WordTimings:
        """Segment-relative word timings from the engine, on the utterance's timeline."""
        shift = self._segment_start
        return WordTimings(tuple(replace(w, start=w.start + shift, end=w.end + shift) for w in words.words))

    def close_stream(self) -> tuple[bool, int]:
        """Close the engine stream in progress, if any: whether there was one, and the
        admitted memory it gives back."""
        self._lock.on_worker_thread("Utterance.close_stream")
        stream, self._stream = self._stream, None
        if stream is None:
            return False, 0
        freed = stream.memory_bytes if self._admitted else 0
        self._admitted = False
        try:
            stream.close()
        except Exception:
            log.exception("engine stream failed to close")
        return True, freed
