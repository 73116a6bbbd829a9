"""One utterance, from admission to its figures, whichever door it came through.

Every door (server/doors/) asks the same ``Pipeline`` to ``open`` an utterance. It
checks what only the engine can tell (the voice, timestamps), takes an admission slot,
and either replays the result cache or submits to the worker. The door's utterance task
(server/doors/base.py) reads ``Speech.events()`` (frames, word timings, flushed, done or
failed), which the door sends in its own shape, and ends the speech with its outcome
(``Speech.end``): that gives the slot back, stops the worker's side, fills the cache and
records the metrics and the log line, exactly once. A refusal is recorded the same way.

``Framer`` is the sans-I/O core: the worker's queue items in, the client's events
out; it is tested with synthetic items, without sockets. docs/glossary.md says what
each word (utterance, stream, piece, chunk, frame) names.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, replace

import numpy as np

from voxwire.engine.audio_queue import Failed, Finished, Flushed, Item
from voxwire.engine.base import Engine, EngineError, SynthesisParams, WordTiming, WordTimings
from voxwire.engine.errors import CodedError, quoted
from voxwire.engine.text import expanded_length, normalize
from voxwire.engine.worker import Utterance, Worker
from voxwire.server.accounting import Accounting
from voxwire.server.audio import FormatError, FrameCutter, open_encoder, stream_rate
from voxwire.server.cache import CacheKey, CachedAudio, Replay, ResultCache
from voxwire.server.limits import Admission
from voxwire.server.protocol import StreamSettings

RETRY_AFTER_MS = 1000  # a hint: one second is long next to an utterance's first step


class Refused(CodedError):
    """A new utterance (or connection) was not taken, with when to try again, if soon."""

    def __init__(self, code: str, message: str, retry_after_ms: int | None = None) -> None:
        super().__init__(code, message)
        self.retry_after_ms = retry_after_ms


# -- what a door is given to send -------------------------------------------------------


@dataclass(frozen=True)
class AudioFrame:
    seq: int
    offset: int
    """Index of the frame's first sample within the utterance, at the stream's rate."""
    samples: int
    data: bytes
    """The samples in the stream's format; for a compressed one, the bytes its encoder
    let go of with these samples (the frames, concatenated, are one stream)."""


@dataclass(frozen=True)
class Words:
    """Word timings, sent just ahead of the frame the first of them starts in."""

    words: tuple[dict[str, object], ...]


@dataclass(frozen=True)
class FlushedEvent:
    pass


@dataclass(frozen=True)
class Done:
    figures: Figures


@dataclass(frozen=True)
class FailedEvent:
    code: str
    message: str


Event = AudioFrame | Words | FlushedEvent | Done | FailedEvent


@dataclass(frozen=True)
class Figures:
    """An utterance's own figures, as ``done`` reports them (docs/protocol.md)."""

    ttfa_ms: float | None
    audio_ms: float
    compute_ms: float
    rtf: float | None
    chunks: int
    samples: int
    segments: int
    engine_steps: int
    engine_steps_at_first_chunk: int | None
    cached: bool
    bytes: int
    """Audio bytes sent: what the format costs on the wire."""

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


# -- the sans-I/O core ------------------------------------------------------------------


class Framer:
    """The worker's queue items in; frames, word timings and markers out.

    It resamples and cuts the pieces into chunks (server/audio.py), encodes each into a
    frame, moves word timings onto the stream's timeline, and keeps a copy of the
    engine's audio and words for the result cache while it stays under ``capture_bytes``.
    """

    def __init__(self, engine_rate: int, settings: StreamSettings, capture_bytes: int = 0) -> None:
        self.settings = settings
        self._engine_rate = engine_rate
        self._out = FrameCutter(engine_rate, settings.sample_rate, settings.chunk_ms)
        self._encoder = open_encoder(settings.format, settings.sample_rate)
        self._words: deque[WordTiming] = deque()
        self.frames = 0
        self.samples = 0
        self.bytes = 0
        self.finished = False
        self._capture: list[np.ndarray] | None = [] if capture_bytes > 0 else None
        self._capture_bytes = capture_bytes
        self._captured_bytes = 0
        self._captured_words: list[WordTiming] = []

    def receive(self, item: Item) -> list[Event]:
        if isinstance(item, np.ndarray):
            self._keep(item)
            return self._frames(self._out.push(item))
        if isinstance(item, WordTimings):
            if self._capture is not None:
                self._captured_words.extend(item.words)
            if self.settings.timestamps:
                scale = self.settings.sample_rate / self._engine_rate  # engine samples -> the stream's
                self._words.extend(WordTiming(w.word, round(w.start * scale), round(w.end * scale)) for w in item.words)
            return []
        if isinstance(item, Flushed):
            return [*self._frames(self._out.flush()), FlushedEvent()]
        if isinstance(item, Finished):
            self.finished = True
            events = self._frames(self._out.finish(), last=True)
            return events + self._words_before(None)
        self._encoder.close()
        return [FailedEvent(item.code, item.message)]

    def close(self) -> None:
        """The utterance ended without finishing (cancelled, disconnected): the encoder's
        held samples are dropped; what was sent is whole frames, and stays decodable."""
        self._encoder.close()

    def captured(self, segments: int) -> CachedAudio | None:
        """What the cache may keep of a finished utterance: its engine audio, and its
        words when they were asked for; None when it grew too big to keep."""
        if not self.finished or not self._capture:
            return None
        words = tuple(self._captured_words) if self.settings.timestamps else None
        return CachedAudio(np.concatenate(self._capture), segments, words)

    def _keep(self, piece: np.ndarray) -> None:
        if self._capture is None:
            return
        self._capture.append(piece)
        self._captured_bytes += piece.nbytes
        if self._captured_bytes > self._capture_bytes:
            self._capture = None  # too long to cache: stop holding it

    def _frames(self, frames: list[np.ndarray], last: bool = False) -> list[Event]:
        """Frames encoded; with ``last``, the encoder's end goes with the last of them
        (or alone, covering no samples, when the utterance ends on a frame boundary)."""
        events: list[Event] = []
        if last and not frames:
            frames = [np.zeros(0, np.float32)]
        for i, frame in enumerate(frames):
            data = self._encoder.push(frame)
            if last and i == len(frames) - 1:
                data += self._encoder.finish()
                if not frame.size and not data:
                    break  # nothing held back (PCM): no empty frame
            events += self._words_before(self.samples + frame.size)
            events.append(AudioFrame(self.frames, self.samples, frame.size, data))
            self.frames += 1
            self.samples += frame.size
            self.bytes += len(data)
        return events

    def _words_before(self, end: int | None) -> list[Event]:
        """The words that start before sample ``end`` (all of them when None)."""
        words = []
        while self._words and (end is None or self._words[0].start < end):
            words.append(self._words.popleft())
        if not words:
            return []
        rate = self.settings.sample_rate
        return [
            Words(tuple(
                {"word": w.word, "start_ms": round(w.start * 1000 / rate, 1), "end_ms": round(w.end * 1000 / rate, 1)}
                for w in words
            ))
        ]


# -- one utterance ----------------------------------------------------------------------


@dataclass(frozen=True)
class UtteranceRequest:
    """What a door asks for: the first text, and how the audio is to be delivered."""

    door: str
    """The door's name (``ws``, ``http``, ``wyoming``), for the metrics and the log."""
    text: str
    final: bool
    settings: StreamSettings
    ids: dict[str, str]
    """What names this utterance in the log (session and ctx, or a request id)."""


class Speech:
    """An admitted utterance, as a door sees it: fed, streamed, ended once."""

    def __init__(
        self,
        pipeline: Pipeline,
        request: UtteranceRequest,
        source: Utterance | Replay,
        engine_rate: int,
        key: CacheKey | None,
        cached: CachedAudio | None,
    ) -> None:
        self.request = request
        self.settings = request.settings
        self.received_at = time.monotonic()
        self.first_frame_at: float | None = None
        self.outcome: str | None = None
        self._pipeline = pipeline
        self._source = source
        self._key = key
        self._cached = cached
        self._text = [request.text]
        self._chars = expanded_length(request.text)
        capture = pipeline.cache.max_entry_bytes if key is not None and cached is None else 0
        self.framer = Framer(engine_rate, request.settings, capture)
        self._engine_rate = engine_rate
        self._steps_at_first_frame: int | None = None
        # Once the queue has given Finished, a flush can no longer go through it: the
        # events answer it themselves before Done, or, once Done is out, the door does.
        self._finishing = False
        self._flush_at_end = False
        self._sent_all = False

    # -- the door's side ------------------------------------------------------------------

    @property
    def complete(self) -> bool:
        """All its text has arrived (a cached replay always has it)."""
        return self._source.complete

    @property
    def cached(self) -> bool:
        """It is replayed from the result cache."""
        return isinstance(self._source, Replay)

    @property
    def text_chars(self) -> int:
        """Its text's length so far, as normalisation expands it (``expanded_length``)."""
        return self._chars

    def feed(self, text: str, final: bool) -> None:
        self._text.append(text)
        self._chars += expanded_length(text)
        self._source.feed(text, final)

    def flush(self) -> bool:
        """Ask for a FlushedEvent once the audio of the text so far is out: False when all
        of it already is (the events have reached Done), and the door answers at once."""
        if self._sent_all:
            return False
        if self._finishing:
            self._flush_at_end = True
        else:
            self._source.flush()
        return True

    async def events(self) -> AsyncIterator[Event]:
        """What the client is sent, in order, up to and including Done or FailedEvent."""
        while True:
            item = await self._source.queue.get()
            self._finishing = isinstance(item, Finished)
            for event in self.framer.receive(item):
                if isinstance(event, AudioFrame) and self.first_frame_at is None:
                    self.first_frame_at = time.monotonic()
                    self._steps_at_first_frame = self._source.steps
                yield event
            if isinstance(item, Finished):
                if self._flush_at_end:
                    yield FlushedEvent()
                self._sent_all = True
                yield Done(self.figures())
                return
            if isinstance(item, Failed):
                return

    def figures(self) -> Figures:
        source = self._source
        audio_s = self.framer.samples / self.settings.sample_rate
        ttfa = None if self.first_frame_at is None else round((self.first_frame_at - self.received_at) * 1000, 1)
        return Figures(
            ttfa_ms=ttfa,
            audio_ms=round(audio_s * 1000, 1),
            compute_ms=round(source.compute_seconds * 1000, 1),
            rtf=round(source.compute_seconds / audio_s, 4) if audio_s else None,
            chunks=self.framer.frames,
            samples=self.framer.samples,
            segments=source.segments,
            engine_steps=source.steps,
            engine_steps_at_first_chunk=self._steps_at_first_frame,
            cached=self.cached,
            bytes=self.framer.bytes,
        )

    def abort(self, code: str, message: str) -> None:
        """Fail it from the server's side (a shutdown past its deadline): the worker stops,
        and the door's next event is FailedEvent, whatever was queued."""
        if self.outcome is not None:
            return
        self._source.cancel()
        self._source.queue.clear()
        self._source.queue.put(Failed(code, message))

    def played(self, samples: int, window_seconds: float) -> None:
        """The client has played ``samples`` of this utterance (at the stream's rate):
        compute at most ``window_seconds`` of audio beyond that. A cached replay computes
        nothing, so there is nothing to hold."""
        if isinstance(self._source, Replay):
            return
        rate = self._engine_rate
        played = min(samples, self.framer.samples) * rate // self.settings.sample_rate
        self._source.queue.pace(round(window_seconds * rate), played)

    @property
    def held_by_listener(self) -> bool:
        """The engine has more to compute for it but waits for its listener: the queue is
        full, or the playback window is in hand. Waiting for the producer's text is not
        this; a cached replay computes nothing, so it is never held."""
        source = self._source
        return isinstance(source, Utterance) and source.queue.full() and source.runnable()

    def drop_queued(self) -> None:
        """A barge-in: the audio queued for the client goes, now."""
        self._source.queue.clear()

    def end_stalled(self, reason: str) -> None:
        """Its listener stopped taking its audio (``reason``: ``not_reading``, its socket
        took nothing; ``no_progress``, it reported no playback): it ends ``listener_stalled``,
        counted by door and reason. Only the first end counts, as for ``end``."""
        if self.outcome is None:
            self.end("failed", "listener_stalled")
            self._pipeline.accounting.metrics.listeners_stalled.labels(self.request.door, reason).inc()

    def end(self, outcome: str, code: str | None = None) -> None:
        """The utterance is over (``done``, ``cancelled``, ``disconnected`` or ``failed``
        with its code): stop the worker's side, give back the slot, keep a finished
        result for the cache, and account for it. Only the first call counts."""
        if self.outcome is not None:
            return
        self.outcome = outcome
        self._pipeline.open_speeches.discard(self)
        if self._source.outcome is None:
            self._source.cancel()
        self.framer.close()
        self._pipeline.admission.end_utterance()
        if outcome == "done" and self._key is not None and self._cached is None:
            entry = self.framer.captured(self._source.segments)
            if entry is not None:
                # Streamed text is keyed by what it added up to, for one-shot repeats of it.
                self._pipeline.cache.put(replace(self._key, text=normalize("".join(self._text))), entry)
        figures = self.figures() if outcome == "done" else None
        self._pipeline.accounting.utterance(
            self.request.door, outcome, code, self.request.ids, self.settings.voice, "".join(self._text),
            figures.to_dict() if figures else {"samples": self.framer.samples, "chunks": self.framer.frames},
        )


class Pipeline:
    """What every door shares: the worker, admission, the result cache and accounting."""

    def __init__(
        self,
        worker: Callable[[], Worker],
        admission: Admission,
        cache: ResultCache,
        accounting: Accounting,
        draining: Callable[[], bool],
    ) -> None:
        self._worker = worker
        self.admission = admission
        self.cache = cache
        self.accounting = accounting
        self._draining = draining
        self.open_speeches: set[Speech] = set()

    def abort_all(self, code: str, message: str) -> None:
        """Fail every open utterance (a shutdown past its deadline)."""
        for speech in list(self.open_speeches):
            speech.abort(code, message)

    def open(self, request: UtteranceRequest) -> Speech:
        """Admit an utterance and start it (from the cache, or on the worker), or raise
        ``Refused``, which is recorded here."""
        try:
            return self._open(request)
        except Refused as e:
            self.refused(request.door, e.code, request.ids, request.settings.voice, request.text)
            raise

    def engine(self) -> Engine:
        """The loaded engine, or an ``EngineError`` a client can be told."""
        return self._worker().loaded_engine()

    def refused(self, door: str, code: str, ids: dict[str, str], voice: str, text: str) -> None:
        """Record a new utterance that a door turned away (its own limits, bad input)."""
        self.accounting.utterance(door, "refused", code, ids, voice, text, {})

    def resolve(self, settings: StreamSettings, check_voice: bool = True) -> StreamSettings:
        """The settings as the loaded engine will speak them: the default voice (``""``)
        named, and what only the engine can tell checked (whether it has the voice, and
        whether it can time words). Raises ``Refused``."""
        try:
            engine = self._worker().loaded_engine()
        except EngineError as e:
            raise Refused(e.code, e.message, RETRY_AFTER_MS) from None
        try:
            # Opus is sent at its own rate; MP3 and AAC take only their standard rates.
            settings = replace(settings, sample_rate=stream_rate(settings.format, settings.sample_rate))
        except FormatError as e:
            raise Refused(e.code, e.message) from None
        if settings.timestamps and not engine.timestamps:
            raise Refused(
                "timestamps_unsupported",
                f"this server's engine ({engine.name}) cannot time words; ready.features says what it can do",
            )
        if not check_voice:
            return settings
        if not settings.voice:
            default = engine.default_voice()
            if default is None:
                raise Refused("no_voice", "no voices yet: register one with POST /v1/voices")
            return replace(settings, voice=default)
        if not engine.has_voice(settings.voice):
            raise Refused("unknown_voice", f"unknown voice {quoted(settings.voice)}; GET /v1/voices lists them")
        return settings

    def _open(self, request: UtteranceRequest) -> Speech:
        if self._draining():
            raise Refused("shutting_down", "the server is shutting down; reconnect shortly")
        settings = self.resolve(request.settings)
        request = replace(request, settings=settings)
        if not self.admission.try_start_utterance():
            raise Refused("overloaded", "the server is at capacity; try again shortly", RETRY_AFTER_MS)
        worker = self._worker()
        engine = worker.loaded_engine()
        key = (
            self.cache.key(engine.name, settings.voice, settings.speed, request.text, settings.fast_start)
            if self.cache.enabled
            else None
        )
        # Only a one-shot utterance can be looked up: streamed text is not known yet.
        hit = self.cache.get(key, with_words=settings.timestamps) if key is not None and request.final else None
        if hit is not None:
            speech = Speech(self, request, Replay(hit, engine.sample_rate), engine.sample_rate, key, hit)
            self.open_speeches.add(speech)
            return speech
        lag = self.admission.limits.max_listener_lag_seconds
        behind = worker.behind_seconds() if lag > 0 else 0.0
        if behind > lag:
            # Measured, not counted: the cores are already too few for the listeners the
            # worker has. One more would make every one of them run dry, not just itself.
            self.admission.end_utterance()
            raise Refused(
                "overloaded",
                f"the server cannot keep up with its listeners now (one has waited {behind:.1f} s for audio); "
                "try again shortly", RETRY_AFTER_MS,
            )
        try:
            utterance = worker.submit(
                SynthesisParams(
                    voice=settings.voice, speed=settings.speed, timestamps=settings.timestamps, fast_start=settings.fast_start
                ),
                asyncio.get_running_loop(),
                first_clause_words=settings.first_clause_words,
            )
        except EngineError as e:
            self.admission.end_utterance()
            raise Refused(e.code, e.message, RETRY_AFTER_MS) from None
        speech = Speech(self, request, utterance, engine.sample_rate, key, None)
        self.open_speeches.add(speech)
        utterance.feed(request.text, request.final)
        return speech

